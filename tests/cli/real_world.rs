//! Files as users have them: written by anndata and h5py with LZF and gzip, in
//! older layouts, with genes in another order or other genes; files and caches
//! read by other accounts; and the messages a user sees, compared whole.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use deltacells::Dataset;
use serde_json::Value;

use crate::util::{Run, TestDir};
use deltacells::Selection;

/// The files of tests/python/make_real_world_inputs.py, written once per run,
/// and what they hold; None (with a note, or a failure where skips are not
/// allowed) without DELTACELLS_PYTHON.
fn inputs() -> Option<&'static (PathBuf, Value)> {
    static INPUTS: OnceLock<Option<(PathBuf, Value)>> = OnceLock::new();
    let made = INPUTS.get_or_init(|| {
        std::env::var_os("DELTACELLS_PYTHON")?;
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("real-world-inputs");
        let _ = std::fs::remove_dir_all(&dir);
        crate::util::python_script("make_real_world_inputs.py", &[dir.to_str().unwrap()]);
        let expected = serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        Some((dir, expected))
    });
    if made.is_none() {
        crate::util::skip("DELTACELLS_PYTHON not set; tests on files written by anndata and h5py skipped");
    }
    made.as_ref()
}

fn input(name: &str) -> String {
    inputs().unwrap().0.join(name).to_str().unwrap().to_string()
}

/// The rows of `name` as expected.json has them, as (gene name, count) per cell.
fn expected_rows(name: &str) -> Vec<Vec<(String, u32)>> {
    let e = &inputs().unwrap().1[name];
    let genes: Vec<String> = e["genes"].as_array().unwrap().iter().map(|g| g.as_str().unwrap().to_string()).collect();
    e["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let mut cells: Vec<(String, u32)> = row
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
                .filter(|(_, v)| v.as_u64().unwrap() > 0)
                .map(|(g, v)| (genes[g].clone(), v.as_u64().unwrap() as u32))
                .collect();
            cells.sort();
            cells
        })
        .collect()
}

/// Every cell of a dataset as (gene name, count), by name.
fn dataset_rows(dir: &Path) -> Vec<Vec<(String, u32)>> {
    let ds = Dataset::open(dir.to_str().unwrap()).unwrap();
    let names = ds.var_names().unwrap().unwrap();
    let m = ds.read(Selection::Range(0..ds.n_cells())).unwrap();
    (0..m.n_rows())
        .map(|r| {
            let (g, c) = m.row(r);
            let mut row: Vec<(String, u32)> = g.iter().zip(c).map(|(&g, &c)| (names[g as usize].clone(), c)).collect();
            row.sort();
            row
        })
        .collect()
}

/// The one stderr line of a failed run, `deltacells: ...`.
#[track_caller]
fn error_line(run: &Run) -> String {
    let stderr = run.stderr();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got:\n{stderr}");
    lines[0].to_string()
}

#[test]
fn lzf_gzip_and_blosc_files_convert() {
    if inputs().is_none() {
        return;
    }
    let t = TestDir::new();
    for name in ["lzf.h5ad", "gzip.h5ad", "blosc.h5ad"] {
        let out = t.join(name);
        t.run(&["convert", "-q", &input(name), out.to_str().unwrap()]).expect_code(0);
        t.run(&["verify", "-q", out.to_str().unwrap()]).expect_code(0);
        assert_eq!(dataset_rows(&out), expected_rows(name), "{name}");
    }
}

#[test]
fn a_filter_we_cannot_decode_is_named_in_plain_words() {
    if inputs().is_none() {
        return;
    }
    let t = TestDir::new();
    let file = input("zstd_filter.h5ad");
    let run = t.run(&["convert", &file, "out"]).expect_code(2);
    assert_eq!(
        error_line(&run),
        format!(
            "deltacells: convert: {file}: X/data: unsupported: compressed with the Zstandard filter (HDF5 filter \
             32015), which deltacells cannot decode (it reads gzip, LZF, Blosc, shuffle and fletcher32); rewrite the file with one of those, for example \
             anndata.read_h5ad(path).write_h5ad(new_path, compression=\"gzip\")"
        )
    );
    assert!(!t.join("out").exists(), "{}", t.join("out").display());
}

#[test]
fn older_anndata_layouts_are_read_or_named() {
    if inputs().is_none() {
        return;
    }
    let t = TestDir::new();
    // var index as an old-style categorical: read as anndata reads it
    t.run(&["convert", "-q", &input("old_cat_index.h5ad"), "cat"]).expect_code(0);
    assert_eq!(dataset_rows(&t.join("cat")), expected_rows("old_cat_index.h5ad"));
    // raw.X / raw.var at the top level: --matrix raw/X finds them, and X's hint names it
    let raw = input("raw_dot.h5ad");
    let run = t.run(&["convert", &raw, "x"]).expect_code(2);
    let line = error_line(&run);
    assert!(line.ends_with("is not an integer count; raw/X holds counts; use --matrix raw/X"), "{line}");
    t.run(&["convert", "-q", "--matrix", "raw/X", &raw, "raw"]).expect_code(0);
    assert_eq!(dataset_rows(&t.join("raw")), expected_rows("raw_dot.h5ad"));
    // obs and var as compound datasets: refused, naming the layout
    let compound = input("compound.h5ad");
    let run = t.run(&["convert", &compound, "c"]).expect_code(2);
    assert_eq!(
        error_line(&run),
        format!(
            "deltacells: convert: {compound}: var: unsupported: a compound dataset, the layout of anndata before 0.7 \
             (2019); anndata still reads it: write it again with a current anndata, \
             anndata.read_h5ad(path).write_h5ad(new_path)"
        )
    );
}

#[test]
fn inputs_with_the_same_genes_in_another_order_are_aligned_by_name() {
    if inputs().is_none() {
        return;
    }
    let t = TestDir::new();
    let (base, reordered) = (input("base.h5ad"), input("reordered.h5ad"));
    let run = t.run(&["convert", &base, &reordered, "out"]).expect_code(0);
    assert!(
        run.stderr().contains(&format!(
            "deltacells: note: {reordered} has the same genes as {base} in another order; its columns are aligned by gene name"
        )),
        "{}",
        run.stderr()
    );
    let mut want = expected_rows("base.h5ad");
    want.extend(expected_rows("reordered.h5ad"));
    assert_eq!(dataset_rows(&t.join("out")), want);
    // var.parquet is the first input's table; the stored genes are named as it names them
    let ds = Dataset::open(t.join("out").to_str().unwrap()).unwrap();
    let mut names = ds.var_names().unwrap().unwrap();
    names.sort();
    let mut genes: Vec<String> = (0..12).map(|i| format!("G{i}")).collect();
    genes.sort();
    assert_eq!(names, genes);
    // sharded: the same bytes
    t.run(&["plan", "-q", &base, &reordered, "sharded"]).expect_code(0);
    t.run(&["shard", "-q", "sharded", "--shard", "0/1"]).expect_code(0);
    t.run(&["finalize", "-q", "sharded"]).expect_code(0);
    for key in ["manifest.json", "tiles/tile_000000.dct", "var.parquet", "var_names.txt", "gene_order.npy"] {
        assert_eq!(
            std::fs::read(t.join("out").join(key)).unwrap(),
            std::fs::read(t.join("sharded").join(key)).unwrap(),
            "{key}"
        );
    }
}

#[test]
fn differing_gene_sets_are_refused_or_intersected_or_united() {
    if inputs().is_none() {
        return;
    }
    let t = TestDir::new();
    let (base, subset) = (input("base.h5ad"), input("subset.h5ad"));
    let run = t.run(&["convert", &base, &subset, "same"]).expect_code(2);
    assert_eq!(
        error_line(&run),
        format!(
            "deltacells: convert: {subset}: genes differ from {base}: 2 of its 10 genes are not in the first file \
             (e.g. \"NEW1\", \"NEW2\"), and 4 of the first file's 12 are not in it (e.g. \"G8\", \"G9\", \"G10\"); \
             every input must have the same genes (keep the genes every input has with --genes intersection, or all \
             of them with --genes union)"
        )
    );
    assert!(!t.join("same").exists());

    // intersection: genes G0..G7; the others' nonzeros are counted
    let run = t.run(&["convert", "--genes", "intersection", &base, &subset, "inter"]).expect_code(0);
    let keep = |rows: Vec<Vec<(String, u32)>>| -> Vec<Vec<(String, u32)>> {
        rows.into_iter().map(|r| r.into_iter().filter(|(g, _)| g.len() == 2 && g.as_str() < "G8").collect()).collect()
    };
    let (all_base, all_subset) = (expected_rows("base.h5ad"), expected_rows("subset.h5ad"));
    let total: usize = all_base.iter().chain(&all_subset).map(Vec::len).sum();
    let mut want = keep(all_base.clone());
    want.extend(keep(all_subset.clone()));
    let kept: usize = want.iter().map(Vec::len).sum();
    assert_eq!(dataset_rows(&t.join("inter")), want);
    assert!(
        run.stdout().contains(&format!(
            "{} nonzeros of genes that not every input has were left out (--genes intersection)",
            total - kept
        )),
        "{}",
        run.stdout()
    );
    let ds = Dataset::open(t.join("inter").to_str().unwrap()).unwrap();
    assert_eq!(ds.n_genes(), 8);
    let convert = &ds.manifest().metadata["convert"];
    assert_eq!(convert["genes"], "intersection");
    assert_eq!(convert["dropped_nonzeros"], (total - kept) as u64);

    // union: every gene; an input's missing genes are zeros
    t.run(&["convert", "-q", "--genes", "union", &base, &subset, "union"]).expect_code(0);
    let mut want = all_base;
    want.extend(all_subset);
    assert_eq!(dataset_rows(&t.join("union")), want);
    let ds = Dataset::open(t.join("union").to_str().unwrap()).unwrap();
    assert_eq!(ds.n_genes(), 14);
    assert_eq!(ds.manifest().metadata["convert"]["genes"], "union");
    t.run(&["verify", "-q", "union"]).expect_code(0);
}

#[test]
fn an_obs_column_with_a_slash_keeps_its_name() {
    if inputs().is_none() {
        return;
    }
    let t = TestDir::new();
    let slash = input("slash.h5ad");
    t.run(&["convert", "-q", &slash, "out"]).expect_code(0);
    let schema: Value = serde_json::from_slice(&std::fs::read(t.join("out/obs/schema.json")).unwrap()).unwrap();
    let names: Vec<&str> = schema["columns"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["obs_names", "qc/pass", "depth"]);
    assert_eq!(schema["columns"][1]["kind"], "bool");
    t.run(&["convert", "-q", "--obs-exclude", "qc/pass", &slash, "excluded"]).expect_code(0);
    let schema: Value = serde_json::from_slice(&std::fs::read(t.join("excluded/obs/schema.json")).unwrap()).unwrap();
    assert_eq!(schema["columns"].as_array().unwrap().len(), 2);
    // a name no input has is an error that lists the columns there are
    let run = t.run(&["convert", "--obs-exclude", "qc_pass", &slash, "typo"]).expect_code(2);
    assert_eq!(
        error_line(&run),
        "deltacells: convert: obs column \"qc_pass\" to leave out: no input has an obs column of that name; the obs \
         columns are: \"qc/pass\", \"depth\"; check the names given to --obs-exclude"
    );
}

#[test]
fn a_column_only_a_later_input_has_is_named_where_it_is() {
    if inputs().is_none() {
        return;
    }
    let t = TestDir::new();
    // base.h5ad has cell_type and depth; slash.h5ad has qc/pass and depth
    let (base, slash) = (input("base.h5ad"), input("slash.h5ad"));
    let run = t.run(&["convert", "--obs-exclude", "cell_type", &base, &slash, "out"]).expect_code(2);
    assert_eq!(
        error_line(&run),
        format!(
            "deltacells: convert: {slash}: obs column \"qc/pass\" is not in {base} (the first input with obs); leave it \
             out with --obs-exclude qc/pass"
        )
    );
}

/// Runs deltacells under `umask`.
fn run_with_umask(t: &TestDir, umask: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_deltacells"))
        .args(args)
        .current_dir(t.path())
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .output()
        .unwrap()
}

/// Every file and folder below `dir` with its mode bits.
fn modes(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        out.push((path.clone(), std::fs::metadata(&path).unwrap().permissions().mode() & 0o777));
        if path.is_dir() {
            out.extend(modes(&path));
        }
    }
    out
}

#[test]
fn files_get_the_mode_the_umask_gives_so_other_accounts_can_read_them() {
    let t = TestDir::new();
    let rows = crate::h5::random_rows(30, 20, 3);
    let input = t.join("in.h5ad");
    crate::h5::write_counts(&input, &rows, 20, "c");
    for (umask, file_mode, dir_mode) in [("022", 0o644, 0o755), ("027", 0o640, 0o750)] {
        let out = format!("ds{umask}");
        let cache = format!("cache{umask}");
        let exported = format!("x{umask}.h5ad");
        for args in [
            vec!["convert", "-q", "--tile-size", "7", "--obs-tiles-per-file", "2", input.to_str().unwrap(), &out],
            vec!["obs", "localize", &out, "--all", "--cache-dir", &cache],
            vec!["export", "-q", &out, &exported],
        ] {
            let output = run_with_umask(&t, umask, &args);
            assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        }
        let mut found = modes(&t.join(&out));
        found.extend(modes(&t.join(&cache)));
        found.push((t.join(&exported), std::fs::metadata(t.join(&exported)).unwrap().permissions().mode() & 0o777));
        assert!(found.iter().any(|(p, _)| p.extension().is_some_and(|e| e == "arrow")), "{found:?}");
        for (path, mode) in found {
            let want = if path.is_dir() { dir_mode } else { file_mode };
            assert_eq!(mode, want, "{} under umask {umask}: {mode:o}, expected {want:o}", path.display());
        }
    }
}

#[test]
fn whole_error_lines_print_each_cause_once() {
    let t = TestDir::new();
    let rows = crate::h5::random_rows(10, 8, 1);
    let input = t.join("in.h5ad");
    crate::h5::write_counts(&input, &rows, 8, "c");
    t.run(&["convert", "-q", input.to_str().unwrap(), "ds"]).expect_code(0);
    let manifest = t.join("ds/manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("\"version\": 2", "\"version\": 7")).unwrap();
    let dir = "ds";
    for (command, args) in [("info", vec!["info", "ds"]), ("export", vec!["export", "ds", "x.h5ad"])] {
        let run = t.run(&args).expect_code(2);
        assert_eq!(error_line(&run), format!("deltacells: {command}: {dir}/manifest.json: version is 7, expected 2"));
    }
    // verify reports it as a problem it found
    let run = t.run(&["verify", "ds"]).expect_code(1);
    assert_eq!(run.stdout().matches("version is 7, expected 2").count(), 1, "{}", run.stdout());
    std::fs::write(&manifest, text).unwrap();
    // an OS error is printed once
    let tile = t.join("ds/tiles/tile_000000.dct");
    std::fs::remove_file(&tile).unwrap();
    std::fs::create_dir(&tile).unwrap();
    let run = t.run(&["export", "ds", "x.h5ad"]).expect_code(2);
    assert_eq!(
        error_line(&run),
        format!("deltacells: export: {dir}/tiles/tile_000000.dct: Is a directory (os error 21)")
    );
    // no dataset, and an interrupted one
    let run = t.run(&["info", "nothing"]).expect_code(2);
    assert_eq!(error_line(&run), "deltacells: info: nothing: no dataset here (nothing at this location)");
    t.run(&["plan", "-q", input.to_str().unwrap(), "unfinished"]).expect_code(0);
    let unfinished = "unfinished";
    let advice = format!(
        "incomplete dataset: a conversion into it was interrupted before its manifest.json was written; finish it \
         with `deltacells shard {unfinished} --shard K/N` for each shard whose result is missing (a single convert \
         is shard 0/1) and then `deltacells finalize {unfinished}`, or convert again with --overwrite"
    );
    let run = t.run(&["verify", "unfinished"]).expect_code(2);
    assert_eq!(error_line(&run), format!("deltacells: verify: {unfinished}: {advice}"));
    let run = t.run(&["convert", input.to_str().unwrap(), "unfinished"]).expect_code(2);
    assert_eq!(error_line(&run), format!("deltacells: convert: {unfinished}: {advice}"));
}

#[test]
fn help_puts_only_object_store_options_under_their_heading() {
    let t = TestDir::new();
    for command in
        [vec!["info"], vec!["verify"], vec!["export"], vec!["obs", "info"], vec!["obs", "localize"], vec!["convert"]]
    {
        let mut args = command.clone();
        args.push("--help");
        let help = t.run(&args).expect_code(0).stdout();
        let section = help.split("Object stores:").nth(1).unwrap_or_else(|| panic!("{command:?}: no heading\n{help}"));
        let options: Vec<&str> = section
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("--"))
            .map(|l| l.split([' ', '<']).next().unwrap())
            .collect();
        assert_eq!(options, ["anonymous", "endpoint", "stats"], "{command:?}\n{help}");
        assert!(!section.contains("<OUT>"), "{command:?}\n{help}");
    }
}

#[test]
fn export_leaves_no_temporary_file_behind() {
    let t = TestDir::new();
    let rows = crate::h5::random_rows(30, 8, 5);
    let input = t.join("in.h5ad");
    crate::h5::write_counts(&input, &rows, 8, "c");
    t.run(&["convert", "-q", "--tile-size", "10", input.to_str().unwrap(), "ds"]).expect_code(0);
    // one left by a killed export (its process is gone) is removed by the next
    let stale = t.join(".x.h5ad.tmp-4194303");
    std::fs::write(&stale, b"partial").unwrap();
    t.run(&["export", "-q", "ds", "x.h5ad"]).expect_code(0);
    assert!(!stale.exists());
    // a failure half-way (a damaged second tile) removes its own
    let tile = t.join("ds/tiles/tile_000001.dct");
    let mut blob = std::fs::read(&tile).unwrap();
    let last = blob.len() - 1;
    blob[last] ^= 0xff;
    std::fs::write(&tile, blob).unwrap();
    t.run(&["export", "-q", "ds", "y.h5ad"]).expect_code(2);
    let left: Vec<String> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("y.h5ad"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn localize_refetches_a_damaged_cache_file_and_obs_info_predicts_its_reads() {
    let t = TestDir::new();
    let rows = crate::h5::random_rows(30, 8, 6);
    let input = t.join("in.h5ad");
    crate::h5::write_counts(&input, &rows, 8, "c");
    t.run(&["convert", "-q", "--tile-size", "10", input.to_str().unwrap(), "ds"]).expect_code(0);
    let info = t.run(&["obs", "info", "ds", "--json", "--cache-dir", "cache"]).expect_code(0).json();
    let column = &info["columns"][0];
    let localized = t.run(&["obs", "localize", "ds", "--columns", "obs_names", "--cache-dir", "cache", "--json"]);
    let report = localized.expect_code(0).json();
    assert_eq!(report["fetched"], serde_json::json!(["obs_names"]));
    // what obs info said a localize of this one column would read, it read
    assert_eq!(
        report["bytes"].as_u64().unwrap(),
        info["open_bytes"].as_u64().unwrap() + column["fetch_bytes"].as_u64().unwrap()
    );
    assert_eq!(
        report["requests"].as_u64().unwrap(),
        info["open_requests"].as_u64().unwrap() + column["fetch_requests"].as_u64().unwrap()
    );
    let cached = t.path().join(report["cache"].as_str().unwrap()).join("obs_names.arrow");
    // damage the contents without changing the size or the structure's counts
    let mut bytes = std::fs::read(&cached).unwrap();
    let at = bytes.windows(2).position(|w| w == b"c1").unwrap();
    bytes[at] = b'x';
    std::fs::write(&cached, &bytes).unwrap();
    let again = t.run(&["obs", "localize", "ds", "--columns", "obs_names", "--cache-dir", "cache", "--json"]);
    assert_eq!(again.expect_code(0).json()["replaced"], serde_json::json!(["obs_names"]));
    let valid = t.run(&["obs", "localize", "ds", "--columns", "obs_names", "--cache-dir", "cache", "--json"]);
    assert_eq!(valid.expect_code(0).json()["already_local"], serde_json::json!(["obs_names"]));
    let forced =
        t.run(&["obs", "localize", "ds", "--columns", "obs_names", "--cache-dir", "cache", "--json", "--force"]);
    assert_eq!(forced.expect_code(0).json()["fetched"], serde_json::json!(["obs_names"]));
}

#[test]
fn summaries_count_in_words() {
    let t = TestDir::new();
    let rows = crate::h5::random_rows(5, 8, 2);
    let input = t.join("in.h5ad");
    crate::h5::write_counts(&input, &rows, 8, "c");
    let run = t.run(&["convert", input.to_str().unwrap(), "ds"]).expect_code(0);
    assert!(run.stdout().contains("5 cells x 8 genes in 1 tile, "), "{}", run.stdout());
    let info = t.run(&["info", "ds"]).expect_code(0).stdout();
    assert!(info.contains("obs          1 column in 1 shard of up to 1,000 tiles"), "{info}");
    let verify = t.run(&["verify", "ds"]).expect_code(0).stdout();
    assert!(verify.contains(": 1 tile, 5 cells, "), "{verify}");
    // an unnamed gene index is not shown under pyarrow's name for it
    let t2 = TestDir::new();
    let f = crate::h5::create(&t2.join("u.h5ad"));
    crate::h5::matrix(&f, "X", &rows, 8, crate::h5::Layout::Csr, |v| v as f32);
    crate::h5::dataframe(&f, "obs", "_index", &crate::h5::cells(5, "c"));
    crate::h5::dataframe(&f, "var", "_index", &crate::h5::genes(8));
    drop(f);
    t2.run(&["convert", "-q", "u.h5ad", "ds"]).expect_code(0);
    let info = t2.run(&["info", "ds"]).expect_code(0).stdout();
    assert!(info.contains("var columns  (unnamed index)"), "{info}");
}

#[test]
fn tables_whose_length_is_not_the_matrix_shape_are_refused() {
    let t = TestDir::new();
    let rows = crate::h5::random_rows(2, 5, 4);
    // obs with 3 names for an X of 2 rows (anndata refuses to read this file)
    let f = crate::h5::create(&t.join("obs3.h5ad"));
    crate::h5::matrix(&f, "X", &rows, 5, crate::h5::Layout::Csr, |v| v as f32);
    crate::h5::dataframe(&f, "obs", "_index", &crate::h5::cells(3, "c"));
    crate::h5::dataframe(&f, "var", "_index", &crate::h5::genes(5));
    drop(f);
    let run = t.run(&["convert", "obs3.h5ad", "a"]).expect_code(2);
    assert_eq!(
        error_line(&run),
        "deltacells: convert: obs3.h5ad: obs/_index: has 3 rows, but the matrix has 2 cells; anndata requires one \
         row per cell"
    );
    // a var column one row short
    let f = crate::h5::create(&t.join("var_short.h5ad"));
    crate::h5::matrix(&f, "X", &rows, 5, crate::h5::Layout::Csr, |v| v as f32);
    crate::h5::dataframe(&f, "obs", "_index", &crate::h5::cells(2, "c"));
    let var = crate::h5::dataframe(&f, "var", "_index", &crate::h5::genes(5));
    var.new_dataset_builder().with_data(&[1.0f64, 2.0, 3.0, 4.0]).create("mean").unwrap();
    drop(var);
    drop(f);
    let run = t.run(&["convert", "var_short.h5ad", "b"]).expect_code(2);
    assert_eq!(
        error_line(&run),
        "deltacells: convert: var_short.h5ad: var/mean: has 4 rows, but the matrix has 5 genes; anndata requires one \
         row per gene"
    );
    assert!(!t.join("a").exists() && !t.join("b").exists());
}

#[test]
fn an_obs_column_of_a_kind_we_cannot_store_points_to_no_obs() {
    let t = TestDir::new();
    let rows = crate::h5::random_rows(3, 5, 4);
    let f = crate::h5::create(&t.join("in.h5ad"));
    crate::h5::matrix(&f, "X", &rows, 5, crate::h5::Layout::Csr, |v| v as f32);
    let obs = crate::h5::dataframe(&f, "obs", "_index", &crate::h5::cells(3, "c"));
    let grid = ndarray::Array2::<f64>::zeros((3, 2));
    obs.new_dataset_builder().with_data(&grid).create("spatial").unwrap();
    drop(obs);
    crate::h5::dataframe(&f, "var", "_index", &crate::h5::genes(5));
    drop(f);
    let run = t.run(&["convert", "in.h5ad", "out"]).expect_code(2);
    assert_eq!(
        error_line(&run),
        "deltacells: convert: in.h5ad: obs/spatial: unsupported: a 2-D array, which deltacells cannot store; leave \
         the column out with --obs-exclude spatial (or all of obs with --no-obs)"
    );
    t.run(&["convert", "-q", "--obs-exclude", "spatial", "in.h5ad", "out"]).expect_code(0);
}

#[test]
fn every_command_prints_one_whole_error_line() {
    let t = TestDir::new();
    let rows = crate::h5::random_rows(10, 8, 1);
    let input = t.join("in.h5ad");
    crate::h5::write_counts(&input, &rows, 8, "c");
    let input = input.to_str().unwrap();
    t.run(&["convert", "-q", input, "ds"]).expect_code(0);
    t.run(&["convert", "-q", "--no-obs", input, "bare"]).expect_code(0);
    std::fs::create_dir(t.join("empty")).unwrap();
    for (args, line) in [
        (
            vec!["obs", "localize", "ds", "--columns", "nope", "--cache-dir", "c"],
            "deltacells: obs localize: ds: no obs column \"nope\"",
        ),
        (vec!["obs", "info", "bare"], "deltacells: obs info: bare: the dataset has no obs"),
        (
            vec!["shard", "empty", "--shard", "0/1"],
            "deltacells: shard 0/1: empty/.plan/plan.json: no plan; run `deltacells plan INPUTS... empty` first",
        ),
        (
            vec!["finalize", "empty"],
            "deltacells: finalize: empty/.plan/plan.json: no plan; run `deltacells plan INPUTS... empty` first",
        ),
        (vec!["plan", input, "ds"], "deltacells: plan: ds is not empty; use --overwrite to replace the dataset in it"),
        (vec!["shard", "ds", "--shard", "3/2"], "deltacells: --shard 3/2: K must be from 0 to N-1"),
        (vec!["export", "ds", "x.h5ad", "--cells", "5:99"], "deltacells: --cells \"5:99\": outside 0:10"),
        (vec!["info", "nothing-here"], "deltacells: info: nothing-here: no dataset here (nothing at this location)"),
        (vec!["verify", "empty"], "deltacells: verify: empty: no dataset here (nothing at this location)"),
    ] {
        let run = t.run(&args).expect_code(2);
        assert_eq!(error_line(&run), line, "{args:?}");
    }
}
