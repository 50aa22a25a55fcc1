use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use indicatif::{HumanBytes, HumanCount, ProgressBar, ProgressStyle};
use serde_json::{Map, Value};

use deltacells::convert::{convert, ConvertOptions, ConvertProgress};
use deltacells::obs::merge::ObsOptions;
use std::sync::Arc;

use deltacells::storage::{self, Storage};
use deltacells::writer::WriteOptions;

use crate::cli::ConvertArgs;

/// The progress bar: cells done of the phase's total, rate, ETA, current file.
pub(crate) struct Bar {
    pub(crate) bar: ProgressBar,
}

impl ConvertProgress for Bar {
    fn phase(&self, name: &str, total_cells: u64) {
        self.bar.set_length(total_cells);
        self.bar.set_position(0);
        self.bar.set_prefix(name.to_string());
    }
    fn file(&self, path: &Path) {
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        self.bar.set_message(name);
    }
    fn advance(&self, cells: u64) {
        self.bar.inc(cells);
    }
}

fn inputs_and_output(args: &ConvertArgs) -> anyhow::Result<(Vec<PathBuf>, String)> {
    let (out, given) = args.paths.split_last().expect("clap requires at least one path");
    let mut inputs: Vec<PathBuf> = given.iter().map(PathBuf::from).collect();
    if let Some(list) = &args.inputs_from {
        let text = std::fs::read_to_string(list).with_context(|| format!("--inputs-from {list}"))?;
        inputs.extend(text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(PathBuf::from));
    }
    if inputs.is_empty() {
        bail!("no input files: give INPUTS... OUT, or --inputs-from FILE OUT");
    }
    Ok((inputs, out.clone()))
}

fn parse_metadata(pairs: &[String]) -> anyhow::Result<Map<String, Value>> {
    let mut map = Map::new();
    for pair in pairs {
        let Some((k, v)) = pair.split_once('=') else {
            bail!("--metadata {pair:?}: expected KEY=VALUE");
        };
        map.insert(k.to_string(), Value::String(v.to_string()));
    }
    Ok(map)
}

/// What the arguments of convert and plan ask for.
struct Conversion {
    inputs: Vec<PathBuf>,
    out_path: String,
    store: Arc<dyn Storage>,
    options: ConvertOptions,
}

/// The inputs, the output's storage and the conversion options the arguments give.
fn conversion(args: &ConvertArgs) -> anyhow::Result<Conversion> {
    super::set_threads(args.threads)?;
    let (inputs, out) = inputs_and_output(args)?;
    if out.starts_with("http://") || out.starts_with("https://") {
        bail!("{out}: an HTTP server is read-only; write to a local folder, s3:// or gs://");
    }
    let out_path = out.strip_prefix("file://").unwrap_or(&out);
    if !storage::is_remote(&out) && Path::new(out_path).is_file() {
        bail!("{out_path}: is a file, not a folder");
    }
    let store = super::open_store(&out, &args.store)?;
    let options = ConvertOptions {
        matrix: args.matrix.clone(),
        write: WriteOptions { tile_size: args.tile_size, n_chunks: args.chunks as usize, zstd_level: args.level },
        gene_order_files: args.gene_order_files,
        write_var: !args.no_var,
        obs: (!args.no_obs).then(|| ObsOptions {
            names: !args.no_obs_names,
            exclude: args.obs_exclude.clone(),
            max_categories: args.max_categories,
            tiles_per_file: args.obs_tiles_per_file,
        }),
        overwrite: args.overwrite,
        metadata: parse_metadata(&args.metadata)?,
        ..ConvertOptions::default()
    };
    Ok(Conversion { inputs, out_path: out_path.to_string(), store, options })
}

/// A progress bar on a terminal, else nothing.
pub(crate) fn progress_bar(quiet: bool) -> ProgressBar {
    if super::show_progress(quiet) {
        let style = ProgressStyle::with_template(
            "{prefix:>10} {bar:30} {human_pos}/{human_len} cells {per_sec} ETA {eta} {wide_msg}",
        )
        .expect("valid template");
        ProgressBar::new(0).with_style(style)
    } else {
        ProgressBar::hidden()
    }
}

pub(crate) fn run_plan(args: &ConvertArgs) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let Conversion { inputs, out_path, store, options } = conversion(args).context("plan")?;
    let bar = progress_bar(args.quiet);
    let plan =
        deltacells::convert::plan(&inputs, store.as_ref(), &options, &Bar { bar: bar.clone() }).context("plan")?;
    bar.finish_and_clear();
    let summary = serde_json::json!({
        "plan": plan.id,
        "n_cells": plan.n_cells,
        "n_genes": plan.n_genes,
        "n_tiles": plan.n_tiles(),
        "max_useful_shards": plan.n_units(),
        "seconds": started.elapsed().as_secs_f64(),
    });
    if args.json {
        super::print_json(&summary)?;
    } else if !args.quiet {
        println!(
            "{out_path}: planned {} cells x {} genes in {} tiles; up to {} shards have work. Next: deltacells shard {out_path} --shard K/N (K = 0..N-1), then deltacells finalize {out_path}",
            HumanCount(plan.n_cells),
            HumanCount(plan.n_genes),
            plan.n_tiles(),
            plan.n_units()
        );
    }
    super::report_stats(store.as_ref(), &args.store, started, args.json);
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn run(args: &ConvertArgs) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let Conversion { inputs, out_path, store, options } = conversion(args).context("convert")?;
    let bar = progress_bar(args.quiet);
    let progress = Bar { bar: bar.clone() };
    let summary = convert(&inputs, store.as_ref(), &options, &progress).context("convert")?;
    bar.finish_and_clear();
    if args.json {
        super::print_json(&summary)?;
    } else if !args.quiet {
        println!(
            "{out_path}: {} cells x {} genes in {} tiles, {} ({:.3} bytes per nonzero, {} nonzeros) in {:.1} s",
            HumanCount(summary.n_cells),
            HumanCount(summary.n_genes),
            summary.n_tiles,
            HumanBytes(summary.tile_bytes),
            summary.bytes_per_nonzero,
            HumanCount(summary.nnz),
            summary.seconds
        );
    }
    super::report_stats(store.as_ref(), &args.store, started, args.json);
    Ok(ExitCode::SUCCESS)
}
