//! The decoding stage: a window of units whose chunks are chosen one at a
//! time at random among all of the window's, each decompressed into its
//! byte planes (their values checked later, row by row, by the batcher that
//! writes them) and handed on as an [`OpenChunk`] with the rows the
//! share reads from it, a group of them at a time. It fetches nothing and
//! writes no batch: the stages before and after it do.

use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::RngExt;
use rand_pcg::Pcg64Mcg;
use rayon::prelude::*;

use super::buffers::{PlanesPool, MAX_DECODE_GROUP, MAX_SMALL_GROUP};
use super::fetch::Fetched;
use super::options::LoaderError;
use super::plan::{rng_for, EpochPlan, Unit};
use super::source::OpenMember;
use crate::format::tile::{ChunkPlanes, ParsedTile, TileIndex};
use crate::vocabulary::GeneMap;

/// A chunk decompressed for the batcher: its planes (decompressed, the
/// rules of their values not checked yet: the batcher checks each row as it
/// writes it), the global index of its tile's first cell, and the rows of
/// it this share reads, in the order they are to be written (the batcher
/// pops them from the end). Its planes go back to their pool when it is
/// dropped, wherever that is: spent in the batcher, or still open, queued
/// or in flight when an epoch ends.
pub(super) struct OpenChunk {
    pub(super) planes: ChunkPlanes,
    pub(super) start: u64,
    pub(super) rows: Vec<u64>,
    /// Its dataset, and the map of its columns onto the batches'.
    pub(super) member: OpenMember,
    /// Its tile and its place in it.
    tile: usize,
    chunk: usize,
    home: Arc<PlanesPool>,
}

impl OpenChunk {
    /// The map of its dataset's columns onto the batches'.
    pub(super) fn genes(&self) -> Option<&GeneMap> {
        self.member.genes.as_deref()
    }

    /// The error of a chunk a row of which broke a rule when it was
    /// written: its tile read again and the chunk decoded whole, which names
    /// the rule and the place (the planes keep no copy of the compressed
    /// bytes, which a tile's last open chunk would otherwise hold on to).
    pub(super) fn rule_error(&self) -> LoaderError {
        let dataset = &self.member.dataset;
        let decoded = dataset.fetch_checked_tile(self.tile).map_err(LoaderError::from).and_then(|(blob, expect)| {
            let tile = dataset.parse_tile_again_as(self.tile, &blob, &expect)?;
            tile.decode_planes(self.chunk, &mut ChunkPlanes::default())
                .map_err(|e| dataset.tile_error(self.tile, e))?;
            Ok(())
        });
        match decoded {
            Err(e) => e,
            Ok(()) => LoaderError::Internal(format!(
                "chunk {} of tile {} broke a rule when its rows were written, and none when it was read again \
                 (was the dataset changed while it was read?)",
                self.chunk, self.tile
            )),
        }
    }
}

impl Drop for OpenChunk {
    // (Only the spent chunks went back before: the 16-24 open or queued at
    // an epoch's end were freed, and a dataset of a few tiles faulted in
    // most of its planes again every epoch.)
    fn drop(&mut self) {
        self.home.give(std::mem::take(&mut self.planes));
    }
}

/// Chunks decompressed together, in parallel, ahead of the batcher (one per
/// thread of the pool): at most this many wait for it, and as many are being
/// decompressed.
pub(super) fn decode_group(pool: Option<&rayon::ThreadPool>) -> usize {
    pool.map_or_else(rayon::current_num_threads, |p| p.current_num_threads()).clamp(1, MAX_DECODE_GROUP)
}

/// A group of chunks decompressed together grows past one a thread, up to
/// [`MAX_SMALL_GROUP`], while it holds fewer nonzeros than this: small
/// chunks (a dataset written for random access) are then handed to the
/// threads several at a time, not two by two.
const SMALL_GROUP_NNZ: u64 = 256 << 10;

/// Runs `f` on `pool`, or on rayon's global pool when None.
pub(super) fn on<T: Send>(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() -> T + Send) -> T {
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// The rows one share reads from one chunk of one of its units.
struct Piece {
    unit: usize,
    chunk: usize,
    rows: Vec<u64>,
}

/// The decoding thread's window: the units whose chunks are still to be
/// chosen, and the bytes of every unit with a chunk still to be decoded.
struct Window {
    /// Per unit: its tile's bytes (and dataset) while a chunk of it is to be
    /// decoded, with the tile's index, checked once when it came in (a tile
    /// of 1,024 chunks parsed again for each chunk cost its epoch 3x).
    blobs: Vec<Option<(Fetched, TileIndex)>>,
    /// Per unit: how many of its chunks are still to be chosen.
    unchosen: Vec<usize>,
    /// The chunks still to be chosen, of every unit in the window.
    pending: Vec<Piece>,
    /// Units in the window (with a chunk still to be chosen).
    open: usize,
    /// The next unit to let in.
    next: usize,
}

impl Window {
    /// Lets units in, as their tiles arrive (each checked once), while fewer
    /// than `size` have chunks to choose. False when the fetcher has stopped,
    /// which it does only when the loader is dropped.
    fn admit(
        &mut self,
        size: usize,
        units: &[Unit],
        tiles: &Receiver<Result<Fetched, LoaderError>>,
    ) -> Result<bool, LoaderError> {
        while self.open < size && self.next < units.len() {
            let Ok(fetched) = tiles.recv() else {
                return Ok(false);
            };
            let fetched = fetched?;
            let u = self.next;
            let unit = &units[u];
            // (checked whole, CRC included, when it was fetched)
            let tile = fetched.member.dataset.parse_tile_again_as(unit.tile, &fetched.blob, &fetched.expect)?;
            let mut i = 0;
            for (chunk, cells) in tile.chunk_cells().enumerate() {
                let mut rows = Vec::new();
                while i < unit.rows.len() && unit.rows.get(i) < cells.end {
                    rows.push(unit.rows.get(i));
                    i += 1;
                }
                // Cells drawn several times (an epoch drawn by weight) would
                // make a chunk of the most drawn ones last longest, the
                // epoch's last batches all from it: a chunk drawn more than
                // twice its cells is read as several pieces of at most twice
                // its cells, each decompressed when chosen. (At most its
                // cells made every chunk of an epoch drawn evenly two
                // pieces, open side by side: 0.86 of random instead of 0.90,
                // at 0.77x the speed.)
                let most = 2 * (cells.end - cells.start).max(1) as usize;
                let parts = rows.len().div_ceil(most);
                if parts > 1 {
                    for part in 0..parts {
                        let rows = rows.iter().skip(part).step_by(parts).copied().collect();
                        self.pending.push(Piece { unit: u, chunk, rows });
                        self.unchosen[u] += 1;
                    }
                } else if !rows.is_empty() {
                    self.pending.push(Piece { unit: u, chunk, rows });
                    self.unchosen[u] += 1;
                }
            }
            if self.unchosen[u] > 0 {
                let index = tile.index().clone();
                self.blobs[u] = Some((fetched, index));
                self.open += 1;
            }
            self.next += 1;
        }
        Ok(true)
    }

    /// The next chunk: one of the window's at random, or, without `rng`, the
    /// first in dataset order. None when no chunk is left.
    fn choose(&mut self, rng: Option<&mut Pcg64Mcg>) -> Option<Piece> {
        if self.pending.is_empty() {
            return None;
        }
        let piece = match rng {
            Some(rng) => self.pending.swap_remove(rng.random_range(0..self.pending.len())),
            None => self.pending.remove(0),
        };
        self.unchosen[piece.unit] -= 1;
        if self.unchosen[piece.unit] == 0 {
            self.open -= 1;
        }
        Some(piece)
    }
}

/// The decoding thread. It keeps up to `window_tiles` units whose chunks are
/// not all chosen yet (their tiles checked once, when they come in, and kept
/// compressed), chooses the next chunk at random among all of theirs, and
/// lets the next unit in as soon as one has had its last chunk chosen. The
/// chosen chunks are decompressed `group` at a time (more, when they are
/// small: [`SMALL_GROUP_NNZ`]), in parallel, and handed on together, in
/// the order chosen. The choices depend only on the plan and the seed,
/// never on the threads or the timing.
pub(super) fn decode_chunks(
    plan: &EpochPlan,
    pool: Option<&rayon::ThreadPool>,
    group: usize,
    pool_of_planes: &Arc<PlanesPool>,
    tiles: Receiver<Result<Fetched, LoaderError>>,
    out: &SyncSender<Result<Vec<OpenChunk>, LoaderError>>,
) {
    let options = &plan.options;
    let units = &plan.units;
    // (Two streams: how many chunks are decompressed together must change
    // neither.)
    let mut choose = rng_for(options, "chunks", &[plan.share as u64]);
    let mut shuffle_rows = rng_for(options, "rows", &[plan.share as u64]);
    // In dataset order one tile at a time is enough.
    let size = if options.shuffle { options.window_tiles } else { 1 };
    let mut window = Window {
        blobs: vec![None; units.len()],
        unchosen: vec![0; units.len()],
        pending: Vec::new(),
        open: 0,
        next: 0,
    };
    let result = (|| -> Result<(), LoaderError> {
        loop {
            let mut chosen: Vec<Piece> = Vec::new();
            let mut nnz = 0u64;
            // (A tile that fails to come in ends the epoch after the chunks
            // chosen before it.)
            let mut failed = None;
            while chosen.len() < group || (chosen.len() < MAX_SMALL_GROUP && nnz < SMALL_GROUP_NNZ) {
                match window.admit(size, units, &tiles) {
                    Ok(true) => {}
                    Ok(false) => return Ok(()),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
                let Some(piece) = window.choose(options.shuffle.then_some(&mut choose)) else {
                    break;
                };
                nnz += window.blobs[piece.unit].as_ref().map_or(0, |(_, index)| index.chunk_nnz(piece.chunk));
                chosen.push(piece);
            }
            if chosen.is_empty() {
                return failed.map_or(Ok(()), Err);
            }
            let decoded = on(pool, || {
                chosen
                    .par_iter()
                    .map(|piece| {
                        let tile = units[piece.unit].tile;
                        let (fetched, index) = window.blobs[piece.unit].as_ref().ok_or_else(|| {
                            LoaderError::Internal("a chunk was chosen after its tile was let go".into())
                        })?;
                        let dataset = &fetched.member.dataset;
                        let parsed = ParsedTile::of_chunk(index, piece.chunk, &fetched.blob, 0)
                            .map_err(|e| dataset.tile_error(tile, e))?;
                        let mut planes = pool_of_planes.take();
                        // (The values' rules are checked row by row as the
                        // batcher writes them: a pass over the planes here
                        // read them all once more, 4% of an epoch.)
                        parsed.decompress_planes(piece.chunk, &mut planes).map_err(|e| dataset.tile_error(tile, e))?;
                        Ok(planes)
                    })
                    .collect::<Result<Vec<ChunkPlanes>, LoaderError>>()
            })?;
            // (Read before any unit is let go: a group may hold several
            // chunks of one.)
            let members: Vec<Option<OpenMember>> =
                chosen.iter().map(|p| window.blobs[p.unit].as_ref().map(|(f, _)| f.member.clone())).collect();
            let mut group_out = Vec::with_capacity(chosen.len());
            for ((piece, planes), member) in chosen.into_iter().zip(decoded).zip(members) {
                let member = member
                    .ok_or_else(|| LoaderError::Internal("a chunk was chosen after its tile was let go".into()))?;
                if window.unchosen[piece.unit] == 0 {
                    window.blobs[piece.unit] = None;
                }
                let mut rows = piece.rows;
                if options.shuffle {
                    rows.shuffle(&mut shuffle_rows);
                } else {
                    rows.reverse(); // popped from the end
                }
                let unit = &units[piece.unit];
                group_out.push(OpenChunk {
                    planes,
                    start: unit.start,
                    rows,
                    member,
                    tile: unit.tile,
                    chunk: piece.chunk,
                    home: pool_of_planes.clone(),
                });
            }
            // (One message a group: small chunks sent one by one woke the
            // batcher for each.)
            if out.send(Ok(group_out)).is_err() {
                return Ok(());
            }
            if let Some(e) = failed {
                return Err(e);
            }
        }
    })();
    if let Err(e) = result {
        let _ = out.send(Err(e));
    }
}
