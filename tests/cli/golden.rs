//! The conformance vectors of ../shared/golden: every valid dataset verifies and
//! decodes to its expected matrix; every corrupt one is rejected by the rule
//! INDEX.json names, naming the file.

use std::path::PathBuf;

use deltacells::format::{decode_tile, CsrMatrix, TileEncoder};
use deltacells::Dataset;
use serde_json::Value;

use crate::util::TestDir;
use deltacells::Selection;

/// ../shared/golden, or None (with a note) where it is absent, as in a user's clone.
pub fn golden() -> Option<PathBuf> {
    let dir = std::env::var_os("DELTACELLS_GOLDEN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/golden"));
    if dir.join("INDEX.json").is_file() {
        Some(dir)
    } else {
        crate::util::skip(&format!("{} not found; golden conformance tests skipped", dir.display()));
        None
    }
}

fn index(dir: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("INDEX.json")).unwrap()).unwrap()
}

fn expected_matrix(v: &Value) -> CsrMatrix {
    let nums = |k: &str| v[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect::<Vec<u64>>();
    CsrMatrix {
        n_cols: v["shape"][1].as_u64().unwrap() as u32,
        indptr: nums("indptr"),
        indices: nums("indices").into_iter().map(|x| x as u32).collect(),
        data: nums("data").into_iter().map(|x| x as u32).collect(),
    }
}

#[test]
fn valid_datasets_verify_and_decode_to_the_expected_matrix() {
    let Some(dir) = golden() else { return };
    let t = TestDir::new();
    let mut checked = 0;
    for d in index(&dir)["datasets"].as_array().unwrap().iter().filter(|d| d["valid"] == true) {
        let name = d["name"].as_str().unwrap();
        let path = dir.join(name);
        t.run(&["verify", path.to_str().unwrap()]).expect_code(0);
        let ds = Dataset::open(path.to_str().unwrap()).unwrap();
        let got = ds.read(Selection::Range(0..ds.n_cells())).unwrap();
        let expected: Value =
            serde_json::from_slice(&std::fs::read(dir.join(format!("expected/{name}.json"))).unwrap()).unwrap();
        assert_eq!(got, expected_matrix(&expected), "{name}");
        assert_eq!(expected["shape"][0].as_u64().unwrap(), ds.n_cells(), "{name}");
        checked += 1;
    }
    assert!(checked >= 4, "INDEX.json lists {checked} valid datasets");
}

#[test]
fn corrupt_datasets_are_rejected_by_the_named_rule() {
    let Some(dir) = golden() else { return };
    let t = TestDir::new();
    let mut checked = 0;
    for d in index(&dir)["datasets"].as_array().unwrap().iter().filter(|d| d["valid"] == false) {
        let name = d["name"].as_str().unwrap();
        let rule = d["expect_rule"].as_str().unwrap();
        let report = t.run(&["verify", "--json", dir.join(name).to_str().unwrap()]).expect_code(1).json();
        let problems = report["problems"].as_array().unwrap();
        assert!(
            problems.iter().any(|p| p["rule"] == rule && !p["file"].as_str().unwrap().is_empty()),
            "{name}: expected rule {rule}, got {problems:?}"
        );
        checked += 1;
    }
    assert!(checked >= 25, "INDEX.json lists {checked} corrupt datasets");
}

#[test]
fn standalone_tiles_decode_and_our_encoder_writes_the_same_bytes() {
    let Some(dir) = golden() else { return };
    for t in index(&dir)["standalone_tiles"].as_array().unwrap() {
        let blob = std::fs::read(dir.join(t["file"].as_str().unwrap())).unwrap();
        let m = decode_tile(&blob, None).unwrap();
        assert_eq!(m.n_rows() as u64, t["n_cells"].as_u64().unwrap());
        assert_eq!(m.nnz(), 0);
        assert_eq!(m.n_cols, 10);
        if m.n_rows() == 0 {
            // A tile with no cells has no streams: its bytes are fully determined.
            assert_eq!(TileEncoder::new(8, 19).encode(&m).unwrap(), blob);
        }
    }
}

#[test]
fn obs_kinds_info_lists_obs_and_var() {
    let Some(dir) = golden() else { return };
    let t = TestDir::new();
    let info = t.run(&["info", "--json", dir.join("obs_kinds").to_str().unwrap()]).expect_code(0).json();
    let obs = &info["obs"];
    assert_eq!(obs["shards"], 3);
    assert_eq!(obs["fingerprint"], "493453bd2a83a1ab37b78f60");
    let columns = obs["columns"].as_array().unwrap();
    assert_eq!(columns.len(), 12);
    assert_eq!(columns[1]["name"], "cell_type");
    assert_eq!(columns[1]["kind"], "category");
    assert_eq!(columns[1]["n_categories"], 5);
    let var = info["var_columns"].as_array().unwrap();
    assert!(var.iter().any(|c| c["name"] == "gene_ids" && c["is_index"] == true), "{var:?}");
    let ds = Dataset::open(dir.join("obs_kinds").to_str().unwrap()).unwrap();
    let order = ds.gene_order().unwrap().unwrap();
    assert_eq!(order.len(), 40);
    assert_eq!(ds.var_names().unwrap().unwrap().len(), 40);
}

/// The loader checks a chunk's values row by row as it writes them, not when
/// it decompresses the chunk: every corrupt tile of the vectors that can be
/// opened must still end an epoch with the error a whole read gives, naming
/// the same rule, tile and place.
#[test]
fn corrupt_tiles_end_a_loader_epoch_with_the_error_a_read_gives() {
    use deltacells::loader::{Batches, EpochPlan, LoaderBuffers, LoaderOptions};
    let Some(dir) = golden() else { return };
    let (index, mut checked) = (index(&dir), Vec::new());
    for d in index["datasets"].as_array().unwrap().iter().filter(|d| d["valid"] == false) {
        let (name, rule) = (d["name"].as_str().unwrap(), d["expect_rule"].as_str().unwrap());
        if !rule.starts_with("tile:") {
            continue;
        }
        let Ok(ds) = Dataset::open(dir.join(name).to_str().unwrap()) else { continue };
        let ds = std::sync::Arc::new(ds);
        let read = ds.read(Selection::Range(0..ds.n_cells())).expect_err(name);
        let expected = deltacells::error_chain(&read);
        for shuffle in [false, true] {
            let options = LoaderOptions { batch_size: 3, shuffle, ..LoaderOptions::default() };
            let plan = EpochPlan::new(&ds, None, &options).unwrap();
            let results: Vec<_> =
                Batches::start(ds.clone(), plan, None, &LoaderBuffers::new(&options)).unwrap().collect();
            let error = results.iter().find_map(|r| r.as_ref().err()).unwrap_or_else(|| panic!("{name}: no error"));
            assert_eq!(deltacells::error_chain(error), expected, "{name}, shuffled: {shuffle}");
            assert!(results.last().unwrap().is_err(), "{name}: batches after the error");
        }
        checked.push(rule);
    }
    // The rules of the values, which only the row-by-row check finds.
    for rule in ["tile:zero-count", "tile:gene-index-range", "tile:gene-index-order", "tile:vexc-payload"] {
        assert!(checked.contains(&rule), "{rule} was not checked: {checked:?}");
    }
}
