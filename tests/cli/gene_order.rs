//! convert --gene-order-from DATASET and --gene-order FILE.npy: a gene order
//! given instead of computed, so that datasets share their columns.

use std::path::Path;

use deltacells::format::npy;
use deltacells::Dataset;

use crate::convert::source_order;
use crate::h5::{self, Layout, Rows};
use crate::util::TestDir;

const FAST: [&str; 4] = ["--level", "3", "--tile-size", "7"];

/// `deltacells CMD -q` with small tiles and a fast level, then `rest`.
fn fast<'a>(cmd: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    [&[cmd, "-q"][..], &FAST, rest].concat()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// An .h5ad of `rows` whose columns are named `names`.
pub fn write_named(path: &Path, rows: &Rows, names: &[String], cell_prefix: &str) {
    let f = h5::create(path);
    h5::str_attr(&f, "encoding-type", "anndata");
    h5::str_attr(&f, "encoding-version", "0.1.0");
    h5::matrix(&f, "X", rows, names.len(), Layout::Csr, |v| v as f32);
    h5::dataframe(&f, "obs", "_index", &h5::cells(rows.len(), cell_prefix));
    h5::dataframe(&f, "var", "gene_ids", names);
}

fn tiles(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut found: Vec<(String, Vec<u8>)> = std::fs::read_dir(root.join("tiles"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap())
        })
        .collect();
    found.sort();
    found
}

pub fn var_names(root: &Path) -> String {
    std::fs::read_to_string(root.join("var_names.txt")).unwrap()
}

/// Rows whose counts are concentrated on other genes than `h5::random_rows`'
/// (which skews to low genes), so that their own order differs.
pub fn reversed_rows(rows: &Rows, n_genes: u32) -> Rows {
    rows.iter().map(|row| row.iter().rev().map(|&(g, v)| (n_genes - 1 - g, v)).collect()).collect()
}

#[test]
fn gene_order_from_a_dataset_gives_its_columns_by_name() {
    let t = TestDir::new();
    let genes = h5::genes(40);
    let a = h5::random_rows(30, 40, 1);
    write_named(&t.join("a.h5ad"), &a, &genes, "a");
    t.run(&fast("convert", &["a.h5ad", "ds_a"])).expect_code(0);

    // b's counts favour the high genes: its own order is not a's.
    let b = reversed_rows(&h5::random_rows(20, 40, 2), 40);
    write_named(&t.join("b.h5ad"), &b, &genes, "b");
    t.run(&fast("convert", &["b.h5ad", "own"])).expect_code(0);
    assert_ne!(var_names(&t.join("own")), var_names(&t.join("ds_a")), "the test needs b to have another order");

    t.run(&fast("convert", &["--gene-order-from", "ds_a", "b.h5ad", "ds_b"])).expect_code(0);
    t.run(&["verify", "-q", "ds_b"]).expect_code(0);
    assert_eq!(var_names(&t.join("ds_b")), var_names(&t.join("ds_a")));
    let ds = Dataset::open(s(&t.join("ds_b"))).unwrap();
    let own = Dataset::open(s(&t.join("own"))).unwrap();
    assert_eq!(source_order(&ds), source_order(&own), "the same counts, in other columns");
    let convert = &ds.manifest().metadata["convert"];
    assert_eq!(convert["gene_order_from"], "ds_a (var_names.txt)");
    assert_eq!(convert["gene_order_files"], serde_json::json!([]));

    // The same genes listed in another order get the same columns: the tiles
    // are the same bytes (gene_order.npy differs: it names the input's columns).
    let mut reversed_names = genes.clone();
    reversed_names.reverse();
    write_named(&t.join("b_rev.h5ad"), &reversed_rows(&b, 40), &reversed_names, "b");
    t.run(&fast("convert", &["--gene-order-from", "ds_a", "b_rev.h5ad", "ds_b_rev"])).expect_code(0);
    assert_eq!(tiles(&t.join("ds_b_rev")), tiles(&t.join("ds_b")));
    assert_eq!(var_names(&t.join("ds_b_rev")), var_names(&t.join("ds_b")));

    // plan --gene-order-from records it in the plan the shards run.
    t.run(&fast("plan", &["--gene-order-from", "ds_a", "b.h5ad", "planned"])).expect_code(0);
    t.run(&["shard", "-q", "--shard", "0/1", "planned"]).expect_code(0);
    t.run(&["finalize", "-q", "planned"]).expect_code(0);
    assert_eq!(tiles(&t.join("planned")), tiles(&t.join("ds_b")));
}

#[test]
fn inputs_with_other_genes_than_the_given_order_are_refused_naming_the_first_difference() {
    let t = TestDir::new();
    let genes = h5::genes(40);
    write_named(&t.join("a.h5ad"), &h5::random_rows(10, 40, 1), &genes, "a");
    t.run(&fast("convert", &["a.h5ad", "ds_a"])).expect_code(0);

    let mut other = genes.clone();
    other[5] = "NOT_IN_A".into();
    write_named(&t.join("other.h5ad"), &h5::random_rows(10, 40, 2), &other, "o");
    let run = t.run(&["convert", "-q", "--gene-order-from", "ds_a", "other.h5ad", "out"]).expect_code(2);
    let column = var_names(&t.join("ds_a")).lines().position(|n| n == genes[5]).unwrap();
    let want = format!("other.h5ad: has no gene {:?}, which ds_a (var_names.txt) stores as column {column}", genes[5]);
    assert!(run.stderr().contains(&want), "{}", run.stderr());
    assert!(!t.join("out").join("manifest.json").exists());

    let more = h5::genes(41);
    write_named(&t.join("more.h5ad"), &h5::random_rows(10, 41, 2), &more, "m");
    let run = t.run(&["convert", "-q", "--gene-order-from", "ds_a", "more.h5ad", "out"]).expect_code(2);
    let want = format!("more.h5ad: its gene {:?} is not among the 40 genes of ds_a (var_names.txt)", more[40]);
    assert!(run.stderr().contains(&want), "{}", run.stderr());

    // A dataset that is not one (no manifest) is refused before anything is read.
    std::fs::create_dir(t.join("empty")).unwrap();
    let run = t.run(&["convert", "-q", "--gene-order-from", "empty", "a.h5ad", "out"]).expect_code(2);
    assert!(run.stderr().contains("--gene-order-from empty"), "{}", run.stderr());

    // The flags exclude each other and --gene-order-files.
    t.run(&["convert", "--gene-order-from", "ds_a", "--gene-order-files", "3", "a.h5ad", "out"]).expect_code(2);
}

#[test]
fn gene_order_from_a_npy_file_is_the_stored_order() {
    let t = TestDir::new();
    let rows = h5::random_rows(20, 30, 3);
    write_named(&t.join("a.h5ad"), &rows, &h5::genes(30), "a");
    let order: Vec<i32> = (0..30).map(|g| (g * 7) % 30).collect();
    std::fs::write(t.join("order.npy"), npy::write_i32(&order)).unwrap();
    t.run(&fast("convert", &["--gene-order", "order.npy", "a.h5ad", "ds"])).expect_code(0);
    let ds = Dataset::open(s(&t.join("ds"))).unwrap();
    assert_eq!(ds.gene_order().unwrap().unwrap(), order);
    t.run(&fast("convert", &["a.h5ad", "plain"])).expect_code(0);
    assert_eq!(source_order(&ds), source_order(&Dataset::open(s(&t.join("plain"))).unwrap()));
    assert_eq!(ds.manifest().metadata["convert"]["gene_order_from"], "order.npy");

    let mut repeated = order.clone();
    repeated[29] = repeated[0];
    std::fs::write(t.join("bad.npy"), npy::write_i32(&repeated)).unwrap();
    let run = t.run(&["convert", "-q", "--gene-order", "bad.npy", "a.h5ad", "out"]).expect_code(2);
    assert!(
        run.stderr().contains("bad.npy: entry 29: 0 appears twice (a gene order lists every input column once"),
        "{}",
        run.stderr()
    );
    std::fs::write(t.join("short.npy"), npy::write_i32(&order[..29])).unwrap();
    let run = t.run(&["convert", "-q", "--gene-order", "short.npy", "a.h5ad", "out"]).expect_code(2);
    assert!(run.stderr().contains("short.npy: has 29 entries, expected n_genes 30"), "{}", run.stderr());
    std::fs::write(t.join("text.npy"), "not numpy").unwrap();
    let run = t.run(&["convert", "-q", "--gene-order", "text.npy", "a.h5ad", "out"]).expect_code(2);
    assert!(run.stderr().contains("text.npy: not a .npy file"), "{}", run.stderr());
    assert!(!t.join("out").join("manifest.json").exists());
}

#[test]
fn a_dataset_without_var_names_gives_its_gene_order_npy_or_is_refused() {
    let t = TestDir::new();
    let genes = h5::genes(40);
    write_named(&t.join("a.h5ad"), &h5::random_rows(30, 40, 1), &genes, "a");
    t.run(&fast("convert", &["a.h5ad", "ds_a"])).expect_code(0);
    // As another writer may leave it: gene_order.npy but no var_names.txt.
    let copy = t.join("no_names");
    std::fs::create_dir_all(copy.join("tiles")).unwrap();
    for entry in walk(&t.join("ds_a")) {
        let relative = entry.strip_prefix(t.join("ds_a")).unwrap();
        std::fs::create_dir_all(copy.join(relative).parent().unwrap()).unwrap();
        std::fs::copy(&entry, copy.join(relative)).unwrap();
    }
    std::fs::remove_file(copy.join("var_names.txt")).unwrap();
    let manifest = std::fs::read_to_string(copy.join("manifest.json")).unwrap();
    let manifest = manifest.replace("\"has_var_names\": true", "\"has_var_names\": false");
    std::fs::write(copy.join("manifest.json"), manifest).unwrap();
    t.run(&["verify", "-q", "no_names"]).expect_code(0);

    let b = reversed_rows(&h5::random_rows(20, 40, 2), 40);
    write_named(&t.join("b.h5ad"), &b, &genes, "b");
    t.run(&fast("convert", &["--gene-order-from", "no_names", "b.h5ad", "ds_b"])).expect_code(0);
    assert_eq!(var_names(&t.join("ds_b")), var_names(&t.join("ds_a")));
    let ds = Dataset::open(s(&t.join("ds_b"))).unwrap();
    assert_eq!(ds.manifest().metadata["convert"]["gene_order_from"], "no_names (gene_order.npy)");

    // A dataset with neither (the conformance vectors have none) is refused.
    let Some(golden) = crate::golden::golden() else { return };
    let root = golden.join("empty_chunk");
    let run = t.run(&["convert", "-q", "--gene-order-from", s(&root), "b.h5ad", "out"]).expect_code(2);
    assert!(run.stderr().contains("has neither var_names.txt nor gene_order.npy"), "{}", run.stderr());
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            found.extend(walk(&p));
        } else {
            found.push(p);
        }
    }
    found
}
