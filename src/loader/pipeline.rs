//! [`Batches`]: one share's batches, read by three threads in a row (the
//! fetching, decoding and batching stages), joined by bounded channels and
//! each guarded so that a panic reaches the consumer as an error. It starts
//! the threads and hands on their batches; what each stage does is in its
//! own file.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use super::batcher::cut_batches;
use super::buffers::{LoaderBatch, LoaderBuffers};
use super::decode::{decode_chunks, decode_group, OpenChunk};
use super::fetch::{fetch_tiles, Fetched};
use super::options::{panic_text, LoaderError};
use super::plan::EpochPlan;
use super::source::{OneDataset, TileSource};
use crate::batch::{BatchOutput, CellWriter};
use crate::Dataset;

/// The batches of one share, read on background threads. Dropping it stops
/// them (each finishes the step in hand and exits).
pub struct Batches {
    receiver: Receiver<Result<LoaderBatch, LoaderError>>,
    expected: u64,
    yielded: u64,
    failed: bool,
}

/// Tiles fetched and waiting for the decoding thread, at most.
const TILES_WAITING: usize = 2;

impl Batches {
    /// Starts reading `plan`'s share of `dataset`: tiles are fetched and
    /// chunks decompressed on `pool` (rayon's global pool when None), into
    /// buffers from `buffers`, as are the batches.
    pub fn start(
        dataset: Arc<Dataset>,
        plan: impl Into<Arc<EpochPlan>>,
        pool: Option<Arc<rayon::ThreadPool>>,
        buffers: &LoaderBuffers,
    ) -> Result<Batches, LoaderError> {
        Batches::start_with(dataset, plan, pool, buffers, BatchOutput::default())
    }

    /// [`Batches::start`], with batches in the form `output` says (a gene
    /// vocabulary, applied to each cell as the batcher writes it).
    pub fn start_with(
        dataset: Arc<Dataset>,
        plan: impl Into<Arc<EpochPlan>>,
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
        plan: impl Into<Arc<EpochPlan>>,
        pool: Option<Arc<rayon::ThreadPool>>,
        buffers: &LoaderBuffers,
        output: BatchOutput,
    ) -> Result<Batches, LoaderError> {
        let plan: Arc<EpochPlan> = plan.into();
        let n_cols = source.check_output(&output)?;
        output.check_rows((plan.options.batch_size as u64).min(plan.n_cells()), n_cols)?;
        let group = decode_group(pool.as_deref());
        let (batch_tx, receiver) = sync_channel(plan.options.prefetch);
        let (tile_tx, tile_rx) = sync_channel::<Result<Fetched, LoaderError>>(TILES_WAITING);
        // (Handed over when the batcher needs it, the next group decompressed
        // meanwhile: as many chunks in flight as two waiting one by one.)
        let (chunk_tx, chunk_rx) = sync_channel::<Result<Vec<OpenChunk>, LoaderError>>(0);
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
                        let writer = CellWriter::with_columns(&output, n_cols);
                        cut_batches(&plan, writer, chunk_rx, (&batches, &values), pool.as_deref(), out)
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
