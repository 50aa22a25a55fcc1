/// A compressed sparse row matrix of counts, as tiles store and decode them.
///
/// Row `r` holds the entries `indptr[r]..indptr[r + 1]` of `indices` (column, i.e.
/// gene, indices in increasing order) and `data` (counts, never zero).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CsrMatrix {
    /// Number of columns (genes).
    pub n_cols: u32,
    /// Row offsets, `n_rows + 1` of them, starting at 0.
    pub indptr: Vec<u64>,
    /// Column index of each stored entry.
    pub indices: Vec<u32>,
    /// Count of each stored entry.
    pub data: Vec<u32>,
}

impl CsrMatrix {
    /// An empty matrix with no rows.
    pub fn empty(n_cols: u32) -> Self {
        CsrMatrix { n_cols, indptr: vec![0], indices: Vec::new(), data: Vec::new() }
    }

    /// Number of rows (cells).
    pub fn n_rows(&self) -> usize {
        self.indptr.len().saturating_sub(1)
    }

    /// Number of stored entries.
    pub fn nnz(&self) -> usize {
        self.indices.len()
    }

    /// The column indices and counts of row `r`.
    ///
    /// # Panics
    /// If `r >= self.n_rows()`.
    pub fn row(&self, r: usize) -> (&[u32], &[u32]) {
        let (lo, hi) = (self.indptr[r] as usize, self.indptr[r + 1] as usize);
        (&self.indices[lo..hi], &self.data[lo..hi])
    }

    /// Appends row `r` of `other` as a new last row.
    pub fn push_row_from(&mut self, other: &CsrMatrix, r: usize) {
        let (indices, data) = other.row(r);
        self.indices.extend_from_slice(indices);
        self.data.extend_from_slice(data);
        self.indptr.push(self.indices.len() as u64);
    }

    /// Total counts of each column.
    pub fn column_totals(&self) -> Vec<u64> {
        let mut totals = vec![0u64; self.n_cols as usize];
        for (&g, &c) in self.indices.iter().zip(&self.data) {
            if let Some(t) = totals.get_mut(g as usize) {
                *t += u64::from(c);
            }
        }
        totals
    }

    /// The matrix with column `g` moved to `position[g]` (a permutation of the
    /// columns; each row's entries sorted again).
    ///
    /// # Panics
    /// If a column index is not below `position.len()`.
    pub fn with_columns(&self, position: &[u32]) -> CsrMatrix {
        let mut out = CsrMatrix::empty(self.n_cols);
        out.indices.reserve(self.nnz());
        out.data.reserve(self.nnz());
        let mut row: Vec<(u32, u32)> = Vec::new();
        for r in 0..self.n_rows() {
            let (genes, counts) = self.row(r);
            row.clear();
            row.extend(genes.iter().zip(counts).map(|(&g, &c)| (position[g as usize], c)));
            row.sort_unstable();
            out.indices.extend(row.iter().map(|p| p.0));
            out.data.extend(row.iter().map(|p| p.1));
            out.indptr.push(out.indices.len() as u64);
        }
        out
    }

    /// Appends every row of `other`.
    pub fn append(&mut self, other: &CsrMatrix) {
        let base = self.indices.len() as u64;
        self.indices.extend_from_slice(&other.indices);
        self.data.extend_from_slice(&other.data);
        self.indptr.extend(other.indptr.iter().skip(1).map(|&p| p + base));
    }
}

/// A [`CsrMatrix`] refilled in place: rows are written over the entries its
/// buffers held before, which grow (zeroed) only past their old length, so
/// that a loop refilling one matrix writes each entry once instead of
/// clearing, zeroing and then writing it. [`CsrFill::finish`] cuts the
/// buffers to what was written; until then (and if it is never called, after
/// an error) the matrix holds unspecified rows.
pub struct CsrFill<'a> {
    matrix: &'a mut CsrMatrix,
    nnz: usize,
}

impl<'a> CsrFill<'a> {
    /// Starts refilling `matrix` as a matrix of `n_cols` columns and no rows.
    pub fn new(matrix: &'a mut CsrMatrix, n_cols: u32) -> Self {
        matrix.n_cols = n_cols;
        matrix.indptr.clear();
        matrix.indptr.push(0);
        CsrFill { matrix, nnz: 0 }
    }

    /// Room for `n` more entries after those of the rows ended so far: their
    /// gene indices and counts, to be written whole before
    /// [`CsrFill::end_rows`].
    pub fn room(&mut self, n: usize) -> (&mut [u32], &mut [u32]) {
        let need = self.nnz + n;
        for v in [&mut self.matrix.indices, &mut self.matrix.data] {
            if v.len() < need {
                if v.capacity() == 0 {
                    // Fresh zeroed pages from the allocator, not a memset.
                    *v = vec![0; need];
                } else {
                    v.resize(need, 0);
                }
            }
        }
        (&mut self.matrix.indices[self.nnz..need], &mut self.matrix.data[self.nnz..need])
    }

    /// Ends rows written into the room: `ends` are their end offsets from the
    /// room's start, in increasing order.
    pub fn end_rows(&mut self, ends: impl IntoIterator<Item = u64>) {
        let base = self.nnz as u64;
        for end in ends {
            self.matrix.indptr.push(base + end);
        }
        self.nnz = *self.matrix.indptr.last().unwrap_or(&0) as usize;
    }

    /// Appends every row of `other`.
    pub fn append(&mut self, other: &CsrMatrix) {
        let (indices, data) = self.room(other.nnz());
        indices.copy_from_slice(&other.indices);
        data.copy_from_slice(&other.data);
        self.end_rows(other.indptr.iter().skip(1).copied());
    }

    /// Cuts the buffers to the rows ended.
    pub fn finish(self) {
        self.matrix.indices.truncate(self.nnz);
        self.matrix.data.truncate(self.nnz);
    }
}
