//! Every input the fuzzers ever crashed on (kept in fuzz/regressions/<target>/)
//! is checked here with the same property as its fuzz target, on every test
//! run, and so are damaged copies of valid inputs made here (every prefix and
//! bytes flipped through the whole input), so that each property runs on
//! inputs that exist whether or not a fuzzer has found anything yet.

use std::path::PathBuf;

use deltacells::format::obs_schema::ObsSchema;
use deltacells::format::{decode_tile, npy, Manifest, TileExpectation};

/// The recorded crash inputs of `target` (none is recorded for most
/// targets), then every prefix of `valid` and copies of it with one byte
/// flipped, at every position.
fn inputs(target: &str, valid: &[u8]) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions").join(target);
    let mut out: Vec<_> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    assert!(!valid.is_empty());
    for end in 0..valid.len() {
        out.push((PathBuf::from(format!("{target}: the first {end} bytes")), valid[..end].to_vec()));
    }
    for at in 0..valid.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut damaged = valid.to_vec();
            damaged[at] ^= flip;
            out.push((PathBuf::from(format!("{target}: byte {at} ^ {flip:#x}")), damaged));
        }
    }
    out
}

/// A small valid tile: 7 cells, some empty, of 50 genes.
fn valid_tile() -> Vec<u8> {
    let mut m = deltacells::format::CsrMatrix::empty(50);
    for r in 0..7u32 {
        for g in (0..50).filter(|g| (g * 7 + r) % 5 == 0 && r != 3) {
            m.indices.push(g);
            m.data.push(1 + (g * r) % 40);
        }
        m.indptr.push(m.indices.len() as u64);
    }
    let blob = deltacells::format::TileEncoder::new(2, 3).encode(&m).unwrap();
    assert_eq!(decode_tile(&blob, None).unwrap(), m);
    blob
}

const VALID_SCHEMA: &str = r#"{"format": "deltacells-obs", "version": 1, "columns": [
    {"name": "obs_names", "kind": "string", "arrow_type": "string", "categories": null},
    {"name": "cell_type", "kind": "category", "arrow_type": "int8", "categories": ["T", "B"]},
    {"name": "score", "kind": "numeric", "arrow_type": "double", "categories": null}]}"#;

#[test]
fn manifest_regressions() {
    let valid =
        std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/manifest/float-roundtrip.json"))
            .expect("fuzz/regressions/manifest holds the float round-trip case");
    for (path, data) in inputs("manifest", &valid) {
        if let Ok(m) = Manifest::parse_checked(&data) {
            let again = Manifest::parse_checked(m.to_json().as_bytes()).unwrap();
            assert_eq!(again, m, "{}", path.display());
        }
    }
}

#[test]
fn tile_decode_regressions() {
    let valid = valid_tile();
    let mut accepted = 0;
    for (path, data) in inputs("tile_decode", &valid) {
        if let Ok(m) = decode_tile(&data, None) {
            accepted += 1;
            assert_eq!(m.indptr.first(), Some(&0), "{}", path.display());
            assert_eq!(*m.indptr.last().unwrap() as usize, m.indices.len(), "{}", path.display());
            for r in 0..m.n_rows() {
                let (genes, counts) = m.row(r);
                assert!(genes.windows(2).all(|w| w[0] < w[1]), "{}", path.display());
                assert!(genes.iter().all(|&g| g < m.n_cols), "{}", path.display());
                assert!(counts.iter().all(|&c| c >= 1 && c <= i32::MAX as u32), "{}", path.display());
            }
        }
    }
    // The CRC covers everything after the header: a damaged copy that
    // decodes differs in a header field it does not cover (n_genes, 10 of
    // the flips here), and what the manifest expects refuses it.
    assert_eq!(accepted, 10);
    let original = decode_tile(&valid, None).unwrap();
    let expect = TileExpectation { n_cells: 7, nnz: original.nnz() as u64, n_genes: 50 };
    for (path, data) in inputs("tile_decode", &valid) {
        if let Ok(m) = decode_tile(&data, Some(&expect)) {
            assert!(data == valid, "{} was accepted", path.display());
            assert_eq!(m, original);
        }
    }
}

#[test]
fn npy_regressions() {
    let valid = npy::write_i32(&[3, 0, 2, 1, -5, i32::MAX]);
    let mut accepted = 0;
    for (path, data) in inputs("npy", &valid) {
        if let Ok(values) = npy::read_i32(&data) {
            accepted += 1;
            assert_eq!(npy::read_i32(&npy::write_i32(&values)).unwrap(), values, "{}", path.display());
        }
    }
    // Some flips leave a readable array (a value byte); no prefix is one.
    assert!(accepted > 0);
}

#[test]
fn obs_schema_regressions() {
    assert!(ObsSchema::parse(VALID_SCHEMA.as_bytes()).is_ok());
    for (path, data) in inputs("obs_schema", VALID_SCHEMA.as_bytes()) {
        if let Ok(schema) = ObsSchema::parse(&data) {
            let text = serde_json::to_string(&schema).unwrap();
            assert_eq!(ObsSchema::parse(text.as_bytes()).unwrap(), schema, "{}", path.display());
        }
    }
}

/// The inputs kept in fuzz/regressions/<target>/ of an input format's
/// target: the ones it crashed on once, and `valid-*` ones, which it must
/// accept. An empty or missing folder fails: a loop over nothing checks
/// nothing.
fn recorded(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions").join(target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut out: Vec<_> = entries.map(|e| e.unwrap().path()).map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect();
    out.sort();
    assert!(!out.is_empty(), "{} holds no input", dir.display());
    out
}

/// Runs an input format's harness (the fuzz target's own) on every recorded
/// input of `target`, and on damaged copies of the valid ones (prefixes and
/// flipped bytes at up to ~120 places each): the harness panics on a
/// finding; the valid ones must be accepted.
fn replay(target: &str, harness: fn(&[u8]) -> Result<(), deltacells::inputs::InputError>) {
    let recorded = recorded(target);
    let mut valid = 0;
    for (path, data) in &recorded {
        let result = harness(data);
        if path.file_name().unwrap().to_string_lossy().starts_with("valid-") {
            valid += 1;
            if let Err(e) = result {
                panic!("{} is refused: {}", path.display(), deltacells::error_chain(&e));
            }
        }
    }
    assert!(valid > 0, "fuzz/regressions/{target} holds no valid-* input");
    for (path, data) in recorded.iter().filter(|(p, _)| p.file_name().unwrap().to_string_lossy().starts_with("valid-"))
    {
        let stride = data.len() / 120 + 1;
        for at in (0..data.len()).step_by(stride) {
            let _ = harness(&data[..at]);
            for flip in [0x01u8, 0x80, 0xff] {
                let mut damaged = data.clone();
                damaged[at] ^= flip;
                let _ = harness(&damaged);
            }
        }
        eprintln!("{}: {} damaged copies read", path.display(), data.len().div_ceil(stride) * 4);
    }
}

#[test]
fn mtx_regressions() {
    replay("mtx", deltacells::inputs::fuzzing::mtx);
}

#[test]
fn tenx_h5_regressions() {
    replay("tenx_h5", deltacells::inputs::fuzzing::tenx_h5);
}

#[test]
fn zarr_regressions() {
    replay("zarr", deltacells::inputs::fuzzing::zarr);
}
