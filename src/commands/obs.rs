use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context};
use indicatif::HumanBytes;
use serde::Serialize;

use crate::obs::localize::{cache_root, cached_file_is_valid, column_path, ObsSource};
use crate::Dataset;

use crate::cli::{LocalizeArgs, ObsCommand, ObsInfoArgs};

pub(crate) fn run(cmd: &ObsCommand) -> anyhow::Result<u8> {
    match cmd {
        ObsCommand::Info(args) => info(args),
        ObsCommand::Localize(args) => run_localize(args),
    }
}

#[derive(Serialize)]
struct ColumnInfo {
    name: String,
    kind: String,
    arrow_type: String,
    n_categories: Option<usize>,
    fetch_bytes: u64,
    fetch_requests: u64,
    cached: bool,
}

#[derive(Serialize)]
struct ObsInfo {
    dataset: String,
    fingerprint: String,
    shards: usize,
    shard_bytes: u64,
    cache: String,
    /// What any localize reads first, once: obs/schema.json and the shard footers.
    open_requests: u64,
    open_bytes: u64,
    columns: Vec<ColumnInfo>,
}

fn info(args: &ObsInfoArgs) -> anyhow::Result<u8> {
    let started = std::time::Instant::now();
    let ds = Dataset::from_storage(super::open_store(&args.dataset, &args.store)?).context("obs info")?;
    let manifest = ds.manifest();
    let Some(obs) = manifest.obs() else { bail!("obs info: {}: the dataset has no obs", args.dataset) };
    let source = ObsSource::open(ds.storage().as_ref(), manifest).context("obs info")?;
    let root = cache_root(args.cache_dir.as_deref().map(Path::new));
    let columns = source
        .schema
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (fetch_requests, fetch_bytes) = source.column_cost(i);
            ColumnInfo {
                name: c.name.clone(),
                kind: c.kind.as_str().to_string(),
                arrow_type: c.arrow_type.clone(),
                n_categories: c.categories.as_ref().map(Vec::len),
                fetch_bytes,
                fetch_requests,
                cached: cached_file_is_valid(
                    &column_path(&root, obs.fingerprint, &c.name),
                    &c.name,
                    &manifest.tile_cells,
                ),
            }
        })
        .collect();
    let (open_requests, open_bytes) = source.opening_cost();
    let report = ObsInfo {
        dataset: ds.storage().location(""),
        fingerprint: obs.fingerprint.to_string(),
        shards: obs.shard_bytes.len(),
        shard_bytes: obs.shard_bytes.iter().sum(),
        cache: root.join(obs.fingerprint).join("obs").display().to_string(),
        open_requests,
        open_bytes,
        columns,
    };
    if args.json {
        super::print_json(&report)?;
        super::report_stats(ds.storage().as_ref(), &args.store, started, true);
        return Ok(0);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}: {} obs columns in {} shards ({}), fingerprint {}",
        report.dataset,
        report.columns.len(),
        report.shards,
        HumanBytes(report.shard_bytes),
        report.fingerprint
    )?;
    writeln!(out, "cache: {}", report.cache)?;
    writeln!(
        out,
        "a localize first reads obs/schema.json and the shard footers ({} in {} requests), then the columns' chunks:",
        HumanBytes(report.open_bytes),
        report.open_requests
    )?;
    let width = report.columns.iter().map(|c| c.name.len()).max().unwrap_or(4).max(6);
    writeln!(
        out,
        "{:width$}  {:8}  {:6}  {:>10}  {:>12}  {:>8}  local",
        "column", "kind", "type", "categories", "fetch", "requests"
    )?;
    for c in &report.columns {
        let cats = c.n_categories.map_or(String::new(), |n| n.to_string());
        let local = if c.cached { "yes" } else { "no" };
        writeln!(
            out,
            "{:width$}  {:8}  {:6}  {cats:>10}  {:>12}  {:>8}  {local}",
            c.name,
            c.kind,
            c.arrow_type,
            HumanBytes(c.fetch_bytes).to_string(),
            c.fetch_requests
        )?;
    }
    drop(out);
    super::report_stats(ds.storage().as_ref(), &args.store, started, false);
    Ok(0)
}

fn run_localize(args: &LocalizeArgs) -> anyhow::Result<u8> {
    super::set_threads(args.threads)?;
    let started = std::time::Instant::now();
    let ds = Dataset::from_storage(super::open_store(&args.dataset, &args.store)?).context("obs localize")?;
    let manifest = ds.manifest();
    if manifest.obs().is_none() {
        bail!("obs localize: {}: the dataset has no obs", args.dataset);
    }
    let columns: Vec<String> = if args.all {
        let schema = crate::obs::read_schema(ds.storage().as_ref()).context("obs localize")?.schema;
        schema.columns.into_iter().map(|c| c.name).collect()
    } else {
        args.columns.clone()
    };
    let root = cache_root(args.cache_dir.as_deref().map(Path::new));
    let report = ds.localize_obs(&columns, &root, args.force).context("obs localize")?;
    if args.json {
        super::print_json(&report)?;
    } else {
        let mut out = std::io::stdout().lock();
        if !report.fetched.is_empty() {
            writeln!(
                out,
                "fetched {} ({} in {} requests, {:.2} s)",
                report.fetched.join(", "),
                HumanBytes(report.bytes),
                report.requests,
                report.seconds
            )?;
        }
        if !report.already_local.is_empty() {
            writeln!(out, "already local: {}", report.already_local.join(", "))?;
        }
        if !report.replaced.is_empty() {
            writeln!(out, "replaced invalid cache files: {}", report.replaced.join(", "))?;
        }
        writeln!(out, "cache: {}", report.cache)?;
    }
    super::report_stats(ds.storage().as_ref(), &args.store, started, args.json);
    Ok(0)
}
