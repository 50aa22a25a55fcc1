//! The one read of a dataset: a selection of cells (a tile, a range, a
//! list) decoded into a CSR matrix, a buffer to fill, or a batch's form.

use std::ops::Range;

use super::{Dataset, DatasetError};
use crate::batch::{BatchOutput, CellWriter, FormedBatch};
use crate::format::CsrMatrix;

/// Which cells a read returns, and in which order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection<'a> {
    /// Tile `t`'s cells, in order: decoded whole, checked against the
    /// manifest.
    Tile(usize),
    /// Cells `start..end` (indices over the whole dataset), in order: of a
    /// tile the range covers in part, only the chunks holding its cells are
    /// decoded.
    Range(Range<u64>),
    /// The listed cells in the order given, repeats allowed: only the
    /// chunks holding them are read and decoded, each tile's index kept for
    /// the next read and its decoded chunks cached (within
    /// [`ReadOptions::cache_bytes`](super::ReadOptions::cache_bytes)).
    List(&'a [u64]),
}

impl Selection<'_> {
    /// The rows a read of it from `dataset` returns (None for a selection
    /// the dataset does not hold, which the read refuses).
    fn rows(&self, dataset: &Dataset) -> Option<u64> {
        match self {
            Selection::Tile(t) => (*t < dataset.n_tiles()).then(|| dataset.manifest().tile_cells[*t]),
            Selection::Range(r) => (r.start <= r.end && r.end <= dataset.n_cells()).then(|| r.end - r.start),
            Selection::List(cells) => Some(cells.len() as u64),
        }
    }
}

impl Dataset {
    /// Reads the cells `cells` selects as one CSR matrix.
    ///
    /// ```no_run
    /// use deltacells::{Dataset, Selection};
    /// let ds = Dataset::open("pbmc")?;
    /// let first = ds.read(Selection::Tile(0))?;
    /// let some = ds.read(Selection::Range(100..200))?;
    /// let picked = ds.read(Selection::List(&[7, 3, 7]))?;
    /// # Ok::<(), deltacells::DatasetError>(())
    /// ```
    pub fn read(&self, cells: Selection<'_>) -> Result<CsrMatrix, DatasetError> {
        let mut out = CsrMatrix::default();
        self.read_into(cells, &mut out)?;
        Ok(out)
    }

    /// [`Dataset::read`] into `out`'s buffers, reused as far as they are
    /// large enough and written over rather than cleared first: a loop over
    /// tiles or consecutive ranges faults in no fresh memory for each. On
    /// error, `out` holds unspecified rows.
    pub fn read_into(&self, cells: Selection<'_>, out: &mut CsrMatrix) -> Result<(), DatasetError> {
        match cells {
            Selection::Tile(tile) => self.tile_into(tile, out),
            Selection::Range(range) => self.range_into(range, out),
            Selection::List(list) => self.list_into(list, out),
        }
    }

    /// The cells `cells` selects in the form `output` asks for: a gene
    /// vocabulary, scaled values, dense, top-k tokens (see [`crate::batch`]);
    /// the same values the loader gives with that output.
    pub fn read_formed(&self, cells: Selection<'_>, output: &BatchOutput) -> Result<FormedBatch, DatasetError> {
        output.check(self.n_genes())?;
        // (a selection the dataset does not hold is refused by the read)
        if let Some(rows) = cells.rows(self) {
            output.check_rows(rows, output.n_cols(self.n_genes()))?;
        }
        let m = self.read(cells)?;
        Ok(CellWriter::new(output, self.n_genes()).form(m))
    }
}
