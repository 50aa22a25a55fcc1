//! The memory a loader reuses: [`LoaderBuffers`], the pools kept from one
//! epoch to the next (decompressed chunks in a [`PlanesPool`], batches and
//! their scaled values), and [`LoaderBatch`], the batch written into buffers
//! from them and handed to the consumer. It fills nothing: the decoding and
//! batching stages do.

use std::sync::Arc;

use super::options::LoaderOptions;
use crate::buffers::{BufferPool, FloatPool, Pool};
use crate::format::tile::ChunkPlanes;
use crate::format::CsrMatrix;

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
            // the options' extremes do not overflow). Planes: the chunks
            // open, those decompressed ahead, and those spent but held
            // until the batch with their last cells is written, up to a
            // batch's cells: with chunks of one cell, a pool of the first
            // two alone let most of a batch's planes be freed and made
            // again, a seventh of the epoch's time.
            planes: Arc::new(PlanesPool::new(
                options.mix_chunks.saturating_add(2 * MAX_SMALL_GROUP).saturating_add(options.batch_size),
            )),
            batches: Arc::new(BufferPool::new(options.prefetch.saturating_add(4).saturating_mul(2))),
            values: Arc::new(FloatPool::new(options.prefetch.saturating_add(4))),
        }
    }
}

/// Decompressed chunks kept for reuse.
pub type PlanesPool = Pool<ChunkPlanes>;

/// One batch: the cells (global indices, in the order yielded) and their
/// rows, in the form of the [`BatchOutput`](crate::batch::BatchOutput) the
/// batches were started with (see [`crate::batch::FormedBatch`] for which
/// fields hold what).
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

/// The most chunks decompressed together, in parallel, ahead of the batcher
/// (here because it sizes the pool of planes; the decoding stage uses it).
pub(super) const MAX_DECODE_GROUP: usize = 8;

/// The most chunks in a group of small ones (see the decoding stage's
/// `SMALL_GROUP_NNZ`): a dataset written for random access has chunks of a
/// few cells, and handing them to the threads eight at a time made its
/// epoch wait on the handing, not the decoding.
pub(super) const MAX_SMALL_GROUP: usize = 64;
