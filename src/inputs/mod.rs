//! Every input format behind one seam: what conversion needs of an input,
//! whatever its format ([`InputSource`], with its row blocks, tables and
//! errors), and the one place that knows the formats: [`InputFormat`] names
//! them, [`open`] tells an input's format from its name and content and
//! opens it with the format's module, and [`input_version`] gives the facts
//! of an input (at a URL, its size and entity tag) that a sharded conversion
//! checks.
//!
//! Each format is a module implementing [`InputSource`]: [`h5ad`] (AnnData's
//! HDF5 file, whose HDF5 reading [`tenx`] shares), [`tenx`] (Cell Ranger's
//! `.h5`), [`mtx`] (Matrix Market) and [`zarr`] (AnnData's zarr store).
//! Inputs at URLs are read by ranges through [`remote`], which they share.
//! Nothing here knows conversion (the client) or the tile format.

use std::path::{Path, PathBuf};

mod counts;
mod error;
mod features;
mod format;
#[doc(hidden)]
pub mod fuzzing;
pub mod h5ad;
pub mod mtx;
mod options;
pub mod remote;
mod rows;
mod source;
mod table;
pub mod tenx;
pub mod zarr;

pub use counts::{count_of, to_counts, BadValue, Cleaned, DROPPED_COLUMN};
pub use error::{Advised, BadCount, Cause, Context, FailedRead, Hdf5Error, InputError, Whole};
use format::format_by_name;
pub use format::InputFormat;
use options::Shared;
pub use options::{InputOptions, InputReading, ProvidedInput};
use remote::is_url;
pub(crate) use rows::with_values;
pub use rows::{checked_indices, checked_indptr, made_once, RawRows, Value, Values};
pub use source::{first_rows_are_counts, InputSource, COUNTS_PROBE_ROWS};
pub use table::{Categories, FrameColumn, MemoryTable, Table};

/// The size of an input in bytes (of the object, for a URL), if it can be had.
pub fn input_size(path: &Path, options: &InputOptions) -> Option<u64> {
    input_version(path, options).map(|v| v.size)
}

/// The size of an input and, for an object at a URL, its entity tag: what a
/// shard compares with the plan's record to refuse a file that changed. For
/// a Matrix Market folder, the matrix file's.
pub fn input_version(path: &Path, options: &InputOptions) -> Option<crate::storage::Version> {
    if options.provided(path).is_some() {
        return None;
    }
    if is_url(path) {
        return remote::object_version(&path.to_string_lossy(), &options.remote.store).ok();
    }
    let file = match path.is_dir() {
        // (a zarr store's root metadata: its arrays are not followed)
        true if zarr::is_zarr(path) => ["zarr.json", ".zgroup"].iter().map(|n| path.join(n)).find(|p| p.is_file())?,
        true => mtx::matrix_file(path).ok()?,
        false => path.to_path_buf(),
    };
    std::fs::metadata(file).map(|m| crate::storage::Version { size: m.len(), etag: None }).ok()
}

/// How a version reads in a message: `37393704 bytes`, `, ETag "..."` after
/// it when there is one.
pub(crate) fn describe_version(version: &crate::storage::Version) -> String {
    match &version.etag {
        Some(tag) => format!("{} bytes, ETag {tag}", version.size),
        None => format!("{} bytes", version.size),
    }
}

/// Opens `path` (a local file or folder, or an s3://, gs:// or http(s)://
/// URL, read by ranges) for conversion of its matrix `matrix` (`X`, `raw/X`,
/// `layers/NAME` of an .h5ad file; `X`, the one matrix, of the other
/// formats), in the format `options.reading` names or else the one its name
/// and content tell.
pub fn open(path: &Path, matrix: &str, options: &InputOptions) -> Result<Box<dyn InputSource>, InputError> {
    if let Some(source) = options.provided(path) {
        return Ok(Box::new(Shared(source.clone())));
    }
    let reading = &options.reading;
    let tenx = |file: h5ad::H5adFile| -> Result<Box<dyn InputSource>, InputError> {
        only_x(path, matrix, InputFormat::TenxH5)?;
        let (feature_type, genome) = (reading.feature_type.as_deref(), reading.genome.as_deref());
        Ok(Box::new(tenx::TenxSource::open(file, feature_type, genome)?))
    };
    match reading.format.or_else(|| format_by_name(path)) {
        Some(InputFormat::Mtx) => {
            only_x(path, matrix, InputFormat::Mtx)?;
            if let Some(genome) = &reading.genome {
                return Err(InputError::Unsupported {
                    path: path.to_path_buf(),
                    object: "--genome".into(),
                    message: format!(
                        "{genome:?} names a genome of a 10x .h5 file; a Matrix Market input's features have none"
                    ),
                });
            }
            Ok(Box::new(mtx::MtxSource::open(path, &options.remote, reading.feature_type.as_deref())?))
        }
        Some(InputFormat::TenxH5) => tenx(h5ad::H5adFile::open_with(path, &options.remote)?),
        Some(InputFormat::H5ad) => Ok(Box::new(h5ad::H5adSource::open_with(path, matrix, &options.remote)?)),
        Some(InputFormat::Zarr) => Ok(Box::new(zarr::ZarrSource::open(path, matrix, &options.remote)?)),
        None => {
            // An HDF5 file: Cell Ranger's layout, or else AnnData's.
            let file = h5ad::H5adFile::open_with(path, &options.remote)?;
            if tenx::is_tenx(&file) {
                tenx(file)
            } else {
                Ok(Box::new(h5ad::H5adSource::from_file(file, matrix)?))
            }
        }
    }
}

/// Refuses a matrix other than `X` of a format that holds one.
fn only_x(path: &Path, matrix: &str, format: InputFormat) -> Result<(), InputError> {
    if matrix == "X" {
        return Ok(());
    }
    Err(InputError::Unsupported {
        path: PathBuf::from(path),
        object: matrix.to_string(),
        message: format!(
            "a {} input holds one matrix, converted as X; --matrix names a matrix of an .h5ad file",
            match format {
                InputFormat::TenxH5 => "10x Genomics .h5",
                InputFormat::Mtx => "Matrix Market",
                InputFormat::H5ad | InputFormat::Zarr => "AnnData",
            }
        ),
    })
}
