use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use deltacells::format::CsrMatrix;

/// A temporary folder for one test, and a way to run the binary in it. When an
/// assertion on a run fails, the command, its output and the folder's listing
/// are printed.
pub struct TestDir {
    dir: tempfile::TempDir,
}

pub struct Run {
    pub cmd: String,
    pub output: Output,
    pub listing: String,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    pub fn code(&self) -> i32 {
        self.output.status.code().unwrap_or(-1)
    }

    fn explain(&self) -> String {
        format!(
            "command: {}\nexit: {:?}\n--- stdout\n{}\n--- stderr\n{}\n--- folder\n{}",
            self.cmd,
            self.output.status.code(),
            self.stdout(),
            self.stderr(),
            self.listing
        )
    }

    /// Asserts the exit status and returns self.
    #[track_caller]
    pub fn expect_code(self, code: i32) -> Self {
        assert_eq!(self.code(), code, "unexpected exit status\n{}", self.explain());
        self
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.output.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON: {e}\n{}", self.explain()))
    }
}

impl TestDir {
    pub fn new() -> Self {
        TestDir { dir: tempfile::tempdir().expect("temp dir") }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// Runs `deltacells ARGS...` in this folder.
    pub fn run(&self, args: &[&str]) -> Run {
        self.run_env(args, &[])
    }

    /// Runs `deltacells ARGS...` in this folder with extra environment variables.
    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let output = self.command(args).envs(env.iter().copied()).output().expect("run deltacells");
        Run { cmd: format!("deltacells {}", args.join(" ")), output, listing: listing(self.path()) }
    }

    /// `deltacells ARGS...` in this folder, not yet started: for a test that
    /// spawns, kills or times a run (`run` waits, and explains a failure).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = deltacells();
        c.args(args).current_dir(self.path());
        c
    }
}

/// The binary, with the environment of every test run: no colors, HDF5
/// without file locks (test threads write .h5ad files while others spawn
/// this binary; a child would inherit the writer's descriptor and so its
/// flock, which real runs never share), and none of the job-array variables
/// that `shard --shard-from-env` reads.
pub fn deltacells() -> Command {
    with_test_environment(Command::new(env!("CARGO_BIN_EXE_deltacells")))
}

/// The address space [`TestDir::run_limited`] gives the binary, in KiB.
pub const ADDRESS_SPACE_KIB: u64 = 1 << 20;

impl TestDir {
    /// Runs `deltacells ARGS...` in this folder with its address space
    /// limited to [`ADDRESS_SPACE_KIB`] (`ulimit -v`, so even a reservation
    /// never touched fails): an allocation sized by a hostile length field
    /// aborts the run instead of passing unseen, while converting a small
    /// file needs far less. Two threads and two malloc arenas, so that
    /// threads' reservations stay well within it.
    pub fn run_limited(&self, args: &[&str]) -> Run {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("ulimit -v {ADDRESS_SPACE_KIB} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_deltacells"))
            .args(args)
            .current_dir(self.path())
            .env("MALLOC_ARENA_MAX", "2")
            .env("RAYON_NUM_THREADS", "2");
        let output = with_test_environment(c).output().expect("run deltacells");
        Run {
            cmd: format!("(ulimit -v {ADDRESS_SPACE_KIB}) deltacells {}", args.join(" ")),
            output,
            listing: listing(self.path()),
        }
    }
}

/// `c` with the environment of every test run (see [`deltacells`]).
fn with_test_environment(mut c: Command) -> Command {
    c.env("NO_COLOR", "1").env("HDF5_USE_FILE_LOCKING", "FALSE");
    for var in [
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_MIN",
        "SLURM_ARRAY_TASK_COUNT",
        "JOB_COMPLETION_INDEX",
        "AWS_BATCH_JOB_ARRAY_INDEX",
        "AWS_BATCH_JOB_ARRAY_SIZE",
    ] {
        c.env_remove(var);
    }
    c
}

pub fn listing(dir: &Path) -> String {
    let mut out = String::new();
    for entry in walk(dir) {
        let size = std::fs::metadata(&entry).map(|m| m.len()).unwrap_or(0);
        out.push_str(&format!("{} ({size} bytes)\n", entry.strip_prefix(dir).unwrap_or(&entry).display()));
    }
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A deterministic pseudo-random count matrix with a realistic shape: most
/// counts 1-3, a few large, some empty cells, genes skewed toward low indices.
pub fn synthetic_matrix(n_cells: usize, n_genes: u32, seed: u64) -> CsrMatrix {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut m = CsrMatrix::empty(n_genes);
    for _ in 0..n_cells {
        if next() % 10 == 0 {
            m.indptr.push(m.indices.len() as u64);
            continue;
        }
        let mut gene = 0u64;
        loop {
            gene += 1 + (next() % 7) * (next() % 5);
            if gene >= u64::from(n_genes) {
                break;
            }
            let r = next() % 1000;
            let count = match r {
                0 => 70_000 + (next() % 1000) as u32,
                1..=5 => 100 + (next() % 1000) as u32,
                _ => 1 + (r % 3) as u32,
            };
            m.indices.push(gene as u32);
            m.data.push(count);
        }
        m.indptr.push(m.indices.len() as u64);
    }
    m
}

/// Where [`skip`] records the checks skipped by a run of the tests, one line
/// each (test, place, why): scripts/test.sh empties it before the tests and
/// prints it, counted, after them, since libtest shows no output of a test
/// that passes.
pub const SKIPPED: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/skipped.txt");

/// Notes that a test (or part of one) is skipped because something it needs is
/// absent here: `../shared`, the PBMC files, or the Python packages that
/// scripts/setup.sh installs (the servers and the anndata checks), in
/// [`SKIPPED`]. Where DELTACELLS_REQUIRE_ALL is set, as `.ci/run` sets it, a
/// skip is a failure instead, so that CI cannot pass without those tests.
#[track_caller]
pub fn skip(note: &str) {
    if std::env::var_os("DELTACELLS_REQUIRE_ALL").is_some_and(|v| !v.is_empty() && v != "0") {
        panic!("{note}, and DELTACELLS_REQUIRE_ALL is set: this test must not be skipped");
    }
    eprintln!("note: {note}");
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let line = format!("{test} ({}): {note}\n", std::panic::Location::caller());
    let file = std::fs::OpenOptions::new().create(true).append(true).open(SKIPPED);
    if let Ok(mut file) = file {
        let _ = std::io::Write::write_all(&mut file, line.as_bytes());
    }
}

/// Runs tests/python/check_roundtrip.py with ARGS under $DELTACELLS_PYTHON (set
/// by scripts/test.sh, whose venv has anndata, pandas and pyarrow); skipped
/// with a note where it is not set.
pub fn python_check(args: &[&str]) {
    python_script("check_roundtrip.py", args);
}

/// Runs tests/python/SCRIPT with ARGS under $DELTACELLS_PYTHON, or notes the skip.
pub fn python_script(script: &str, args: &[&str]) {
    let Some(python) = std::env::var_os("DELTACELLS_PYTHON") else {
        skip("DELTACELLS_PYTHON not set; anndata/pandas checks skipped");
        return;
    };
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python").join(script);
    // The same inherited-lock hazard as in TestDir::run applies to h5py.
    let out =
        Command::new(python).arg(script).args(args).env("HDF5_USE_FILE_LOCKING", "FALSE").output().expect("run python");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "Python check failed:\n{text}");
    eprint!("{text}");
}

/// The two real PBMC files (ctrl, stim) from $DELTACELLS_PBMC or data/pbmc
/// (scripts/test.sh fetches them); None, with a note, where they are absent.
pub fn pbmc() -> Option<(PathBuf, PathBuf)> {
    let dir = std::env::var_os("DELTACELLS_PBMC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/pbmc"));
    let (a, b) = (dir.join("pbmc_ctrl.h5ad"), dir.join("pbmc_stim.h5ad"));
    if a.is_file() && b.is_file() {
        Some((a, b))
    } else {
        skip(&format!("PBMC files not found in {}; real-data test skipped", dir.display()));
        None
    }
}

/// The path of PROGRAM on $PATH, or in /usr/sbin or /sbin (where Debian puts
/// daemons such as slurmctld, and which a user's PATH may lack).
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// The folder holding the `deltacells` binary under test, to put first on
/// the PATH of what runs it by name (a Slurm job, a Snakemake rule).
pub fn binary_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_deltacells")).parent().expect("the binary's folder").to_path_buf()
}
