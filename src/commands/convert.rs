use std::path::PathBuf;

use anyhow::{bail, Context};
use indicatif::{HumanBytes, HumanCount};
use serde_json::{Map, Value};

use crate::convert::{convert, ConvertOptions};
use crate::convert::{GivenOrder, ObsOptions};
use crate::dataset::Dataset;
use std::sync::Arc;

use crate::storage::Storage;
use crate::writer::WriteOptions;

use super::progress::{plural, Bar};
use crate::cli::ConvertArgs;

fn inputs_and_output(args: &ConvertArgs) -> anyhow::Result<(Vec<PathBuf>, String)> {
    let (out, given) = args.paths.split_last().expect("clap requires at least one path");
    let inputs = super::input_paths(given, args.inputs_from.as_deref())?;
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

/// The gene order --gene-order-from or --gene-order gives, if either.
fn given_gene_order(args: &ConvertArgs) -> anyhow::Result<Option<GivenOrder>> {
    if let Some(root) = &args.gene_order_from {
        let store = super::open_store(root, &args.store)?;
        let dataset = Dataset::from_storage(store).with_context(|| format!("--gene-order-from {root}"))?;
        return Ok(Some(
            GivenOrder::from_dataset(&dataset, root).with_context(|| format!("--gene-order-from {root}"))?,
        ));
    }
    match &args.gene_order {
        Some(path) => Ok(Some(GivenOrder::from_npy(path).context("--gene-order")?)),
        None => Ok(None),
    }
}

/// What the arguments of convert and plan ask for.
struct Conversion {
    inputs: Vec<PathBuf>,
    /// The folder of --download-inputs, removed at the end.
    _downloads: Option<tempfile::TempDir>,
    out_path: String,
    store: Arc<dyn Storage>,
    options: ConvertOptions,
}

/// The inputs, the output's storage and the conversion options the arguments give.
fn conversion(args: &ConvertArgs) -> anyhow::Result<Conversion> {
    super::set_threads(args.threads)?;
    super::check_spill_dir(args.spill_dir.as_deref())?;
    let (inputs, out) = inputs_and_output(args)?;
    let (reach, downloads) = super::input_options(&args.store, &args.download, &args.reading, &inputs, false)?;
    let (out_path, store) = crate::convert::open_output(&out, &args.store.options(), "write to")?;
    let options = ConvertOptions {
        matrix: args.matrix.clone().unwrap_or_else(|| "X".into()),
        write: WriteOptions { tile_size: args.tile_size, n_chunks: args.chunks as usize, zstd_level: args.level },
        gene_order_files: args.gene_order_files,
        gene_order: given_gene_order(args)?,
        genes: args.genes.into(),
        write_var: !args.no_var,
        obs: (!args.no_obs).then(|| ObsOptions {
            names: !args.no_obs_names,
            exclude: args.obs_exclude.clone(),
            max_categories: args.max_categories,
            tiles_per_file: args.obs_tiles_per_file,
        }),
        overwrite: args.overwrite,
        metadata: parse_metadata(&args.metadata)?,
        shuffle: args.shuffle,
        spill_dir: args.spill_dir.clone(),
        inputs: reach,
        ..ConvertOptions::default()
    };
    Ok(Conversion { inputs, _downloads: downloads, out_path: out_path.to_string(), store, options })
}

/// What `plan --json` prints.
fn plan_summary(plan: &crate::convert::Plan, started: std::time::Instant) -> Value {
    serde_json::json!({
        "plan": plan.id,
        "n_cells": plan.n_cells,
        "n_genes": plan.n_genes,
        "n_tiles": plan.n_tiles(),
        "first_tile": plan.first_tile(),
        "max_useful_shards": plan.n_units(),
        "seconds": started.elapsed().as_secs_f64(),
    })
}

/// `plan --append DATASET INPUTS...`.
fn plan_append(args: &ConvertArgs, dataset: &str, started: std::time::Instant) -> anyhow::Result<u8> {
    super::set_threads(args.threads)?;
    let inputs = super::input_paths(&args.paths, args.inputs_from.as_deref())?;
    let store = super::open_store(dataset, &args.store)?;
    let (reach, _downloads) = super::input_options(&args.store, &args.download, &args.reading, &inputs, false)?;
    let options = crate::convert::AppendOptions {
        matrix: args.matrix.clone(),
        shuffle: args.shuffle,
        inputs: reach,
        ..Default::default()
    };
    let progress = Bar::new(args.quiet);
    let planned = crate::convert::plan_append(store.clone(), &inputs, &options, &progress).context("plan --append")?;
    progress.bar.finish_and_clear();
    match planned {
        crate::convert::Planned::Plan(plan) => {
            if args.json {
                super::print_json(&plan_summary(&plan, started))?;
            } else if !args.quiet {
                println!(
                    "{dataset}: planned an append of {} cells (tiles {} to {}); up to {} have work. Next: deltacells shard {dataset} --shard K/N (K = 0..N-1), then deltacells finalize {dataset}",
                    HumanCount(plan.n_cells - plan.first_cell() - plan.inputs.iter().filter(|i| i.stored_tile.is_some()).map(|i| i.n_rows).sum::<u64>()),
                    plan.first_tile(),
                    plan.n_tiles() - 1,
                    plural(plan.n_units() as u64, "shard", "shards")
                );
            }
        }
        crate::convert::Planned::Done(summary) => {
            if args.json {
                super::print_json(&summary)?;
            } else if !args.quiet {
                println!(
                    "{dataset}: {}: {} cells ({} cells now)",
                    summary.outcome,
                    HumanCount(summary.cells_added),
                    HumanCount(summary.n_cells)
                );
            }
        }
    }
    super::report_stats(store.as_ref(), &args.store, started, args.json);
    Ok(0)
}

pub(crate) fn run_plan(args: &ConvertArgs) -> anyhow::Result<u8> {
    let started = std::time::Instant::now();
    if let Some(dataset) = &args.append {
        return plan_append(args, dataset, started);
    }
    let Conversion { inputs, out_path, store, options, _downloads } = conversion(args).context("plan")?;
    let progress = Bar::new(args.quiet);
    if let Some(spec) = &args.totals_shard {
        let (k, n) = super::parse_k_of_n("--totals-shard", spec)?;
        let done = crate::convert::plan_totals_shard(&inputs, store.as_ref(), &options, k, n, &progress)
            .context("plan --totals-shard")?;
        progress.bar.finish_and_clear();
        if args.json {
            super::print_json(&done)?;
        } else if !args.quiet {
            println!(
                "{out_path}: gene totals of share {k}/{n}: {} ({} cells) in {:.1} s. Next: the other shares, then the same deltacells plan without --totals-shard",
                plural(done.inputs.len() as u64, "file", "files"),
                HumanCount(done.cells),
                done.seconds
            );
        }
        super::report_stats(store.as_ref(), &args.store, started, args.json);
        return Ok(0);
    }
    let plan = crate::convert::plan(&inputs, store.as_ref(), &options, &progress).context("plan")?;
    progress.bar.finish_and_clear();
    if args.json {
        super::print_json(&plan_summary(&plan, started))?;
    } else if !args.quiet {
        println!(
            "{out_path}: planned {} cells x {} genes in {}; up to {} have work. Next: deltacells shard {out_path} --shard K/N (K = 0..N-1), then deltacells finalize {out_path}",
            HumanCount(plan.n_cells),
            HumanCount(plan.n_genes),
            plural(plan.n_tiles() as u64, "tile", "tiles"),
            plural(plan.n_units() as u64, "shard", "shards")
        );
    }
    super::report_stats(store.as_ref(), &args.store, started, args.json);
    Ok(0)
}

pub(crate) fn run(args: &ConvertArgs) -> anyhow::Result<u8> {
    let started = std::time::Instant::now();
    if args.append.is_some() {
        bail!("--append is for `deltacells plan` (a sharded append); to append in one run, use `deltacells append DATASET INPUTS...`");
    }
    if args.totals_shard.is_some() {
        bail!("--totals-shard is for `deltacells plan` (sharded conversion); convert sums the gene totals itself");
    }
    let Conversion { inputs, out_path, store, options, _downloads } = conversion(args).context("convert")?;
    let progress = Bar::new(args.quiet);
    let summary = convert(&inputs, store.as_ref(), &options, &progress).context("convert")?;
    progress.bar.finish_and_clear();
    if args.json {
        super::print_json(&summary)?;
    } else if !args.quiet {
        println!(
            "{out_path}: {} cells x {} genes in {}, {} ({:.3} bytes per nonzero, {} nonzeros) in {:.1} s",
            HumanCount(summary.n_cells),
            HumanCount(summary.n_genes),
            plural(summary.n_tiles as u64, "tile", "tiles"),
            HumanBytes(summary.tile_bytes),
            summary.bytes_per_nonzero,
            HumanCount(summary.nnz),
            summary.seconds
        );
        if summary.summed_duplicates > 0 {
            println!(
                "{out_path}: {} entries repeated a cell and gene of an earlier entry; each was added to it",
                HumanCount(summary.summed_duplicates)
            );
        }
        if summary.dropped_nonzeros > 0 {
            println!(
                "{out_path}: {} nonzeros of genes that not every input has were left out (--genes intersection)",
                HumanCount(summary.dropped_nonzeros)
            );
        }
    }
    super::report_stats(store.as_ref(), &args.store, started, args.json);
    Ok(0)
}
