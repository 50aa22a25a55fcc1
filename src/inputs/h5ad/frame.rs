//! AnnData dataframes (obs, var): the index and the columns, each read into one
//! of the four kinds the format stores (category, numeric, bool, string).

use std::ops::Range;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, UInt16Array, UInt32Array,
    UInt64Array, UInt8Array,
};
use hdf5::types::{FloatSize, IntSize, TypeDescriptor};

use super::{check_filters, read_string_attr, read_strings, read_strings_range, H5adError, H5adFile};
use crate::inputs::table::{Categories, FrameColumn};
use crate::inputs::{Cause, Hdf5Error};

/// Rows to read: all of them, or a range.
type Rows<'a> = Option<&'a Range<usize>>;

fn read_vec<T: hdf5::H5Type + Clone>(ds: &hdf5::Dataset, rows: Rows<'_>) -> hdf5::Result<Vec<T>> {
    match rows {
        None => ds.read_raw::<T>(),
        Some(r) => ds.read_slice_1d::<T, _>(r.clone()).map(|a| a.to_vec()),
    }
}

fn read_string_vec(ds: &hdf5::Dataset, rows: Rows<'_>) -> Result<Vec<String>, Cause> {
    match rows {
        None => read_strings(ds),
        Some(r) => read_strings_range(ds, r.clone()),
    }
}

/// A column of a type the format cannot store; `object` is `table/column`
/// (with `/values`, `/codes` ... for a member of an encoded column).
fn unsupported_type(file: &H5adFile, object: &str, what: impl std::fmt::Display) -> H5adError {
    let (table, column) = object.split_once('/').unwrap_or((object, ""));
    let column = ["/values", "/codes", "/categories", "/mask"]
        .iter()
        .find_map(|part| column.strip_suffix(part))
        .unwrap_or(column);
    H5adError::ColumnType {
        path: file.path().to_path_buf(),
        table: table.to_string(),
        column: column.to_string(),
        what: what.to_string(),
    }
}

fn read_numeric(
    file: &H5adFile,
    object: &str,
    ds: &hdf5::Dataset,
    mask: Option<&[bool]>,
    rows: Rows<'_>,
) -> Result<ArrayRef, H5adError> {
    let desc = ds.dtype().and_then(|t| t.to_descriptor()).map_err(|e| file.read_failed(object, Hdf5Error::new(e)))?;
    let err = |e: hdf5::Error| file.read_failed(object, Hdf5Error::new(e));
    macro_rules! nullable {
        ($t:ty, $array:ty) => {{
            let v = read_vec::<$t>(ds, rows).map_err(err)?;
            let it = v
                .iter()
                .enumerate()
                .map(|(i, &x)| (!mask.is_some_and(|m| m.get(i).copied().unwrap_or(false))).then_some(x));
            Arc::new(it.collect::<$array>()) as ArrayRef
        }};
    }
    macro_rules! float {
        ($t:ty, $array:ty) => {{
            let v = read_vec::<$t>(ds, rows).map_err(err)?;
            let it = v
                .iter()
                .enumerate()
                .map(|(i, &x)| (!x.is_nan() && !mask.is_some_and(|m| m.get(i).copied().unwrap_or(false))).then_some(x));
            Arc::new(it.collect::<$array>()) as ArrayRef
        }};
    }
    Ok(match desc {
        TypeDescriptor::Integer(IntSize::U1) => nullable!(i8, Int8Array),
        TypeDescriptor::Integer(IntSize::U2) => nullable!(i16, Int16Array),
        TypeDescriptor::Integer(IntSize::U4) => nullable!(i32, Int32Array),
        TypeDescriptor::Integer(IntSize::U8) => nullable!(i64, Int64Array),
        TypeDescriptor::Unsigned(IntSize::U1) => nullable!(u8, UInt8Array),
        TypeDescriptor::Unsigned(IntSize::U2) => nullable!(u16, UInt16Array),
        TypeDescriptor::Unsigned(IntSize::U4) => nullable!(u32, UInt32Array),
        TypeDescriptor::Unsigned(IntSize::U8) => nullable!(u64, UInt64Array),
        TypeDescriptor::Float(FloatSize::U4) => float!(f32, Float32Array),
        TypeDescriptor::Float(FloatSize::U8) => float!(f64, Float64Array),
        other => return Err(unsupported_type(file, object, format!("holds {other}"))),
    })
}

fn read_bools(file: &H5adFile, object: &str, ds: &hdf5::Dataset, rows: Rows<'_>) -> Result<Vec<bool>, H5adError> {
    read_vec::<bool>(ds, rows).map_err(|e| file.read_failed(object, Hdf5Error::new(e)))
}

fn read_categories(file: &H5adFile, object: &str, ds: &hdf5::Dataset) -> Result<Categories, H5adError> {
    let desc = ds.dtype().and_then(|t| t.to_descriptor()).map_err(|e| file.read_failed(object, Hdf5Error::new(e)))?;
    let err = |e: hdf5::Error| file.read_failed(object, Hdf5Error::new(e));
    Ok(match desc {
        TypeDescriptor::Integer(_) | TypeDescriptor::Unsigned(_) => {
            Categories::Ints(ds.read_raw::<i64>().map_err(err)?)
        }
        TypeDescriptor::Float(_) => Categories::Floats(ds.read_raw::<f64>().map_err(err)?),
        TypeDescriptor::Boolean => Categories::Bools(read_bools(file, object, ds, None)?),
        _ => Categories::Strings(read_strings(ds).map_err(|e| file.read_failed(object, e))?),
    })
}

fn read_codes(
    file: &H5adFile,
    object: &str,
    ds: &hdf5::Dataset,
    n_categories: usize,
    rows: Rows<'_>,
) -> Result<Vec<i32>, H5adError> {
    let codes = read_vec::<i64>(ds, rows).map_err(|e| file.read_failed(object, Hdf5Error::new(e)))?;
    codes
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            if c < -1 || c >= n_categories as i64 {
                Err(file.invalid(&format!("{object}[{i}]"), format!("code {c} outside -1..{n_categories}")))
            } else {
                Ok(c as i32)
            }
        })
        .collect()
}

/// Reads column `name` of dataframe group `group_name`: all rows, or `rows`.
/// A categorical column's vocabulary is read whole when `with_categories`;
/// otherwise only its length is (to check the codes) and `categories` is empty,
/// which is what reading block after block of a known column needs.
pub fn read_column(
    file: &H5adFile,
    group_name: &str,
    name: &str,
    rows: Rows<'_>,
    with_categories: bool,
) -> Result<FrameColumn, H5adError> {
    let object = format!("{group_name}/{name}");
    let group = file.file().group(group_name).map_err(|_| file.invalid(group_name, "missing"))?;
    if let Ok(sub) = group.group(name) {
        let encoding = read_string_attr(&sub, "encoding-type").map_err(|e| file.read_failed(&object, e))?;
        let member = |m: &str| {
            let member_object = format!("{object}/{m}");
            let ds = sub.dataset(m).map_err(|_| file.invalid(&member_object, "missing"))?;
            check_filters(file, &member_object, &ds)?;
            Ok::<_, H5adError>(ds)
        };
        let mask =
            |sub_object: &str| -> Result<Vec<bool>, H5adError> { read_bools(file, sub_object, &member("mask")?, rows) };
        return match encoding.as_deref() {
            Some("categorical") => {
                let cats = member("categories")?;
                let (categories, n) = if with_categories {
                    let c = read_categories(file, &format!("{object}/categories"), &cats)?;
                    let n = c.len();
                    (c, n)
                } else {
                    (Categories::Strings(Vec::new()), cats.size())
                };
                let codes = read_codes(file, &format!("{object}/codes"), &member("codes")?, n, rows)?;
                let ordered = sub.attr("ordered").and_then(|a| a.read_scalar::<bool>()).unwrap_or(false);
                Ok(FrameColumn::Category { codes, categories, ordered })
            }
            Some("nullable-integer") => {
                let m = mask(&format!("{object}/mask"))?;
                Ok(FrameColumn::Numeric(read_numeric(
                    file,
                    &format!("{object}/values"),
                    &member("values")?,
                    Some(&m),
                    rows,
                )?))
            }
            Some("nullable-boolean") => {
                let m = mask(&format!("{object}/mask"))?;
                let v = read_bools(file, &format!("{object}/values"), &member("values")?, rows)?;
                Ok(FrameColumn::Bool(v.iter().zip(&m).map(|(&v, &missing)| (!missing).then_some(v)).collect()))
            }
            Some("nullable-string-array") => {
                let m = mask(&format!("{object}/mask"))?;
                let v = read_string_vec(&member("values")?, rows)
                    .map_err(|e| file.read_failed(&format!("{object}/values"), e))?;
                Ok(FrameColumn::String(v.into_iter().zip(&m).map(|(v, &missing)| (!missing).then_some(v)).collect()))
            }
            other => Err(unsupported_type(file, &object, format!("encoding-type {}", other.unwrap_or("(none)")))),
        };
    }
    let ds = group.dataset(name).map_err(|_| file.invalid(&object, "missing"))?;
    check_filters(file, &object, &ds)?;
    if ds.shape().len() != 1 {
        return Err(unsupported_type(file, &object, format!("a {}-D array", ds.shape().len())));
    }
    // anndata before 0.8: categorical codes here, categories in __categories/<name>.
    if let Ok(cats) = group.dataset(&format!("__categories/{name}")) {
        let (categories, n) = if with_categories {
            let c = read_categories(file, &format!("{group_name}/__categories/{name}"), &cats)?;
            let n = c.len();
            (c, n)
        } else {
            (Categories::Strings(Vec::new()), cats.size())
        };
        let codes = read_codes(file, &object, &ds, n, rows)?;
        return Ok(FrameColumn::Category { codes, categories, ordered: false });
    }
    let desc = ds.dtype().and_then(|t| t.to_descriptor()).map_err(|e| file.read_failed(&object, Hdf5Error::new(e)))?;
    match desc {
        TypeDescriptor::Boolean => {
            Ok(FrameColumn::Bool(read_bools(file, &object, &ds, rows)?.into_iter().map(Some).collect()))
        }
        TypeDescriptor::VarLenUnicode
        | TypeDescriptor::VarLenAscii
        | TypeDescriptor::FixedAscii(_)
        | TypeDescriptor::FixedUnicode(_) => Ok(FrameColumn::String(
            read_string_vec(&ds, rows).map_err(|e| file.read_failed(&object, e))?.into_iter().map(Some).collect(),
        )),
        _ => Ok(FrameColumn::Numeric(read_numeric(file, &object, &ds, None, rows)?)),
    }
}

/// The number of rows of column `name` of dataframe group `group_name`, from
/// its shape alone (the codes of a categorical, the values of a nullable
/// column); None for a group of another encoding, which reading it reports.
pub fn column_len(file: &H5adFile, group_name: &str, name: &str) -> Result<Option<usize>, H5adError> {
    let object = format!("{group_name}/{name}");
    let group = file.file().group(group_name).map_err(|_| file.invalid(group_name, "missing"))?;
    let ds = match group.group(name) {
        Ok(sub) => match ["codes", "values"].into_iter().find(|m| sub.link_exists(m)) {
            Some(member) => sub.dataset(member).map_err(|_| file.invalid(&format!("{object}/{member}"), "missing"))?,
            None => return Ok(None),
        },
        Err(_) => group.dataset(name).map_err(|_| file.invalid(&object, "missing"))?,
    };
    Ok(Some(ds.shape().first().copied().unwrap_or(0)))
}

/// Checks that the index and every column of dataframe group `group_name`
/// have `rows` rows, as anndata requires of obs (one row per cell) and var
/// (one per gene); names the file, the table and both lengths otherwise.
pub fn check_rows(file: &H5adFile, group_name: &str, rows: u64, what: &str) -> Result<(), H5adError> {
    let (index_name, index) = file.index_dataset(group_name)?;
    let mut lengths = vec![(index_name, index.shape().first().copied().unwrap_or(0))];
    for name in column_names(file, group_name)? {
        if let Some(n) = column_len(file, group_name, &name)? {
            lengths.push((name, n));
        }
    }
    for (name, n) in lengths {
        if n as u64 != rows {
            return Err(file.invalid(
                &format!("{group_name}/{name}"),
                format!(
                    "has {n} rows, but the matrix has {rows} {what}; anndata requires one row per {}",
                    what.trim_end_matches('s')
                ),
            ));
        }
    }
    Ok(())
}

/// The columns of a dataframe group: those of its `column-order` attribute
/// (an empty float array when there are none), then any other member that is
/// not the index or `__categories`.
pub fn column_names(file: &H5adFile, group_name: &str) -> Result<Vec<String>, H5adError> {
    let (index_name, _) = file.index_dataset(group_name)?;
    let group = file.file().group(group_name).map_err(|_| file.invalid(group_name, "missing"))?;
    let mut names: Vec<String> = match group.attr("column-order") {
        Ok(attr) if attr.size() > 0 => {
            let as_strings: Result<Vec<String>, Cause> = (|| {
                let desc = attr.dtype().and_then(|t| t.to_descriptor()).map_err(super::strings::hdf5_cause)?;
                match desc {
                    TypeDescriptor::Float(_) => Ok(Vec::new()),
                    _ => super::strings::read_attr_strings(&attr),
                }
            })();
            as_strings.map_err(|e| file.read_failed(&format!("{group_name}/@column-order"), e))?
        }
        _ => Vec::new(),
    };
    for member in group.member_names().unwrap_or_default() {
        // A column named "a/b" (older anndata wrote such names) is the member
        // "b" of a group "a"; it is listed under its real name by column-order.
        let holds_listed = names.iter().any(|n| n.starts_with(&format!("{member}/")));
        if member != index_name && member != "__categories" && !names.contains(&member) && !holds_listed {
            names.push(member);
        }
    }
    Ok(names)
}
