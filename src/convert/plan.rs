//! Sharded conversion: plan, shard K of N, finalize.
//!
//! `plan` writes everything the workers need into the output, under `.plan/`
//! (plan.json: the inputs and their row counts, the options, the tile layout)
//! and at the dataset's own keys (gene_order.npy, var_names.txt, var.parquet,
//! obs/schema.json, which are final). Shard K of N encodes its own contiguous
//! range of tiles, aligned to obs shards, reading only the inputs that hold its
//! cells, and writes its tiles, its obs shards and, last, a result record under
//! `.plan/results/`. `finalize` checks that the records cover every tile and
//! obs shard and agree with the plan and with the stored objects, writes
//! manifest.json, then removes `.plan/`.
//!
//! Every step is deterministic, so the dataset is byte-identical whatever the
//! number of shards and the order they run in; a shard run twice writes the
//! same bytes again, and touches no other shard's objects.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::obs_merge::ObsPlan;
use super::{
    gene_order_from_totals, gene_totals, prepare_output, sampled_inputs, scan_inputs, write_tiles, ConvertOptions,
    ConvertProgress, ConvertSummary, Input, ShardOptions, TileJob,
};
use crate::format::{self, fingerprint, npy, MAX_GENES};
use crate::storage::Storage;
use crate::writer::{manifest_of, DatasetWriter, ManifestFlags, TileRecord, WriteOptions};

/// Where the plan is, in the output.
pub(crate) const PLAN_KEY: &str = crate::dataset::PLAN_KEY;
/// Where shard results are, in the output.
pub(crate) const RESULTS_PREFIX: &str = ".plan/results";
pub(crate) const PLAN_FORMAT: &str = "deltacells-plan";
const RESULT_FORMAT: &str = "deltacells-shard-result";

/// The key of shard `k` of `n`'s result record.
pub(crate) fn result_key(k: usize, n: usize) -> String {
    format!("{RESULTS_PREFIX}/shard-{k:05}-of-{n:05}.json")
}

/// (k, n) from a result key.
fn parse_result_key(key: &str) -> Option<(usize, usize)> {
    let name = key.strip_prefix(RESULTS_PREFIX)?.strip_prefix("/shard-")?.strip_suffix(".json")?;
    let (k, n) = name.split_once("-of-")?;
    Some((k.parse().ok()?, n.parse().ok()?))
}

/// Where `plan --totals-shard` puts the gene totals of its share of the
/// sampled inputs, in the output.
pub(crate) const TOTALS_PREFIX: &str = ".plan/totals";
const TOTALS_FORMAT: &str = "deltacells-gene-totals";

fn totals_key(k: usize, n: usize) -> String {
    format!("{TOTALS_PREFIX}/shard-{k:05}-of-{n:05}.json")
}

/// The gene totals of one share of the sampled inputs.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct TotalsShard {
    format: String,
    /// What the totals are of (the sampled inputs with their sizes, the
    /// matrix, the source genes): a plan takes only totals of what it samples.
    of: String,
    shard: usize,
    shards: usize,
    inputs: Vec<String>,
    cells: u64,
    totals: Vec<u64>,
}

/// What a totals shard did.
#[derive(Clone, Debug, Serialize)]
pub struct TotalsSummary {
    pub shard: usize,
    pub shards: usize,
    /// The sampled inputs this share summed.
    pub inputs: Vec<PathBuf>,
    pub cells: u64,
    pub seconds: f64,
}

/// The identity of the totals a plan of `scanned` samples.
fn totals_identity(scanned: &[Input], sampled: &[usize], matrix: &str, genes: &[String]) -> String {
    let files: Vec<_> = sampled.iter().map(|&i| (&scanned[i].path, scanned[i].bytes, scanned[i].n_rows)).collect();
    let text = serde_json::to_vec(&json!({"files": files, "matrix": matrix, "genes": genes})).expect("serializes");
    fingerprint::sha256_hex(&text)[..24].to_string()
}

/// The sampled inputs (indices into `sampled`) that share `k` of `n` sums:
/// consecutive, as even as they go.
fn totals_share(n_sampled: usize, k: usize, n: usize) -> Range<usize> {
    k * n_sampled / n..(k + 1) * n_sampled / n
}

/// Plan step 0, optional: sums the gene totals of share `k` of `n` (0-based)
/// of the inputs the plan samples, and stores them in `out` for [`plan()`] to
/// add up instead of reading those inputs' X itself. Run with the inputs and
/// options the plan will have; the plan refuses totals of anything else.
pub fn plan_totals_shard(
    inputs: &[PathBuf],
    out: &dyn Storage,
    options: &ConvertOptions,
    k: usize,
    n: usize,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<TotalsSummary> {
    let started = std::time::Instant::now();
    if n == 0 || k >= n {
        bail!("--totals-shard {k}/{n}: K must be from 0 to N-1");
    }
    if inputs.is_empty() {
        bail!("no input files");
    }
    let sampled = sampled_inputs(inputs.len(), options.gene_order_files);
    let mine: Vec<usize> = sampled[totals_share(sampled.len(), k, n)].to_vec();
    let (scanned, var_names) = scan_inputs(inputs, &options.matrix, options.genes, &mine, progress)?;
    let keys = out.list("").with_context(|| format!("cannot list the output {}", out.location("")))?;
    if keys.iter().any(|key| !key.starts_with(TOTALS_PREFIX)) {
        return Err(super::ConvertError::NotEmpty { location: out.location("") }.into());
    }
    let totals = gene_totals(&scanned, &mine, &options.matrix, &var_names, progress)?;
    let record = TotalsShard {
        format: TOTALS_FORMAT.into(),
        of: totals_identity(&scanned, &sampled, &options.matrix, &var_names),
        shard: k,
        shards: n,
        inputs: mine.iter().map(|&i| scanned[i].path.display().to_string()).collect(),
        cells: mine.iter().map(|&i| scanned[i].n_rows).sum(),
        totals,
    };
    let mut text = serde_json::to_vec(&record)?;
    text.push(b'\n');
    out.put(&totals_key(k, n), Bytes::from(text))?;
    Ok(TotalsSummary {
        shard: k,
        shards: n,
        inputs: mine.iter().map(|&i| scanned[i].path.clone()).collect(),
        cells: record.cells,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Whether `out` holds gene totals of `plan --totals-shard` (checked by
/// [`stored_totals`] once the inputs are scanned).
fn has_stored_totals(out: &dyn Storage) -> bool {
    out.list(TOTALS_PREFIX).is_ok_and(|keys| !keys.is_empty())
}

/// The gene totals `plan --totals-shard` stored in `out`, summed, when there
/// are any: every share of one count N must be there, and of the inputs and
/// options this plan samples (`identity`).
fn stored_totals(out: &dyn Storage, identity: &str, n_genes: usize) -> anyhow::Result<Option<Vec<u64>>> {
    let keys = out.list(TOTALS_PREFIX)?;
    if keys.is_empty() {
        return Ok(None);
    }
    let again = format!(
        "run `deltacells plan --totals-shard K/N` with this plan's inputs and options, or remove {} to sum them here",
        out.location(TOTALS_PREFIX)
    );
    let mut shares: BTreeMap<usize, TotalsShard> = BTreeMap::new();
    let mut count = None;
    for key in &keys {
        let location = out.location(key);
        let bytes = out.get(key)?.with_context(|| format!("{location}: vanished while planning"))?;
        let r: TotalsShard = serde_json::from_slice(&bytes)
            .ok()
            .filter(|r: &TotalsShard| r.format == TOTALS_FORMAT && r.shard < r.shards && r.totals.len() == n_genes)
            .with_context(|| format!("{location}: not gene totals of this plan's {n_genes} genes; {again}"))?;
        if r.of != identity {
            bail!(
                "{location}: gene totals of other inputs or options (--matrix, --genes, --gene-order-files, \
                 or an input changed since); {again}"
            );
        }
        if *count.get_or_insert(r.shards) != r.shards {
            bail!("{location}: totals of {} shares beside totals of {}; {again}", r.shards, count.unwrap_or(0));
        }
        shares.insert(r.shard, r);
    }
    let n = count.unwrap_or(0);
    let missing: Vec<String> = (0..n).filter(|k| !shares.contains_key(k)).map(|k| format!("{k}/{n}")).collect();
    if !missing.is_empty() {
        bail!("{}: the gene totals of shares {} are missing; {again}", out.location(TOTALS_PREFIX), missing.join(", "));
    }
    let mut totals = vec![0u64; n_genes];
    for share in shares.values() {
        for (t, s) in totals.iter_mut().zip(&share.totals) {
            *t = t.saturating_add(*s);
        }
    }
    Ok(Some(totals))
}

/// What obs the plan stores; the schema itself is obs/schema.json.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PlanObs {
    /// The first column is the cell names.
    pub names: bool,
    pub tiles_per_file: u64,
    /// The last two columns say where each cell was read (`source_file`,
    /// `source_row`: a shuffled dataset's), filled by the shards.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub source: bool,
}

/// Everything a shard worker needs besides the files the plan wrote.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Plan {
    pub format: String,
    pub version: u32,
    /// Identifies this plan; results of another plan are refused.
    pub id: String,
    pub matrix: String,
    pub inputs: Vec<Input>,
    pub n_cells: u64,
    pub n_genes: u64,
    pub tile_size: u64,
    pub n_chunks: usize,
    pub zstd_level: i32,
    pub var_table: bool,
    pub obs: Option<PlanObs>,
    /// The manifest's metadata.
    pub metadata: Map<String, Value>,
    /// What an append keeps of the dataset it extends; None for a conversion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub append: Option<AppendPlan>,
    /// The seed of the order the cells are stored in (`convert --shuffle`);
    /// None for the inputs' order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle: Option<u64>,
}

/// The part of an append's plan that a conversion's does not have: the
/// dataset's tiles before `first_tile` (and their obs shards) are kept.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AppendPlan {
    /// SHA-256 of the manifest appended to: shards and finalize refuse another.
    pub base: String,
    /// The first tile the shards write (the dataset's last, when not full).
    pub first_tile: usize,
    /// The cells of the tiles before it.
    pub first_cell: u64,
    /// The obs shards before `first_tile`'s, as kept (or as the plan restated
    /// them, under `.append/`).
    pub kept_obs_bytes: Vec<u64>,
    pub kept_obs_sha256: Vec<String>,
    /// Stored obs columns whose type the append changes.
    pub restated: Vec<super::obs_merge::Restated>,
}

impl Plan {
    pub fn n_tiles(&self) -> usize {
        self.n_cells.div_ceil(self.tile_size) as usize
    }

    /// The first tile the shards write: 0, or an append's first.
    pub fn first_tile(&self) -> usize {
        self.append.as_ref().map_or(0, |a| a.first_tile)
    }

    /// The cell that is the first input's first row.
    pub fn first_cell(&self) -> u64 {
        self.append.as_ref().map_or(0, |a| a.first_cell)
    }

    pub fn tile_cells(&self, tile: usize) -> u64 {
        let start = tile as u64 * self.tile_size;
        (start + self.tile_size).min(self.n_cells) - start
    }

    /// Tiles per unit of work: an obs shard's tiles, or one tile without obs.
    pub fn tiles_per_unit(&self) -> usize {
        self.obs.as_ref().map_or(1, |o| o.tiles_per_file.max(1) as usize)
    }

    /// Units of work: more shards than this leave some with nothing to do.
    pub fn n_units(&self) -> usize {
        self.n_tiles().div_ceil(self.tiles_per_unit()) - self.first_tile() / self.tiles_per_unit()
    }

    /// The tiles of shard `k` of `n`: a contiguous range of whole units (an
    /// append's first unit starts at its first tile), the units spread as
    /// evenly as they go.
    pub fn shard_tiles(&self, k: usize, n: usize) -> Range<usize> {
        let (units, per) = (self.n_units(), self.tiles_per_unit());
        let first_unit = self.first_tile() / per;
        let unit = |k: usize| ((first_unit + k * units / n) * per).clamp(self.first_tile(), self.n_tiles());
        unit(k)..unit(k + 1)
    }

    /// The obs shards that tiles `tiles` fall in.
    fn obs_shards_of(&self, tiles: &Range<usize>) -> Range<usize> {
        let per = self.tiles_per_unit();
        if tiles.is_empty() {
            return tiles.start / per..tiles.start / per;
        }
        tiles.start / per..tiles.end.div_ceil(per)
    }

    fn write_options(&self) -> WriteOptions {
        WriteOptions { tile_size: self.tile_size, n_chunks: self.n_chunks, zstd_level: self.zstd_level }
    }

    pub(crate) fn with_id(mut self) -> Plan {
        self.id = String::new();
        let text = serde_json::to_vec(&self).expect("a plan serializes");
        self.id = fingerprint::sha256_hex(&text)[..24].to_string();
        self
    }
}

/// What shard K of N wrote.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ShardResult {
    pub format: String,
    pub plan: String,
    pub shard: usize,
    pub shards: usize,
    pub first_tile: usize,
    pub tile_cells: Vec<u64>,
    pub tile_nnz: Vec<u64>,
    pub tile_bytes: Vec<u64>,
    pub tile_sha256: Vec<String>,
    pub first_obs_shard: usize,
    pub obs_shard_bytes: Vec<u64>,
    pub obs_shard_sha256: Vec<String>,
    /// Nonzeros of genes the dataset does not store (`--genes intersection`).
    #[serde(default)]
    pub dropped_nonzeros: u64,
}

/// Step 1: scans the inputs and writes the plan, the gene tables and the obs
/// schema into `out` (plan.json last).
pub fn plan(
    inputs: &[PathBuf],
    out: &dyn Storage,
    options: &ConvertOptions,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<Plan> {
    plan_then(inputs, out, options, Then::Nothing, progress)
}

/// What the process does after a plan: the inputs it reads whole, fetched
/// ahead while they are scanned when they are at URLs.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Then {
    /// Nothing: the shards run elsewhere (the plan reads the sampled inputs).
    Nothing,
    /// Every tile, here (convert reads every input whole).
    Tiles,
}

/// [`plan`], with what follows it.
pub(crate) fn plan_then(
    inputs: &[PathBuf],
    out: &dyn Storage,
    options: &ConvertOptions,
    then: Then,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<Plan> {
    if inputs.is_empty() {
        bail!("no input files");
    }
    if options.write.tile_size == 0 {
        bail!("the tile size must be at least 1");
    }
    // The sampled inputs' X is read for the gene totals (unless they were
    // summed by plan --totals-shard), and every input's for the tiles.
    let mut read_whole = match options.gene_order {
        Some(_) => Vec::new(),
        None if has_stored_totals(out) => Vec::new(),
        None => sampled_inputs(inputs.len(), options.gene_order_files),
    };
    if then == Then::Tiles {
        let rest: Vec<usize> = (0..inputs.len()).filter(|i| !read_whole.contains(i)).collect();
        read_whole.extend(rest);
    }
    let (scanned, var_names) = scan_inputs(inputs, &options.matrix, options.genes, &read_whole, progress)?;
    let n_genes = var_names.len() as u64;
    if n_genes == 0 || n_genes > MAX_GENES {
        bail!("{}: {} has {n_genes} genes; a dataset needs 1..2^31", inputs[0].display(), options.matrix);
    }
    let mut obs_plan = match &options.obs {
        Some(o) => {
            progress.phase("reading obs", 0);
            let paths: Vec<&Path> = scanned.iter().map(|i| i.path.as_path()).collect();
            ObsPlan::new(&paths, &options.matrix, o)?
        }
        None => None,
    };
    if let (Some(p), Some(_)) = (&mut obs_plan, options.shuffle) {
        let names: Vec<String> = scanned.iter().map(|i| i.path.display().to_string()).collect();
        p.add_source_columns(&names).map_err(anyhow::Error::msg)?;
    }
    prepare_output(out, options.overwrite)?;

    let (sampled, order) = match &options.gene_order {
        Some(given) => (Vec::new(), given.resolve(&var_names, &scanned[0].path)?),
        None => {
            let sampled = sampled_inputs(scanned.len(), options.gene_order_files);
            let identity = totals_identity(&scanned, &sampled, &options.matrix, &var_names);
            let totals = match stored_totals(out, &identity, var_names.len())? {
                Some(totals) => {
                    progress.note("gene totals summed from the results of plan --totals-shard");
                    totals
                }
                None => gene_totals(&scanned, &sampled, &options.matrix, &var_names, progress)?,
            };
            (sampled, gene_order_from_totals(&totals))
        }
    };
    let order_i32: Vec<i32> = order.iter().map(|&g| g as i32).collect();
    out.put(format::GENE_ORDER_KEY, Bytes::from(npy::write_i32(&order_i32)))?;
    let mut names_text = String::new();
    for &g in &order {
        names_text.push_str(&var_names[g as usize]);
        names_text.push('\n');
    }
    out.put(format::VAR_NAMES_KEY, Bytes::from(names_text))?;
    if options.write_var {
        let first = super::input::open(&scanned[0].path, &options.matrix)?;
        let first_genes = first.gene_names()?;
        // The first input's row of each stored gene (none for genes only later inputs have).
        let first_rows: Vec<Option<u32>> = match super::genes::column_map(&scanned[0].path, &first_genes, &var_names)? {
            None => order.iter().map(|&g| Some(g)).collect(),
            Some(map) => {
                let mut row_of = vec![None; var_names.len()];
                for (row, &g) in map.iter().enumerate() {
                    if g != super::genes::DROPPED {
                        row_of[g as usize] = Some(row as u32);
                    }
                }
                order.iter().map(|&g| row_of[g as usize]).collect()
            }
        };
        let stored_names: Vec<&str> = order.iter().map(|&g| var_names[g as usize].as_str()).collect();
        let table = super::var_table::build(first.var()?.as_ref(), &first_rows, &stored_names)?;
        out.put(format::VAR_TABLE_KEY, Bytes::from(table))?;
    }
    if let Some(p) = &obs_plan {
        out.put(format::OBS_SCHEMA_KEY, Bytes::from(p.schema_text()))?;
    }

    let mut metadata = Map::new();
    metadata.insert("generator".into(), json!(format!("deltacells {}", env!("CARGO_PKG_VERSION"))));
    metadata.insert(
        "convert".into(),
        json!({
            "inputs": scanned.iter().map(|i| i.path.display().to_string()).collect::<Vec<_>>(),
            "matrix": options.matrix,
            "genes": options.genes.as_str(),
            "gene_order_files": sampled.iter().map(|&i| scanned[i].path.display().to_string()).collect::<Vec<_>>(),
            "tile_size": options.write.tile_size,
            "n_chunks": options.write.n_chunks,
            "zstd_level": options.write.zstd_level,
        }),
    );
    if let (Some(seed), Some(Value::Object(record))) = (options.shuffle, metadata.get_mut("convert")) {
        record.insert(
            "shuffle".into(),
            json!({
                "seed": seed,
                "source_columns": obs_plan.is_some(),
            }),
        );
    }
    if let (Some(given), Some(Value::Object(record))) = (&options.gene_order, metadata.get_mut("convert")) {
        record.insert("gene_order_from".into(), json!(given.source()));
    }
    // What an append needs to merge more inputs' obs as this plan did.
    if let (Some(o), Some(p), Some(Value::Object(record))) = (&options.obs, &obs_plan, metadata.get_mut("convert")) {
        record.insert(
            "obs".into(),
            json!({
                "names": o.names,
                "exclude": o.exclude,
                "max_categories": o.max_categories,
                "categories_as_strings": p.categories_as_strings(),
            }),
        );
    }
    metadata.extend(options.metadata.clone());
    let plan = Plan {
        format: PLAN_FORMAT.into(),
        version: 1,
        id: String::new(),
        matrix: options.matrix.clone(),
        n_cells: scanned.iter().map(|i| i.n_rows).sum(),
        inputs: scanned,
        n_genes,
        tile_size: options.write.tile_size,
        n_chunks: options.write.n_chunks,
        zstd_level: options.write.zstd_level,
        var_table: options.write_var,
        obs: obs_plan.as_ref().zip(options.obs.as_ref()).map(|(_, o)| PlanObs {
            names: o.names,
            tiles_per_file: o.tiles_per_file.max(1),
            source: options.shuffle.is_some(),
        }),
        metadata,
        append: None,
        shuffle: options.shuffle,
    }
    .with_id();
    let mut text = serde_json::to_vec_pretty(&plan)?;
    text.push(b'\n');
    out.put(PLAN_KEY, Bytes::from(text))?;
    Ok(plan)
}

/// The plan in `out`: of a conversion into it, or of an append to the
/// dataset in it (`plan --append`).
pub fn read_planned(out: &dyn Storage) -> anyhow::Result<Plan> {
    match super::append::planned_staging(out)? {
        Some(staging) => read_plan(&staging),
        None => read_plan(out),
    }
}

/// Reads the plan of the conversion into `out`.
pub(crate) fn read_plan(out: &dyn Storage) -> anyhow::Result<Plan> {
    let location = out.location(PLAN_KEY);
    let Some(bytes) = out.get(PLAN_KEY)? else {
        if out.get(format::MANIFEST_KEY)?.is_some() {
            bail!("{}: the dataset is complete (finalized); there is no plan left to run", out.location(""));
        }
        return Err(super::ConvertError::NoPlan { location, root: out.location("") }.into());
    };
    let plan: Plan = serde_json::from_slice(&bytes).with_context(|| format!("{location}: not a readable plan"))?;
    if plan.format != PLAN_FORMAT || plan.version != 1 {
        bail!("{location}: not a plan of this version (format {:?}, version {})", plan.format, plan.version);
    }
    if plan.tile_size == 0 || plan.first_cell() + plan.inputs.iter().map(|i| i.n_rows).sum::<u64>() != plan.n_cells {
        bail!("{location}: inconsistent plan (tile size or cell count)");
    }
    if plan.clone().with_id().id != plan.id {
        bail!("{location}: the plan was changed after it was written (its id does not match its content)");
    }
    Ok(plan)
}

/// Step 2: encodes shard `k` of `n` (0-based): its tiles, its obs shards, and
/// its result record, last. `out` is the output of [`plan()`], or a dataset
/// that `plan --append` planned an append to.
pub fn run_shard(
    out: &dyn Storage,
    k: usize,
    n: usize,
    options: &ShardOptions,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<ShardResult> {
    if n == 0 || k >= n {
        bail!("shard {k}/{n}: the index must be below the number of shards (0-based: 0..{n})");
    }
    match super::append::planned_staging(out)? {
        Some(staging) => shard_in(&staging, out, k, n, options, progress),
        None => shard_in(out, out, k, n, options, progress),
    }
}

/// Shard `k` of `n` of the plan in `out`, reading the gene tables (and what
/// an append keeps) from `base`: `out` itself, or the dataset whose append
/// `out` stages.
pub(crate) fn shard_in(
    out: &dyn Storage,
    base: &dyn Storage,
    k: usize,
    n: usize,
    options: &ShardOptions,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<ShardResult> {
    let plan = read_plan(out)?;
    let tiles = plan.shard_tiles(k, n);

    let order_location = base.location(format::GENE_ORDER_KEY);
    let order = match base.get(format::GENE_ORDER_KEY)? {
        Some(bytes) => npy::read_i32(&bytes).map_err(|e| anyhow::anyhow!("{order_location}: {e}"))?,
        // An append to a dataset stored in source order.
        None if plan.append.is_some() => (0..plan.n_genes as i32).collect(),
        None => bail!("{order_location}: missing"),
    };
    npy::check_permutation(&order, plan.n_genes).map_err(|e| anyhow::anyhow!("{order_location}: {e}"))?;
    let mut remap = vec![0u32; order.len()];
    for (j, &g) in order.iter().enumerate() {
        remap[g as usize] = j as u32;
    }
    // The genes in source order, to map each input's columns by name.
    let names_location = base.location(format::VAR_NAMES_KEY);
    let names_bytes = base.get(format::VAR_NAMES_KEY)?.with_context(|| format!("{names_location}: missing"))?;
    let mut stored_names = crate::dataset::parse_var_names(&names_bytes, plan.n_genes)
        .map_err(|e| anyhow::anyhow!("{names_location}: {e}"))?;
    let mut source_genes = vec![String::new(); order.len()];
    for (j, &g) in order.iter().enumerate() {
        source_genes[g as usize] = std::mem::take(&mut stored_names[j]);
    }

    let obs_plan = match &plan.obs {
        None => None,
        Some(o) => {
            let schema = crate::obs::read_schema(out)?.schema;
            let location = out.location(format::OBS_SCHEMA_KEY);
            Some(ObsPlan::from_schema(schema, o.names, o.source).map_err(|e| anyhow::anyhow!("{location}: {e}"))?)
        }
    };

    // An append's first shard starts with what it keeps of the dataset's
    // last tile and obs shard.
    let (tail, obs_prefix) = match &plan.append {
        Some(a) if !tiles.is_empty() && tiles.start == a.first_tile => {
            super::append::kept_rows(base, &plan, obs_plan.as_ref())?
        }
        Some(a) => {
            super::append::check_base(base, a)?;
            (None, Vec::new())
        }
        None => (None, Vec::new()),
    };
    let mut writer = DatasetWriter::starting_at(out, plan.write_options(), plan.n_genes as u32, tiles.start);
    let job = TileJob {
        inputs: &plan.inputs,
        first_cell: plan.first_cell(),
        tail: tail.as_ref(),
        obs_prefix: &obs_prefix,
        matrix: &plan.matrix,
        tiles: tiles.clone(),
        source_genes: &source_genes,
        remap: &remap,
        obs_plan: obs_plan.as_ref(),
        obs_tiles_per_file: plan.tiles_per_unit() as u64,
        write: plan.write_options(),
        max_in_flight: options.max_in_flight,
        shuffle: plan.shuffle,
        spill_dir: options.spill_dir.as_deref(),
    };
    let written = if tiles.is_empty() { None } else { Some(write_tiles(&job, &mut writer, progress)?) };
    let dropped_nonzeros = written.as_ref().map_or(0, |w| w.dropped_nonzeros);
    let shards = written.and_then(|w| w.obs_shards).unwrap_or_default();
    let result = ShardResult {
        format: RESULT_FORMAT.into(),
        plan: plan.id.clone(),
        shard: k,
        shards: n,
        first_tile: tiles.start,
        tile_cells: writer.tiles().iter().map(|t| t.cells).collect(),
        tile_nnz: writer.tiles().iter().map(|t| t.nnz).collect(),
        tile_bytes: writer.tiles().iter().map(|t| t.bytes).collect(),
        tile_sha256: writer.tile_sha256().to_vec(),
        first_obs_shard: plan.obs_shards_of(&tiles).start,
        obs_shard_bytes: shards.iter().map(|s| s.bytes).collect(),
        obs_shard_sha256: shards.iter().map(|s| s.sha256.clone()).collect(),
        dropped_nonzeros,
    };
    let mut text = serde_json::to_vec_pretty(&result)?;
    text.push(b'\n');
    out.put(&result_key(k, n), Bytes::from(text))?;
    Ok(result)
}

/// One tile or obs shard as the results have it: (size, sha256, nnz) and who wrote it.
type Entry = ((u64, String, u64), (usize, usize));

fn record(
    map: &mut BTreeMap<usize, Entry>,
    index: usize,
    value: (u64, String, u64),
    by: (usize, usize),
    what: &str,
) -> anyhow::Result<()> {
    if let Some((old, old_by)) = map.get(&index) {
        if *old != value {
            bail!(
                "shard results {}/{} and {}/{} disagree about {what} {index}; re-run one of them",
                old_by.0,
                old_by.1,
                by.0,
                by.1
            );
        }
        return Ok(());
    }
    map.insert(index, (value, by));
    Ok(())
}

/// Checks one result record against the plan; returns it parsed.
fn check_result(out: &dyn Storage, plan: &Plan, key: &str, k: usize, n: usize) -> anyhow::Result<ShardResult> {
    let location = out.location(key);
    let failed = |problem: String| super::ConvertError::ShardResult {
        location: location.clone(),
        problem,
        root: out.location(""),
        shard: k,
        shards: n,
    };
    let bytes = out.get(key)?.with_context(|| format!("{location}: vanished while finalizing"))?;
    let r: ShardResult = serde_json::from_slice(&bytes).map_err(|e| failed(format!("corrupt shard result ({e})")))?;
    let expected = plan.shard_tiles(k, n);
    let expected_obs = plan.obs_shards_of(&expected);
    let n_obs = if plan.obs.is_some() { expected_obs.len() } else { 0 };
    let problem = if r.format != RESULT_FORMAT {
        Some(format!("format {:?} is not {RESULT_FORMAT:?}", r.format))
    } else if r.plan != plan.id {
        Some(format!("it belongs to another plan ({}, not {})", r.plan, plan.id))
    } else if (r.shard, r.shards) != (k, n) {
        Some(format!("it says it is shard {}/{}", r.shard, r.shards))
    } else if r.first_tile != expected.start
        || [r.tile_cells.len(), r.tile_nnz.len(), r.tile_bytes.len(), r.tile_sha256.len()] != [expected.len(); 4]
    {
        Some(format!("it does not hold tiles {}..{}", expected.start, expected.end))
    } else if let Some(t) = expected.clone().find(|&t| r.tile_cells[t - expected.start] != plan.tile_cells(t)) {
        Some(format!("tile {t} has {} cells, the plan says {}", r.tile_cells[t - expected.start], plan.tile_cells(t)))
    } else if r.first_obs_shard != expected_obs.start
        || r.obs_shard_bytes.len() != n_obs
        || r.obs_shard_sha256.len() != n_obs
    {
        Some(format!("it does not hold obs shards {}..{}", expected_obs.start, expected_obs.start + n_obs))
    } else {
        None
    };
    if let Some(p) = problem {
        return Err(failed(format!("inconsistent shard result: {p}")).into());
    }
    Ok(r)
}

/// Step 3: checks every shard's result and writes manifest.json, last; then
/// removes the plan.
///
/// For an append (`out` is the dataset), the manifest is staged, and then
/// the staged files are moved into place and the manifest replaced; a
/// finalize that was interrupted then completes when run again.
pub fn finalize(out: &dyn Storage) -> anyhow::Result<ConvertSummary> {
    let started = std::time::Instant::now();
    let _lock = super::append::lock(out)?;
    if let Some(manifest) = super::append::finish_interrupted(out)? {
        return Ok(summary_of_manifest(&manifest, 0, started));
    }
    match super::append::planned_staging(out)? {
        Some(staging) => {
            let (summary, staged) = finalize_in(&staging, out)?;
            super::append::commit(out, &staged)?;
            super::append::clean_up(out)?;
            Ok(summary)
        }
        None => finalize_in(out, out).map(|(summary, _)| summary),
    }
}

/// What a finished dataset's manifest says of it.
fn summary_of_manifest(
    m: &crate::format::Manifest,
    dropped_nonzeros: u64,
    started: std::time::Instant,
) -> ConvertSummary {
    let nnz: u64 = m.tile_nnz.iter().sum();
    let tile_bytes: u64 = m.tile_bytes.iter().sum();
    ConvertSummary {
        n_cells: m.n_cells,
        n_genes: m.n_genes,
        n_tiles: m.n_tiles(),
        nnz,
        tile_bytes,
        bytes_per_nonzero: if nnz == 0 { 0.0 } else { tile_bytes as f64 / nnz as f64 },
        dropped_nonzeros,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Finalize's checks and manifest, in `out` (which holds the plan and the
/// shards' results), with `base` the dataset an append extends (else `out`).
/// Returns the manifest written.
pub(crate) fn finalize_in(out: &dyn Storage, base: &dyn Storage) -> anyhow::Result<(ConvertSummary, Bytes)> {
    let started = std::time::Instant::now();
    let plan = read_plan(out)?;
    let n_tiles = plan.n_tiles();
    let first_tile = plan.first_tile();
    let written_obs = plan.obs_shards_of(&(first_tile..n_tiles));
    let n_obs_shards = if plan.obs.is_some() { written_obs.end } else { 0 };
    let base_manifest = match &plan.append {
        Some(a) => Some(super::append::check_base(base, a)?),
        None => None,
    };

    let mut tiles: BTreeMap<usize, Entry> = BTreeMap::new();
    let mut obs: BTreeMap<usize, Entry> = BTreeMap::new();
    let mut seen: Vec<(usize, usize)> = Vec::new();
    // Per first tile, so that a shard whose result appears twice (as K/N and
    // as another split) is counted once.
    let mut dropped: BTreeMap<usize, u64> = BTreeMap::new();
    for key in out.list(RESULTS_PREFIX)? {
        let Some((k, n)) = parse_result_key(&key).filter(|(k, n)| k < n) else {
            bail!("{}: not a shard result name (shard-K-of-N.json)", out.location(&key));
        };
        let r = check_result(out, &plan, &key, k, n)?;
        for (i, t) in (r.first_tile..).zip(0..r.tile_cells.len()) {
            record(&mut tiles, i, (r.tile_bytes[t], r.tile_sha256[t].clone(), r.tile_nnz[t]), (k, n), "tile")?;
        }
        for (i, s) in (r.first_obs_shard..).zip(0..r.obs_shard_bytes.len()) {
            record(&mut obs, i, (r.obs_shard_bytes[s], r.obs_shard_sha256[s].clone(), 0), (k, n), "obs shard")?;
        }
        dropped.insert(r.first_tile, r.dropped_nonzeros);
        seen.push((k, n));
    }
    let dropped_nonzeros: u64 = dropped.values().sum();

    let missing_tiles: Vec<usize> = (first_tile..n_tiles).filter(|t| !tiles.contains_key(t)).collect();
    if !missing_tiles.is_empty() {
        let mut counts: Vec<usize> = seen.iter().map(|s| s.1).collect();
        counts.sort_unstable();
        counts.dedup();
        let which = match counts.as_slice() {
            [n] => {
                let missing: Vec<String> =
                    (0..*n).filter(|k| !seen.contains(&(*k, *n))).map(|k| format!("{k}/{n}")).collect();
                format!("the results of shards {} are missing", missing.join(", "))
            }
            [] => "no shard has finished".to_string(),
            _ => format!("{} tiles are not covered by any result", missing_tiles.len()),
        };
        bail!(
            "{}: cannot finalize: {which} (first missing tile: {}); run those shards, then finalize again",
            out.location(""),
            missing_tiles[0]
        );
    }

    // The objects the results describe must be there, with their sizes.
    let stored: BTreeMap<String, u64> = out.list_sizes("tiles")?.into_iter().chain(out.list_sizes("obs")?).collect();
    let check_size = |key: String, bytes: u64, by: (usize, usize)| -> anyhow::Result<()> {
        match stored.get(&key) {
            Some(&size) if size == bytes => Ok(()),
            found => bail!(
                "{}: {} (shard {}/{} recorded {bytes} bytes); re-run that shard",
                out.location(&key),
                found.map_or("missing".to_string(), |s| format!("{s} bytes")),
                by.0,
                by.1
            ),
        }
    };
    for (&t, ((bytes, _, _), by)) in &tiles {
        check_size(format::tile_key(t), *bytes, *by)?;
    }
    for s in written_obs.start.min(n_obs_shards)..n_obs_shards {
        let Some(((bytes, _, _), by)) = obs.get(&s) else {
            bail!("{}: cannot finalize: no result holds obs shard {s}", out.location(""));
        };
        check_size(format::obs_shard_key(s), *bytes, *by)?;
    }

    // The kept tiles as the dataset's manifest has them, then the new ones.
    let kept = base_manifest.iter().flat_map(|m| {
        (0..first_tile).map(|t| TileRecord { cells: m.tile_cells[t], nnz: m.tile_nnz[t], bytes: m.tile_bytes[t] })
    });
    let records: Vec<TileRecord> = kept
        .chain(tiles.iter().map(|(&t, ((bytes, _, nnz), _))| TileRecord {
            cells: plan.tile_cells(t),
            nnz: *nnz,
            bytes: *bytes,
        }))
        .collect();
    let flags = match &base_manifest {
        Some(m) => {
            ManifestFlags { gene_order: m.has_gene_order, var_names: m.has_var_names, var_table: m.has_var_table }
        }
        None => ManifestFlags { gene_order: true, var_names: true, var_table: plan.var_table },
    };
    let mut metadata = plan.metadata.clone();
    if let (None, Some(Value::Object(convert))) = (&plan.append, metadata.get_mut("convert")) {
        if convert.get("genes").is_some_and(|g| g == "intersection") {
            convert.insert("dropped_nonzeros".into(), json!(dropped_nonzeros));
        }
    }
    let mut m = manifest_of(plan.write_options(), plan.n_genes as u32, &records, flags, metadata);
    if let Some(o) = &plan.obs {
        let text = crate::obs::read_schema(out)?.text;
        let (mut sizes, mut sha256) = match &plan.append {
            Some(a) => (a.kept_obs_bytes.clone(), a.kept_obs_sha256.clone()),
            None => (Vec::new(), Vec::new()),
        };
        for s in sizes.len()..n_obs_shards {
            sizes.push(obs[&s].0 .0);
            sha256.push(obs[&s].0 .1.clone());
        }
        m.has_obs = true;
        m.obs_tiles_per_file = Some(o.tiles_per_file);
        m.obs_shard_bytes = Some(sizes);
        m.obs_fingerprint = Some(fingerprint::obs_fingerprint(&text, &m.tile_cells, &sha256));
        m.obs_shard_sha256 = Some(sha256);
        // An append stages the schema for its shards; where it did not
        // change, the dataset's stays as it is.
        if plan.append.is_some() && crate::obs::read_schema(base)?.text == text {
            out.delete(format::OBS_SCHEMA_KEY)?;
        }
    }
    // Temporary files of killed shard runs (their re-runs wrote the objects).
    for key in stored.keys().filter(|k| k.contains("/.deltacells-")) {
        out.delete(key)?;
    }
    if let Some(problem) = m.check().into_iter().next() {
        bail!("{}: the manifest would be inconsistent ({problem}); nothing was changed", out.location(""));
    }
    let text = Bytes::from(m.to_json());
    out.put(format::MANIFEST_KEY, text.clone())?;
    // The dataset is complete (an append's is staged); the plan's files are
    // no longer needed.
    for key in out.list(".plan")? {
        out.delete(&key)?;
    }
    Ok((summary_of_manifest(&m, dropped_nonzeros, started), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(n_cells: u64, tile_size: u64, obs_tiles: Option<u64>) -> Plan {
        Plan {
            format: PLAN_FORMAT.into(),
            version: 1,
            id: String::new(),
            matrix: "X".into(),
            inputs: vec![Input { path: "a.h5ad".into(), n_rows: n_cells, bytes: 0, etag: None, stored_tile: None }],
            n_cells,
            n_genes: 10,
            tile_size,
            n_chunks: 8,
            zstd_level: 19,
            var_table: true,
            obs: obs_tiles.map(|t| PlanObs { names: true, tiles_per_file: t, source: false }),
            metadata: Map::new(),
            append: None,
            shuffle: None,
        }
    }

    #[test]
    fn shards_cover_every_tile_once_in_whole_obs_shards() {
        for (n_cells, tile_size, obs) in [(95, 10, Some(3)), (100, 10, None), (1, 10, Some(1000)), (0, 10, None)] {
            let p = plan(n_cells, tile_size, obs);
            for n in 1..12 {
                let mut next = 0;
                for k in 0..n {
                    let r = p.shard_tiles(k, n);
                    assert_eq!(r.start, next, "{n_cells} cells, shard {k}/{n}");
                    assert!(r.start.is_multiple_of(p.tiles_per_unit()));
                    next = r.end;
                }
                assert_eq!(next, p.n_tiles());
            }
        }
        let p = plan(95, 10, Some(3)); // 10 tiles in 4 obs shards
        assert_eq!((0..3).map(|k| p.shard_tiles(k, 3)).collect::<Vec<_>>(), vec![0..3, 3..6, 6..10]);
    }

    #[test]
    fn result_keys_round_trip() {
        assert_eq!(parse_result_key(&result_key(3, 7)), Some((3, 7)));
        assert_eq!(parse_result_key(".plan/results/other.json"), None);
    }

    #[test]
    fn the_plan_id_covers_its_content() {
        let a = plan(95, 10, Some(3)).with_id();
        let b = plan(96, 10, Some(3)).with_id();
        assert_ne!(a.id, b.id);
        assert_eq!(a.clone().with_id().id, a.id);
    }
}
