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

    /// Appends every row of `other`.
    pub fn append(&mut self, other: &CsrMatrix) {
        let base = self.indices.len() as u64;
        self.indices.extend_from_slice(&other.indices);
        self.data.extend_from_slice(&other.data);
        self.indptr.extend(other.indptr.iter().skip(1).map(|&p| p + base));
    }
}
