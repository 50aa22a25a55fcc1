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
//! Nothing of the old dataset is lost at any moment: it is staged, then
//! committed (see `convert/staging.rs`).
//!
//! A run that finds `.append/` picks up where the last one stopped: it
//! completes a commit that began (everything it needs is staged), and redoes
//! a staging that did not finish when given the same inputs (the record keeps
//! the time, so the bytes are the same).

use super::error::{ConvertError, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::base::{recorded, StoredObsRows};
use super::finalize::finalize_in;
use super::job::{AppendPlan, Plan, PlanObs, PLAN_FORMAT, PLAN_KEY};
use super::obs_merge::{ObsPlan, Restated, StoredObs};
use super::obs_shards::{ShardRecord, ShardWriter};
use super::plan::Then;
use super::shard::shard_in;
use super::staging::{
    clean_up, commit, commit_staged, leftover, lock, new_inputs, now, AppendError, AppendRecord, Leftover,
    APPEND_PREFIX, RECORD_FORMAT, RECORD_KEY,
};
use super::{scan_inputs, ConvertProgress, GeneSet, GivenOrder, Input};
use crate::dataset::{read_manifest, Dataset};
use crate::format::{self, fingerprint, Manifest};
use crate::storage::{Storage, Within};

/// How to append.
#[derive(Clone, Debug)]
pub struct AppendOptions {
    /// The inputs' matrix; None for the one the dataset was converted from.
    pub matrix: Option<String>,
    /// Tiles read but not yet written, at most.
    pub max_in_flight: usize,
    /// Store the appended cells in an order fixed by this seed (after the
    /// cells the dataset has, which keep their places).
    pub shuffle: Option<u64>,
    /// Where a shuffled append spills its cells (default: the system's
    /// temporary folder).
    pub spill_dir: Option<PathBuf>,
    /// How inputs at URLs are reached.
    pub inputs: crate::inputs::InputOptions,
}

impl Default for AppendOptions {
    fn default() -> Self {
        AppendOptions {
            matrix: None,
            max_in_flight: super::MAX_IN_FLIGHT,
            shuffle: None,
            spill_dir: None,
            inputs: crate::inputs::InputOptions::default(),
        }
    }
}

/// What an append did.
#[derive(Clone, Debug, Serialize)]
pub struct AppendSummary {
    /// "appended", "completed" (an interrupted append, finished), or
    /// "already appended" (these inputs were the last append, which had
    /// finished).
    pub outcome: String,
    /// Printed (`--json`) with their credentials redacted.
    #[serde(serialize_with = "crate::redact::serialize_paths")]
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
    /// Entries of a cell and gene that repeated an earlier one (summed into it).
    pub summed_duplicates: u64,
    pub seconds: f64,
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
) -> Result<AppendSummary> {
    let _lock = lock(ds.as_ref())?;
    append_locked(ds, inputs, options, progress)
}

/// [`append`], with the dataset's lock held.
fn append_locked(
    ds: Arc<dyn Storage>,
    inputs: &[PathBuf],
    options: &AppendOptions,
    progress: &dyn ConvertProgress,
) -> Result<AppendSummary> {
    let started = Instant::now();
    if inputs.is_empty() {
        return Err(ConvertError::NoInputs);
    }
    let time = match settle(ds.as_ref(), inputs, options.matrix.as_deref(), &options.inputs, progress, started)? {
        Settled::Proceed(time) => time,
        Settled::Done(summary) => return Ok(summary),
    };
    let staging = Within::new(ds.as_ref(), APPEND_PREFIX);
    let run = || -> Result<_> {
        let plan = plan_staged(ds.clone(), inputs, options, time, Then::Tiles, progress)?;
        let shard_options = super::ShardOptions {
            max_in_flight: options.max_in_flight,
            spill_dir: options.spill_dir.clone(),
            inputs: options.inputs.clone(),
        };
        let shard = shard_in(&staging, ds.as_ref(), 0, 1, &shard_options, progress)?;
        let (_, staged) = finalize_in(&staging, ds.as_ref())?;
        Ok((plan, shard, staged))
    };
    let (plan, shard, staged) = match run() {
        Ok(done) => done,
        Err(e) => {
            // The dataset was not touched: leave it as it was.
            let _ = clean_up(ds.as_ref());
            return Err(e);
        }
    };
    commit(ds.as_ref(), &staged)?;
    clean_up(ds.as_ref())?;
    let a = plan.append.as_ref().expect("an append's plan");
    let added: u64 = new_inputs(&plan.inputs).map(|i| i.n_rows).sum();
    let cells_before = plan.n_cells - added;
    let tiles_before = cells_before.div_ceil(plan.tile_size) as usize;
    Ok(AppendSummary {
        outcome: "appended".into(),
        inputs: inputs.to_vec(),
        cells_before,
        cells_added: added,
        n_cells: plan.n_cells,
        tile_rewritten: plan.inputs.iter().find_map(|i| i.stored_tile),
        tiles_added: plan.n_tiles() - tiles_before,
        tile_bytes_written: shard.tile_bytes.iter().sum(),
        obs_shards_written: shard.obs_shard_bytes.len()
            + if a.restated.is_empty() { 0 } else { a.kept_obs_bytes.len() },
        obs_restated: a.restated.clone(),
        summed_duplicates: shard.summed_duplicates,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// What an earlier append left means for this one.
enum Settled {
    /// Go on (with the time of an unfinished staging of the same append).
    Proceed(Option<String>),
    /// This append was already done, or is now completed.
    Done(AppendSummary),
}

/// Completes, discards or refuses what an earlier append left in `ds`, given
/// the inputs of this one.
fn settle(
    ds: &dyn Storage,
    inputs: &[PathBuf],
    matrix: Option<&str>,
    reach: &crate::inputs::InputOptions,
    progress: &dyn ConvertProgress,
    started: Instant,
) -> Result<Settled> {
    Ok(match leftover(ds)? {
        Leftover::Clean => Settled::Proceed(None),
        // A compaction's files are all staged: completing it costs renames.
        Leftover::Committing(record, staged) | Leftover::Staged(record, staged) if record.compact.is_some() => {
            commit_staged(ds, &staged)?;
            Settled::Proceed(None)
        }
        Leftover::Staging(record) if record.compact.is_some() => {
            progress.note("discarding an unfinished compaction (the dataset is as it was before it)");
            clean_up(ds)?;
            Settled::Proceed(None)
        }
        Leftover::Committing(record, staged) => {
            if !record.is_of(inputs, matrix, reach) {
                return Err(AppendError::Interrupted { location: ds.location(""), inputs: record.input_list() }.into());
            }
            Settled::Done(finish(ds, &record, &staged, started, "completed")?)
        }
        Leftover::Staged(record, staged) if record.is_of(inputs, matrix, reach) => {
            Settled::Done(finish(ds, &record, &staged, started, "completed")?)
        }
        Leftover::Finished(Some(record)) if record.is_of(inputs, matrix, reach) => {
            clean_up(ds)?;
            let manifest = read_manifest(ds)?;
            Settled::Done(summary_of(&record, &manifest, "already appended", started))
        }
        Leftover::Staging(record) if record.is_of(inputs, matrix, reach) => {
            clean_up(ds)?;
            Settled::Proceed(Some(record.time))
        }
        // Its shards may be running on other machines now.
        Leftover::Staging(record) | Leftover::Staged(record, _) if record.sharded => {
            return Err(AppendError::Planned { location: ds.location(""), inputs: record.input_list() }.into());
        }
        Leftover::Staging(record) | Leftover::Staged(record, _) => {
            progress.note(&format!(
                "discarding the unfinished append of {} (the dataset is as it was before it)",
                record.input_list()
            ));
            clean_up(ds)?;
            Settled::Proceed(None)
        }
        Leftover::Finished(_) => {
            clean_up(ds)?;
            Settled::Proceed(None)
        }
    })
}

/// What [`plan_append`] did.
pub enum Planned {
    /// The plan, under `DATASET/.append/`: run `shard` K of N and `finalize`
    /// on the dataset, as for a planned conversion.
    Plan(Box<Plan>),
    /// The same append had already been done, or was interrupted and is now
    /// completed.
    Done(AppendSummary),
}

/// Plans an append of `inputs` to the dataset in `ds` for many workers: then
/// [`super::run_shard`] K of N and [`super::finalize`] on `ds` give the bytes
/// [`append`] gives. The dataset is untouched until finalize.
pub fn plan_append(
    ds: Arc<dyn Storage>,
    inputs: &[PathBuf],
    options: &AppendOptions,
    progress: &dyn ConvertProgress,
) -> Result<Planned> {
    let started = Instant::now();
    if inputs.is_empty() {
        return Err(ConvertError::NoInputs);
    }
    let _lock = lock(ds.as_ref())?;
    let time = match settle(ds.as_ref(), inputs, options.matrix.as_deref(), &options.inputs, progress, started)? {
        Settled::Proceed(time) => time,
        Settled::Done(summary) => return Ok(Planned::Done(summary)),
    };
    match plan_staged(ds.clone(), inputs, options, time, Then::Nothing, progress) {
        Ok(plan) => Ok(Planned::Plan(Box::new(plan))),
        Err(e) => {
            let _ = clean_up(ds.as_ref());
            Err(e)
        }
    }
}

/// Completes the append whose files `ds` holds under `.append/` (one that was
/// interrupted), from its record: the commit, when everything is staged, or
/// the whole append again from its recorded inputs.
pub fn resume(ds: Arc<dyn Storage>, options: &AppendOptions, progress: &dyn ConvertProgress) -> Result<AppendSummary> {
    let started = Instant::now();
    let _lock = lock(ds.as_ref())?;
    match leftover(ds.as_ref())? {
        Leftover::Clean => {
            Err(ConvertError::state(ds.location(""), format!("no interrupted append to resume (no {RECORD_KEY})")))
        }
        Leftover::Committing(record, staged) | Leftover::Staged(record, staged) => {
            finish(ds.as_ref(), &record, &staged, started, "completed")
        }
        Leftover::Finished(record) => {
            clean_up(ds.as_ref())?;
            let manifest = read_manifest(ds.as_ref())?;
            match record {
                Some(record) => Ok(summary_of(&record, &manifest, "already appended", started)),
                None => Err(ConvertError::state(
                    ds.location(""),
                    "no interrupted append to resume (its leftovers were removed)",
                )),
            }
        }
        Leftover::Staging(record) if record.compact.is_some() => Err(ConvertError::state(
            ds.location(""),
            format!("the interrupted change is {}: run `deltacells compact` again", record.input_list()),
        )),
        Leftover::Staging(record) => {
            let inputs: Vec<PathBuf> = new_inputs(&record.inputs).map(|i| i.path.clone()).collect();
            let mut options =
                AppendOptions { matrix: Some(record.matrix.clone()), shuffle: record.shuffle, ..options.clone() };
            options.inputs.reading = record.reading.clone();
            let mut summary = append_locked(ds, &inputs, &options, progress)?;
            summary.outcome = "completed".into();
            Ok(summary)
        }
    }
}

/// Commits what is staged, then cleans up.
fn finish(
    ds: &dyn Storage,
    record: &AppendRecord,
    staged: &Bytes,
    started: Instant,
    outcome: &str,
) -> Result<AppendSummary> {
    let manifest = commit_staged(ds, staged)?;
    Ok(summary_of(record, &manifest, outcome, started))
}

/// What the manifest after `record`'s append says of it.
fn summary_of(record: &AppendRecord, after: &Manifest, outcome: &str, started: Instant) -> AppendSummary {
    let added: u64 = new_inputs(&record.inputs).map(|i| i.n_rows).sum();
    AppendSummary {
        outcome: outcome.into(),
        inputs: new_inputs(&record.inputs).map(|i| i.path.clone()).collect(),
        cells_before: after.n_cells - added,
        cells_added: added,
        n_cells: after.n_cells,
        tile_rewritten: record.inputs.iter().find_map(|i| i.stored_tile),
        tiles_added: 0,
        tile_bytes_written: 0,
        obs_shards_written: 0,
        obs_restated: Vec::new(),
        summed_duplicates: 0,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Checks the dataset and the inputs, and writes the plan of the append under
/// `.append/` (its record first, its plan last): the obs schema the shards
/// write, and the obs shards before the first one they write when a column's
/// type changes.
fn plan_staged(
    ds: Arc<dyn Storage>,
    inputs: &[PathBuf],
    options: &AppendOptions,
    time: Option<String>,
    then: Then,
    progress: &dyn ConvertProgress,
) -> Result<Plan> {
    let root = ds.location("");
    let base_bytes = ds.get(format::MANIFEST_KEY)?.ok_or_else(|| crate::dataset::no_manifest(ds.as_ref()))?;
    let dataset = Dataset::from_storage(ds.clone())?;
    let manifest = dataset.manifest().clone();
    let stored_schema = if manifest.has_obs { Some(crate::obs::read_schema(ds.as_ref())?) } else { None };
    let recorded = recorded(&manifest, stored_schema.as_ref().map(|s| &s.schema));
    let matrix = options.matrix.clone().unwrap_or_else(|| recorded.matrix.clone());
    // A dataset converted shuffled says in obs where each cell was read; its
    // appends go on saying it. A shuffled append needs it said.
    let has_source = stored_schema.as_ref().is_some_and(|s| super::obs_merge::source_files(&s.schema).is_some());
    if options.shuffle.is_some() && manifest.has_obs && !has_source {
        return Err(AppendError::NoSourceColumns { location: root }.into());
    }

    // Genes: matched by name to the stored columns.
    let Some(var_names) = dataset.var_names()? else {
        return Err(ConvertError::state(
            root,
            "has no var_names.txt, so the inputs' genes cannot be matched to its columns by name",
        ));
    };
    // An append in one process reads its inputs whole for the tiles.
    let read_whole: Vec<usize> = if then == Then::Tiles { (0..inputs.len()).collect() } else { Vec::new() };
    let (scanned, input_genes) = scan_inputs(inputs, &matrix, GeneSet::Same, &read_whole, &options.inputs, progress)?;
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
            Some(ObsPlan::extend(&stored_obs, &paths, &matrix, &recorded.obs, &options.inputs)?)
        }
        None => {
            // Said, not silently dropped: a convert of these inputs would store them.
            let mut with_obs = Vec::new();
            for input in &scanned {
                if crate::inputs::open(&input.path, &matrix, &options.inputs)?.obs()?.is_some() {
                    with_obs.push(input.path.display().to_string());
                }
            }
            if !with_obs.is_empty() {
                progress.note(&format!(
                    "{root} stores no obs (it was converted without it), so the obs of {} are not stored",
                    with_obs.join(", ")
                ));
            }
            None
        }
    };
    let restated = obs.as_ref().map(|(_, r)| r.clone()).unwrap_or_default();
    for r in &restated {
        progress.note(&format!(
            "obs column {:?} changes from {} to {}: every obs shard is rewritten",
            r.column, r.was, r.now
        ));
    }
    let obs_plan = obs.as_ref().map(|(p, _)| p);

    // The layout: the tiles kept; the last one, when not full, rewritten.
    let n_tiles = manifest.n_tiles();
    let tile_size = manifest.tile_size;
    let tail_tile = (n_tiles > 0 && manifest.tile_cells[n_tiles - 1] < tile_size).then(|| n_tiles - 1);
    let first_tile = tail_tile.unwrap_or(n_tiles);
    let first_cell: u64 = manifest.tile_cells[..first_tile].iter().sum();
    let per_file = recorded.obs.tiles_per_file.max(1) as usize;
    let first_shard = first_tile / per_file;

    let record = AppendRecord {
        format: RECORD_FORMAT.into(),
        version: 1,
        base: fingerprint::sha256_hex(&base_bytes),
        inputs: tail_tile
            .map(|t| Input {
                path: ds.location(&format::tile_key(t)).into(),
                n_rows: manifest.tile_cells[t],
                bytes: 0,
                etag: None,
                stored_tile: Some(t),
                genes_digest: None,
            })
            .into_iter()
            .chain(scanned.iter().cloned())
            .collect(),
        matrix: matrix.clone(),
        time: time.unwrap_or_else(now),
        sharded: then == Then::Nothing,
        shuffle: options.shuffle,
        reading: options.inputs.reading.clone(),
        compact: None,
        compact_from: None,
    };
    let mut text = serde_json::to_vec_pretty(&record)?;
    text.push(b'\n');
    ds.put(RECORD_KEY, Bytes::from(text))?;
    let staging = Within::new(ds.as_ref(), APPEND_PREFIX);

    // The obs shards before the first one the shards write: kept, or
    // restated here when a column's type changes.
    let mut kept_obs: Vec<ShardRecord> = Vec::new();
    if let (Some(plan), Some(stored)) = (obs_plan, &stored_schema) {
        let bytes = manifest.obs_shard_bytes.as_deref().unwrap_or_default();
        let sha256 = manifest.obs_shard_sha256.as_deref().unwrap_or_default();
        if restated.is_empty() {
            kept_obs.extend(
                bytes
                    .iter()
                    .zip(sha256)
                    .take(first_shard)
                    .map(|(&bytes, sha)| ShardRecord { bytes, sha256: sha.clone() }),
            );
        } else {
            progress.phase("rewriting obs", first_cell);
            for s in 0..first_shard {
                let mut writer = ShardWriter::starting_at(plan.arrow_schema().clone(), per_file as u64, s);
                let rows = StoredObsRows::open(ds.as_ref(), s, &stored.schema, &manifest)?;
                for i in 0..rows.len() {
                    let n = writer.add_kept(&rows, i, plan, &staging)?;
                    progress.advance(n);
                }
                kept_obs.extend(writer.finish(&staging)?);
            }
        }
        // The shards read the schema they write from here; finalize drops it
        // again where it did not change.
        staging.put(format::OBS_SCHEMA_KEY, Bytes::from(plan.schema_text()))?;
    }

    // The manifest's metadata: the dataset's, and a record of this append.
    let mut metadata = manifest.metadata.clone();
    let mut entry = Map::new();
    entry.insert("inputs".into(), json!(scanned.iter().map(|i| crate::redact::path(&i.path)).collect::<Vec<_>>()));
    entry.insert("matrix".into(), json!(matrix));
    entry.insert("cells".into(), json!(scanned.iter().map(|i| i.n_rows).sum::<u64>()));
    entry.insert("time".into(), json!(record.time));
    if let Some(seed) = options.shuffle {
        entry.insert("shuffle".into(), json!({ "seed": seed }));
    }
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
    match metadata.get_mut("appends") {
        Some(Value::Array(list)) => list.push(Value::Object(entry)),
        _ => {
            metadata.insert("appends".into(), json!([entry]));
        }
    }
    format::manifest::extend_lineage(&mut metadata, &record.base);

    let plan = Plan {
        format: PLAN_FORMAT.into(),
        version: 1,
        id: String::new(),
        matrix,
        n_cells: first_cell + record.inputs.iter().map(|i| i.n_rows).sum::<u64>(),
        inputs: record.inputs.clone(),
        n_genes: manifest.n_genes,
        tile_size,
        n_chunks: manifest.n_chunks as usize,
        zstd_level: manifest.zstd_level as i32,
        var_table: manifest.has_var_table,
        obs: obs_plan.map(|_| PlanObs {
            names: recorded.obs.names,
            tiles_per_file: per_file as u64,
            source: has_source,
        }),
        metadata,
        append: Some(AppendPlan {
            base: record.base.clone(),
            first_tile,
            first_cell,
            kept_obs_bytes: kept_obs.iter().map(|r| r.bytes).collect(),
            kept_obs_sha256: kept_obs.iter().map(|r| r.sha256.clone()).collect(),
            restated,
        }),
        shuffle: options.shuffle,
        reading: options.inputs.reading.clone(),
    }
    .with_id();
    let mut text = serde_json::to_vec_pretty(&plan)?;
    text.push(b'\n');
    staging.put(PLAN_KEY, Bytes::from(text))?;
    Ok(plan)
}
