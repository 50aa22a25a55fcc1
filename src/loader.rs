//! Shuffled batches of cells for training.
//!
//! An epoch is planned first ([`EpochPlan`]): the tiles are put in an order
//! fixed by (seed, epoch), the cells to read (all, or a subset such as a train
//! split) are laid out in that order, and the sequence is cut into one
//! contiguous, equal share per (rank, worker). A share is a list of [`Unit`]s,
//! the cells it reads from one tile. Then [`Batches`] reads a share in three
//! stages, each on its own thread: one fetches the tiles of the next window of
//! `window_tiles` units (in parallel, on a rayon pool) and hands them on still
//! compressed; one shuffles the chunks of a window and decompresses them in
//! groups of `mix_chunks` (in parallel, on the pool) into their byte planes
//! ([`ChunkPlanes`], checked); one shuffles the cells of each group and writes
//! each cell straight from the planes into its batch, and the batches wait in
//! a queue of `prefetch`. No decoded tile is ever made and copied from.
//! Memory is therefore bounded by three windows of compressed tiles, two
//! groups of decompressed chunks (4 bytes per nonzero) and the batches (8),
//! never by the dataset or the number of epochs.
//!
//! This module owns the order and the pipeline; it knows nothing of Python or
//! torch. The Python package's `Dataset.batches` is a thin layer over it.

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_pcg::Pcg64Mcg;
use rayon::prelude::*;
use sha2::{Digest, Sha256};

pub use crate::buffers::{BufferPool, Pool};
use crate::format::tile::{finish_rows, ChunkPlanes};
use crate::format::CsrMatrix;
use crate::{Dataset, DatasetError};

/// How an epoch is read. `Default` gives batches of 1,024 shuffled cells, one
/// process, windows of 4 tiles, cells mixed across 4 chunks, 4 batches ready
/// ahead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoaderOptions {
    /// Cells per batch (the last batch of a share may have fewer).
    pub batch_size: usize,
    /// Shuffle tiles, chunks within each window and cells within each group
    /// of chunks; otherwise dataset order.
    pub shuffle: bool,
    /// With `epoch`, fixes every random choice.
    pub seed: u64,
    /// Another epoch gives another order.
    pub epoch: u64,
    /// This process's rank among `world_size` (distributed training).
    pub rank: usize,
    pub world_size: usize,
    /// This worker among the `num_workers` of its rank (DataLoader workers).
    pub worker: usize,
    pub num_workers: usize,
    /// Drop the cells that would make shares unequal and every share's last,
    /// partial batch, so that every share yields the same number of batches.
    pub drop_last: bool,
    /// Units (tiles, or the part of a tile a share reads) fetched together,
    /// whose chunks are shuffled together.
    pub window_tiles: usize,
    /// Chunks (of any tiles of the window) decoded together, whose cells are
    /// shuffled together: each batch is drawn from that many chunks.
    pub mix_chunks: usize,
    /// Batches made ahead of the consumer.
    pub prefetch: usize,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            batch_size: 1024,
            shuffle: true,
            seed: 0,
            epoch: 0,
            rank: 0,
            world_size: 1,
            worker: 0,
            num_workers: 1,
            drop_last: false,
            window_tiles: 4,
            mix_chunks: 4,
            prefetch: 4,
        }
    }
}

/// Why batches could not be planned or read.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// An option out of its range.
    #[error("{0}")]
    Options(String),
    /// Reading or decoding a tile (or a cell out of range in `cells`).
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// A loader thread panicked or stopped: a bug in deltacells.
    #[error("internal error (a bug in deltacells): {0}")]
    Internal(String),
}

/// The rows of a tile that one share reads, in increasing order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rows {
    /// Consecutive rows (the whole tile, or its part at a share's edge).
    Range(Range<u64>),
    /// Chosen rows (from a `cells` subset).
    List(Vec<u64>),
}

impl Rows {
    /// How many rows.
    pub fn len(&self) -> usize {
        match self {
            Rows::Range(r) => (r.end - r.start) as usize,
            Rows::List(l) => l.len(),
        }
    }

    /// No rows at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get(&self, i: usize) -> u64 {
        match self {
            Rows::Range(r) => r.start + i as u64,
            Rows::List(l) => l[i],
        }
    }
}

/// The cells one share reads from one tile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    pub tile: usize,
    pub rows: Rows,
}

/// One share of one epoch: what a (rank, worker) reads, in order.
#[derive(Clone, Debug)]
pub struct EpochPlan {
    units: Vec<Unit>,
    /// The global index of each tile's first cell.
    tile_starts: Vec<u64>,
    n_cells: u64,
    n_batches: u64,
    n_genes: u32,
    options: LoaderOptions,
    share: usize,
}

/// A seeded generator for one purpose (`what`, with its indices) of one epoch:
/// the bytes of SHA-256 over all of them, so that streams never overlap.
fn rng_for(options: &LoaderOptions, what: &str, indices: &[u64]) -> Pcg64Mcg {
    let mut hash = Sha256::new();
    hash.update(b"deltacells loader\0");
    hash.update(what.as_bytes());
    for v in [options.seed, options.epoch].iter().chain(indices) {
        hash.update(v.to_le_bytes());
    }
    let digest = hash.finalize();
    let mut seed = [0u8; 16];
    seed.copy_from_slice(&digest[..16]);
    Pcg64Mcg::from_seed(seed)
}

fn check(options: &LoaderOptions) -> Result<(), LoaderError> {
    let bad = |m: String| Err(LoaderError::Options(m));
    if options.batch_size == 0 {
        return bad("batch_size must be at least 1".into());
    }
    if options.world_size == 0 || options.rank >= options.world_size {
        return bad(format!("rank {} is not below world_size {}", options.rank, options.world_size));
    }
    if options.num_workers == 0 || options.worker >= options.num_workers {
        return bad(format!("worker {} is not below num_workers {}", options.worker, options.num_workers));
    }
    if options.window_tiles == 0 {
        return bad("window_tiles must be at least 1".into());
    }
    if options.mix_chunks == 0 {
        return bad("mix_chunks must be at least 1".into());
    }
    if options.prefetch == 0 {
        return bad("prefetch must be at least 1".into());
    }
    Ok(())
}

impl EpochPlan {
    /// Plans this share (`options.rank`, `options.worker`) of one epoch over
    /// `cells` (global indices, any order, repeats read as often as listed),
    /// or over every cell.
    ///
    /// Every share of the same epoch is planned from the same tile order, and
    /// the shares are consecutive pieces of one sequence, so that together they
    /// read every cell exactly once. Shares differ by at most one cell (none
    /// with `drop_last`, which leaves out the last `n % shares` cells).
    pub fn new(dataset: &Dataset, cells: Option<&[u64]>, options: &LoaderOptions) -> Result<EpochPlan, LoaderError> {
        check(options)?;
        let n_tiles = dataset.n_tiles();
        let tile_starts: Vec<u64> = (0..n_tiles).map(|t| dataset.tile_cells(t).start).collect();
        let mut order: Vec<usize> = (0..n_tiles).collect();
        if options.shuffle {
            order.shuffle(&mut rng_for(options, "tiles", &[]));
        }
        // Per tile, the cells read from it: all of them, or a slice of the
        // sorted subset.
        let sorted: Option<Vec<u64>> = match cells {
            None => None,
            Some(cells) => {
                let n = dataset.n_cells();
                if let Some(&cell) = cells.iter().find(|&&c| c >= n) {
                    return Err(DatasetError::CellOutOfRange { cell, n_cells: n }.into());
                }
                let mut sorted = cells.to_vec();
                sorted.sort_unstable();
                Some(sorted)
            }
        };
        let selected = |t: usize| -> Range<usize> {
            let cells = dataset.tile_cells(t);
            match &sorted {
                None => 0..(cells.end - cells.start) as usize,
                Some(s) => s.partition_point(|&c| c < cells.start)..s.partition_point(|&c| c < cells.end),
            }
        };
        let total: u64 = (0..n_tiles).map(|t| selected(t).len() as u64).sum();
        let shares = (options.world_size * options.num_workers) as u64;
        let share = options.rank * options.num_workers + options.worker;
        let s = share as u64;
        let (lo, hi) = if options.drop_last {
            let each = total / shares;
            (s * each, (s + 1) * each)
        } else {
            let at = |k: u64| (u128::from(k) * u128::from(total) / u128::from(shares)) as u64;
            (at(s), at(s + 1))
        };
        let mut units = Vec::new();
        let mut position = 0u64;
        for &tile in &order {
            let picked = selected(tile);
            let count = picked.len() as u64;
            let (a, b) = (lo.max(position), hi.min(position + count));
            if a < b {
                let (a, b) = ((a - position) as usize, (b - position) as usize);
                let rows = match &sorted {
                    None => Rows::Range(a as u64..b as u64),
                    Some(s) => {
                        let start = tile_starts[tile];
                        Rows::List(s[picked.start + a..picked.start + b].iter().map(|&c| c - start).collect())
                    }
                };
                units.push(Unit { tile, rows });
            }
            position += count;
            if position >= hi {
                break;
            }
        }
        let n_cells = hi - lo;
        let size = options.batch_size as u64;
        let n_batches = if options.drop_last { n_cells / size } else { n_cells.div_ceil(size) };
        Ok(EpochPlan {
            units,
            tile_starts,
            n_cells,
            n_batches,
            n_genes: dataset.n_genes(),
            options: options.clone(),
            share,
        })
    }

    /// What this share reads, in order.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// Cells this share yields (with `drop_last`, before its last partial batch
    /// is dropped).
    pub fn n_cells(&self) -> u64 {
        self.n_cells
    }

    /// Batches this share yields.
    pub fn n_batches(&self) -> u64 {
        self.n_batches
    }

    fn window(&self, w: usize) -> &[Unit] {
        let size = self.options.window_tiles;
        &self.units[w * size..((w + 1) * size).min(self.units.len())]
    }

    fn n_windows(&self) -> usize {
        self.units.len().div_ceil(self.options.window_tiles)
    }
}

/// The buffers a loader decompresses chunks and writes batches into, kept from one
/// epoch to the next (a new epoch then faults in no fresh memory). Clones
/// share the pools.
#[derive(Clone, Debug)]
pub struct LoaderBuffers {
    /// Decompressed chunks, for two groups.
    pub planes: Arc<PlanesPool>,
    /// Batches: two buffers per batch, for those queued and those the consumer
    /// holds (it may give them back here when it is done with them).
    pub batches: Arc<BufferPool>,
}

impl LoaderBuffers {
    /// Pools sized for `options`' windows and queue.
    pub fn new(options: &LoaderOptions) -> LoaderBuffers {
        LoaderBuffers {
            planes: Arc::new(PlanesPool::new(2 * options.mix_chunks)),
            batches: Arc::new(BufferPool::new(2 * (options.prefetch + 4))),
        }
    }
}

/// Decompressed chunks kept for reuse.
pub type PlanesPool = Pool<ChunkPlanes>;

/// One batch: the cells (global indices, in the order yielded) and their rows.
#[derive(Debug)]
pub struct LoaderBatch {
    pub cells: Vec<u64>,
    pub x: CsrMatrix,
}

/// A window's tiles, fetched, still compressed (unit i of the window is `blobs[i]`).
struct Fetched {
    blobs: Vec<bytes::Bytes>,
}

/// A group of decompressed chunks and the order of their cells (piece, row of
/// its tile): piece i is rows of `planes[i]`, of a tile whose first cell is
/// global cell `starts[i]`.
struct Group {
    planes: Vec<ChunkPlanes>,
    starts: Vec<u64>,
    order: Vec<(u32, u64)>,
}

/// The batches of one share, read on background threads. Dropping it stops
/// them (each finishes the step in hand and exits).
pub struct Batches {
    receiver: Receiver<Result<LoaderBatch, LoaderError>>,
    expected: u64,
    yielded: u64,
    failed: bool,
}

/// The text of a panic's payload.
fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a loader thread panicked".into())
}

impl Batches {
    /// Starts reading `plan`'s share of `dataset`: tiles are fetched and
    /// chunks decompressed on `pool` (rayon's global pool when None), into
    /// buffers from `buffers`, as are the batches.
    pub fn start(
        dataset: Arc<Dataset>,
        plan: EpochPlan,
        pool: Option<Arc<rayon::ThreadPool>>,
        buffers: &LoaderBuffers,
    ) -> Result<Batches, LoaderError> {
        let plan = Arc::new(plan);
        let (batch_tx, receiver) = sync_channel(plan.options.prefetch);
        // One fetched window waits while the next is fetched; a group is handed
        // over only when the batcher is ready for it, so at most two are
        // decompressed at once.
        let (fetched_tx, fetched_rx) = sync_channel::<Result<Fetched, LoaderError>>(1);
        let (group_tx, group_rx) = sync_channel::<Result<Group, LoaderError>>(0);
        let (planes, batches) = (buffers.planes.clone(), buffers.batches.clone());
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| LoaderError::Internal(format!("cannot start a loader thread: {e}")))
        };
        // Each stage runs under catch_unwind and reports a panic downstream.
        fn guarded<T>(out: SyncSender<Result<T, LoaderError>>, f: impl FnOnce(&SyncSender<Result<T, LoaderError>>)) {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| f(&out))) {
                let _ = out.send(Err(LoaderError::Internal(panic_text(panic))));
            }
        }
        {
            let (dataset, plan, pool) = (dataset.clone(), plan.clone(), pool.clone());
            spawn(
                "deltacells-fetch",
                Box::new(move || guarded(fetched_tx, |out| fetch_windows(&dataset, &plan, pool.as_deref(), out))),
            )?;
        }
        {
            let plan = plan.clone();
            let planes = planes.clone();
            spawn(
                "deltacells-decode",
                Box::new(move || {
                    guarded(group_tx, |out| decode_groups(&dataset, &plan, pool.as_deref(), &planes, fetched_rx, out))
                }),
            )?;
        }
        {
            let plan = plan.clone();
            spawn(
                "deltacells-batch",
                Box::new(move || guarded(batch_tx, |out| cut_batches(&plan, group_rx, &planes, &batches, out))),
            )?;
        }
        Ok(Batches { receiver, expected: plan.n_batches, yielded: 0, failed: false })
    }

    /// Batches this share yields in all.
    pub fn len(&self) -> u64 {
        self.expected
    }

    /// True when the share yields no batch.
    pub fn is_empty(&self) -> bool {
        self.expected == 0
    }
}

impl Iterator for Batches {
    type Item = Result<LoaderBatch, LoaderError>;

    /// The next batch, waiting for it if it is not ready; after an error, None.
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.receiver.recv() {
            Ok(Ok(batch)) => {
                self.yielded += 1;
                Some(Ok(batch))
            }
            Ok(Err(e)) => {
                self.failed = true;
                Some(Err(e))
            }
            Err(_) if self.yielded < self.expected => {
                self.failed = true;
                Some(Err(LoaderError::Internal(format!(
                    "the loader stopped after {} of {} batches",
                    self.yielded, self.expected
                ))))
            }
            Err(_) => None,
        }
    }
}

/// Runs `f` on `pool`, or on rayon's global pool when None.
fn on<T: Send>(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() -> T + Send) -> T {
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// The fetching thread: each window's tiles, read in parallel, handed on in
/// order.
fn fetch_windows(
    dataset: &Dataset,
    plan: &EpochPlan,
    pool: Option<&rayon::ThreadPool>,
    out: &SyncSender<Result<Fetched, LoaderError>>,
) {
    for w in 0..plan.n_windows() {
        let units = plan.window(w);
        let blobs = on(pool, || units.par_iter().map(|u| dataset.fetch_tile(u.tile)).collect::<Result<Vec<_>, _>>());
        let fetched = blobs.map(|blobs| Fetched { blobs }).map_err(LoaderError::from);
        let failed = fetched.is_err();
        if out.send(fetched).is_err() || failed {
            return;
        }
    }
}

/// The rows one share reads from one chunk of a unit of the window.
struct Piece {
    unit: usize,
    chunk: usize,
    rows: Vec<u64>,
}

/// The decoding thread: checks each fetched window's tiles once, splits the
/// rows read into pieces by chunk, puts the pieces in a shuffled order and
/// decompresses them in groups of `mix_chunks`, in parallel; hands each group
/// on with its cells in a shuffled order.
fn decode_groups(
    dataset: &Dataset,
    plan: &EpochPlan,
    pool: Option<&rayon::ThreadPool>,
    pool_of_planes: &PlanesPool,
    windows: Receiver<Result<Fetched, LoaderError>>,
    out: &SyncSender<Result<Group, LoaderError>>,
) {
    let options = &plan.options;
    for (w, fetched) in windows.iter().enumerate() {
        // Ok(false): the batcher has stopped listening.
        let result = (|| -> Result<bool, LoaderError> {
            let fetched = fetched?;
            let units = plan.window(w);
            let parsed = on(pool, || {
                units
                    .par_iter()
                    .zip(&fetched.blobs)
                    .map(|(u, blob)| dataset.parse_tile(u.tile, blob))
                    .collect::<Result<Vec<_>, _>>()
            })?;
            let mut pieces = Vec::new();
            for (u, (unit, tile)) in units.iter().zip(&parsed).enumerate() {
                let mut i = 0;
                for (chunk, cells) in tile.chunk_cells().enumerate() {
                    let mut rows = Vec::new();
                    while i < unit.rows.len() && unit.rows.get(i) < cells.end {
                        rows.push(unit.rows.get(i));
                        i += 1;
                    }
                    if !rows.is_empty() {
                        pieces.push(Piece { unit: u, chunk, rows });
                    }
                }
            }
            if options.shuffle {
                pieces.shuffle(&mut rng_for(options, "chunks", &[plan.share as u64, w as u64]));
            }
            for (g, group) in pieces.chunks(options.mix_chunks).enumerate() {
                let decoded = on(pool, || {
                    group
                        .par_iter()
                        .map(|piece| {
                            let mut planes = pool_of_planes.take();
                            let tile = units[piece.unit].tile;
                            parsed[piece.unit]
                                .decode_planes(piece.chunk, &mut planes)
                                .map_err(|e| dataset.tile_error(tile, e))?;
                            Ok(planes)
                        })
                        .collect::<Result<Vec<ChunkPlanes>, DatasetError>>()
                })?;
                let mut order: Vec<(u32, u64)> = group
                    .iter()
                    .enumerate()
                    .flat_map(|(p, piece)| piece.rows.iter().map(move |&r| (p as u32, r)))
                    .collect();
                if options.shuffle {
                    order.shuffle(&mut rng_for(options, "cells", &[plan.share as u64, w as u64, g as u64]));
                }
                let starts = group.iter().map(|piece| plan.tile_starts[units[piece.unit].tile]).collect();
                if out.send(Ok(Group { planes: decoded, starts, order })).is_err() {
                    return Ok(false);
                }
            }
            Ok(true)
        })();
        match result {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                let _ = out.send(Err(e));
                return;
            }
        }
    }
}

/// The batching thread: cuts the groups' cells, in their order, into batches
/// (a batch may span two groups), writing each cell straight from its chunk's
/// planes into buffers from `buffers`; gives each group's planes back when it
/// is done.
fn cut_batches(
    plan: &EpochPlan,
    groups: Receiver<Result<Group, LoaderError>>,
    pool_of_planes: &PlanesPool,
    buffers: &BufferPool,
    out: &SyncSender<Result<LoaderBatch, LoaderError>>,
) {
    let size = plan.options.batch_size;
    // A batch's buffers come back with old values: they are resized only to
    // grow (new room is zeroed once), written up to `filled`, cut there.
    let new_batch = || {
        let mut x = buffers.take_matrix();
        x.n_cols = plan.n_genes;
        x.indptr = Vec::with_capacity(size + 1);
        x.indptr.push(0);
        LoaderBatch { cells: Vec::with_capacity(size), x }
    };
    let send = |mut batch: LoaderBatch| {
        let filled = *batch.x.indptr.last().expect("indptr starts at 0") as usize;
        batch.x.indices.truncate(filled);
        batch.x.data.truncate(filled);
        finish_rows();
        out.send(Ok(batch)).is_ok()
    };
    let mut batch: Option<LoaderBatch> = None;
    let mut sent = 0u64;
    for group in groups.iter() {
        let group = match group {
            Ok(group) => group,
            Err(e) => {
                let _ = out.send(Err(e));
                return;
            }
        };
        let mut at = 0;
        while at < group.order.len() {
            let current = batch.get_or_insert_with(new_batch);
            let take = (size - current.cells.len()).min(group.order.len() - at);
            let rows = &group.order[at..at + take];
            let mut filled = *current.x.indptr.last().expect("indptr starts at 0") as usize;
            let nnz: usize = rows.iter().map(|&(p, row)| group.planes[p as usize].row_nnz(row)).sum();
            let x = &mut current.x;
            // (The two buffers may come from different batches, with different lengths.)
            for buffer in [&mut x.indices, &mut x.data] {
                if buffer.len() < filled + nnz {
                    buffer.resize(filled + nnz, 0);
                }
            }
            for &(p, row) in rows {
                let planes = &group.planes[p as usize];
                let n = planes.row_nnz(row);
                planes.write_row(row, &mut x.indices[filled..filled + n], &mut x.data[filled..filled + n]);
                filled += n;
                x.indptr.push(filled as u64);
                current.cells.push(group.starts[p as usize] + row);
            }
            at += take;
            if current.cells.len() == size {
                sent += 1;
                // After the last batch (with drop_last, before the cells it
                // leaves out) the other stages are stopped by dropping their
                // channels.
                if !send(batch.take().expect("a batch is being filled")) || sent == plan.n_batches {
                    return;
                }
            }
        }
        for planes in group.planes {
            pool_of_planes.give(planes);
        }
    }
    if let Some(last) = batch.filter(|b| !b.cells.is_empty() && sent < plan.n_batches) {
        send(last);
    }
}

#[cfg(test)]
mod tests;
