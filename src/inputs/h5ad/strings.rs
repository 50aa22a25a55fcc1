//! Strings in HDF5: variable-length (current anndata) or fixed-length (older
//! files and other writers), ASCII or UTF-8. HDF5 converts between variable
//! ASCII and UTF-8, and between fixed-length strings of different sizes, but
//! not between fixed and variable length, so we branch on the stored type.

use hdf5::types::{FixedAscii, FixedUnicode, TypeDescriptor, VarLenAscii, VarLenUnicode};

use crate::inputs::error::{Cause, Context, Hdf5Error};

/// An HDF5 error as the cause of a failed read of strings.
pub(crate) fn hdf5_cause(e: hdf5::Error) -> Cause {
    Box::new(Hdf5Error::new(e))
}

/// Reads a fixed-length string array of stored width `width` by letting HDF5
/// widen it to the smallest of a few buffer sizes that holds it.
macro_rules! read_fixed {
    ($container:expr, $width:expr, $ty:ident) => {{
        let c = $container;
        let w = $width;
        if w <= 16 {
            c.read_raw::<$ty<16>>().map(|v| v.iter().map(|s| s.as_str().to_string()).collect())
        } else if w <= 64 {
            c.read_raw::<$ty<64>>().map(|v| v.iter().map(|s| s.as_str().to_string()).collect())
        } else if w <= 256 {
            c.read_raw::<$ty<256>>().map(|v| v.iter().map(|s| s.as_str().to_string()).collect())
        } else if w <= 4096 {
            c.read_raw::<$ty<4096>>().map(|v| v.iter().map(|s| s.as_str().to_string()).collect())
        } else {
            return Err(format!("fixed-length strings of {w} bytes are longer than supported (4096)").into());
        }
    }};
}

fn read_any(c: &hdf5::Container) -> Result<Vec<String>, Cause> {
    let desc = c.dtype().and_then(|t| t.to_descriptor()).map_err(hdf5_cause)?;
    let result: hdf5::Result<Vec<String>> = match desc {
        TypeDescriptor::VarLenUnicode => {
            c.read_raw::<VarLenUnicode>().map(|v| v.iter().map(|s| s.as_str().to_string()).collect())
        }
        TypeDescriptor::VarLenAscii => {
            c.read_raw::<VarLenAscii>().map(|v| v.iter().map(|s| s.as_str().to_string()).collect())
        }
        TypeDescriptor::FixedAscii(w) => read_fixed!(c, w, FixedAscii),
        TypeDescriptor::FixedUnicode(w) => read_fixed!(c, w, FixedUnicode),
        other => return Err(format!("holds {other}, not strings").into()),
    };
    result.map_err(hdf5_cause)
}

/// Reads a 1-D dataset of strings.
pub fn read_strings(ds: &hdf5::Dataset) -> Result<Vec<String>, Cause> {
    // (a dataset that declares more strings than its bytes hold, in chunks
    // never written, is refused before they are allocated)
    if let Some(problem) = crate::inputs::rows::unbacked(ds.size() as u64, ds.storage_size()) {
        return Err(problem.into());
    }
    read_any(ds)
}

/// Reads rows `rows` of a 1-D dataset of strings.
pub fn read_strings_range(ds: &hdf5::Dataset, rows: std::ops::Range<usize>) -> Result<Vec<String>, Cause> {
    let desc = ds.dtype().and_then(|t| t.to_descriptor()).map_err(hdf5_cause)?;
    macro_rules! slice {
        ($t:ty) => {
            ds.read_slice_1d::<$t, _>(rows.clone()).map(|v| v.iter().map(|s| s.as_str().to_string()).collect())
        };
    }
    let result: hdf5::Result<Vec<String>> = match desc {
        TypeDescriptor::VarLenUnicode => slice!(VarLenUnicode),
        TypeDescriptor::VarLenAscii => slice!(VarLenAscii),
        TypeDescriptor::FixedAscii(w) if w <= 16 => slice!(FixedAscii<16>),
        TypeDescriptor::FixedAscii(w) if w <= 64 => slice!(FixedAscii<64>),
        TypeDescriptor::FixedAscii(w) if w <= 256 => slice!(FixedAscii<256>),
        TypeDescriptor::FixedAscii(w) if w <= 4096 => slice!(FixedAscii<4096>),
        TypeDescriptor::FixedUnicode(w) if w <= 16 => slice!(FixedUnicode<16>),
        TypeDescriptor::FixedUnicode(w) if w <= 64 => slice!(FixedUnicode<64>),
        TypeDescriptor::FixedUnicode(w) if w <= 256 => slice!(FixedUnicode<256>),
        TypeDescriptor::FixedUnicode(w) if w <= 4096 => slice!(FixedUnicode<4096>),
        other => return Err(format!("holds {other}, not strings (or strings longer than 4096 bytes)").into()),
    };
    result.map_err(hdf5_cause)
}

/// Reads a scalar string attribute, or None when the attribute is absent.
pub fn read_string_attr(loc: &hdf5::Location, name: &str) -> Result<Option<String>, Cause> {
    let Ok(attr) = loc.attr(name) else { return Ok(None) };
    let values = read_any(&attr).map_err(|e| Context::new(format!("attribute {name}"), e))?;
    Ok(values.into_iter().next())
}

/// Reads an array attribute of strings.
pub(crate) fn read_attr_strings(attr: &hdf5::Attribute) -> Result<Vec<String>, Cause> {
    read_any(attr)
}
