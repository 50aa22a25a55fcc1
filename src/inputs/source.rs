//! The contract between conversion and the input formats: what convert needs
//! of an input, whatever its format. An input is a count matrix read in row
//! blocks ([`RawRows`], values not yet checked), its gene names, and two
//! tables, obs (one row per cell) and var (one row per gene), whose columns
//! come as [`FrameColumn`](super::FrameColumn)s. A format is a module
//! implementing [`InputSource`], and a case in [`super::open`].

use std::ops::Range;
use std::path::Path;

use super::counts::to_counts;
use super::error::InputError;
use super::rows::RawRows;
use super::table::Table;

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
