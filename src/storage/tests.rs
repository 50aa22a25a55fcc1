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
    // a.b.c.bin twice and top.txt: 10 + 1 + 3 bytes
    assert_eq!(store.stats().uploads(), (3, 14));
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
    let err = open("ftp://host/prefix").err().unwrap();
    assert!(err.to_string().contains("ftp://"), "{err}");
    assert!(open("file:///tmp/x").is_ok());
    assert!(open("s3://bucket/prefix").is_ok());
}

#[test]
fn object_storage_conformance() {
    let memory: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    conformance(&ObjectStorage::new(memory.clone(), "data/set", "mem://data/set"));
    // every key stayed under the prefix
    let outside = ObjectStorage::new(memory, "data", "mem://data");
    assert_eq!(outside.list("").unwrap(), vec!["set/a/b/c.bin".to_string()]);
}

#[test]
fn multipart_uploads_are_whole() {
    let memory: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let store = ObjectStorage::new(memory, "", "mem://").with_multipart(10, 4);
    let data: Vec<u8> = (0..=255).collect();
    store.put("big.bin", Bytes::from(data.clone())).unwrap();
    assert_eq!(store.get("big.bin").unwrap().unwrap(), Bytes::from(data));
}

#[test]
fn close_ranges_are_fetched_together() {
    let memory: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let store = ObjectStorage::new(memory, "", "mem://");
    let data: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
    store.put("f", Bytes::from(data.clone())).unwrap();
    let before = store.stats().snapshot().0;
    let far = 900_000u64;
    let ranges = [far..far + 10, 10..20, 0..5, 100..200];
    let parts = store.get_ranges("f", &ranges).unwrap().unwrap();
    for (r, p) in ranges.iter().zip(&parts) {
        assert_eq!(&p[..], &data[r.start as usize..r.end as usize]);
    }
    // 0..5, 10..20 and 100..200 are one request; 900000.. another
    assert_eq!(store.stats().snapshot().0 - before, 2);
}
