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
//! into their byte planes ([`ChunkPlanes`](crate::format::tile::ChunkPlanes));
//! one keeps `mix_chunks` decompressed chunks open and writes each cell of a
//! batch straight from the planes of one of them (checking every rule of its
//! values as it writes it), chosen uniformly at random (so the open chunks give a batch about equal numbers of cells),
//! so that a batch draws on `mix_chunks` chunks from anywhere in the window.
//! No decoded tile is ever made and copied from.
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
//!
//! Its files, lowest first, each importing only those before it: `options`
//! (the options and the errors), `source` (what is read: [`TileSource`]),
//! `plan` (the order: [`EpochPlan`], [`draw_by_weight`]), `buffers` (the
//! pools kept across epochs, and [`LoaderBatch`]), then the three stages,
//! `fetch`, `decode` and `batcher`, and `pipeline`, which starts them
//! ([`Batches`]).

mod batcher;
mod buffers;
mod decode;
mod fetch;
mod options;
mod pipeline;
mod plan;
mod source;

pub use crate::batch::BatchOutput;
pub use crate::buffers::{BufferPool, FloatPool, Pool};
pub use buffers::{LoaderBatch, LoaderBuffers, PlanesPool};
pub use options::{LoaderError, LoaderOptions, MAX_PREFETCH};
pub use pipeline::Batches;
pub(crate) use plan::rng_for;
pub use plan::{draw_by_weight, EpochPlan, Rows, Unit, MAX_DRAWS_PER_CELL};
pub use source::{OpenMember, TileSource};

#[cfg(test)]
mod tests;
