//! Hostile files of the input formats besides .h5ad (Matrix Market, 10x
//! .h5, zarr): sizes that do not match, shapes of 10^15, indptr that runs
//! backwards, length fields and codecs that claim far more than the file
//! holds. Each goes through the real command line under an address-space
//! limit ([`TestDir::run_limited`]), so an allocation sized by a field
//! aborts instead of passing: exit status 2, a message naming the file and
//! the place, and no output left.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::formats::{gene_features, write_tenx3_with};
use crate::h5::Rows;
use crate::util::TestDir;

/// Converts `input` under the address-space limit: exit status 2, every
/// needle in the message, nothing at `out`.
fn refused(t: &TestDir, input: &Path, needles: &[&str]) {
    let run = t.run_limited(&["convert", "-q", "--threads", "2", input.to_str().unwrap(), "out"]).expect_code(2);
    let err = run.stderr();
    for n in needles {
        assert!(err.contains(n), "expected {n:?} in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert!(!t.join("out").exists(), "a refused conversion left {}", t.join("out").display());
}

/// The same limit does not fail a good file of the format by itself.
fn converts(t: &TestDir, input: &Path) {
    t.run_limited(&["convert", "-q", "--threads", "2", input.to_str().unwrap(), "good_out"]).expect_code(0);
}

const MATRIX: &str = "%%MatrixMarket matrix coordinate integer general\n3 2 4\n1 1 5\n2 1 1\n3 2 2\n1 2 7\n";

fn mtx(t: &TestDir, name: &str, matrix: &[u8], gzip: bool) -> PathBuf {
    let dir = t.join(name);
    std::fs::create_dir(&dir).unwrap();
    let features: String = (1..=3).map(|i| format!("g{i}\tG{i}\tGene Expression\n")).collect();
    std::fs::write(dir.join("features.tsv"), features).unwrap();
    std::fs::write(dir.join("barcodes.tsv"), "AAAC-1\nAAAG-1\n").unwrap();
    if gzip {
        std::fs::write(dir.join("matrix.mtx.gz"), gz(matrix)).unwrap();
    } else {
        std::fs::write(dir.join("matrix.mtx"), matrix).unwrap();
    }
    dir
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(bytes).unwrap();
    z.finish().unwrap()
}

#[test]
fn hostile_matrix_market_inputs_are_refused_naming_the_line() {
    let t = TestDir::new();
    converts(&t, &mtx(&t, "good", MATRIX.as_bytes(), true));
    // more entries claimed than present: counted, never reserved
    let p = mtx(&t, "claims", MATRIX.replace("3 2 4", "3 2 1000000000000000").as_bytes(), false);
    refused(&t, &p, &["claims", "matrix.mtx", "the file ends after 4 entries, but the header says 1000000000000000"]);
    // a shape of 10^15
    let p = mtx(&t, "huge", MATRIX.replace("3 2 4", "1000000000000000 2 4").as_bytes(), false);
    refused(&t, &p, &["huge", "matrix.mtx, line 2", "larger than deltacells stores"]);
    // sizes that disagree with the features and barcodes
    let p = mtx(&t, "sizes", MATRIX.replace("3 2 4", "5 2 4").as_bytes(), false);
    refused(&t, &p, &["sizes", "matrix.mtx, line 2", "the sizes disagree: 5 x 2 (header), 3 features"]);
    // a gzip stream cut short
    let mut cut = gz(MATRIX.as_bytes());
    cut.truncate(cut.len() / 2);
    let p = mtx(&t, "cut", b"", false);
    std::fs::remove_file(p.join("matrix.mtx")).unwrap();
    std::fs::write(p.join("matrix.mtx.gz"), cut).unwrap();
    refused(&t, &p, &["cut", "matrix.mtx.gz", "the gzip stream ends early"]);
    // a small gzip stream of 1.5 GiB without a line end: not held whole
    let p = mtx(&t, "bomb", b"", false);
    std::fs::remove_file(p.join("matrix.mtx")).unwrap();
    let file = std::fs::File::create(p.join("matrix.mtx.gz")).unwrap();
    let mut z = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
    z.write_all(MATRIX.as_bytes()).unwrap();
    let ones = vec![b'1'; 1 << 20];
    for _ in 0..1536 {
        z.write_all(&ones).unwrap();
    }
    z.finish().unwrap();
    refused(&t, &p, &["bomb", "matrix.mtx.gz, line 7", "a line longer than 1048576 bytes"]);
}

/// A Cell Ranger 3 file of 2 cells and 3 genes, with `edit` applied to its
/// `matrix` group.
fn tenx(t: &TestDir, name: &str, edit: &dyn Fn(&hdf5::Group)) -> PathBuf {
    let rows: Rows = vec![vec![(0, 1.0), (2, 3.0)], vec![(1, 2.0)]];
    let p = t.join(name);
    write_tenx3_with(&p, &rows, &gene_features(3), &[0, 1, 2], &["a".into(), "b".into()], edit);
    p
}

fn replace<T: hdf5::H5Type>(g: &hdf5::Group, name: &str, values: &[T]) {
    g.unlink(name).unwrap();
    g.new_dataset_builder().with_data(values).create(name).unwrap();
}

/// Replaces `name` with a dataset of `declared` elements in chunks never
/// written (HDF5 reads them as zeros): a few bytes on disk.
fn declared<T: hdf5::H5Type>(g: &hdf5::Group, name: &str, declared: usize) {
    g.unlink(name).unwrap();
    g.new_dataset::<T>().shape(declared).chunk(vec![4096]).create(name).unwrap();
}

#[test]
fn hostile_10x_files_are_refused_naming_the_object() {
    let t = TestDir::new();
    converts(&t, &tenx(&t, "good.h5", &|_| {}));
    let p = tenx(&t, "indptr_length.h5", &|g| replace(g, "indptr", &[0i64, 2]));
    refused(&t, &p, &["indptr_length.h5", "matrix/indptr: has 2 entries, but shape [2, 3] needs 3"]);
    let p = tenx(&t, "lengths.h5", &|g| replace(g, "data", &[1i32, 3]));
    refused(&t, &p, &["lengths.h5", "matrix: data has 2 entries but indices has 3"]);
    let p = tenx(&t, "huge.h5", &|g| replace(g, "shape", &[3i64, 1_000_000_000_000_000]));
    refused(&t, &p, &["huge.h5", "matrix/shape", "1000000000000000 cells, more than an input may have"]);
    let p = tenx(&t, "backwards.h5", &|g| replace(g, "indptr", &[0i64, 3, 2]));
    refused(&t, &p, &["backwards.h5", "matrix/indptr[2]: 2 is below the previous entry 3"]);
    // data and indices that claim 2^40 entries, and an indptr that points
    // into them: refused before a row is read
    let p = tenx(&t, "claims.h5", &|g| {
        declared::<i32>(g, "data", 1 << 40);
        declared::<i64>(g, "indices", 1 << 40);
        replace(g, "indptr", &[0i64, 0, 1 << 40]);
    });
    refused(&t, &p, &["claims.h5", "matrix/data: declares 1099511627776 elements, but only 0 bytes"]);
    // features that claim 2^31-1 names
    let p = tenx(&t, "features.h5", &|g| {
        replace(g, "shape", &[(1i64 << 31) - 1, 2]);
        declared::<hdf5::types::FixedAscii<16>>(&g.group("features").unwrap(), "feature_type", (1 << 31) - 1);
    });
    refused(&t, &p, &["features.h5", "matrix/features/feature_type: declares 2147483647 elements"]);
}

/// A copy of the v3 (or v2) store of tests/data/zarr.
fn store(t: &TestDir, name: &str, form: &str) -> PathBuf {
    let from = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/zarr/{form}.zarr"));
    let to = t.join(name);
    let status = std::process::Command::new("cp").arg("-r").arg(&from).arg(&to).status().unwrap();
    assert!(status.success());
    to
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn hostile_zarr_stores_are_refused_naming_the_array_and_chunk() {
    let t = TestDir::new();
    converts(&t, &store(&t, "good.zarr", "v3"));
    let shape = |name: &str, shape: serde_json::Value| {
        let p = store(&t, name, "v3");
        edit_json(&p.join("X/zarr.json"), |v| v["attributes"]["shape"] = shape);
        p
    };
    let p = shape("indptr_length.zarr", serde_json::json!([61, 25]));
    refused(&t, &p, &["indptr_length.zarr", "X/indptr: has 61 entries, but shape [61, 25] needs 62"]);
    let p = shape("huge.zarr", serde_json::json!([1_000_000_000_000_000u64, 25]));
    refused(&t, &p, &["huge.zarr", "X/@shape", "1000000000000000 cells, more than an input may have"]);
    // data and indices of different lengths
    let p = store(&t, "lengths.zarr", "v3");
    edit_json(&p.join("X/data/zarr.json"), |v| v["shape"] = serde_json::json!([374]));
    refused(&t, &p, &["lengths.zarr", "X: data has 374 entries but indices has 375"]);
    // an indptr that runs backwards (int32, one zstd chunk)
    let p = store(&t, "backwards.zarr", "v3");
    let chunk = p.join("X/indptr/c/0");
    let mut indptr: Vec<i32> = zstd::decode_all(&std::fs::read(&chunk).unwrap()[..])
        .unwrap()
        .chunks(4)
        .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    indptr[5] = indptr[4] - 1;
    let bytes: Vec<u8> = indptr.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&chunk, zstd::encode_all(&bytes[..], 3).unwrap()).unwrap();
    refused(&t, &p, &["backwards.zarr", "X/indptr[5]", "is below the previous entry"]);
    // a zstd frame whose header says 2^40 bytes: one empty raw block
    let p = store(&t, "zstd_lies.zarr", "v3");
    let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd, 0xe0];
    frame.extend((1u64 << 40).to_le_bytes());
    frame.extend([1, 0, 0]);
    std::fs::write(p.join("X/data/c/0"), frame).unwrap();
    refused(&t, &p, &["zstd_lies.zarr", "X/data", "chunk X/data/c/0: its zstd header says 1099511627776 bytes"]);
    // a Blosc header (v2 store) whose nbytes says 2 GiB
    let p = store(&t, "blosc_lies.zarr", "v2");
    let chunk = p.join("X/data/0");
    let mut bytes = std::fs::read(&chunk).unwrap();
    bytes[4..8].copy_from_slice(&0x7fff_0000u32.to_le_bytes());
    std::fs::write(&chunk, bytes).unwrap();
    refused(&t, &p, &["blosc_lies.zarr", "X/data", "chunk X/data/0: its blosc header says 2147418112 bytes"]);
}
