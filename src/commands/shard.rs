//! `shard` and `finalize`, steps 2 and 3 of a sharded conversion (`plan` is in
//! convert.rs, beside convert, whose options it takes): which shard this
//! worker is, progress for terminals and for cluster logs, and the reports.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use indicatif::{HumanBytes, HumanCount};

use crate::convert::{finalize, run_shard, ConvertProgress, ShardOptions, MAX_IN_FLIGHT};

use super::parse_k_of_n;
use super::progress::{human_rate, plural, Bar};
use crate::cli::{FinalizeArgs, ShardArgs};

/// Parses `K/N`.
fn parse_shard(text: &str) -> anyhow::Result<(usize, usize)> {
    parse_k_of_n("--shard", text)
}

fn env_number(name: &str) -> anyhow::Result<Option<usize>> {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().map(Some).map_err(|_| anyhow::anyhow!("${name} is {v:?}, not a number")),
        Err(_) => Ok(None),
    }
}

/// K and N from a job-array engine's environment.
fn shard_from_env(shards: Option<usize>) -> anyhow::Result<(usize, usize)> {
    let (k, n_env, var) = if let Some(id) = env_number("SLURM_ARRAY_TASK_ID")? {
        let min = env_number("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
        (
            id.checked_sub(min).context("SLURM_ARRAY_TASK_ID is below SLURM_ARRAY_TASK_MIN")?,
            env_number("SLURM_ARRAY_TASK_COUNT")?,
            "SLURM_ARRAY_TASK_ID",
        )
    } else if let Some(id) = env_number("JOB_COMPLETION_INDEX")? {
        (id, None, "JOB_COMPLETION_INDEX")
    } else if let Some(id) = env_number("AWS_BATCH_JOB_ARRAY_INDEX")? {
        (id, env_number("AWS_BATCH_JOB_ARRAY_SIZE")?, "AWS_BATCH_JOB_ARRAY_INDEX")
    } else {
        bail!(
            "--shard-from-env: none of SLURM_ARRAY_TASK_ID, JOB_COMPLETION_INDEX, AWS_BATCH_JOB_ARRAY_INDEX is set; use --shard K/N"
        );
    };
    let Some(n) = shards.or(n_env) else {
        bail!("--shard-from-env: ${var} gives K = {k}, but not N; give --shards N");
    };
    if k >= n {
        bail!("--shard-from-env: ${var} gives K = {k}, which is not below N = {n}");
    }
    Ok((k, n))
}

/// One line per tile written, for logs (stderr is not a terminal).
struct LogLines {
    label: String,
    started: Instant,
    cells: std::sync::atomic::AtomicU64,
    nnz: std::sync::atomic::AtomicU64,
}

impl ConvertProgress for LogLines {
    fn tile_done(&self, index: usize, cells: u64, nnz: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let total_cells = self.cells.fetch_add(cells, Relaxed) + cells;
        let total_nnz = self.nnz.fetch_add(nnz, Relaxed) + nnz;
        let seconds = self.started.elapsed().as_secs_f64().max(1e-9);
        eprintln!(
            "{}: tile {index} written ({} cells, {} nonzeros); {} cells in {seconds:.1} s, {}, {}",
            self.label,
            HumanCount(cells),
            HumanCount(nnz),
            HumanCount(total_cells),
            human_rate(total_cells as f64 / seconds, "cells"),
            human_rate(total_nnz as f64 / seconds, "nonzeros")
        );
    }
}

pub(crate) fn run(args: &ShardArgs) -> anyhow::Result<u8> {
    super::set_threads(args.threads)?;
    let started = Instant::now();
    super::check_spill_dir(args.spill_dir.as_deref())?;
    let (k, n) = match &args.shard {
        Some(text) => parse_shard(text)?,
        None => shard_from_env(args.shards)?,
    };
    let label = format!("shard {k}/{n}");
    let store = super::open_store(&args.out, &args.store)?;
    let inputs: Vec<std::path::PathBuf> = if args.download.download_inputs {
        // The plan's inputs (of a conversion, or of an append to a dataset);
        // without a plan, run_shard says so below.
        let plan = crate::convert::read_planned(store.as_ref()).ok();
        plan.map(|p| p.inputs.into_iter().map(|i| i.path).collect()).unwrap_or_default()
    } else {
        Vec::new()
    };
    let (reach, _downloads) = super::input_options(&args.store, &args.download, &Default::default(), &inputs, true)?;
    let in_flight = ShardOptions { max_in_flight: MAX_IN_FLIGHT, spill_dir: args.spill_dir.clone(), inputs: reach };
    let result = if super::show_progress(args.quiet) {
        let progress = Bar::new(false);
        progress.bar.set_prefix(label.clone());
        let r = run_shard(store.as_ref(), k, n, &in_flight, &progress);
        progress.bar.finish_and_clear();
        r
    } else if args.quiet {
        run_shard(store.as_ref(), k, n, &in_flight, &crate::convert::NoProgress)
    } else {
        let log = LogLines { label: label.clone(), started, cells: 0.into(), nnz: 0.into() };
        run_shard(store.as_ref(), k, n, &in_flight, &log)
    }
    .with_context(|| label.clone())?;
    let seconds = started.elapsed().as_secs_f64();
    let tiles = result.first_tile..result.first_tile + result.tile_cells.len();
    if args.json {
        let mut value = serde_json::to_value(&result)?;
        value["seconds"] = serde_json::json!(seconds);
        super::print_json(&value)?;
    } else if !args.quiet {
        let cells: u64 = result.tile_cells.iter().sum();
        let nnz: u64 = result.tile_nnz.iter().sum();
        let bytes: u64 = result.tile_bytes.iter().sum();
        println!(
            "{label}: tiles {}..{} ({} cells, {} nonzeros, {}) and {} in {seconds:.1} s",
            tiles.start,
            tiles.end,
            HumanCount(cells),
            HumanCount(nnz),
            HumanBytes(bytes),
            plural(result.obs_shard_bytes.len() as u64, "obs shard", "obs shards")
        );
    }
    super::report_stats(store.as_ref(), &args.store, started, args.json);
    Ok(0)
}

pub(crate) fn run_finalize(args: &FinalizeArgs) -> anyhow::Result<u8> {
    let started = Instant::now();
    let store = super::open_store(&args.out, &args.store)?;
    let summary = finalize(store.as_ref()).context("finalize")?;
    if args.json {
        super::print_json(&summary)?;
    } else if !args.quiet {
        println!(
            "{}: {} cells x {} genes in {}, {} ({:.3} bytes per nonzero, {} nonzeros); manifest written",
            Path::new(&args.out).display(),
            HumanCount(summary.n_cells),
            HumanCount(summary.n_genes),
            plural(summary.n_tiles as u64, "tile", "tiles"),
            HumanBytes(summary.tile_bytes),
            summary.bytes_per_nonzero,
            HumanCount(summary.nnz)
        );
    }
    super::report_stats(store.as_ref(), &args.store, started, args.json);
    Ok(0)
}
