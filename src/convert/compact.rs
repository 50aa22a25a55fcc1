//! Compaction: every tile of a dataset encoded again at another zstd level,
//! so that a pipeline can convert fast (a low level) and get the bytes of a
//! high level later. Encoding is a function of a tile's rows and the encoder
//! settings, so the tiles written are the ones a conversion at that level
//! writes, byte for byte.
//!
//! It is a change of the dataset like an append, and as safe: the new tiles
//! and then the new manifest are staged under `.append/` beside a record
//! (`staging.rs`), then committed. A kill at any moment leaves the old
//! dataset or the new one; running the compaction again picks up where it
//! stopped (tiles already staged are kept) or completes its commit.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde::Serialize;
use serde_json::json;

use super::error::{ConvertError, Result};
use super::staging::{
    clean_up, commit_staged, leftover, lock, now, AppendError, AppendRecord, Leftover, APPEND_PREFIX, RECORD_FORMAT,
    RECORD_KEY, STAGED_MANIFEST,
};
use super::ConvertProgress;
use crate::dataset::Dataset;
use crate::dataset::Selection;
use crate::format::{self, CsrMatrix, Manifest, TileEncoder};
use crate::storage::{Storage, Within};

/// What a compaction did.
#[derive(Clone, Debug, Serialize)]
pub struct CompactSummary {
    /// "compacted", "completed" (an interrupted compaction, finished) or
    /// "unchanged" (the dataset was already at that level).
    pub outcome: String,
    /// The level the dataset was at, and the one it is at now.
    pub level_before: i64,
    pub level: i64,
    pub n_tiles: usize,
    /// Tiles encoded by this run (fewer than `n_tiles` when a run before it
    /// had staged some).
    pub tiles_encoded: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub seconds: f64,
}

/// Encodes every tile of the dataset in `ds` again at zstd `level`, with the
/// dataset's chunks per tile; obs and the gene tables are kept as they are.
///
/// Completes an interrupted compaction first (its commit, or its staging when
/// it was to the same level). Refuses a dataset with an unfinished append.
pub fn compact(ds: Arc<dyn Storage>, level: i32, progress: &dyn ConvertProgress) -> Result<CompactSummary> {
    let started = Instant::now();
    if !(1..=22).contains(&level) {
        return Err(ConvertError::Argument(format!("zstd level {level} is outside 1..=22")));
    }
    let _lock = lock(ds.as_ref())?;
    let mut resume = false;
    match leftover(ds.as_ref())? {
        Leftover::Clean => {}
        Leftover::Finished(_) => clean_up(ds.as_ref())?,
        Leftover::Committing(record, staged) | Leftover::Staged(record, staged) if record.compact.is_some() => {
            let before = record.compact_from.unwrap_or_default();
            let manifest = commit_staged(ds.as_ref(), &staged)?;
            if record.compact == Some(level) {
                let bytes = manifest.tile_bytes.iter().sum();
                return Ok(summary("completed", before, &manifest, 0, 0, bytes, started));
            }
        }
        Leftover::Staging(record) if record.compact == Some(level) => resume = true,
        Leftover::Staging(record) if record.compact.is_some() => {
            progress.note("discarding the unfinished compaction to another level (the dataset is as it was before it)");
            clean_up(ds.as_ref())?;
        }
        Leftover::Committing(record, _) => {
            return Err(AppendError::Interrupted { location: ds.location(""), inputs: record.input_list() }.into())
        }
        Leftover::Staging(record) | Leftover::Staged(record, _) if record.sharded => {
            return Err(AppendError::Planned { location: ds.location(""), inputs: record.input_list() }.into())
        }
        Leftover::Staging(record) | Leftover::Staged(record, _) => {
            return Err(AppendError::Unfinished { location: ds.location(""), inputs: record.input_list() }.into())
        }
    }
    let dataset = Dataset::from_storage(ds.clone())?;
    let manifest = dataset.manifest().clone();
    let bytes_before: u64 = manifest.tile_bytes.iter().sum();
    if !resume && manifest.zstd_level == i64::from(level) {
        return Ok(summary("unchanged", manifest.zstd_level, &manifest, 0, bytes_before, bytes_before, started));
    }
    let staging = Within::new(ds.as_ref(), APPEND_PREFIX);
    if !resume {
        let record = AppendRecord {
            format: RECORD_FORMAT.into(),
            version: 1,
            base: dataset.manifest_sha256().to_string(),
            inputs: Vec::new(),
            matrix: String::new(),
            time: now(),
            sharded: false,
            shuffle: None,
            reading: Default::default(),
            compact: Some(level),
            compact_from: Some(manifest.zstd_level),
        };
        ds.put(RECORD_KEY, Bytes::from(serde_json::to_vec_pretty(&record)?))?;
    }
    let (tile_bytes, encoded) = stage_tiles(&dataset, &staging, level, progress)?;
    let mut after = manifest.clone();
    after.tile_bytes = tile_bytes;
    after.zstd_level = level.into();
    let note = json!({ "zstd_level": level, "from_zstd_level": manifest.zstd_level, "time": now() });
    after.metadata.insert("compacted".into(), note);
    format::manifest::extend_lineage(&mut after.metadata, dataset.manifest_sha256());
    let staged = Bytes::from(after.to_json());
    staging.put(STAGED_MANIFEST, staged.clone())?;
    let after = commit_staged(ds.as_ref(), &staged)?;
    let bytes_after = after.tile_bytes.iter().sum();
    Ok(summary("compacted", manifest.zstd_level, &after, encoded, bytes_before, bytes_after, started))
}

fn summary(
    outcome: &str,
    level_before: i64,
    after: &Manifest,
    tiles_encoded: usize,
    bytes_before: u64,
    bytes_after: u64,
    started: Instant,
) -> CompactSummary {
    CompactSummary {
        outcome: outcome.into(),
        level_before,
        level: after.zstd_level,
        n_tiles: after.tile_bytes.len(),
        tiles_encoded,
        bytes_before,
        bytes_after,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// A tile ready to be staged: found staged by a run before (its size), or
/// its rows, to encode.
enum Prepared {
    Staged(u64),
    Rows(CsrMatrix),
}

/// Stages every tile at `level` (keeping those a run before staged, each
/// written whole by the store); their sizes, and how many were encoded here.
/// The next tile is read and decoded while one is encoded.
fn stage_tiles(
    dataset: &Dataset,
    staging: &dyn Storage,
    level: i32,
    progress: &dyn ConvertProgress,
) -> Result<(Vec<u64>, usize)> {
    let manifest = dataset.manifest();
    let n_chunks = usize::try_from(manifest.n_chunks).unwrap_or(usize::MAX).min(1 << 16);
    let encoder = TileEncoder::new(n_chunks, level);
    let n_tiles = dataset.n_tiles();
    progress.phase("compacting", dataset.n_cells());
    let mut sizes = Vec::with_capacity(n_tiles);
    let mut encoded = 0;
    // A tile a run before staged is kept as it is (its size asked once);
    // any other is read, CRC-checked and decoded.
    let prepare = |tile: usize| -> Result<Prepared> {
        Ok(match staging.size(&format::tile_key(tile))? {
            Some(bytes) => Prepared::Staged(bytes),
            None => Prepared::Rows(dataset.read(Selection::Tile(tile))?),
        })
    };
    let mut next = if n_tiles > 0 { Some(prepare(0)?) } else { None };
    for tile in 0..n_tiles {
        let Some(current) = next.take() else { break };
        let fresh = matches!(current, Prepared::Rows(_));
        let (written, following) = rayon::join(
            || -> Result<u64> {
                match current {
                    Prepared::Rows(rows) => {
                        let blob = encoder.encode(&rows)?;
                        let bytes = blob.len() as u64;
                        staging.put(&format::tile_key(tile), Bytes::from(blob))?;
                        Ok(bytes)
                    }
                    Prepared::Staged(bytes) => Ok(bytes),
                }
            },
            || (tile + 1 < n_tiles).then(|| prepare(tile + 1)).transpose(),
        );
        sizes.push(written?);
        next = following?;
        if fresh {
            encoded += 1;
            abort_for_tests(encoded);
        }
        let cells = dataset.tile_cells(tile);
        progress.advance(cells.end - cells.start);
        progress.tile_done(tile, cells.end - cells.start, manifest.tile_nnz.get(tile).copied().unwrap_or(0));
    }
    Ok((sizes, encoded))
}

/// The crash tests stop the process for real (SIGABRT) once this many tiles
/// are staged; only in builds with the test-only feature `fault-injection`.
#[cfg(feature = "fault-injection")]
fn abort_for_tests(encoded: usize) {
    let after: Option<usize> =
        std::env::var("DELTACELLS_TEST_ABORT_COMPACT_AFTER").ok().and_then(|v| v.trim().parse().ok());
    if after == Some(encoded) {
        std::process::abort();
    }
}

#[cfg(not(feature = "fault-injection"))]
fn abort_for_tests(_encoded: usize) {}
