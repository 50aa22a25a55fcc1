//! deltacells: compact tiled storage for single-cell count matrices.
//!
//! A dataset is a folder (or bucket prefix) of tiles, each a block of consecutive
//! cells in a compressed CSR form, plus a manifest and optional gene and cell
//! tables (docs/format.md in the repository describes every byte).
//!
//! # Reading
//!
//! [`Dataset`] opens a dataset in any [`storage`] (a local folder, `s3://`,
//! `gs://`, `http(s)://`) and reads cells by tile, by range or by list;
//! [`obs::localize`] copies cell-metadata columns into the local cache that
//! training jobs memory-map; [`verify`] checks a whole dataset and [`info`]
//! summarizes one. [`format`](mod@format) is the byte layout itself (tile codec,
//! manifest, obs schema, fingerprint), usable on its own.
//!
//! ```no_run
//! let ds = deltacells::Dataset::open("out/pbmc_1k")?;
//! let cells = ds.read(deltacells::Selection::List(&[5, 0, 999]))?; // CSR, rows in the order asked
//! assert_eq!(cells.n_rows(), 3);
//! # Ok::<(), deltacells::DatasetError>(())
//! ```
//!
//! # Features
//!
//! With no feature at all, the crate is that reading core (and [`writer`]):
//! it builds without HDF5, a command-line parser or progress bars.
//! - `convert`: reading `.h5ad` and 10x Genomics `.h5` files (HDF5, built
//!   from source and linked statically), Matrix Market files and AnnData
//!   zarr stores (`inputs`), turning them into datasets (`convert`), and
//!   writing datasets back as `.h5ad` files (`export`).
//! - `cli` (default): the command line ([`run_command_line`]), which the
//!   `deltacells` binary and the Python package's `deltacells` console script
//!   run; implies `convert`.
//!
//! # Errors
//!
//! Every error names the file or object and the place in it, and leaves its
//! cause to [`std::error::Error::source`]; [`error_chain`] prints the whole
//! chain on one line. No function panics on bad bytes. No message carries a
//! credential: [`redact`] masks those of URLs wherever one becomes text.

pub mod batch;
pub mod buffers;
pub mod causes;
#[cfg(feature = "cli")]
mod cli;
pub mod collection;
#[cfg(feature = "cli")]
mod commands;
#[cfg(feature = "convert")]
pub mod convert;
pub mod dataset;
#[cfg(feature = "convert")]
pub mod export;
pub mod format;
pub mod info;
#[cfg(feature = "convert")]
pub mod inputs;
pub mod loader;
pub mod obs;
pub mod planned;
pub mod redact;
pub mod storage;
pub mod verify;
pub mod vocabulary;
pub mod writer;

#[cfg(feature = "cli")]
pub use commands::main as run_command_line;
pub use dataset::{Dataset, DatasetError, ReadOptions, Selection};
pub use format::CsrMatrix;

/// An error and its causes on one line, `outer: inner: innermost`, each printed
/// once (the library's errors leave their cause to `source()`), with any
/// credential a URL in it carries [`redact`](redact::redact)ed.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    redact::redact(&text).into_owned()
}
