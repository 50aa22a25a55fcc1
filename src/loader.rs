//! Shuffled batches of cells for training.
//!
//! An epoch is planned first ([`EpochPlan`]): the tiles are put in an order
//! fixed by (seed, epoch), the cells to read (all, a subset such as a train
//! split, or cells drawn by weight) are laid out in that order, and the
//! sequence is cut into one contiguous, equal share per (rank, worker). A
//! share is a list of [`Unit`]s, the cells it reads from one tile. Then
//! [`Batches`] reads a share in three stages, each on its own thread: one
//! fetches the share's tiles in order and hands them on still compressed;
//! one keeps a window of `window_tiles` tiles, chooses their chunks one at a
//! time at random among all of the window's (a tile leaves the window when its
//! last chunk is chosen, and the next one comes in), and decompresses them
//! into their byte planes ([`ChunkPlanes`], checked); one keeps `mix_chunks`
//! decompressed chunks open and writes each cell of a batch straight from the
//! planes of one of them, chosen uniformly at random (so the open chunks give
//! a batch about equal numbers of cells), so that a batch draws on
//! `mix_chunks` chunks from anywhere in the window. No decoded tile is ever
//! made and copied from.
//!
//! Memory is bounded by the window and a few tiles fetched ahead (compressed),
//! the open chunks and a few decompressed ahead (4 bytes per nonzero) and the
//! batches (8), never by the dataset or the number of epochs.
//!
//! How well batches mix depends on how the dataset was written: a dataset whose
//! inputs were one sample after another holds each sample in a few tiles, so
//! a batch holds the samples of its window's tiles. `benches/shuffle_quality.py`
//! measures it.
//!
//! This module owns the order and the pipeline; it knows nothing of Python or
//! torch. The Python package's `Dataset.batches` is a thin layer over it.

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use rayon::prelude::*;
use sha2::{Digest, Sha256};

pub use crate::batch::BatchOutput;
use crate::batch::{CellWriter, FormedBatch, OutputError};
pub use crate::buffers::{BufferPool, FloatPool, Pool};
use crate::format::tile::{finish_rows, ChunkPlanes};
use crate::format::CsrMatrix;
use crate::vocabulary::GeneMap;
use crate::{Dataset, DatasetError};

/// How an epoch is read. `Default` gives batches of 1,024 shuffled cells, one
/// process, a window of 8 tiles, each batch drawn from 16 open chunks, 4
/// batches ready ahead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoaderOptions {
    /// Cells per batch (the last batch of a share may have fewer).
    pub batch_size: usize,
    /// Shuffle tiles, the chunks of the window and the cells of the open
    /// chunks; otherwise dataset order.
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
    /// Units (tiles, or the part of a tile a share reads) whose chunks are
    /// chosen from at random: the window, kept compressed.
    pub window_tiles: usize,
    /// Decompressed chunks (of any tiles of the window) open at once, whose
    /// cells are drawn at random: each batch draws on that many chunks.
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
            window_tiles: 8,
            mix_chunks: 16,
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
    /// A dataset of a collection could not be opened, or changed since the
    /// collection was made (the message names it).
    #[error("{0}")]
    Member(String),
}

impl From<OutputError> for LoaderError {
    fn from(e: OutputError) -> Self {
        LoaderError::Options(e.to_string())
    }
}

/// What a loader reads: the datasets of a cell space, one after another (one
/// dataset, or the datasets of a [`crate::collection::Collection`]), each
/// opened when a share first reads from it.
pub trait TileSource: Send + Sync {
    /// The datasets.
    fn n_members(&self) -> usize;
    /// The cell space's index of dataset `member`'s first cell.
    fn member_start(&self, member: usize) -> u64;
    /// Dataset `member`'s tiles, as the first cell after each (its own
    /// indices: cumulative cells per tile).
    fn tile_limits(&self, member: usize) -> &[u64];
    /// Dataset `member`, opened (once) if it is not yet, with the map of its
    /// stored columns onto the batches' (None: the batches' columns are its
    /// stored ones).
    fn open_member(&self, member: usize) -> Result<OpenMember, LoaderError>;
    /// Checks `output` against the source; the columns of its batches.
    fn check_output(&self, output: &BatchOutput) -> Result<u32, LoaderError>;
    /// Whether cells are mapped onto the batches' columns.
    fn maps_cells(&self, output: &BatchOutput) -> bool;
}

/// A dataset of a [`TileSource`], open, with its map onto the batches' columns.
#[derive(Clone)]
pub struct OpenMember {
    pub dataset: Arc<Dataset>,
    pub genes: Option<Arc<GeneMap>>,
}

/// One dataset as a [`TileSource`], in the columns of its output's vocabulary.
struct OneDataset {
    dataset: Arc<Dataset>,
    genes: Option<Arc<GeneMap>>,
}

impl TileSource for OneDataset {
    fn n_members(&self) -> usize {
        1
    }

    fn member_start(&self, _: usize) -> u64 {
        0
    }

    fn tile_limits(&self, _: usize) -> &[u64] {
        self.dataset.tile_limits()
    }

    fn open_member(&self, _: usize) -> Result<OpenMember, LoaderError> {
        Ok(OpenMember { dataset: self.dataset.clone(), genes: self.genes.clone() })
    }

    fn check_output(&self, output: &BatchOutput) -> Result<u32, LoaderError> {
        let n_genes = self.dataset.n_genes();
        output.check(n_genes)?;
        Ok(output.n_cols(n_genes))
    }

    fn maps_cells(&self, output: &BatchOutput) -> bool {
        output.genes.is_some()
    }
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
    /// The dataset (0 for a loader over one dataset).
    pub member: usize,
    /// The tile, of that dataset.
    pub tile: usize,
    /// The cell space's index of the tile's first cell.
    pub start: u64,
    pub rows: Rows,
}

/// One share of one epoch: what a (rank, worker) reads, in order.
#[derive(Clone, Debug)]
pub struct EpochPlan {
    units: Vec<Unit>,
    n_cells: u64,
    n_batches: u64,
    options: LoaderOptions,
    share: usize,
}

/// The most batches made ahead of the consumer (the queue is reserved at its
/// size).
pub const MAX_PREFETCH: usize = 1024;

/// A seeded generator for one purpose (`what`, with its indices) of one epoch:
/// the bytes of SHA-256 over all of them, so that streams never overlap.
pub(crate) fn rng_for(options: &LoaderOptions, what: &str, indices: &[u64]) -> Pcg64Mcg {
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
    if options.prefetch == 0 || options.prefetch > MAX_PREFETCH {
        return bad(format!("prefetch must be from 1 to {MAX_PREFETCH}, not {}", options.prefetch));
    }
    if options.world_size.checked_mul(options.num_workers).is_none() {
        return bad(format!(
            "world_size {} times num_workers {} is too large",
            options.world_size, options.num_workers
        ));
    }
    Ok(())
}

/// The most draws an epoch sampled by weight may make, per cell that has a
/// weight: the draws are held in memory (8 bytes each) by every share.
pub const MAX_DRAWS_PER_CELL: u64 = 100;

/// Draws `n` cells with replacement, each with probability in proportion to
/// its weight: `weights` has one per cell of `cells`, or one per cell of the
/// dataset (of `n_cells`) when `cells` is None. The draws are fixed by the
/// seed and epoch of `options` (not by rank or worker): every share draws the
/// same cells, and [`EpochPlan::new`] then gives each its part of them.
///
/// Refused, naming the argument: weights of the wrong length, a weight that is
/// negative or not finite, weights that are all zero, and more than
/// [`MAX_DRAWS_PER_CELL`] draws per cell with a weight.
pub fn draw_by_weight(
    n_cells: u64,
    cells: Option<&[u64]>,
    weights: &[f64],
    n: u64,
    options: &LoaderOptions,
) -> Result<Vec<u64>, LoaderError> {
    let bad = |m: String| Err(LoaderError::Options(m));
    let expected = cells.map_or(n_cells, |c| c.len() as u64);
    if weights.len() as u64 != expected {
        let of = if cells.is_some() { "cell of cells" } else { "cell of the dataset" };
        return bad(format!("weights has {} values, not one per {of} ({expected})", weights.len()));
    }
    if let Some((i, w)) = weights.iter().enumerate().find(|(_, w)| !(w.is_finite() && **w >= 0.0)) {
        return bad(format!("weights[{i}] is {w}: weights must be finite and not negative"));
    }
    let positive = weights.iter().filter(|&&w| w > 0.0).count() as u64;
    if positive == 0 {
        return bad("weights are all zero: no cell can be drawn".into());
    }
    if n > positive.saturating_mul(MAX_DRAWS_PER_CELL) {
        return bad(format!(
            "num_samples {n} is more than {MAX_DRAWS_PER_CELL} draws for each of the {positive} cells with a weight"
        ));
    }
    let mut total = 0.0;
    let cumulative: Vec<f64> = weights
        .iter()
        .map(|w| {
            total += w;
            total
        })
        .collect();
    let last = weights.iter().rposition(|&w| w > 0.0).unwrap_or(0);
    let mut rng = rng_for(options, "draws", &[]);
    Ok((0..n)
        .map(|_| {
            let u = rng.random::<f64>() * total;
            // The first cell whose cumulative weight passes u: never one of
            // weight zero (its cumulative weight equals the one before).
            let i = cumulative.partition_point(|&c| c <= u).min(last);
            cells.map_or(i as u64, |c| c[i])
        })
        .collect())
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
        EpochPlan::of_tiles(&[(0, dataset.tile_limits())], cells, options)
    }

    /// [`EpochPlan::new`] over the datasets of `source`, one after another
    /// (`cells` in its cell space): the tiles of all of them are put in one
    /// order, so that a window holds tiles of any of them.
    pub fn over(
        source: &dyn TileSource,
        cells: Option<&[u64]>,
        options: &LoaderOptions,
    ) -> Result<EpochPlan, LoaderError> {
        let members: Vec<(u64, &[u64])> =
            (0..source.n_members()).map(|m| (source.member_start(m), source.tile_limits(m))).collect();
        EpochPlan::of_tiles(&members, cells, options)
    }

    /// The plan over datasets given as (first cell, tile limits).
    fn of_tiles(
        members: &[(u64, &[u64])],
        cells: Option<&[u64]>,
        options: &LoaderOptions,
    ) -> Result<EpochPlan, LoaderError> {
        check(options)?;
        // Every tile of every dataset: (dataset, tile, first cell, cells).
        let mut tiles: Vec<(usize, usize, u64, u64)> = Vec::new();
        for (m, &(first, limits)) in members.iter().enumerate() {
            let mut previous = 0;
            for (t, &limit) in limits.iter().enumerate() {
                tiles.push((m, t, first + previous, limit - previous));
                previous = limit;
            }
        }
        let n = members.last().map_or(0, |&(first, limits)| first + limits.last().copied().unwrap_or(0));
        let mut order: Vec<usize> = (0..tiles.len()).collect();
        if options.shuffle {
            order.shuffle(&mut rng_for(options, "tiles", &[]));
        }
        // Per tile, the cells read from it: all of them, or a slice of the
        // sorted subset.
        let sorted: Option<Vec<u64>> = match cells {
            None => None,
            Some(cells) => {
                if let Some(&cell) = cells.iter().find(|&&c| c >= n) {
                    return Err(DatasetError::CellOutOfRange { cell, n_cells: n }.into());
                }
                let mut sorted = cells.to_vec();
                sorted.sort_unstable();
                Some(sorted)
            }
        };
        let selected = |g: usize| -> Range<usize> {
            let (_, _, start, count) = tiles[g];
            match &sorted {
                None => 0..count as usize,
                Some(s) => s.partition_point(|&c| c < start)..s.partition_point(|&c| c < start + count),
            }
        };
        let total: u64 = (0..tiles.len()).map(|g| selected(g).len() as u64).sum();
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
        for &g in &order {
            let picked = selected(g);
            let count = picked.len() as u64;
            let (a, b) = (lo.max(position), hi.min(position + count));
            if a < b {
                let (a, b) = ((a - position) as usize, (b - position) as usize);
                let (member, tile, start, _) = tiles[g];
                let rows = match &sorted {
                    None => Rows::Range(a as u64..b as u64),
                    Some(s) => Rows::List(s[picked.start + a..picked.start + b].iter().map(|&c| c - start).collect()),
                };
                units.push(Unit { member, tile, start, rows });
            }
            position += count;
            if position >= hi {
                break;
            }
        }
        let n_cells = hi - lo;
        let size = options.batch_size as u64;
        let n_batches = if options.drop_last { n_cells / size } else { n_cells.div_ceil(size) };
        Ok(EpochPlan { units, n_cells, n_batches, options: options.clone(), share })
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
}

/// The buffers a loader decompresses chunks and writes batches into, kept from one
/// epoch to the next (a new epoch then faults in no fresh memory). Clones
/// share the pools.
#[derive(Clone, Debug)]
pub struct LoaderBuffers {
    /// Decompressed chunks: those open in the batcher and those decompressed
    /// ahead of it.
    pub planes: Arc<PlanesPool>,
    /// Batches: two buffers per batch, for those queued and those the consumer
    /// holds (it may give them back here when it is done with them).
    pub batches: Arc<BufferPool>,
    /// Scaled values of batches, one buffer per batch, likewise.
    pub values: Arc<FloatPool>,
}

impl LoaderBuffers {
    /// Pools sized for `options`' windows and queue.
    pub fn new(options: &LoaderOptions) -> LoaderBuffers {
        LoaderBuffers {
            // (pools keep at most this many; none is reserved ahead, and
            // the options' extremes do not overflow)
            planes: Arc::new(PlanesPool::new(options.mix_chunks.saturating_add(2 * MAX_DECODE_GROUP))),
            batches: Arc::new(BufferPool::new(options.prefetch.saturating_add(4).saturating_mul(2))),
            values: Arc::new(FloatPool::new(options.prefetch.saturating_add(4))),
        }
    }
}

/// Decompressed chunks kept for reuse.
pub type PlanesPool = Pool<ChunkPlanes>;

/// One batch: the cells (global indices, in the order yielded) and their
/// rows, in the form of the [`BatchOutput`] the batches were started with
/// (see [`crate::batch::FormedBatch`] for which fields hold what).
#[derive(Debug)]
pub struct LoaderBatch {
    pub cells: Vec<u64>,
    /// CSR: counts, or (scaled) the row offsets and columns of `values`.
    pub x: CsrMatrix,
    /// Scaled values (CSR beside `x.indices`, or dense); empty for counts.
    pub values: Vec<f32>,
    /// Dense counts, `cells x x.n_cols`, row-major; empty unless dense.
    pub dense_counts: Vec<u32>,
    /// The top-k output columns of each cell (`cells x k`, -1 padded), and
    /// their values; empty without top-k.
    pub top_k: Vec<i32>,
    pub top_k_values: Vec<f32>,
}

/// A chunk decompressed for the batcher: its planes, the global index of its
/// tile's first cell, and the rows of it this share reads, in the order they
/// are to be written (the batcher pops them from the end).
struct OpenChunk {
    planes: ChunkPlanes,
    start: u64,
    rows: Vec<u64>,
    /// The map of its dataset's columns onto the batches'.
    genes: Option<Arc<GeneMap>>,
}

/// A tile fetched, still compressed, with its dataset.
#[derive(Clone)]
struct Fetched {
    blob: bytes::Bytes,
    member: OpenMember,
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

/// Tiles fetched together, in parallel, each on a thread of its own
/// (requests in flight to a bucket: through a link of 50 ms a request and
/// 100 MB/s, 4 so read 88,500 cells/s where 2 on the decoding pool read
/// 64,500; benches/bucket.py).
const FETCH_GROUP: usize = 4;

/// Tiles fetched and waiting for the decoding thread, at most.
const TILES_WAITING: usize = 2;

/// The most chunks decompressed together, in parallel, ahead of the batcher.
const MAX_DECODE_GROUP: usize = 8;

/// Chunks decompressed together, in parallel, ahead of the batcher (one per
/// thread of the pool): at most this many wait for it, and as many are being
/// decompressed.
fn decode_group(pool: Option<&rayon::ThreadPool>) -> usize {
    pool.map_or_else(rayon::current_num_threads, |p| p.current_num_threads()).clamp(1, MAX_DECODE_GROUP)
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
        Batches::start_with(dataset, plan, pool, buffers, BatchOutput::default())
    }

    /// [`Batches::start`], with batches in the form `output` says (a gene
    /// vocabulary, applied to each cell as the batcher writes it).
    pub fn start_with(
        dataset: Arc<Dataset>,
        plan: EpochPlan,
        pool: Option<Arc<rayon::ThreadPool>>,
        buffers: &LoaderBuffers,
        output: BatchOutput,
    ) -> Result<Batches, LoaderError> {
        let source = Arc::new(OneDataset { dataset, genes: output.genes.clone() });
        Batches::start_over(source, plan, pool, buffers, output)
    }

    /// [`Batches::start_with`] over the datasets of `source` (a plan made by
    /// [`EpochPlan::over`] of it), each opened when the share first reads a
    /// tile of it and written in the batches' columns by its own map.
    pub fn start_over(
        source: Arc<dyn TileSource>,
        plan: EpochPlan,
        pool: Option<Arc<rayon::ThreadPool>>,
        buffers: &LoaderBuffers,
        output: BatchOutput,
    ) -> Result<Batches, LoaderError> {
        let n_cols = source.check_output(&output)?;
        output.check_rows((plan.options.batch_size as u64).min(plan.n_cells()), n_cols)?;
        let mapped = source.maps_cells(&output);
        let plan = Arc::new(plan);
        let group = decode_group(pool.as_deref());
        let (batch_tx, receiver) = sync_channel(plan.options.prefetch);
        let (tile_tx, tile_rx) = sync_channel::<Result<Fetched, LoaderError>>(TILES_WAITING);
        let (chunk_tx, chunk_rx) = sync_channel::<Result<OpenChunk, LoaderError>>(group);
        let (planes, batches, values) = (buffers.planes.clone(), buffers.batches.clone(), buffers.values.clone());
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
            let plan = plan.clone();
            spawn(
                "deltacells-fetch",
                Box::new(move || guarded(tile_tx, |out| fetch_tiles(source.as_ref(), &plan, out))),
            )?;
        }
        {
            let (plan, pool) = (plan.clone(), pool.clone());
            let planes = planes.clone();
            spawn(
                "deltacells-decode",
                Box::new(move || {
                    guarded(chunk_tx, |out| decode_chunks(&plan, pool.as_deref(), group, &planes, tile_rx, out))
                }),
            )?;
        }
        {
            let plan = plan.clone();
            spawn(
                "deltacells-batch",
                Box::new(move || {
                    guarded(batch_tx, |out| {
                        let writer = CellWriter::with_columns(&output, n_cols, mapped);
                        cut_batches(&plan, writer, chunk_rx, &planes, (&batches, &values), pool.as_deref(), out)
                    })
                }),
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

/// The fetching thread: the share's tiles in plan order, still compressed,
/// [`FETCH_GROUP`] at a time in parallel, each dataset opened when a tile of
/// it first comes up.
fn fetch_tiles(source: &dyn TileSource, plan: &EpochPlan, out: &SyncSender<Result<Fetched, LoaderError>>) {
    let mut opened: Vec<Option<OpenMember>> = vec![None; source.n_members()];
    for units in plan.units.chunks(FETCH_GROUP) {
        let members: Result<Vec<OpenMember>, LoaderError> = units
            .iter()
            .map(|u| match &opened[u.member] {
                Some(m) => Ok(m.clone()),
                None => {
                    let m = source.open_member(u.member)?;
                    opened[u.member] = Some(m.clone());
                    Ok(m)
                }
            })
            .collect();
        // Each tile of the group on a thread of its own: a fetch waits on
        // the store, not on a core, and must not queue behind the chunks
        // being decompressed on the pool.
        let fetched = members.and_then(|members| {
            let fetch = |u: &Unit, member: OpenMember| Ok(Fetched { blob: member.dataset.fetch_tile(u.tile)?, member });
            std::thread::scope(|scope| {
                // (A thread that cannot be started leaves its tile to be
                // fetched here, after the others.)
                let started: Vec<_> = units
                    .iter()
                    .zip(members)
                    .map(|(u, member)| {
                        let m = member.clone();
                        std::thread::Builder::new().spawn_scoped(scope, move || fetch(u, m)).map_err(|_| (u, member))
                    })
                    .collect();
                started
                    .into_iter()
                    .map(|s| match s {
                        Ok(thread) => {
                            thread.join().unwrap_or_else(|panic| Err(LoaderError::Internal(panic_text(panic))))
                        }
                        Err((u, member)) => fetch(u, member),
                    })
                    .collect::<Result<Vec<_>, LoaderError>>()
            })
        });
        match fetched {
            Ok(fetched) => {
                for f in fetched {
                    if out.send(Ok(f)).is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = out.send(Err(e));
                return;
            }
        }
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
    /// decoded.
    blobs: Vec<Option<Fetched>>,
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
            let tile = fetched.member.dataset.parse_tile(unit.tile, &fetched.blob)?;
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
                self.blobs[u] = Some(fetched);
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
/// chosen chunks are decompressed `group` at a time, in parallel, and handed
/// on in the order chosen. The choices depend only on the plan and the seed,
/// never on the threads or the timing.
fn decode_chunks(
    plan: &EpochPlan,
    pool: Option<&rayon::ThreadPool>,
    group: usize,
    pool_of_planes: &PlanesPool,
    tiles: Receiver<Result<Fetched, LoaderError>>,
    out: &SyncSender<Result<OpenChunk, LoaderError>>,
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
            let mut chosen: Vec<Piece> = Vec::with_capacity(group);
            while chosen.len() < group {
                if !window.admit(size, units, &tiles)? {
                    return Ok(());
                }
                let Some(piece) = window.choose(options.shuffle.then_some(&mut choose)) else {
                    break;
                };
                chosen.push(piece);
            }
            if chosen.is_empty() {
                return Ok(());
            }
            let decoded = on(pool, || {
                chosen
                    .par_iter()
                    .map(|piece| {
                        let tile = units[piece.unit].tile;
                        let fetched = window.blobs[piece.unit].as_ref().ok_or_else(|| {
                            LoaderError::Internal("a chunk was chosen after its tile was let go".into())
                        })?;
                        let dataset = &fetched.member.dataset;
                        let parsed = dataset.parse_tile_again(tile, &fetched.blob)?;
                        let mut planes = pool_of_planes.take();
                        parsed.decode_planes(piece.chunk, &mut planes).map_err(|e| dataset.tile_error(tile, e))?;
                        Ok(planes)
                    })
                    .collect::<Result<Vec<ChunkPlanes>, LoaderError>>()
            })?;
            // (Read before any unit is let go: a group may hold several
            // chunks of one.)
            let maps: Vec<Option<Arc<GeneMap>>> =
                chosen.iter().map(|p| window.blobs[p.unit].as_ref().and_then(|f| f.member.genes.clone())).collect();
            for ((piece, planes), genes) in chosen.into_iter().zip(decoded).zip(maps) {
                if window.unchosen[piece.unit] == 0 {
                    window.blobs[piece.unit] = None;
                }
                let mut rows = piece.rows;
                if options.shuffle {
                    rows.shuffle(&mut shuffle_rows);
                } else {
                    rows.reverse(); // popped from the end
                }
                let start = units[piece.unit].start;
                if out.send(Ok(OpenChunk { planes, start, rows, genes })).is_err() {
                    return Ok(());
                }
            }
        }
    })();
    if let Err(e) = result {
        let _ = out.send(Err(e));
    }
}

/// A cell drawn for the batch being made: the chunk it is in (its slot in
/// the batcher's `held` chunks), its row and its nonzeros.
struct Drawn {
    chunk: usize,
    row: u64,
    nnz: usize,
}

/// Cells written by one task when a batch's rows are written in parallel.
const ROWS_PER_TASK: usize = 128;

/// The batching thread. It keeps `mix_chunks` decompressed chunks open and
/// draws each batch's cells one at a time, each from an open chunk chosen
/// uniformly at random; a chunk with no cells left is replaced by the next
/// one decompressed (and given back once the batch holding its last cells is
/// written). (Drawing each chunk equally often mixes a batch better than
/// drawing each remaining cell equally often, which gives the nearly spent
/// chunks few cells: 0.90 of random against 0.81 at the defaults, in
/// benches/shuffle_quality.py.) Then the batch's rows are written straight
/// from the chunks' planes into buffers from `buffers`: counts in stored
/// columns on the threads of `pool` at once, each row at its place; any
/// other form one cell after another, as [`CellWriter`] makes it.
fn cut_batches(
    plan: &EpochPlan,
    mut writer: CellWriter<'_>,
    chunks: Receiver<Result<OpenChunk, LoaderError>>,
    pool_of_planes: &PlanesPool,
    (buffers, floats): (&BufferPool, &FloatPool),
    pool: Option<&rayon::ThreadPool>,
    out: &SyncSender<Result<LoaderBatch, LoaderError>>,
) {
    let options = &plan.options;
    let size = options.batch_size;
    let mut rng = rng_for(options, "cells", &[plan.share as u64]);
    // (Reserved for the cells a batch can hold, not for what batch_size asks.)
    let cells_in_batch = size.min(usize::try_from(plan.n_cells).unwrap_or(usize::MAX));
    let new_batch = |writer: &CellWriter| {
        let (counts, values) = if writer.output().dense && !writer.output().scaled() {
            (buffers.take(), Vec::new())
        } else if writer.output().scaled() {
            (Vec::new(), floats.take())
        } else {
            (Vec::new(), Vec::new())
        };
        writer.start_with(buffers.take_matrix(), counts, values, cells_in_batch)
    };
    let send = |writer: &CellWriter, cells: Vec<u64>, mut batch: FormedBatch| {
        writer.finish(&mut batch);
        finish_rows();
        let FormedBatch { x, values, dense_counts, top_k, top_k_values, .. } = batch;
        out.send(Ok(LoaderBatch { cells, x, values, dense_counts, top_k, top_k_values })).is_ok()
    };
    // In dataset order one open chunk is enough.
    let mix = if options.shuffle { options.mix_chunks } else { 1 };
    // Chunks by slot: those with cells left (`open`, in the order they
    // came), and those spent, kept until the batch being drawn is written.
    let mut held: Vec<Option<OpenChunk>> = Vec::new();
    let (mut open, mut spent, mut free): (Vec<usize>, Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new(), Vec::new());
    let mut exhausted = false;
    // An error from upstream ends the epoch after the full batches the open
    // chunks still make.
    let mut failure: Option<LoaderError> = None;
    let mut drawn_cells: Vec<Drawn> = Vec::with_capacity(cells_in_batch);
    let mut sent = 0u64;
    // The chunks open at first come in one by one, a chunk's cells divided
    // by `mix` draws apart, so that they do not all run out at once (they are
    // drawn equally often): one is then replaced every so many cells, and
    // the decoding keeps up, instead of the batcher waiting for `mix` new
    // chunks together.
    let (mut drawn, mut stagger) = (0usize, 0usize);
    loop {
        let allowed = drawn.checked_div(stagger).map_or(1, |d| mix.min(1 + d));
        while open.len() < allowed && !exhausted {
            match chunks.recv() {
                Ok(Ok(chunk)) => {
                    if stagger == 0 {
                        stagger = (chunk.rows.len() / mix).max(1);
                    }
                    let slot = free.pop().unwrap_or_else(|| {
                        held.push(None);
                        held.len() - 1
                    });
                    held[slot] = Some(chunk);
                    open.push(slot);
                }
                Ok(Err(e)) => {
                    failure = Some(e);
                    exhausted = true;
                }
                Err(_) => exhausted = true,
            }
        }
        if open.is_empty() {
            break;
        }
        let at = if options.shuffle { rng.random_range(0..open.len()) } else { 0 };
        let slot = open[at];
        let chunk = held[slot].as_mut().expect("open chunks are held");
        let row = chunk.rows.pop().expect("open chunks have cells left");
        drawn += 1;
        drawn_cells.push(Drawn { chunk: slot, row, nnz: chunk.planes.row_nnz(row) });
        if chunk.rows.is_empty() {
            spent.push(open.remove(at));
        }
        if drawn_cells.len() == size {
            let batch = new_batch(&writer);
            let (cells, batch) = write_batch(&mut writer, &held, &drawn_cells, batch, pool);
            drawn_cells.clear();
            for slot in spent.drain(..) {
                if let Some(chunk) = held[slot].take() {
                    pool_of_planes.give(chunk.planes);
                }
                free.push(slot);
            }
            sent += 1;
            // After the last batch (with drop_last, before the cells it
            // leaves out) the other stages are stopped by dropping their
            // channels.
            if !send(&writer, cells, batch) || sent == plan.n_batches {
                return;
            }
        }
    }
    if let Some(e) = failure {
        let _ = out.send(Err(e));
        return;
    }
    if !drawn_cells.is_empty() && sent < plan.n_batches {
        let batch = new_batch(&writer);
        let (cells, batch) = write_batch(&mut writer, &held, &drawn_cells, batch, pool);
        send(&writer, cells, batch);
    }
}

/// Writes the cells `drawn` (in that order) into `batch`, from the planes
/// of the `held` chunks; returns their global indices and the batch.
fn write_batch(
    writer: &mut CellWriter<'_>,
    held: &[Option<OpenChunk>],
    drawn: &[Drawn],
    mut batch: FormedBatch,
    pool: Option<&rayon::ThreadPool>,
) -> (Vec<u64>, FormedBatch) {
    let chunk = |d: &Drawn| held[d.chunk].as_ref().expect("a drawn cell's chunk is held until its batch is written");
    let cells: Vec<u64> = drawn.iter().map(|d| chunk(d).start + d.row).collect();
    // Buffers come back from earlier batches with old values: they are
    // resized only to grow (only the new room is zeroed: growing by half
    // at a time zeroed half a batch every other batch), written up to what
    // the batch fills, and cut there by CellWriter::finish.
    let grow = |buffer: &mut Vec<u32>, to: usize| {
        if buffer.len() < to {
            if buffer.capacity() < to {
                buffer.reserve(to + to / 2 - buffer.len());
            }
            buffer.resize(to, 0);
        }
    };
    if !writer.rewrites() && drawn.iter().all(|d| chunk(d).genes.is_none()) {
        // Counts in stored columns: every row at its place, known from the
        // nonzeros of the rows before it, so the rows are written at once.
        let total: usize = drawn.iter().map(|d| d.nnz).sum();
        grow(&mut batch.x.indices, total);
        grow(&mut batch.x.data, total);
        let (indices, data) = (&mut batch.x.indices[..total], &mut batch.x.data[..total]);
        on(pool, || write_rows(held, drawn, indices, data));
        for d in drawn {
            writer.finish_cell_in(&mut batch, d.nnz, None);
        }
        return (cells, batch);
    }
    for d in drawn {
        let chunk = chunk(d);
        let filled = *batch.x.indptr.last().expect("indptr starts at 0") as usize;
        grow(&mut batch.x.indices, filled + d.nnz);
        grow(&mut batch.x.data, filled + d.nnz);
        let (indices, data) = (&mut batch.x.indices[filled..filled + d.nnz], &mut batch.x.data[filled..filled + d.nnz]);
        // (Cached stores: the writer reads the row again.)
        chunk.planes.write_row_with(d.row, indices, data, false);
        writer.finish_cell_in(&mut batch, d.nnz, chunk.genes.as_deref());
    }
    (cells, batch)
}

/// Writes the rows `drawn` one after another into `indices` and `data`
/// (exactly their nonzeros long), in parallel halves down to
/// [`ROWS_PER_TASK`] rows.
fn write_rows(held: &[Option<OpenChunk>], drawn: &[Drawn], indices: &mut [u32], data: &mut [u32]) {
    if drawn.len() <= ROWS_PER_TASK {
        // Each row's place, then the rows read chunk by chunk, in order
        // within each (the planes read forwards, not at random).
        let mut places: Vec<(usize, u64, usize, usize)> = Vec::with_capacity(drawn.len());
        let mut at = 0;
        for d in drawn {
            places.push((d.chunk, d.row, at, d.nnz));
            at += d.nnz;
        }
        places.sort_unstable();
        for (chunk, row, at, n) in places {
            let planes = &held[chunk].as_ref().expect("a drawn cell's chunk is held").planes;
            // (Streaming stores: the batch goes straight out.)
            planes.write_row_with(row, &mut indices[at..at + n], &mut data[at..at + n], true);
        }
        return;
    }
    let (first, second) = drawn.split_at(drawn.len() / 2);
    let split = first.iter().map(|d| d.nnz).sum();
    let (indices_first, indices_second) = indices.split_at_mut(split);
    let (data_first, data_second) = data.split_at_mut(split);
    rayon::join(
        || write_rows(held, first, indices_first, data_first),
        || write_rows(held, second, indices_second, data_second),
    );
}

#[cfg(test)]
mod tests;
