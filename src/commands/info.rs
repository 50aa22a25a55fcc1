use std::io::Write;

use anyhow::Context;
use indicatif::{HumanBytes, HumanCount};

use crate::collection::{CollectionFile, GeneChoice};
use crate::info::dataset_info;
use crate::Dataset;

use super::progress::plural;
use crate::cli::InfoArgs;

pub(crate) fn run(args: &InfoArgs) -> anyhow::Result<u8> {
    let path = std::path::Path::new(&args.dataset);
    if args.dataset.ends_with(".json") && path.is_file() {
        return collection(path, args);
    }
    let started = std::time::Instant::now();
    let ds = Dataset::from_storage(super::open_store(&args.dataset, &args.store)?).context("info")?;
    let info = dataset_info(&ds).context("info")?;
    if args.json {
        super::print_json(&info)?;
        super::report_stats(ds.storage().as_ref(), &args.store, started, true);
        return Ok(0);
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
    Ok(0)
}

/// What `info` reports of a collection file.
#[derive(serde::Serialize)]
struct CollectionInfo {
    collection: String,
    n_datasets: usize,
    n_cells: u64,
    /// "union", "intersection" or "list".
    genes: String,
    n_genes: usize,
    gene_column: Option<String>,
    datasets: Vec<MemberInfo>,
}

#[derive(serde::Serialize)]
struct MemberInfo {
    name: String,
    root: String,
    n_cells: u64,
    n_genes: u32,
    n_tiles: usize,
    /// Genes of the collection this dataset holds.
    genes_held: usize,
    weight: Option<f64>,
    manifest_sha256: String,
}

/// `info COLLECTION.json`: opens every dataset of the collection file (each
/// checked against the manifest digest it records) and summarizes them.
fn collection(path: &std::path::Path, args: &InfoArgs) -> anyhow::Result<u8> {
    let file = CollectionFile::read(path).context("info")?;
    let weights = file.weights_in_order().map_err(|m| anyhow::anyhow!("{}: {m}", path.display()))?;
    let store = args.store.options();
    let c = file.open(&store).context("info")?;
    let held = c.holders().context("info")?;
    let info = CollectionInfo {
        collection: path.display().to_string(),
        n_datasets: c.n_members(),
        n_cells: c.n_cells(),
        genes: match &file.genes {
            GeneChoice::Union => "union".into(),
            GeneChoice::Intersection => "intersection".into(),
            GeneChoice::List(_) => "list".into(),
        },
        n_genes: c.vocabulary().len(),
        gene_column: file.gene_column.clone(),
        datasets: c
            .members()
            .enumerate()
            .map(|(i, m)| MemberInfo {
                // A member named by its root, or a root with credentials in it.
                name: crate::redact::redact(&m.name).into_owned(),
                root: crate::redact::redact(&m.root).into_owned(),
                n_cells: m.n_cells,
                n_genes: m.n_genes,
                n_tiles: m.tile_cells.len(),
                genes_held: held[i].iter().filter(|&&h| h).count(),
                weight: weights.as_ref().map(|w| w[i]),
                manifest_sha256: m.manifest_sha256.clone(),
            })
            .collect(),
    };
    if args.json {
        super::print_json(&info)?;
        return Ok(0);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "collection   {}", info.collection)?;
    writeln!(out, "datasets     {}", HumanCount(info.n_datasets as u64))?;
    writeln!(out, "cells        {}", HumanCount(info.n_cells))?;
    let by = info.gene_column.as_deref().unwrap_or("var_names");
    writeln!(out, "genes        {} ({}, matched by {by})", HumanCount(info.n_genes as u64), info.genes)?;
    let width = info.datasets.iter().map(|d| d.name.len()).max().unwrap_or(4).max(4);
    writeln!(
        out,
        "  {:width$}  {:>12}  {:>8}  {:>10}  {:>6}  {:>7}  root",
        "name", "cells", "genes", "held", "tiles", "weight"
    )?;
    for d in &info.datasets {
        let weight = d.weight.map_or("-".to_string(), |w| format!("{w}"));
        writeln!(
            out,
            "  {:width$}  {:>12}  {:>8}  {:>10}  {:>6}  {:>7}  {}",
            d.name,
            HumanCount(d.n_cells).to_string(),
            HumanCount(u64::from(d.n_genes)).to_string(),
            HumanCount(d.genes_held as u64).to_string(),
            d.n_tiles,
            weight,
            d.root
        )?;
    }
    Ok(0)
}
