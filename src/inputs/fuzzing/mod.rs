//! What the fuzz targets (fuzz/fuzz_targets/) and their regression test
//! (tests/cli/fuzz_regressions.rs) share: each builds an input of its format
//! in a temporary folder from arbitrary bytes ([`mtx`], [`tenx_h5`],
//! [`zarr`]) and reads it as a conversion does ([`read_as_convert_does`]),
//! checking that every refusal names the file and that what is accepted is a
//! well-formed matrix of the sizes the input declares. Not part of the
//! library's API: hidden from its documentation, and only here so that a
//! fuzzer and the tests drive one code path.

mod mtx_case;
mod tenx_case;
mod zarr_case;

use std::ops::Range;
use std::path::Path;

use super::{error::InputError, open, to_counts, InputOptions};

pub use mtx_case::mtx;
pub use tenx_case::tenx_h5;
pub use zarr_case::zarr;

/// Rows read at the start of a matrix (and as many at its end): enough for
/// every matrix a fuzzer writes, and bounded for the ones that declare
/// billions of empty cells.
const ROWS_READ: u64 = 4096;

/// Rows read at once, as a conversion reads a block.
const BLOCK_ROWS: u64 = 61;

/// Arbitrary bytes taken as a sequence of choices; past their end every
/// choice is 0.
pub(crate) struct Choices<'a> {
    data: &'a [u8],
}

impl<'a> Choices<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Choices { data }
    }

    pub(crate) fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    pub(crate) fn i64(&mut self) -> i64 {
        let mut b = [0u8; 8];
        b.iter_mut().for_each(|x| *x = self.byte());
        i64::from_le_bytes(b)
    }

    /// One of `options`, chosen by the next byte.
    pub(crate) fn pick<T: Copy>(&mut self, options: &[T]) -> T {
        options[self.byte() as usize % options.len()]
    }

    /// At most `n` bytes.
    pub(crate) fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        self.take(self.data.len())
    }
}

/// Opens the input at `path` and reads it as a conversion does: its genes
/// and tables checked against the matrix's shape, obs's index and columns,
/// and its rows in blocks turned into counts. An error must name the file
/// (`name`, the input's file or folder name, appears in its message);
/// whatever is read must be a matrix of the declared shape.
///
/// # Panics
///
/// When an error does not name the file, or rows read disagree with the
/// shape: the findings a fuzzer reports.
pub fn read_as_convert_does(path: &Path) -> Result<(), InputError> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let result = read(path);
    if let Err(e) = &result {
        let text = crate::error_chain(e);
        assert!(text.contains(&name), "the error does not name the file {name}: {text}");
    }
    result
}

fn read(path: &Path) -> Result<(), InputError> {
    let source = open(path, "X", &InputOptions::default())?;
    let (n_rows, n_cols) = (source.n_rows(), source.n_cols());
    let genes = source.gene_names()?;
    assert_eq!(genes.len() as u64, n_cols);
    if let Some(obs) = source.obs()? {
        obs.check_rows(n_rows, "cells")?;
        let first = 0..n_rows.min(ROWS_READ) as usize;
        assert_eq!(obs.index(Some(first.clone()))?.len(), first.len());
        for column in obs.columns()? {
            assert_eq!(obs.column(&column, Some(&first), true)?.len(), first.len());
        }
    }
    source.var()?.check_rows(n_cols, "genes")?;
    let n_cols = u32::try_from(n_cols).expect("the formats refuse more than 2^31 genes");
    let head = 0..n_rows.min(ROWS_READ);
    let tail = n_rows.saturating_sub(ROWS_READ).max(head.end)..n_rows;
    for rows in [head, tail] {
        for start in rows.clone().step_by(BLOCK_ROWS as usize) {
            let block: Range<u64> = start..(start + BLOCK_ROWS).min(rows.end);
            let raw = source.read_rows(block.clone())?;
            assert_eq!(raw.indptr.len() as u64, block.end - block.start + 1, "rows {block:?}");
            assert_eq!(raw.indptr.first(), Some(&0));
            assert!(raw.indptr.windows(2).all(|w| w[0] <= w[1]), "rows {block:?}: indptr decreases");
            assert_eq!(raw.indptr.last().copied(), Some(raw.indices.len() as u64));
            assert_eq!(raw.indices.len(), raw.values.len());
            assert!(raw.indices.iter().all(|&c| c < n_cols), "rows {block:?}: a column outside 0..{n_cols}");
            // (a value that is not a count is the conversion's refusal to make)
            let _ = to_counts(&raw, n_cols, None);
        }
    }
    Ok(())
}
