//! The Slurm recipe of docs/clusters.md on a real one-node Slurm cluster
//! (Debian's slurm-wlm and munge, started and stopped by
//! scripts/slurm_cluster.sh in the test's folder): the docs' script,
//! workflows/slurm/convert.sbatch, submitted with `sbatch --array=0-3`
//! converts the PBMC files in 4 shards, and the docs' finalize job joins them
//! into the bytes of one `convert`; again with one task killed mid-run by
//! `scontrol requeue`, which Slurm runs again. Skipped, noted, where Slurm is
//! not installed or the test does not run as root.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::clusters::{code_blocks, docs_section, repo};
use crate::sharded::assert_same_tree;
use crate::util::{binary_dir, find_program, listing, skip, TestDir};

/// A cluster started by scripts/slurm_cluster.sh, stopped when dropped (and
/// so when the test fails) if the test has not stopped it.
pub(crate) struct SlurmCluster {
    dir: PathBuf,
    pub(crate) conf: PathBuf,
    stopped: bool,
}

fn script(action: &str, dir: &Path) -> Output {
    Command::new("bash").arg(repo().join("scripts/slurm_cluster.sh")).arg(action).arg(dir).output().unwrap()
}

pub(crate) fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

impl SlurmCluster {
    pub(crate) fn start(dir: PathBuf) -> Self {
        let started = Instant::now();
        let output = script("start", &dir);
        assert!(output.status.success(), "the Slurm cluster did not start:\n{}", text(&output));
        eprintln!("slurm: the cluster started in {:.1} s", started.elapsed().as_secs_f64());
        let conf = dir.join("slurm.conf");
        SlurmCluster { dir, conf, stopped: false }
    }

    /// A Slurm client command (sbatch, scontrol, squeue) of this cluster.
    pub(crate) fn command(&self, program: &str, cwd: &Path) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf).current_dir(cwd);
        c
    }

    /// Everything that tells why a job did not finish: the queue, the
    /// daemons' logs and the jobs' output.
    pub(crate) fn explain(&self, cwd: &Path) -> String {
        let queue = self.command("squeue", cwd).arg("--states=all").output().map(|o| text(&o)).unwrap_or_default();
        let mut out = format!("--- squeue\n{queue}");
        for dir in [self.dir.join("log"), cwd.to_path_buf()] {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if name.ends_with(".log") || name.ends_with(".out") {
                    let body = std::fs::read_to_string(&path).unwrap_or_default();
                    let lines: Vec<&str> = body.lines().collect();
                    let tail = lines[lines.len().saturating_sub(20)..].join("\n");
                    out += &format!("--- {}\n{tail}\n", path.display());
                }
            }
        }
        out
    }

    pub(crate) fn stop(&mut self) -> Output {
        self.stopped = true;
        script("stop", &self.dir)
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        if !self.stopped {
            let output = self.stop();
            eprintln!("slurm: stopped after a failure:\n{}", text(&output));
        }
    }
}

/// Whether this machine can run the cluster; notes the skip otherwise.
pub(crate) fn slurm_here() -> bool {
    let missing: Vec<&str> = ["sbatch", "scontrol", "squeue", "slurmctld", "slurmd", "munged", "mungekey"]
        .into_iter()
        .filter(|p| find_program(p).is_none())
        .collect();
    if !missing.is_empty() {
        skip(&format!(
            "{} not found (`apt-get install slurm-wlm munge`, as root; .ci/run installs them); the Slurm test is skipped",
            missing.join(", ")
        ));
        return false;
    }
    let root = Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0\n")).unwrap_or(false);
    if !root {
        skip("the one-node Slurm cluster needs root (slurmd runs jobs as their users); the Slurm test is skipped");
    }
    root
}

/// `sbatch --parsable ARGS...` in `cwd` with `deltacells` on the jobs' PATH
/// (sbatch passes its environment to the job); the job's ID.
fn sbatch(cluster: &SlurmCluster, cwd: &Path, args: &[&str], env: &[(&str, &Path)]) -> String {
    let path = std::env::join_paths(
        std::iter::once(binary_dir()).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    let mut c = cluster.command("sbatch", cwd);
    c.arg("--parsable").args(args).env("PATH", path).env("NO_COLOR", "1");
    c.envs(env.iter().map(|(k, v)| (k, v)));
    let output = c.output().unwrap();
    assert!(output.status.success(), "sbatch {args:?}:\n{}", text(&output));
    String::from_utf8(output.stdout).unwrap().trim().split(';').next().unwrap().to_string()
}

/// Runs `f` every 50 ms until it gives a value; panics after `seconds`,
/// with the cluster's logs.
fn wait_for<T>(cluster: &SlurmCluster, cwd: &Path, seconds: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if started.elapsed() > Duration::from_secs(seconds) {
            panic!("{what}: nothing after {seconds} s\n{}", cluster.explain(cwd));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The state of a job (`COMPLETED`, `RUNNING`, ...) and its restarts.
fn job_state(cluster: &SlurmCluster, cwd: &Path, job: &str) -> (String, String) {
    let output = cluster.command("scontrol", cwd).args(["show", "job", job]).output().unwrap();
    let shown = text(&output);
    let field = |name: &str| {
        shown.split_whitespace().find_map(|w| w.strip_prefix(name)).map(str::to_string).unwrap_or_default()
    };
    (field("JobState="), field("Restarts="))
}

/// The docs' finalize job, after the array `job`; waits until it completes.
fn finalize_after(cluster: &SlurmCluster, cwd: &Path, job: &str, out: &Path) {
    let wrap = format!("deltacells finalize {}", out.display());
    let finalize = sbatch(cluster, cwd, &[&format!("--dependency=afterok:{job}"), "--wrap", &wrap], &[]);
    let state = wait_for(cluster, cwd, 300, "the finalize job", || {
        let (state, _) = job_state(cluster, cwd, &finalize);
        (!["PENDING", "RUNNING", "CONFIGURING", "COMPLETING", ""].contains(&state.as_str())).then_some(state)
    });
    assert_eq!(state, "COMPLETED", "the finalize job\n{}\n{}", cluster.explain(cwd), listing(out));
}

#[test]
fn docs_slurm_script_converts_in_an_array_job_and_survives_a_requeue() {
    let Some((ctrl, stim)) = crate::util::pbmc() else { return };
    if !slurm_here() {
        return;
    }
    // The script is the one docs/clusters.md shows, byte for byte.
    let sbatch_script = repo().join("workflows/slurm/convert.sbatch");
    let shown = code_blocks(&docs_section("## Slurm"), "sh");
    let file = std::fs::read_to_string(&sbatch_script).unwrap();
    assert!(shown.contains(&file), "docs/clusters.md does not show workflows/slurm/convert.sbatch as it is");

    let t = TestDir::new();
    let mut cluster = SlurmCluster::start(t.join("slurm"));
    // 13,999 cells: 14 tiles in 7 obs shards, of which 4 shards have 2, 2, 2 and 1.
    let layout = ["--tile-size", "1000", "--obs-tiles-per-file", "2", "--level", "3"];
    let (ctrl, stim) = (ctrl.to_str().unwrap(), stim.to_str().unwrap());
    let run = |verb: &str, out: &str| {
        let mut args = vec![verb, "-q"];
        args.extend(layout);
        args.extend([ctrl, stim, out]);
        t.run(&args).expect_code(0);
    };
    run("convert", "single");
    let script = sbatch_script.to_str().unwrap();
    // The docs' 32 CPUs and 8 GiB are more than this machine may have: the
    // task's size is given on the command line, as on any cluster.
    let array = ["--array=0-3", "--cpus-per-task=1", "--mem=1G", script];

    // Four tasks, then the finalize job.
    let started = Instant::now();
    run("plan", "clean");
    let clean = t.join("clean");
    let mut args = array.to_vec();
    args.push(clean.to_str().unwrap());
    let job = sbatch(&cluster, t.path(), &args, &[]);
    finalize_after(&cluster, t.path(), &job, &clean);
    assert_same_tree(&clean, &t.join("single"));
    eprintln!("slurm: 4 shards and finalize in {:.1} s", started.elapsed().as_secs_f64());

    // The first task to write a tile stops there (the test-only stall hook),
    // with a tile written and its result not; `scontrol requeue` kills it,
    // and Slurm runs it again from the start.
    if cfg!(feature = "fault-injection") {
        let started = Instant::now();
        run("plan", "requeued");
        let requeued = t.join("requeued");
        let marker = t.join("stalled-shard");
        let mut args = array.to_vec();
        args.push(requeued.to_str().unwrap());
        let job = sbatch(&cluster, t.path(), &args, &[("DELTACELLS_TEST_STALL_SHARD", &marker)]);
        let k: usize = wait_for(&cluster, t.path(), 120, "a task to stall", || {
            let text = std::fs::read_to_string(&marker).ok()?;
            text.trim().strip_suffix("/4").map(|k| k.parse().expect("the stalled shard's index"))
        });
        let task = format!("{job}_{k}");
        // mid-run: a tile written, the result not
        assert!(!requeued.join(format!(".plan/results/shard-{k:05}-of-00004.json")).exists());
        let output = cluster.command("scontrol", t.path()).args(["requeue", &task]).output().unwrap();
        assert!(output.status.success(), "scontrol requeue {task}: {}", text(&output));
        finalize_after(&cluster, t.path(), &job, &requeued);
        assert_same_tree(&requeued, &t.join("single"));
        assert_eq!(job_state(&cluster, t.path(), &task), ("COMPLETED".into(), "1".into()), "task {task}");
        eprintln!("slurm: 4 shards, one requeued, and finalize in {:.1} s", started.elapsed().as_secs_f64());
    } else {
        skip("built without the fault-injection feature; the requeue of a task mid-run is not tested");
    }

    let output = cluster.stop();
    assert!(output.status.success(), "stopping the cluster left something running:\n{}", text(&output));
}
