//! Inputs at URLs (S3, HTTP, GCS), against the real servers of
//! tests/servers/serve.py: converted as the local files are, each byte
//! fetched once, and failures of the store named. Skipped, with a note,
//! where $DELTACELLS_PYTHON is not set (scripts/test.sh sets it).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use deltacells::inputs::remote::RemoteOptions;
use deltacells::storage::{LocalStorage, Storage};
use deltacells::Dataset;
use serde_json::Value;

use crate::remote::{convert_local, example, io_json, s3_storage, LAYOUT, S3_ENV};
use crate::servers::Server;
use crate::util::TestDir;

/// Every file of a dataset with its bytes; the manifest without its metadata
/// (which names the inputs as they were given).
fn dataset_content(dir: &Path) -> Vec<(String, Vec<u8>)> {
    crate::hardening::files(dir)
        .into_iter()
        .map(|(name, bytes)| {
            if name != "manifest.json" {
                return (name, bytes);
            }
            let mut m: Value = serde_json::from_slice(&bytes).unwrap();
            m.as_object_mut().unwrap().remove("metadata");
            (name, serde_json::to_vec(&m).unwrap())
        })
        .collect()
}

/// The `--stats --json` line's bytes fetched for inputs at URLs.
fn input_bytes(stderr: &str) -> u64 {
    io_json(stderr)["input_bytes"].as_u64().unwrap()
}

#[test]
fn real_h5ad_inputs_in_s3_and_on_http_convert_as_the_local_files() {
    let Some((ctrl, stim)) = crate::util::pbmc() else { return };
    let Some(s3) = Server::start("s3", &[]) else { return };
    let dir = ctrl.parent().unwrap().to_str().unwrap().to_string();
    let Some(http) = Server::start("http", &[&dir]) else { return };
    let t = TestDir::new();
    let endpoint = s3.url();
    let bucket = s3_storage(&endpoint, "inputs");
    for file in [&ctrl, &stim] {
        let name = file.file_name().unwrap().to_str().unwrap();
        bucket.put(name, Bytes::from(std::fs::read(file).unwrap())).unwrap();
    }
    let layout = ["--tile-size", "1500", "--obs-tiles-per-file", "1", "--level", "3"];
    let local = [ctrl.to_str().unwrap(), stim.to_str().unwrap()];
    t.run(&[&["convert", "-q"][..], &layout, &local, &["local"]].concat()).expect_code(0);
    let in_s3 = ["s3://test/inputs/pbmc_ctrl.h5ad".to_string(), "s3://test/inputs/pbmc_stim.h5ad".to_string()];
    let args = [&["convert", "-q", "--stats", "--json", "--endpoint", &endpoint][..], &layout];
    let run = t.run_env(&[&args.concat()[..], &[in_s3[0].as_str(), in_s3[1].as_str(), "from_s3"]].concat(), &S3_ENV);
    run.expect_code(0);
    assert_eq!(dataset_content(&t.join("from_s3")), dataset_content(&t.join("local")), "from S3");
    let on_http = [format!("{}/pbmc_ctrl.h5ad", http.url()), format!("{}/pbmc_stim.h5ad", http.url())];
    t.run(&[&["convert", "-q"][..], &layout, &[on_http[0].as_str(), on_http[1].as_str(), "from_http"]].concat())
        .expect_code(0);
    assert_eq!(dataset_content(&t.join("from_http")), dataset_content(&t.join("local")), "from HTTP");
    let ds = Dataset::open(t.join("from_http").to_str().unwrap()).unwrap();
    assert_eq!(ds.manifest().metadata["convert"]["inputs"][1], on_http[1].as_str());

    // Sharded: each shard fetches about its share of the input bytes.
    let total: u64 = [&ctrl, &stim].iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
    t.run(&[&["plan", "-q"][..], &layout, &[on_http[0].as_str(), on_http[1].as_str(), "sharded"]].concat())
        .expect_code(0);
    let n = 4;
    let plan: deltacells::convert::Plan =
        serde_json::from_slice(&std::fs::read(t.join("sharded/.plan/plan.json")).unwrap()).unwrap();
    let mut fetched = Vec::new();
    for k in 0..n {
        let args = ["shard", "-q", "sharded", "--shard", &format!("{k}/{n}"), "--stats", "--json"];
        let run = t.run_env(&args, &[("DELTACELLS_INPUT_READAHEAD_MIB", "2")]).expect_code(0);
        fetched.push(input_bytes(&run.stderr()));
    }
    t.run(&["finalize", "-q", "sharded"]).expect_code(0);
    assert_eq!(dataset_content(&t.join("sharded")), dataset_content(&t.join("local")), "sharded from HTTP");
    // Each shard's share of each file, by its cells; beyond it, a shard may
    // fetch the window read ahead of each of a file's two streams (X's data
    // and indices), the file's first and last MiB, and the blocks of HDF5
    // metadata it reads (each with a little read ahead): 8 MiB per file here.
    let window = 2 << 20; // DELTACELLS_INPUT_READAHEAD_MIB below
    let mut report = Vec::new();
    for (k, &got) in fetched.iter().enumerate() {
        let tiles = plan.shard_tiles(k, n);
        let cells = tiles.start as u64 * plan.tile_size..(tiles.end as u64 * plan.tile_size).min(plan.n_cells);
        let (mut share, mut files, mut first) = (0u64, 0u64, 0u64);
        for input in &plan.inputs {
            let here = first..first + input.n_rows;
            first = here.end;
            let rows = cells.end.min(here.end).saturating_sub(cells.start.max(here.start));
            if rows > 0 {
                share += input.bytes * rows / input.n_rows;
                files += 1;
            }
        }
        report.push(format!("shard {k}/{n}: {got} bytes fetched for a share of {share}"));
        assert!(got <= share + files * (2 * window + (8 << 20)), "{}", report.join("; "));
    }
    eprintln!("inputs of {total} bytes: {}", report.join("; "));

    // A file that changes between plan and shard is refused, naming it.
    let plan = [&["plan", "-q", "--endpoint", &endpoint][..], &layout, &[in_s3[0].as_str(), "changing"]].concat();
    t.run_env(&plan, &S3_ENV).expect_code(0);
    bucket.put("pbmc_ctrl.h5ad", Bytes::from(std::fs::read(&stim).unwrap())).unwrap();
    let run =
        t.run_env(&["shard", "-q", "changing", "--shard", "0/1", "--endpoint", &endpoint], &S3_ENV).expect_code(2);
    assert!(
        run.stderr().contains("s3://test/inputs/pbmc_ctrl.h5ad: the file changed since it was planned"),
        "{}",
        run.stderr()
    );
}

/// Starts a conversion of `args` (inputs at URLs and options) into `out`
/// that keeps little and reads little ahead, so that most of the input is
/// still to be fetched when its first tile is written; returns it then.
fn convert_until_a_tile(t: &TestDir, args: &[&str], env: &[(&str, &str)]) -> std::process::Child {
    let child = t
        .command(&["convert", "-q", "--tile-size", "300", "--level", "19", "--threads", "1", "--gene-order-files", "0"])
        .args(args)
        .arg("out")
        .env("DELTACELLS_INPUT_CACHE_MIB", "8")
        .env("DELTACELLS_INPUT_READAHEAD_MIB", "1")
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while std::fs::read_dir(t.join("out/tiles")).map_or(0, |d| d.count()) < 1 {
        assert!(started.elapsed() < Duration::from_secs(60), "no tile was written");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[test]
fn an_input_server_that_fails_mid_read_is_a_clear_error_and_leaves_no_manifest() {
    let Some((_, stim)) = crate::util::pbmc() else { return };
    let dir = stim.parent().unwrap().to_str().unwrap().to_string();
    let Some(mut http) = Server::start("http", &[&dir]) else { return };
    let t = TestDir::new();
    let url = format!("{}/pbmc_stim.h5ad", http.url());
    let child = convert_until_a_tile(&t, &[&url], &[]);
    let _ = http.child.kill();
    let _ = http.child.wait();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&url), "the error names the URL: {stderr}");
    assert!(!t.join("out/manifest.json").exists());
}

#[test]
fn download_inputs_fetches_whole_files_first_and_converts_the_same() {
    let input = example();
    let dir = Path::new(&input).parent().unwrap().to_str().unwrap().to_string();
    let Some(http) = Server::start("http", &[&dir]) else { return };
    let t = TestDir::new();
    convert_local(&t, "local");
    let url = format!("{}/pbmc_1k.h5ad", http.url());
    let args = [&["convert", "-q", "--stats", "--json", "--download-inputs", "--download-dir", "dl"][..], &LAYOUT];
    let run = t.run(&[&args.concat()[..], &[url.as_str(), "remote"]].concat()).expect_code(0);
    let size = std::fs::metadata(&input).unwrap().len();
    assert!(run.stderr().contains("1 inputs at URLs are downloaded whole into dl"), "{}", run.stderr());
    assert!(run.stderr().contains(&indicatif_bytes(size)), "the disk needed is stated: {}", run.stderr());
    assert_eq!(input_bytes(&run.stderr()), size, "each input fetched once, whole");
    let kept: Vec<_> = std::fs::read_dir(t.join("dl")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(std::fs::read(&kept[0]).unwrap(), std::fs::read(&input).unwrap());
    assert_eq!(dataset_content(&t.join("remote")), dataset_content(&t.join("local")));
}

/// A size as indicatif's HumanBytes prints it (what the notes use).
fn indicatif_bytes(n: u64) -> String {
    let mib = n as f64 / (1u64 << 20) as f64;
    format!("{mib:.2} MiB")
}

#[test]
fn an_input_replaced_by_one_of_the_same_size_is_refused_by_its_etag() {
    let Some(s3) = Server::start("s3", &[]) else { return };
    let t = TestDir::new();
    let endpoint = s3.url();
    let bucket = s3_storage(&endpoint, "inputs");
    let original = std::fs::read(example()).unwrap();
    bucket.put("pbmc_1k.h5ad", Bytes::from(original.clone())).unwrap();
    let url = "s3://test/inputs/pbmc_1k.h5ad";
    let plan = |out: &str| {
        t.run_env(&[&["plan", "-q", "--endpoint", &endpoint][..], &LAYOUT, &[url, out]].concat(), &S3_ENV)
            .expect_code(0);
    };
    plan("planned");
    let recorded: deltacells::convert::Plan =
        serde_json::from_slice(&std::fs::read(t.join("planned/.plan/plan.json")).unwrap()).unwrap();
    assert!(recorded.inputs[0].etag.is_some(), "the plan records the object's ETag");
    // The same bytes again: the same tag, and the shard runs.
    bucket.put("pbmc_1k.h5ad", Bytes::from(original.clone())).unwrap();
    let shard = ["shard", "-q", "planned", "--shard", "0/1", "--endpoint", &endpoint];
    t.run_env(&shard, &S3_ENV).expect_code(0);
    // One byte of the last one changed: the same size, another tag.
    plan("again");
    let mut changed = original.clone();
    *changed.last_mut().unwrap() ^= 1;
    bucket.put("pbmc_1k.h5ad", Bytes::from(changed)).unwrap();
    let run = t.run_env(&["shard", "-q", "again", "--shard", "0/1", "--endpoint", &endpoint], &S3_ENV).expect_code(2);
    let stderr = run.stderr();
    assert!(stderr.contains(&format!("{url}: the file changed since it was planned")), "{stderr}");
    assert!(stderr.contains("ETag"), "the message says what differs: {stderr}");
    assert!(!t.join("again/manifest.json").exists());
}

#[test]
fn gs_inputs_convert_as_the_local_file() {
    let t = TestDir::new();
    convert_local(&t, "local");
    let dir = t.join("inputs");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(example(), dir.join("pbmc_1k.h5ad")).unwrap();
    // fake-gcs-server, given the folder at its start (uploaded as inputs/...)
    let Some(gcs) = Server::start("fake-gcs", &[dir.to_str().unwrap()]) else { return };
    let endpoint = gcs.url();
    let args = [&["convert", "-q", "--stats", "--json", "--endpoint", &endpoint, "--anonymous"][..], &LAYOUT];
    let run = t.run(&[&args.concat()[..], &["gs://test/inputs/pbmc_1k.h5ad", "from_gs"]].concat()).expect_code(0);
    assert_eq!(dataset_content(&t.join("from_gs")), dataset_content(&t.join("local")));
    let size = std::fs::metadata(example()).unwrap().len();
    assert_eq!(input_bytes(&run.stderr()), size, "the file is fetched once");
}

#[test]
fn a_slow_store_serves_every_input_byte_once_and_the_same_dataset() {
    let Some((ctrl, stim)) = crate::util::pbmc() else { return };
    let dir = ctrl.parent().unwrap().to_str().unwrap().to_string();
    // 20 ms before each answer, 200 MB/s shared by all of them.
    let Some(http) = Server::start("http", &[&dir, "--latency-ms", "20", "--mbps", "200"]) else { return };
    let t = TestDir::new();
    let layout = ["--tile-size", "3000", "--level", "1", "--threads", "2"];
    let local = [ctrl.to_str().unwrap(), stim.to_str().unwrap()];
    t.run(&[&["convert", "-q"][..], &layout, &local, &["local"]].concat()).expect_code(0);
    let urls = [format!("{}/pbmc_ctrl.h5ad", http.url()), format!("{}/pbmc_stim.h5ad", http.url())];
    let args = [&["convert", "-q", "--stats", "--json"][..], &layout, &[urls[0].as_str(), urls[1].as_str(), "remote"]];
    let run = t.run(&args.concat()).expect_code(0);
    assert_eq!(dataset_content(&t.join("remote")), dataset_content(&t.join("local")));
    // Both files are read whole twice (gene totals, then tiles) and fetched
    // once: ahead of the reads, in pieces, none of them twice.
    let total: u64 = [&ctrl, &stim].iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
    assert_eq!(input_bytes(&run.stderr()), total);
    let io = io_json(&run.stderr());
    let requests = io["input_requests"].as_u64().unwrap();
    // 2 MiB pieces, and the reads of HDF5 metadata per file besides (each
    // fetches its blocks alone: 89 requests here, 38 of them pieces; with
    // read-ahead after metadata, about 70, and 1.6 times the bytes when the
    // inputs outgrow the cache).
    assert!(requests <= total / (2 << 20) + 60, "{requests} requests for {total} bytes");
    let phases = io["phases"].as_array().unwrap();
    assert!(phases.iter().any(|p| p[0] == "gene order"), "--stats gives the phases: {io}");
}

#[test]
fn an_object_replaced_while_it_is_read_stops_the_conversion_and_leaves_no_manifest() {
    let Some((ctrl, stim)) = crate::util::pbmc() else { return };
    let Some(s3) = Server::start("s3", &[]) else { return };
    let t = TestDir::new();
    let endpoint = s3.url();
    let bucket = s3_storage(&endpoint, "inputs");
    bucket.put("pbmc_stim.h5ad", Bytes::from(std::fs::read(&stim).unwrap())).unwrap();
    let url = "s3://test/inputs/pbmc_stim.h5ad";
    let child = convert_until_a_tile(&t, &["--endpoint", &endpoint, url], &S3_ENV);
    // Another file under the same key: the reads that follow are of another
    // version, and are refused rather than mixed with the first one's bytes.
    bucket.put("pbmc_stim.h5ad", Bytes::from(std::fs::read(&ctrl).unwrap())).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("{url}: the object changed while it was being read")), "{stderr}");
    assert!(!t.join("out/manifest.json").exists());
}

/// Converts 34 copies of the example served over HTTP (more than the 32
/// files the reader keeps whatever their blocks), with `env`; the bytes
/// fetched and the inputs' bytes. None when the server cannot run here.
fn convert_34_inputs_over_http(t: &TestDir, env: &[(&str, &str)]) -> Option<(u64, u64)> {
    std::fs::create_dir(t.join("inputs")).unwrap();
    let example = example();
    let n = 34;
    for i in 0..n {
        std::fs::copy(&example, t.join(&format!("inputs/in_{i:02}.h5ad"))).unwrap();
    }
    let http = Server::start("http", &[t.join("inputs").to_str().unwrap()])?;
    let urls: Vec<String> = (0..n).map(|i| format!("{}/in_{i:02}.h5ad", http.url())).collect();
    let mut args = vec!["convert", "-q", "--stats", "--json", "--level", "3"];
    args.extend(urls.iter().map(String::as_str));
    args.push("out");
    let run = t.run_env(&args, env).expect_code(0);
    t.run(&["verify", "-q", "out"]).expect_code(0);
    Some((input_bytes(&run.stderr()), n as u64 * std::fs::metadata(&example).unwrap().len()))
}

#[test]
fn more_inputs_at_urls_than_files_kept_open_are_each_fetched_once() {
    // Every pass (scan, obs, gene totals, tiles) used to fetch them all
    // again, 3.0x their bytes; the blocks now stay while the budget holds.
    let t = TestDir::new();
    let Some((fetched, total)) = convert_34_inputs_over_http(&t, &[]) else { return };
    assert!(fetched <= total + total / 10, "{fetched} bytes fetched for {total} bytes of inputs");
}

#[test]
fn inputs_at_urls_larger_than_the_block_cache_are_not_fetched_at_every_pass() {
    // The 34 inputs of 1.9 MB (65 MB) through a 40 MiB cache. Each pass reads
    // them in the same order, so the blocks of the files opened last go
    // first (the other way, 3.73 times their bytes were fetched), HDF5's
    // structure last (it is read again by every pass), and no read-ahead
    // fetches past the matrix a pass reads, nor after metadata and tables,
    // HDF5's object headers are kept by exact read, and opening a file
    // fetches 256 KiB at each end, not 1 MiB (which was all of these files):
    // measured 1.29 times (2.14 before these rules). 100 inputs of 11.6 MB
    // through 512 MiB fetch 0.78 times their bytes (their unread columns
    // never).
    let t = TestDir::new();
    let Some((fetched, total)) = convert_34_inputs_over_http(&t, &[("DELTACELLS_INPUT_CACHE_MIB", "40")]) else {
        return;
    };
    assert!(fetched <= total * 3 / 2, "{fetched} bytes fetched for {total} bytes of inputs");
}

#[test]
fn two_conversions_in_one_process_reach_their_inputs_each_its_own_way() {
    // The options of inputs at URLs are values of each conversion: one
    // downloads its input whole into a folder, the next in the same process
    // reads the same URL by ranges, and a third reaches a store that needs
    // an endpoint; all write the same dataset.
    use deltacells::convert::{convert, ConvertOptions, NoProgress};
    use deltacells::inputs::InputOptions;
    use deltacells::storage::StoreOptions;
    let t = TestDir::new();
    let example = example();
    std::fs::create_dir(t.join("inputs")).unwrap();
    std::fs::copy(&example, t.join("inputs/in.h5ad")).unwrap();
    let Some(http) = Server::start("http", &[t.join("inputs").to_str().unwrap()]) else { return };
    let Some(s3) = Server::start("s3", &[]) else { return };
    s3_storage(&s3.url(), "inputs").put("in.h5ad", Bytes::from(std::fs::read(&example).unwrap())).unwrap();
    for (k, v) in S3_ENV {
        std::env::set_var(k, v);
    }
    let url = PathBuf::from(format!("{}/in.h5ad", http.url()));
    let run = |out: &str, input: &PathBuf, inputs: InputOptions| {
        let options = ConvertOptions { inputs, ..ConvertOptions::default() };
        convert(std::slice::from_ref(input), &LocalStorage::new(t.join(out)), &options, &NoProgress).unwrap();
    };
    let downloads = t.join("downloads");
    let remote = RemoteOptions { download_dir: Some(downloads.clone()), ..RemoteOptions::default() };
    run("downloaded", &url, InputOptions { remote, ..InputOptions::default() });
    assert_eq!(std::fs::read_dir(&downloads).unwrap().count(), 1, "the input was downloaded whole");
    run("ranged", &url, InputOptions::default());
    assert_eq!(std::fs::read_dir(&downloads).unwrap().count(), 1);
    let store = StoreOptions { anonymous: false, endpoint: Some(s3.url()) };
    run(
        "from_s3",
        &PathBuf::from("s3://test/inputs/in.h5ad"),
        InputOptions { remote: RemoteOptions { store, ..RemoteOptions::default() }, ..InputOptions::default() },
    );
    t.run(&["convert", "-q", &example, "local"]).expect_code(0);
    for out in ["downloaded", "ranged", "from_s3"] {
        assert_eq!(dataset_content(&t.join(out)), dataset_content(&t.join("local")), "{out}");
    }
}

#[test]
fn ten_x_and_matrix_market_inputs_convert_from_an_http_server_as_from_disk() {
    use crate::formats::{gene_features, write_mtx, write_tenx3, MtxForm};
    let t = TestDir::new();
    let rows = crate::h5::random_rows(60, 20, 3);
    let genes = gene_features(20);
    let barcodes = crate::h5::cells(60, "bc");
    let served = t.join("served");
    std::fs::create_dir(&served).unwrap();
    write_tenx3(&served.join("s1.h5"), &rows, &genes, &(0..20).collect::<Vec<_>>(), &barcodes);
    let matrix = write_mtx(
        &served.join("s2"),
        &rows,
        &genes,
        &barcodes,
        MtxForm { gzip: true, scrambled: true, prefix: "GSM2_", ..Default::default() },
    );
    let Some(http) = Server::start("http", &[served.to_str().unwrap()]) else { return };
    let local = [served.join("s1.h5"), matrix.clone()];
    let mut args = vec!["convert", "-q", "--tile-size", "25"];
    args.extend(local.iter().map(|p| p.to_str().unwrap()));
    args.push("local");
    t.run(&args).expect_code(0);
    let urls = [format!("{}/s1.h5", http.url()), format!("{}/s2/GSM2_matrix.mtx.gz", http.url())];
    let mut args = vec!["convert", "-q", "--tile-size", "25"];
    args.extend(urls.iter().map(String::as_str));
    args.push("remote");
    t.run(&args).expect_code(0);
    assert_eq!(dataset_content(&t.join("remote")), dataset_content(&t.join("local")));
    // and downloaded whole first
    let mut args = vec!["convert", "-q", "--download-inputs", "--tile-size", "25"];
    args.extend(urls.iter().map(String::as_str));
    args.push("downloaded");
    t.run(&args).expect_code(0);
    assert_eq!(dataset_content(&t.join("downloaded")), dataset_content(&t.join("local")));
}

#[test]
fn zarr_stores_convert_from_an_http_server_as_from_disk() {
    let t = TestDir::new();
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/zarr");
    let Some(http) = Server::start("http", &[data.to_str().unwrap()]) else { return };
    for store in ["v2.zarr", "v3_sharded.zarr"] {
        let local = data.join(store);
        t.run(&["convert", "-q", "--tile-size", "16", local.to_str().unwrap(), &format!("local_{store}")])
            .expect_code(0);
        let url = format!("{}/{store}", http.url());
        t.run(&["convert", "-q", "--tile-size", "16", &url, &format!("remote_{store}")]).expect_code(0);
        assert_eq!(
            dataset_content(&t.join(&format!("remote_{store}"))),
            dataset_content(&t.join(&format!("local_{store}"))),
            "{store}"
        );
    }
}

#[test]
fn the_input_block_cache_budgets_are_arguments_refused_by_name() {
    // (given on the command line or in the environment, as before; a value
    // that is not a whole number of MiB is refused, not ignored)
    let t = TestDir::new();
    let input = example();
    let run = t.run(&["convert", "-q", "--input-cache-mib", "lots", &input, "out"]).expect_code(2);
    assert!(run.stderr().contains("--input-cache-mib"), "{}", run.stderr());
    let args = ["convert", "-q", &input, "out"];
    let run = t.run_env(&args, &[("DELTACELLS_INPUT_READAHEAD_MIB", "-3")]).expect_code(2);
    assert!(run.stderr().contains("--input-readahead-mib"), "{}", run.stderr());
    assert!(!t.join("out").exists());
    t.run_env(&args, &[("DELTACELLS_INPUT_CACHE_MIB", "16")]).expect_code(0);
    assert!(t.join("out/manifest.json").is_file());
}
