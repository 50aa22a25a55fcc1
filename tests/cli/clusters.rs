//! The cluster recipes of docs/clusters.md, run as the docs give them: the
//! Kubernetes Indexed Job's and the AWS Batch array job's shard commands,
//! taken from the page, started once per index with the variables those
//! systems set (one worker killed mid-run and replaced by another of the
//! same index, as both systems retry), then finalized and compared byte for
//! byte with one `convert`. The Slurm script is in slurm.rs, the Snakemake
//! workflow in snakemake.rs; both use the page helpers here.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use crate::sharded::assert_same_tree;
use crate::util::TestDir;

/// The repository's root.
pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The part of docs/clusters.md under the heading that starts with
/// `heading`, up to the next heading of the same or a higher level.
pub(crate) fn docs_section(heading: &str) -> String {
    let page = std::fs::read_to_string(repo().join("docs/clusters.md")).expect("docs/clusters.md");
    let mut lines = page.lines().skip_while(|l| !l.starts_with(heading));
    let first = lines.next().unwrap_or_else(|| panic!("docs/clusters.md has no heading {heading:?}"));
    let level = first.chars().take_while(|&c| c == '#').count();
    let mut out = String::new();
    let mut in_code = false;
    for line in lines {
        in_code ^= line.starts_with("```");
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !in_code && hashes > 0 && hashes <= level && line[hashes..].starts_with(' ') {
            break;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The code blocks of a section of docs/clusters.md whose fence names `lang`.
pub(crate) fn code_blocks(section: &str, lang: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in section.lines() {
        match &mut current {
            None if line == format!("```{lang}") => current = Some(String::new()),
            Some(block) if line == "```" => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// The number after `key` in `text` (`completions: 100` -> 100).
fn number_after(text: &str, key: &str) -> usize {
    let at = text.find(key).unwrap_or_else(|| panic!("{key:?} not found in\n{text}")) + key.len();
    let digits: String = text[at..].trim_start().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("no number after {key:?}"))
}

/// The JSON array of strings that follows the first `key` after `marker` in
/// `text` (the YAML `args: [...]`, the `command=[...]` of an AWS override).
fn json_args_after(text: &str, marker: &str, key: &str) -> Vec<String> {
    let from = text.find(marker).unwrap_or_else(|| panic!("no {marker:?} in\n{text}"));
    let start = from + text[from..].find(key).unwrap_or_else(|| panic!("no {key:?} after {marker:?}")) + key.len();
    let end = start + text[start..].find(']').expect("the array's end") + 1;
    serde_json::from_str(&text[start..end]).unwrap_or_else(|e| panic!("{:?}: {e}", &text[start..end]))
}

/// The docs' commands write to a bucket; the test writes to `out` instead.
fn to_local(args: &[String], out: &Path) -> Vec<String> {
    args.iter().map(|a| if a.starts_with("s3://") { out.display().to_string() } else { a.clone() }).collect()
}

/// A job array as an engine runs it: `size` workers, index 0..size, at most
/// `parallelism` at once, each started with the variables `env_of(index,
/// attempt)` gives. With the test-only stall hook set, the first worker to
/// write a tile stops there; it is killed, as a lost node's worker is, and a
/// second attempt of its index is started. Returns the index killed.
fn run_array(
    t: &TestDir,
    args: &[String],
    size: usize,
    parallelism: usize,
    env_of: &dyn Fn(usize, usize) -> Vec<(String, String)>,
    stall: Option<&Path>,
) -> Option<usize> {
    let mut waiting: VecDeque<(usize, usize)> = (0..size).map(|k| (k, 1)).collect();
    let mut running: Vec<(usize, Child)> = Vec::new();
    let mut killed = None;
    let started = Instant::now();
    while !waiting.is_empty() || !running.is_empty() {
        assert!(started.elapsed() < Duration::from_secs(300), "the job array did not finish in 300 s");
        while running.len() < parallelism {
            let Some((k, attempt)) = waiting.pop_front() else { break };
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut cmd = t.command(&args);
            cmd.envs(env_of(k, attempt));
            if let Some(marker) = stall {
                cmd.env("DELTACELLS_TEST_STALL_SHARD", marker);
            }
            // a worker's output, as the engine keeps it
            let log = std::fs::File::create(t.join(&format!("worker-{k}-attempt-{attempt}.log"))).unwrap();
            cmd.stdout(log.try_clone().unwrap()).stderr(log);
            running.push((k, cmd.spawn().expect("start a worker")));
        }
        if let (Some(marker), None) = (stall, killed) {
            if let Ok(text) = std::fs::read_to_string(marker) {
                if let Some((k, _)) = text.trim().split_once('/') {
                    let k: usize = k.parse().expect("the stalled shard's index");
                    let at = running.iter().position(|(i, _)| *i == k).expect("the stalled worker runs");
                    let (_, mut child) = running.remove(at);
                    child.kill().unwrap();
                    child.wait().unwrap();
                    waiting.push_back((k, 2));
                    killed = Some(k);
                }
            }
        }
        let mut i = 0;
        while i < running.len() {
            if let Some(status) = running[i].1.try_wait().unwrap() {
                let (k, _) = running.remove(i);
                if !status.success() {
                    let log = std::fs::read_to_string(t.join(&format!("worker-{k}-attempt-1.log")));
                    panic!("the worker of index {k}: {status}\n{}", log.unwrap_or_default());
                }
            } else {
                i += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    killed
}

/// The bundled 1,000 PBMC cells as 100 tiles of 10 cells, one obs shard
/// each, so that each of the docs' 100 shards has one tile to write.
const LAYOUT: [&str; 6] = ["--tile-size", "10", "--obs-tiles-per-file", "1", "--level", "3"];

fn convert_and_plan(t: &TestDir, plan: &[&str]) {
    let input = repo().join("examples/pbmc_1k.h5ad");
    std::fs::write(t.join("inputs.txt"), format!("{}\n", input.display())).unwrap();
    let mut args = vec!["convert", "-q", "--inputs-from", "inputs.txt"];
    args.extend(LAYOUT);
    args.push("single");
    t.run(&args).expect_code(0);
    let mut args = plan.to_vec();
    args.push("-q");
    args.extend(LAYOUT);
    t.run(&args).expect_code(0);
}

/// Whether the stall hook is built in; otherwise the kill is skipped, noted.
fn stall_marker(t: &TestDir) -> Option<PathBuf> {
    if cfg!(feature = "fault-injection") {
        Some(t.join("stalled-shard"))
    } else {
        crate::util::skip("built without the fault-injection feature; no worker is killed mid-run");
        None
    }
}

#[test]
fn kubernetes_indexed_job_of_the_docs_equals_one_convert() {
    let yaml = code_blocks(&docs_section("## Kubernetes"), "yaml").concat();
    let completions = number_after(&yaml, "completions:");
    let parallelism = number_after(&yaml, "parallelism:");
    assert!(yaml.contains("completionMode: Indexed"), "{yaml}");
    let t = TestDir::new();
    let out = t.join("atlas");
    // the image's entry point is `deltacells`
    let args = to_local(&json_args_after(&yaml, "args:", "args:"), &out);
    assert!(args.starts_with(&["shard".to_string()]) && args.contains(&"--shard-from-env".into()), "{args:?}");
    // The Job's plan (in the comment) reads the inputs' list; here one file.
    convert_and_plan(&t, &["plan", "--inputs-from", "inputs.txt", out.to_str().unwrap()]);
    let stall = stall_marker(&t);
    // Each pod: JOB_COMPLETION_INDEX, and the hostname $(job-name)-$(index).
    let pod = |k: usize, _attempt: usize| {
        vec![("JOB_COMPLETION_INDEX".to_string(), k.to_string()), ("HOSTNAME".into(), format!("atlas-convert-{k}"))]
    };
    let killed = run_array(&t, &args, completions, parallelism, &pod, stall.as_deref());
    assert_eq!(killed.is_some(), stall.is_some(), "a pod was to be killed mid-run");
    t.run(&["finalize", "-q", out.to_str().unwrap()]).expect_code(0);
    assert_same_tree(&out, &t.join("single"));
}

#[test]
fn aws_batch_array_job_of_the_docs_equals_one_convert() {
    let script = code_blocks(&docs_section("## AWS Batch"), "sh").concat();
    let size = number_after(&script, "--array-properties size=");
    let t = TestDir::new();
    let out = t.join("atlas");
    // the job definition's image runs `deltacells`, the overrides give its arguments
    let plan = to_local(&json_args_after(&script, "atlas-plan", "command="), &out);
    let shard = to_local(&json_args_after(&script, "--array-properties", "command="), &out);
    let finalize = to_local(&json_args_after(&script, "atlas-finalize", "command="), &out);
    assert_eq!(plan[..2], ["plan", "--inputs-from"], "{plan:?}");
    assert_eq!(shard, ["shard", out.to_str().unwrap(), "--shard-from-env"]);
    assert_eq!(finalize, ["finalize", out.to_str().unwrap()]);
    // /config/inputs.txt, in the image, lists the inputs; here one file.
    let mut plan: Vec<&str> = plan.iter().map(String::as_str).collect();
    plan[2] = "inputs.txt";
    convert_and_plan(&t, &plan);
    let stall = stall_marker(&t);
    // Each child job: its index, the array's size, its attempt (a retry is
    // attempt 2) and an ID of the parent's ID and the index.
    let child = |k: usize, attempt: usize| {
        [
            ("AWS_BATCH_JOB_ARRAY_INDEX", k.to_string()),
            ("AWS_BATCH_JOB_ARRAY_SIZE", size.to_string()),
            ("AWS_BATCH_JOB_ATTEMPT", attempt.to_string()),
            ("AWS_BATCH_JOB_ID", format!("5b4c2a8e-0d7f-4a53-9a55-2c1f7e6a9d10:{k}")),
            ("AWS_BATCH_JQ_NAME", "cpu".into()),
            ("AWS_BATCH_CE_NAME", "cpu-spot".into()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect()
    };
    // AWS Batch starts the children as capacity allows: 10 at a time here.
    let killed = run_array(&t, &shard, size, 10, &child, stall.as_deref());
    assert_eq!(killed.is_some(), stall.is_some(), "a child job was to be killed mid-run");
    let finalize: Vec<&str> = finalize.iter().map(String::as_str).collect();
    t.run(&finalize).expect_code(0);
    assert_same_tree(&out, &t.join("single"));
}
