//! Datasets in object stores, against real servers on 127.0.0.1 started from
//! tests/servers/serve.py under $DELTACELLS_PYTHON (moto's S3 server,
//! gcp-storage-emulator, a static HTTP server with Range support), and a store
//! that adds latency per request. Skipped, with a note, where
//! $DELTACELLS_PYTHON is not set (scripts/test.sh sets it).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use deltacells::storage::{LocalStorage, ObjectStorage, RootLock, Storage};
use deltacells::Dataset;
use serde_json::Value;

use crate::servers::Server;
use crate::util::TestDir;
use deltacells::Selection;

/// Dummy keys for moto, so that no real credential source is consulted.
pub(crate) const S3_ENV: [(&str, &str); 3] =
    [("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_REGION", "us-east-1")];

pub(crate) fn s3_storage(endpoint: &str, prefix: &str) -> ObjectStorage {
    let store = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name("test")
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .build()
        .expect("S3 client");
    ObjectStorage::new(Arc::new(store), prefix, &format!("s3://test/{prefix}"))
}

fn gcs_storage(endpoint: &str, prefix: &str) -> ObjectStorage {
    let store = deltacells::storage::anonymous_gcs(object_store::gcp::GoogleCloudStorageBuilder::new())
        .with_bucket_name("test")
        .with_base_url(endpoint)
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
        .build()
        .expect("GCS client");
    ObjectStorage::new(Arc::new(store), prefix, &format!("gs://test/{prefix}"))
}

pub(crate) fn example() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/pbmc_1k.h5ad").display().to_string()
}

/// Small tiles and obs shards, so that 1,000 cells make 5 tiles and 3 shards.
pub(crate) const LAYOUT: [&str; 6] = ["--tile-size", "200", "--obs-tiles-per-file", "2", "--level", "3"];

pub(crate) fn convert_local(t: &TestDir, out: &str) {
    let mut args = vec!["convert", "-q"];
    args.extend(LAYOUT);
    let input = example();
    args.extend([input.as_str(), out]);
    t.run(&args).expect_code(0);
}

/// `value` without the keys that name where the dataset is.
fn without_location(mut value: Value) -> Value {
    if let Some(map) = value.as_object_mut() {
        map.remove("dataset");
    }
    value
}

/// The `--stats --json` line a command printed on stderr.
/// The `io` object of the last `--stats --json` line on `stderr`.
pub(crate) fn io_json(stderr: &str) -> Value {
    let line = stderr.lines().rev().find(|l| l.starts_with("{\"io\"")).expect("an io line on stderr");
    serde_json::from_str::<Value>(line).unwrap()["io"].take()
}

fn io_stats(stderr: &str) -> (u64, u64) {
    let io = io_json(stderr);
    (io["requests"].as_u64().unwrap(), io["bytes"].as_u64().unwrap())
}

pub(crate) fn same_objects(remote: &dyn Storage, local: &dyn Storage) {
    let local_keys = local.list_sizes("").unwrap();
    assert_eq!(remote.list_sizes("").unwrap(), local_keys);
    for (key, _) in &local_keys {
        assert_eq!(remote.get(key).unwrap(), local.get(key).unwrap(), "{key}");
    }
}

fn cached_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for fingerprint in std::fs::read_dir(dir).unwrap() {
        let obs = fingerprint.unwrap().path().join("obs");
        for f in std::fs::read_dir(&obs).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|e| e == "arrow") {
                out.push((p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Runs the reading commands on `local` and `remote` and asserts the same results.
fn reading_commands_agree(t: &TestDir, local: &str, remote: &str, extra: &[&str], env: &[(&str, &str)]) {
    let run = |args: &[&str], dataset: &str| {
        let mut all: Vec<&str> = args.to_vec();
        all.push(dataset);
        if dataset == remote {
            all.extend(extra);
        }
        t.run_env(&all, env)
    };
    for args in [&["info", "--json"][..], &["verify", "--json"], &["obs", "info", "--json", "--cache-dir", "c0"]] {
        let mut l = run(args, local).expect_code(0).json();
        let mut r = run(args, remote).expect_code(0).json();
        // An object store merges the nearby chunks of a column into fewer
        // requests than a local folder's reads; everything else is the same.
        if let (Some(lc), Some(rc)) = (l["columns"].as_array_mut(), r["columns"].as_array_mut()) {
            for (lc, rc) in lc.iter_mut().zip(rc.iter_mut()) {
                let (lr, rr) = (lc["fetch_requests"].take(), rc["fetch_requests"].take());
                if args[0] == "obs" {
                    assert!(rr.as_u64().unwrap() <= lr.as_u64().unwrap(), "{rr} requests remote, {lr} local");
                }
            }
        }
        assert_eq!(without_location(r), without_location(l), "{args:?}");
    }
    run(&["obs", "localize", "--all", "--cache-dir", "cache-local"], local).expect_code(0);
    let fetched = run(&["obs", "localize", "--all", "--json", "--cache-dir", "cache-remote"], remote).expect_code(0);
    assert_eq!(fetched.json()["fetched"], serde_json::json!(["obs_names"]));
    let cached = cached_files(&t.join("cache-remote"));
    assert!(!cached.is_empty());
    assert_eq!(cached, cached_files(&t.join("cache-local")));
}

#[test]
fn s3_server_holds_a_converted_dataset_that_reads_like_the_local_copy() {
    let Some(s3) = Server::start("s3", &[]) else { return };
    let t = TestDir::new();
    let endpoint = s3.url();
    convert_local(&t, "local");
    let input = example();
    let mut args = vec!["convert", "-q", "--endpoint", &endpoint];
    args.extend(LAYOUT);
    args.extend([input.as_str(), "s3://test/ds"]);
    t.run_env(&args, &S3_ENV).expect_code(0);

    // convert wrote the same objects a local convert writes, byte for byte
    let remote = s3_storage(&endpoint, "ds");
    let local = LocalStorage::new(t.join("local"));
    same_objects(&remote, &local);
    reading_commands_agree(&t, "local", "s3://test/ds", &["--endpoint", &endpoint], &S3_ENV);

    // verify reads every object once: as many bytes as the dataset holds
    let run = t.run_env(&["verify", "--stats", "--json", "s3://test/ds", "--endpoint", &endpoint], &S3_ENV);
    let (requests, bytes) = io_stats(&run.expect_code(0).stderr());
    let objects = local.list_sizes("").unwrap();
    assert_eq!(bytes, objects.iter().map(|(_, s)| s).sum::<u64>());
    assert_eq!(requests, objects.len() as u64 + 1, "one GET per object and one listing of tiles/");

    // a prefix without a dataset, and a bucket that does not exist
    let run = t.run_env(&["info", "s3://test/nothing", "--endpoint", &endpoint], &S3_ENV).expect_code(2);
    assert!(run.stderr().contains("s3://test/nothing: no dataset here"), "{}", run.stderr());
    let run = t.run_env(&["info", "s3://missing-bucket/ds", "--endpoint", &endpoint], &S3_ENV).expect_code(2);
    assert!(run.stderr().contains("s3://missing-bucket/ds") && run.stderr().contains("404"), "{}", run.stderr());
    let mut args = vec!["convert", "-q", "--endpoint", &endpoint, input.as_str(), "s3://missing-bucket/ds"];
    args.extend(LAYOUT);
    let run = t.run_env(&args, &S3_ENV).expect_code(2);
    let err = run.stderr();
    assert!(err.contains("s3://missing-bucket/ds") && err.contains("404"), "{err}");

    // a second convert into the same prefix is refused, and --overwrite replaces it
    let mut args = vec!["convert", "-q", "--endpoint", &endpoint, input.as_str(), "s3://test/ds"];
    t.run_env(&args, &S3_ENV).expect_code(2);
    args.push("--overwrite");
    t.run_env(&args, &S3_ENV).expect_code(0);
    t.run_env(&["verify", "-q", "s3://test/ds", "--endpoint", &endpoint], &S3_ENV).expect_code(0);
    assert!(remote.list("tiles").unwrap().len() == 1, "the old layout's tiles were removed");
}

#[test]
fn gene_order_from_a_dataset_in_s3() {
    use crate::gene_order::{reversed_rows, var_names, write_named};
    use crate::h5;

    let Some(s3) = Server::start("s3", &[]) else { return };
    let t = TestDir::new();
    let endpoint = s3.url();
    let genes = h5::genes(40);
    write_named(&t.join("a.h5ad"), &h5::random_rows(30, 40, 1), &genes, "a");
    write_named(&t.join("b.h5ad"), &reversed_rows(&h5::random_rows(20, 40, 2), 40), &genes, "b");
    t.run(&["convert", "-q", "--level", "3", "a.h5ad", "a_local"]).expect_code(0);
    t.run_env(&["convert", "-q", "--level", "3", "--endpoint", &endpoint, "a.h5ad", "s3://test/a"], &S3_ENV)
        .expect_code(0);
    t.run(&["convert", "-q", "--level", "3", "b.h5ad", "b_own"]).expect_code(0);
    assert_ne!(var_names(&t.join("b_own")), var_names(&t.join("a_local")), "b must have an order of its own");

    let args = ["convert", "-q", "--level", "3", "--endpoint", &endpoint, "--gene-order-from", "s3://test/a"];
    t.run_env(&[&args[..], &["b.h5ad", "b"]].concat(), &S3_ENV).expect_code(0);
    assert_eq!(var_names(&t.join("b")), var_names(&t.join("a_local")));
    let ds = Dataset::open(t.join("b").to_str().unwrap()).unwrap();
    assert_eq!(ds.manifest().metadata["convert"]["gene_order_from"], "s3://test/a (var_names.txt)");

    // A prefix that holds no dataset is refused, naming it.
    let args = ["convert", "-q", "--endpoint", &endpoint, "--gene-order-from", "s3://test/none", "b.h5ad", "c"];
    let run = t.run_env(&args, &S3_ENV).expect_code(2);
    assert!(run.stderr().contains("--gene-order-from s3://test/none"), "{}", run.stderr());
    assert!(!t.join("c").join("manifest.json").exists());
}

#[test]
fn s3_large_objects_are_uploaded_in_parts() {
    let Some(s3) = Server::start("s3", &[]) else { return };
    // moto asks for parts of at least 5 MiB, like S3
    let store = s3_storage(&s3.url(), "big").with_multipart(6 << 20, 5 << 20);
    let data: Vec<u8> = (0..13u32 << 20).map(|i| (i % 251) as u8).collect();
    store.put("obs/obs_0000.parquet", Bytes::from(data.clone())).unwrap();
    assert_eq!(store.get("obs/obs_0000.parquet").unwrap().unwrap(), Bytes::from(data));
    assert_eq!(store.list("").unwrap(), vec!["obs/obs_0000.parquet".to_string()]);
}

#[test]
fn http_server_serves_a_dataset_to_every_reading_command() {
    let t = TestDir::new();
    convert_local(&t, "local");
    // The first requests fail with 503: they are retried.
    let root = t.path().display().to_string();
    let Some(http) = Server::start("http", &[&root, "--fail-first", "2"]) else { return };
    let url = format!("{}/local", http.url());
    reading_commands_agree(&t, "local", &url, &[], &[]);

    // verify reads each file once; without a listing it cannot look for strays
    let run = t.run(&["verify", "--stats", "--json", &url]).expect_code(0);
    let (requests, bytes) = io_stats(&run.stderr());
    let objects = LocalStorage::new(t.join("local")).list_sizes("").unwrap();
    assert_eq!(bytes, objects.iter().map(|(_, s)| s).sum::<u64>());
    assert_eq!(requests, objects.len() as u64);

    let forbidden = format!("{}/forbidden/ds", http.url());
    let run = t.run(&["info", &forbidden]).expect_code(2);
    assert!(run.stderr().contains(&forbidden) && run.stderr().contains("403"), "{}", run.stderr());
    // nothing there: what a local folder with nothing in it says, though HTTP cannot list
    let nothing = format!("{}/nothing", http.url());
    let run = t.run(&["info", &nothing]).expect_code(2);
    assert_eq!(
        run.stderr().trim_end(),
        format!("deltacells: info: {nothing}: no dataset here (nothing at this location)")
    );
    let run = t.run(&["convert", &example(), &format!("{}/new", http.url())]).expect_code(2);
    assert!(run.stderr().contains("read-only"), "{}", run.stderr());
}

#[test]
fn a_store_that_fails_transiently_is_retried_and_the_retries_counted() {
    let t = TestDir::new();
    convert_local(&t, "local");
    // Every third request fails: a 503, a 500, or a connection dropped
    // without an answer, in turn.
    let root = t.path().display().to_string();
    let Some(http) = Server::start("http", &[&root, "--fail-every", "3"]) else { return };
    let url = format!("{}/local", http.url());
    reading_commands_agree(&t, "local", &url, &[], &[]);
    let run = t.run(&["verify", "--stats", "--json", &url]).expect_code(0);
    let io = io_json(&run.stderr());
    let (requests, retries) = (io["requests"].as_u64().unwrap(), io["retries"].as_u64().unwrap());
    assert!(requests > 3 && retries >= requests / 3, "{io}");
    let text = t.run(&["verify", "--stats", &url]).expect_code(0);
    assert!(text.stderr().contains("failed attempts retried"), "{}", text.stderr());
}

#[test]
fn fake_gcs_server_serves_a_dataset_to_every_reading_command() {
    let t = TestDir::new();
    convert_local(&t, "ds");
    let root = t.join("ds").display().to_string();
    // serve.py uploads the dataset through the JSON API: this server's XML
    // uploads (the API object_store writes with) answer 400 "invalid uploadType".
    let Some(gcs) = Server::start("fake-gcs", &[&root]) else { return };
    let endpoint = gcs.url();
    reading_commands_agree(&t, "ds", "gs://test/ds", &["--endpoint", &endpoint, "--anonymous"], &[]);
    let run = t.run(&["verify", "--stats", "--json", "gs://test/ds", "--endpoint", &endpoint, "--anonymous"]);
    let (requests, bytes) = io_stats(&run.expect_code(0).stderr());
    let objects = LocalStorage::new(&root).list_sizes("").unwrap();
    assert_eq!(bytes, objects.iter().map(|(_, s)| s).sum::<u64>());
    assert_eq!(requests, objects.len() as u64 + 1);
}

#[test]
fn gcs_emulator_serves_a_dataset_uploaded_to_it() {
    let t = TestDir::new();
    convert_local(&t, "ds");
    let root = t.join("ds").display().to_string();
    let Some(gcs) = Server::start("gcs", &[]) else { return };
    let remote = gcs_storage(&gcs.url(), "ds");
    let local = LocalStorage::new(&root);
    for key in local.list("").unwrap() {
        remote.put(&key, local.get(&key).unwrap().unwrap()).unwrap();
    }
    // The emulator's XML API has no listing, HEAD or DELETE, so info, verify
    // and convert cannot run on it; Dataset and obs localize use only GETs.
    let ours = Dataset::from_storage(Arc::new(remote)).unwrap();
    let theirs = Dataset::open(&root).unwrap();
    assert_eq!(ours.read(Selection::Range(0..1000)).unwrap(), theirs.read(Selection::Range(0..1000)).unwrap());
    let url = "gs://test/ds";
    let endpoint = gcs.url();
    t.run(&["obs", "localize", "--all", "--cache-dir", "cache-local", "ds"]).expect_code(0);
    let args = ["obs", "localize", "--all", "--cache-dir", "cache-remote", url, "--endpoint", &endpoint, "--anonymous"];
    t.run(&args).expect_code(0);
    assert_eq!(cached_files(&t.join("cache-remote")), cached_files(&t.join("cache-local")));
}

#[test]
fn localize_on_a_slow_store_reads_each_shards_chunks_of_a_column_in_one_request() {
    let Some((ctrl, _)) = crate::util::pbmc() else { return };
    if std::env::var_os("DELTACELLS_PYTHON").is_none() {
        crate::util::skip("DELTACELLS_PYTHON not set; slow-store test skipped");
        return;
    }
    let t = TestDir::new();
    let with_obs = t.join("pbmc_obs.h5ad");
    crate::util::python_script("add_obs_columns.py", &[ctrl.to_str().unwrap(), with_obs.to_str().unwrap()]);
    let layout = ["--tile-size", "500", "--obs-tiles-per-file", "2", "--level", "1"];
    let mut args = vec!["convert", "-q"];
    args.extend(layout);
    args.extend(["pbmc_obs.h5ad", "ds"]);
    t.run(&args).expect_code(0);

    // 100 ms per request, 100 MB/s
    let latency = Duration::from_millis(100);
    let config = object_store::throttle::ThrottleConfig {
        wait_get_per_call: latency,
        wait_get_per_byte: Duration::from_nanos(10),
        ..Default::default()
    };
    // ThrottledStore needs streamed payloads, which the in-memory store gives.
    let memory = ObjectStorage::new(Arc::new(object_store::memory::InMemory::new()), "", "mem://ds");
    let local = LocalStorage::new(t.join("ds"));
    for key in local.list("").unwrap() {
        memory.put(&key, local.get(&key).unwrap().unwrap()).unwrap();
    }
    let inner = memory.into_store();
    let slow =
        ObjectStorage::new(Arc::new(object_store::throttle::ThrottledStore::new(inner, config)), "", "slow://ds");
    let manifest = deltacells::dataset::read_manifest(&slow).unwrap();
    let tiles = manifest.n_tiles() as u64;
    assert_eq!(tiles, 14, "6,548 cells in tiles of 500");
    let shards = manifest.obs().unwrap().shard_bytes.len() as u64;
    assert_eq!(shards, 7);

    let threads = 4;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let columns = ["cell_type", "donor_id", "n_genes"].map(String::from);
    let (before, _) = slow.stats().snapshot();
    let started = Instant::now();
    let report = pool
        .install(|| deltacells::obs::localize::localize(&slow, &manifest, &columns, &t.join("cache"), false))
        .unwrap();
    let elapsed = started.elapsed();
    let (after, _) = slow.stats().snapshot();

    // obs/schema.json, one footer per shard, then per column one request per
    // shard: a column's chunks in a shard are within 64 KiB of each other, so
    // the store merges them. What the report counts is what the store served.
    assert_eq!(report.requests, 1 + shards + 3 * shards);
    assert_eq!(after - before, report.requests);
    // the same columns, localized from the local copy, are the same files
    let local_report =
        deltacells::obs::localize::localize(&local, &manifest, &columns, &t.join("cache-local"), false).unwrap();
    assert_eq!(local_report.requests, 1 + shards + 3 * tiles, "a local folder reads each chunk");
    assert_eq!(cached_files(&t.join("cache")), cached_files(&t.join("cache-local")));
    eprintln!(
        "slow store: {} requests, {} bytes, {:.2} s with {threads} in flight ({} chunks unmerged: {:.2} s of latency at {threads} in flight)",
        report.requests,
        report.bytes,
        elapsed.as_secs_f64(),
        local_report.requests,
        (latency * local_report.requests as u32 / threads as u32).as_secs_f64()
    );
}

#[test]
fn shards_on_other_machines_write_one_s3_prefix() {
    let Some(s3) = Server::start("s3", &[]) else { return };
    let t = TestDir::new();
    let endpoint = s3.url();
    convert_local(&t, "local");
    let input = example();
    let mut args = vec!["plan", "-q", "--endpoint", &endpoint];
    args.extend(LAYOUT);
    args.extend([input.as_str(), "s3://test/sharded"]);
    t.run_env(&args, &S3_ENV).expect_code(0);
    // two workers at once, as two machines would
    let workers: Vec<_> = (0..2)
        .map(|k| {
            t.command(&["shard", "-q", "s3://test/sharded", "--endpoint", &endpoint, "--shard", &format!("{k}/2")])
                .envs(S3_ENV)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut w in workers {
        assert!(w.wait().unwrap().success());
    }
    t.run_env(&["finalize", "-q", "s3://test/sharded", "--endpoint", &endpoint], &S3_ENV).expect_code(0);
    same_objects(&s3_storage(&endpoint, "sharded"), &LocalStorage::new(t.join("local")));
}

#[test]
fn a_store_that_goes_away_mid_convert_is_a_clear_error() {
    let Some(mut s3) = Server::start("s3", &[]) else { return };
    let t = TestDir::new();
    let endpoint = s3.url();
    // 1,000 cells in 50 tiles, so that the server dies between two uploads
    let input = example();
    let child = t
        .command(&[
            "convert",
            "-q",
            "--tile-size",
            "20",
            "--level",
            "19",
            &input,
            "s3://test/ds",
            "--endpoint",
            &endpoint,
        ])
        .envs(S3_ENV)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let remote = s3_storage(&endpoint, "ds");
    let started = Instant::now();
    while remote.list("tiles").map(|k| k.len()).unwrap_or(0) < 2 {
        assert!(started.elapsed() < Duration::from_secs(60), "no tile was uploaded");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(remote.get("manifest.json").unwrap().is_none());
    let _ = s3.child.kill();
    let _ = s3.child.wait();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    // (retried first: the server is gone for good)
    let refused = format!("connection refused by 127.0.0.1:{}: nothing is listening there", s3.port);
    assert!(stderr.contains("s3://test/ds/") && stderr.contains(&refused), "{stderr}");
}

#[test]
fn every_server_passes_the_storage_conformance_checks() {
    use deltacells::storage::conformance::{check_read, check_read_write, FIXTURE};
    // S3 (moto): reads and writes
    let Some(s3) = Server::start("s3", &[]) else { return };
    check_read_write(&s3_storage(&s3.url(), "conformance")).unwrap();
    // the fixture in a folder, for the read-only servers
    let t = TestDir::new();
    for (key, data) in FIXTURE {
        let path = t.join("fixture").join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }
    // HTTP with Range (no listing, read-only), through the same opener as the CLI
    let root = t.path().display().to_string();
    let Some(http) = Server::start("http", &[&root]) else { return };
    let store = deltacells::storage::open(&format!("{}/fixture", http.url())).unwrap();
    check_read(store.as_ref()).unwrap();
    // GCS (fake-gcs-server, which takes uploads only through its JSON API)
    let fixture = t.join("fixture").display().to_string();
    let Some(gcs) = Server::start("fake-gcs", &[&fixture]) else { return };
    check_read(&gcs_storage(&gcs.url(), "fixture")).unwrap();
}

#[test]
fn append_to_a_dataset_in_s3_writes_what_a_local_append_writes() {
    let Some(s3) = Server::start("s3", &[]) else { return };
    let t = TestDir::new();
    let endpoint = s3.url();
    let input = example();
    let env = [S3_ENV[0], S3_ENV[1], S3_ENV[2], ("SOURCE_DATE_EPOCH", "1700000000")];
    // 1,000 cells in tiles of 300: the last tile, partial, is rewritten.
    let layout = ["--tile-size", "300", "--obs-tiles-per-file", "2", "--level", "3"];
    t.run(&[&["convert", "-q"][..], &layout, &[input.as_str(), "local"]].concat()).expect_code(0);
    let args = [&["convert", "-q", "--endpoint", &endpoint][..], &layout, &[input.as_str(), "s3://test/ds"]].concat();
    t.run_env(&args, &S3_ENV).expect_code(0);
    t.run_env(&["append", "-q", "local", &input], &env).expect_code(0);
    t.run_env(&["append", "-q", "--endpoint", &endpoint, "s3://test/ds", &input], &env).expect_code(0);
    let remote = s3_storage(&endpoint, "ds");
    let local = LocalStorage::new(t.join("local"));
    same_objects(&remote, &local);
    // A commit stopped half-way in the bucket: incomplete, then resumed.
    if !cfg!(feature = "fault-injection") {
        crate::util::skip("built without the fault-injection feature; a crash in a commit is not tested");
        return;
    }
    t.run_env(&["append", "-q", "local", &input], &env).expect_code(0);
    // The writer killed in its commit leaves its lease (of 3 s here, 60 s
    // outside the tests): the next writer is refused, naming it, until it
    // expires, then takes it over and completes the append.
    let short_lease = ("DELTACELLS_TEST_LEASE_SECONDS", "3");
    let stopped = t.run_env(
        &["append", "-q", "--endpoint", &endpoint, "s3://test/ds", &input],
        &[env[0], env[1], env[2], env[3], ("DELTACELLS_TEST_ABORT_COMMIT_AFTER", "2"), short_lease],
    );
    assert_ne!(stopped.code(), 0);
    let run = t.run_env(&["verify", "-q", "--endpoint", &endpoint, "s3://test/ds"], &S3_ENV).expect_code(2);
    assert!(run.stderr().contains("an append into it was interrupted"), "{}", run.stderr());
    let resume = ["append", "-q", "--endpoint", &endpoint, "--resume", "s3://test/ds"];
    let refused = t.run_env(&resume, &[env[0], env[1], env[2], env[3], short_lease]).expect_code(2);
    assert!(
        refused.stderr().contains("it holds the dataset's lease: process ") && refused.stderr().contains("renewed"),
        "{}",
        refused.stderr()
    );
    std::thread::sleep(std::time::Duration::from_millis(3500));
    t.run_env(&resume, &[env[0], env[1], env[2], env[3], short_lease]).expect_code(0);
    same_objects(&remote, &local);
    t.run_env(&["verify", "-q", "--endpoint", &endpoint, "s3://test/ds"], &S3_ENV).expect_code(0);
    // and the lease is gone with its writer
    assert_eq!(remote.get(deltacells::storage::lease::LEASE_KEY).unwrap(), None);
}

#[test]
fn writers_of_a_dataset_in_a_bucket_take_turns_by_its_lease() {
    let Some(s3) = Server::start("s3", &[]) else { return };
    let t = TestDir::new();
    let endpoint = s3.url();
    let input = example();
    let env = [S3_ENV[0], S3_ENV[1], S3_ENV[2], ("SOURCE_DATE_EPOCH", "1700000000")];
    let layout = ["--tile-size", "300", "--obs-tiles-per-file", "2", "--level", "3"];
    t.run(&[&["convert", "-q"][..], &layout, &[input.as_str(), "local"]].concat()).expect_code(0);
    let args = [&["convert", "-q", "--endpoint", &endpoint][..], &layout, &[input.as_str(), "s3://test/ds"]].concat();
    t.run_env(&args, &S3_ENV).expect_code(0);
    let remote = s3_storage(&endpoint, "ds");

    // One lease at a time: a second writer of the prefix is refused while the
    // first holds it, and gets it once the first lets it go.
    let held = match remote.try_lock_root().unwrap() {
        RootLock::Leased(lease) => lease,
        _ => panic!("an S3 prefix gives a lease"),
    };
    let other = s3_storage(&endpoint, "ds");
    match other.try_lock_root().unwrap() {
        RootLock::Busy { holder: Some(holder) } => {
            assert!(holder.contains(&format!("process {}", std::process::id())), "{holder}")
        }
        _ => panic!("a held lease is refused to another writer"),
    }
    // a writer started meanwhile (the command line) is refused, naming the holder, and writes nothing
    let append = ["append", "-q", "--endpoint", &endpoint, "s3://test/ds", &input];
    let before = remote.list_sizes("").unwrap();
    let refused = t.run_env(&append, &env).expect_code(2);
    assert!(
        refused.stderr().contains(&format!("it holds the dataset's lease: process {}", std::process::id())),
        "{}",
        refused.stderr()
    );
    assert_eq!(remote.list_sizes("").unwrap(), before);
    drop(held);
    assert_eq!(remote.get(deltacells::storage::lease::LEASE_KEY).unwrap(), None);

    // Two appends started at once: one takes the lease and appends, the
    // other is refused; the dataset is one append's.
    let start = |t: &TestDir| {
        let mut command = t.command(&append);
        command.envs(env).stdout(Stdio::piped()).stderr(Stdio::piped());
        command.spawn().expect("deltacells starts")
    };
    let (a, b) = (start(&t), start(&t));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let codes = [a.status.code(), b.status.code()];
    assert!(codes.contains(&Some(0)) && codes.contains(&Some(2)), "{codes:?}");
    let loser = if a.status.code() == Some(2) { &a } else { &b };
    assert!(String::from_utf8_lossy(&loser.stderr).contains("lease"), "{}", String::from_utf8_lossy(&loser.stderr));
    t.run_env(&["append", "-q", "local", &input], &env).expect_code(0);
    same_objects(&remote, &LocalStorage::new(t.join("local")));
}
