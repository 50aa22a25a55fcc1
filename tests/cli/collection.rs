//! `deltacells info COLLECTION.json`: a collection file summarized, each
//! dataset checked against the manifest digest the file records.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::util::{deltacells, TestDir};

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/pbmc_1k.h5ad")
}

fn digest(dir: &std::path::Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(dir.join("manifest.json")).unwrap()))
}

/// Two datasets of the example (tiles of 300 and 400 cells) and a collection
/// file naming them with relative roots.
fn collection(dir: &TestDir) -> PathBuf {
    for (name, tile) in [("a", "300"), ("b", "400")] {
        let done = deltacells()
            .args(["convert", "-q", "--tile-size", tile])
            .arg(example())
            .arg(dir.join(name))
            .output()
            .unwrap();
        assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    }
    let text = format!(
        r#"{{"deltacells_collection": 1, "datasets": [
            {{"name": "a", "root": "a", "manifest_sha256": "{}"}},
            {{"name": "b", "root": "b", "manifest_sha256": "{}"}}],
           "genes": "intersection", "gene_column": null, "weights": {{"a": 0.25, "b": 0.75}}}}"#,
        digest(&dir.join("a")),
        digest(&dir.join("b"))
    );
    let path = dir.join("atlas.json");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn info_summarizes_a_collection_file() {
    let dir = TestDir::new();
    let path = collection(&dir);
    let out = deltacells().arg("info").arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("datasets     2"), "{text}");
    assert!(text.contains("cells        2,000"), "{text}");
    assert!(text.contains("(intersection, matched by var_names)"), "{text}");
    assert!(text.contains("0.75"), "{text}");
    let out = deltacells().args(["info", "--json"]).arg(&path).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["n_cells"], 2000);
    assert_eq!(json["datasets"][1]["n_tiles"], 3);
    assert_eq!(json["datasets"][0]["genes_held"], json["n_genes"]);
    assert_eq!(json["datasets"][0]["weight"], 0.25);
}

#[test]
fn a_changed_or_missing_dataset_is_named_with_exit_status_2() {
    let dir = TestDir::new();
    let path = collection(&dir);
    let done = deltacells()
        .args(["convert", "-q", "--overwrite", "--tile-size", "500"])
        .arg(example())
        .arg(dir.join("b"))
        .output()
        .unwrap();
    assert!(done.status.success());
    let out = deltacells().arg("info").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("dataset \"b\"") && err.contains("changed since the collection was made"), "{err}");
    std::fs::remove_dir_all(dir.join("a")).unwrap();
    let out = deltacells().arg("info").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("dataset \"a\""), "{err}");
    std::fs::write(&path, "{\"deltacells_collection\": 1, \"datasets\": 3}").unwrap();
    let out = deltacells().arg("info").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("atlas.json") && err.contains("\"datasets\" is not a list"), "{err}");
}
