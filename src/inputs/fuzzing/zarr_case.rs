//! An AnnData zarr store from arbitrary bytes: a sequence of its objects,
//! each a flags byte, its key's length (one byte) and key, its value's
//! length (two bytes, little-endian) and value. Flags 1 compresses the
//! value with Zstandard and 2 with gzip before it is written, so that a
//! fuzzer reaches the codecs' payloads and not only their headers; the
//! metadata (`zarr.json`, `.zarray`, `.zgroup`, `.zattrs`) is JSON as given.
//! Keys of other characters than letters, digits and `._-/`, or with empty,
//! `.` or `..` parts, are left out.

use std::io::Write;
use std::path::Path;

use super::{read_as_convert_does, Choices};
use crate::inputs::error::InputError;

/// Writes the store the bytes describe and reads it as a conversion does.
///
/// # Panics
///
/// Where [`read_as_convert_does`] finds a fault.
pub fn zarr(data: &[u8]) -> Result<(), InputError> {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store = dir.path().join("case.zarr");
    std::fs::create_dir(&store).expect("a folder");
    let mut c = Choices::new(data);
    loop {
        let flags = c.byte();
        let key_len = usize::from(c.byte());
        let key = c.take(key_len);
        let value_len = usize::from(c.u16());
        let value = c.take(value_len);
        if key.is_empty() {
            break;
        }
        let Some(key) = std::str::from_utf8(key).ok().filter(|k| usable(k)) else { continue };
        let value = match flags % 4 {
            1 => zstd::bulk::compress(value, 1).expect("in memory"),
            2 => {
                let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                z.write_all(value).expect("in memory");
                z.finish().expect("in memory")
            }
            _ => value.to_vec(),
        };
        put(&store, key, &value);
    }
    read_as_convert_does(&store)
}

fn usable(key: &str) -> bool {
    key.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
        && key.split('/').all(|part| !matches!(part, "" | "." | ".."))
}

/// Writes `value` at `key` in `store`, unless a file stands where a folder
/// of the key must be, or the reverse (then it is left out).
fn put(store: &Path, key: &str, value: &[u8]) {
    let path = store.join(key);
    if let Some(parent) = path.parent() {
        if std::fs::create_dir_all(parent).is_err() {
            return;
        }
    }
    let _ = std::fs::write(path, value);
}
