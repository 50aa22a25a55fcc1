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
