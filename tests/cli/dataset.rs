//! Datasets written by this crate: the reader API and the commands on them.

use deltacells::format::{self, CsrMatrix};
use deltacells::storage::LocalStorage;
use deltacells::writer::{write_matrix, WriteOptions};
use deltacells::Dataset;

use crate::util::{synthetic_matrix, TestDir};
use deltacells::Selection;

fn write(dir: &TestDir, name: &str, m: &CsrMatrix, tile_size: u64) -> String {
    let store = LocalStorage::new(dir.join(name));
    write_matrix(&store, m, WriteOptions { tile_size, n_chunks: 4, zstd_level: 3 }).unwrap();
    dir.join(name).display().to_string()
}

#[test]
fn reader_returns_tiles_ranges_and_lists() {
    let dir = TestDir::new();
    let m = synthetic_matrix(257, 3000, 1);
    let path = write(&dir, "ds", &m, 50);
    let ds = Dataset::open(&path).unwrap();
    assert_eq!((ds.n_cells(), ds.n_genes(), ds.n_tiles()), (257, 3000, 6));
    assert_eq!(ds.locate(0).unwrap(), (0, 0));
    assert_eq!(ds.locate(49).unwrap(), (0, 49));
    assert_eq!(ds.locate(50).unwrap(), (1, 0));
    assert_eq!(ds.locate(256).unwrap(), (5, 6));
    assert!(ds.locate(257).is_err());
    assert_eq!(ds.read(Selection::Range(0..257)).unwrap(), m);
    let part = ds.read(Selection::Range(45..160)).unwrap();
    let mut want = CsrMatrix::empty(3000);
    for r in 45..160 {
        want.push_row_from(&m, r);
    }
    assert_eq!(part, want);
    assert_eq!(ds.read(Selection::Range(10..10)).unwrap().n_rows(), 0);
    assert!(ds.read(Selection::Range(200..258)).is_err());
    let order = [256u64, 0, 77, 77, 3, 150];
    let picked = ds.read(Selection::List(&order)).unwrap();
    let mut want = CsrMatrix::empty(3000);
    for &r in &order {
        want.push_row_from(&m, r as usize);
    }
    assert_eq!(picked, want);
    assert_eq!(ds.read(Selection::Tile(5)).unwrap().n_rows(), 7);
}

#[test]
fn verify_and_info_on_a_written_dataset() {
    let dir = TestDir::new();
    let m = synthetic_matrix(120, 500, 2);
    write(&dir, "ds", &m, 40);
    let run = dir.run(&["verify", "ds"]).expect_code(0);
    assert!(run.stdout().starts_with("ok: "), "{}", run.stdout());
    let report = dir.run(&["verify", "--json", "ds"]).expect_code(0).json();
    assert_eq!(report["ok"], true);
    assert_eq!(report["tiles_checked"], 3);
    assert_eq!(report["cells"], 120);
    assert_eq!(report["nnz"], m.nnz() as u64);
    let info = dir.run(&["info", "--json", "ds"]).expect_code(0).json();
    assert_eq!(info["n_cells"], 120);
    assert_eq!(info["n_genes"], 500);
    assert_eq!(info["n_tiles"], 3);
    assert_eq!(info["nnz"], m.nnz() as u64);
    assert_eq!(info["has_obs"], false);
    let text = dir.run(&["info", "ds"]).expect_code(0).stdout();
    assert!(text.contains("cells        120"), "{text}");
}

/// verify records each sound tile in its cache folder's record of checked
/// tiles, so that a later gather reads only that tile's chunks; a damaged
/// tile is not recorded, and a gather still refuses it by its CRC.
#[test]
fn verify_records_the_sound_tiles_for_later_gathers() {
    let dir = TestDir::new();
    let m = synthetic_matrix(120, 500, 4);
    let path = write(&dir, "ds", &m, 40);
    let damaged = std::path::Path::new(&path).join(format::tile_key(1));
    let mut b = std::fs::read(&damaged).unwrap();
    let i = b.len() - 3;
    b[i] ^= 0x40;
    std::fs::write(&damaged, b).unwrap();
    dir.run(&["verify", "--cache-dir", "cache", "ds"]).expect_code(1);
    let read = deltacells::dataset::ReadOptions { cache_dir: Some(dir.join("cache")), ..Default::default() };
    let ds = Dataset::from_storage_with(deltacells::storage::open(&path).unwrap(), &read).unwrap();
    let tile_bytes = ds.manifest().tile_bytes[0];
    assert_eq!(ds.read(Selection::List(&[5])).unwrap().row(0), m.row(5));
    assert!(ds.storage().stats().snapshot().1 < tile_bytes, "tile 0 was read whole");
    let e = ds.read(Selection::List(&[45])).unwrap_err();
    assert!(deltacells::error_chain(&e).contains("crc32"), "{}", deltacells::error_chain(&e));
}

#[test]
fn verify_reports_every_damaged_tile_and_names_it() {
    let dir = TestDir::new();
    let m = synthetic_matrix(120, 500, 3);
    let path = write(&dir, "ds", &m, 30);
    for t in [1usize, 3] {
        let p = std::path::Path::new(&path).join(format::tile_key(t));
        let mut b = std::fs::read(&p).unwrap();
        let i = b.len() - 3;
        b[i] ^= 0x40;
        std::fs::write(&p, b).unwrap();
    }
    std::fs::write(std::path::Path::new(&path).join("tiles/tile_000009.dct"), b"stray").unwrap();
    let report = dir.run(&["verify", "--json", "ds"]).expect_code(1).json();
    let problems = report["problems"].as_array().unwrap();
    let rules: Vec<(&str, &str)> =
        problems.iter().map(|p| (p["file"].as_str().unwrap(), p["rule"].as_str().unwrap())).collect();
    assert_eq!(
        rules,
        vec![
            ("tiles/tile_000001.dct", "tile:crc32"),
            ("tiles/tile_000003.dct", "tile:crc32"),
            ("tiles/tile_000009.dct", "extra-file")
        ]
    );
    let text = dir.run(&["verify", "ds"]).expect_code(1).stdout();
    assert!(text.contains("tile_000001.dct: [tile:crc32]"), "{text}");
    assert!(text.contains("FAILED"), "{text}");
}

#[test]
fn a_folder_without_manifest_is_incomplete() {
    let dir = TestDir::new();
    let m = synthetic_matrix(10, 50, 4);
    write(&dir, "ds", &m, 4);
    std::fs::remove_file(dir.join("ds/manifest.json")).unwrap();
    let run = dir.run(&["verify", "ds"]).expect_code(2);
    assert!(run.stderr().contains("incomplete dataset: no manifest.json"), "{}", run.stderr());
    let run = dir.run(&["info", "ds"]).expect_code(2);
    assert!(run.stderr().contains("incomplete dataset: no manifest.json"), "{}", run.stderr());
    let run = dir.run(&["verify", "does-not-exist"]).expect_code(2);
    assert!(run.stderr().contains("does-not-exist"), "{}", run.stderr());
}

#[test]
fn has_flags_must_match_the_files() {
    let dir = TestDir::new();
    let m = synthetic_matrix(10, 3, 5);
    write(&dir, "ds", &m, 4);
    std::fs::write(dir.join("ds/var_names.txt"), "a\nb\nc\n").unwrap();
    std::fs::write(dir.join("ds/gene_order.npy"), format::npy::write_i32(&[2, 0, 1])).unwrap();
    let report = dir.run(&["verify", "--json", "ds"]).expect_code(1).json();
    let rules: Vec<&str> = report["problems"].as_array().unwrap().iter().map(|p| p["rule"].as_str().unwrap()).collect();
    assert_eq!(rules, vec!["has-flags", "has-flags"]);
    // now say they exist, and break one
    let text = std::fs::read_to_string(dir.join("ds/manifest.json")).unwrap();
    let text = text
        .replace("\"has_gene_order\": false", "\"has_gene_order\": true")
        .replace("\"has_var_names\": false", "\"has_var_names\": true");
    std::fs::write(dir.join("ds/manifest.json"), text).unwrap();
    dir.run(&["verify", "ds"]).expect_code(0);
    std::fs::write(dir.join("ds/gene_order.npy"), format::npy::write_i32(&[2, 0, 0])).unwrap();
    std::fs::write(dir.join("ds/var_names.txt"), "a\nb\n").unwrap();
    let report = dir.run(&["verify", "--json", "ds"]).expect_code(1).json();
    let rules: Vec<&str> = report["problems"].as_array().unwrap().iter().map(|p| p["rule"].as_str().unwrap()).collect();
    assert_eq!(rules, vec!["gene-order", "var-names"]);
}

#[test]
fn an_empty_dataset_has_no_tiles() {
    let dir = TestDir::new();
    write(&dir, "ds", &CsrMatrix::empty(7), 4);
    let ds = Dataset::open(dir.join("ds").to_str().unwrap()).unwrap();
    assert_eq!((ds.n_cells(), ds.n_tiles()), (0, 0));
    dir.run(&["verify", "ds"]).expect_code(0);
}
