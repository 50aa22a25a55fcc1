//! Reading listed cells of a collection in a batch's form: each dataset's
//! cells read together, then written in the order listed.

use rayon::prelude::*;

use super::{check_output, Collection, CollectionError, OpenMember};
use crate::batch::{BatchOutput, CellWriter, FormedBatch};
use crate::CsrMatrix;

impl Collection {
    /// The listed cells (of the cell space, any order, repeats allowed) in the
    /// form `output` asks for (its `genes` must be None: the collection's
    /// vocabulary is the batches' columns). Each dataset's cells are read
    /// together, its tiles decoded once, on the calling thread's rayon pool.
    pub fn read_cells_formed(&self, cells: &[u64], output: &BatchOutput) -> Result<FormedBatch, CollectionError> {
        self.read_cells_formed_in(cells, output, &crate::buffers::BufferPool::new(0))
    }

    /// [`Collection::read_cells_formed`], its buffers (the batch's and each
    /// dataset's rows) taken from `buffers`, and each dataset's given back
    /// there: a loop of gathers whose batches come back to `buffers` writes
    /// into memory already mapped.
    pub fn read_cells_formed_in(
        &self,
        cells: &[u64],
        output: &BatchOutput,
        buffers: &crate::buffers::BufferPool,
    ) -> Result<FormedBatch, CollectionError> {
        let n_cols = self.vocabulary.len() as u32;
        check_output(output, n_cols)?;
        output.check_rows(cells.len() as u64, n_cols).map_err(|e| CollectionError::Argument(e.to_string()))?;
        let mut located = Vec::with_capacity(cells.len());
        for &cell in cells {
            located.push(self.locate(cell)?);
        }
        let mut rows_of: Vec<Vec<u64>> = vec![Vec::new(); self.members.len()];
        for &(m, row) in &located {
            rows_of[m].push(row);
        }
        let needed: Vec<usize> = (0..self.members.len()).filter(|&m| !rows_of[m].is_empty()).collect();
        let read: Vec<(OpenMember, CsrMatrix)> = needed
            .par_iter()
            .map(|&m| {
                let open = self.open_member(m)?;
                let name = &self.members[m].summary.name;
                let mut matrix = buffers.take_matrix();
                open.dataset
                    .read_into(crate::dataset::Selection::List(&rows_of[m]), &mut matrix)
                    .map_err(|source| CollectionError::Member { name: name.clone(), source })?;
                Ok((open, matrix))
            })
            .collect::<Result<_, CollectionError>>()?;
        let mut slot = vec![usize::MAX; self.members.len()];
        for (i, &m) in needed.iter().enumerate() {
            slot[m] = i;
        }
        let mut next = vec![0usize; needed.len()];
        let nnz: usize = read.iter().map(|(_, m)| m.nnz()).sum();
        let mut writer = CellWriter::with_columns(output, n_cols);
        // (every entry is written below: old values of a kept buffer go)
        let mut x = buffers.take_matrix();
        x.n_cols = n_cols;
        x.indices.resize(nnz, 0);
        x.data.resize(nnz, 0);
        let mut batch = writer.start(x, cells.len());
        for &(m, _) in &located {
            let i = slot[m];
            let (open, matrix) = &read[i];
            let (indices, data) = matrix.row(next[i]);
            next[i] += 1;
            let at = batch.x.indptr.last().copied().unwrap_or(0) as usize;
            let n = indices.len();
            batch.x.indices[at..at + n].copy_from_slice(indices);
            batch.x.data[at..at + n].copy_from_slice(data);
            writer.finish_cell_in(&mut batch, n, open.genes.as_deref());
        }
        writer.finish(&mut batch);
        for (_, matrix) in read {
            buffers.give_matrix(matrix);
        }
        Ok(batch)
    }
}
