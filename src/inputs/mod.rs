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
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub mod h5ad;
pub mod mtx;
pub mod remote;
mod source;
pub mod tenx;
pub mod zarr;

use remote::{is_url, RemoteOptions};
pub use source::{
    checked_indices, checked_indptr, first_rows_are_counts, made_once, to_counts, BadCount, BadValue, Categories,
    Cleaned, FrameColumn, InputError, InputSource, MemoryTable, RawRows, Table, COUNTS_PROBE_ROWS, DROPPED_COLUMN,
};

/// How a conversion's inputs are reached (at URLs: credentials, endpoint, or
/// downloaded whole first) and read (which format, which features): part of
/// each conversion's options.
#[derive(Clone, Debug, Default)]
pub struct InputOptions {
    pub remote: RemoteOptions,
    pub reading: InputReading,
    /// Inputs that are not files: sources the caller has opened itself (an
    /// AnnData object of a Python session), each under the name that stands
    /// for it among the inputs. [`open`] returns them before looking for a
    /// file of that name.
    pub provided: Vec<ProvidedInput>,
}

/// An input the caller has opened, and the name it goes by among a job's
/// inputs (in messages and in the manifest's record of the inputs).
#[derive(Clone)]
pub struct ProvidedInput {
    pub name: PathBuf,
    pub source: Arc<dyn InputSource>,
}

impl std::fmt::Debug for ProvidedInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProvidedInput").field("name", &self.name).finish_non_exhaustive()
    }
}

impl InputOptions {
    fn provided(&self, path: &Path) -> Option<&Arc<dyn InputSource>> {
        self.provided.iter().find(|p| p.name == path).map(|p| &p.source)
    }
}

/// A provided input, opened again: the source is shared, not reopened.
struct Shared(Arc<dyn InputSource>);

impl InputSource for Shared {
    fn path(&self) -> &Path {
        self.0.path()
    }
    fn matrix_name(&self) -> &str {
        self.0.matrix_name()
    }
    fn n_rows(&self) -> u64 {
        self.0.n_rows()
    }
    fn n_cols(&self) -> u64 {
        self.0.n_cols()
    }
    fn read_rows(&self, rows: std::ops::Range<u64>) -> Result<RawRows, InputError> {
        self.0.read_rows(rows)
    }
    fn var(&self) -> Result<Box<dyn Table + '_>, InputError> {
        self.0.var()
    }
    fn obs(&self) -> Result<Option<Box<dyn Table + '_>>, InputError> {
        self.0.obs()
    }
    fn counts_elsewhere(&self) -> Option<String> {
        self.0.counts_elsewhere()
    }
    fn will_read_whole(&self) {
        self.0.will_read_whole()
    }
}

/// How the inputs are read, whatever reaches them: recorded in a sharded
/// conversion's plan, so that every shard reads as the plan did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputReading {
    /// The inputs' format; None: told by each input's name and content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<InputFormat>,
    /// 10x Genomics inputs: the features converted (their `feature_type`);
    /// None: `Gene Expression`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_type: Option<String>,
    /// 10x Genomics inputs of several genomes: the one converted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub genome: Option<String>,
}

impl InputReading {
    /// Whether this is how inputs are read when nothing is said.
    pub fn is_default(&self) -> bool {
        *self == InputReading::default()
    }
}

/// The formats conversion reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InputFormat {
    /// AnnData's HDF5 file.
    H5ad,
    /// Cell Ranger's feature-barcode matrix in HDF5 (`filtered_feature_bc_matrix.h5`).
    #[serde(rename = "10x-h5")]
    TenxH5,
    /// Matrix Market: `matrix.mtx[.gz]` with its features (or genes) and
    /// barcodes files, or the folder that holds them.
    Mtx,
    /// AnnData's zarr store (v2, or v3 sharded or not).
    Zarr,
}

impl InputFormat {
    /// Every format, in the order the help lists them.
    pub const ALL: [InputFormat; 4] = [InputFormat::H5ad, InputFormat::TenxH5, InputFormat::Mtx, InputFormat::Zarr];

    /// The format of name `name` (as [`InputFormat::as_str`] spells it).
    pub fn from_name(name: &str) -> Option<InputFormat> {
        InputFormat::ALL.into_iter().find(|f| f.as_str() == name)
    }

    /// The name users give it (`--input-format`).
    pub fn as_str(self) -> &'static str {
        match self {
            InputFormat::H5ad => "h5ad",
            InputFormat::TenxH5 => "10x-h5",
            InputFormat::Mtx => "mtx",
            InputFormat::Zarr => "zarr",
        }
    }
}

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
        return remote::ranged::object_version(&path.to_string_lossy(), &options.remote.store).ok();
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

/// The format of `path` when its name tells: a `.zarr` folder or one with a
/// zarr group's metadata is AnnData's zarr, another folder or a `.mtx[.gz]`
/// file is Matrix Market, `.h5ad` is AnnData; None for an HDF5 file of
/// another name, whose content tells.
fn format_by_name(path: &Path) -> Option<InputFormat> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
    if zarr::is_zarr(path) {
        Some(InputFormat::Zarr)
    } else if name.ends_with(".mtx") || name.ends_with(".mtx.gz") || (!is_url(path) && path.is_dir()) {
        Some(InputFormat::Mtx)
    } else if name.ends_with(".h5ad") {
        Some(InputFormat::H5ad)
    } else {
        None
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
