//! deltacells: compact tiled storage for single-cell count matrices.
//!
//! A dataset is a folder (or bucket prefix) of tiles, each a block of consecutive
//! cells in a compressed CSR form, plus a manifest and optional gene and cell
//! tables. [`format`](mod@format) holds the byte layout; [`Dataset`] reads cells back;
//! [`verify`] checks a whole dataset; [`storage`] is where the bytes live.

#[cfg(feature = "convert")]
pub mod convert;
pub mod dataset;
pub mod format;
#[cfg(feature = "convert")]
pub mod h5ad;
pub mod info;
pub mod obs;
pub mod storage;
pub mod verify;
pub mod writer;

pub use dataset::{Dataset, DatasetError};
pub use format::CsrMatrix;

/// An error and its causes on one line, `outer: inner: innermost`, each printed
/// once (the library's errors leave their cause to `source()`).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}
