use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use indicatif::{HumanBytes, HumanCount};

use deltacells::info::dataset_info;
use deltacells::Dataset;

use super::progress::plural;
use crate::cli::InfoArgs;

pub(crate) fn run(args: &InfoArgs) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let ds = Dataset::from_storage(super::open_store(&args.dataset, &args.store)?).context("info")?;
    let info = dataset_info(&ds).context("info")?;
    if args.json {
        super::print_json(&info)?;
        super::report_stats(ds.storage().as_ref(), &args.store, started, true);
        return Ok(ExitCode::SUCCESS);
    }
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let mut out = std::io::stdout().lock();
    writeln!(out, "dataset      {}", info.dataset)?;
    writeln!(out, "cells        {}", HumanCount(info.n_cells))?;
    writeln!(out, "genes        {}", HumanCount(info.n_genes))?;
    writeln!(
        out,
        "tiles        {} of up to {}",
        HumanCount(info.n_tiles as u64),
        plural(info.tile_size, "cell", "cells")
    )?;
    writeln!(out, "nonzeros     {}", HumanCount(info.nnz))?;
    writeln!(
        out,
        "size         {} on disk, tiles {} ({:.3} bytes per nonzero)",
        HumanBytes(info.bytes_on_disk),
        HumanBytes(info.tile_bytes),
        info.bytes_per_nonzero
    )?;
    writeln!(
        out,
        "encoding     format version {}, {} chunks per tile, zstd level {}",
        info.version, info.n_chunks, info.zstd_level
    )?;
    writeln!(
        out,
        "files        gene_order.npy: {}, var_names.txt: {}, var.parquet: {}, obs: {}",
        yes_no(info.has_gene_order),
        yes_no(info.has_var_names),
        yes_no(info.has_var_table),
        yes_no(info.has_obs)
    )?;
    if let Some(obs) = &info.obs {
        writeln!(
            out,
            "obs          {} in {} of up to {}, fingerprint {}",
            plural(obs.columns.len() as u64, "column", "columns"),
            plural(obs.shards as u64, "shard", "shards"),
            plural(obs.tiles_per_file, "tile", "tiles"),
            obs.fingerprint
        )?;
        let width = obs.columns.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for c in &obs.columns {
            let cats = c.n_categories.map(|n| format!("  {n} categories")).unwrap_or_default();
            writeln!(out, "  {:width$}  {:8}  {:6}{cats}", c.name, c.kind, c.arrow_type)?;
        }
    }
    if let Some(var) = &info.var_columns {
        // pyarrow's name for an unnamed pandas index is no name a user gave.
        let names: Vec<String> = var
            .iter()
            .map(|c| match (c.is_index, c.name.as_str()) {
                (true, "__index_level_0__") => "(unnamed index)".to_string(),
                (true, name) => format!("{name} (index)"),
                (false, name) => name.to_string(),
            })
            .collect();
        writeln!(out, "var columns  {}", names.join(", "))?;
    }
    writeln!(out, "metadata     {}", serde_json::Value::Object(info.metadata.clone()))?;
    super::report_stats(ds.storage().as_ref(), &args.store, started, false);
    Ok(ExitCode::SUCCESS)
}
