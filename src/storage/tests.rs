//! The conformance suite every backend must pass.

use super::*;

#[test]
fn local_storage_conformance() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStorage::new(dir.path());
    for (key, data) in conformance::FIXTURE {
        store.put(key, Bytes::from_static(data)).unwrap();
    }
    // no temporary files are left behind by put
    let names: Vec<_> = std::fs::read_dir(dir.path().join("a/b")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec!["c.bin"]);
    conformance::check_read_write(&store).unwrap();
    // folders left empty by delete go too
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn locations_are_parsed_by_scheme() {
    let parse = |s: &str| Location::parse(s).unwrap();
    assert_eq!(parse("out/ds"), Location::Local("out/ds".into()));
    assert_eq!(parse("file:///tmp/ds"), Location::Local("/tmp/ds".into()));
    assert_eq!(parse("s3://bucket/a/b"), Location::S3 { bucket: "bucket".into(), prefix: "a/b".into() });
    assert_eq!(parse("s3a://bucket/a"), Location::S3 { bucket: "bucket".into(), prefix: "a".into() });
    assert_eq!(parse("gs://bucket"), Location::Gcs { bucket: "bucket".into(), prefix: "".into() });
    assert_eq!(parse("https://host/x/"), Location::Http { url: "https://host/x".into() });
    // an https address of a bucket's host is still plain HTTP
    assert_eq!(
        parse("https://bucket.s3.amazonaws.com/ds"),
        Location::Http { url: "https://bucket.s3.amazonaws.com/ds".into() }
    );
    assert!(!parse("a:b").is_remote());
    let e = Location::parse("az://container/ds").unwrap_err().to_string();
    assert!(e.contains("az:// is not a supported dataset location"), "{e}");
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
    let store = ObjectStorage::new(memory.clone(), "data/set", "mem://data/set");
    conformance::check_read_write(&store).unwrap();
    // every key stayed under the prefix
    store.put("x", Bytes::from_static(b"1")).unwrap();
    let outside = ObjectStorage::new(memory, "data", "mem://data");
    assert_eq!(outside.list("").unwrap(), vec!["set/x".to_string()]);
}

#[test]
fn the_checks_find_a_broken_store() {
    /// A store whose ranged reads come back in sorted order, not the order asked.
    struct Sorted(LocalStorage);
    impl Storage for Sorted {
        fn location(&self, key: &str) -> String {
            self.0.location(key)
        }
        fn size(&self, key: &str) -> Result<Option<u64>, StorageError> {
            self.0.size(key)
        }
        fn get(&self, key: &str) -> Result<Option<Bytes>, StorageError> {
            self.0.get(key)
        }
        fn get_ranges(&self, key: &str, ranges: &[Range<u64>]) -> Result<Option<Vec<Bytes>>, StorageError> {
            let mut sorted = ranges.to_vec();
            sorted.sort_by_key(|r| r.start);
            self.0.get_ranges(key, &sorted)
        }
        fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
            self.0.put(key, data)
        }
        fn delete(&self, key: &str) -> Result<(), StorageError> {
            self.0.delete(key)
        }
        fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
            self.0.list(prefix)
        }
        fn stats(&self) -> &IoStats {
            self.0.stats()
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let e = conformance::check_read_write(&Sorted(LocalStorage::new(dir.path()))).unwrap_err();
    assert!(e.starts_with("get_ranges: got Some(["), "{e}");
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
