//! Why an input could not be read: one error for every format, each variant
//! naming the file and the object inside it.

use std::path::PathBuf;

pub use crate::causes::{Advised, Cause, Context, Whole};

/// An HDF5 error as deltacells prints it: its first line (or all of it), and
/// what it most likely means when the caller knows. The error itself is
/// [`error`](Hdf5Error::error), for a caller that wants more than the text.
#[derive(Debug)]
pub struct Hdf5Error {
    error: hdf5::Error,
    first_line: bool,
    hint: Option<String>,
}

impl Hdf5Error {
    /// The whole text of `error`.
    pub fn new(error: hdf5::Error) -> Hdf5Error {
        Hdf5Error { error, first_line: false, hint: None }
    }

    /// The first line of `error`'s text (HDF5's can carry its error stack).
    pub fn first_line(error: hdf5::Error) -> Hdf5Error {
        Hdf5Error { error, first_line: true, hint: None }
    }

    /// With `hint`, in parentheses after the text.
    pub fn hint(mut self, hint: impl Into<String>) -> Hdf5Error {
        self.hint = Some(hint.into());
        self
    }

    /// Without its hint (why a read under it failed takes the hint's place).
    pub(crate) fn without_hint(self) -> Hdf5Error {
        Hdf5Error { hint: None, ..self }
    }

    pub fn error(&self) -> &hdf5::Error {
        &self.error
    }
}

impl std::fmt::Display for Hdf5Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.error.to_string();
        let text = if self.first_line { text.lines().next().unwrap_or("") } else { &text };
        match &self.hint {
            Some(hint) => write!(f, "{text} ({hint})"),
            None => f.write_str(text),
        }
    }
}

// (the text is the error's: no source, or it would print twice)
impl std::error::Error for Hdf5Error {}

/// An error of a file at a URL whose read failed under it, with why (HDF5
/// says only that a read failed): `error's first line (reading the object
/// failed: why)`. Both are kept as the values they are.
#[derive(Debug)]
pub struct FailedRead {
    error: Cause,
    failure: crate::inputs::remote::Failure,
}

impl FailedRead {
    pub(crate) fn new(error: impl Into<Cause>, failure: crate::inputs::remote::Failure) -> FailedRead {
        FailedRead { error: error.into(), failure }
    }

    /// The error the read's failure came under (HDF5's, or a rule it broke).
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self.error.as_ref()
    }

    /// Why the read failed: the store's error, or a read that panicked.
    pub fn failure(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self.failure.0.as_ref()
    }
}

impl std::fmt::Display for FailedRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let error = crate::error_chain(self.error.as_ref());
        let failure = crate::error_chain(&self.failure);
        write!(f, "{} (reading the object failed: {failure})", error.lines().next().unwrap_or(""))
    }
}

// (why the read failed is printed inside the parentheses, which a source()
// cannot be: no source, or it would print twice)
impl std::error::Error for FailedRead {}

/// Why an input file could not be read. Each variant names the file and the
/// object inside it (for .h5ad files, the HDF5 path: `X/data`, `obs/cell_type`).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A file that is not one of its format, by a rule it breaks.
    #[error("{path}: cannot open as {format}: {message}")]
    Open { path: PathBuf, format: &'static str, message: String },
    /// A file that could not be opened as its format: the library or the
    /// system that failed is the source.
    #[error("{path}: cannot open as {format}")]
    OpenFailed { path: PathBuf, format: &'static str, source: Cause },
    /// An object of a file that breaks a rule of its format.
    #[error("{path}: {object}: {message}")]
    Invalid { path: PathBuf, object: String, message: String },
    /// An object of a file that could not be read: the library or the system
    /// that failed is the source.
    #[error("{path}: {object}")]
    Read { path: PathBuf, object: String, source: Cause },
    #[error("{path}: {object}: unsupported: {message}")]
    Unsupported { path: PathBuf, object: String, message: String },
    /// An object whose type the library that reads it does not know; that
    /// library's error is the source.
    #[error("{path}: {object}: unsupported")]
    UnsupportedBy { path: PathBuf, object: String, source: Cause },
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
