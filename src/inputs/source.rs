//! The contract between conversion and the input formats: what convert needs
//! of an input, whatever its format. An input is a count matrix read in row
//! blocks ([`RawRows`], values not yet checked), its gene names, and two
//! tables, obs (one row per cell) and var (one row per gene), whose columns
//! come as [`FrameColumn`]s. A format is a module implementing
//! [`InputSource`], and a case in [`super::open`].
//!
//! Turning stored values into counts ([`to_counts`]) is the same for every
//! format, so it is here too.

use std::ops::Range;
use std::path::{Path, PathBuf};

use arrow_array::ArrayRef;

use crate::format::{CsrMatrix, MAX_COUNT};

/// Why an input file could not be read. Each variant names the file and the
/// object inside it (for .h5ad files, the HDF5 path: `X/data`, `obs/cell_type`).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{path}: cannot open as {format}: {message}")]
    Open { path: PathBuf, format: &'static str, message: String },
    #[error("{path}: {object}: {message}")]
    Invalid { path: PathBuf, object: String, message: String },
    #[error("{path}: {object}: unsupported: {message}")]
    Unsupported { path: PathBuf, object: String, message: String },
    /// A column of a table whose type the format cannot store.
    #[error("{path}: {table}/{column}: unsupported: {what}, which deltacells cannot store", path = path.display())]
    ColumnType { path: PathBuf, table: String, column: String, what: String },
    #[error("{0}")]
    BadCount(Box<BadCount>),
    #[error("{path}: the file changed since it was planned ({was} then, {now} now); plan again", path = path.display())]
    Changed { path: PathBuf, was: String, now: String },
}

/// A value that is not a count, with everything needed to find it.
#[derive(Debug, thiserror::Error)]
#[error(
    "{path}: {matrix}: cell {row}{obs_name}, gene {gene}{var_name}: {problem}{}",
    counts_in.as_ref().map(|m| format!("; {m} holds counts")).unwrap_or_default(),
    path = path.display()
)]
pub struct BadCount {
    pub path: PathBuf,
    pub matrix: String,
    pub row: u64,
    /// " (name)" or empty.
    pub obs_name: String,
    pub gene: u64,
    /// " (name)" or empty.
    pub var_name: String,
    pub problem: String,
    /// Another matrix of the file that holds counts.
    pub counts_in: Option<String>,
}

/// Rows of a matrix as stored, before they are checked as counts: CSR with
/// indptr relative to the first row and values of any numeric type as f64.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawRows {
    pub indptr: Vec<u64>,
    pub indices: Vec<u32>,
    pub values: Vec<f64>,
}

impl RawRows {
    /// Rows `rows` of a matrix held whole as one block (the caller checked
    /// that they are rows of it).
    pub fn rows(&self, rows: Range<u64>) -> RawRows {
        let (first, last) = (rows.start as usize, rows.end as usize);
        let (lo, hi) = (self.indptr[first] as usize, self.indptr[last] as usize);
        RawRows {
            indptr: self.indptr[first..=last].iter().map(|&p| p - lo as u64).collect(),
            indices: self.indices[lo..hi].to_vec(),
            values: self.values[lo..hi].to_vec(),
        }
    }

    /// The rows of a dense block, each an iterator of its values; zeros are
    /// left out.
    pub fn from_dense_rows<'a, R: IntoIterator<Item = &'a f64>>(rows: impl Iterator<Item = R>) -> RawRows {
        let mut out = RawRows { indptr: vec![0], ..Default::default() };
        for row in rows {
            for (j, &v) in row.into_iter().enumerate() {
                if v != 0.0 {
                    out.indices.push(j as u32);
                    out.values.push(v);
                }
            }
            out.indptr.push(out.indices.len() as u64);
        }
        out
    }

    /// A matrix stored by column (CSC: `colptr` over the columns, each
    /// entry's row in `rows_of`, checked to be below `n_rows`) as rows.
    pub fn from_columns(colptr: &[u64], rows_of: &[u32], values: &[f64], n_rows: u64) -> RawRows {
        let mut starts = vec![0u64; n_rows as usize + 1];
        for &r in rows_of {
            starts[r as usize + 1] += 1;
        }
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        let indptr = starts.clone();
        let mut indices = vec![0u32; rows_of.len()];
        let mut out = vec![0f64; rows_of.len()];
        for (col, w) in colptr.windows(2).enumerate() {
            for k in w[0] as usize..w[1] as usize {
                let r = rows_of[k] as usize;
                let at = starts[r] as usize;
                indices[at] = col as u32;
                out[at] = values[k];
                starts[r] += 1;
            }
        }
        RawRows { indptr, indices, values: out }
    }
}

/// The rows in `cell`, made by `make` on first use: a matrix that is read
/// whole once (CSC, which cannot be read by rows).
pub fn made_once<E>(
    cell: &std::sync::OnceLock<RawRows>,
    make: impl FnOnce() -> Result<RawRows, E>,
) -> Result<&RawRows, E> {
    if let Some(made) = cell.get() {
        return Ok(made);
    }
    let made = make()?;
    Ok(cell.get_or_init(|| made))
}

/// Checks entries `first..` of a sparse matrix's indptr as stored: never
/// decreasing, each within the `n_entries` stored entries. On failure, the
/// entry's position and what is wrong with it.
pub fn checked_indptr(raw: Vec<i64>, first: u64, n_entries: i64) -> Result<Vec<u64>, (u64, String)> {
    for (k, w) in raw.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err((first + k as u64 + 1, format!("{} is below the previous entry {}", w[1], w[0])));
        }
    }
    if let Some((k, &v)) = raw.iter().enumerate().find(|(_, &v)| v < 0 || v > n_entries) {
        return Err((first + k as u64, format!("{v} points outside the {n_entries} stored entries")));
    }
    Ok(raw.into_iter().map(|v| v as u64).collect())
}

/// Checks entries `first..` of a sparse matrix's indices as stored: each
/// below `minor` (the columns of CSR, the rows of CSC). On failure, the
/// entry's position and what is wrong with it.
pub fn checked_indices(raw: Vec<i64>, first: u64, minor: u64) -> Result<Vec<u32>, (u64, String)> {
    if let Some((k, &v)) = raw.iter().enumerate().find(|(_, &v)| v < 0 || v as u64 >= minor) {
        return Err((first + k as u64, format!("index {v} outside 0..{minor}")));
    }
    Ok(raw.into_iter().map(|v| v as u32).collect())
}

/// The vocabulary of a categorical column, in its own type.
#[derive(Clone, Debug, PartialEq)]
pub enum Categories {
    Strings(Vec<String>),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Bools(Vec<bool>),
}

impl Categories {
    pub fn len(&self) -> usize {
        match self {
            Categories::Strings(v) => v.len(),
            Categories::Ints(v) => v.len(),
            Categories::Floats(v) => v.len(),
            Categories::Bools(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One column, as read.
#[derive(Clone, Debug)]
pub enum FrameColumn {
    /// Codes (-1 for missing) into `categories`.
    Category {
        codes: Vec<i32>,
        categories: Categories,
        ordered: bool,
    },
    /// An Arrow array of the source's numeric type; missing values (masked, or
    /// NaN in floats) are nulls.
    Numeric(ArrayRef),
    Bool(Vec<Option<bool>>),
    String(Vec<Option<String>>),
}

impl FrameColumn {
    pub fn len(&self) -> usize {
        match self {
            FrameColumn::Category { codes, .. } => codes.len(),
            FrameColumn::Numeric(a) => a.len(),
            FrameColumn::Bool(v) => v.len(),
            FrameColumn::String(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A table of an input: obs (one row per cell) or var (one row per gene).
pub trait Table {
    /// Where the table is, for messages (`obs`, `var`, `raw/var`).
    fn name(&self) -> &str;
    /// The index's name (`_index` when unnamed, as anndata writes it).
    fn index_name(&self) -> Result<String, InputError>;
    /// Rows `rows` (all when None) of the index: the cell or gene names.
    fn index(&self, rows: Option<Range<usize>>) -> Result<Vec<String>, InputError>;
    /// The columns, in order (the index not among them).
    fn columns(&self) -> Result<Vec<String>, InputError>;
    /// Rows `rows` (all when None) of column `name`. A categorical column's
    /// vocabulary is read only `with_categories` (otherwise its length is, to
    /// check the codes, and `categories` is empty).
    fn column(&self, name: &str, rows: Option<&Range<usize>>, with_categories: bool)
        -> Result<FrameColumn, InputError>;
    /// Checks that the index and every column have `rows` rows; `what` names
    /// a row in the message ("cells", "genes").
    fn check_rows(&self, rows: u64, what: &str) -> Result<(), InputError>;
    /// An error about `object` of this table's file.
    fn invalid(&self, object: &str, message: String) -> InputError;
}

/// A table borrowed: what an input that holds its tables in memory returns
/// from [`InputSource::var`] and [`InputSource::obs`], instead of a copy.
impl<T: Table + ?Sized> Table for &T {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn index_name(&self) -> Result<String, InputError> {
        (**self).index_name()
    }

    fn index(&self, rows: Option<Range<usize>>) -> Result<Vec<String>, InputError> {
        (**self).index(rows)
    }

    fn columns(&self) -> Result<Vec<String>, InputError> {
        (**self).columns()
    }

    fn column(
        &self,
        name: &str,
        rows: Option<&Range<usize>>,
        with_categories: bool,
    ) -> Result<FrameColumn, InputError> {
        (**self).column(name, rows, with_categories)
    }

    fn check_rows(&self, rows: u64, what: &str) -> Result<(), InputError> {
        (**self).check_rows(rows, what)
    }

    fn invalid(&self, object: &str, message: String) -> InputError {
        (**self).invalid(object, message)
    }
}

/// A table held in memory whole: the tables of formats that store them as
/// small arrays or text files (10x features, Matrix Market's features and
/// barcodes), and those of an AnnData object handed over in memory.
#[derive(Clone, Debug)]
pub struct MemoryTable {
    /// The file, for messages.
    pub path: PathBuf,
    /// The table, for messages (`obs`, `var`).
    pub name: String,
    /// The index's name: `_index` when unnamed, as anndata writes it.
    pub index_name: String,
    pub index: Vec<String>,
    pub columns: Vec<(String, FrameColumn)>,
}

impl MemoryTable {
    /// A column of strings with few distinct values, as a categorical whose
    /// vocabulary is sorted (as pandas sorts one it infers).
    pub fn category_of(values: &[String]) -> FrameColumn {
        let mut categories: Vec<String> = values.to_vec();
        categories.sort_unstable();
        categories.dedup();
        let codes = values.iter().map(|v| categories.binary_search(v).map_or(-1, |c| c as i32)).collect();
        FrameColumn::Category { codes, categories: Categories::Strings(categories), ordered: false }
    }
}

impl Table for MemoryTable {
    fn name(&self) -> &str {
        &self.name
    }

    fn index_name(&self) -> Result<String, InputError> {
        Ok(self.index_name.clone())
    }

    fn index(&self, rows: Option<Range<usize>>) -> Result<Vec<String>, InputError> {
        let rows = rows.unwrap_or(0..self.index.len());
        match self.index.get(rows.clone()) {
            Some(names) => Ok(names.to_vec()),
            None => Err(self.invalid(&self.name, format!("rows {rows:?} outside 0..{}", self.index.len()))),
        }
    }

    fn columns(&self) -> Result<Vec<String>, InputError> {
        Ok(self.columns.iter().map(|(n, _)| n.clone()).collect())
    }

    fn column(
        &self,
        name: &str,
        rows: Option<&Range<usize>>,
        with_categories: bool,
    ) -> Result<FrameColumn, InputError> {
        let object = format!("{}/{name}", self.name);
        let Some((_, column)) = self.columns.iter().find(|(n, _)| n == name) else {
            return Err(self.invalid(&object, "not found".into()));
        };
        let rows = rows.cloned().unwrap_or(0..column.len());
        if rows.start > rows.end || rows.end > column.len() {
            return Err(self.invalid(&object, format!("rows {rows:?} outside 0..{}", column.len())));
        }
        Ok(match column {
            FrameColumn::Category { codes, categories, ordered } => FrameColumn::Category {
                codes: codes[rows].to_vec(),
                categories: if with_categories { categories.clone() } else { Categories::Strings(Vec::new()) },
                ordered: *ordered,
            },
            FrameColumn::Numeric(a) => FrameColumn::Numeric(a.slice(rows.start, rows.len())),
            FrameColumn::Bool(v) => FrameColumn::Bool(v[rows].to_vec()),
            FrameColumn::String(v) => FrameColumn::String(v[rows].to_vec()),
        })
    }

    fn check_rows(&self, rows: u64, what: &str) -> Result<(), InputError> {
        let lengths = std::iter::once((self.name.clone(), self.index.len()))
            .chain(self.columns.iter().map(|(n, c)| (format!("{}/{n}", self.name), c.len())));
        for (object, len) in lengths {
            if len as u64 != rows {
                return Err(self.invalid(&object, format!("has {len} rows, but the matrix has {rows} {what}")));
            }
        }
        Ok(())
    }

    fn invalid(&self, object: &str, message: String) -> InputError {
        InputError::Invalid { path: self.path.clone(), object: object.to_string(), message }
    }
}

/// One input file, opened for conversion. Reading is `&self`, so that the
/// matrix can be read while a table of the same file is borrowed, and on the
/// thread that the conversion's reading runs on.
pub trait InputSource: Send + Sync {
    /// The file, for messages.
    fn path(&self) -> &Path;
    /// The matrix being converted, as the user named it (`X`, `raw/X`).
    fn matrix_name(&self) -> &str;
    /// Cells (rows) and genes (columns) of the matrix being converted.
    fn n_rows(&self) -> u64;
    fn n_cols(&self) -> u64;
    /// Rows `rows` of the matrix as stored.
    fn read_rows(&self, rows: Range<u64>) -> Result<RawRows, InputError>;
    /// The gene table that goes with the matrix.
    fn var(&self) -> Result<Box<dyn Table + '_>, InputError>;
    /// The cell table, when the file has one.
    fn obs(&self) -> Result<Option<Box<dyn Table + '_>>, InputError>;
    /// Another matrix of the file whose first rows are counts, for the message
    /// about a matrix that is not (`raw/X holds counts`).
    fn counts_elsewhere(&self) -> Option<String>;
    /// Says that the whole matrix is going to be read, after the inputs that
    /// said so before: an input fetched over a network starts fetching it
    /// ahead of the reads. Nothing for local files.
    fn will_read_whole(&self) {}

    /// The gene names, checked to be one per column.
    fn gene_names(&self) -> Result<Vec<String>, InputError> {
        let var = self.var()?;
        let names = var.index(None)?;
        if names.len() as u64 != self.n_cols() {
            return Err(InputError::Invalid {
                path: self.path().to_path_buf(),
                object: var.name().to_string(),
                message: format!("has {} genes but {} has {} columns", names.len(), self.matrix_name(), self.n_cols()),
            });
        }
        Ok(names)
    }
}

/// Rows of another matrix read to tell whether it holds counts, for the
/// message that refuses a matrix that does not (`raw/X holds counts`).
pub const COUNTS_PROBE_ROWS: u64 = 1000;

/// Whether the first rows ([`COUNTS_PROBE_ROWS`] at most) of a matrix of
/// `n_rows` x `n_cols`, read by `read`, are counts: false for a matrix
/// without rows or whose rows cannot be read. What every format's
/// [`InputSource::counts_elsewhere`] asks of its other matrices.
pub fn first_rows_are_counts<E>(n_rows: u64, n_cols: u64, read: impl FnOnce(Range<u64>) -> Result<RawRows, E>) -> bool {
    let rows = n_rows.min(COUNTS_PROBE_ROWS);
    rows > 0 && read(0..rows).is_ok_and(|raw| to_counts(&raw, n_cols as u32, None).is_ok())
}

/// A value that is not a count, found by [`to_counts`].
#[derive(Clone, Debug, PartialEq)]
pub struct BadValue {
    /// Row within the block.
    pub row: u64,
    pub gene: u64,
    pub problem: String,
}

/// What [`to_counts`] left out or merged, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    /// Nonzeros of genes the dataset does not store.
    pub dropped: u64,
    /// Entries of a cell and gene that another entry of the same cell and
    /// gene came before: summed into it.
    pub summed: u64,
}

impl std::ops::AddAssign for Cleaned {
    fn add_assign(&mut self, other: Cleaned) {
        self.dropped += other.dropped;
        self.summed += other.summed;
    }
}

/// A column that [`to_counts`] leaves out (a gene the dataset does not store).
pub const DROPPED_COLUMN: u32 = u32::MAX;

/// Turns stored rows into counts: every value must be a whole number in
/// 0..2^31-1; zeros are dropped, column indices are mapped through `remap`
/// (source column -> output column) when given, sorted within each row, and
/// duplicates summed. Columns that `remap` maps to [`DROPPED_COLUMN`] are left
/// out (after their values were checked); the second value counts their
/// nonzeros and the duplicates summed.
pub fn to_counts(raw: &RawRows, n_cols: u32, remap: Option<&[u32]>) -> Result<(CsrMatrix, Cleaned), BadValue> {
    let mut cleaned = Cleaned::default();
    let mut out = CsrMatrix::empty(n_cols);
    out.indices.reserve(raw.indices.len());
    out.data.reserve(raw.values.len());
    let mut row_buf: Vec<(u32, u32)> = Vec::new();
    for (r, w) in raw.indptr.windows(2).enumerate() {
        row_buf.clear();
        let mut sorted = true;
        let mut previous: Option<u32> = None;
        for k in w[0] as usize..w[1] as usize {
            let source = raw.indices[k];
            let v = raw.values[k];
            if !(v >= 0.0 && v <= f64::from(MAX_COUNT) && v.fract() == 0.0) {
                let problem = if v.is_nan() {
                    "value NaN is not a count".to_string()
                } else if v < 0.0 {
                    format!("value {v} is negative")
                } else if v > f64::from(MAX_COUNT) {
                    format!("value {v} is above the largest count 2^31-1")
                } else {
                    format!("value {v} is not an integer count")
                };
                return Err(BadValue { row: r as u64, gene: source.into(), problem });
            }
            if v == 0.0 {
                continue;
            }
            let column = remap.map_or(source, |m| m[source as usize]);
            if column == DROPPED_COLUMN {
                cleaned.dropped += 1;
                continue;
            }
            if previous.is_some_and(|p| column <= p) {
                sorted = false;
            }
            previous = Some(column);
            row_buf.push((column, v as u32));
        }
        if !sorted {
            row_buf.sort_unstable_by_key(|&(c, _)| c);
            let mut merged: Vec<(u32, u32)> = Vec::with_capacity(row_buf.len());
            for &(c, v) in &row_buf {
                match merged.last_mut() {
                    Some(last) if last.0 == c => {
                        let sum = u64::from(last.1) + u64::from(v);
                        if sum > u64::from(MAX_COUNT) {
                            let gene = raw.indices[w[0] as usize..w[1] as usize]
                                .iter()
                                .copied()
                                .find(|&s| remap.map_or(s, |m| m[s as usize]) == c)
                                .unwrap_or(c);
                            return Err(BadValue {
                                row: r as u64,
                                gene: gene.into(),
                                problem: format!("duplicate entries sum to {sum}, above the largest count 2^31-1"),
                            });
                        }
                        last.1 = sum as u32;
                        cleaned.summed += 1;
                    }
                    _ => merged.push((c, v)),
                }
            }
            row_buf = merged;
        }
        for &(c, v) in &row_buf {
            out.indices.push(c);
            out.data.push(v);
        }
        out.indptr.push(out.indices.len() as u64);
    }
    Ok((out, cleaned))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(rows: &[&[(u32, f64)]]) -> RawRows {
        let mut r = RawRows { indptr: vec![0], ..Default::default() };
        for row in rows {
            for &(i, v) in *row {
                r.indices.push(i);
                r.values.push(v);
            }
            r.indptr.push(r.indices.len() as u64);
        }
        r
    }

    #[test]
    fn counts_are_cleaned() {
        // explicit zero dropped, unsorted sorted, duplicates summed
        let (m, cleaned) = to_counts(&raw(&[&[(3, 2.0), (1, 0.0), (0, 1.0), (3, 5.0)], &[]]), 5, None).unwrap();
        assert_eq!(cleaned, Cleaned { dropped: 0, summed: 1 });
        assert_eq!(m.indptr, vec![0, 2, 2]);
        assert_eq!(m.indices, vec![0, 3]);
        assert_eq!(m.data, vec![1, 7]);
        // remapped columns are sorted in output order
        let (m, cleaned) = to_counts(&raw(&[&[(0, 1.0), (1, 2.0), (2, 3.0)]]), 3, Some(&[2, 0, 1])).unwrap();
        assert_eq!((m.indices, m.data, cleaned), (vec![0, 1, 2], vec![2, 3, 1], Cleaned::default()));
        // columns mapped to DROPPED_COLUMN are left out and counted
        let (m, cleaned) =
            to_counts(&raw(&[&[(0, 1.0), (1, 2.0), (2, 3.0)], &[(1, 4.0)]]), 2, Some(&[1, DROPPED_COLUMN, 0])).unwrap();
        assert_eq!((m.indptr, m.indices, m.data, cleaned.dropped), (vec![0, 2, 2], vec![0, 1], vec![3, 1], 2));
    }

    #[test]
    fn columns_dense_rows_and_slices_give_the_same_rows() {
        // rows: [(0, 1), (2, 5)], [], [(1, 2)]
        let want = raw(&[&[(0, 1.0), (2, 5.0)], &[], &[(1, 2.0)]]);
        let by_column = RawRows::from_columns(&[0, 1, 2, 3], &[0, 2, 0], &[1.0, 2.0, 5.0], 3);
        assert_eq!(by_column, want);
        let dense = [1.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0];
        assert_eq!(RawRows::from_dense_rows(dense.chunks(3)), want);
        assert_eq!(want.rows(1..3), raw(&[&[], &[(1, 2.0)]]));
        assert_eq!(want.rows(2..2), raw(&[]));
        assert_eq!(checked_indptr(vec![0, 2, 2, 3], 5, 3), Ok(vec![0, 2, 2, 3]));
        assert_eq!(checked_indptr(vec![0, 2, 1], 5, 3).unwrap_err().0, 7);
        assert!(checked_indptr(vec![0, 4], 0, 3).unwrap_err().1.contains("outside the 3 stored entries"));
        assert_eq!(checked_indices(vec![0, 3, 1], 10, 3).unwrap_err(), (11, "index 3 outside 0..3".into()));
        assert_eq!(checked_indices(vec![-1], 0, 3).unwrap_err().0, 0);
    }

    #[test]
    fn non_counts_are_named() {
        let bad = |v: f64| to_counts(&raw(&[&[], &[(0, 1.0), (4, v)]]), 5, None).unwrap_err();
        let e = bad(2.5);
        assert_eq!((e.row, e.gene), (1, 4));
        assert!(e.problem.contains("2.5 is not an integer"), "{}", e.problem);
        assert!(bad(-1.0).problem.contains("negative"));
        assert!(bad(f64::NAN).problem.contains("NaN"));
        assert!(bad(2147483648.0).problem.contains("above"));
        assert!(to_counts(&raw(&[&[(0, 2147483647.0)]]), 5, None).is_ok());
        let e = to_counts(&raw(&[&[(1, 2147483647.0), (1, 1.0)]]), 5, None).unwrap_err();
        assert!(e.problem.contains("duplicate"), "{}", e.problem);
    }
}
