//! The Snakemake workflow shipped in workflows/snakemake/, run by snakemake
//! from PyPI on local cores: a sample sheet of the two PBMC files, plan, 4
//! shards as 4 jobs, finalize and verify give the bytes of one `convert`.
//! Skipped, noted, where snakemake is not installed (scripts/setup.sh puts
//! it in .venv, beside $DELTACELLS_PYTHON).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::clusters::repo;
use crate::sharded::assert_same_tree;
use crate::util::{binary_dir, find_program, skip, TestDir};

/// snakemake beside $DELTACELLS_PYTHON (the .venv of scripts/setup.sh), or
/// on PATH.
fn snakemake() -> Option<PathBuf> {
    let beside_python = std::env::var_os("DELTACELLS_PYTHON")
        .map(PathBuf::from)
        .and_then(|p| p.parent().map(|d| d.join("snakemake")))
        .filter(|p| p.is_file());
    let found = beside_python.or_else(|| find_program("snakemake"));
    if found.is_none() {
        skip("snakemake not found (scripts/setup.sh installs it into .venv); the Snakemake workflow test is skipped");
    }
    found
}

#[test]
fn snakemake_workflow_gives_the_bytes_of_one_convert() {
    let Some((ctrl, stim)) = crate::util::pbmc() else { return };
    let Some(snakemake) = snakemake() else { return };
    let t = TestDir::new();
    // 13,999 cells: 14 tiles in 7 obs shards, so that all 4 shards have work.
    let options = ["--tile-size", "1000", "--obs-tiles-per-file", "2", "--level", "3"];
    let mut args = vec!["convert", "-q"];
    args.extend(options);
    args.extend([ctrl.to_str().unwrap(), stim.to_str().unwrap(), "single"]);
    t.run(&args).expect_code(0);

    // The workflow's own config with this test's sample sheet and options.
    std::fs::write(
        t.join("samples.tsv"),
        format!("sample\tpath\nctrl\t{}\nstim\t{}\n", ctrl.display(), stim.display()),
    )
    .unwrap();
    let config = format!(
        "samples: samples.tsv\nout: results/pbmc\nshards: 4\noptions: {}\nthreads_per_shard: 1\n",
        serde_json::to_string(&options).unwrap()
    );
    std::fs::write(t.join("config.yaml"), config).unwrap();
    let snakefile = repo().join("workflows/snakemake/Snakefile");
    run_workflow(&snakemake, &snakefile, t.path(), &["--configfile", "config.yaml", "--cores", "2"], &[]);

    assert_same_tree(&t.join("results/pbmc"), &t.join("single"));
    let steps = t.join("results/pbmc.steps");
    for k in 0..4 {
        assert!(steps.join(format!("shard-{k}-of-4.done")).exists(), "shard {k}");
    }
    let verified = std::fs::read_to_string(steps.join("verified.txt")).unwrap();
    assert!(verified.starts_with("ok: results/pbmc: 14 tiles, 13,999 cells"), "{verified}");
    // The cells are in the sheet's order: the plan read ctrl, then stim.
    let inputs = std::fs::read_to_string(steps.join("inputs.txt")).unwrap();
    assert_eq!(inputs, format!("{}\n{}\n", ctrl.display(), stim.display()));

    // Run again, nothing is left to do.
    let said = run_workflow(&snakemake, &snakefile, t.path(), &["--configfile", "config.yaml", "--dry-run"], &[]);
    assert!(said.contains("Nothing to be done"), "{said}");
}

/// Runs `snakemake --snakefile SNAKEFILE ARGS...` in `dir`, with the binary
/// under test first on PATH; its output, or a panic with it and the listing.
fn run_workflow(snakemake: &Path, snakefile: &Path, dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> String {
    let path = std::env::join_paths(
        std::iter::once(binary_dir()).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    let started = Instant::now();
    let output = Command::new(snakemake)
        .arg("--snakefile")
        .arg(snakefile)
        .args(args)
        .current_dir(dir)
        .env("PATH", path)
        // snakemake keeps a cache of sources under $XDG_CACHE_HOME
        .env("XDG_CACHE_HOME", dir.join(".cache"))
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "snakemake {args:?} failed:\n{log}\n{}", crate::util::listing(dir));
    eprintln!("snakemake {args:?}: {:.1} s", started.elapsed().as_secs_f64());
    log
}

#[test]
fn snakemake_workflow_as_shipped_converts_the_bundled_cells() {
    let Some(snakemake) = snakemake() else { return };
    let t = TestDir::new();
    let workflow = shipped_workflow(&t);
    run_workflow(&snakemake, &workflow.join("Snakefile"), &workflow, &["--cores", "2"], &[]);
    assert_same_as_convert(&t, &workflow);
}

/// The workflow's folder and the bundled file in `t`, at the same relative
/// places as in the repository, so that the shipped config runs as is.
fn shipped_workflow(t: &TestDir) -> PathBuf {
    let workflow = t.join("workflows/snakemake");
    std::fs::create_dir_all(workflow.join("config")).unwrap();
    std::fs::create_dir_all(t.join("examples")).unwrap();
    for file in ["Snakefile", "config/config.yaml", "config/samples.tsv"] {
        std::fs::copy(repo().join("workflows/snakemake").join(file), workflow.join(file)).unwrap();
    }
    std::fs::copy(repo().join("examples/pbmc_1k.h5ad"), t.join("examples/pbmc_1k.h5ad")).unwrap();
    workflow
}

/// Checks the shipped workflow's dataset against one convert with the
/// options its config gives plan, of the input named as the sample sheet
/// names it (the manifest records it).
fn assert_same_as_convert(t: &TestDir, workflow: &Path) {
    let config = std::fs::read_to_string(workflow.join("config/config.yaml")).unwrap();
    let line = config.lines().find_map(|l| l.strip_prefix("options: ")).expect("the config's options");
    let options: Vec<String> = serde_json::from_str(line).unwrap();
    let mut args = vec!["convert", "-q"];
    args.extend(options.iter().map(String::as_str));
    args.extend(["../../examples/pbmc_1k.h5ad", "single"]);
    let status = t.command(&args).current_dir(workflow).status().unwrap();
    assert!(status.success(), "deltacells {args:?}");
    assert_same_tree(&workflow.join("results/pbmc_1k"), &workflow.join("single"));
}

/// The workflow with snakemake's Slurm executor on the one-node Slurm
/// cluster of slurm.rs: each rule a Slurm job, the shards 4 jobs. Not run by
/// default (`cargo test -- --ignored snakemake_workflow_on_slurm`): it takes
/// 60-90 s, as each job starts snakemake again (8-10 s a job on these 2
/// cores) and the executor polls at growing intervals. Needs root, Slurm, and
/// `pip install snakemake-executor-plugin-slurm` beside snakemake.
#[test]
#[ignore = "60-90 s; run with --ignored (needs root, slurm-wlm and snakemake-executor-plugin-slurm)"]
fn snakemake_workflow_on_slurm_executor() {
    let Some(snakemake) = snakemake() else { return };
    if !crate::slurm::slurm_here() {
        return;
    }
    let python = snakemake.with_file_name("python");
    let plugin = Command::new(&python).args(["-c", "import snakemake_executor_plugin_slurm"]).status();
    if !plugin.is_ok_and(|s| s.success()) {
        skip("snakemake-executor-plugin-slurm is not installed beside snakemake; the Slurm executor is not tested");
        return;
    }
    let t = TestDir::new();
    let mut cluster = crate::slurm::SlurmCluster::start(t.join("slurm"));
    let workflow = shipped_workflow(&t);
    // As the README says, with what this cluster needs: no accounting (so
    // squeue follows the jobs, and no account), a first look after 1 s, and
    // shards small enough for any machine.
    let args = [
        "--executor",
        "slurm",
        "--jobs",
        "4",
        "--slurm-status-command",
        "squeue",
        "--slurm-no-account",
        "--slurm-init-seconds-before-status-checks",
        "1",
        "--default-resources",
        "slurm_partition=local",
        "--config",
        "mem_mb_per_shard=500",
        "--latency-wait",
        "5",
    ];
    let log = run_workflow(&snakemake, &workflow.join("Snakefile"), &workflow, &args, &[("SLURM_CONF", &cluster.conf)]);
    // inputs runs on this host; plan, 4 shards, finalize and verify are jobs
    assert_eq!(log.matches("has been submitted with SLURM jobid").count(), 7, "{log}");
    assert_same_as_convert(&t, &workflow);
    let output = cluster.stop();
    assert!(output.status.success(), "stopping the cluster:\n{}", crate::slurm::text(&output));
}
