//! What a loader reads: [`TileSource`], the datasets of a cell space one
//! after another (one dataset, or those of a collection), [`OpenMember`], a
//! dataset of it opened, and `OneDataset`, the source over one dataset. It
//! neither plans nor reads: the plan and the fetching stage call on it.

use std::sync::Arc;

use super::options::LoaderError;
use crate::batch::BatchOutput;
use crate::vocabulary::GeneMap;
use crate::Dataset;

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
}

/// A dataset of a [`TileSource`], open, with its map onto the batches' columns.
#[derive(Clone)]
pub struct OpenMember {
    pub dataset: Arc<Dataset>,
    pub genes: Option<Arc<GeneMap>>,
}

/// One dataset as a [`TileSource`], in the columns of its output's vocabulary.
pub(super) struct OneDataset {
    pub(super) dataset: Arc<Dataset>,
    pub(super) genes: Option<Arc<GeneMap>>,
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
}
