//! Failures users meet in pipelines: a conversion killed at any moment, a full
//! disk, and hostile inputs. Nothing may look complete unless it is.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::h5::{self, Rows};
use crate::util::{listing, TestDir};

/// An input big enough that conversion takes a while at level 19: 40 tiles of
/// 60 cells, with an obs column.
fn slow_input(t: &TestDir) -> String {
    let rows: Rows = h5::random_rows(2400, 3000, 77);
    let path = t.join("big.h5ad");
    let f = h5::create(&path);
    h5::matrix(&f, "X", &rows, 3000, h5::Layout::Csr, |v| v as f32);
    let obs = h5::dataframe(&f, "obs", "_index", &h5::cells(2400, "cell"));
    let v: Vec<f64> = (0..2400).map(|i| i as f64 / 7.0).collect();
    obs.new_dataset_builder().with_data(&v[..]).create("score").unwrap();
    h5::dataframe(&f, "var", "_index", &h5::genes(3000));
    path.to_str().unwrap().to_string()
}

const ARGS: [&str; 6] = ["--tile-size", "60", "--obs-tiles-per-file", "7", "--threads", "2"];

fn convert_cmd(input: &str, out: &Path, overwrite: bool) -> Command {
    let mut c = crate::util::deltacells();
    c.args(["convert", "-q"]).args(ARGS);
    if overwrite {
        c.arg("--overwrite");
    }
    c.arg(input).arg(out);
    c
}

/// Every file of a dataset with its bytes.
pub(crate) fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for line in listing(dir).lines() {
        let rel = line.rsplit_once(" (").unwrap().0.to_string();
        out.push((rel.clone(), std::fs::read(dir.join(&rel)).unwrap()));
    }
    out
}

#[test]
fn a_killed_convert_never_leaves_a_complete_looking_dataset() {
    let t = TestDir::new();
    let input = slow_input(&t);
    let reference = t.join("reference");
    assert!(convert_cmd(&input, &reference, false).status().unwrap().success());
    let reference_files = files(&reference);
    let n_tiles = std::fs::read_dir(reference.join("tiles")).unwrap().count();
    let mut incomplete = 0;
    for k in 0..10usize {
        let out = t.join(&format!("killed{k}"));
        let mut child = convert_cmd(&input, &out, false).spawn().unwrap();
        // Kill k: once k tenths of the tiles are written (by what is on disk,
        // not by the clock, which other tests make unreliable).
        let wanted = k * n_tiles / 10;
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            let written = std::fs::read_dir(out.join("tiles")).map_or(0, |d| d.count());
            if written >= wanted || child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let _ = child.kill(); // SIGKILL
        child.wait().unwrap();
        let run = t.run(&["verify", "-q", out.to_str().unwrap()]);
        if out.join("manifest.json").exists() {
            assert_eq!(run.code(), 0, "a manifest exists, so the dataset must be complete:\n{}", run.stdout());
        } else {
            incomplete += 1;
            assert_eq!(run.code(), 2, "{}", run.stderr());
            let err = run.stderr();
            assert!(err.contains("incomplete dataset: ") || err.contains("no dataset here"), "{err}");
        }
        // rerunning with --overwrite completes it, byte for byte as an uninterrupted run
        assert!(convert_cmd(&input, &out, true).status().unwrap().success());
        assert_eq!(files(&out), reference_files, "killed at {k}/10 then rerun");
    }
    assert!(incomplete >= 5, "only {incomplete} of 10 kills landed before the manifest ({n_tiles} tiles)");
}

/// Whether this process may mount filesystems (root in its own sandbox).
fn can_mount() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false)
}

#[test]
fn a_full_disk_is_a_clear_error_and_leaves_no_manifest() {
    let t = TestDir::new();
    let small = t.join("small");
    std::fs::create_dir(&small).unwrap();
    if !can_mount()
        || !Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
            .arg(&small)
            .status()
            .is_ok_and(|s| s.success())
    {
        crate::util::skip("cannot mount a small tmpfs here; disk-full test skipped");
        return;
    }
    let input = slow_input(&t);
    let out = small.join("ds");
    let output = convert_cmd(&input, &out, false).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let _ = Command::new("umount").arg(&small).status();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(stderr.contains("ds/"), "the error names the file: {stderr}");
}

fn hostile(t: &TestDir, name: &str, build: impl FnOnce(&hdf5::File)) -> String {
    let path = t.join(name);
    let f = h5::create(&path);
    build(&f);
    drop(f);
    path.to_str().unwrap().to_string()
}

fn fails_naming(t: &TestDir, input: &str, needles: &[&str]) {
    let run = t.run(&["convert", "-q", input, "out"]).expect_code(2);
    for n in needles {
        assert!(run.stderr().contains(n), "expected {n:?} in {}", run.stderr());
    }
    assert!(!t.join("out/manifest.json").exists());
}

#[test]
fn hostile_h5ad_inputs_fail_cleanly() {
    let t = TestDir::new();
    let rows = h5::random_rows(4, 10, 9);
    // the shape attribute disagrees with the arrays
    let p = hostile(&t, "shape.h5ad", |f| {
        h5::matrix(f, "X", &rows, 10, h5::Layout::Csr, |v| v as f32);
        f.group("X").unwrap().attr("shape").unwrap().write_raw(&[5i64, 10]).unwrap();
        h5::dataframe(f, "var", "_index", &h5::genes(10));
    });
    fails_naming(&t, &p, &["shape.h5ad", "X/indptr", "has 5 entries, but shape [5, 10] needs 6"]);
    // data and indices of different lengths
    let p = hostile(&t, "lengths.h5ad", |f| {
        h5::matrix(f, "X", &rows, 10, h5::Layout::Csr, |v| v as f32);
        f.unlink("X/data").unwrap();
        f.group("X").unwrap().new_dataset_builder().with_data(&[1.0f32][..]).create("data").unwrap();
        h5::dataframe(f, "var", "_index", &h5::genes(10));
    });
    fails_naming(&t, &p, &["lengths.h5ad", "X: data has 1 entries but indices has"]);
    // indptr pointing past the data
    let p = hostile(&t, "past.h5ad", |f| {
        h5::matrix(f, "X", &rows, 10, h5::Layout::Csr, |v| v as f32);
        let n = f.dataset("X/data").unwrap().size() as i64;
        f.dataset("X/indptr").unwrap().write_raw(&[0i64, 1, 2, 3, n + 5]).unwrap();
        h5::dataframe(f, "var", "_index", &h5::genes(10));
    });
    fails_naming(&t, &p, &["past.h5ad", "X/indptr[4]", "points outside"]);
    // a categorical whose codes exceed its categories
    let p = hostile(&t, "codes.h5ad", |f| {
        h5::matrix(f, "X", &rows, 10, h5::Layout::Csr, |v| v as f32);
        let obs = h5::dataframe(f, "obs", "_index", &h5::cells(4, "c"));
        let ct = obs.create_group("ct").unwrap();
        h5::str_attr(&ct, "encoding-type", "categorical");
        h5::strings(&ct, "categories", &["a".to_string(), "b".to_string()]);
        ct.new_dataset_builder().with_data(&[0i8, 1, 2, 0][..]).create("codes").unwrap();
        h5::dataframe(f, "var", "_index", &h5::genes(10));
    });
    fails_naming(&t, &p, &["codes.h5ad", "obs/ct/codes[2]", "code 2 outside -1..2"]);
    // an obs column shorter than the cells
    let p = hostile(&t, "short.h5ad", |f| {
        h5::matrix(f, "X", &rows, 10, h5::Layout::Csr, |v| v as f32);
        let obs = h5::dataframe(f, "obs", "_index", &h5::cells(4, "c"));
        obs.new_dataset_builder().with_data(&[1.0f64, 2.0][..]).create("score").unwrap();
        h5::dataframe(f, "var", "_index", &h5::genes(10));
    });
    fails_naming(&t, &p, &["short.h5ad", "obs/score"]);
    // var names that disagree in number with X's columns
    let p = hostile(&t, "var.h5ad", |f| {
        h5::matrix(f, "X", &rows, 10, h5::Layout::Csr, |v| v as f32);
        h5::dataframe(f, "var", "_index", &h5::genes(9));
    });
    fails_naming(&t, &p, &["var.h5ad", "var: has 9 genes but X has 10 columns"]);
}
