//! deltacells: compact tiled storage for single-cell count matrices.
//!
//! A dataset is a folder (or bucket prefix) of tiles, each a block of consecutive
//! cells in a compressed CSR form, plus a manifest and optional gene and cell
//! tables. [`format`] holds the byte layout; [`Dataset`] reads cells back;
//! [`verify`] checks a whole dataset; [`storage`] is where the bytes live.

pub mod convert;
pub mod dataset;
pub mod format;
pub mod h5ad;
pub mod info;
pub mod obs;
pub mod storage;
pub mod verify;
pub mod writer;

pub use dataset::{Dataset, DatasetError};
pub use format::CsrMatrix;
