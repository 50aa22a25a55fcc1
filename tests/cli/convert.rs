//! convert: .h5ad files in, a dataset that verifies and holds the same counts.

use std::path::{Path, PathBuf};

use deltacells::format::CsrMatrix;
use deltacells::Dataset;

use crate::h5::{self, Layout, Rows};
use crate::util::TestDir;
use deltacells::Selection;

/// The dataset's cells with columns mapped back to the source gene order.
pub fn source_order(ds: &Dataset) -> Vec<Vec<(u32, u32)>> {
    let order = ds.gene_order().unwrap().unwrap();
    let m = ds.read(Selection::Range(0..ds.n_cells())).unwrap();
    (0..m.n_rows())
        .map(|r| {
            let (g, c) = m.row(r);
            let mut row: Vec<(u32, u32)> = g.iter().zip(c).map(|(&g, &c)| (order[g as usize] as u32, c)).collect();
            row.sort_unstable();
            row
        })
        .collect()
}

/// Rows as counts: zeros dropped, duplicates summed, sorted.
pub fn expected(rows: &Rows) -> Vec<Vec<(u32, u32)>> {
    rows.iter()
        .map(|row| {
            let mut m = std::collections::BTreeMap::new();
            for &(g, v) in row {
                *m.entry(g).or_insert(0u32) += v as u32;
            }
            m.into_iter().filter(|&(_, v)| v > 0).collect()
        })
        .collect()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const FAST: [&str; 4] = ["--level", "3", "--tile-size", "7"];

#[test]
fn csr_csc_dense_and_legacy_layouts_of_every_dtype_convert_to_the_same_counts() {
    let t = TestDir::new();
    let rows = h5::random_rows(30, 40, 11);
    let mut n = 0;
    let mut write = |layout: Layout, dtype: &str| {
        let path = t.join(&format!("in_{n}.h5ad"));
        n += 1;
        let f = h5::create(&path);
        match dtype {
            "f32" => h5::matrix(&f, "X", &rows, 40, layout, |v| v as f32),
            "f64" => h5::matrix(&f, "X", &rows, 40, layout, |v| v),
            "i32" => h5::matrix(&f, "X", &rows, 40, layout, |v| v as i32),
            "i64" => h5::matrix(&f, "X", &rows, 40, layout, |v| v as i64),
            "u16" => h5::matrix(&f, "X", &rows, 40, layout, |v| v as u16),
            _ => unreachable!(),
        }
        h5::dataframe(&f, "obs", "_index", &h5::cells(30, "c"));
        h5::dataframe(&f, "var", "_index", &h5::genes(40));
        path
    };
    let cases = [
        (Layout::Csr, "f32"),
        (Layout::Csr, "f64"),
        (Layout::Csr, "i32"),
        (Layout::Csr, "i64"),
        (Layout::Csr, "u16"),
        (Layout::Csc, "f32"),
        (Layout::Csc, "i32"),
        (Layout::Dense, "f32"),
        (Layout::Dense, "i64"),
        (Layout::LegacyCsr, "f32"),
    ];
    for (layout, dtype) in cases {
        let input = write(layout, dtype);
        let out = t.join(&format!("out_{layout:?}_{dtype}"));
        t.run(&["convert", "-q", s(&input), s(&out), FAST[0], FAST[1], FAST[2], FAST[3]]).expect_code(0);
        t.run(&["verify", "-q", s(&out)]).expect_code(0);
        let ds = Dataset::open(s(&out)).unwrap();
        assert_eq!(source_order(&ds), expected(&rows), "{layout:?} {dtype}");
    }
}

#[test]
fn many_inputs_tiles_cross_file_boundaries_and_output_ignores_thread_count() {
    let t = TestDir::new();
    let mut all: Rows = Vec::new();
    let mut inputs = Vec::new();
    for (i, n_cells) in [5usize, 0, 12, 3, 9].into_iter().enumerate() {
        let rows = h5::random_rows(n_cells, 60, 100 + i as u64);
        let path = t.join(&format!("part{i}.h5ad"));
        h5::write_counts(&path, &rows, 60, &format!("f{i}_"));
        all.extend(rows);
        inputs.push(path);
    }
    let list = t.join("inputs.txt");
    std::fs::write(&list, inputs[2..].iter().map(|p| format!("{}\n", p.display())).collect::<String>()).unwrap();
    let base = ["convert", "-q", "--level", "5", "--tile-size", "4", "--chunks", "3"];
    let run = |out: &str, threads: &str| {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(["--threads", threads, "--inputs-from", s(&list), s(&inputs[0]), s(&inputs[1]), out]);
        t.run(&args).expect_code(0);
    };
    run("one", "1");
    run("two", "2");
    let ds = Dataset::open(s(&t.join("one"))).unwrap();
    assert_eq!(ds.n_cells(), 29);
    assert_eq!(ds.manifest().tile_cells, vec![4, 4, 4, 4, 4, 4, 4, 1]);
    assert_eq!(source_order(&ds), expected(&all));
    t.run(&["verify", "one"]).expect_code(0);
    for f in walk(&t.join("one")) {
        let rel = f.strip_prefix(t.join("one")).unwrap();
        let other = std::fs::read(t.join("two").join(rel)).unwrap();
        assert!(std::fs::read(&f).unwrap() == other, "{} differs between --threads 1 and 2", rel.display());
    }
    // The gene order comes from decreasing totals over the sampled files.
    let totals = {
        let mut totals = vec![0u64; 60];
        for row in expected(&all) {
            for (g, c) in row {
                totals[g as usize] += u64::from(c);
            }
        }
        totals
    };
    let order = ds.gene_order().unwrap().unwrap();
    for w in order.windows(2) {
        assert!(totals[w[0] as usize] >= totals[w[1] as usize], "order is not by decreasing totals");
    }
    let names = ds.var_names().unwrap().unwrap();
    assert_eq!(names[0], format!("gene{}", order[0]));
    let meta = &ds.manifest().metadata;
    assert_eq!(meta["convert"]["inputs"].as_array().unwrap().len(), 5);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out.sort();
    out
}

#[test]
fn raw_x_and_layers_are_chosen_with_matrix() {
    let t = TestDir::new();
    let counts = h5::random_rows(10, 30, 5);
    let normalized: Rows = counts.iter().map(|r| r.iter().map(|&(g, v)| (g, v / 7.0 + 0.5)).collect()).collect();
    let path = t.join("norm.h5ad");
    let f = h5::create(&path);
    h5::matrix(&f, "X", &normalized, 30, Layout::Csr, |v| v as f32);
    h5::matrix(&f, "layers/counts", &counts, 30, Layout::Csr, |v| v as i32);
    h5::dataframe(&f, "obs", "_index", &h5::cells(10, "cell"));
    h5::dataframe(&f, "var", "_index", &h5::genes(30));
    let raw = f.create_group("raw").unwrap();
    let _ = raw;
    h5::matrix(&f, "raw/X", &counts, 30, Layout::Csr, |v| v as f32);
    h5::dataframe(&f, "raw/var", "_index", &h5::genes(30));
    drop(f);
    let run = t.run(&["convert", "-q", s(&path), "x"]).expect_code(2);
    let err = run.stderr();
    assert!(err.contains("norm.h5ad") && err.contains("X: cell 0 (cell0)") && err.contains("not an integer"), "{err}");
    assert!(err.contains("use --matrix raw/X") || err.contains("use --matrix layers/counts"), "{err}");
    assert!(!t.join("x/manifest.json").exists());
    for m in ["raw/X", "layers/counts"] {
        let out = t.join(&m.replace('/', "_"));
        t.run(&["convert", "-q", "--matrix", m, s(&path), s(&out)]).expect_code(0);
        assert_eq!(source_order(&Dataset::open(s(&out)).unwrap()), expected(&counts), "{m}");
    }
    let run = t.run(&["convert", "-q", "--matrix", "layers/nope", s(&path), "y"]).expect_code(2);
    assert!(run.stderr().contains("layers/nope: not found"), "{}", run.stderr());
}

#[test]
fn zeros_unsorted_and_duplicate_entries_are_cleaned() {
    let t = TestDir::new();
    let rows: Rows = vec![vec![(5, 2.0), (1, 0.0), (3, 1.0), (5, 3.0)], vec![], vec![(0, 65_535.0), (2, 70_000.0)]];
    let path = t.join("messy.h5ad");
    let f = h5::create(&path);
    h5::matrix(&f, "X", &rows, 6, Layout::Csr, |v| v);
    h5::dataframe(&f, "obs", "_index", &h5::cells(3, "c"));
    h5::dataframe(&f, "var", "_index", &h5::genes(6));
    drop(f);
    t.run(&["convert", "-q", s(&path), "out"]).expect_code(0);
    t.run(&["verify", "-q", "out"]).expect_code(0);
    let ds = Dataset::open(s(&t.join("out"))).unwrap();
    assert_eq!(source_order(&ds), vec![vec![(3, 1), (5, 5)], vec![], vec![(0, 65_535), (2, 70_000)]]);
}

fn bad_input(t: &TestDir, name: &str, value: f64) -> PathBuf {
    let rows: Rows = vec![vec![(0, 1.0)], vec![(1, 2.0), (3, value)]];
    let path = t.join(name);
    let f = h5::create(&path);
    h5::matrix(&f, "X", &rows, 4, Layout::Csr, |v| v);
    h5::dataframe(&f, "obs", "_index", &["a".to_string(), "b".to_string()]);
    h5::dataframe(&f, "var", "_index", &h5::genes(4));
    path
}

/// Runs convert expecting failure: exit 2, every `needle` in the message, and
/// no manifest.json in the output.
fn fails(t: &TestDir, args: &[&str], needles: &[&str]) {
    let mut all = vec!["convert", "-q"];
    all.extend_from_slice(args);
    all.push("out");
    let run = t.run(&all).expect_code(2);
    let err = run.stderr();
    for n in needles {
        assert!(err.contains(n), "expected {n:?} in: {err}");
    }
    assert!(!t.join("out/manifest.json").exists(), "a failed convert left a manifest");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn values_that_are_not_counts_name_file_cell_gene_and_value() {
    let t = TestDir::new();
    for (name, value, what) in [
        ("frac.h5ad", 2.5, "value 2.5 is not an integer"),
        ("neg.h5ad", -3.0, "value -3 is negative"),
        ("nan.h5ad", f64::NAN, "NaN"),
        ("big.h5ad", 3e9, "above the largest count"),
    ] {
        let p = bad_input(&t, name, value);
        fails(&t, &[s(&p)], &[name, "X: cell 1 (b), gene 3 (gene3)", what]);
    }
}

#[test]
fn bad_files_fail_cleanly() {
    let t = TestDir::new();
    let good = t.join("good.h5ad");
    h5::write_counts(&good, &h5::random_rows(4, 10, 1), 10, "g");
    // genes differ
    let other = t.join("other.h5ad");
    let f = h5::create(&other);
    h5::matrix(&f, "X", &h5::random_rows(4, 10, 2), 10, Layout::Csr, |v| v as f32);
    let mut names = h5::genes(10);
    names[6] = "renamed".into();
    h5::dataframe(&f, "var", "gene_ids", &names);
    drop(f);
    fails(
        &t,
        &[s(&good), s(&other)],
        &["other.h5ad", "1 of its 10 genes are not in the first file (e.g. \"renamed\"), and 1 of the first file's 10 are not in it (e.g. \"gene6\")"],
    );
    // no X
    let no_x = t.join("nox.h5ad");
    let f = h5::create(&no_x);
    h5::dataframe(&f, "var", "_index", &h5::genes(3));
    drop(f);
    fails(&t, &[s(&no_x)], &["nox.h5ad", "X: not found"]);
    // not HDF5
    let text = t.join("notes.h5ad");
    std::fs::write(&text, "just text").unwrap();
    fails(&t, &[s(&text)], &["notes.h5ad", "cannot open as HDF5"]);
    // truncated
    let bytes = std::fs::read(&good).unwrap();
    let cut = t.join("cut.h5ad");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    fails(&t, &[s(&cut)], &["cut.h5ad"]);
    // missing
    fails(&t, &["nowhere.h5ad"], &["nowhere.h5ad", "no such file"]);
    // unsupported encoding
    let odd = t.join("odd.h5ad");
    let f = h5::create(&odd);
    let g = f.create_group("X").unwrap();
    h5::str_attr(&g, "encoding-type", "awkward_array");
    h5::dataframe(&f, "var", "_index", &h5::genes(3));
    drop(f);
    fails(&t, &[s(&odd)], &["odd.h5ad", "X: unsupported", "awkward_array"]);
    // indptr that decreases
    let bad_ptr = t.join("ptr.h5ad");
    let f = h5::create(&bad_ptr);
    h5::matrix(&f, "X", &h5::random_rows(4, 10, 3), 10, Layout::Csr, |v| v as f32);
    f.dataset("X/indptr").unwrap().write_raw(&[0i64, 5, 2, 6, 7]).unwrap();
    h5::dataframe(&f, "var", "_index", &h5::genes(10));
    drop(f);
    fails(&t, &[s(&bad_ptr)], &["ptr.h5ad", "X/indptr[2]", "below the previous entry"]);
    // an index out of range
    let bad_idx = t.join("idx.h5ad");
    let f = h5::create(&bad_idx);
    h5::matrix(&f, "X", &vec![vec![(1, 1.0), (2, 1.0)]], 10, Layout::Csr, |v| v as f32);
    f.dataset("X/indices").unwrap().write_raw(&[1i32, 10]).unwrap();
    h5::dataframe(&f, "var", "_index", &h5::genes(10));
    drop(f);
    fails(&t, &[s(&bad_idx)], &["idx.h5ad", "X/indices[1]", "index 10 outside 0..10"]);
    // strings in X
    let strs = t.join("strs.h5ad");
    let f = h5::create(&strs);
    h5::strings(&f.group("/").unwrap(), "X", &["a".to_string()]);
    h5::dataframe(&f, "var", "_index", &h5::genes(3));
    drop(f);
    fails(&t, &[s(&strs)], &["strs.h5ad", "X: unsupported"]);
}

#[test]
fn output_must_be_empty_unless_overwrite() {
    let t = TestDir::new();
    let input = t.join("in.h5ad");
    let rows = h5::random_rows(9, 20, 8);
    h5::write_counts(&input, &rows, 20, "c");
    t.run(&["convert", "-q", "--tile-size", "2", s(&input), "out"]).expect_code(0);
    let run = t.run(&["convert", "-q", s(&input), "out"]).expect_code(2);
    assert!(run.stderr().contains("not empty") && run.stderr().contains("--overwrite"), "{}", run.stderr());
    // a smaller dataset over a bigger one: no stray tiles remain
    t.run(&["convert", "-q", "--overwrite", "--tile-size", "5", "--metadata", "lab=x", s(&input), "out"])
        .expect_code(0);
    t.run(&["verify", "out"]).expect_code(0);
    let ds = Dataset::open(s(&t.join("out"))).unwrap();
    assert_eq!(ds.n_tiles(), 2);
    assert_eq!(ds.manifest().metadata["lab"], "x");
}

#[test]
fn empty_inputs_make_an_empty_dataset() {
    let t = TestDir::new();
    let input = t.join("empty.h5ad");
    h5::write_counts(&input, &Vec::new(), 5, "c");
    t.run(&["convert", "-q", s(&input), "out"]).expect_code(0);
    t.run(&["verify", "out"]).expect_code(0);
    let ds = Dataset::open(s(&t.join("out"))).unwrap();
    assert_eq!((ds.n_cells(), ds.n_tiles(), ds.n_genes()), (0, 0, 5));
}

#[test]
fn golden_sources_convert_to_their_matrices() {
    let Some(dir) = crate::golden::golden() else { return };
    let t = TestDir::new();
    for name in ["tiny", "exceptions", "empty_chunk", "obs_kinds"] {
        let out = t.join(name);
        t.run(&[
            "convert",
            "-q",
            "--level",
            "3",
            "--tile-size",
            "5",
            s(&dir.join(format!("sources/{name}.h5ad"))),
            s(&out),
        ])
        .expect_code(0);
        t.run(&["verify", s(&out)]).expect_code(0);
        // The reference dataset's expected matrix, back in source order.
        let reference = Dataset::open(s(&dir.join(name))).unwrap();
        let want = match reference.gene_order().unwrap() {
            Some(_) => source_order(&reference),
            None => {
                let m: CsrMatrix = reference.read(Selection::Range(0..reference.n_cells())).unwrap();
                (0..m.n_rows())
                    .map(|r| {
                        let (g, c) = m.row(r);
                        g.iter().copied().zip(c.iter().copied()).collect()
                    })
                    .collect()
            }
        };
        let ds = Dataset::open(s(&out)).unwrap();
        assert_eq!(source_order(&ds), want, "{name}");
    }
    // obs_kinds' var has string, bool, float and int columns and a named index:
    // pandas must read them back from our var.parquet.
    let source = dir.join("sources/obs_kinds.h5ad");
    t.run(&["export", "-q", "--source-gene-order", s(&t.join("obs_kinds")), s(&t.join("back.h5ad"))]).expect_code(0);
    crate::util::python_check(&[s(&t.join("obs_kinds")), s(&t.join("back.h5ad")), s(&source)]);
}

#[test]
fn export_gives_back_the_source_counts() {
    let t = TestDir::new();
    let rows = h5::random_rows(23, 50, 21);
    let input = t.join("in.h5ad");
    h5::write_counts(&input, &rows, 50, "c");
    t.run(&["convert", "-q", "--level", "3", "--tile-size", "6", s(&input), "ds"]).expect_code(0);
    t.run(&["export", "-q", "--source-gene-order", "ds", "back.h5ad"]).expect_code(0);
    let back = read_h5ad_rows(&t.join("back.h5ad"));
    assert_eq!(back, expected(&rows));
    let file = deltacells::inputs::h5ad::H5adFile::open(&t.join("back.h5ad")).unwrap();
    assert_eq!(file.dataframe_index("var").unwrap(), h5::genes(50));
    assert_eq!(file.dataframe_index("obs").unwrap(), h5::cells(23, "c"));
    // a range, in stored gene order
    t.run(&["export", "-q", "--cells", "5:14", "ds", "part.h5ad"]).expect_code(0);
    let ds = Dataset::open(s(&t.join("ds"))).unwrap();
    let m = ds.read(Selection::Range(5..14)).unwrap();
    let part = read_h5ad_rows(&t.join("part.h5ad"));
    let names = deltacells::inputs::h5ad::H5adFile::open(&t.join("part.h5ad")).unwrap().dataframe_index("obs").unwrap();
    assert_eq!(names, h5::cells(23, "c")[5..14].to_vec());
    let want: Vec<Vec<(u32, u32)>> =
        (0..m.n_rows()).map(|r| m.row(r).0.iter().copied().zip(m.row(r).1.iter().copied()).collect()).collect();
    assert_eq!(part, want);
    // a range that starts in a later tile and obs shard: only its tiles' obs are read
    t.run(&["convert", "-q", "--level", "3", "--tile-size", "6", "--obs-tiles-per-file", "2", s(&input), "ds2"])
        .expect_code(0);
    t.run(&["export", "-q", "--cells", "13:23", "ds2", "late.h5ad"]).expect_code(0);
    let names = deltacells::inputs::h5ad::H5adFile::open(&t.join("late.h5ad")).unwrap().dataframe_index("obs").unwrap();
    assert_eq!(names, h5::cells(23, "c")[13..23].to_vec());
    let late = Dataset::open(s(&t.join("ds2"))).unwrap().read(Selection::Range(13..23)).unwrap();
    let want: Vec<Vec<(u32, u32)>> = (0..late.n_rows())
        .map(|r| late.row(r).0.iter().copied().zip(late.row(r).1.iter().copied()).collect())
        .collect();
    assert_eq!(read_h5ad_rows(&t.join("late.h5ad")), want);
    let run = t.run(&["export", "-q", "ds", "part.h5ad"]).expect_code(2);
    assert!(run.stderr().contains("exists"), "{}", run.stderr());
    t.run(&["export", "-q", "--cells", "5:99", "ds", "x.h5ad"]).expect_code(2);
}

/// An .h5ad file's X, read with our reader, as sorted rows of counts.
pub fn read_h5ad_rows(path: &Path) -> Vec<Vec<(u32, u32)>> {
    let file = deltacells::inputs::h5ad::H5adFile::open(path).unwrap();
    let x = file.matrix("X").unwrap();
    let raw = x.read_rows(0..x.n_rows()).unwrap();
    let (m, _) = deltacells::inputs::to_counts(&raw, x.n_cols() as u32, None).unwrap();
    (0..m.n_rows()).map(|r| m.row(r).0.iter().copied().zip(m.row(r).1.iter().copied()).collect()).collect()
}
