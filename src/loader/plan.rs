//! The order of an epoch: [`EpochPlan`] lays the cells to read out in a
//! tile order fixed by (seed, epoch) and cuts it into one share per (rank,
//! worker), a list of [`Unit`]s; [`draw_by_weight`] draws an epoch's cells
//! by weight; `rng_for` seeds each random choice of an epoch. It reads no
//! tile: the pipeline reads a plan.

use std::ops::Range;

use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use sha2::{Digest, Sha256};

use super::options::{check, LoaderError, LoaderOptions};
use super::source::TileSource;
use crate::{Dataset, DatasetError};

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

    /// The `i`th row.
    pub(super) fn get(&self, i: usize) -> u64 {
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
    pub(super) units: Vec<Unit>,
    pub(super) n_cells: u64,
    pub(super) n_batches: u64,
    pub(super) options: LoaderOptions,
    pub(super) share: usize,
}

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

    /// The options it was planned with.
    pub fn options(&self) -> &LoaderOptions {
        &self.options
    }
}
