//! deltacells append: the inputs' cells after the dataset's, byte for byte
//! what one convert of everything writes; refusals before anything changes;
//! killed and failed appends that lose nothing.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::h5::{self, Layout, Rows};
use crate::hardening::files;
use crate::util::{listing, TestDir};

/// Small tiles and obs shards, so that tiles and shards end mid-input.
const LAYOUT: [&str; 6] = ["--level", "3", "--tile-size", "7", "--obs-tiles-per-file", "2"];
/// The time appends record, so that runs compare byte for byte.
const EPOCH: [(&str, &str); 1] = [("SOURCE_DATE_EPOCH", "1700000000")];

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[derive(Clone, Copy)]
enum Score {
    Int8,
    Float32,
}

/// An .h5ad of `n` cells over `genes` (in that column order) with obs columns
/// cell_type (categorical over `categories`, some cells missing), score and
/// donor (strings).
fn input(path: &Path, n: usize, seed: u64, genes: &[String], categories: &[String], score: Score) {
    let rows: Rows = h5::random_rows(n, genes.len(), seed);
    let f = h5::create(path);
    h5::str_attr(&f, "encoding-type", "anndata");
    h5::str_attr(&f, "encoding-version", "0.1.0");
    h5::matrix(&f, "X", &rows, genes.len(), Layout::Csr, |v| v as f32);
    let stem = path.file_stem().unwrap().to_str().unwrap();
    let obs = h5::dataframe(&f, "obs", "_index", &h5::cells(n, &format!("{stem}_")));
    let ct = obs.create_group("cell_type").unwrap();
    h5::str_attr(&ct, "encoding-type", "categorical");
    h5::str_attr(&ct, "encoding-version", "0.2.0");
    h5::strings(&ct, "categories", categories);
    let codes: Vec<i16> = (0..n).map(|i| ((i as u64 * 7 + seed) % (categories.len() as u64 + 1)) as i16 - 1).collect();
    ct.new_dataset_builder().with_data(&codes[..]).create("codes").unwrap();
    match score {
        Score::Int8 => {
            let v: Vec<i8> = (0..n).map(|i| (i % 100) as i8).collect();
            obs.new_dataset_builder().with_data(&v[..]).create("score").unwrap();
        }
        Score::Float32 => {
            let v: Vec<f32> = (0..n).map(|i| i as f32 + 0.25).collect();
            obs.new_dataset_builder().with_data(&v[..]).create("score").unwrap();
        }
    }
    h5::strings(&obs, "donor", &(0..n).map(|i| format!("donor{}", (i as u64 + seed) % 3)).collect::<Vec<_>>());
    h5::dataframe(&f, "var", "gene_ids", genes);
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// Every file of a dataset with its bytes; the manifest without its metadata
/// (where convert and append records differ).
fn content(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for line in listing(dir).lines() {
        let rel = line.rsplit_once(" (").unwrap().0.to_string();
        let mut bytes = std::fs::read(dir.join(&rel)).unwrap();
        if rel == "manifest.json" {
            let mut m: Value = serde_json::from_slice(&bytes).unwrap();
            m.as_object_mut().unwrap().remove("metadata");
            bytes = serde_json::to_vec_pretty(&m).unwrap();
        }
        out.push((rel, bytes));
    }
    out
}

#[track_caller]
fn assert_same_dataset(appended: &Path, converted: &Path) {
    let (a, b) = (content(appended), content(converted));
    let names = |c: &[(String, Vec<u8>)]| c.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b), "the same files");
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(x == y, "{name} differs between {} and {}", appended.display(), converted.display());
    }
}

fn inode(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

fn appends(dir: &Path) -> Vec<Value> {
    let m: Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    m["metadata"]["appends"].as_array().cloned().unwrap_or_default()
}

#[test]
fn appends_equal_one_convert_of_every_input() {
    let t = TestDir::new();
    let genes = h5::genes(30);
    let reversed: Vec<String> = genes.iter().rev().cloned().collect();
    let (tb, nk) = (vec!["T".to_string(), "B".to_string()], vec!["NK".to_string(), "T".to_string()]);
    input(&t.join("a.h5ad"), 23, 1, &genes, &tb, Score::Int8);
    // b: a new category, and its genes in another column order.
    input(&t.join("b.h5ad"), 17, 2, &reversed, &nk, Score::Int8);
    // c: 140 categories (the codes must widen to int16) and float scores.
    input(&t.join("c.h5ad"), 40, 3, &genes, &names("c", 140), Score::Float32);
    let convert = |extra: &[&str], inputs: &[&str], out: &str| {
        t.run_env(&[&["convert", "-q"][..], &LAYOUT, extra, inputs, &[out]].concat(), &EPOCH).expect_code(0);
    };
    convert(&[], &["a.h5ad"], "ds");
    convert(&[], &["a.h5ad"], "orig");

    // 23 cells: tiles 0-2 are full, tile 3 holds 2; obs shard 1 holds tiles 2 and 3.
    let kept: Vec<(&str, u64)> = ["tiles/tile_000000.dct", "tiles/tile_000001.dct", "tiles/tile_000002.dct"]
        .into_iter()
        .chain(["obs/obs_0000.parquet"])
        .map(|k| (k, inode(&t.join("ds").join(k))))
        .collect();
    let run = t.run_env(&["append", "ds", "b.h5ad"], &EPOCH).expect_code(0);
    assert!(
        run.stdout().contains("appended 17 cells from 1 file (23 -> 40 cells): rewrote tile 3"),
        "{}",
        run.stdout()
    );
    for (key, was) in &kept {
        assert_eq!(inode(&t.join("ds").join(key)), *was, "{key} was not touched");
    }
    assert!(!t.join("ds/.append").exists());
    t.run(&["verify", "-q", "ds"]).expect_code(0);
    convert(&["--gene-order-from", "orig"], &["a.h5ad", "b.h5ad"], "ref_ab");
    assert_same_dataset(&t.join("ds"), &t.join("ref_ab"));

    // c widens cell_type's codes and score's type: every obs shard is restated.
    let run = t.run_env(&["append", "ds", "c.h5ad"], &EPOCH).expect_code(0);
    assert!(
        run.stderr()
            .contains("obs column \"cell_type\" changes from categorical (int8 codes) to categorical (int16 codes)")
            && run.stderr().contains("obs column \"score\" changes from numeric (int8) to numeric (double)")
            && run.stderr().contains("every obs shard is rewritten"),
        "{}",
        run.stderr()
    );
    t.run(&["verify", "-q", "ds"]).expect_code(0);
    convert(&["--gene-order-from", "orig"], &["a.h5ad", "b.h5ad", "c.h5ad"], "ref_abc");
    assert_same_dataset(&t.join("ds"), &t.join("ref_abc"));
    let log = appends(&t.join("ds"));
    assert_eq!(log.len(), 2);
    assert_eq!(log[0]["inputs"], serde_json::json!(["b.h5ad"]));
    assert_eq!((log[1]["cells"].as_u64(), log[1]["time"].as_str()), (Some(40), Some("2023-11-14T22:13:20Z")));
    assert!(log[1]["generator"].as_str().unwrap().starts_with("deltacells "));
    let m: Value = serde_json::from_slice(&std::fs::read(t.join("ds/manifest.json")).unwrap()).unwrap();
    assert_eq!(m["metadata"]["convert"]["inputs"], serde_json::json!(["a.h5ad"]), "convert's record is kept");
}

#[test]
fn a_vocabulary_past_max_categories_turns_into_strings_and_stays_strings() {
    let t = TestDir::new();
    let genes = h5::genes(12);
    input(&t.join("a.h5ad"), 9, 4, &genes, &["T".to_string(), "B".to_string()], Score::Int8);
    input(&t.join("c.h5ad"), 20, 5, &genes, &names("c", 140), Score::Int8);
    input(&t.join("d.h5ad"), 8, 6, &genes, &names("d", 20), Score::Int8);
    input(&t.join("e.h5ad"), 11, 7, &genes, &["T".to_string(), "e1".to_string()], Score::Int8);
    let options = [&LAYOUT[..], &["--max-categories", "150"]].concat();
    let convert = |extra: &[&str], inputs: &[&str], out: &str| {
        t.run_env(&[&["convert", "-q"][..], &options, extra, inputs, &[out]].concat(), &EPOCH).expect_code(0);
    };
    convert(&[], &["a.h5ad"], "ds");
    convert(&[], &["a.h5ad"], "orig");
    t.run_env(&["append", "-q", "ds", "c.h5ad"], &EPOCH).expect_code(0);
    // 162 categories are past 150: cell_type becomes strings; then e's
    // categories join the strings.
    let run = t.run_env(&["append", "ds", "d.h5ad", "e.h5ad"], &EPOCH).expect_code(0);
    assert!(
        run.stderr().contains("\"cell_type\" changes from categorical (int16 codes) to string"),
        "{}",
        run.stderr()
    );
    t.run(&["verify", "-q", "ds"]).expect_code(0);
    convert(&["--gene-order-from", "orig"], &["a.h5ad", "c.h5ad", "d.h5ad", "e.h5ad"], "ref");
    assert_same_dataset(&t.join("ds"), &t.join("ref"));
    let log = appends(&t.join("ds"));
    assert_eq!(log[1]["categories_as_strings"], serde_json::json!(["cell_type"]));
    // One more categorical input onto the string column.
    t.run_env(&["append", "-q", "ds", "e.h5ad"], &EPOCH).expect_code(0);
    convert(&["--gene-order-from", "orig"], &["a.h5ad", "c.h5ad", "d.h5ad", "e.h5ad", "e.h5ad"], "ref2");
    assert_same_dataset(&t.join("ds"), &t.join("ref2"));
}

#[test]
fn real_pbmc_cells_appended_equal_one_convert() {
    let Some((ctrl, stim)) = crate::util::pbmc() else { return };
    let t = TestDir::new();
    let layout = ["--level", "3", "--tile-size", "1500", "--obs-tiles-per-file", "2"];
    let run = |args: &[&str]| t.run_env(&[&args[..1], &["-q"], &layout, &args[1..]].concat(), &EPOCH).expect_code(0);
    run(&["convert", s(&ctrl), "ds"]);
    run(&["convert", s(&ctrl), "orig"]);
    t.run_env(&["append", "-q", "ds", s(&stim)], &EPOCH).expect_code(0);
    t.run(&["verify", "-q", "ds"]).expect_code(0);
    run(&["convert", "--gene-order-from", "orig", s(&ctrl), s(&stim), "ref"]);
    assert_same_dataset(&t.join("ds"), &t.join("ref"));
}

#[test]
fn inputs_that_cannot_be_appended_are_refused_before_anything_changes() {
    let t = TestDir::new();
    let genes = h5::genes(20);
    let tb = vec!["T".to_string(), "B".to_string()];
    input(&t.join("a.h5ad"), 10, 1, &genes, &tb, Score::Int8);
    t.run(&[&["convert", "-q"][..], &LAYOUT, &["a.h5ad", "ds"]].concat()).expect_code(0);
    let before = files(&t.join("ds"));
    let refused = |inputs: &[&str], needles: &[&str]| {
        let run = t.run(&[&["append", "-q", "ds"][..], inputs].concat()).expect_code(2);
        for n in needles {
            assert!(run.stderr().contains(n), "expected {n:?} in {}", run.stderr());
        }
        assert_eq!(files(&t.join("ds")), before, "the dataset is unchanged");
        assert!(!t.join("ds/.append").exists(), "nothing is left staged");
    };
    // other genes
    let mut other = genes.clone();
    other[4] = "not_a_gene".into();
    input(&t.join("genes.h5ad"), 5, 2, &other, &tb, Score::Int8);
    refused(&["genes.h5ad"], &["genes.h5ad", "has no gene \"gene4\"", "ds (var_names.txt)"]);
    // an obs column missing
    input(&t.join("missing.h5ad"), 5, 2, &genes, &tb, Score::Int8);
    let f = h5::open_rw(&t.join("missing.h5ad"));
    f.unlink("obs/score").unwrap();
    drop(f);
    refused(&["missing.h5ad"], &["missing.h5ad: obs column \"score\" is missing (it is in ds)"]);
    // an obs column of another kind
    input(&t.join("kind.h5ad"), 5, 2, &genes, &tb, Score::Int8);
    let f = h5::open_rw(&t.join("kind.h5ad"));
    f.unlink("obs/score").unwrap();
    h5::strings(&f.group("obs").unwrap(), "score", &names("s", 5));
    drop(f);
    refused(&["kind.h5ad"], &["obs column \"score\" is numeric in ds but string in kind.h5ad"]);
    // values that are not counts (found while encoding: still nothing changes)
    input(&t.join("floats.h5ad"), 3, 2, &genes, &tb, Score::Int8);
    let f = h5::open_rw(&t.join("floats.h5ad"));
    f.unlink("X").unwrap();
    let rows: Rows = vec![vec![(1, 2.0)], vec![], vec![(3, 0.5)]];
    h5::matrix(&f, "X", &rows, 20, Layout::Csr, |v| v as f32);
    drop(f);
    input(&t.join("ok.h5ad"), 5, 3, &genes, &tb, Score::Int8);
    refused(
        &["ok.h5ad", "floats.h5ad"],
        &["floats.h5ad: X: cell 2 (floats_2), gene 3 (gene3): value 0.5 is not an integer count"],
    );
    // a dataset that is incomplete
    std::fs::copy(t.join("ds/manifest.json"), t.join("manifest.keep")).unwrap();
    std::fs::remove_file(t.join("ds/manifest.json")).unwrap();
    let run = t.run(&["append", "-q", "ds", "ok.h5ad"]).expect_code(2);
    assert!(run.stderr().contains("incomplete dataset"), "{}", run.stderr());
    std::fs::copy(t.join("manifest.keep"), t.join("ds/manifest.json")).unwrap();
    // and one that fails its manifest's checks
    let text = std::fs::read_to_string(t.join("ds/manifest.json")).unwrap();
    std::fs::write(t.join("ds/manifest.json"), text.replacen("\"n_cells\": 10", "\"n_cells\": 11", 1)).unwrap();
    let run = t.run(&["append", "-q", "ds", "ok.h5ad"]).expect_code(2);
    assert!(run.stderr().contains("manifest.json"), "{}", run.stderr());
    assert!(!t.join("ds/.append").exists());
}

/// An input big enough that appending it takes a while at level 19: 40 tiles
/// of 60 cells for 2,400 cells.
fn slow_input(path: &Path, n: usize, seed: u64) {
    let genes = h5::genes(3000);
    let f = h5::create(path);
    h5::matrix(&f, "X", &h5::random_rows(n, 3000, seed), 3000, Layout::Csr, |v| v as f32);
    let obs = h5::dataframe(&f, "obs", "_index", &h5::cells(n, &format!("s{seed}_")));
    let v: Vec<f64> = (0..n).map(|i| i as f64 / 7.0).collect();
    obs.new_dataset_builder().with_data(&v[..]).create("score").unwrap();
    h5::dataframe(&f, "var", "_index", &genes);
}

const SLOW: [&str; 6] = ["--tile-size", "60", "--obs-tiles-per-file", "7", "--threads", "2"];

fn append_cmd(ds: &Path, input: &Path) -> Command {
    let mut c = crate::util::deltacells();
    c.args(["append", "-q", "--threads", "2"]).arg(ds).arg(input);
    c.env("SOURCE_DATE_EPOCH", "1700000000");
    c
}

#[test]
fn a_killed_append_loses_nothing_and_running_it_again_completes_it() {
    let t = TestDir::new();
    // a's last tile is half full, in the middle of an obs shard.
    slow_input(&t.join("a.h5ad"), 2370, 1);
    slow_input(&t.join("b.h5ad"), 2400, 2);
    t.run(&[&["convert", "-q"][..], &SLOW, &["--level", "19", "a.h5ad", "base"]].concat()).expect_code(0);
    let base = files(&t.join("base"));
    let copy = |to: &str| {
        let dir = t.join(to);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("tiles")).unwrap();
        for (name, bytes) in &base {
            std::fs::create_dir_all(dir.join(name).parent().unwrap()).unwrap();
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        dir
    };
    let reference = copy("reference");
    assert!(append_cmd(&reference, &t.join("b.h5ad")).status().unwrap().success());
    let expected = files(&reference);
    let n_tiles = 40;

    let mut interrupted = 0;
    for k in 0..10usize {
        let ds = copy(&format!("killed{k}"));
        let mut child = append_cmd(&ds, &t.join("b.h5ad")).spawn().unwrap();
        // Kill k: once k tenths of the new tiles are staged (by what is on
        // disk, not by the clock).
        let wanted = k * n_tiles / 10;
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            let staged = std::fs::read_dir(ds.join(".append/tiles")).map_or(0, |d| d.count());
            if staged >= wanted.max(usize::from(k > 0)) || child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let _ = child.kill(); // SIGKILL
        child.wait().unwrap();
        if ds.join(".append").exists() {
            interrupted += 1;
        }
        // Killed while staging: the old dataset, complete and verifying.
        if files(&ds).iter().filter(|(n, _)| !n.starts_with(".append/")).cloned().collect::<Vec<_>>() != base {
            assert_eq!(files(&ds), expected, "killed at {k}/10: neither the old dataset nor the appended one");
        }
        t.run(&["verify", "-q", s(&ds)]).expect_code(0);
        // Every other kill that left a record is completed by --resume, from
        // the record alone; the others by running the same append again.
        if k % 2 == 1 && ds.join(".append/append.json").exists() {
            let run = t.run_env(&["append", "-q", "--resume", s(&ds)], &EPOCH);
            assert_eq!(run.code(), 0, "killed at {k}/10, then --resume: {}", run.stderr());
        } else {
            assert!(append_cmd(&ds, &t.join("b.h5ad")).status().unwrap().success());
        }
        assert_eq!(files(&ds), expected, "killed at {k}/10 then completed");
    }
    assert!(interrupted >= 5, "only {interrupted} of 10 kills landed while staging");

    // A crash in the commit (the process aborts there for real): the dataset
    // is incomplete and says so; the same append, or --resume, completes it.
    // -1: before the manifest is removed; -2: every file moved, the new
    // manifest not yet written.
    if !cfg!(feature = "fault-injection") {
        crate::util::skip("built without the fault-injection feature; the crashes in a commit are not tested");
        return;
    }
    for (after, how) in [(-1, "again"), (0, "again"), (1, "resume"), (3, "again"), (-2, "resume")] {
        let ds = copy(&format!("commit{after}"));
        let status = append_cmd(&ds, &t.join("b.h5ad"))
            .env("DELTACELLS_TEST_ABORT_COMMIT_AFTER", after.to_string())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success(), "the commit was stopped after {after} moves");
        if after != -1 {
            let run = t.run(&["verify", "-q", s(&ds)]).expect_code(2);
            assert!(run.stderr().contains("an append into it was interrupted"), "{}", run.stderr());
            assert!(run.stderr().contains("append --resume"), "{}", run.stderr());
            // Another append is refused until this one is complete.
            let run = t.run(&["append", "-q", s(&ds), "a.h5ad"]).expect_code(2);
            assert!(run.stderr().contains("an append of ") && run.stderr().contains("b.h5ad"), "{}", run.stderr());
        } else {
            assert_eq!(files(&ds).iter().filter(|(n, _)| !n.starts_with(".append/")).count(), base.len());
            t.run(&["verify", "-q", s(&ds)]).expect_code(0);
        }
        let done = match how {
            "resume" => t.run_env(&["append", "--resume", s(&ds)], &EPOCH).expect_code(0),
            // (the input named otherwise than the first time: it is the same file)
            _ => t.run_env(&["append", s(&ds), "b.h5ad"], &EPOCH).expect_code(0),
        };
        assert!(done.stdout().contains("completed: 2,400 cells"), "{}", done.stdout());
        assert_eq!(files(&ds), expected, "aborted after {after} moves, then {how}");
    }
}

/// Whether this process may mount filesystems (root in its own sandbox).
fn can_mount() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false)
}

#[test]
fn an_append_that_fills_the_disk_fails_clearly_and_leaves_the_dataset_as_it_was() {
    let t = TestDir::new();
    slow_input(&t.join("a.h5ad"), 2370, 1);
    slow_input(&t.join("b.h5ad"), 2400, 2);
    t.run(&[&["convert", "-q"][..], &SLOW, &["a.h5ad", "made"]].concat()).expect_code(0);
    let made = files(&t.join("made"));
    let size: usize = made.iter().map(|(_, b)| b.len() + 4096).sum();
    let small = t.join("small");
    std::fs::create_dir(&small).unwrap();
    if !can_mount()
        || !Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={}k", size / 1024 + 96), "tmpfs"])
            .arg(&small)
            .status()
            .is_ok_and(|st| st.success())
    {
        crate::util::skip("cannot mount a small tmpfs here; disk-full test skipped");
        return;
    }
    let ds = small.join("ds");
    for (name, bytes) in &made {
        std::fs::create_dir_all(ds.join(name).parent().unwrap()).unwrap();
        std::fs::write(ds.join(name), bytes).unwrap();
    }
    let output = append_cmd(&ds, &t.join("b.h5ad")).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let after = files(&ds);
    let verify = t.run(&["verify", "-q", s(&ds)]);
    let _ = Command::new("umount").arg(&small).status();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("No space left on device") && stderr.contains("ds/.append/"), "{stderr}");
    assert_eq!(after, made, "the dataset is as it was, with nothing staged left");
    assert_eq!(verify.code(), 0, "{}", verify.stdout());
}

#[test]
fn a_planned_append_in_shards_equals_one_append() {
    let t = TestDir::new();
    let genes = h5::genes(30);
    let tb = vec!["T".to_string(), "B".to_string()];
    input(&t.join("a.h5ad"), 23, 1, &genes, &tb, Score::Int8);
    input(&t.join("b.h5ad"), 17, 2, &genes, &["NK".to_string()], Score::Int8);
    // c widens the codes and the scores: the plan restates the kept obs shards.
    input(&t.join("c.h5ad"), 40, 3, &genes, &names("c", 140), Score::Float32);
    let convert = |out: &str| {
        t.run_env(&[&["convert", "-q"][..], &LAYOUT, &["a.h5ad", out]].concat(), &EPOCH).expect_code(0);
    };
    convert("one");
    t.run_env(&["append", "-q", "one", "b.h5ad", "c.h5ad"], &EPOCH).expect_code(0);

    for n in [1usize, 3, 7] {
        let ds = format!("sharded{n}");
        convert(&ds);
        let before = files(&t.join(&ds));
        let run = t.run_env(&["plan", "--append", &ds, "b.h5ad", "c.h5ad"], &EPOCH).expect_code(0);
        assert!(
            run.stdout().contains("planned an append of 57 cells (tiles 3 to 11); up to 5 shards have work"),
            "{}",
            run.stdout()
        );
        // Until finalize, the dataset is as it was (and reads as such).
        let outside: Vec<_> = files(&t.join(&ds)).into_iter().filter(|(k, _)| !k.starts_with(".append/")).collect();
        assert_eq!(outside, before);
        t.run(&["verify", "-q", &ds]).expect_code(0);
        // Another append while the shards may be running is refused (it
        // would discard their staging), and the plan stays.
        let staged = files(&t.join(&ds));
        let run = t.run_env(&["append", "-q", &ds, "a.h5ad"], &EPOCH).expect_code(2);
        assert!(run.stderr().contains("a planned append of"), "{}", run.stderr());
        assert!(run.stderr().contains("b.h5ad"), "it names the planned inputs: {}", run.stderr());
        assert_eq!(files(&t.join(&ds)), staged);
        for k in (0..n).rev() {
            t.run(&["shard", "-q", &ds, "--shard", &format!("{k}/{n}")]).expect_code(0);
        }
        t.run(&["finalize", "-q", &ds]).expect_code(0);
        assert!(!t.join(&ds).join(".append").exists());
        t.run(&["verify", "-q", &ds]).expect_code(0);
        assert_eq!(files(&t.join(&ds)), files(&t.join("one")), "{n} shards");
    }
    // A shard of a plan whose dataset changed since is refused.
    convert("changed");
    t.run_env(&["plan", "--append", "changed", "b.h5ad"], &EPOCH).expect_code(0);
    let run = t.run(&["append", "-q", "nothing_here", "b.h5ad"]).expect_code(2);
    assert!(run.stderr().contains("nothing_here: no dataset here"), "{}", run.stderr());
    let text = std::fs::read_to_string(t.join("changed/manifest.json")).unwrap();
    std::fs::write(t.join("changed/manifest.json"), text.replace("\"deltacells ", "\"deltacells  ")).unwrap();
    let run = t.run(&["shard", "-q", "changed", "--shard", "0/1"]).expect_code(2);
    assert!(run.stderr().contains("the dataset changed since the append was planned"), "{}", run.stderr());
}

#[test]
fn a_second_writer_while_an_append_runs_is_refused_and_changes_nothing() {
    let t = TestDir::new();
    slow_input(&t.join("a.h5ad"), 2370, 1);
    slow_input(&t.join("b.h5ad"), 2400, 2);
    t.run(&[&["convert", "-q"][..], &SLOW, &["--level", "19", "a.h5ad", "ds"]].concat()).expect_code(0);
    let ds = t.join("ds");
    let reference = t.join("reference");
    std::fs::create_dir_all(&reference).unwrap();
    for (name, bytes) in files(&ds) {
        std::fs::create_dir_all(reference.join(&name).parent().unwrap()).unwrap();
        std::fs::write(reference.join(&name), bytes).unwrap();
    }
    assert!(append_cmd(&reference, &t.join("b.h5ad")).status().unwrap().success());
    let expected = files(&reference);

    let mut first = append_cmd(&ds, &t.join("b.h5ad")).spawn().unwrap();
    let started = Instant::now();
    while !ds.join(".append/append.json").exists() {
        assert!(first.try_wait().unwrap().is_none(), "the first append ended before it was seen staging");
        assert!(started.elapsed() < Duration::from_secs(60), "the first append never began staging");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Another append (of other inputs, whose settling would discard the
    // first one's staging), a resume, a finalize and a convert --overwrite:
    // each is refused at once, naming the dataset.
    let others: [&[&str]; 4] = [
        &["append", "-q", s(&ds), "a.h5ad"],
        &["append", "-q", "--resume", s(&ds)],
        &["finalize", "-q", s(&ds)],
        &["convert", "-q", "--overwrite", "a.h5ad", s(&ds)],
    ];
    for args in others {
        let run = t.run_env(args, &EPOCH).expect_code(2);
        assert!(run.stderr().contains(&format!("{}: another append", ds.display())), "{args:?}: {}", run.stderr());
    }
    assert!(first.try_wait().unwrap().is_none(), "the first append was still running while the others were refused");
    assert!(first.wait().unwrap().success());
    assert_eq!(files(&ds), expected, "the first append's result, untouched by the others");
    // Once it has ended, the dataset is free again.
    t.run_env(&["append", "-q", s(&ds), "a.h5ad"], &EPOCH).expect_code(0);
}

#[test]
fn an_append_to_a_dataset_without_obs_says_the_inputs_obs_are_not_stored() {
    let t = TestDir::new();
    let genes = h5::genes(30);
    input(&t.join("a.h5ad"), 23, 1, &genes, &["T".to_string()], Score::Int8);
    input(&t.join("b.h5ad"), 17, 2, &genes, &["B".to_string()], Score::Int8);
    let args = [&["convert", "-q", "--no-obs"][..], &LAYOUT, &["a.h5ad", "ds"]].concat();
    t.run_env(&args, &EPOCH).expect_code(0);
    let run = t.run_env(&["append", "ds", "b.h5ad"], &EPOCH).expect_code(0);
    assert!(
        run.stderr().contains("stores no obs (it was converted without it), so the obs of b.h5ad are not stored"),
        "{}",
        run.stderr()
    );
    let both = [&["convert", "-q", "--no-obs", "--gene-order-from", "ds"][..], &LAYOUT, &["a.h5ad", "b.h5ad", "one"]];
    t.run_env(&both.concat(), &EPOCH).expect_code(0);
    let tiles = |ds: &str| files(&t.join(ds)).into_iter().filter(|(n, _)| n.starts_with("tiles/")).collect::<Vec<_>>();
    assert_eq!(tiles("ds"), tiles("one"), "the tiles of one convert of both, without obs");
    assert!(!t.join("ds/obs").exists());
}

/// The row groups of `shard`, decoded, and each one's compression codec.
fn shard_groups(shard: &Path) -> (Vec<arrow_array::RecordBatch>, Vec<parquet::basic::Compression>) {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let bytes = bytes::Bytes::from(std::fs::read(shard).unwrap());
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).unwrap();
    let codecs = builder.metadata().row_groups().iter().map(|g| g.column(0).compression()).collect();
    let mut batches = Vec::new();
    for g in 0..builder.metadata().num_row_groups() {
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes.clone())
            .unwrap()
            .with_row_groups(vec![g])
            .with_batch_size(1 << 20)
            .build()
            .unwrap();
        batches.extend(reader.map(Result::unwrap));
    }
    (batches, codecs)
}

/// An append rewrites the dataset's last obs shard when it is not full: the
/// tiles it keeps of it are copied as they are encoded (here by another
/// writer, uncompressed), not decoded and encoded again, so that an append's
/// cost does not grow with the shard; the rows are those one convert writes.
#[test]
fn an_append_copies_the_kept_obs_row_groups_as_they_are_encoded() {
    let t = TestDir::new();
    let genes = h5::genes(30);
    let tb = vec!["T".to_string(), "B".to_string()];
    input(&t.join("a.h5ad"), 1200, 1, &genes, &tb, Score::Int8);
    input(&t.join("b.h5ad"), 300, 2, &genes, &tb, Score::Int8);
    let layout = ["--level", "3", "--tile-size", "500", "--obs-tiles-per-file", "4"];
    t.run_env(&[&["convert", "-q"][..], &layout, &["a.h5ad", "ds"]].concat(), &EPOCH).expect_code(0);
    t.run_env(&[&["convert", "-q"][..], &layout, &["a.h5ad", "b.h5ad", "ref"]].concat(), &EPOCH).expect_code(0);
    // The one obs shard (tiles 0-2, the last of 200 cells), written again
    // uncompressed, a row group per tile, and recorded in the manifest.
    let shard = t.join("ds/obs/obs_0000.parquet");
    let (groups, _) = shard_groups(&shard);
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::UNCOMPRESSED)
        .build();
    let mut out = Vec::new();
    let mut writer = parquet::arrow::ArrowWriter::try_new(&mut out, groups[0].schema(), Some(props)).unwrap();
    for g in &groups {
        writer.write(g).unwrap();
        writer.flush().unwrap();
    }
    writer.close().unwrap();
    std::fs::write(&shard, &out).unwrap();
    let manifest_path = t.join("ds/manifest.json");
    // Not the shard the manifest records: refused, nothing changed.
    let before = std::fs::read(&manifest_path).unwrap();
    let refused = t.run_env(&["append", "-q", "ds", "b.h5ad"], &EPOCH).expect_code(2);
    assert!(
        refused.stderr().contains("obs/obs_0000.parquet") && refused.stderr().contains("SHA-256"),
        "{}",
        refused.stderr()
    );
    assert_eq!(std::fs::read(&manifest_path).unwrap(), before);
    let mut m: Value = serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    m["obs_shard_bytes"] = serde_json::json!([out.len()]);
    let sha = vec![deltacells::format::fingerprint::sha256_hex(&out)];
    let schema = std::fs::read_to_string(t.join("ds/obs/schema.json")).unwrap();
    let tile_cells: Vec<u64> = serde_json::from_value(m["tile_cells"].clone()).unwrap();
    m["obs_fingerprint"] = deltacells::format::fingerprint::obs_fingerprint(&schema, &tile_cells, &sha).into();
    m["obs_shard_sha256"] = serde_json::json!(sha);
    std::fs::write(&manifest_path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    t.run(&["verify", "-q", "ds"]).expect_code(0);

    t.run_env(&["append", "-q", "ds", "b.h5ad"], &EPOCH).expect_code(0);
    t.run(&["verify", "-q", "ds"]).expect_code(0);
    let (appended, codecs) = shard_groups(&shard);
    use parquet::basic::Compression::{UNCOMPRESSED, ZSTD};
    // tiles 0 and 1 kept as they were; tile 2 (its 200 cells and b's 300)
    // encoded now
    assert!(matches!(codecs[..], [UNCOMPRESSED, UNCOMPRESSED, ZSTD(_)]), "{codecs:?}");
    let (expected, _) = shard_groups(&t.join("ref/obs/obs_0000.parquet"));
    assert_eq!(appended, expected, "the rows one convert writes");
}
