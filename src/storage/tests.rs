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
fn files_read_into_kept_buffers_are_each_exactly_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStorage::new(dir.path());
    // Large enough for their buffers to be kept and lent again, the larger
    // first: a buffer lent again must hold nothing of the file before.
    let files: Vec<(String, Vec<u8>)> = [(1 << 20, 0xAA), (300 << 10, 0xBB), (2 << 20, 0xCC), (1 << 20, 0xDD)]
        .iter()
        .enumerate()
        .map(|(i, &(n, byte))| (format!("f{i}.bin"), (0..n).map(|k| byte ^ (k % 7) as u8).collect()))
        .collect();
    for (key, data) in &files {
        store.put(key, Bytes::from(data.clone())).unwrap();
    }
    for round in 0..3 {
        // held at once, then all given back: each read after takes one
        let held: Vec<Bytes> = files.iter().map(|(key, _)| store.get(key).unwrap().unwrap()).collect();
        for ((key, data), got) in files.iter().zip(&held) {
            assert!(got[..] == data[..], "{key}, round {round}");
        }
        drop(held);
        for (key, data) in files.iter().rev() {
            let got = store.get(key).unwrap().unwrap();
            assert!(got[..] == data[..], "{key} read alone, round {round}");
        }
    }
    // ranges read into kept buffers too, each range exactly its bytes
    for round in 0..3 {
        for (key, data) in &files {
            let n = data.len() as u64;
            // (the whole file as one range takes a buffer a whole read gave back)
            let whole: Vec<std::ops::Range<u64>> = std::iter::once(0..n).collect();
            for ranges in [vec![0..10, n / 3..n / 2, n - 5..n], whole] {
                let got = store.get_ranges(key, &ranges).unwrap().unwrap();
                for (r, part) in ranges.iter().zip(&got) {
                    assert!(part[..] == data[r.start as usize..r.end as usize], "{key} {r:?}, round {round}");
                }
            }
        }
    }
    // a slice of a lent buffer outlives the store and the other reads
    let part = store.get("f2.bin").unwrap().unwrap().slice(10..20);
    drop(store);
    assert_eq!(&part[..], &files[2].1[10..20]);
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

#[test]
fn many_requests_are_answered_each_in_its_place() {
    let memory: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let store = ObjectStorage::new(memory, "", "mem://");
    let a: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    store.put("a", Bytes::from(a.clone())).unwrap();
    store.put("b", Bytes::from_static(b"0123456789")).unwrap();
    let requests: Vec<(String, Vec<Range<u64>>)> = vec![
        ("a".into(), vec![150_000..150_010, 10..20, 0..5]),
        ("missing".into(), std::iter::once(0..1).collect()),
        ("b".into(), vec![4..4, 5..7]),
        ("b".into(), std::iter::once(8..11).collect()),
        ("b".into(), std::iter::once(3..3).collect()),
        ("a".into(), std::iter::once(199_990..200_000).collect()),
    ];
    let answers = store.get_ranges_many(&requests);
    assert_eq!(answers.len(), requests.len());
    let parts = |i: usize| answers[i].as_ref().unwrap().clone().unwrap();
    for (r, p) in requests[0].1.iter().zip(parts(0)) {
        assert_eq!(&p[..], &a[r.start as usize..r.end as usize]);
    }
    assert!(matches!(answers[1], Ok(None)));
    assert_eq!(parts(2), vec![Bytes::new(), Bytes::from_static(b"56")]);
    assert!(matches!(answers[3], Err(StorageError::Range { start: 8, end: 11, .. })), "{:?}", answers[3]);
    assert_eq!(parts(4), vec![Bytes::new()]);
    assert_eq!(&parts(5)[0][..], &a[199_990..]);
    // the merging a read costs is the merging it does
    assert_eq!(store.read_cost(&requests[0].1), (2, 20 + 10));
    assert_eq!(store.read_cost(std::slice::from_ref(&(5..5))), (0, 0));
}

#[test]
fn merged_ranges_hold_each_span_whole() {
    let m = merge_ranges(vec![0..10, 16..40, 40..50, 10_000..10_008, 20_000..20_100], 4 << 10);
    assert_eq!(m, vec![0..50, 10_000..10_008, 20_000..20_100]);
    assert_eq!(merge_ranges(vec![], 10), Vec::<Range<u64>>::new());
    // a span inside another, an empty one dropped, a gap of exactly `gap` joined
    assert_eq!(merge_ranges(vec![100..200, 150..160, 7..7, 5_000..6_000], 100), vec![100..200, 5_000..6_000]);
    assert_eq!(merge_ranges(vec![0..10, 20..30], 10), vec![0..30]);
    assert_eq!(merge_ranges(vec![0..10, 21..30], 10), vec![0..10, 21..30]);
}

/// Each failure of the HTTP client a user can act on is told apart, from
/// object_store's variant or the kind of error down its causes.
#[test]
fn request_failures_are_told_apart() {
    use object_store::client::{HttpError, HttpErrorKind};
    use std::io::{Error as IoError, ErrorKind};
    let server = Some("127.0.0.1:9".to_string());
    let generic = |e: HttpError| object_store::Error::Generic { store: "HTTP", source: Box::new(e) };
    let classify = |e: &object_store::Error| object::request_failure(e, StoreKind::S3, &server);

    let timed_out = generic(HttpError::new(HttpErrorKind::Timeout, std::fmt::Error));
    let failure = classify(&timed_out).unwrap();
    assert_eq!(failure, RequestFailure::TimedOut { kind: StoreKind::S3, server: server.clone() });
    assert!(failure.to_string().starts_with("no answer from 127.0.0.1:9 in time (timed out): check the network"));
    let io_timeout = generic(HttpError::new(HttpErrorKind::Unknown, IoError::from(ErrorKind::TimedOut)));
    assert!(matches!(classify(&io_timeout), Some(RequestFailure::TimedOut { .. })));

    let refused = generic(HttpError::new(HttpErrorKind::Connect, IoError::from(ErrorKind::ConnectionRefused)));
    assert_eq!(classify(&refused), Some(RequestFailure::Refused { kind: StoreKind::S3, server: server.clone() }));
    let dns = generic(HttpError::new(HttpErrorKind::Connect, IoError::other("failed to lookup address")));
    let failure = classify(&dns).unwrap();
    assert!(failure
        .to_string()
        .starts_with("cannot connect to 127.0.0.1:9 (failed to lookup address): check the endpoint"));

    let body = "<Error><Code>InvalidAccessKeyId</Code><Message>no such key</Message></Error>";
    let denied = object_store::Error::PermissionDenied { path: "x".into(), source: body.into() };
    let failure = classify(&denied).unwrap();
    assert_eq!(failure.to_string().split(':').next(), Some("access denied (HTTP 403, InvalidAccessKeyId)"));
    let missing = object_store::Error::NotFound { path: "x".into(), source: "gone".into() };
    assert_eq!(classify(&missing), Some(RequestFailure::NotFound { kind: StoreKind::S3 }));
    // anything else keeps the store's own words
    let other = generic(HttpError::new(HttpErrorKind::Decode, std::fmt::Error));
    assert_eq!(classify(&other), None);
}

/// A location keeps no credential, whatever part of the URL holds it.
#[test]
fn object_storage_locations_are_redacted() {
    let memory = Arc::new(object_store::memory::InMemory::new());
    let store = ObjectStorage::new(memory.clone(), "", "https://ann:secret1@host/dir");
    assert_eq!(store.location(""), "https://REDACTED@host/dir");
    assert_eq!(
        store.location("x.h5ad?X-Amz-Signature=secret2&X-Amz-Date=1"),
        "https://REDACTED@host/dir/x.h5ad?X-Amz-Signature=REDACTED&X-Amz-Date=1"
    );
    let signed = ObjectStorage::new(memory, "", "https://host/ds?token=secret3");
    assert_eq!(signed.location(""), "https://host/ds?token=REDACTED");
    assert!(!format!("{store:?}").contains("secret"));
    let refused = Location::parse("ftp://ann:secret4@host/x").unwrap_err().to_string();
    assert!(refused.starts_with("ftp://REDACTED@host/x: "), "{refused}");
}

#[test]
fn spools_outside_the_dataset_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let memory: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let store = ObjectStorage::new(memory, "", "mem://");
    // in the shared temporary folder: this account's alone
    let spool = store.spool("obs/obs_0000.parquet").unwrap();
    let mode = std::fs::metadata(spool.file.path()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // beside the dataset's files: the mode of the files it holds
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStorage::new(dir.path());
    let spool = local.spool("obs/obs_0000.parquet").unwrap();
    assert_eq!(spool.file.path().parent(), Some(dir.path().join("obs").as_path()));
    local.put_spooled("obs/obs_0000.parquet", spool).unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path().join("obs")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec!["obs_0000.parquet"]);
}
