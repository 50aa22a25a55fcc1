//! obs in convert: schema, shards and values, checked against the reference's
//! expectations and across files with different category sets.

use std::path::Path;

use arrow_array::{Array, RecordBatch};
use deltacells::format::obs_schema::ObsSchema;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;

use crate::h5;
use crate::util::TestDir;

/// Every row of every shard, per column, as JSON values (null where missing).
pub(crate) fn obs_values(dataset: &Path) -> (ObsSchema, Vec<Vec<Value>>) {
    let schema = ObsSchema::parse(&std::fs::read(dataset.join("obs/schema.json")).unwrap()).unwrap();
    let mut columns = vec![Vec::new(); schema.columns.len()];
    let mut shards: Vec<_> = std::fs::read_dir(dataset.join("obs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    shards.sort();
    for shard in shards {
        let file = std::fs::File::open(shard).unwrap();
        for batch in ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap() {
            let batch: RecordBatch = batch.unwrap();
            for (i, array) in batch.columns().iter().enumerate() {
                let json = arrow_json_values(array.as_ref());
                columns[i].extend(json);
            }
        }
    }
    (schema, columns)
}

fn arrow_json_values(array: &dyn Array) -> Vec<Value> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    use arrow_schema::DataType::*;
    macro_rules! prim {
        ($t:ty) => {
            array.as_primitive::<$t>().iter().map(|v| v.map_or(Value::Null, |x| serde_json::json!(x))).collect()
        };
    }
    match array.data_type() {
        Int8 => prim!(Int8Type),
        Int16 => prim!(Int16Type),
        Int32 => prim!(Int32Type),
        Int64 => prim!(Int64Type),
        UInt8 => prim!(UInt8Type),
        UInt16 => prim!(UInt16Type),
        UInt32 => prim!(UInt32Type),
        UInt64 => prim!(UInt64Type),
        Float32 => prim!(Float32Type),
        Float64 => prim!(Float64Type),
        Boolean => array.as_boolean().iter().map(|v| v.map_or(Value::Null, Value::Bool)).collect(),
        Utf8 => array.as_string::<i32>().iter().map(|v| v.map_or(Value::Null, |s| Value::String(s.into()))).collect(),
        other => panic!("unexpected type {other}"),
    }
}

fn same_value(got: &Value, want: &Value) -> bool {
    match (got.as_f64(), want.as_f64()) {
        (Some(g), Some(w)) => (g - w).abs() <= 1e-6 * w.abs().max(1.0),
        _ => got == want,
    }
}

#[test]
fn obs_kinds_converts_to_the_expected_obs() {
    let Some(dir) = crate::golden::golden() else { return };
    let t = TestDir::new();
    let source = dir.join("sources/obs_kinds.h5ad");
    let args = ["convert", "-q", "--level", "3", "--tile-size", "4", "--obs-tiles-per-file", "2"];
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--max-categories", "1000", source.to_str().unwrap(), "out"]);
    t.run(&all).expect_code(0);
    t.run(&["verify", "out"]).expect_code(0);
    let expected: serde_json::Map<String, Value> =
        serde_json::from_slice(&std::fs::read(dir.join("expected/obs_kinds.obs.json")).unwrap()).unwrap();
    let (schema, values) = obs_values(&t.join("out"));
    let names: Vec<&str> = schema.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, expected.keys().map(String::as_str).collect::<Vec<_>>());
    for (c, got) in schema.columns.iter().zip(&values) {
        let e = &expected[&c.name];
        assert_eq!(c.kind.as_str(), e["kind"], "{}", c.name);
        assert_eq!(c.arrow_type, e["arrow_type"], "{}", c.name);
        assert_eq!(c.categories.clone().map(Value::Array).unwrap_or(Value::Null), e["categories"], "{}", c.name);
        let want = e["values"].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{}", c.name);
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(same_value(g, w), "{} row {i}: {g} != {w}", c.name);
        }
    }
    crate::util::python_script(
        "check_obs.py",
        &[t.join("out").to_str().unwrap(), dir.join("expected/obs_kinds.obs.json").to_str().unwrap()],
    );
}

/// A file with a categorical obs column `cell_type` of the given categories
/// and codes, and a numeric column `score` of the given type.
pub(crate) fn with_obs(path: &Path, categories: &[&str], codes: &[i8], score_int: bool) {
    let n = codes.len();
    let rows = h5::random_rows(n, 8, n as u64);
    let f = h5::create(path);
    h5::matrix(&f, "X", &rows, 8, h5::Layout::Csr, |v| v as f32);
    let obs =
        h5::dataframe(&f, "obs", "_index", &h5::cells(n, &format!("{}_", path.file_stem().unwrap().to_str().unwrap())));
    let ct = obs.create_group("cell_type").unwrap();
    h5::str_attr(&ct, "encoding-type", "categorical");
    h5::str_attr(&ct, "encoding-version", "0.2.0");
    h5::strings(&ct, "categories", &categories.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    ct.new_dataset_builder().with_data(codes).create("codes").unwrap();
    if score_int {
        let v: Vec<i32> = (0..n as i32).collect();
        obs.new_dataset_builder().with_data(&v[..]).create("score").unwrap();
    } else {
        let v: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
        obs.new_dataset_builder().with_data(&v[..]).create("score").unwrap();
    }
    h5::dataframe(&f, "var", "_index", &h5::genes(8));
}

#[test]
fn category_sets_of_several_files_merge_into_one_vocabulary() {
    let t = TestDir::new();
    with_obs(&t.join("a.h5ad"), &["T", "B"], &[0, 1, -1, 0], true);
    with_obs(&t.join("b.h5ad"), &["NK", "T", "unused"], &[0, 1, 0], false);
    let run = |extra: &[&str]| {
        let mut args = vec!["convert", "-q", "--level", "3", "--tile-size", "3", "--obs-tiles-per-file", "2"];
        args.extend_from_slice(extra);
        args.extend(["a.h5ad", "b.h5ad", "out"]);
        t.run(&args)
    };
    run(&[]).expect_code(0);
    t.run(&["verify", "out"]).expect_code(0);
    let (schema, values) = obs_values(&t.join("out"));
    let ct = schema.column("cell_type").unwrap();
    assert_eq!(
        ct.categories.clone().unwrap(),
        vec![Value::from("T"), Value::from("B"), Value::from("NK"), Value::from("unused")]
    );
    assert_eq!(ct.arrow_type, "int8");
    let codes: Vec<i64> = values[1].iter().map(|v| v.as_i64().unwrap()).collect();
    assert_eq!(codes, vec![0, 1, -1, 0, 2, 0, 2]);
    // int32 meets float32: double
    assert_eq!(schema.column("score").unwrap().arrow_type, "double");
    assert_eq!(values[2][5], serde_json::json!(1.5));
    assert_eq!(values[0][4], Value::from("b_0"));
    // three categories at most: stored as strings
    std::fs::remove_dir_all(t.join("out")).unwrap();
    run(&["--max-categories", "3"]).expect_code(0);
    let (schema, values) = obs_values(&t.join("out"));
    assert_eq!(schema.column("cell_type").unwrap().kind.as_str(), "string");
    assert_eq!(values[1][2], Value::Null);
    assert_eq!(values[1][4], Value::from("NK"));
    // leaving columns and names out
    std::fs::remove_dir_all(t.join("out")).unwrap();
    run(&["--no-obs-names", "--obs-exclude", "score"]).expect_code(0);
    let (schema, _) = obs_values(&t.join("out"));
    assert_eq!(schema.columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), vec!["cell_type"]);
    std::fs::remove_dir_all(t.join("out")).unwrap();
    run(&["--no-obs"]).expect_code(0);
    assert!(!t.join("out/obs").exists());
    t.run(&["verify", "out"]).expect_code(0);
}

#[test]
fn obs_columns_that_cannot_be_stored_or_merged_are_named() {
    let t = TestDir::new();
    with_obs(&t.join("a.h5ad"), &["T"], &[0, 0], true);
    // b: score is a string column
    let f = h5::create(&t.join("b.h5ad"));
    h5::matrix(&f, "X", &h5::random_rows(2, 8, 1), 8, h5::Layout::Csr, |v| v as f32);
    let obs = h5::dataframe(&f, "obs", "_index", &h5::cells(2, "b"));
    h5::strings(&obs, "score", &["x".to_string(), "y".to_string()]);
    let ct = obs.create_group("cell_type").unwrap();
    h5::str_attr(&ct, "encoding-type", "categorical");
    h5::strings(&ct, "categories", &["T".to_string()]);
    ct.new_dataset_builder().with_data(&[0i8, 0][..]).create("codes").unwrap();
    h5::dataframe(&f, "var", "_index", &h5::genes(8));
    drop((obs, ct, f));
    let run = t.run(&["convert", "-q", "a.h5ad", "b.h5ad", "out"]).expect_code(2);
    assert!(run.stderr().contains("\"score\" is numeric in") && run.stderr().contains("b.h5ad"), "{}", run.stderr());
    assert!(!t.join("out/manifest.json").exists());
    // a column missing from one file
    with_obs(&t.join("c.h5ad"), &["T"], &[0], true);
    let f = h5::open_rw(&t.join("c.h5ad"));
    f.unlink("obs/score").unwrap();
    drop(f);
    let run = t.run(&["convert", "-q", "a.h5ad", "c.h5ad", "out"]).expect_code(2);
    assert!(
        run.stderr().contains("\"score\" is missing") && run.stderr().contains("--obs-exclude score"),
        "{}",
        run.stderr()
    );
    t.run(&["convert", "-q", "--obs-exclude", "score", "a.h5ad", "c.h5ad", "out"]).expect_code(0);
    // one input without any obs table
    let f = h5::create(&t.join("bare.h5ad"));
    h5::matrix(&f, "X", &h5::random_rows(2, 8, 1), 8, h5::Layout::Csr, |v| v as f32);
    h5::dataframe(&f, "var", "_index", &h5::genes(8));
    drop(f);
    let run = t.run(&["convert", "-q", "a.h5ad", "bare.h5ad", "out3"]).expect_code(2);
    assert!(
        run.stderr().contains("bare.h5ad: has no obs table") && run.stderr().contains("--no-obs"),
        "{}",
        run.stderr()
    );
    t.run(&["convert", "-q", "--no-obs", "a.h5ad", "bare.h5ad", "out3"]).expect_code(0);
    // a column of an unsupported encoding
    let f = h5::open_rw(&t.join("c.h5ad"));
    let g = f.group("obs").unwrap().create_group("when").unwrap();
    h5::str_attr(&g, "encoding-type", "datetime");
    drop((g, f));
    let run = t.run(&["convert", "-q", "--overwrite", "c.h5ad", "out2"]).expect_code(2);
    assert!(run.stderr().contains("obs/when") && run.stderr().contains("--obs-exclude"), "{}", run.stderr());
}

fn converted_obs_kinds(t: &TestDir) -> Option<std::path::PathBuf> {
    let dir = crate::golden::golden()?;
    let source = dir.join("sources/obs_kinds.h5ad");
    t.run(&[
        "convert",
        "-q",
        "--level",
        "3",
        "--tile-size",
        "4",
        "--obs-tiles-per-file",
        "2",
        "--max-categories",
        "1000",
        source.to_str().unwrap(),
        "ds",
    ])
    .expect_code(0);
    Some(t.join("ds"))
}

#[test]
fn localize_fetches_only_the_column_chunks_and_caches_them() {
    let t = TestDir::new();
    let Some(ds) = converted_obs_kinds(&t) else { return };
    let ds = ds.to_str().unwrap();
    let cache = t.join("cache");
    let cache = cache.to_str().unwrap();
    let info = t.run(&["obs", "info", "--json", "--cache-dir", cache, ds]).expect_code(0).json();
    let columns = info["columns"].as_array().unwrap();
    assert_eq!(columns.len(), 12);
    assert!(columns.iter().all(|c| c["cached"] == false && c["fetch_bytes"].as_u64().unwrap() > 0));
    let report = t
        .run(&["obs", "localize", "--json", "--cache-dir", cache, "--columns", "cell_type,score,obs_names", ds])
        .expect_code(0)
        .json();
    assert_eq!(report["fetched"], serde_json::json!(["cell_type", "score", "obs_names"]));
    // one request per column per tile (6 tiles), one per shard footer (3), and the schema
    assert_eq!(report["requests"], 3 * 6 + 3 + 1);
    let again = t
        .run(&["obs", "localize", "--json", "--cache-dir", cache, "--columns", "score,frac", ds])
        .expect_code(0)
        .json();
    assert_eq!(again["already_local"], serde_json::json!(["score"]));
    assert_eq!(again["fetched"], serde_json::json!(["frac"]));
    let info = t.run(&["obs", "info", "--json", "--cache-dir", cache, ds]).expect_code(0).json();
    let cached: Vec<&str> = info["columns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["cached"] == true)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cached, vec!["obs_names", "cell_type", "score", "frac"]);
    // a damaged cache file is replaced
    let fingerprint = info["fingerprint"].as_str().unwrap();
    let path = t.join(&format!("cache/{fingerprint}/obs/score.arrow"));
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let fixed =
        t.run(&["obs", "localize", "--json", "--cache-dir", cache, "--columns", "score", ds]).expect_code(0).json();
    assert_eq!(fixed["replaced"], serde_json::json!(["score"]));
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    // $DELTACELLS_CACHE is the default root
    let out = t
        .command(&["obs", "localize", "--json", "--columns", "batch", ds])
        .env("DELTACELLS_CACHE", t.join("envcache"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(t.join(&format!("envcache/{fingerprint}/obs/batch.arrow")).is_file());
    // no temporary files remain
    let leftovers: Vec<_> = std::fs::read_dir(t.join(&format!("cache/{fingerprint}/obs")))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    crate::util::python_script("check_obs.py", &[ds, "--cache", cache]);
    t.run(&["verify", "--cache", "--cache-dir", cache, ds]).expect_code(0);
    // a cache file holding another column's values is reported by verify --cache
    let frac = std::fs::read(t.join(&format!("cache/{fingerprint}/obs/frac.arrow"))).unwrap();
    std::fs::write(t.join(&format!("cache/{fingerprint}/obs/cell_type.arrow")), frac).unwrap();
    let report = t.run(&["verify", "--json", "--cache", "--cache-dir", cache, ds]).expect_code(1).json();
    let problems = report["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0]["rule"], "obs-cache");
    assert!(problems[0]["file"].as_str().unwrap().ends_with("cell_type.arrow"));
    let run = t.run(&["obs", "localize", "--cache-dir", cache, "--columns", "nope", ds]).expect_code(2);
    assert!(run.stderr().contains("no obs column \"nope\""), "{}", run.stderr());
}

#[test]
fn processes_started_together_fetch_each_column_once() {
    let t = TestDir::new();
    let Some(ds) = converted_obs_kinds(&t) else { return };
    let cache = t.join("cache");
    let children: Vec<_> = (0..8)
        .map(|_| {
            t.command(&["obs", "localize", "--json", "--cache-dir", cache.to_str().unwrap()])
                .args(["--columns", "cell_type,donor,note", ds.to_str().unwrap()])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut fetched: std::collections::BTreeMap<String, usize> = Default::default();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for c in report["fetched"].as_array().unwrap() {
            *fetched.entry(c.as_str().unwrap().to_string()).or_default() += 1;
        }
        assert_eq!(report["fetched"].as_array().unwrap().len() + report["already_local"].as_array().unwrap().len(), 3);
    }
    assert_eq!(
        fetched.into_iter().collect::<Vec<_>>(),
        vec![("cell_type".into(), 1), ("donor".into(), 1), ("note".into(), 1)]
    );
    crate::util::python_script("check_obs.py", &[ds.to_str().unwrap(), "--cache", cache.to_str().unwrap()]);
}

#[test]
fn obs_of_every_encoding_written_by_anndata_reads_back() {
    let Some(python) = std::env::var_os("DELTACELLS_PYTHON") else {
        crate::util::skip("DELTACELLS_PYTHON not set; anndata-written obs test skipped");
        return;
    };
    let t = TestDir::new();
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/make_obs_encodings.py");
    let out =
        std::process::Command::new(python).arg(script).args([t.join("enc.h5ad"), t.join("enc.json")]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    t.run(&["convert", "-q", "--level", "3", "--tile-size", "4", "enc.h5ad", "out"]).expect_code(0);
    t.run(&["verify", "out"]).expect_code(0);
    let want: serde_json::Map<String, Value> =
        serde_json::from_slice(&std::fs::read(t.join("enc.json")).unwrap()).unwrap();
    let (schema, values) = obs_values(&t.join("out"));
    assert_eq!(
        schema.columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        want.keys().map(String::as_str).collect::<Vec<_>>()
    );
    for (c, got) in schema.columns.iter().zip(&values) {
        let w = &want[&c.name];
        if let Some(cats) = w.get("categories") {
            assert_eq!(c.kind.as_str(), "category", "{}", c.name);
            assert_eq!(&Value::Array(c.categories.clone().unwrap()), cats, "{}", c.name);
            assert_eq!(&Value::Array(got.clone()), &w["codes"], "{}", c.name);
        } else {
            let w = w.as_array().unwrap();
            for (i, (g, e)) in got.iter().zip(w).enumerate() {
                assert!(same_value(g, e), "{} row {i}: {g} != {e}", c.name);
            }
        }
    }
    let kind = |n: &str| schema.column(n).map(|c| (c.kind.as_str(), c.arrow_type.as_str())).unwrap();
    assert_eq!(kind("uint32"), ("numeric", "uint32"));
    assert_eq!(kind("float32"), ("numeric", "float"));
    assert_eq!(kind("nullable_int"), ("numeric", "int32"));
    assert_eq!(kind("nullable_bool"), ("bool", "bool"));
    assert_eq!(kind("nullable_str"), ("string", "string"));
    assert_eq!(kind("cat_int"), ("category", "int8"));
}

#[test]
fn the_pre_0_8_layout_with_categories_elsewhere_is_read() {
    let t = TestDir::new();
    let path = t.join("old.h5ad");
    let f = h5::create(&path);
    h5::matrix(&f, "X", &h5::random_rows(4, 5, 3), 5, h5::Layout::LegacyCsr, |v| v as f32);
    let obs = h5::dataframe(&f, "obs", "_index", &h5::cells(4, "o"));
    obs.new_dataset_builder().with_data(&[1i8, 0, 1, -1][..]).create("kind").unwrap();
    let cats = obs.create_group("__categories").unwrap();
    h5::strings(&cats, "kind", &["alpha".to_string(), "beta".to_string()]);
    h5::dataframe(&f, "var", "_index", &h5::genes(5));
    drop((cats, obs, f));
    t.run(&["convert", "-q", "old.h5ad", "out"]).expect_code(0);
    let (schema, values) = obs_values(&t.join("out"));
    let c = schema.column("kind").unwrap();
    assert_eq!(c.categories.clone().unwrap(), vec![Value::from("alpha"), Value::from("beta")]);
    assert_eq!(values[1], vec![Value::from(1), Value::from(0), Value::from(1), Value::from(-1)]);
}

#[test]
fn sixteen_localizers_some_killed_leave_a_valid_cache() {
    let t = TestDir::new();
    let Some(ds) = converted_obs_kinds(&t) else { return };
    let cache = t.join("cache");
    let sets = ["cell_type,donor", "donor,note,score", "obs_names", "cell_type,frac,batch,is_ok"];
    let children: Vec<_> = (0..16)
        .map(|i| {
            let child = t
                .command(&["obs", "localize", "--json", "--cache-dir", cache.to_str().unwrap()])
                .args(["--columns", sets[i % sets.len()], ds.to_str().unwrap()])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            (i, child)
        })
        .collect();
    let mut fetched: std::collections::BTreeMap<String, usize> = Default::default();
    for (i, mut child) in children {
        if i % 5 == 2 {
            std::thread::sleep(std::time::Duration::from_millis(3 * i as u64));
            let _ = child.kill();
            let _ = child.wait();
            continue;
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        for c in report["fetched"].as_array().unwrap() {
            *fetched.entry(c.as_str().unwrap().to_string()).or_default() += 1;
        }
    }
    // Completed runs fetched each column at most once (a killed run may have
    // fetched one without reporting it, never the same twice).
    assert!(fetched.values().all(|&n| n == 1), "{fetched:?}");
    // A final run completes whatever the killed ones left, and cleans up.
    let all = "cell_type,donor,note,score,obs_names,frac,batch,is_ok";
    t.run(&[
        "obs",
        "localize",
        "--json",
        "--cache-dir",
        cache.to_str().unwrap(),
        "--columns",
        all,
        ds.to_str().unwrap(),
    ])
    .expect_code(0);
    t.run(&["verify", "--cache", "--cache-dir", cache.to_str().unwrap(), ds.to_str().unwrap()]).expect_code(0);
    let fingerprint = serde_json::from_slice::<Value>(&std::fs::read(ds.join("manifest.json")).unwrap()).unwrap()
        ["obs_fingerprint"]
        .as_str()
        .unwrap()
        .to_string();
    let names: Vec<String> = std::fs::read_dir(cache.join(&fingerprint).join("obs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".tmp")), "{names:?}");
    assert_eq!(names.iter().filter(|n| n.ends_with(".arrow")).count(), 8, "{names:?}");
}
