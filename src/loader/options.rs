//! What a loader is asked for and how it fails: [`LoaderOptions`], their
//! defaults and the check of their ranges, and [`LoaderError`] (with the
//! text of a loader thread's panic, for its `Internal` case). It knows
//! nothing of how an epoch is planned or read.

use crate::batch::OutputError;
use crate::DatasetError;

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
    #[error(transparent)]
    Member(Box<crate::collection::CollectionError>),
}

impl From<OutputError> for LoaderError {
    fn from(e: OutputError) -> Self {
        LoaderError::Options(e.to_string())
    }
}

/// The most batches made ahead of the consumer (the queue is reserved at its
/// size).
pub const MAX_PREFETCH: usize = 1024;

/// Refuses options out of their ranges, naming the option.
pub(super) fn check(options: &LoaderOptions) -> Result<(), LoaderError> {
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

/// The text of a panic's payload.
pub(super) fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a loader thread panicked".into())
}
