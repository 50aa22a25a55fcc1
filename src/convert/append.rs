//! Appending cells to a dataset: the inputs' cells go after its last cell,
//! with its gene order, tile layout, encoder settings and obs schema, in time
//! proportional to the new cells.
//!
//! An append is a conversion whose first tile is the dataset's last one when
//! that is not full: its cells are decoded and come first, as if they were an
//! input (encoding is a function of the rows, so the tile's old cells encode
//! as they did). Obs follows the merge rules of convert, the stored schema
//! taking the place of the first input; a stored column whose type must change
//! is restated in every obs shard. The result is what converting the original
//! inputs and the new ones in one run would have written.
//!
//! Nothing of the old dataset is lost at any moment:
//! 1. `.append/append.json` records the append (its inputs, the manifest it
//!    extends); every new or rewritten file is written under `.append/`, and
//!    the new manifest last, as `.append/manifest.json`. Until then the old
//!    dataset is complete and untouched.
//! 2. Commit: manifest.json is removed (the dataset is now incomplete, and
//!    says an append was interrupted), the staged files are moved into place,
//!    and the staged manifest is written as manifest.json.
//! 3. `.append/` is removed, its record first.
//!
//! A run that finds `.append/` picks up where the last one stopped: it
//! completes a commit that began (everything it needs is staged), and redoes
//! a staging that did not finish when given the same inputs (the record keeps
//! the time, so the bytes are the same).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::obs_merge::{ObsPlan, Restated, StoredObs};
use super::obs_shards::{ShardRecord, ShardWriter};
use super::{scan_inputs, write_tiles, ConvertProgress, GeneSet, GivenOrder, Input, ObsOptions, StoredTail, TileJob};
use crate::dataset::{read_manifest, Dataset};
use crate::format::{self, fingerprint, Manifest};
use crate::storage::{Storage, Within};
use crate::writer::{DatasetWriter, WriteOptions};

/// Where an append stages its files, in the dataset.
pub(crate) const APPEND_PREFIX: &str = ".append";
/// The record of the append in progress.
pub(crate) const RECORD_KEY: &str = crate::dataset::APPEND_KEY;
/// The staged manifest, within [`APPEND_PREFIX`]: its presence means every
/// staged file is complete.
const STAGED_MANIFEST: &str = "manifest.json";
const RECORD_FORMAT: &str = "deltacells-append";

/// What an append is, as `.append/append.json` records it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct AppendRecord {
    format: String,
    version: u32,
    /// SHA-256 of the manifest.json appended to.
    base: String,
    inputs: Vec<Input>,
    matrix: String,
    /// When the append began (RFC 3339), as the manifest records it.
    time: String,
}

impl AppendRecord {
    /// Whether `inputs` (the same files, by their sizes too) and `matrix`
    /// are this append's.
    fn is_of(&self, inputs: &[PathBuf], matrix: Option<&str>) -> bool {
        let file = |p: &PathBuf| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        let files: Vec<(PathBuf, u64)> =
            self.inputs.iter().filter(|i| i.stored_tile.is_none()).map(|i| (file(&i.path), i.bytes)).collect();
        let asked: Vec<(PathBuf, u64)> =
            inputs.iter().map(|p| (file(p), std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))).collect();
        files == asked && matrix.is_none_or(|m| m == self.matrix)
    }

    fn input_list(&self) -> String {
        let names: Vec<String> =
            self.inputs.iter().filter(|i| i.stored_tile.is_none()).map(|i| i.path.display().to_string()).collect();
        names.join(", ")
    }
}

/// How to append.
#[derive(Clone, Debug)]
pub struct AppendOptions {
    /// The inputs' matrix; None for the one the dataset was converted from.
    pub matrix: Option<String>,
    /// Tiles read but not yet written, at most.
    pub max_in_flight: usize,
}

impl Default for AppendOptions {
    fn default() -> Self {
        AppendOptions { matrix: None, max_in_flight: super::MAX_IN_FLIGHT }
    }
}

/// What an append did.
#[derive(Clone, Debug, Serialize)]
pub struct AppendSummary {
    /// "appended", "completed" (an interrupted append, finished), or
    /// "already appended" (these inputs were the last append, which had
    /// finished).
    pub outcome: String,
    pub inputs: Vec<PathBuf>,
    pub cells_before: u64,
    pub cells_added: u64,
    pub n_cells: u64,
    /// The dataset's last tile, rewritten with the first new cells (when it was not full).
    pub tile_rewritten: Option<usize>,
    pub tiles_added: usize,
    /// Bytes of the tiles written (the rewritten one included).
    pub tile_bytes_written: u64,
    /// Obs shards written (rewritten or new).
    pub obs_shards_written: usize,
    /// Obs columns whose stored type changed (every obs shard was rewritten).
    pub obs_restated: Vec<Restated>,
    pub seconds: f64,
}

/// An append's leftovers in a dataset, and what they mean.
enum Leftover {
    /// None.
    Clean,
    /// Staging began but did not finish: the old dataset is intact.
    Staging(AppendRecord),
    /// Everything is staged; the commit has not begun (the old dataset is intact).
    Staged(AppendRecord, Bytes),
    /// The commit began: the dataset is incomplete until it is finished.
    Committing(AppendRecord, Bytes),
    /// The append finished but its staging folder is still there (or the
    /// dataset was replaced since): only cleaning up is left.
    Finished(Option<AppendRecord>),
}

fn leftover(ds: &dyn Storage) -> anyhow::Result<Leftover> {
    let staging = Within::new(ds, APPEND_PREFIX);
    let Some(record_bytes) = ds.get(RECORD_KEY)? else {
        // Files without a record: a cleanup that was interrupted.
        let stray = ds.can_list() && !ds.list(APPEND_PREFIX)?.is_empty();
        return Ok(if stray { Leftover::Finished(None) } else { Leftover::Clean });
    };
    let location = ds.location(RECORD_KEY);
    let record: AppendRecord = serde_json::from_slice(&record_bytes)
        .ok()
        .filter(|r: &AppendRecord| r.format == RECORD_FORMAT && r.version == 1)
        .with_context(|| format!("{location}: not the record of an append of this version"))?;
    let current = ds.get(format::MANIFEST_KEY)?;
    let staged = staging.get(STAGED_MANIFEST)?;
    Ok(match (current, staged) {
        (None, Some(staged)) => Leftover::Committing(record, staged),
        (None, None) => bail!(
            "{}: incomplete dataset: an append into it was interrupted and its staged manifest is missing ({})",
            ds.location(""),
            staging.location(STAGED_MANIFEST)
        ),
        (Some(current), Some(staged)) if current == staged => Leftover::Finished(Some(record)),
        (Some(current), staged) if fingerprint::sha256_hex(&current) == record.base => match staged {
            Some(staged) => Leftover::Staged(record, staged),
            None => Leftover::Staging(record),
        },
        // The dataset is not the one the append began from.
        (Some(_), _) => Leftover::Finished(None),
    })
}

/// Removes `.append/`, its record first (so that what is left is never taken
/// for an append in progress).
fn clean_up(ds: &dyn Storage) -> anyhow::Result<()> {
    ds.delete(RECORD_KEY)?;
    for key in ds.list(APPEND_PREFIX)? {
        ds.delete(&key)?;
    }
    Ok(())
}

/// Appends the cells of `inputs` to the dataset in `ds`.
///
/// Refuses, before writing anything the dataset reads, inputs of other genes
/// (by name: their order may differ), other obs columns or kinds, and a
/// dataset that is incomplete or fails its manifest's checks. When `ds` holds
/// an interrupted append, completes it if it is of these inputs (else refuses,
/// naming them, while its commit is under way, or discards its staging).
pub fn append(
    ds: Arc<dyn Storage>,
    inputs: &[PathBuf],
    options: &AppendOptions,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<AppendSummary> {
    let started = Instant::now();
    if inputs.is_empty() {
        bail!("no input files");
    }
    let mut time = None;
    match leftover(ds.as_ref())? {
        Leftover::Clean => {}
        Leftover::Committing(record, staged) => {
            if !record.is_of(inputs, options.matrix.as_deref()) {
                return Err(AppendError::Interrupted { location: ds.location(""), inputs: record.input_list() }.into());
            }
            return finish(ds.as_ref(), &record, &staged, started, "completed");
        }
        Leftover::Staged(record, staged) if record.is_of(inputs, options.matrix.as_deref()) => {
            return finish(ds.as_ref(), &record, &staged, started, "completed");
        }
        Leftover::Finished(Some(record)) if record.is_of(inputs, options.matrix.as_deref()) => {
            clean_up(ds.as_ref())?;
            let manifest = read_manifest(ds.as_ref())?;
            return Ok(summary_of(&record, &manifest, "already appended", started));
        }
        Leftover::Staging(record) if record.is_of(inputs, options.matrix.as_deref()) => {
            time = Some(record.time.clone());
            clean_up(ds.as_ref())?;
        }
        Leftover::Staging(record) | Leftover::Staged(record, _) => {
            progress.note(&format!(
                "discarding the unfinished append of {} (the dataset is as it was before it)",
                record.input_list()
            ));
            clean_up(ds.as_ref())?;
        }
        Leftover::Finished(_) => clean_up(ds.as_ref())?,
    }
    let staged = stage(ds.clone(), inputs, options, time, progress);
    let (record, staged, mut summary) = match staged {
        Ok(done) => done,
        Err(e) => {
            // The dataset was not touched: leave it as it was.
            let _ = clean_up(ds.as_ref());
            return Err(e);
        }
    };
    commit(ds.as_ref(), &staged)?;
    clean_up(ds.as_ref())?;
    drop(record);
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// Completes the append whose files `ds` holds under `.append/` (one that was
/// interrupted), from its record: the commit, when everything is staged, or
/// the whole append again from its recorded inputs.
pub fn resume(
    ds: Arc<dyn Storage>,
    options: &AppendOptions,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<AppendSummary> {
    let started = Instant::now();
    match leftover(ds.as_ref())? {
        Leftover::Clean => bail!("{}: no interrupted append to resume (no {RECORD_KEY})", ds.location("")),
        Leftover::Committing(record, staged) | Leftover::Staged(record, staged) => {
            finish(ds.as_ref(), &record, &staged, started, "completed")
        }
        Leftover::Finished(record) => {
            clean_up(ds.as_ref())?;
            let manifest = read_manifest(ds.as_ref())?;
            match record {
                Some(record) => Ok(summary_of(&record, &manifest, "already appended", started)),
                None => bail!("{}: no interrupted append to resume (its leftovers were removed)", ds.location("")),
            }
        }
        Leftover::Staging(record) => {
            let inputs: Vec<PathBuf> = record.inputs.iter().map(|i| i.path.clone()).collect();
            let options = AppendOptions { matrix: Some(record.matrix.clone()), ..options.clone() };
            let mut summary = append(ds, &inputs, &options, progress)?;
            summary.outcome = "completed".into();
            Ok(summary)
        }
    }
}

/// Why an append cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error(
        "{location}: incomplete dataset: an append of {inputs} into it was interrupted while it replaced files; \
         it must be completed first"
    )]
    Interrupted { location: String, inputs: String },
}

/// Commits what is staged, then cleans up.
fn finish(
    ds: &dyn Storage,
    record: &AppendRecord,
    staged: &Bytes,
    started: Instant,
    outcome: &str,
) -> anyhow::Result<AppendSummary> {
    let manifest = Manifest::parse_checked(staged)
        .map_err(|e| anyhow::anyhow!("{}: {e}", Within::new(ds, APPEND_PREFIX).location(STAGED_MANIFEST)))?;
    commit(ds, staged)?;
    clean_up(ds)?;
    Ok(summary_of(record, &manifest, outcome, started))
}

/// What the manifest after `record`'s append says of it.
fn summary_of(record: &AppendRecord, after: &Manifest, outcome: &str, started: Instant) -> AppendSummary {
    let added: u64 = record.inputs.iter().filter(|i| i.stored_tile.is_none()).map(|i| i.n_rows).sum();
    AppendSummary {
        outcome: outcome.into(),
        inputs: record.inputs.iter().filter(|i| i.stored_tile.is_none()).map(|i| i.path.clone()).collect(),
        cells_before: after.n_cells - added,
        cells_added: added,
        n_cells: after.n_cells,
        tile_rewritten: record.inputs.iter().find_map(|i| i.stored_tile),
        tiles_added: 0,
        tile_bytes_written: 0,
        obs_shards_written: 0,
        obs_restated: Vec::new(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Step 2: removes the manifest, moves every staged file into place, writes
/// the staged manifest. Running it again after an interruption completes it.
fn commit(ds: &dyn Storage, staged_manifest: &Bytes) -> anyhow::Result<()> {
    // The crash tests stop the process here for real (SIGABRT) after this many
    // moves (-1: before the manifest is removed, -2: before the new one is
    // written): a kill cannot be timed into a commit of a few renames.
    let abort_after: Option<i64> =
        std::env::var("DELTACELLS_TEST_ABORT_COMMIT_AFTER").ok().and_then(|v| v.parse().ok());
    let stop_here = |moved: i64| {
        if abort_after == Some(moved) {
            std::process::abort();
        }
    };
    let mut moved = 0;
    stop_here(-1);
    ds.delete(format::MANIFEST_KEY)?;
    stop_here(moved);
    let skip = [RECORD_KEY.to_string(), format!("{APPEND_PREFIX}/{STAGED_MANIFEST}")];
    for key in ds.list(APPEND_PREFIX)? {
        if skip.contains(&key) {
            continue;
        }
        // A temporary file of a write that was killed is not a staged file.
        if key.contains("/.deltacells-") {
            ds.delete(&key)?;
            continue;
        }
        let target = key.strip_prefix(APPEND_PREFIX).and_then(|k| k.strip_prefix('/')).unwrap_or(&key);
        ds.rename(&key, target)?;
        moved += 1;
        stop_here(moved);
    }
    stop_here(-2);
    ds.put(format::MANIFEST_KEY, staged_manifest.clone())?;
    Ok(())
}

/// What convert recorded of itself in the manifest, with what appends added.
struct Recorded {
    matrix: String,
    obs: ObsOptions,
    categories_as_strings: Vec<String>,
}

fn recorded(manifest: &Manifest, schema: Option<&format::obs_schema::ObsSchema>) -> Recorded {
    let convert = manifest.metadata.get("convert");
    let obs = convert.and_then(|c| c.get("obs"));
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array).into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect()
    };
    let defaults = ObsOptions::default();
    let mut categories_as_strings = strings(obs.and_then(|o| o.get("categories_as_strings")));
    for a in manifest.metadata.get("appends").and_then(Value::as_array).into_iter().flatten() {
        categories_as_strings.extend(strings(a.get("categories_as_strings")));
    }
    Recorded {
        matrix: convert.and_then(|c| c.get("matrix")).and_then(Value::as_str).unwrap_or("X").to_string(),
        obs: ObsOptions {
            names: obs
                .and_then(|o| o.get("names"))
                .and_then(Value::as_bool)
                .unwrap_or_else(|| schema.and_then(|s| s.columns.first()).is_some_and(|c| c.name == "obs_names")),
            exclude: strings(obs.and_then(|o| o.get("exclude"))),
            max_categories: obs
                .and_then(|o| o.get("max_categories"))
                .and_then(Value::as_u64)
                .map_or(defaults.max_categories, |n| n as usize),
            tiles_per_file: manifest.obs_tiles_per_file.unwrap_or(defaults.tiles_per_file),
        },
        categories_as_strings,
    }
}

/// The time an append records: now, or `SOURCE_DATE_EPOCH` when set (the
/// convention of reproducible builds; tests use it).
fn now() -> String {
    let at = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or_else(std::time::SystemTime::now, |s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
    humantime::format_rfc3339_seconds(at).to_string()
}

/// Step 1: writes everything the append changes under `.append/`, the new
/// manifest last.
fn stage(
    ds: Arc<dyn Storage>,
    inputs: &[PathBuf],
    options: &AppendOptions,
    time: Option<String>,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<(AppendRecord, Bytes, AppendSummary)> {
    let root = ds.location("");
    let base_bytes = ds.get(format::MANIFEST_KEY)?.ok_or_else(|| crate::dataset::no_manifest(ds.as_ref()))?;
    let dataset = Dataset::from_storage(ds.clone())?;
    let manifest = dataset.manifest().clone();
    let stored_schema = if manifest.has_obs { Some(crate::obs::read_schema(ds.as_ref())?) } else { None };
    let recorded = recorded(&manifest, stored_schema.as_ref().map(|s| &s.schema));
    let matrix = options.matrix.clone().unwrap_or_else(|| recorded.matrix.clone());
    let n_genes = manifest.n_genes as u32;

    // Genes: matched by name to the stored columns.
    let Some(var_names) = dataset.var_names()? else {
        bail!("{root}: has no var_names.txt, so the inputs' genes cannot be matched to its columns by name");
    };
    let order: Vec<u32> = match dataset.gene_order()? {
        Some(order) => order.into_iter().map(|g| g as u32).collect(),
        None => (0..n_genes).collect(),
    };
    let mut source_genes = vec![String::new(); order.len()];
    let mut remap = vec![0u32; order.len()];
    for (j, &g) in order.iter().enumerate() {
        source_genes[g as usize] = var_names[j].clone();
        remap[g as usize] = j as u32;
    }
    let (scanned, input_genes) = scan_inputs(inputs, &matrix, GeneSet::Same, progress)?;
    GivenOrder::Names { names: var_names, source: format!("{root} (var_names.txt)") }
        .resolve(&input_genes, &scanned[0].path)?;

    // Obs: the stored schema extended by the inputs'.
    let obs = match &stored_schema {
        Some(stored) => {
            progress.phase("reading obs", 0);
            let paths: Vec<&std::path::Path> = scanned.iter().map(|i| i.path.as_path()).collect();
            let stored_obs = StoredObs {
                location: &root,
                schema: &stored.schema,
                categories_as_strings: &recorded.categories_as_strings,
            };
            Some(ObsPlan::extend(&stored_obs, &paths, &matrix, &recorded.obs)?)
        }
        None => None,
    };
    let restated = obs.as_ref().map(|(_, r)| r.clone()).unwrap_or_default();
    for r in &restated {
        progress.note(&format!(
            "obs column {:?} changes from {} to {}: every obs shard is rewritten",
            r.column, r.was, r.now
        ));
    }
    let obs_plan = obs.as_ref().map(|(p, _)| p);

    // The layout: the tiles kept, the last one when not full rewritten.
    let n_tiles = manifest.n_tiles();
    let tile_size = manifest.tile_size;
    let tail_tile = (n_tiles > 0 && manifest.tile_cells[n_tiles - 1] < tile_size).then(|| n_tiles - 1);
    let first_tile = tail_tile.unwrap_or(n_tiles);
    let kept_cells: u64 = manifest.tile_cells[..first_tile].iter().sum();
    let per_file = recorded.obs.tiles_per_file.max(1) as usize;
    let first_shard = first_tile / per_file;
    let old_shards = manifest.obs_shard_bytes.as_ref().map_or(0, Vec::len);

    let record = AppendRecord {
        format: RECORD_FORMAT.into(),
        version: 1,
        base: fingerprint::sha256_hex(&base_bytes),
        inputs: tail_tile
            .map(|t| Input {
                path: ds.location(&format::tile_key(t)).into(),
                n_rows: manifest.tile_cells[t],
                bytes: 0,
                stored_tile: Some(t),
            })
            .into_iter()
            .chain(scanned.iter().cloned())
            .collect(),
        matrix: matrix.clone(),
        time: time.unwrap_or_else(now),
    };
    let mut text = serde_json::to_vec_pretty(&record)?;
    text.push(b'\n');
    ds.put(RECORD_KEY, Bytes::from(text))?;
    let staging = Within::new(ds.as_ref(), APPEND_PREFIX);

    // Obs rows kept: those of the first shard's tiles before `first_tile`
    // (and the tail's), restated into the new schema; every other shard too
    // when a column's type changes.
    let shard_rows = |s: usize| -> anyhow::Result<Vec<arrow_array::RecordBatch>> {
        let (plan, stored) = (obs_plan.expect("obs"), stored_schema.as_ref().expect("obs"));
        let key = format::obs_shard_key(s);
        let location = ds.location(&key);
        let bytes = ds.get(&key)?.with_context(|| format!("{location}: missing (the manifest lists it)"))?;
        let groups = crate::obs::row_groups(bytes).map_err(|e| anyhow::anyhow!("{location}: {e}"))?;
        groups.iter().map(|g| plan.restate(&stored.schema, g).map_err(|e| anyhow::anyhow!("{location}: {e}"))).collect()
    };
    let mut obs_records: Vec<ShardRecord> = Vec::new();
    let mut obs_prefix = Vec::new();
    let mut tail_obs = None;
    if let Some(plan) = obs_plan {
        let kept = manifest
            .obs_shard_bytes
            .as_deref()
            .unwrap_or_default()
            .iter()
            .zip(manifest.obs_shard_sha256.as_deref().unwrap_or_default());
        if restated.is_empty() {
            obs_records.extend(kept.take(first_shard).map(|(&bytes, sha)| ShardRecord { bytes, sha256: sha.clone() }));
        } else {
            progress.phase("rewriting obs", kept_cells);
            for s in 0..first_shard {
                let mut writer = ShardWriter::starting_at(plan.arrow_schema().clone(), per_file as u64, s);
                let rows = shard_rows(s)?;
                for batch in &rows {
                    writer.add_tile(batch, &staging)?;
                    progress.advance(batch.num_rows() as u64);
                }
                obs_records.extend(writer.finish(&staging)?);
            }
        }
        if first_shard < old_shards {
            let mut rows = shard_rows(first_shard)?;
            let in_shard = first_tile - first_shard * per_file;
            if tail_tile.is_some() {
                tail_obs = rows.get(in_shard).cloned();
            }
            rows.truncate(in_shard);
            obs_prefix = rows;
        }
    }
    let tail = match tail_tile {
        Some(t) => Some(StoredTail { rows: dataset.read_tile(t)?, obs: tail_obs }),
        None => None,
    };
    if obs_plan.is_some() && tail.as_ref().is_some_and(|t| t.obs.is_none()) {
        bail!("{root}: obs shard {first_shard} has no row group for tile {first_tile}");
    }

    // The tiles.
    let write =
        WriteOptions { tile_size, n_chunks: manifest.n_chunks as usize, zstd_level: manifest.zstd_level as i32 };
    let n_cells = kept_cells + record.inputs.iter().map(|i| i.n_rows).sum::<u64>();
    let new_n_tiles = n_cells.div_ceil(tile_size) as usize;
    let mut writer = DatasetWriter::starting_at(&staging, write, n_genes, first_tile);
    let job = TileJob {
        inputs: &record.inputs,
        first_cell: kept_cells,
        tail: tail.as_ref(),
        obs_prefix: &obs_prefix,
        matrix: &matrix,
        tiles: first_tile..new_n_tiles,
        source_genes: &source_genes,
        remap: &remap,
        obs_plan,
        obs_tiles_per_file: per_file as u64,
        write,
        max_in_flight: options.max_in_flight,
    };
    let written = write_tiles(&job, &mut writer, progress)?;
    let new_obs = written.obs_shards.unwrap_or_default();
    let obs_shards_written = new_obs.len() + if restated.is_empty() { 0 } else { first_shard };
    obs_records.extend(new_obs);

    // The manifest: the kept tiles' records, then the new ones.
    let mut m = manifest.clone();
    m.tile_cells.truncate(first_tile);
    m.tile_nnz.truncate(first_tile);
    m.tile_bytes.truncate(first_tile);
    for t in writer.tiles() {
        m.tile_cells.push(t.cells);
        m.tile_nnz.push(t.nnz);
        m.tile_bytes.push(t.bytes);
    }
    m.n_cells = m.tile_cells.iter().sum();
    if let (Some(plan), Some(stored)) = (obs_plan, &stored_schema) {
        let text = plan.schema_text();
        if text != stored.text {
            staging.put(format::OBS_SCHEMA_KEY, Bytes::from(text.clone()))?;
        }
        let sha256: Vec<String> = obs_records.iter().map(|r| r.sha256.clone()).collect();
        m.obs_shard_bytes = Some(obs_records.iter().map(|r| r.bytes).collect());
        m.obs_fingerprint = Some(fingerprint::obs_fingerprint(&text, &m.tile_cells, &sha256));
        m.obs_shard_sha256 = Some(sha256);
    }
    let mut entry = Map::new();
    entry.insert("inputs".into(), json!(scanned.iter().map(|i| i.path.display().to_string()).collect::<Vec<_>>()));
    entry.insert("matrix".into(), json!(matrix));
    entry.insert("cells".into(), json!(scanned.iter().map(|i| i.n_rows).sum::<u64>()));
    entry.insert("time".into(), json!(record.time));
    entry.insert("generator".into(), json!(format!("deltacells {}", env!("CARGO_PKG_VERSION"))));
    let new_as_strings: Vec<&String> = obs_plan
        .map(|p| p.categories_as_strings())
        .unwrap_or_default()
        .iter()
        .filter(|c| !recorded.categories_as_strings.contains(c))
        .collect();
    if !new_as_strings.is_empty() {
        entry.insert("categories_as_strings".into(), json!(new_as_strings));
    }
    match m.metadata.get_mut("appends") {
        Some(Value::Array(list)) => list.push(Value::Object(entry)),
        _ => {
            m.metadata.insert("appends".into(), json!([entry]));
        }
    }
    if let Some(problem) = m.check().into_iter().next() {
        bail!("{root}: the appended manifest would be inconsistent ({problem}); nothing was changed");
    }
    let staged = Bytes::from(m.to_json());
    staging.put(STAGED_MANIFEST, staged.clone())?;

    let summary = AppendSummary {
        outcome: "appended".into(),
        inputs: scanned.iter().map(|i| i.path.clone()).collect(),
        cells_before: manifest.n_cells,
        cells_added: m.n_cells - manifest.n_cells,
        n_cells: m.n_cells,
        tile_rewritten: tail_tile,
        tiles_added: new_n_tiles - n_tiles,
        tile_bytes_written: writer.tiles().iter().map(|t| t.bytes).sum(),
        obs_shards_written,
        obs_restated: restated,
        seconds: 0.0,
    };
    Ok((record, staged, summary))
}
