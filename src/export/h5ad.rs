//! Writing AnnData files: X as an int32 CSR matrix appended block by block,
//! obs and var as dataframes (index and columns: categorical, numeric, bool
//! and string, with anndata's nullable encodings where values are missing),
//! in the layout anndata 0.8+ writes. The file is written under a temporary
//! name and renamed.

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use hdf5::types::VarLenUnicode;
use hdf5::Extents;

use crate::format::CsrMatrix;

/// A dataframe to write: its index (name and values) and columns.
pub struct Table {
    /// anndata's name for an unnamed index is `_index`.
    pub index_name: String,
    pub index: Vec<String>,
    pub columns: Vec<(String, TableColumn)>,
}

impl Table {
    /// A table of names only.
    pub fn names(names: &[String]) -> Table {
        Table { index_name: "_index".into(), index: names.to_vec(), columns: Vec::new() }
    }
}

/// One column: values, or, with `categories`, integer codes (-1 for missing)
/// into them.
pub struct TableColumn {
    pub values: ArrayRef,
    pub categories: Option<ArrayRef>,
}

/// A dataset of `values` at `name` of `group`, with anndata's encoding attributes.
fn write_array(group: &hdf5::Group, name: &str, values: &dyn Array) -> hdf5::Result<()> {
    macro_rules! numbers {
        ($t:ty) => {{
            let v: Vec<_> = values.as_primitive::<$t>().values().to_vec();
            group.new_dataset_builder().with_data(&v[..]).create(name)?
        }};
    }
    let (ds, kind) = match values.data_type() {
        DataType::Utf8 => {
            let strings = values.as_string::<i32>();
            let v: Vec<VarLenUnicode> = (0..strings.len())
                .map(|i| vlu(if strings.is_null(i) { "" } else { strings.value(i) }))
                .collect::<hdf5::Result<_>>()?;
            (group.new_dataset_builder().with_data(&v[..]).create(name)?, "string-array")
        }
        DataType::Boolean => {
            let b = values.as_boolean();
            let v: Vec<bool> = (0..b.len()).map(|i| !b.is_null(i) && b.value(i)).collect();
            (group.new_dataset_builder().with_data(&v[..]).create(name)?, "array")
        }
        DataType::Int8 => (numbers!(Int8Type), "array"),
        DataType::Int16 => (numbers!(Int16Type), "array"),
        DataType::Int32 => (numbers!(Int32Type), "array"),
        DataType::Int64 => (numbers!(Int64Type), "array"),
        DataType::UInt8 => (numbers!(UInt8Type), "array"),
        DataType::UInt16 => (numbers!(UInt16Type), "array"),
        DataType::UInt32 => (numbers!(UInt32Type), "array"),
        DataType::UInt64 => (numbers!(UInt64Type), "array"),
        DataType::Float32 => {
            let f = values.as_primitive::<Float32Type>();
            let v: Vec<f32> = (0..f.len()).map(|i| if f.is_null(i) { f32::NAN } else { f.value(i) }).collect();
            (group.new_dataset_builder().with_data(&v[..]).create(name)?, "array")
        }
        DataType::Float64 => {
            let f = values.as_primitive::<Float64Type>();
            let v: Vec<f64> = (0..f.len()).map(|i| if f.is_null(i) { f64::NAN } else { f.value(i) }).collect();
            (group.new_dataset_builder().with_data(&v[..]).create(name)?, "array")
        }
        other => return Err(hdf5::Error::from(format!("column {name:?}: cannot write {other} to .h5ad"))),
    };
    encoding(&ds, kind, "0.2.0")
}

/// The group holding column `name` (nested groups for a name with `/`) and the
/// last part of the name.
fn parent_of<'n>(group: &hdf5::Group, name: &'n str) -> hdf5::Result<(hdf5::Group, &'n str)> {
    let mut at = group.clone();
    let mut parts: Vec<&str> = name.split('/').collect();
    let leaf = parts.pop().unwrap_or(name);
    for part in parts {
        at = match at.group(part) {
            Ok(g) => g,
            Err(_) => at.create_group(part)?,
        };
    }
    Ok((at, leaf))
}

fn write_column(group: &hdf5::Group, name: &str, column: &TableColumn) -> hdf5::Result<()> {
    let (parent, leaf) = parent_of(group, name)?;
    if let Some(categories) = &column.categories {
        let sub = parent.create_group(leaf)?;
        encoding(&sub, "categorical", "0.2.0")?;
        sub.new_attr::<bool>().create("ordered")?.write_scalar(&false)?;
        write_array(&sub, "categories", categories.as_ref())?;
        return write_array(&sub, "codes", column.values.as_ref());
    }
    let values = column.values.as_ref();
    let nullable = match values.data_type() {
        _ if values.null_count() == 0 => None,
        DataType::Float32 | DataType::Float64 => None, // NaN marks what is missing
        DataType::Boolean => Some("nullable-boolean"),
        DataType::Utf8 => Some("nullable-string-array"),
        _ => Some("nullable-integer"),
    };
    let Some(kind) = nullable else { return write_array(&parent, leaf, values) };
    let sub = parent.create_group(leaf)?;
    encoding(&sub, kind, "0.1.0")?;
    write_array(&sub, "values", values)?;
    let mask: Vec<bool> = (0..values.len()).map(|i| values.is_null(i)).collect();
    sub.new_dataset_builder().with_data(&mask[..]).create("mask")?;
    Ok(())
}

/// Rows per HDF5 chunk of the growing X arrays.
const CHUNK: usize = 1 << 16;

/// An .h5ad file being written; nothing is visible under its final name until
/// [`H5adWriter::finish`].
pub struct H5adWriter {
    file: hdf5::File,
    tmp: PathBuf,
    path: PathBuf,
    n_cols: u32,
    data: hdf5::Dataset,
    indices: hdf5::Dataset,
    indptr: hdf5::Dataset,
    nnz: u64,
    rows: u64,
}

fn vlu(s: &str) -> hdf5::Result<VarLenUnicode> {
    s.replace('\0', "").parse().map_err(|e| hdf5::Error::from(format!("{e:?}")))
}

fn str_attr(loc: &hdf5::Location, name: &str, value: &str) -> hdf5::Result<()> {
    loc.new_attr::<VarLenUnicode>().create(name)?.write_scalar(&vlu(value)?)
}

fn encoding(loc: &hdf5::Location, kind: &str, version: &str) -> hdf5::Result<()> {
    str_attr(loc, "encoding-type", kind)?;
    str_attr(loc, "encoding-version", version)
}

fn growing<T: hdf5::H5Type>(group: &hdf5::Group, name: &str) -> hdf5::Result<hdf5::Dataset> {
    group.new_dataset::<T>().shape(Extents::resizable(0usize.into())).chunk(CHUNK).deflate(4).create(name)
}

fn append<T: hdf5::H5Type + Copy>(ds: &hdf5::Dataset, at: u64, values: &[T]) -> hdf5::Result<()> {
    if values.is_empty() {
        return Ok(());
    }
    let end = at as usize + values.len();
    ds.resize(end)?;
    ds.write_slice(values, at as usize..end)
}

impl H5adWriter {
    /// Starts `path`, written as `.NAME.tmp-<pid>` beside it until finished.
    /// Such files left by earlier runs that died (their process is gone) are
    /// removed first; on any error the temporary file is removed too.
    pub fn create(path: &Path, n_cols: u32) -> hdf5::Result<H5adWriter> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        remove_stale_temporaries(path, &name);
        let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
        let started = Self::start(path, &tmp, n_cols);
        if started.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        started
    }

    fn start(path: &Path, tmp: &Path, n_cols: u32) -> hdf5::Result<H5adWriter> {
        let tmp = tmp.to_path_buf();
        let file = hdf5::File::create(&tmp)?;
        encoding(&file, "anndata", "0.1.0")?;
        let x = file.create_group("X")?;
        encoding(&x, "csr_matrix", "0.1.0")?;
        let data = growing::<i32>(&x, "data")?;
        let indices = growing::<i32>(&x, "indices")?;
        let indptr = growing::<i64>(&x, "indptr")?;
        append(&indptr, 0, &[0i64])?;
        for g in ["layers", "obsm", "obsp", "varm", "varp", "uns"] {
            let group = file.create_group(g)?;
            encoding(&group, "dict", "0.1.0")?;
        }
        Ok(H5adWriter { file, tmp, path: path.to_path_buf(), n_cols, data, indices, indptr, nnz: 0, rows: 0 })
    }

    /// Appends the rows of `block`.
    pub fn append_rows(&mut self, block: &CsrMatrix) -> hdf5::Result<()> {
        let data: Vec<i32> = block.data.iter().map(|&v| v as i32).collect();
        let indices: Vec<i32> = block.indices.iter().map(|&v| v as i32).collect();
        let indptr: Vec<i64> = block.indptr[1..].iter().map(|&p| (p + self.nnz) as i64).collect();
        append(&self.data, self.nnz, &data)?;
        append(&self.indices, self.nnz, &indices)?;
        append(&self.indptr, self.rows + 1, &indptr)?;
        self.nnz += block.nnz() as u64;
        self.rows += block.n_rows() as u64;
        Ok(())
    }

    /// Writes obs and var, the shape, and renames the file into place.
    pub fn finish(self, obs: &Table, var: &Table) -> hdf5::Result<()> {
        let tmp = self.tmp.clone();
        let finished = self.finish_file(obs, var);
        if finished.is_err() {
            let _ = std::fs::remove_file(tmp);
        }
        finished
    }

    fn finish_file(self, obs: &Table, var: &Table) -> hdf5::Result<()> {
        let x = self.file.group("X")?;
        x.new_attr::<i64>().shape(2).create("shape")?.write_raw(&[self.rows as i64, i64::from(self.n_cols)])?;
        for (group, table) in [("obs", obs), ("var", var)] {
            let g = self.file.create_group(group)?;
            encoding(&g, "dataframe", "0.2.0")?;
            str_attr(&g, "_index", &table.index_name)?;
            let order: Vec<VarLenUnicode> =
                table.columns.iter().map(|(name, _)| vlu(name)).collect::<hdf5::Result<_>>()?;
            g.new_attr::<VarLenUnicode>().shape(order.len()).create("column-order")?.write_raw(&order)?;
            let values: Vec<VarLenUnicode> = table.index.iter().map(|s| vlu(s)).collect::<hdf5::Result<_>>()?;
            let ds = g.new_dataset_builder().with_data(&values[..]).create(table.index_name.as_str())?;
            encoding(&ds, "string-array", "0.2.0")?;
            for (name, column) in &table.columns {
                write_column(&g, name, column)?;
            }
        }
        drop(x);
        let (tmp, path) = (self.tmp.clone(), self.path.clone());
        drop(self.data);
        drop(self.indices);
        drop(self.indptr);
        self.file.close()?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| hdf5::Error::from(format!("renaming {} to {}: {e}", tmp.display(), path.display())))
    }

    /// Removes the temporary file (after an error).
    pub fn abandon(self) {
        let tmp = self.tmp.clone();
        drop(self);
        let _ = std::fs::remove_file(tmp);
    }
}

/// Removes `.NAME.tmp-<pid>` files beside `path` whose process no longer runs
/// (an export that was killed); those of running processes are left alone.
fn remove_stale_temporaries(path: &Path, name: &str) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let prefix = format!(".{name}.tmp-");
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
