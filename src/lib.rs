//! deltacells: compact tiled storage for single-cell count matrices.
//!
//! A dataset is a folder (or bucket prefix) of tiles, each a block of consecutive
//! cells in a compressed CSR form, plus a manifest and optional gene and cell
//! tables. [`format`] holds the byte layout; [`Dataset`] reads cells back.

pub mod format;
