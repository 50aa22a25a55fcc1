//! Reading on while writers change the dataset: an open dataset keeps the
//! cells, genes and obs of the version it opened, and reads their tiles
//! from whichever later version of the same dataset is in place.
//!
//! Every writer (append, a sharded append's finalize, compact) changes a
//! finished dataset the same way (`convert/staging.rs`): it stages the new
//! files, removes manifest.json, moves the staged files over the old ones,
//! and writes the new manifest.json. None of them changes the row of a cell
//! the dataset had, nor its place: an append adds cells after the last one
//! (re-encoding the last tile when it was not full, its old cells first), a
//! compaction encodes the same rows again. So a tile that disagrees with the
//! manifest read at open (its size, header or CRC, a version pinned by a
//! ranged read, a tile that is not there) means one of three things, told
//! apart by reading manifest.json again:
//! - it is the same manifest: the tile is damaged, and the error stands;
//! - there is none: a writer is committing; wait for it (a bounded time);
//! - another one: if it is a later version of the opened dataset
//!   ([`is_later_version`]), reads go on from its tiles (every cell the
//!   opened version has is in the same tile, at the same row, with the same
//!   values), with the caches of the older version dropped; if not, the
//!   dataset was replaced, and reads refuse ([`DatasetError::Replaced`]).
//!
//! A read (a gather, a range, a tile) runs whole against one version: when
//! it has to move to another, it starts again there, so that nothing it
//! returns comes from two versions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::format::{self, Manifest, TileExpectation};
use crate::obs::localize;
use crate::storage::StorageError;

use super::{Dataset, DatasetError};

/// The version of the dataset whose tiles reads go to now: the manifest
/// read at open, or a later version's.
pub(crate) struct Current {
    /// 0 for the version opened, one more for each later one followed.
    pub(crate) generation: u64,
    pub(crate) manifest: Manifest,
    sha256: String,
}

impl Current {
    pub(super) fn new(manifest: Manifest, sha256: String) -> Current {
        Current { generation: 0, manifest, sha256 }
    }

    /// What this version's manifest says tile `tile` holds.
    /// (A tile the manifest does not list is expected empty, so that
    /// reading it is refused as a mismatch, not a panic.)
    pub(crate) fn expectation(&self, tile: usize) -> TileExpectation {
        TileExpectation {
            n_cells: self.manifest.tile_cells.get(tile).copied().unwrap_or(0),
            nnz: self.manifest.tile_nnz.get(tile).copied().unwrap_or(0),
            n_genes: self.manifest.n_genes as u32,
        }
    }
}

/// The most versions one read follows before it gives up (each a writer's
/// whole commit seen between two of its attempts).
const MAX_FOLLOWS: usize = 16;

/// The first and the longest pause between two looks for the manifest of a
/// writer that is committing.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(500);

impl Dataset {
    /// The version reads go to now.
    pub(crate) fn current(&self) -> Arc<Current> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Runs `read` against the current version; when it fails in a way a
    /// writer's change explains, follows the dataset to its new version and
    /// runs `read` again, whole, there.
    pub(crate) fn on_current<T>(
        &self,
        mut read: impl FnMut(&Current) -> Result<T, DatasetError>,
    ) -> Result<T, DatasetError> {
        let mut current = self.current();
        for _ in 0..MAX_FOLLOWS {
            match read(&current) {
                Err(e) if may_be_a_change(&e) => current = self.follow(&current, e)?,
                done => return done,
            }
        }
        read(&current)
    }

    /// At open with a version given: moves to the version in place now,
    /// when it is another (the given one must be it or an earlier one).
    pub(super) fn follow_at_open(&self) -> Result<(), DatasetError> {
        let seen = self.current();
        let location = self.storage.location(format::MANIFEST_KEY);
        let cause = DatasetError::Missing { location, what: "the manifest changed".into() };
        match self.follow(&seen, cause) {
            Ok(_) | Err(DatasetError::Missing { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The version after `seen`, which a read of it failed on with `cause`:
    /// another thread's, if it moved on already; else read now (waiting for
    /// a writer's commit to end). `cause` when nothing changed.
    fn follow(&self, seen: &Arc<Current>, cause: DatasetError) -> Result<Arc<Current>, DatasetError> {
        let changed_in_place = matches!(cause, DatasetError::Storage(StorageError::Changed { .. }));
        self.next_version(seen, changed_in_place)?.ok_or(cause)
    }

    /// The version after `seen`: another thread's, if it moved on already;
    /// else read now (waiting for a writer's commit to end). None when the
    /// manifest is still `seen`'s, unless a file `changed_in_place` under a
    /// pinned read (then the read is tried again on the same manifest).
    fn next_version(&self, seen: &Arc<Current>, changed_in_place: bool) -> Result<Option<Arc<Current>>, DatasetError> {
        let now = self.current();
        if now.generation > seen.generation {
            return Ok(Some(now));
        }
        // (None: a wait longer than the clock can count, so no end)
        let deadline = Instant::now().checked_add(self.writer_wait);
        let mut pause = FIRST_PAUSE;
        let mut no_writer_seen = false;
        let (manifest, sha256) = loop {
            if let Some(bytes) = self.storage.get(format::MANIFEST_KEY)? {
                let sha256 = format::fingerprint::sha256_hex(&bytes);
                if sha256 == seen.sha256 && !changed_in_place {
                    return Ok(None); // the same version: the file read is what is wrong
                }
                let location = self.storage.location(format::MANIFEST_KEY);
                let manifest =
                    Manifest::parse_checked(&bytes).map_err(|source| DatasetError::Manifest { location, source })?;
                break (manifest, sha256);
            }
            // No manifest: a writer is between removing the old one and
            // writing the new one (or was stopped there), and its record is
            // there until it has written the new one. Without a record, the
            // dataset is gone, unless a writer finished between the two
            // looks: so one more look, then the error, at once.
            // (a store that cannot answer a HEAD is waited for, as before)
            if matches!(self.storage.size(super::files::APPEND_KEY), Ok(None)) {
                if no_writer_seen {
                    return Err(super::no_manifest(self.storage.as_ref()));
                }
                no_writer_seen = true;
                continue;
            }
            no_writer_seen = false;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(super::no_manifest(self.storage.as_ref()));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(LONGEST_PAUSE);
        };
        if !is_later_version((&self.manifest, &self.manifest_sha256), (&manifest, &sha256)) {
            return Err(DatasetError::Replaced { location: self.storage.location("") });
        }
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if current.generation == seen.generation {
            *current = Arc::new(Current { generation: seen.generation + 1, manifest, sha256 });
            self.cache.forget_before(current.generation);
            *self.recent.lock().unwrap_or_else(|p| p.into_inner()) = Default::default();
        }
        Ok(Some(current.clone()))
    }

    /// Copies obs `columns` of the version opened into the local cache
    /// under `root` ([`localize::localize`]), from the shards of whichever
    /// later version is in place when a writer rewrote them (an append
    /// rewrites the last shard, its old rows first).
    pub fn localize_obs(
        &self,
        columns: &[String],
        root: &std::path::Path,
        force: bool,
    ) -> Result<localize::LocalizeReport, localize::ObsError> {
        let mut current = self.current();
        for _ in 0..MAX_FOLLOWS {
            match localize::localize_as(
                self.storage.as_ref(),
                (&self.manifest, &current.manifest),
                columns,
                root,
                force,
            ) {
                Err(e) if obs_may_be_a_change(&e) => {
                    let in_place = matches!(e, localize::ObsError::Storage(StorageError::Changed { .. }));
                    match self.next_version(&current, in_place)? {
                        Some(next) => current = next,
                        None => return Err(e),
                    }
                }
                done => return done,
            }
        }
        localize::localize_as(self.storage.as_ref(), (&self.manifest, &current.manifest), columns, root, force)
    }
}

/// Whether a failed read of obs may be explained by a writer's change (a
/// shard of another size, gone, or not what its footer said).
fn obs_may_be_a_change(e: &localize::ObsError) -> bool {
    use localize::ObsError;
    match e {
        ObsError::Missing { .. } | ObsError::Shard { .. } | ObsError::RowGroup { .. } => true,
        ObsError::Storage(s) => matches!(s, StorageError::Changed { .. } | StorageError::Range { .. }),
        _ => false,
    }
}

/// Whether a failed read may be explained by a writer's change of the
/// dataset since the version read was taken (and so is worth reading the
/// manifest again for): a tile's size, bytes or presence that disagree with
/// the manifest, or a version that changed under a ranged read. Not a cell
/// out of range, nor a store that does not answer (those are retried
/// where they happen).
fn may_be_a_change(e: &DatasetError) -> bool {
    match e {
        DatasetError::Missing { .. }
        | DatasetError::Invalid { .. }
        | DatasetError::Unreadable { .. }
        | DatasetError::Tile { .. } => true,
        DatasetError::Storage(s) => matches!(s, StorageError::Changed { .. } | StorageError::Range { .. }),
        _ => false,
    }
}

/// Whether `later` is a later version of the dataset `opened` describes
/// (each with its manifest's SHA-256), as our writers make them: the same
/// genes in the same layout; every full tile of `opened` with the same cells
/// and nonzeros, and its last tile with at least its cells and nonzeros (an
/// append fills it); the same record of how the dataset was made, with the
/// appends since added after those `opened` lists; and `opened`'s manifest
/// in the lineage `later` lists. A version without a lineage (an older
/// writer's) must at least record a change since `opened`: another append,
/// or another compaction. So a new conversion of the same inputs with the
/// same options, whose tiles agree with the opened ones in every size, is
/// another dataset, not a later version.
pub(super) fn is_later_version(opened: (&Manifest, &str), later: (&Manifest, &str)) -> bool {
    let ((opened, opened_sha256), (later, later_sha256)) = (opened, later);
    if opened_sha256 == later_sha256 {
        return true;
    }
    let n = opened.tile_cells.len();
    let same_layout = later.n_genes == opened.n_genes
        && later.tile_size == opened.tile_size
        && later.n_cells >= opened.n_cells
        && later.tile_cells.len() >= n
        && later.tile_nnz.len() >= n
        && opened.tile_nnz.len() == n
        && later.n_chunks == opened.n_chunks
        && later.has_gene_order == opened.has_gene_order
        && later.has_var_names == opened.has_var_names
        && later.has_var_table == opened.has_var_table
        && later.has_obs == opened.has_obs;
    if !same_layout {
        return false;
    }
    let tiles_kept = (0..n).all(|t| {
        let (cells, nnz) = (opened.tile_cells[t], opened.tile_nnz[t]);
        if t + 1 < n || cells == opened.tile_size {
            later.tile_cells[t] == cells && later.tile_nnz[t] == nnz
        } else {
            later.tile_cells[t] >= cells && later.tile_nnz[t] >= nnz
        }
    });
    tiles_kept && same_lineage((&opened.metadata, opened_sha256), &later.metadata)
}

/// The metadata keys our writers change after a conversion: the list of
/// appends (extended), the record of the last compaction (replaced), and
/// the lineage (extended).
const APPENDS: &str = "appends";
const COMPACTED: &str = "compacted";

fn same_lineage(opened: (&serde_json::Map<String, Value>, &str), later: &serde_json::Map<String, Value>) -> bool {
    let (opened, opened_sha256) = opened;
    let changed = [APPENDS, COMPACTED, format::manifest::LINEAGE_KEY];
    let made = |m: &serde_json::Map<String, Value>| -> Vec<(String, Value)> {
        let mut kept: Vec<(String, Value)> =
            m.iter().filter(|(k, _)| !changed.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
        kept.sort_by(|a, b| a.0.cmp(&b.0));
        kept
    };
    let appends = |m: &serde_json::Map<String, Value>| match m.get(APPENDS) {
        Some(Value::Array(list)) => Some(list.clone()),
        None => Some(Vec::new()),
        Some(_) => None,
    };
    let (Some(before), Some(after)) = (appends(opened), appends(later)) else {
        return false;
    };
    if made(opened) != made(later) || !after.starts_with(&before) {
        return false;
    }
    match format::manifest::lineage(later) {
        Some(lineage) => lineage.contains(&opened_sha256),
        None => after.len() > before.len() || later.get(COMPACTED) != opened.get(COMPACTED),
    }
}

/// Rows `0..rows` of `m`, the rest dropped: a tile of a later version holds
/// the opened version's cells of it first.
pub(super) fn keep_rows(m: &mut format::CsrMatrix, rows: u64) {
    let rows = rows as usize;
    if m.indptr.len() <= rows + 1 {
        return;
    }
    m.indptr.truncate(rows + 1);
    let nnz = m.indptr[rows] as usize;
    m.indices.truncate(nnz);
    m.data.truncate(nnz);
}
