//! What a batch holds, in a model's terms: [`BatchOutput`] says which gene
//! vocabulary its columns are in, whether counts are scaled (normalized to a
//! target sum, then log1p), whether the matrix is dense, and whether the top
//! genes of each cell come with it as tokens. [`CellWriter`] writes one cell
//! at a time into a [`FormedBatch`]: the loader's batcher and the reads of
//! [`crate::Dataset`] use the same writer, so both give the same values.
//!
//! Everything is off by default: counts stay integer counts, in the stored
//! columns, as a CSR matrix.

use std::sync::Arc;

use crate::format::CsrMatrix;
use crate::vocabulary::{GeneMap, RowScratch};

/// Which of a cell's counts a normalization sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SumOver {
    /// Every gene the dataset stores for the cell (the library size as
    /// sequenced), whether the vocabulary has it or not.
    Stored,
    /// The genes of the output: the vocabulary's (or every stored gene
    /// without one).
    Output,
}

/// Each cell's counts scaled so that they sum to `target_sum` (over
/// [`SumOver`]); a cell with no counts stays all zeros.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Normalize {
    pub target_sum: f64,
    pub over: SumOver,
}

/// The form of a batch. See the [module](self).
#[derive(Clone, Debug, Default)]
pub struct BatchOutput {
    /// The columns: a vocabulary's ([`crate::vocabulary`]), or the stored ones.
    pub genes: Option<Arc<GeneMap>>,
    /// Scale each cell to a target sum (values become float32).
    pub normalize: Option<Normalize>,
    /// `ln(1 + value)`, after any normalization (values become float32).
    pub log1p: bool,
    /// A dense `[cells, genes]` matrix (row-major) instead of CSR.
    pub dense: bool,
    /// The `k` columns of each cell with the highest values, as tokens.
    pub top_k: Option<usize>,
    /// Values as float32 even without a transform (counts as floats).
    pub float32: bool,
    /// With a vocabulary, leave each cell's CSR columns in the dataset's
    /// stored order instead of sorting them (valid CSR that SciPy accepts,
    /// with `has_sorted_indices` false): saves a sort per cell.
    pub unsorted: bool,
}

/// Why a [`BatchOutput`] cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("normalize: the target sum must be a positive, finite number, not {0}")]
    TargetSum(f64),
    #[error("top_k: must be at least 1")]
    TopK,
    #[error("top_k: {k} tokens of {n_cols} genes; at most {n_cols} (the genes of a batch)")]
    TopKAboveGenes { k: usize, n_cols: u32 },
    #[error("genes: the map is of {map} stored genes, the dataset has {dataset}")]
    Map { map: usize, dataset: u32 },
    #[error(
        "dense: a batch of {rows} cells x {n_cols} genes takes {bytes} bytes dense, more than the {} bytes \
         (16 GiB) a dense batch may take; ask for fewer cells in a batch, or for CSR batches",
        MAX_DENSE_BYTES
    )]
    DenseTooLarge { rows: u64, n_cols: u32, bytes: u64 },
}

/// The most memory a dense batch may take: a request for more is refused
/// before anything is read or reserved, rather than failing to allocate.
pub const MAX_DENSE_BYTES: u64 = 16 << 30;

impl BatchOutput {
    /// Checks the options against a dataset of `n_genes` stored genes.
    pub fn check(&self, n_genes: u32) -> Result<(), OutputError> {
        if let Some(map) = &self.genes {
            if map.n_stored() != n_genes as usize {
                return Err(OutputError::Map { map: map.n_stored(), dataset: n_genes });
            }
        }
        self.check_columns(self.n_cols(n_genes))
    }

    /// Checks the options that do not depend on a dataset, for batches of
    /// `n_cols` columns (a collection's vocabulary, whose datasets each have
    /// their own map onto it).
    pub fn check_columns(&self, n_cols: u32) -> Result<(), OutputError> {
        if let Some(n) = &self.normalize {
            if !(n.target_sum.is_finite() && n.target_sum > 0.0) {
                return Err(OutputError::TargetSum(n.target_sum));
            }
        }
        match self.top_k {
            Some(0) => Err(OutputError::TopK),
            Some(k) if k > n_cols as usize => Err(OutputError::TopKAboveGenes { k, n_cols }),
            _ => Ok(()),
        }
    }

    /// Checks that batches of `rows` cells and `n_cols` columns fit the
    /// budget of their form ([`MAX_DENSE_BYTES`] dense; CSR follows the
    /// cells' nonzeros).
    pub fn check_rows(&self, rows: u64, n_cols: u32) -> Result<(), OutputError> {
        if !self.dense {
            return Ok(());
        }
        let bytes = rows.saturating_mul(u64::from(n_cols)).saturating_mul(4);
        if bytes > MAX_DENSE_BYTES {
            return Err(OutputError::DenseTooLarge { rows, n_cols, bytes });
        }
        Ok(())
    }

    /// Columns of a batch of a dataset of `n_genes` stored genes.
    pub fn n_cols(&self, n_genes: u32) -> u32 {
        self.genes.as_deref().map_or(n_genes, GeneMap::n_output)
    }

    /// Values are float32 (a transform is on, or float32 was asked for)
    /// rather than integer counts.
    pub fn scaled(&self) -> bool {
        self.normalize.is_some() || self.log1p || self.float32
    }
}

/// A batch's matrix and tokens as [`CellWriter`] writes them.
///
/// - CSR counts (the default): `x` (indptr, indices, counts in `x.data`).
/// - CSR scaled: `x.indptr` and `x.indices`, the values in `values`.
/// - Dense counts: `dense_counts`, `rows * n_cols`, row-major.
/// - Dense scaled: `values`, `rows * n_cols`, row-major.
/// - With top-k: `top_k` (`rows * k` output columns, -1 past a cell's
///   nonzeros) and `top_k_values` beside them (counts as float32 when not
///   scaled).
#[derive(Debug, Default)]
pub struct FormedBatch {
    pub rows: usize,
    pub n_cols: u32,
    pub x: CsrMatrix,
    pub values: Vec<f32>,
    pub dense_counts: Vec<u32>,
    pub top_k: Vec<i32>,
    pub top_k_values: Vec<f32>,
}

/// Writes cells into a [`FormedBatch`] in the form of a [`BatchOutput`],
/// with its reused scratch space.
pub struct CellWriter<'a> {
    output: &'a BatchOutput,
    n_cols: u32,
    scratch: RowScratch,
    ranked: Vec<u64>,
    scaled_row: Vec<f32>,
}

impl<'a> CellWriter<'a> {
    /// A writer for batches of a dataset of `n_genes` stored genes (the
    /// output checked with [`BatchOutput::check`]).
    pub fn new(output: &'a BatchOutput, n_genes: u32) -> CellWriter<'a> {
        CellWriter::with_columns(output, output.n_cols(n_genes))
    }

    /// A writer for batches of `n_cols` columns, whose cells may each come
    /// with their own map onto them ([`CellWriter::finish_cell_in`]): the
    /// cells of a collection's datasets.
    pub fn with_columns(output: &'a BatchOutput, n_cols: u32) -> CellWriter<'a> {
        CellWriter { output, n_cols, scratch: RowScratch::default(), ranked: Vec::new(), scaled_row: Vec::new() }
    }

    /// The form this writer writes.
    pub fn output(&self) -> &BatchOutput {
        self.output
    }

    /// An empty batch to write up to `rows` cells into, reusing `x`'s buffers.
    pub fn start(&self, x: CsrMatrix, rows: usize) -> FormedBatch {
        self.start_with(x, Vec::new(), Vec::new(), rows)
    }

    /// [`CellWriter::start`], reusing buffers for dense counts and for
    /// scaled values too (their memory already mapped: a dense batch of
    /// 1,024 cells and 20,000 genes is 80 MB).
    pub fn start_with(&self, mut x: CsrMatrix, counts: Vec<u32>, values: Vec<f32>, rows: usize) -> FormedBatch {
        x.n_cols = self.n_cols;
        x.indptr.clear();
        x.indptr.push(0);
        let (mut dense_counts, mut values) = (counts, values);
        dense_counts.clear();
        values.clear();
        let mut batch = FormedBatch { rows: 0, n_cols: self.n_cols, x, values, dense_counts, ..FormedBatch::default() };
        if self.output.dense {
            let cells = rows.saturating_mul(self.n_cols as usize);
            if self.output.scaled() {
                batch.values.reserve(cells);
            } else {
                batch.dense_counts.reserve(cells);
            }
        }
        batch
    }

    /// Appends one cell whose stored columns and counts have been written at
    /// the end of `batch.x.indices` and `batch.x.data` (from `batch.x`'s last
    /// row offset, `n` entries): maps, scales, and writes it in the form asked.
    pub fn finish_cell(&mut self, batch: &mut FormedBatch, n: usize) {
        self.finish_cell_in(batch, n, self.output.genes.as_deref());
    }

    /// [`CellWriter::finish_cell`] for a cell whose stored columns `genes`
    /// maps onto the batch's (None: they are the batch's).
    pub fn finish_cell_in(&mut self, batch: &mut FormedBatch, n: usize, genes: Option<&GeneMap>) {
        let out = self.output;
        let filled = batch.x.indptr.last().copied().unwrap_or(0) as usize;
        let end = (filled + n).min(batch.x.indices.len()).min(batch.x.data.len());
        let stored_sum: u64 = if matches!(out.normalize, Some(Normalize { over: SumOver::Stored, .. })) {
            batch.x.data[filled..end].iter().map(|&c| u64::from(c)).sum()
        } else {
            0
        };
        let (indices, data) = (&mut batch.x.indices[filled..end], &mut batch.x.data[filled..end]);
        let kept = match genes {
            // A dense row is scattered: its entries need no order (unless
            // names stored twice must be added first); nor do unsorted ones.
            Some(map) => map.map_row_in(indices, data, &mut self.scratch, out.dense || out.unsorted),
            None => indices.len(),
        };
        let (indices, data) = (&batch.x.indices[filled..filled + kept], &batch.x.data[filled..filled + kept]);
        let scaled = out.scaled();
        if scaled {
            let scale = match out.normalize {
                None => 1.0,
                Some(Normalize { target_sum, over }) => {
                    let total = match over {
                        SumOver::Stored => stored_sum,
                        SumOver::Output => data.iter().map(|&c| u64::from(c)).sum(),
                    };
                    if total == 0 {
                        0.0
                    } else {
                        target_sum / total as f64
                    }
                }
            };
            self.scaled_row.clear();
            let scale = scale as f32;
            if out.log1p {
                self.scaled_row.extend(data.iter().map(|&c| (c as f32 * scale).ln_1p()));
            } else {
                self.scaled_row.extend(data.iter().map(|&c| c as f32 * scale));
            }
        }
        if let Some(k) = out.top_k {
            self.rank(indices, data, (scaled, genes), k, (&mut batch.top_k, &mut batch.top_k_values));
        }
        let row = batch.rows;
        if out.dense {
            let width = self.n_cols as usize;
            if scaled {
                batch.values.resize((row + 1) * width, 0.0);
                let dense = &mut batch.values[row * width..];
                for (&j, &v) in indices.iter().zip(&self.scaled_row) {
                    if let Some(d) = dense.get_mut(j as usize) {
                        *d = v;
                    }
                }
            } else {
                batch.dense_counts.resize((row + 1) * width, 0);
                let dense = &mut batch.dense_counts[row * width..];
                for (&j, &c) in indices.iter().zip(data) {
                    if let Some(d) = dense.get_mut(j as usize) {
                        *d = c;
                    }
                }
            }
            // The CSR buffers were scratch for this cell.
            batch.x.indptr.push(filled as u64);
        } else {
            if scaled {
                batch.values.truncate(filled);
                batch.values.extend_from_slice(&self.scaled_row);
            }
            batch.x.indptr.push((filled + kept) as u64);
        }
        batch.rows += 1;
    }

    /// The cell's `k` highest values, ties broken by the stored column (the
    /// gene with more counts over the dataset first), padded with -1.
    fn rank(
        &mut self,
        indices: &[u32],
        data: &[u32],
        (scaled, genes): (bool, Option<&GeneMap>),
        k: usize,
        out: (&mut Vec<i32>, &mut Vec<f32>),
    ) {
        // Each entry as one integer, (inverted value bits, stored column):
        // values are never negative, so their f32 bits order as the values
        // do, and an integer sort ranks them, ties by stored column (unique
        // in a cell: each output column has its own first stored column).
        let keys = &mut self.ranked;
        keys.clear();
        for (i, &j) in indices.iter().enumerate() {
            let v = if scaled { self.scaled_row[i] } else { data[i] as f32 };
            let inverted = u64::from(u32::MAX - v.max(0.0).to_bits());
            let stored = genes.map_or(j, |m| m.first_stored(j));
            keys.push(inverted << 32 | u64::from(stored));
        }
        if keys.len() > k {
            keys.select_nth_unstable(k - 1);
            keys.truncate(k);
        }
        keys.sort_unstable();
        let (columns, values) = out;
        for &key in keys.iter() {
            let stored = key as u32;
            let j = genes.map_or(Some(stored), |m| m.output_column(stored)).unwrap_or(u32::MAX);
            columns.push(j as i32);
            values.push(f32::from_bits(u32::MAX - (key >> 32) as u32));
        }
        for _ in keys.len()..k {
            columns.push(-1);
            values.push(0.0);
        }
    }

    /// Cuts a finished batch's buffers at what was written.
    pub fn finish(&self, batch: &mut FormedBatch) {
        let filled = batch.x.indptr.last().copied().unwrap_or(0) as usize;
        batch.x.indices.truncate(filled);
        batch.x.data.truncate(filled);
        if self.output.scaled() && !self.output.dense {
            batch.values.truncate(filled);
        }
        if self.output.dense || self.output.scaled() {
            // x.data holds no values of the batch then.
            batch.x.data.clear();
        }
        if self.output.dense {
            batch.x.indices.clear();
        }
    }

    /// Every row of `m` (stored columns, counts) as one batch.
    pub fn form(&mut self, m: CsrMatrix) -> FormedBatch {
        let rows = m.n_rows();
        let offsets = m.indptr.clone();
        let x = CsrMatrix { n_cols: m.n_cols, indptr: Vec::new(), indices: m.indices, data: m.data };
        let mut batch = self.start(x, rows);
        for r in 0..rows {
            let (start, end) = (offsets[r] as usize, offsets[r + 1] as usize);
            // Rows only shrink: move this one to where the batch's rows end.
            let at = batch.x.indptr.last().copied().unwrap_or(0) as usize;
            if at != start {
                batch.x.indices.copy_within(start..end, at);
                batch.x.data.copy_within(start..end, at);
            }
            self.finish_cell(&mut batch, end - start);
        }
        self.finish(&mut batch);
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reference in f64 over a dense row: the cell's values in the output's
    /// columns (by name), scaled as asked.
    fn reference(row: &[(u32, u32)], output: &BatchOutput, stored: &[String], wanted: &[String]) -> Vec<f64> {
        let mut dense = vec![0f64; wanted.len()];
        for &(g, c) in row {
            if let Some(j) = wanted.iter().position(|w| *w == stored[g as usize]) {
                dense[j] += f64::from(c);
            }
        }
        if let Some(n) = output.normalize {
            let total: f64 = match n.over {
                SumOver::Stored => row.iter().map(|&(_, c)| f64::from(c)).sum(),
                SumOver::Output => dense.iter().sum(),
            };
            let scale = if total == 0.0 { 0.0 } else { n.target_sum / total };
            dense.iter_mut().for_each(|v| *v *= scale);
        }
        if output.log1p {
            dense.iter_mut().for_each(|v| *v = v.ln_1p());
        }
        dense
    }

    proptest::proptest! {
        #[test]
        fn every_form_matches_a_dense_reference(
            cells in proptest::collection::vec(proptest::collection::btree_map(0u32..30, 1u32..60, 0..20), 1..8),
            picks in proptest::collection::vec(0usize..40, 1..30),
            target in 1.0f64..1e5,
            over_stored: bool,
            normalize: bool,
            log1p: bool,
            dense: bool,
            k in 1usize..12,
        ) {
            let stored: Vec<String> = (0..30).map(|g| format!("g{g}")).collect();
            let mut wanted: Vec<String> = Vec::new();
            for p in picks {
                let name = format!("g{p}");
                if !wanted.contains(&name) { wanted.push(name); }
            }
            let k = k.min(wanted.len());
            let over = if over_stored { SumOver::Stored } else { SumOver::Output };
            let output = BatchOutput {
                genes: Some(Arc::new(GeneMap::by_name(&stored, &wanted).unwrap())),
                normalize: normalize.then_some(Normalize { target_sum: target, over }),
                log1p,
                dense,
                top_k: Some(k),
                float32: false,
                unsorted: false,
            };
            output.check(30).unwrap();
            let mut m = CsrMatrix::empty(30);
            for cell in &cells {
                for (&g, &c) in cell { m.indices.push(g); m.data.push(c); }
                m.indptr.push(m.indices.len() as u64);
            }
            let formed = CellWriter::new(&output, 30).form(m);
            let width = wanted.len();
            proptest::prop_assert_eq!(formed.rows, cells.len());
            for (r, cell) in cells.iter().enumerate() {
                let row: Vec<(u32, u32)> = cell.iter().map(|(&g, &c)| (g, c)).collect();
                let want = reference(&row, &output, &stored, &wanted);
                let got: Vec<f64> = match (dense, output.scaled()) {
                    (true, true) => formed.values[r * width..(r + 1) * width].iter().map(|&v| f64::from(v)).collect(),
                    (true, false) => formed.dense_counts[r * width..(r + 1) * width].iter().map(|&v| f64::from(v)).collect(),
                    (false, scaled) => {
                        let (lo, hi) = (formed.x.indptr[r] as usize, formed.x.indptr[r + 1] as usize);
                        let mut d = vec![0f64; width];
                        for i in lo..hi {
                            let v = if scaled { f64::from(formed.values[i]) } else { f64::from(formed.x.data[i]) };
                            d[formed.x.indices[i] as usize] = v;
                        }
                        d
                    }
                };
                for (g, w) in got.iter().zip(&want) {
                    proptest::prop_assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "row {}: {:?} vs {:?}", r, got, want);
                }
                // Top k: the highest values, ties by stored column, -1 padded.
                let mut ranked: Vec<(f64, usize, usize)> = want.iter().enumerate().filter(|(j, _)| {
                    row.iter().any(|&(g, _)| stored[g as usize] == wanted[*j])
                }).map(|(j, &v)| (v, stored.iter().position(|s| *s == wanted[j]).unwrap(), j)).collect();
                ranked.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
                let tokens = &formed.top_k[r * k..(r + 1) * k];
                for (t, &tok) in tokens.iter().enumerate() {
                    match ranked.get(t) {
                        Some(&(v, _, j)) => {
                            let got_v = f64::from(formed.top_k_values[r * k + t]);
                            proptest::prop_assert!((got_v - v).abs() <= 1e-5 * v.abs().max(1.0));
                            // Equal values may come in either order only when f32 makes them equal.
                            if tok != j as i32 {
                                proptest::prop_assert!((f64::from(formed.top_k_values[r * k + t]) - want[tok as usize]).abs() <= 1e-5 * v.abs().max(1.0));
                            }
                        }
                        None => proptest::prop_assert_eq!(tok, -1),
                    }
                }
            }
        }
    }

    #[test]
    fn bad_outputs_are_refused_by_argument() {
        let check = |o: BatchOutput| o.check(10).unwrap_err().to_string();
        for t in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let o = BatchOutput {
                normalize: Some(Normalize { target_sum: t, over: SumOver::Stored }),
                ..BatchOutput::default()
            };
            assert!(check(o).starts_with("normalize:"));
        }
        assert!(check(BatchOutput { top_k: Some(0), ..BatchOutput::default() }).starts_with("top_k:"));
        assert!(check(BatchOutput { top_k: Some(11), ..BatchOutput::default() }).contains("at most 10"));
    }
}
