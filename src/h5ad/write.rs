//! Writing AnnData files: X as an int32 CSR matrix appended block by block,
//! obs and var as dataframes of their names, in the layout anndata 0.8+
//! writes. The file is written under a temporary name and renamed.

use std::path::{Path, PathBuf};

use hdf5::types::VarLenUnicode;
use hdf5::Extents;

use crate::format::CsrMatrix;

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

    /// Writes obs and var (their names as the index), the shape, and renames
    /// the file into place.
    pub fn finish(self, obs_names: &[String], var_names: &[String]) -> hdf5::Result<()> {
        let tmp = self.tmp.clone();
        let finished = self.finish_file(obs_names, var_names);
        if finished.is_err() {
            let _ = std::fs::remove_file(tmp);
        }
        finished
    }

    fn finish_file(self, obs_names: &[String], var_names: &[String]) -> hdf5::Result<()> {
        let x = self.file.group("X")?;
        x.new_attr::<i64>().shape(2).create("shape")?.write_raw(&[self.rows as i64, i64::from(self.n_cols)])?;
        for (group, names) in [("obs", obs_names), ("var", var_names)] {
            let g = self.file.create_group(group)?;
            encoding(&g, "dataframe", "0.2.0")?;
            str_attr(&g, "_index", "_index")?;
            g.new_attr::<VarLenUnicode>().shape(0).create("column-order")?;
            let values: Vec<VarLenUnicode> = names.iter().map(|s| vlu(s)).collect::<hdf5::Result<_>>()?;
            let ds = g.new_dataset_builder().with_data(&values[..]).create("_index")?;
            encoding(&ds, "string-array", "0.2.0")?;
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
