//! The input formats by name: the one list of them, whose names and help
//! the command line's `--input-format` and the Python package's
//! `input_format` take from here, and the format an input's name tells.

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

    /// The name users give it (`--input-format`, `input_format=`, and a
    /// plan's record of it).
    pub fn as_str(self) -> &'static str {
        match self {
            InputFormat::H5ad => "h5ad",
            InputFormat::TenxH5 => "10x-h5",
            InputFormat::Mtx => "mtx",
            InputFormat::Zarr => "zarr",
        }
    }

    /// What it is, in a line: its help under `--input-format`.
    pub fn description(self) -> &'static str {
        match self {
            InputFormat::H5ad => "AnnData .h5ad",
            InputFormat::TenxH5 => "Cell Ranger's feature-barcode matrix .h5",
            InputFormat::Mtx => {
                "Matrix Market: matrix.mtx[.gz] with features (or genes) and barcodes files, or their folder"
            }
            InputFormat::Zarr => "AnnData zarr store (v2, or v3 sharded or not)",
        }
    }

    /// Every name, as a message lists them: `h5ad, 10x-h5, mtx or zarr`.
    pub fn names_listed() -> String {
        let [others @ .., last] = InputFormat::ALL.map(InputFormat::as_str);
        format!("{} or {last}", others.join(", "))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_has_one_name_everywhere() {
        assert_eq!(InputFormat::names_listed(), "h5ad, 10x-h5, mtx or zarr");
        for format in InputFormat::ALL {
            // a plan records the format by the name users give it
            let json = serde_json::to_string(&format).unwrap();
            assert_eq!(json, format!("{:?}", format.as_str()));
            assert_eq!(serde_json::from_str::<InputFormat>(&json).unwrap(), format);
            assert_eq!(InputFormat::from_name(format.as_str()), Some(format));
        }
    }
}
