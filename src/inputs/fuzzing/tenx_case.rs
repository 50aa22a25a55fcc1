//! A 10x Genomics `.h5` file from arbitrary bytes. libhdf5 is C and not ours
//! to fuzz, so the bytes do not become the file: they choose its structure,
//! which is written as a valid HDF5 file and then read by our 10x reader.
//! The choices: Cell Ranger 3's layout or 2's (one or two genome groups);
//! the shape (small, or sizes like 2^31 and 10^15); for each array of the
//! matrix (`data`, `indices`, `indptr`), the barcodes and the features,
//! whether it is there, its type, its length (as the shape says, off by a
//! little, or declared huge in chunks never written) and its values
//! (indptr rising, or anything).

use std::path::Path;

use hdf5::types::{FixedAscii, VarLenUnicode};

use super::{read_as_convert_does, Choices};
use crate::inputs::error::InputError;

/// Writes the file the bytes describe and reads it as a conversion does.
///
/// # Panics
///
/// Where [`read_as_convert_does`] finds a fault.
pub fn tenx_h5(data: &[u8]) -> Result<(), InputError> {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("case.h5");
    // (sizes libhdf5 itself refuses to write leave nothing to read)
    if write(&path, &mut Choices::new(data)).is_err() {
        return Ok(());
    }
    read_as_convert_does(&path)
}

/// Sizes a length field may take besides small ones.
const HUGE: [i64; 7] = [-1, (1 << 31) - 1, 1 << 31, 1 << 32, 1_000_000_000_000_000, i64::MAX, 1 << 40];

/// A count: mostly 0..8, sometimes one of [`HUGE`].
fn count(c: &mut Choices) -> i64 {
    match c.byte() {
        b @ 0..=239 => i64::from(b % 8),
        b => HUGE[usize::from(b - 240) % HUGE.len()],
    }
}

/// How many elements an array is declared to have, given the number its
/// sizes call for: that number, off by one or two, or huge (written in
/// chunks, only the first of which holds values).
fn length(c: &mut Choices, wanted: i64) -> i64 {
    match c.byte() {
        0..=199 => wanted,
        200..=219 => wanted + 1,
        220..=234 => wanted - 1,
        235..=244 => wanted + 2,
        b => HUGE[usize::from(b - 245) % HUGE.len()],
    }
}

#[derive(Clone, Copy)]
enum Dtype {
    I32,
    I64,
    U32,
    U64,
    F32,
    F64,
    I8,
}

const DTYPES: [Dtype; 9] =
    [Dtype::I64, Dtype::I64, Dtype::I32, Dtype::I32, Dtype::U32, Dtype::U64, Dtype::F32, Dtype::F64, Dtype::I8];

/// A 1-D dataset of `declared` elements whose first ones are `values` (as
/// many as fit), chunked and maybe compressed when `chunked`.
fn numbers(
    g: &hdf5::Group,
    name: &str,
    dtype: Dtype,
    values: &[i64],
    declared: i64,
    chunked: bool,
) -> hdf5::Result<()> {
    fn put<T: hdf5::H5Type + Copy>(
        g: &hdf5::Group,
        name: &str,
        values: Vec<T>,
        declared: usize,
        chunked: bool,
    ) -> hdf5::Result<()> {
        let n = values.len().min(declared);
        if !chunked && declared == values.len() {
            g.new_dataset_builder().with_data(&values[..]).create(name)?;
            return Ok(());
        }
        let ds = g.new_dataset::<T>().shape(declared).chunk(vec![1024.min(declared.max(1))]).deflate(1).create(name)?;
        if n > 0 {
            ds.write_slice(&values[..n], 0..n)?;
        }
        Ok(())
    }
    let declared = usize::try_from(declared.max(0)).unwrap_or(0);
    match dtype {
        Dtype::I32 => put(g, name, values.iter().map(|&v| v as i32).collect(), declared, chunked),
        Dtype::I64 => put(g, name, values.to_vec(), declared, chunked),
        Dtype::U32 => put(g, name, values.iter().map(|&v| v as u32).collect(), declared, chunked),
        Dtype::U64 => put(g, name, values.iter().map(|&v| v as u64).collect(), declared, chunked),
        Dtype::F32 => put(g, name, values.iter().map(|&v| v as f32 / 2.0).collect(), declared, chunked),
        Dtype::F64 => put(g, name, values.iter().map(|&v| v as f64 / 2.0).collect(), declared, chunked),
        Dtype::I8 => put(g, name, values.iter().map(|&v| v as i8).collect(), declared, chunked),
    }
}

/// A 1-D dataset of strings, fixed-length or variable, declared as
/// [`numbers`] are.
fn strings(g: &hdf5::Group, name: &str, values: &[String], declared: i64, c: &mut Choices) -> hdf5::Result<()> {
    let declared = usize::try_from(declared.max(0)).unwrap_or(0);
    let chunked = declared != values.len() || c.byte().is_multiple_of(4);
    let n = values.len().min(declared);
    macro_rules! put {
        ($t:ty, $make:expr) => {{
            let v: Vec<$t> = values.iter().map($make).collect();
            if chunked {
                let ds = g.new_dataset::<$t>().shape(declared).chunk(vec![256.min(declared.max(1))]).create(name)?;
                if n > 0 {
                    ds.write_slice(&v[..n], 0..n)?;
                }
            } else {
                g.new_dataset_builder().with_data(&v[..]).create(name)?;
            }
        }};
    }
    if c.byte().is_multiple_of(2) {
        put!(FixedAscii<24>, |s| FixedAscii::from_ascii(s.as_bytes()).unwrap_or_default());
    } else {
        put!(VarLenUnicode, |s| s.parse().unwrap_or_default());
    }
    Ok(())
}

fn write(path: &Path, c: &mut Choices) -> hdf5::Result<()> {
    let file = hdf5::File::create(path)?;
    let layout_3 = !c.byte().is_multiple_of(4);
    let groups: &[&str] = match (layout_3, c.byte() % 4) {
        (true, _) => &["matrix"],
        (false, 0) => &["GRCh38", "mm10"],
        (false, _) => &["GRCh38"],
    };
    for &name in groups {
        let g = file.create_group(name)?;
        matrix_group(&g, layout_3, c)?;
    }
    Ok(())
}

/// The values of an array: rising from 0 by small steps (indptr), below
/// `bound` (indices), small counts (data); or, one time in sixteen,
/// anything.
fn values(c: &mut Choices, n: i64, rising: bool, bound: i64) -> Vec<i64> {
    let n = n.clamp(0, 64);
    let mut at = 0i64;
    (0..n)
        .map(|k| match c.byte() {
            0..=14 => c.i64(),
            b if rising => {
                if k > 0 {
                    at += i64::from(b % 4);
                }
                at
            }
            b => i64::from(b) % bound.clamp(1, 1 << 16),
        })
        .collect()
}

fn matrix_group(g: &hdf5::Group, layout_3: bool, c: &mut Choices) -> hdf5::Result<()> {
    let (n_features, n_barcodes) = (count(c), count(c));
    let nnz = i64::from(c.byte() % 32);
    match c.byte() % 8 {
        0 => {}
        1 => numbers(g, "shape", Dtype::I64, &[n_features, n_barcodes, 1], 3, false)?,
        2 => numbers(g, "shape", Dtype::I32, &[n_features, n_barcodes], 2, false)?,
        _ => numbers(g, "shape", Dtype::I64, &[n_features, n_barcodes], 2, false)?,
    }
    let arrays = [("data", nnz, false, 32), ("indices", nnz, false, n_features), ("indptr", n_barcodes + 1, true, 0)];
    for (name, wanted, rising, bound) in arrays {
        if c.byte().is_multiple_of(16) {
            continue;
        }
        let dtype = c.pick(&DTYPES);
        let declared = length(c, wanted);
        let mut v = values(c, declared, rising, bound);
        if rising {
            // (the last entry is the number of entries, as Cell Ranger writes it)
            if let Some(last) = v.last_mut().filter(|_| c.byte().is_multiple_of(2)) {
                *last = nnz;
            }
        }
        numbers(g, name, dtype, &v, declared, c.byte().is_multiple_of(4))?;
    }
    let barcodes: Vec<String> = (0..n_barcodes.clamp(0, 64)).map(|i| format!("AAAC{i}-1")).collect();
    if !c.byte().is_multiple_of(16) {
        let declared = length(c, n_barcodes);
        strings(g, "barcodes", &barcodes, declared, c)?;
    }
    let n = n_features.clamp(0, 64);
    let ids: Vec<String> = (0..n).map(|i| format!("ENSG{i:05}")).collect();
    let names: Vec<String> = (0..n).map(|i| format!("G{}", i % 5)).collect();
    let types: Vec<String> =
        (0..n).map(|_| c.pick(&["Gene Expression", "Gene Expression", "Antibody Capture", ""]).to_string()).collect();
    let genomes: Vec<String> = (0..n).map(|_| c.pick(&["GRCh38", "GRCh38", "mm10", ""]).to_string()).collect();
    let (g, columns) = if layout_3 {
        let fg = g.create_group("features")?;
        (fg, vec![("id", ids), ("name", names), ("feature_type", types), ("genome", genomes)])
    } else {
        (g.clone(), vec![("genes", ids), ("gene_names", names)])
    };
    for (name, values) in columns {
        if !c.byte().is_multiple_of(16) {
            let declared = length(c, n_features);
            strings(&g, name, &values, declared, c)?;
        }
    }
    Ok(())
}
