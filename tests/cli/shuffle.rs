//! `convert --shuffle SEED`: every cell once, in an order fixed by the seed,
//! the same bytes for any thread or shard count, obs saying where each cell
//! was read, and `export --source-order` giving the inputs' order back.

use std::path::Path;

use serde_json::Value;

use deltacells::Dataset;

use crate::util::TestDir;
use deltacells::Selection;

const LAYOUT: [&str; 6] = ["--tile-size", "5", "--obs-tiles-per-file", "2", "--level", "3"];

/// Three sample-ordered inputs (23, 17 and 31 cells) with obs.
fn three_inputs(t: &TestDir) -> [&'static str; 3] {
    let codes =
        |n: usize, k: usize| -> Vec<i8> { (0..n).map(|i| if i % 7 == 6 { -1 } else { (i % k) as i8 }).collect() };
    crate::obs::with_obs(&t.join("a.h5ad"), &["T", "B"], &codes(23, 2), true);
    crate::obs::with_obs(&t.join("b.h5ad"), &["NK", "T", "unused"], &codes(17, 3), false);
    crate::obs::with_obs(&t.join("c.h5ad"), &["B", "DC"], &codes(31, 2), true);
    ["a.h5ad", "b.h5ad", "c.h5ad"]
}

fn convert(t: &TestDir, inputs: &[&str], extra: &[&str], out: &str) {
    let mut args = vec!["convert", "-q"];
    args.extend(LAYOUT);
    args.extend(extra);
    args.extend(inputs);
    args.push(out);
    t.run(&args).expect_code(0);
}

fn open(p: &Path) -> Dataset {
    Dataset::open(p.to_str().unwrap()).unwrap()
}

#[test]
fn shuffled_shards_and_thread_counts_write_the_same_bytes() {
    let t = TestDir::new();
    let inputs = three_inputs(&t);
    let mut layout = LAYOUT.to_vec();
    layout.extend(["--shuffle", "7"]);
    // convert, then plan + 1, 3 and 7 shards (one killed and re-run) + finalize
    crate::sharded::sharded_runs_match_convert(&t, &inputs, &layout);
    convert(&t, &inputs, &["--shuffle", "7", "--threads", "1"], "one_thread");
    crate::sharded::assert_same_tree(&t.join("one_thread"), &t.join("single"));
    t.run(&["verify", "-q", "single"]).expect_code(0);
}

#[test]
fn a_shuffled_dataset_holds_every_cell_once_and_says_where_it_was_read() {
    let t = TestDir::new();
    let inputs = three_inputs(&t);
    convert(&t, &inputs, &[], "plain");
    convert(&t, &inputs, &["--shuffle", "7"], "shuffled");
    convert(&t, &inputs, &["--shuffle", "8"], "other_seed");
    t.run(&["verify", "-q", "shuffled"]).expect_code(0);
    let (plain, shuffled) = (open(&t.join("plain")), open(&t.join("shuffled")));
    assert_eq!(shuffled.n_cells(), 71);
    let (a, b) = (crate::convert::source_order(&plain), crate::convert::source_order(&shuffled));

    let (schema, plain_obs) = crate::obs::obs_values(&t.join("plain"));
    let (shuffled_schema, obs) = crate::obs::obs_values(&t.join("shuffled"));
    // The inputs' columns, then where each cell was read.
    let names: Vec<&str> = shuffled_schema.columns.iter().map(|c| c.name.as_str()).collect();
    let mut expected: Vec<&str> = schema.columns.iter().map(|c| c.name.as_str()).collect();
    expected.extend(["source_file", "source_row"]);
    assert_eq!(names, expected);
    let files = shuffled_schema.column("source_file").unwrap().categories.clone().unwrap();
    assert_eq!(files, inputs.iter().map(|&p| Value::from(p)).collect::<Vec<_>>());
    let offsets = [0u64, 23, 40];
    let (file_col, row_col) = (names.len() - 2, names.len() - 1);
    let mut seen = [false; 71];
    for cell in 0..71 {
        let file = obs[file_col][cell].as_u64().unwrap() as usize;
        let row = obs[row_col][cell].as_u64().unwrap();
        let source = (offsets[file] + row) as usize;
        assert!(!seen[source], "cell {source} stored twice");
        seen[source] = true;
        // its counts and every obs value are those of the cell it came from
        assert_eq!(b[cell], a[source], "cell {cell} (input {file}, row {row})");
        for (column, values) in plain_obs.iter().enumerate() {
            assert_eq!(obs[column][cell], values[source], "{} of cell {cell}", names[column]);
        }
    }
    // Every tile of 5 cells holds cells of more than one input (the inputs'
    // order would give 14 of 15 tiles of one input), and another seed gives
    // another order.
    let mixed = (0..71).step_by(5).filter(|&s| (s..(s + 5).min(71)).any(|c| obs[file_col][c] != obs[file_col][s]));
    assert!(mixed.count() >= 10);
    let (_, other) = crate::obs::obs_values(&t.join("other_seed"));
    assert_ne!(other[row_col], obs[row_col]);
    // The manifest records the seed.
    let manifest: Value = serde_json::from_slice(&std::fs::read(t.join("shuffled/manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["metadata"]["convert"]["shuffle"]["seed"], Value::from(7));
}

#[test]
fn export_source_order_gives_the_inputs_order_back() {
    let t = TestDir::new();
    let inputs = three_inputs(&t);
    convert(&t, &inputs, &[], "plain");
    convert(&t, &inputs, &["--shuffle", "11"], "shuffled");
    t.run(&["export", "-q", "plain", "plain.h5ad"]).expect_code(0);
    t.run(&["export", "-q", "--source-order", "shuffled", "back.h5ad"]).expect_code(0);
    // Converted again (unshuffled, the same gene order), both give the same tiles and obs.
    for (input, out) in [("plain.h5ad", "plain2"), ("back.h5ad", "back2")] {
        t.run(&["convert", "-q", "--gene-order-files", "0", "--tile-size", "5", "--level", "3", input, out])
            .expect_code(0);
    }
    let (x, y) = (open(&t.join("plain2")), open(&t.join("back2")));
    assert_eq!(x.read(Selection::Range(0..71)).unwrap(), y.read(Selection::Range(0..71)).unwrap());
    assert_eq!(crate::obs::obs_values(&t.join("plain2")), crate::obs::obs_values(&t.join("back2")));
    // A part of the cells, in their source order.
    t.run(&["export", "-q", "--source-order", "--cells", "10:30", "shuffled", "part.h5ad"]).expect_code(0);
    t.run(&["convert", "-q", "--gene-order-files", "0", "part.h5ad", "part"]).expect_code(0);
    let (_, part) = crate::obs::obs_values(&t.join("part"));
    let (_, all) = crate::obs::obs_values(&t.join("back2"));
    let names = |v: &[Value]| v.iter().map(|n| n.as_str().unwrap().to_string()).collect::<Vec<_>>();
    let mut sorted = names(&part[0]);
    sorted.sort_by_key(|n| names(&all[0]).iter().position(|m| m == n).unwrap());
    assert_eq!(names(&part[0]), sorted, "the part's cells are in source order");
}

#[test]
fn shuffle_errors_name_the_argument_and_leave_nothing() {
    let t = TestDir::new();
    let inputs = three_inputs(&t);
    let run = |extra: &[&str], out: &str| {
        let mut args = vec!["convert", "-q"];
        args.extend(extra);
        args.extend(inputs);
        args.push(out);
        t.run(&args)
    };
    let r = run(&["--shuffle=-1"], "o1").expect_code(2);
    assert!(r.stderr().contains("--shuffle"), "{}", r.stderr());
    let r = run(&["--shuffle", "x"], "o2").expect_code(2);
    assert!(r.stderr().contains("--shuffle"), "{}", r.stderr());
    let r = run(&["--spill-dir", "/tmp"], "o3").expect_code(2);
    assert!(r.stderr().contains("--shuffle"), "{}", r.stderr());
    let missing = t.join("no/such/dir");
    let r = run(&["--shuffle", "1", "--spill-dir", missing.to_str().unwrap()], "o4").expect_code(2);
    assert!(r.stderr().contains("no/such/dir"), "{}", r.stderr());
    assert!(!t.join("o4").exists(), "nothing is created");
    // A shuffled append needs obs that says where the cells were read.
    run(&[], "unshuffled").expect_code(0);
    let before = std::fs::read(t.join("unshuffled/manifest.json")).unwrap();
    let r = t.run(&["append", "-q", "--shuffle", "5", "unshuffled", "a.h5ad"]).expect_code(2);
    assert!(r.stderr().contains("no source_file and source_row columns"), "{}", r.stderr());
    assert_eq!(std::fs::read(t.join("unshuffled/manifest.json")).unwrap(), before);
    assert!(!t.join("unshuffled/.append").exists());
    // A dataset that was not shuffled has no source order to give back.
    run(&[], "plain").expect_code(0);
    let r = t.run(&["export", "-q", "--source-order", "plain", "x.h5ad"]).expect_code(2);
    assert!(
        r.stderr().contains("--source-order") && r.stderr().contains("not converted with --shuffle"),
        "{}",
        r.stderr()
    );
    assert!(!t.join("x.h5ad").exists());
}

/// Checks that every cell of `dataset` holds the counts and obs of the cell of
/// `plain` (the same inputs converted in order) that its source_file and
/// source_row name, given where each input starts in `plain`; returns the
/// (input, row) of each cell.
fn check_against_plain(t: &TestDir, dataset: &str, plain: &str, offsets: &[u64]) -> Vec<(u64, u64)> {
    let a = crate::convert::source_order(&open(&t.join(plain)));
    let b = crate::convert::source_order(&open(&t.join(dataset)));
    let (_, plain_obs) = crate::obs::obs_values(&t.join(plain));
    let (schema, obs) = crate::obs::obs_values(&t.join(dataset));
    let n = schema.columns.len();
    assert_eq!(b.len(), a.len());
    let mut seen = vec![false; a.len()];
    let mut origins = Vec::new();
    for cell in 0..b.len() {
        let (file, row) = (obs[n - 2][cell].as_u64().unwrap(), obs[n - 1][cell].as_u64().unwrap());
        let source = (offsets[file as usize] + row) as usize;
        assert!(!std::mem::replace(&mut seen[source], true), "{dataset}: cell {source} stored twice");
        assert_eq!(b[cell], a[source], "{dataset}: cell {cell} (input {file}, row {row})");
        for (column, values) in plain_obs.iter().enumerate() {
            assert_eq!(obs[column][cell], values[source], "{dataset}: {} of cell {cell}", schema.columns[column].name);
        }
        origins.push((file, row));
    }
    origins
}

#[test]
fn appending_to_a_shuffled_dataset_keeps_its_cells_and_says_where_the_new_ones_were_read() {
    let t = TestDir::new();
    three_inputs(&t);
    // a (23 cells) and c (31): 54 cells, the last tile of 5 holds 4.
    convert(&t, &["a.h5ad", "c.h5ad"], &["--shuffle", "7"], "ds");
    convert(&t, &["a.h5ad", "c.h5ad", "b.h5ad"], &[], "plain");
    for copy in ["shuffled_append", "plain_append", "sharded_append"] {
        let status = std::process::Command::new("cp").arg("-r").arg(t.join("ds")).arg(t.join(copy)).status().unwrap();
        assert!(status.success());
    }
    const EPOCH: [(&str, &str); 1] = [("SOURCE_DATE_EPOCH", "1700000000")];
    t.run_env(&["append", "-q", "--shuffle", "9", "shuffled_append", "b.h5ad"], &EPOCH).expect_code(0);
    t.run_env(&["append", "-q", "plain_append", "b.h5ad"], &EPOCH).expect_code(0);
    for ds in ["shuffled_append", "plain_append"] {
        t.run(&["verify", "-q", ds]).expect_code(0);
    }
    let offsets = [0, 23, 54];
    convert(&t, &["a.h5ad", "c.h5ad"], &[], "plain_ac");
    let before = check_against_plain(&t, "ds", "plain_ac", &offsets[..2]);
    let shuffled = check_against_plain(&t, "shuffled_append", "plain", &offsets);
    let in_order = check_against_plain(&t, "plain_append", "plain", &offsets);
    // The dataset's cells keep their places, the tiles it kept their bytes.
    assert_eq!(shuffled[..54], before[..]);
    assert_eq!(in_order[..54], before[..]);
    for tile in 0..10 {
        let key = deltacells::format::tile_key(tile);
        let kept = std::fs::read(t.join("ds").join(&key)).unwrap();
        assert_eq!(std::fs::read(t.join("shuffled_append").join(&key)).unwrap(), kept, "{key}");
    }
    // b's cells come after them: in order, or shuffled among themselves.
    let b_rows = |origins: &[(u64, u64)]| origins[54..].iter().map(|&(f, r)| (f == 2).then_some(r)).collect::<Vec<_>>();
    assert_eq!(b_rows(&in_order), (0..17).map(Some).collect::<Vec<_>>());
    let mut rows = b_rows(&shuffled);
    assert_ne!(rows, b_rows(&in_order));
    rows.sort();
    assert_eq!(rows, b_rows(&in_order));
    // b's path follows the dataset's inputs in source_file.
    let (schema, _) = crate::obs::obs_values(&t.join("shuffled_append"));
    let files = schema.column("source_file").unwrap().categories.clone().unwrap();
    assert_eq!(files, vec![Value::from("a.h5ad"), Value::from("c.h5ad"), Value::from("b.h5ad")]);

    // Planned for shards: the same bytes.
    t.run_env(&["plan", "-q", "--append", "sharded_append", "--shuffle", "9", "b.h5ad"], &EPOCH).expect_code(0);
    for k in ["1/2", "0/2"] {
        t.run(&["shard", "-q", "sharded_append", "--shard", k]).expect_code(0);
    }
    t.run(&["finalize", "-q", "sharded_append"]).expect_code(0);
    crate::sharded::assert_same_tree(&t.join("sharded_append"), &t.join("shuffled_append"));

    // The source order is the inputs' order, the appended ones last.
    // (genes in the inputs' order: the two were converted from other inputs,
    // so their stored gene orders differ)
    t.run(&["export", "-q", "--source-gene-order", "plain", "plain.h5ad"]).expect_code(0);
    t.run(&["export", "-q", "--source-gene-order", "--source-order", "shuffled_append", "back.h5ad"]).expect_code(0);
    for (input, out) in [("plain.h5ad", "plain2"), ("back.h5ad", "back2")] {
        t.run(&["convert", "-q", "--gene-order-files", "0", "--level", "3", input, out]).expect_code(0);
    }
    assert_eq!(
        open(&t.join("plain2")).read(Selection::Range(0..71)).unwrap(),
        open(&t.join("back2")).read(Selection::Range(0..71)).unwrap()
    );
    assert_eq!(crate::obs::obs_values(&t.join("plain2")), crate::obs::obs_values(&t.join("back2")));
}
