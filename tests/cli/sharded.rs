//! Sharded conversion: plan, shards as separate processes (concurrent, in
//! reverse order, killed and re-run), finalize; byte-identical to convert.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::util::{listing, TestDir};

/// Every file under `dir` with its bytes, by relative path.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push((p.strip_prefix(root).unwrap().display().to_string(), std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[track_caller]
pub(crate) fn assert_same_tree(got: &Path, want: &Path) {
    let (g, w) = (tree(got), tree(want));
    let names = |t: &[(String, Vec<u8>)]| t.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&g), names(&w), "files of {} and {}", got.display(), want.display());
    for ((name, a), (_, b)) in g.iter().zip(&w) {
        assert!(a == b, "{name} differs between {} and {}", got.display(), want.display());
    }
    // nothing of the plan is left
    assert!(!got.join(".plan").exists(), "{}", listing(got));
}

/// `deltacells shard OUT ARGS...` in `t`, not yet started.
fn shard(t: &TestDir, out: &str, args: &[&str]) -> Command {
    let mut cmd = t.command(&["shard", out]);
    cmd.args(args);
    cmd
}

#[track_caller]
fn wait_ok(mut child: Child, what: &str) {
    let status = child.wait().unwrap();
    assert!(status.success(), "{what}: {status}");
}

fn plan(t: &TestDir, inputs: &[&str], layout: &[&str], out: &str) {
    let mut args = vec!["plan", "-q"];
    args.extend(layout);
    args.extend(inputs);
    args.push(out);
    t.run(&args).expect_code(0);
}

/// Converts `inputs` once with convert, then with 1, 3 and 7 shards run in
/// different ways, and checks every result against the first.
pub(crate) fn sharded_runs_match_convert(t: &TestDir, inputs: &[&str], layout: &[&str]) {
    let mut args = vec!["convert", "-q"];
    args.extend(layout);
    args.extend(inputs);
    args.push("single");
    t.run(&args).expect_code(0);
    let single = t.join("single");

    // N = 1
    plan(t, inputs, layout, "n1");
    wait_ok(shard(t, "n1", &["-q", "--shard", "0/1"]).spawn().unwrap(), "shard 0/1");
    t.run(&["finalize", "-q", "n1"]).expect_code(0);
    assert_same_tree(&t.join("n1"), &single);

    // N = 3, all at once, each taking its index from another engine's variable
    plan(t, inputs, layout, "n3");
    let children = vec![
        shard(t, "n3", &["-q", "--shard-from-env"])
            .env("SLURM_ARRAY_TASK_ID", "1")
            .env("SLURM_ARRAY_TASK_MIN", "1")
            .env("SLURM_ARRAY_TASK_COUNT", "3")
            .spawn()
            .unwrap(),
        shard(t, "n3", &["-q", "--shard-from-env", "--shards", "3"]).env("JOB_COMPLETION_INDEX", "1").spawn().unwrap(),
        shard(t, "n3", &["-q", "--shard-from-env"])
            .env("AWS_BATCH_JOB_ARRAY_INDEX", "2")
            .env("AWS_BATCH_JOB_ARRAY_SIZE", "3")
            .spawn()
            .unwrap(),
    ];
    for (k, child) in children.into_iter().enumerate() {
        wait_ok(child, &format!("shard {k}/3"));
    }
    t.run(&["finalize", "-q", "n3"]).expect_code(0);
    assert_same_tree(&t.join("n3"), &single);

    // N = 7 in reverse order; shard 3 is killed once, which finalize notices
    // (when the kill landed before its result), and then re-run.
    plan(t, inputs, layout, "n7");
    for k in (0..7).rev() {
        if k == 3 {
            let mut child = shard(t, "n7", &["-q", "--shard", "3/7"]).spawn().unwrap();
            let started = Instant::now();
            while started.elapsed() < Duration::from_millis(150) && child.try_wait().unwrap().is_none() {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = child.kill();
            child.wait().unwrap();
            if !t.join("n7/.plan/results/shard-00003-of-00007.json").exists() {
                let run = t.run(&["finalize", "n7"]).expect_code(2);
                // shards 0, 1 and 2 have not run yet either
                assert!(run.stderr().contains("shards 0/7, 1/7, 2/7, 3/7 are missing"), "{}", run.stderr());
                assert!(!t.join("n7/manifest.json").exists());
            }
        }
        let run = shard(t, "n7", &["--shard", &format!("{k}/7")]).output().unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    }
    // running a shard twice changes nothing
    wait_ok(shard(t, "n7", &["-q", "--shard", "5/7"]).spawn().unwrap(), "shard 5/7 again");
    t.run(&["finalize", "-q", "n7"]).expect_code(0);
    assert_same_tree(&t.join("n7"), &single);
    t.run(&["verify", "-q", "n7"]).expect_code(0);
}

#[test]
fn shards_of_several_files_with_obs_equal_one_convert() {
    let t = TestDir::new();
    // Tiles of 5 cells and obs shards of 2 tiles run across the files'
    // boundaries (23, 17 and 31 cells); the files' category sets differ.
    let codes =
        |n: usize, k: usize| -> Vec<i8> { (0..n).map(|i| if i % 7 == 6 { -1 } else { (i % k) as i8 }).collect() };
    crate::obs::with_obs(&t.join("a.h5ad"), &["T", "B"], &codes(23, 2), true);
    crate::obs::with_obs(&t.join("b.h5ad"), &["NK", "T", "unused"], &codes(17, 3), false);
    crate::obs::with_obs(&t.join("c.h5ad"), &["B", "DC"], &codes(31, 2), true);
    let layout = ["--tile-size", "5", "--obs-tiles-per-file", "2", "--level", "3"];
    sharded_runs_match_convert(&t, &["a.h5ad", "b.h5ad", "c.h5ad"], &layout);

    // A shard reads only the files that hold its cells: with c.h5ad gone,
    // the shard of tiles 0..8 (cells 0..40, files a and b) still runs.
    plan(&t, &["a.h5ad", "b.h5ad", "c.h5ad"], &layout, "partial");
    std::fs::rename(t.join("c.h5ad"), t.join("c.moved")).unwrap();
    let run = shard(&t, "partial", &["--json", "--shard", "0/2"]).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let result: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(result["first_tile"], 0);
    assert_eq!(result["tile_cells"].as_array().unwrap().len(), 8);
    let run = shard(&t, "partial", &["--shard", "1/2"]).output().unwrap();
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("c.h5ad"));
    // a file that changed after plan is refused
    std::fs::copy(t.join("a.h5ad"), t.join("c.h5ad")).unwrap();
    let run = shard(&t, "partial", &["--shard", "1/2"]).output().unwrap();
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("c.h5ad: the file changed since it was planned"));
}

#[test]
fn pbmc_in_shards_equals_one_convert() {
    let Some((ctrl, stim)) = crate::util::pbmc() else { return };
    let t = TestDir::new();
    // 13,999 cells: 14 tiles, 7 obs shards, so that 7 shards have 2 tiles each
    let layout = ["--tile-size", "1000", "--obs-tiles-per-file", "2", "--level", "3"];
    sharded_runs_match_convert(&t, &[ctrl.to_str().unwrap(), stim.to_str().unwrap()], &layout);
}

#[test]
fn finalize_refuses_missing_corrupt_and_inconsistent_results() {
    let t = TestDir::new();
    crate::obs::with_obs(&t.join("a.h5ad"), &["T", "B"], &[0, 1, 0, 1, 1, 0, -1, 0, 0, 1, 1], true);
    let layout = ["--tile-size", "2", "--obs-tiles-per-file", "1", "--level", "1"];
    plan(&t, &["a.h5ad"], &layout, "out");
    let finalize = |t: &TestDir| t.run(&["finalize", "out"]);

    let run = finalize(&t).expect_code(2);
    assert!(run.stderr().contains("no shard has finished"), "{}", run.stderr());
    for k in 0..3 {
        wait_ok(shard(&t, "out", &["-q", "--shard", &format!("{k}/3")]).spawn().unwrap(), "shard");
    }
    let result = |k: usize| t.join(&format!("out/.plan/results/shard-{k:05}-of-00003.json"));

    // missing
    let saved = std::fs::read(result(1)).unwrap();
    std::fs::remove_file(result(1)).unwrap();
    let run = finalize(&t).expect_code(2);
    assert!(run.stderr().contains("shards 1/3 are missing"), "{}", run.stderr());
    // corrupt
    std::fs::write(result(1), &saved[..saved.len() / 2]).unwrap();
    let run = finalize(&t).expect_code(2);
    assert!(run.stderr().contains("shard-00001-of-00003.json: corrupt shard result"), "{}", run.stderr());
    assert!(run.stderr().contains("--shard 1/3"), "{}", run.stderr());
    // consistent JSON that does not fit the plan
    let text = String::from_utf8(saved.clone()).unwrap().replace("\"first_tile\": 2", "\"first_tile\": 3");
    std::fs::write(result(1), text).unwrap();
    let run = finalize(&t).expect_code(2);
    assert!(run.stderr().contains("inconsistent shard result"), "{}", run.stderr());
    std::fs::write(result(1), &saved).unwrap();
    // a tile that is not what its shard recorded
    let tile = t.join("out/tiles/tile_000004.dct");
    let bytes = std::fs::read(&tile).unwrap();
    std::fs::write(&tile, &bytes[..bytes.len() - 1]).unwrap();
    let run = finalize(&t).expect_code(2);
    assert!(run.stderr().contains("tile_000004.dct") && run.stderr().contains("shard 2/3"), "{}", run.stderr());
    assert!(!t.join("out/manifest.json").exists());

    // a file among the results that no shard wrote
    std::fs::write(t.join("out/.plan/results/notes.json"), b"{}").unwrap();
    let run = finalize(&t).expect_code(2);
    assert!(run.stderr().contains("notes.json: not a shard result name"), "{}", run.stderr());
    std::fs::remove_file(t.join("out/.plan/results/notes.json")).unwrap();

    // re-running the shard mends it; what killed runs left behind goes (a
    // tile's temporary file, and a result's, killed before its rename)
    wait_ok(shard(&t, "out", &["-q", "--shard", "2/3"]).spawn().unwrap(), "shard 2/3 again");
    std::fs::write(t.join("out/tiles/.deltacells-killed.tmp"), b"half a tile").unwrap();
    std::fs::write(t.join("out/.plan/results/.deltacells-killed.tmp"), b"half a result").unwrap();
    finalize(&t).expect_code(0);
    assert!(!t.join("out/tiles/.deltacells-killed.tmp").exists());
    assert!(!t.join("out/.plan").exists());
    t.run(&["verify", "-q", "out"]).expect_code(0);
    let run = t.run(&["finalize", "out"]).expect_code(2);
    assert!(run.stderr().contains("complete"), "{}", run.stderr());

    // bad indices, and no plan
    for bad in ["3/3", "1", "x/2"] {
        let run = shard(&t, "out", &["--shard", bad]).output().unwrap();
        assert_eq!(run.status.code(), Some(2), "--shard {bad}");
    }
    let run = shard(&t, "nowhere", &["--shard", "0/1"]).output().unwrap();
    assert!(String::from_utf8_lossy(&run.stderr).contains("no plan"));
    let run = shard(&t, "out", &["--shard-from-env"]).output().unwrap();
    assert!(String::from_utf8_lossy(&run.stderr).contains("SLURM_ARRAY_TASK_ID"));
}

#[test]
fn gene_totals_summed_in_shares_give_the_plan_one_machine_makes() {
    let t = TestDir::new();
    let mut inputs = Vec::new();
    for (i, seed) in [11u64, 12, 13, 14, 15].into_iter().enumerate() {
        let name = format!("in{i}.h5ad");
        // Each input favours other genes, so the order depends on which are summed.
        let rows: crate::h5::Rows = crate::h5::random_rows(9, 30, seed)
            .into_iter()
            .map(|row| row.into_iter().map(|(g, v)| ((g + 6 * i as u32) % 30, v)).collect::<Vec<_>>())
            .map(|mut row| {
                row.sort_by_key(|e| e.0);
                row
            })
            .collect();
        crate::h5::write_counts(&t.join(&name), &rows, 30, &format!("c{i}-"));
        inputs.push(name);
    }
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let layout = ["--tile-size", "8", "--level", "3", "--gene-order-files", "4"];
    let mut args = vec!["convert", "-q"];
    args.extend(layout);
    args.extend(&inputs);
    args.push("single");
    t.run(&args).expect_code(0);

    // Two of the four sampled inputs per share, on "other machines", then the plan.
    for k in ["1/2", "0/2"] {
        let mut args = vec!["plan", "-q", "--totals-shard", k];
        args.extend(layout);
        args.extend(&inputs);
        args.push("sharded");
        t.run(&args).expect_code(0);
    }
    assert!(t.join("sharded/.plan/totals/shard-00000-of-00002.json").exists());
    let mut args = vec!["plan"];
    args.extend(layout);
    args.extend(&inputs);
    args.push("sharded");
    let run = t.run(&args).expect_code(0);
    assert!(
        run.stderr().contains("gene totals summed from the partial totals stored in the output"),
        "{}",
        run.stderr()
    );
    wait_ok(shard(&t, "sharded", &["-q", "--shard", "0/1"]).spawn().unwrap(), "shard 0/1");
    t.run(&["finalize", "-q", "sharded"]).expect_code(0);
    assert_same_tree(&t.join("sharded"), &t.join("single"));

    // One share missing: the plan names it and writes nothing.
    let mut args = vec!["plan", "-q", "--totals-shard", "2/3"];
    args.extend(layout);
    args.extend(&inputs);
    args.push("partial");
    t.run(&args).expect_code(0);
    let mut args = vec!["plan", "-q"];
    args.extend(layout);
    args.extend(&inputs);
    args.push("partial");
    let run = t.run(&args).expect_code(2);
    assert!(run.stderr().contains("the gene totals of shares 0/3, 1/3 are missing"), "{}", run.stderr());
    assert!(!t.join("partial/.plan/plan.json").exists());

    // Totals of other inputs are refused, naming the file.
    let mut args = vec!["plan", "-q", "--totals-shard", "0/1"];
    args.extend(layout);
    args.extend(&inputs[..4]);
    args.push("other");
    t.run(&args).expect_code(0);
    let mut args = vec!["plan", "-q"];
    args.extend(layout);
    args.extend(&inputs);
    args.push("other");
    let run = t.run(&args).expect_code(2);
    assert!(
        run.stderr().contains("shard-00000-of-00001.json: gene totals of other inputs or options"),
        "{}",
        run.stderr()
    );

    // convert does not take the option; an output holding a dataset is refused.
    t.run(&["convert", "--totals-shard", "0/2", "in0.h5ad", "x"]).expect_code(2);
    let run = t.run(&["plan", "--totals-shard", "0/2", "in0.h5ad", "single"]).expect_code(2);
    assert!(run.stderr().contains("is not empty"), "{}", run.stderr());
}
