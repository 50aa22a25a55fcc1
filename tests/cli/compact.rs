//! `deltacells compact`: tiles encoded again at another level are those a
//! conversion at that level writes, a kill at any step leaves the old or the
//! new dataset, and what cannot be compacted is refused without a change.

use std::path::Path;

use serde_json::Value;

use crate::hardening::files;
use crate::remote::{example, s3_storage, same_objects, S3_ENV};
use crate::servers::Server;
use crate::util::TestDir;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const EPOCH: [(&str, &str); 1] = [("SOURCE_DATE_EPOCH", "1700000000")];

/// 1,000 real cells in 10 tiles of 100 and 5 obs shards.
const LAYOUT: [&str; 4] = ["--tile-size", "100", "--obs-tiles-per-file", "2"];

fn convert(t: &TestDir, level: &str, out: &str) {
    let input = example();
    t.run(&[&["convert", "-q"][..], &LAYOUT, &["--level", level, &input, out]].concat()).expect_code(0);
}

/// The dataset's files but its manifest, and its manifest without metadata
/// (which records how the dataset was made).
fn content(dir: &Path) -> (Vec<(String, Vec<u8>)>, Value) {
    let all = files(dir);
    let manifest = all.iter().find(|(n, _)| n == "manifest.json").expect("a manifest");
    let mut manifest: Value = serde_json::from_slice(&manifest.1).unwrap();
    manifest.as_object_mut().unwrap().remove("metadata");
    (all.into_iter().filter(|(n, _)| n != "manifest.json").collect(), manifest)
}

fn compact_json(t: &TestDir, args: &[&str]) -> Value {
    let run = t.run_env(&[&["compact", "--json"][..], args].concat(), &EPOCH).expect_code(0);
    serde_json::from_str(&run.stdout()).unwrap()
}

#[test]
fn compact_writes_the_tiles_a_conversion_at_that_level_writes() {
    let t = TestDir::new();
    for level in ["1", "9", "19"] {
        convert(&t, level, &format!("level{level}"));
    }
    let fast = t.join("level1");
    let before = content(&fast);
    let summary = compact_json(&t, &["--level", "9", s(&fast)]);
    assert_eq!(summary["outcome"], "compacted");
    assert_eq!((summary["level_before"].as_i64(), summary["level"].as_i64()), (Some(1), Some(9)));
    assert_eq!(summary["tiles_encoded"], 10);
    assert_eq!(content(&fast), content(&t.join("level9")), "compacted to 9 = converted at 9");
    // Then to the default, the archive's level.
    let summary = compact_json(&t, &[s(&fast)]);
    assert_eq!(summary["level"], 19);
    assert_eq!(content(&fast), content(&t.join("level19")), "compacted to 19 = converted at 19");
    let tile_bytes = |c: &(Vec<(String, Vec<u8>)>, Value)| -> u64 {
        c.1["tile_bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).sum()
    };
    assert_eq!(summary["bytes_after"].as_u64(), Some(tile_bytes(&content(&fast))));
    assert!(tile_bytes(&content(&fast)) < tile_bytes(&before), "level 19 is smaller than level 1");
    // The obs shards and gene tables are the ones it had.
    let kept = |c: &(Vec<(String, Vec<u8>)>, Value)| -> Vec<(String, Vec<u8>)> {
        c.0.iter().filter(|(n, _)| !n.starts_with("tiles/")).cloned().collect()
    };
    assert_eq!(kept(&content(&fast)), kept(&before));
    let manifest: Value = serde_json::from_slice(&std::fs::read(fast.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["metadata"]["compacted"]["from_zstd_level"], 9);
    t.run(&["verify", "-q", s(&fast)]).expect_code(0);
    // At its level already: nothing is written.
    let listing = files(&fast);
    let run = t.run(&["compact", s(&fast)]).expect_code(0);
    assert!(run.stdout().contains("unchanged"), "{}", run.stdout());
    assert_eq!(files(&fast), listing);
}

#[test]
fn a_killed_compaction_leaves_the_old_or_the_new_dataset_and_completes_when_run_again() {
    if !cfg!(feature = "fault-injection") {
        crate::util::skip("built without the fault-injection feature; killed compactions are not tested");
        return;
    }
    let t = TestDir::new();
    convert(&t, "1", "base");
    let base = files(&t.join("base"));
    let copy = |to: &str| {
        let dir = t.join(to);
        for (name, bytes) in &base {
            std::fs::create_dir_all(dir.join(name).parent().unwrap()).unwrap();
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        dir
    };
    let reference = copy("reference");
    compact_json(&t, &[s(&reference)]);
    let expected = files(&reference);
    let outside_staging = |dir: &Path| -> Vec<(String, Vec<u8>)> {
        files(dir).into_iter().filter(|(n, _)| !n.starts_with(".append/")).collect()
    };

    // Stopped while staging, after k of the 10 tiles: the old dataset, whole;
    // the next run encodes only the tiles that are not staged.
    for k in [1usize, 4, 9] {
        let ds = copy(&format!("staging{k}"));
        let stop = ("DELTACELLS_TEST_ABORT_COMPACT_AFTER", k.to_string());
        let run = t.run_env(&["compact", "-q", s(&ds)], &[EPOCH[0], (stop.0, &stop.1)]);
        assert_ne!(run.code(), 0, "stopped after {k} tiles");
        assert_eq!(outside_staging(&ds), base, "stopped after {k} tiles: the old dataset");
        assert_eq!(std::fs::read_dir(ds.join(".append/tiles")).unwrap().count(), k);
        t.run(&["verify", "-q", s(&ds)]).expect_code(0);
        let summary = compact_json(&t, &[s(&ds)]);
        assert_eq!(summary["tiles_encoded"].as_u64(), Some(10 - k as u64), "{summary}");
        assert_eq!(files(&ds), expected, "stopped after {k} tiles, then run again");
    }

    // Stopped in the commit: -1 before the manifest is removed, -2 with every
    // tile moved; the dataset is incomplete and says so, and compact (or
    // append --resume) completes it.
    for (after, how) in [(-1, "compact"), (0, "compact"), (3, "resume"), (-2, "compact")] {
        let ds = copy(&format!("commit{after}"));
        let stop = ("DELTACELLS_TEST_ABORT_COMMIT_AFTER", after.to_string());
        let run = t.run_env(&["compact", "-q", s(&ds)], &[EPOCH[0], (stop.0, &stop.1)]);
        assert_ne!(run.code(), 0, "the commit was stopped after {after} moves");
        if after == -1 {
            assert_eq!(outside_staging(&ds), base);
            t.run(&["verify", "-q", s(&ds)]).expect_code(0);
        } else {
            let run = t.run(&["verify", "-q", s(&ds)]).expect_code(2);
            assert!(run.stderr().contains("interrupted"), "{}", run.stderr());
        }
        let done = match how {
            "resume" => t.run_env(&["append", "--resume", s(&ds)], &EPOCH).expect_code(0),
            _ => t.run_env(&["compact", s(&ds)], &EPOCH).expect_code(0),
        };
        if how == "compact" {
            assert!(done.stdout().contains("completed"), "{}", done.stdout());
        }
        assert_eq!(files(&ds), expected, "stopped after {after} moves, then {how}");
    }
}

#[test]
fn compact_refuses_what_it_cannot_compact_and_changes_nothing() {
    let t = TestDir::new();
    let run = t.run(&["compact", s(&t.join("nothing"))]).expect_code(2);
    assert!(run.stderr().contains("nothing"), "{}", run.stderr());
    t.run(&["compact", "--level", "23", "x"]).expect_code(2);

    // A damaged tile: named, and the dataset's files are as they were.
    convert(&t, "1", "damaged");
    let ds = t.join("damaged");
    let tile = ds.join("tiles/tile_000003.dct");
    let mut bytes = std::fs::read(&tile).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&tile, &bytes).unwrap();
    let before = files(&ds);
    let run = t.run(&["compact", "-q", s(&ds)]).expect_code(2);
    assert!(run.stderr().contains("tile_000003.dct"), "{}", run.stderr());
    let kept: Vec<_> = files(&ds).into_iter().filter(|(n, _)| !n.starts_with(".append/")).collect();
    assert_eq!(kept, before);

    // A planned append is under way in the dataset: refused, naming it.
    convert(&t, "1", "planned");
    let ds = t.join("planned");
    let input = example();
    t.run(&["plan", "-q", "--append", s(&ds), &input]).expect_code(0);
    let before = files(&ds);
    let run = t.run(&["compact", "-q", s(&ds)]).expect_code(2);
    assert!(run.stderr().contains("planned append") && run.stderr().contains("pbmc_1k.h5ad"), "{}", run.stderr());
    assert_eq!(files(&ds), before);
}

#[test]
fn compact_in_s3_writes_what_a_local_compact_writes_and_survives_a_kill() {
    let Some(s3) = Server::start("s3", &[]) else { return };
    let t = TestDir::new();
    let endpoint = s3.url();
    let input = example();
    let env = [S3_ENV[0], S3_ENV[1], S3_ENV[2], EPOCH[0]];
    convert(&t, "1", "local");
    let args = [&["convert", "-q", "--endpoint", &endpoint][..], &LAYOUT, &["--level", "1", &input, "s3://test/ds"]];
    t.run_env(&args.concat(), &S3_ENV).expect_code(0);
    let remote = s3_storage(&endpoint, "ds");
    let local = deltacells::storage::LocalStorage::new(t.join("local"));
    t.run_env(&["compact", "-q", "local"], &env).expect_code(0);
    let compact = ["compact", "-q", "--endpoint", &endpoint, "s3://test/ds"];
    let short_lease = ("DELTACELLS_TEST_LEASE_SECONDS", "3");
    if cfg!(feature = "fault-injection") {
        let stop = ("DELTACELLS_TEST_ABORT_COMPACT_AFTER", "3");
        let stopped = t.run_env(&compact, &[env[0], env[1], env[2], env[3], short_lease, stop]);
        assert_ne!(stopped.code(), 0);
        t.run_env(&["verify", "-q", "--endpoint", &endpoint, "s3://test/ds"], &S3_ENV).expect_code(0);
        // The killed writer's lease is left until it expires.
        std::thread::sleep(std::time::Duration::from_millis(3500));
    }
    let run = t.run_env(&compact, &[env[0], env[1], env[2], env[3], short_lease]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    same_objects(&remote, &local);
    t.run_env(&["verify", "-q", "--endpoint", &endpoint, "s3://test/ds"], &S3_ENV).expect_code(0);
}

#[test]
fn an_append_completes_or_discards_an_interrupted_compaction_then_appends() {
    if !cfg!(feature = "fault-injection") {
        crate::util::skip("built without the fault-injection feature; interrupted compactions are not tested");
        return;
    }
    let t = TestDir::new();
    let input = example();
    let append = |ds: &Path| t.run_env(&["append", s(ds), &input], &EPOCH).expect_code(0);
    // What each case must give: the compaction then the append, or the
    // append alone.
    convert(&t, "1", "compacted_then_appended");
    compact_json(&t, &[s(&t.join("compacted_then_appended"))]);
    append(&t.join("compacted_then_appended"));
    convert(&t, "1", "appended");
    append(&t.join("appended"));

    // Stopped in its commit with every tile moved: the append completes
    // the compaction (renames only), then appends.
    convert(&t, "1", "committing");
    let ds = t.join("committing");
    let stop = [EPOCH[0], ("DELTACELLS_TEST_ABORT_COMMIT_AFTER", "-2")];
    assert_ne!(t.run_env(&["compact", "-q", s(&ds)], &stop).code(), 0);
    append(&ds);
    assert_eq!(content(&ds), content(&t.join("compacted_then_appended")));
    assert!(!ds.join(".append").exists());

    // Stopped while staging: the append discards it, says so, and appends
    // to the dataset as it was.
    convert(&t, "1", "staging");
    let ds = t.join("staging");
    let stop = [EPOCH[0], ("DELTACELLS_TEST_ABORT_COMPACT_AFTER", "4")];
    assert_ne!(t.run_env(&["compact", "-q", s(&ds)], &stop).code(), 0);
    let run = append(&ds);
    assert!(run.stderr().contains("discarding an unfinished compaction"), "{}", run.stderr());
    assert_eq!(content(&ds), content(&t.join("appended")));
    assert!(!ds.join(".append").exists());
}
