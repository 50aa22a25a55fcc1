//! The behaviour every [`Storage`] backend must have, as a check that can run
//! against any of them: the local folder and an in-memory store in the unit
//! tests, and the S3, GCS and HTTP servers in the integration tests. A new
//! backend passes [`check_read_write`] (or, read-only, [`check_read`]) before
//! anything else is built on it.
//!
//! The checks write and delete only `a/b/c.bin` and `top.txt` below the
//! store's root: run them on a scratch prefix.

use std::ops::Range;

use bytes::Bytes;

use super::Storage;

/// The objects [`check_read`] expects: `a/b/c.bin` holding `0123456789` and
/// `top.txt` holding `x`. A read-only store must be given them another way.
pub const FIXTURE: [(&str, &[u8]); 2] = [("a/b/c.bin", b"0123456789"), ("top.txt", b"x")];

/// A failed call, as the check's message.
fn err(what: &'static str) -> impl Fn(super::StorageError) -> String {
    move |e| format!("{what}: {}", crate::error_chain(&e))
}

fn expect<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, expected {want:?}"))
    }
}

/// Reads of a store that holds [`FIXTURE`]: sizes, whole and ranged reads
/// (several ranges in one call, in the order asked, empty ones, one past the
/// end), missing objects as `None`, and listings where the store can list.
#[allow(clippy::single_range_in_vec_init)] // one range per call is the point
pub fn check_read(store: &dyn Storage) -> Result<(), String> {
    expect("get of a missing object", store.get("missing.bin").map_err(err("get"))?, None)?;
    expect("size of a missing object", store.size("missing.bin").map_err(err("size"))?, None)?;
    expect("ranges of a missing object", store.get_ranges("missing.bin", &[0..1]).map_err(err("get_ranges"))?, None)?;
    expect("get", store.get("a/b/c.bin").map_err(err("get"))?, Some(Bytes::from_static(b"0123456789")))?;
    expect("size", store.size("a/b/c.bin").map_err(err("size"))?, Some(10))?;
    let ranges: [Range<u64>; 4] = [2..4, 0..1, 9..10, 5..5];
    expect(
        "get_ranges",
        store.get_ranges("a/b/c.bin", &ranges).map_err(err("get_ranges"))?,
        Some(vec![Bytes::from_static(b"23"), Bytes::from_static(b"0"), Bytes::from_static(b"9"), Bytes::new()]),
    )?;
    let past_end: [Range<u64>; 1] = [5..11];
    if store.get_ranges("a/b/c.bin", &past_end).is_ok() {
        return Err("a range past the end of an object was not an error".into());
    }
    if store.can_list() {
        expect("list of the root", store.list("").map_err(err("list"))?, vec!["a/b/c.bin".into(), "top.txt".into()])?;
        expect("list of a folder", store.list("a").map_err(err("list"))?, vec!["a/b/c.bin".to_string()])?;
        expect("list of nothing", store.list("nothing").map_err(err("list"))?, Vec::<String>::new())?;
        expect(
            "list_sizes",
            store.list_sizes("").map_err(err("list_sizes"))?,
            vec![("a/b/c.bin".into(), 10), ("top.txt".into(), 1)],
        )?;
    }
    let (requests, _) = store.stats().snapshot();
    if requests < 3 {
        return Err(format!("the store counted {requests} requests for at least 3 reads"));
    }
    Ok(())
}

/// Everything: writes [`FIXTURE`], [`check_read`], then replacing an object
/// (by put and by a spool), deleting (twice: absent is fine) and the upload counts.
pub fn check_read_write(store: &dyn Storage) -> Result<(), String> {
    let before = store.stats().uploads();
    for (key, data) in FIXTURE {
        store.put(key, Bytes::from_static(data)).map_err(err("put"))?;
    }
    check_read(store)?;
    store.put("a/b/c.bin", Bytes::from_static(b"new")).map_err(err("put"))?;
    expect("get after a replacing put", store.get("a/b/c.bin").map_err(err("get"))?, Some(Bytes::from_static(b"new")))?;
    // a spooled write replaces as put does; a spool dropped unput leaves nothing
    let mut spool = store.spool("a/b/c.bin").map_err(err("spool"))?;
    std::io::Write::write_all(&mut spool, b"spooled").map_err(|e| format!("writing a spool: {e}"))?;
    drop(store.spool("a/b/dropped.bin").map_err(err("spool"))?);
    store.put_spooled("a/b/c.bin", spool).map_err(err("put_spooled"))?;
    expect("get after put_spooled", store.get("a/b/c.bin").map_err(err("get"))?, Some(Bytes::from_static(b"spooled")))?;
    expect("a dropped spool", store.get("a/b/dropped.bin").map_err(err("get"))?, None)?;
    store.delete("top.txt").map_err(err("delete"))?;
    store.delete("top.txt").map_err(err("delete of an absent object"))?;
    expect("get after delete", store.get("top.txt").map_err(err("get"))?, None)?;
    let after = store.stats().uploads();
    // c.bin three times and top.txt: 10 + 1 + 3 + 7 bytes
    expect("uploads counted", (after.0 - before.0, after.1 - before.1), (4, 21))?;
    store.delete("a/b/c.bin").map_err(err("delete"))?;
    Ok(())
}
