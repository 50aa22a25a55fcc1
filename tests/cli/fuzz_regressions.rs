//! Every input the fuzzers ever crashed on (kept in fuzz/regressions/<target>/)
//! is checked here with the same property as its fuzz target, on every test run.

use std::path::PathBuf;

use deltacells::format::obs_schema::ObsSchema;
use deltacells::format::{decode_tile, npy, Manifest};

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions").join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut out: Vec<_> = entries.map(|e| e.unwrap().path()).map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect();
    out.sort();
    out
}

#[test]
fn manifest_regressions() {
    for (path, data) in inputs("manifest") {
        if let Ok(m) = Manifest::parse_checked(&data) {
            let again = Manifest::parse_checked(m.to_json().as_bytes()).unwrap();
            assert_eq!(again, m, "{}", path.display());
        }
    }
}

#[test]
fn tile_decode_regressions() {
    for (_, data) in inputs("tile_decode") {
        let _ = decode_tile(&data, None);
    }
}

#[test]
fn npy_regressions() {
    for (path, data) in inputs("npy") {
        if let Ok(values) = npy::read_i32(&data) {
            assert_eq!(npy::read_i32(&npy::write_i32(&values)).unwrap(), values, "{}", path.display());
        }
    }
}

#[test]
fn obs_schema_regressions() {
    for (path, data) in inputs("obs_schema") {
        if let Ok(schema) = ObsSchema::parse(&data) {
            let text = serde_json::to_string(&schema).unwrap();
            assert_eq!(ObsSchema::parse(text.as_bytes()).unwrap(), schema, "{}", path.display());
        }
    }
}

#[test]
fn the_regression_inputs_are_there() {
    assert!(!inputs("manifest").is_empty(), "fuzz/regressions/manifest holds the float round-trip case");
}
