//! What a conversion is asked to do, how a process runs a shard of it, its
//! progress and what it produced.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{GeneSet, GivenOrder, ObsOptions};
use crate::inputs;
use crate::writer::WriteOptions;

/// Tiles read but not yet written, by default. Each tile's chunks already use
/// every core; one tile encoding while the next is read keeps memory at two
/// tiles whatever the input size.
pub const MAX_IN_FLIGHT: usize = 1;

/// What to convert and how.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// `X`, `raw/X` or `layers/NAME`.
    pub matrix: String,
    pub write: WriteOptions,
    /// How many inputs are sampled for the gene order (decisions.md 12); 0
    /// keeps the source order.
    pub gene_order_files: usize,
    /// A gene order to use instead of computing one (`gene_order_files` is
    /// then not used).
    pub gene_order: Option<GivenOrder>,
    /// Which genes are stored when the inputs' genes differ.
    pub genes: GeneSet,
    /// Write var.parquet.
    pub write_var: bool,
    /// What to store of obs; None for no obs.
    pub obs: Option<ObsOptions>,
    /// Replace an existing dataset in the output.
    pub overwrite: bool,
    /// Added to the manifest's metadata, after what convert records itself.
    pub metadata: Map<String, Value>,
    /// Tiles read but not yet written, at most.
    pub max_in_flight: usize,
    /// Store the cells of all inputs in an order fixed by this seed, so that
    /// every tile is a random sample of the dataset (obs then records where
    /// each cell was read: [`super::SOURCE_FILE`], [`super::SOURCE_ROW`]).
    pub shuffle: Option<u64>,
    /// Where a shuffled conversion spills its cells between its two passes
    /// (default: the system's temporary folder).
    pub spill_dir: Option<PathBuf>,
    /// How inputs at URLs are reached.
    pub inputs: inputs::InputOptions,
}

/// How one process runs a shard of a plan (not part of the plan: any shard
/// may run with any of these, and writes the same bytes).
#[derive(Clone, Debug)]
pub struct ShardOptions {
    /// Tiles read but not yet written, at most.
    pub max_in_flight: usize,
    /// Where a shuffled plan's shard spills its cells (default: the system's
    /// temporary folder); it needs the shard's cells once, compressed.
    pub spill_dir: Option<PathBuf>,
    /// How inputs at URLs are reached.
    pub inputs: inputs::InputOptions,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions { max_in_flight: MAX_IN_FLIGHT, spill_dir: None, inputs: inputs::InputOptions::default() }
    }
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            matrix: "X".into(),
            write: WriteOptions::default(),
            gene_order_files: 10,
            gene_order: None,
            genes: GeneSet::Same,
            write_var: true,
            obs: Some(ObsOptions::default()),
            overwrite: false,
            metadata: Map::new(),
            max_in_flight: MAX_IN_FLIGHT,
            shuffle: None,
            spill_dir: None,
            inputs: inputs::InputOptions::default(),
        }
    }
}

/// Progress of a conversion, for a progress bar.
pub trait ConvertProgress: Sync {
    /// Something the user should know that is not an error (inputs aligned by
    /// gene name, for example).
    fn note(&self, _message: &str) {}
    /// A new phase begins ("scanning", "gene order", "converting").
    fn phase(&self, _name: &str, _total_cells: u64) {}
    /// Reading moved to another input file.
    fn file(&self, _path: &Path) {}
    /// `cells` more cells were processed in the current phase.
    fn advance(&self, _cells: u64) {}
    /// Tile `index` (of `cells` cells and `nnz` nonzeros) was written.
    fn tile_done(&self, _index: usize, _cells: u64, _nnz: u64) {}
}

/// No progress reporting.
pub struct NoProgress;

impl ConvertProgress for NoProgress {}

/// What a finished conversion produced.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ConvertSummary {
    pub n_cells: u64,
    pub n_genes: u64,
    pub n_tiles: usize,
    pub nnz: u64,
    pub tile_bytes: u64,
    pub bytes_per_nonzero: f64,
    /// Nonzeros of genes left out (`--genes intersection`).
    pub dropped_nonzeros: u64,
    /// Entries of a cell and gene that repeated an earlier one (summed into it).
    pub summed_duplicates: u64,
    pub seconds: f64,
}
