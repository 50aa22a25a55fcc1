//! Why an input could not be read: one error for every format, each variant
//! naming the file and the object inside it.

use std::path::PathBuf;

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
    /// An input at a URL that its store did not serve (refused, timed out,
    /// denied, not there): a failure of the store, not of the format. The
    /// storage error names the object.
    #[error(transparent)]
    Store(#[from] crate::storage::StorageError),
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
