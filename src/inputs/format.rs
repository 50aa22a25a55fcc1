//! The input formats by name: what `--input-format` and the Python
//! package's `input_format` accept, and the format an input's name tells.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::remote::is_url;

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

/// The format of `path` when its name tells: a `.zarr` folder or one with a
/// zarr group's metadata is AnnData's zarr, another folder or a `.mtx[.gz]`
/// file is Matrix Market, `.h5ad` is AnnData; None for an HDF5 file of
/// another name, whose content tells.
pub(super) fn format_by_name(path: &Path) -> Option<InputFormat> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
    if super::zarr::is_zarr(path) {
        Some(InputFormat::Zarr)
    } else if name.ends_with(".mtx") || name.ends_with(".mtx.gz") || (!is_url(path) && path.is_dir()) {
        Some(InputFormat::Mtx)
    } else if name.ends_with(".h5ad") {
        Some(InputFormat::H5ad)
    } else {
        None
    }
}
