//! Where an append stages its files, and how it replaces the dataset's
//! without losing anything at any moment:
//! 1. `.append/append.json` records the append (its inputs, the manifest it
//!    extends); every new or rewritten file is written under `.append/`, and
//!    the new manifest last, as `.append/manifest.json`. Until then the old
//!    dataset is complete and untouched.
//! 2. Commit: manifest.json is removed (the dataset is now incomplete, and
//!    says an append was interrupted), the staged files are moved into place,
//!    and the staged manifest is written as manifest.json.
//! 3. `.append/` is removed, its record first.
//!
//! What an interrupted append left is read back as a [`Leftover`], and a
//! [`Workspace`] says where a planned job runs: in the output of a
//! conversion, or in the staging folder of the dataset an append extends.

pub use super::error::AppendError;
use super::error::{ConvertError, Result};
use std::path::PathBuf;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::job::PLAN_KEY;
use super::Input;
use crate::format::{self, fingerprint, Manifest};
use crate::storage::{Storage, Within};

/// Where an append stages its files, in the dataset.
pub(crate) const APPEND_PREFIX: &str = ".append";

/// The record of the append in progress.
pub(crate) const RECORD_KEY: &str = crate::dataset::APPEND_KEY;

/// The staged manifest, within [`APPEND_PREFIX`]: its presence means every
/// staged file is complete.
pub(crate) const STAGED_MANIFEST: &str = "manifest.json";

pub(crate) const RECORD_FORMAT: &str = "deltacells-append";

/// What an append is, as `.append/append.json` records it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct AppendRecord {
    pub(crate) format: String,
    pub(crate) version: u32,
    /// SHA-256 of the manifest.json appended to.
    pub(crate) base: String,
    pub(crate) inputs: Vec<Input>,
    pub(crate) matrix: String,
    /// When the append began (RFC 3339), as the manifest records it.
    pub(crate) time: String,
    /// Planned for shards (`plan --append`): other processes write its
    /// staging until its finalize.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) sharded: bool,
    /// The seed of the appended cells' order, when shuffled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) shuffle: Option<u64>,
    /// How the inputs are read, when not told by each input.
    #[serde(default, skip_serializing_if = "crate::inputs::InputReading::is_default")]
    pub(crate) reading: crate::inputs::InputReading,
    /// A compaction (`compact.rs`), not an append: the zstd level the tiles
    /// are encoded at again, and the one they were at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) compact: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) compact_from: Option<i64>,
}

/// The inputs that are files (not the dataset's own last tile).
pub(crate) fn new_inputs(inputs: &[Input]) -> impl Iterator<Item = &Input> {
    inputs.iter().filter(|i| i.stored_tile.is_none())
}

impl AppendRecord {
    /// Whether `inputs` (the same files, by their sizes too) and `matrix`
    /// are this append's.
    pub(crate) fn is_of(&self, inputs: &[PathBuf], matrix: Option<&str>, reach: &crate::inputs::InputOptions) -> bool {
        let file = |p: &PathBuf| {
            if crate::inputs::remote::is_url(p) {
                p.clone()
            } else {
                std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())
            }
        };
        let files: Vec<(PathBuf, u64)> = new_inputs(&self.inputs).map(|i| (file(&i.path), i.bytes)).collect();
        let asked: Vec<(PathBuf, u64)> =
            inputs.iter().map(|p| (file(p), crate::inputs::input_size(p, reach).unwrap_or(0))).collect();
        files == asked && matrix.is_none_or(|m| m == self.matrix)
    }

    pub(crate) fn input_list(&self) -> String {
        if let Some(level) = self.compact {
            return format!("a compaction to zstd level {level}");
        }
        let names: Vec<String> = new_inputs(&self.inputs).map(|i| i.path.display().to_string()).collect();
        names.join(", ")
    }
}

/// The time an append or compaction records: now, or `SOURCE_DATE_EPOCH`
/// when set (the convention of reproducible builds; tests use it).
pub(crate) fn now() -> String {
    let at = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or_else(std::time::SystemTime::now, |s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
    humantime::format_rfc3339_seconds(at).to_string()
}

/// An append's leftovers in a dataset, and what they mean.
pub(crate) enum Leftover {
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

pub(crate) fn leftover(ds: &dyn Storage) -> Result<Leftover> {
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
        .ok_or_else(|| ConvertError::invalid(location, "not the record of an append of this version"))?;
    let current = ds.get(format::MANIFEST_KEY)?;
    let staged = staging.get(STAGED_MANIFEST)?;
    Ok(match (current, staged) {
        (None, Some(staged)) => Leftover::Committing(record, staged),
        (None, None) => {
            let problem = format!(
                "incomplete dataset: an append into it was interrupted and its staged manifest is missing ({})",
                staging.location(STAGED_MANIFEST)
            );
            return Err(ConvertError::state(ds.location(""), problem));
        }
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
pub(crate) fn clean_up(ds: &dyn Storage) -> Result<()> {
    ds.delete(RECORD_KEY)?;
    for key in ds.list(APPEND_PREFIX)? {
        ds.delete(&key)?;
    }
    Ok(())
}

/// Takes the dataset's lock for an append, a resume or a finalize, so that
/// two of them never change one dataset at once (a local folder's; a bucket
/// has none, see [`Storage::try_lock_root`]).
pub(crate) fn lock(ds: &dyn Storage) -> Result<crate::storage::RootLock> {
    match ds.try_lock_root()? {
        crate::storage::RootLock::Busy { holder } => {
            Err(AppendError::Busy { location: ds.location(""), holder: holder.map(String::into_boxed_str) })?
        }
        lock => Ok(lock),
    }
}

/// Checks the staged manifest, commits and cleans up; the manifest written.
pub(crate) fn commit_staged(ds: &dyn Storage, staged: &Bytes) -> Result<Manifest> {
    let manifest = Manifest::parse_checked(staged)
        .map_err(|e| ConvertError::invalid(Within::new(ds, APPEND_PREFIX).location(STAGED_MANIFEST), e))?;
    commit(ds, staged)?;
    clean_up(ds)?;
    Ok(manifest)
}

/// Step 2: removes the manifest, moves every staged file into place, writes
/// the staged manifest. Running it again after an interruption completes it.
pub(crate) fn commit(ds: &dyn Storage, staged_manifest: &Bytes) -> Result<()> {
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

/// The staging folder of `ds` when it holds the plan of an append (and `ds`
/// no plan of a conversion): where shards and finalize work.
pub(crate) fn planned_staging(ds: &dyn Storage) -> Result<Option<Within<'_>>> {
    if ds.size(PLAN_KEY)?.is_some() {
        return Ok(None);
    }
    let staging = Within::new(ds, APPEND_PREFIX);
    Ok(staging.size(PLAN_KEY)?.is_some().then_some(staging))
}

/// Completes an append whose files are all staged (its finalize, or its
/// commit, was interrupted); the manifest written, or None when there is none.
pub(crate) fn finish_interrupted(ds: &dyn Storage) -> Result<Option<Manifest>> {
    match leftover(ds)? {
        Leftover::Committing(_, staged) | Leftover::Staged(_, staged) => Ok(Some(commit_staged(ds, &staged)?)),
        _ => Ok(None),
    }
}

/// Where a planned job runs: its plan, results and new files (the output of
/// a conversion, or the staging folder of an append), and the dataset whose
/// tables it reads and extends (the dataset an append extends, else the
/// output itself). Resolved once, from the storage a command was given.
pub(crate) struct Workspace<'a> {
    root: &'a dyn Storage,
    staging: Option<Within<'a>>,
}

impl<'a> Workspace<'a> {
    /// The workspace of `root`: its staging folder when that holds the plan
    /// of an append (and `root` no plan of a conversion), else `root`.
    pub fn resolve(root: &'a dyn Storage) -> Result<Workspace<'a>> {
        Ok(Workspace { root, staging: planned_staging(root)? })
    }

    /// Where the plan, the results and the new files are.
    pub fn out(&self) -> &dyn Storage {
        match &self.staging {
            Some(staging) => staging,
            None => self.root,
        }
    }

    /// The dataset whose tables the job reads (and an append extends).
    pub fn base(&self) -> &'a dyn Storage {
        self.root
    }

    /// Whether the job is an append's (its files are then committed).
    pub fn is_append(&self) -> bool {
        self.staging.is_some()
    }
}
