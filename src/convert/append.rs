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
use super::plan::{finalize_in, shard_in, AppendPlan, Plan, PlanObs, Then, PLAN_KEY};
use super::{scan_inputs, ConvertProgress, GeneSet, GivenOrder, Input, ObsOptions, StoredTail};
use crate::dataset::{read_manifest, Dataset};
use crate::format::{self, fingerprint, Manifest, TileExpectation};
use crate::storage::{Storage, Within};

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
    /// Planned for shards (`plan --append`): other processes write its
    /// staging until its finalize.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    sharded: bool,
    /// The seed of the appended cells' order, when shuffled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shuffle: Option<u64>,
}

/// The inputs that are files (not the dataset's own last tile).
fn new_inputs(inputs: &[Input]) -> impl Iterator<Item = &Input> {
    inputs.iter().filter(|i| i.stored_tile.is_none())
}

impl AppendRecord {
    /// Whether `inputs` (the same files, by their sizes too) and `matrix`
    /// are this append's.
    fn is_of(&self, inputs: &[PathBuf], matrix: Option<&str>) -> bool {
        let file = |p: &PathBuf| {
            if crate::h5ad::remote::is_url(p) {
                p.clone()
            } else {
                std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())
            }
        };
        let files: Vec<(PathBuf, u64)> = new_inputs(&self.inputs).map(|i| (file(&i.path), i.bytes)).collect();
        let asked: Vec<(PathBuf, u64)> =
            inputs.iter().map(|p| (file(p), super::input::input_size(p).unwrap_or(0))).collect();
        files == asked && matrix.is_none_or(|m| m == self.matrix)
    }

    fn input_list(&self) -> String {
        let names: Vec<String> = new_inputs(&self.inputs).map(|i| i.path.display().to_string()).collect();
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
    /// Store the appended cells in an order fixed by this seed (after the
    /// cells the dataset has, which keep their places).
    pub shuffle: Option<u64>,
    /// Where a shuffled append spills its cells (default: the system's
    /// temporary folder).
    pub spill_dir: Option<PathBuf>,
}

impl Default for AppendOptions {
    fn default() -> Self {
        AppendOptions { matrix: None, max_in_flight: super::MAX_IN_FLIGHT, shuffle: None, spill_dir: None }
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
pub(crate) fn clean_up(ds: &dyn Storage) -> anyhow::Result<()> {
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
    let _lock = lock(ds.as_ref())?;
    append_locked(ds, inputs, options, progress)
}

/// [`append`], with the dataset's lock held.
fn append_locked(
    ds: Arc<dyn Storage>,
    inputs: &[PathBuf],
    options: &AppendOptions,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<AppendSummary> {
    let started = Instant::now();
    if inputs.is_empty() {
        bail!("no input files");
    }
    let time = match settle(ds.as_ref(), inputs, options.matrix.as_deref(), progress, started)? {
        Settled::Proceed(time) => time,
        Settled::Done(summary) => return Ok(summary),
    };
    let staging = Within::new(ds.as_ref(), APPEND_PREFIX);
    let run = || -> anyhow::Result<_> {
        let plan = plan_staged(ds.clone(), inputs, options, time, Then::Tiles, progress)?;
        let shard_options =
            super::ShardOptions { max_in_flight: options.max_in_flight, spill_dir: options.spill_dir.clone() };
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
    progress: &dyn ConvertProgress,
    started: Instant,
) -> anyhow::Result<Settled> {
    Ok(match leftover(ds)? {
        Leftover::Clean => Settled::Proceed(None),
        Leftover::Committing(record, staged) => {
            if !record.is_of(inputs, matrix) {
                return Err(AppendError::Interrupted { location: ds.location(""), inputs: record.input_list() }.into());
            }
            Settled::Done(finish(ds, &record, &staged, started, "completed")?)
        }
        Leftover::Staged(record, staged) if record.is_of(inputs, matrix) => {
            Settled::Done(finish(ds, &record, &staged, started, "completed")?)
        }
        Leftover::Finished(Some(record)) if record.is_of(inputs, matrix) => {
            clean_up(ds)?;
            let manifest = read_manifest(ds)?;
            Settled::Done(summary_of(&record, &manifest, "already appended", started))
        }
        Leftover::Staging(record) if record.is_of(inputs, matrix) => {
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
) -> anyhow::Result<Planned> {
    let started = Instant::now();
    if inputs.is_empty() {
        bail!("no input files");
    }
    let _lock = lock(ds.as_ref())?;
    let time = match settle(ds.as_ref(), inputs, options.matrix.as_deref(), progress, started)? {
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
pub fn resume(
    ds: Arc<dyn Storage>,
    options: &AppendOptions,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<AppendSummary> {
    let started = Instant::now();
    let _lock = lock(ds.as_ref())?;
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
            let inputs: Vec<PathBuf> = new_inputs(&record.inputs).map(|i| i.path.clone()).collect();
            let options =
                AppendOptions { matrix: Some(record.matrix.clone()), shuffle: record.shuffle, ..options.clone() };
            let mut summary = append_locked(ds, &inputs, &options, progress)?;
            summary.outcome = "completed".into();
            Ok(summary)
        }
    }
}

/// Takes the dataset's lock for an append, a resume or a finalize, so that
/// two of them never change one dataset at once (a local folder's; a bucket
/// has none, see [`Storage::try_lock_root`]).
pub(crate) fn lock(ds: &dyn Storage) -> anyhow::Result<crate::storage::RootLock> {
    match ds.try_lock_root()? {
        crate::storage::RootLock::Busy => Err(AppendError::Busy { location: ds.location("") }.into()),
        lock => Ok(lock),
    }
}

/// Why an append cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// A shuffled append to a dataset whose obs does not say where its cells
    /// were read (it was converted in the inputs' order).
    #[error(
        "{location}: its obs has no source_file and source_row columns (it was converted in the inputs' order), \
         so the order of shuffled cells could not be undone"
    )]
    NoSourceColumns { location: String },
    #[error(
        "{location}: another append, append --resume or finalize is running on this dataset (it holds the folder's lock); \
         run this again once it has ended"
    )]
    Busy { location: String },
    #[error(
        "{location}: a planned append of {inputs} is under way (plan --append; its shards write into .append/): \
         run `deltacells finalize` on the dataset once they are done, or remove its .append folder to discard it"
    )]
    Planned { location: String, inputs: String },
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
    let manifest = commit_staged(ds, staged)?;
    Ok(summary_of(record, &manifest, outcome, started))
}

/// Checks the staged manifest, commits and cleans up; the manifest written.
fn commit_staged(ds: &dyn Storage, staged: &Bytes) -> anyhow::Result<Manifest> {
    let manifest = Manifest::parse_checked(staged)
        .map_err(|e| anyhow::anyhow!("{}: {e}", Within::new(ds, APPEND_PREFIX).location(STAGED_MANIFEST)))?;
    commit(ds, staged)?;
    clean_up(ds)?;
    Ok(manifest)
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
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Step 2: removes the manifest, moves every staged file into place, writes
/// the staged manifest. Running it again after an interruption completes it.
pub(crate) fn commit(ds: &dyn Storage, staged_manifest: &Bytes) -> anyhow::Result<()> {
    // The crash tests stop the process here for real (SIGABRT) after this many
    // moves (-1: before the manifest is removed, -2: before the new one is
    // written): a kill cannot be timed into a commit of a few renames. Only
    // in builds with the test-only feature `fault-injection`.
    #[cfg(feature = "fault-injection")]
    let stop_here = {
        let abort_after: Option<i64> =
            std::env::var("DELTACELLS_TEST_ABORT_COMMIT_AFTER").ok().and_then(|v| v.parse().ok());
        move |moved: i64| {
            if abort_after == Some(moved) {
                std::process::abort();
            }
        }
    };
    #[cfg(not(feature = "fault-injection"))]
    let stop_here = |_moved: i64| {};
    let mut moved = 0;
    stop_here(-1);
    ds.delete(format::MANIFEST_KEY)?;
    stop_here(moved);
    for key in ds.list(APPEND_PREFIX)? {
        // Only the dataset's files move; the record, the staged manifest and
        // what is left of the plan go with the clean-up.
        let target = key.strip_prefix(APPEND_PREFIX).and_then(|k| k.strip_prefix('/')).unwrap_or(&key);
        if !(target.starts_with("tiles/") || target.starts_with("obs/")) {
            continue;
        }
        // A temporary file of a write that was killed is not a staged file.
        if key.contains("/.deltacells-") {
            ds.delete(&key)?;
            continue;
        }
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

/// The staging folder of `ds` when it holds the plan of an append (and `ds`
/// no plan of a conversion): where shards and finalize work.
pub(crate) fn planned_staging(ds: &dyn Storage) -> anyhow::Result<Option<Within<'_>>> {
    if ds.size(PLAN_KEY)?.is_some() {
        return Ok(None);
    }
    let staging = Within::new(ds, APPEND_PREFIX);
    Ok(staging.size(PLAN_KEY)?.is_some().then_some(staging))
}

/// Completes an append whose files are all staged (its finalize, or its
/// commit, was interrupted); the manifest written, or None when there is none.
pub(crate) fn finish_interrupted(ds: &dyn Storage) -> anyhow::Result<Option<Manifest>> {
    match leftover(ds)? {
        Leftover::Committing(_, staged) | Leftover::Staged(_, staged) => Ok(Some(commit_staged(ds, &staged)?)),
        _ => Ok(None),
    }
}

/// The manifest of the dataset an append extends, checked to be the one it
/// was planned on.
pub(crate) fn check_base(base: &dyn Storage, append: &AppendPlan) -> anyhow::Result<Manifest> {
    let bytes = base.get(format::MANIFEST_KEY)?.ok_or_else(|| crate::dataset::no_manifest(base))?;
    if fingerprint::sha256_hex(&bytes) != append.base {
        bail!(
            "{}: the dataset changed since the append was planned (its manifest is not the one planned on); \
             plan the append again",
            base.location(format::MANIFEST_KEY)
        );
    }
    Manifest::parse_checked(&bytes).map_err(|source| {
        crate::dataset::DatasetError::Manifest { location: base.location(format::MANIFEST_KEY), source }.into()
    })
}

/// The obs rows of obs shard `s` of `base`, one batch per tile, restated into
/// `plan`'s schema.
fn restated_rows(
    base: &dyn Storage,
    s: usize,
    old: &format::obs_schema::ObsSchema,
    plan: &ObsPlan,
) -> anyhow::Result<Vec<arrow_array::RecordBatch>> {
    let key = format::obs_shard_key(s);
    let location = base.location(&key);
    let bytes = base.get(&key)?.with_context(|| format!("{location}: missing (the manifest lists it)"))?;
    let groups = crate::obs::row_groups(bytes).map_err(|e| anyhow::anyhow!("{location}: {e}"))?;
    groups.iter().map(|g| plan.restate(old, g).map_err(|e| anyhow::anyhow!("{location}: {e}"))).collect()
}

/// What an append's first shard keeps of `base`: the cells of its last tile
/// when the plan rewrites it (decoded, with their obs rows), and the obs rows
/// of the tiles before it in its obs shard, restated into the plan's schema.
pub(crate) fn kept_rows(
    base: &dyn Storage,
    plan: &Plan,
    obs_plan: Option<&ObsPlan>,
) -> anyhow::Result<(Option<StoredTail>, Vec<arrow_array::RecordBatch>)> {
    let a = plan.append.as_ref().expect("an append's plan");
    let manifest = check_base(base, a)?;
    let per = plan.tiles_per_unit();
    let shard = a.first_tile / per;
    let tail_tile = plan.inputs.first().and_then(|i| i.stored_tile);
    let mut prefix = Vec::new();
    let mut tail_obs = None;
    if let Some(obs_plan) = obs_plan {
        if !a.first_tile.is_multiple_of(per) || tail_tile.is_some() {
            let old = crate::obs::read_schema(base)?;
            let mut rows = restated_rows(base, shard, &old.schema, obs_plan)?;
            let in_shard = a.first_tile - shard * per;
            if tail_tile.is_some() {
                tail_obs = Some(rows.get(in_shard).cloned().with_context(|| {
                    format!("{}: no row group for tile {}", base.location(&format::obs_shard_key(shard)), a.first_tile)
                })?);
            }
            rows.truncate(in_shard);
            prefix = rows;
        }
    }
    let tail = match tail_tile {
        Some(t) => {
            let key = format::tile_key(t);
            let location = base.location(&key);
            let blob = base.get(&key)?.with_context(|| format!("{location}: missing (tile {t})"))?;
            if blob.len() as u64 != manifest.tile_bytes[t] {
                bail!("{location}: tile is {} bytes, the manifest says {}", blob.len(), manifest.tile_bytes[t]);
            }
            let expect = TileExpectation {
                n_cells: manifest.tile_cells[t],
                nnz: manifest.tile_nnz[t],
                n_genes: plan.n_genes as u32,
            };
            let rows = format::decode_tile(&blob, Some(&expect))
                .map_err(|source| crate::dataset::DatasetError::Tile { location, tile: t, source })?;
            Some(StoredTail { rows, obs: tail_obs })
        }
        None => None,
    };
    Ok((tail, prefix))
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
) -> anyhow::Result<Plan> {
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
        bail!("{root}: has no var_names.txt, so the inputs' genes cannot be matched to its columns by name");
    };
    // An append in one process reads its inputs whole for the tiles.
    let read_whole: Vec<usize> = if then == Then::Tiles { (0..inputs.len()).collect() } else { Vec::new() };
    let (scanned, input_genes) = scan_inputs(inputs, &matrix, GeneSet::Same, &read_whole, progress)?;
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
        None => {
            // Said, not silently dropped: a convert of these inputs would store them.
            let mut with_obs = Vec::new();
            for input in &scanned {
                if super::input::open(&input.path, &matrix)?.obs()?.is_some() {
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
            })
            .into_iter()
            .chain(scanned.iter().cloned())
            .collect(),
        matrix: matrix.clone(),
        time: time.unwrap_or_else(now),
        sharded: then == Then::Nothing,
        shuffle: options.shuffle,
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
                for batch in &restated_rows(ds.as_ref(), s, &stored.schema, plan)? {
                    writer.add_tile(batch, &staging)?;
                    progress.advance(batch.num_rows() as u64);
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
    entry.insert("inputs".into(), json!(scanned.iter().map(|i| i.path.display().to_string()).collect::<Vec<_>>()));
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

    let plan = Plan {
        format: super::plan::PLAN_FORMAT.into(),
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
    }
    .with_id();
    let mut text = serde_json::to_vec_pretty(&plan)?;
    text.push(b'\n');
    staging.put(PLAN_KEY, Bytes::from(text))?;
    Ok(plan)
}
