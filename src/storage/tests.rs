//! The conformance suite every backend must pass.

use super::*;

#[allow(clippy::single_range_in_vec_init)] // one range per call is the point
pub(crate) fn conformance(store: &dyn Storage) {
    assert_eq!(store.get("missing.bin").unwrap(), None);
    assert_eq!(store.size("missing.bin").unwrap(), None);
    assert_eq!(store.get_ranges("missing.bin", &[0..1]).unwrap(), None);
    store.put("a/b/c.bin", Bytes::from_static(b"0123456789")).unwrap();
    store.put("top.txt", Bytes::from_static(b"x")).unwrap();
    assert_eq!(store.get("a/b/c.bin").unwrap().unwrap(), Bytes::from_static(b"0123456789"));
    assert_eq!(store.size("a/b/c.bin").unwrap(), Some(10));
    let parts = store.get_ranges("a/b/c.bin", &[2..4, 0..1, 9..10, 5..5]).unwrap().unwrap();
    assert_eq!(
        parts,
        vec![Bytes::from_static(b"23"), Bytes::from_static(b"0"), Bytes::from_static(b"9"), Bytes::new()]
    );
    assert!(store.get_ranges("a/b/c.bin", &[5..11]).is_err());
    store.put("a/b/c.bin", Bytes::from_static(b"new")).unwrap();
    assert_eq!(store.get("a/b/c.bin").unwrap().unwrap(), Bytes::from_static(b"new"));
    assert_eq!(store.list("").unwrap(), vec!["a/b/c.bin".to_string(), "top.txt".to_string()]);
    assert_eq!(store.list("a").unwrap(), vec!["a/b/c.bin".to_string()]);
    assert_eq!(store.list("nothing").unwrap(), Vec::<String>::new());
    store.delete("top.txt").unwrap();
    store.delete("top.txt").unwrap();
    assert_eq!(store.get("top.txt").unwrap(), None);
    let (requests, _) = store.stats().snapshot();
    assert!(requests >= 3);
}

#[test]
fn local_storage_conformance() {
    let dir = tempfile::tempdir().unwrap();
    conformance(&LocalStorage::new(dir.path()));
    // no temporary files are left behind by put
    let names: Vec<_> = std::fs::read_dir(dir.path().join("a/b")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec!["c.bin"]);
}

#[test]
fn unsupported_schemes_say_so() {
    let err = open("s3://bucket/prefix").err().unwrap();
    assert!(err.to_string().contains("s3://"), "{err}");
    assert!(open("file:///tmp/x").is_ok());
}
