//! Reading AnnData `.h5ad` files: a count matrix (X, raw/X or a layer) in row
//! blocks, and the gene and cell names. Nothing here knows the tile format.
//!
//! CSR matrices are read by hyperslab, a slice of indptr and then the matching
//! slice of indices and data, never whole. Dense matrices are read in row
//! blocks. CSC matrices cannot be read by rows cheaply, so they are read whole
//! and converted once: memory is bounded by the file's X.
//!
//! HDF5 serializes every call behind one global lock, so reading stays on one
//! thread; callers parallelize what they do with the rows.

mod direct;
mod driver;
pub(crate) mod frame;
mod source;
mod strings;

pub use source::H5adSource;

use std::ops::Range;
use std::path::{Path, PathBuf};

use hdf5::types::{FloatSize, IntSize, TypeDescriptor};

use super::remote;
use crate::inputs::error::{Cause, FailedRead, Hdf5Error, InputError as H5adError};
use crate::inputs::rows::{
    checked_indices, checked_indices_i32, checked_indptr, made_once, shape_problem, unbacked, RawRows, Values,
};

pub(crate) use strings::{read_string_attr, read_strings, read_strings_range};

/// How a matrix is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Csr,
    Csc,
    Dense,
}

/// An open .h5ad file.
pub struct H5adFile {
    path: PathBuf,
    file: hdf5::File,
    /// The object's reader, for a file at a URL.
    ranged: Option<std::sync::Arc<remote::RangedFile>>,
    /// The file HDF5 opened, when it is on this machine (its arrays' chunks
    /// are then read without HDF5 where they can be).
    local: Option<PathBuf>,
}

/// A matrix of an open file, read by rows.
pub struct MatrixReader {
    path: PathBuf,
    name: String,
    layout: Layout,
    n_rows: u64,
    n_cols: u64,
    /// data, indices, indptr for sparse; the 2-D dataset for dense.
    datasets: Vec<hdf5::Dataset>,
    /// A CSC matrix, converted to CSR on first use.
    csc_as_csr: std::sync::OnceLock<RawRows>,
    /// `datasets` read without HDF5, where they can be (a local file's
    /// simply chunked arrays).
    direct: Vec<Option<direct::DirectArray>>,
}

/// An HDF5 error, its first line.
fn h5err(e: hdf5::Error) -> Hdf5Error {
    Hdf5Error::first_line(e)
}

/// Why HDF5 could not open a file, as the cause of not opening it.
fn not_hdf5(path: &Path, e: hdf5::Error) -> H5adError {
    H5adError::OpenFailed {
        format: "HDF5",
        path: path.to_path_buf(),
        source: Box::new(h5err(e).hint("not an HDF5 file, or truncated")),
    }
}

impl H5adFile {
    /// Opens `path` read-only (a file at a URL with the default options).
    pub fn open(path: &Path) -> Result<H5adFile, H5adError> {
        Self::open_with(path, &remote::RemoteOptions::default())
    }

    /// Opens `path` read-only; a file at a URL is reached as `options` say.
    pub fn open_with(path: &Path, options: &remote::RemoteOptions) -> Result<H5adFile, H5adError> {
        if remote::is_url(path) {
            let url = path.to_string_lossy();
            if let Some(local) = remote::downloaded(&url, options)? {
                let file = hdf5::File::open(&local).map_err(|e| not_hdf5(path, e))?;
                return Ok(H5adFile { path: path.to_path_buf(), file, ranged: None, local: Some(local) });
            }
            // The store's failures are its own (refused, denied, not there);
            // only what HDF5 makes of the bytes is the format's.
            let ranged = remote::RangedFile::open(&url, &options.store, options.block_cache)?;
            let file = driver::open_hdf5(&url, &ranged).map_err(|source| H5adError::OpenFailed {
                format: "HDF5",
                path: path.to_path_buf(),
                source,
            })?;
            return Ok(H5adFile { path: path.to_path_buf(), file, ranged: Some(ranged), local: None });
        }
        if !path.is_file() {
            let message = if path.exists() { "not a file" } else { "no such file" };
            return Err(H5adError::Open { path: path.to_path_buf(), format: "HDF5", message: message.into() });
        }
        let file = hdf5::File::open(path).map_err(|e| not_hdf5(path, e))?;
        Ok(H5adFile { path: path.to_path_buf(), file, ranged: None, local: Some(path.to_path_buf()) })
    }

    /// `e`, with why the read of a file at a URL failed, when one did (HDF5
    /// says only that it did).
    pub(crate) fn with_read_failure(&self, e: H5adError) -> H5adError {
        let Some(failure) = self.ranged.as_ref().and_then(|r| r.failure()) else { return e };
        let (path, object, error): (PathBuf, String, Cause) = match e {
            H5adError::Invalid { path, object, message } => (path, object, message.into()),
            H5adError::Read { path, object, source } => match source.downcast::<Hdf5Error>() {
                Ok(h) => (path, object, Box::new(h.without_hint()) as Cause),
                Err(source) => (path, object, source),
            },
            e => return e,
        };
        H5adError::Read { path, object, source: Box::new(FailedRead::new(error, failure)) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Starts fetching the arrays of `matrix` ahead of the reads, for a file
    /// at a URL whose matrix is most of it (a file whose other matrices are
    /// large is read by its streams' read-ahead alone), and keeps read-ahead
    /// within the arrays' bytes. Nothing for a local file.
    pub(crate) fn prefetch_matrix(&self, matrix: &MatrixReader) {
        if let Some(ranged) = &self.ranged {
            ranged.set_extents(&matrix.byte_extents());
            if matrix.stored_bytes() * 4 >= ranged.size() * 3 {
                let starts: Vec<u64> =
                    matrix.array_paths().iter().filter_map(|p| driver::header_address(&self.file, p)).collect();
                remote::prefetch_whole(ranged, &starts);
            }
        }
    }

    pub fn file(&self) -> &hdf5::File {
        &self.file
    }

    pub(crate) fn invalid(&self, object: &str, message: impl Into<String>) -> H5adError {
        H5adError::Invalid { path: self.path.clone(), object: object.to_string(), message: message.into() }
    }

    pub(crate) fn unsupported(&self, object: &str, message: impl Into<String>) -> H5adError {
        H5adError::Unsupported { path: self.path.clone(), object: object.to_string(), message: message.into() }
    }

    /// `object` could not be read: `source` says why.
    pub(crate) fn read_failed(&self, object: &str, source: impl Into<Cause>) -> H5adError {
        H5adError::Read { path: self.path.clone(), object: object.to_string(), source: source.into() }
    }

    /// Whether an object exists at `name` (a path like `raw/X`).
    pub fn exists(&self, name: &str) -> bool {
        let mut at = String::new();
        for part in name.split('/') {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            if !self.file.link_exists(&at) {
                return false;
            }
        }
        true
    }

    /// The matrix at `name`: `X`, `raw/X` or `layers/NAME`.
    pub fn matrix(&self, name: &str) -> Result<MatrixReader, H5adError> {
        let name = self.matrix_path(name);
        if !self.exists(name) {
            let mut message = "not found".to_string();
            let others = self.matrix_names();
            if !others.is_empty() {
                message.push_str(&format!(" (this file has: {})", others.join(", ")));
            }
            return Err(self.invalid(name, message));
        }
        if let Ok(ds) = self.file.dataset(name) {
            let shape = ds.shape();
            if shape.len() != 2 {
                return Err(self.unsupported(name, format!("a dense matrix must be 2-D, this one has shape {shape:?}")));
            }
            check_numeric(self, name, &ds)?;
            if let Some(problem) = shape_problem(shape[0] as u64, shape[1] as u64) {
                return Err(self.invalid(name, format!("shape {shape:?}: {problem}")));
            }
            if let Some(problem) = unbacked(ds.size() as u64, ds.storage_size()) {
                return Err(self.invalid(name, problem));
            }
            return Ok(MatrixReader {
                path: self.path.clone(),
                name: name.into(),
                layout: Layout::Dense,
                n_rows: shape[0] as u64,
                n_cols: shape[1] as u64,
                datasets: vec![ds],
                csc_as_csr: std::sync::OnceLock::new(),
                direct: vec![None],
            });
        }
        let group = self.file.group(name).map_err(|e| self.read_failed(name, Hdf5Error::new(e)))?;
        let encoding = read_string_attr(&group, "encoding-type").map_err(|e| self.read_failed(name, e))?;
        let legacy = read_string_attr(&group, "h5sparse_format").map_err(|e| self.read_failed(name, e))?;
        let layout = match (encoding.as_deref(), legacy.as_deref()) {
            (Some("csr_matrix"), _) | (None, Some("csr")) => Layout::Csr,
            (Some("csc_matrix"), _) | (None, Some("csc")) => Layout::Csc,
            (Some(other), _) => {
                return Err(self.unsupported(
                    name,
                    format!("encoding-type {other:?}; expected csr_matrix, csc_matrix or a dense array"),
                ))
            }
            (None, Some(other)) => return Err(self.unsupported(name, format!("h5sparse_format {other:?}"))),
            (None, None) => {
                return Err(self.unsupported(name, "a group without encoding-type or h5sparse_format attributes"))
            }
        };
        let shape_attr = if group.attr("shape").is_ok() { "shape" } else { "h5sparse_shape" };
        let shape: Vec<i64> = group
            .attr(shape_attr)
            .and_then(|a| a.read_raw::<i64>())
            .map_err(|e| self.read_failed(&format!("{name}/@shape"), h5err(e)))?;
        let [n_rows, n_cols] = shape[..] else {
            return Err(self.invalid(&format!("{name}/@shape"), format!("{shape:?} is not two dimensions")));
        };
        if n_rows < 0 || n_cols < 0 {
            return Err(self.invalid(&format!("{name}/@shape"), format!("{shape:?} is negative")));
        }
        self.sparse_matrix(name, &group, layout, n_rows as u64, n_cols as u64)
    }

    /// The sparse matrix whose arrays `data`, `indices` and `indptr` are in
    /// `group` (`name` in messages), of the shape given (for CSC, `indptr`
    /// runs over the columns), its arrays checked to agree with it.
    pub(crate) fn sparse_matrix(
        &self,
        name: &str,
        group: &hdf5::Group,
        layout: Layout,
        n_rows: u64,
        n_cols: u64,
    ) -> Result<MatrixReader, H5adError> {
        let mut datasets = Vec::new();
        for part in ["data", "indices", "indptr"] {
            let object = format!("{name}/{part}");
            let ds = group.dataset(part).map_err(|_| self.invalid(&object, "missing"))?;
            if ds.shape().len() != 1 {
                return Err(self.invalid(&object, format!("must be 1-D, has shape {:?}", ds.shape())));
            }
            check_numeric(self, &object, &ds)?;
            datasets.push(ds);
        }
        if let Some(problem) = shape_problem(n_rows, n_cols) {
            return Err(self.invalid(name, format!("shape [{n_rows}, {n_cols}]: {problem}")));
        }
        for (part, ds) in ["data", "indices"].iter().zip(&datasets) {
            if let Some(problem) = unbacked(ds.size() as u64, ds.storage_size()) {
                return Err(self.invalid(&format!("{name}/{part}"), problem));
            }
        }
        let (data_len, indices_len, indptr_len) = (datasets[0].size(), datasets[1].size(), datasets[2].size());
        if data_len != indices_len {
            return Err(self.invalid(name, format!("data has {data_len} entries but indices has {indices_len}")));
        }
        let major = if layout == Layout::Csr { n_rows } else { n_cols };
        if indptr_len as u64 != major + 1 {
            return Err(self.invalid(
                &format!("{name}/indptr"),
                format!("has {indptr_len} entries, but shape [{n_rows}, {n_cols}] needs {}", major + 1),
            ));
        }
        Ok(MatrixReader {
            path: self.path.clone(),
            name: name.into(),
            layout,
            n_rows,
            n_cols,
            direct: self.direct_arrays(&datasets),
            datasets,
            csc_as_csr: std::sync::OnceLock::new(),
        })
    }

    /// Each of `datasets` as read without HDF5, where it can be: the file
    /// on this machine, opened again (and the same size as HDF5's), and the
    /// array simply chunked.
    fn direct_arrays(&self, datasets: &[hdf5::Dataset]) -> Vec<Option<direct::DirectArray>> {
        let file = self.local.as_ref().and_then(|p| std::fs::File::open(p).ok());
        let len = file.as_ref().and_then(|f| f.metadata().ok()).map(|m| m.len());
        match (file, len) {
            (Some(file), Some(len)) if self.file.size() == len => {
                let file = std::sync::Arc::new(file);
                datasets.iter().map(|ds| direct::DirectArray::new(ds, &file, len)).collect()
            }
            _ => datasets.iter().map(|_| None).collect(),
        }
    }

    /// The matrices this file holds, among X, raw/X and layers/*.
    pub fn matrix_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for n in ["X", "raw/X"] {
            if self.exists(self.matrix_path(n)) {
                names.push(n.to_string());
            }
        }
        if let Ok(layers) = self.file.group("layers") {
            for l in layers.member_names().unwrap_or_default() {
                names.push(format!("layers/{l}"));
            }
        }
        names
    }

    /// Where matrix `name` is stored: itself, except that `raw/X` is `raw.X`
    /// in files written before anndata 0.7, which kept raw as top-level
    /// `raw.X` and `raw.var`.
    fn matrix_path<'n>(&self, name: &'n str) -> &'n str {
        if name == "raw/X" && !self.exists("raw/X") && self.file.link_exists("raw.X") {
            "raw.X"
        } else {
            name
        }
    }

    /// The var (gene) table group that goes with matrix `name`: `raw/var` for
    /// `raw/X` (`raw.var` in files before anndata 0.7), `var` otherwise.
    pub fn var_group_for(&self, name: &str) -> &'static str {
        match self.matrix_path(name) {
            "raw/X" => "raw/var",
            "raw.X" => "raw.var",
            _ => "var",
        }
    }

    /// The dataframe group `group_name` (obs, var), or an error naming what is
    /// there instead.
    fn dataframe_group(&self, group_name: &str) -> Result<hdf5::Group, H5adError> {
        if let Ok(group) = self.file.group(group_name) {
            return Ok(group);
        }
        if self.file.dataset(group_name).is_ok() {
            return Err(self.unsupported(
                group_name,
                "a compound dataset, the layout of anndata before 0.7 (2019); anndata still reads it: \
                 write it again with a current anndata, anndata.read_h5ad(path).write_h5ad(new_path)",
            ));
        }
        Err(self.invalid(group_name, "missing"))
    }

    /// The name (the `_index` attribute, "_index" when absent) and dataset of
    /// the index of a dataframe group such as `obs` or `var`.
    pub fn index_dataset(&self, group_name: &str) -> Result<(String, hdf5::Dataset), H5adError> {
        let group = self.dataframe_group(group_name)?;
        let index = read_string_attr(&group, "_index")
            .map_err(|e| self.read_failed(group_name, e))?
            .unwrap_or_else(|| "_index".into());
        let object = format!("{group_name}/{index}");
        let ds = group.dataset(&index).map_err(|_| self.invalid(&object, "the index column is missing"))?;
        check_filters(self, &object, &ds)?;
        Ok((index, ds))
    }

    /// Rows `rows` (all when None) of the index (names) of a dataframe group
    /// such as `obs` or `var`. Besides strings, reads an index stored as an
    /// old-style categorical (anndata before 0.8: codes in the column, the
    /// names in `__categories/<index>`), as anndata does.
    pub fn index_rows(&self, group_name: &str, rows: Option<Range<usize>>) -> Result<Vec<String>, H5adError> {
        let (index, ds) = self.index_dataset(group_name)?;
        let object = format!("{group_name}/{index}");
        let categories_object = format!("{group_name}/__categories/{index}");
        if let Ok(categories) = self.file.dataset(&categories_object) {
            let names = read_strings(&categories).map_err(|e| self.read_failed(&categories_object, e))?;
            let codes: Vec<i64> = match &rows {
                None => ds.read_raw::<i64>(),
                Some(r) => ds.read_slice_1d::<i64, _>(r.clone()).map(|a| a.to_vec()),
            }
            .map_err(|e| self.read_failed(&object, h5err(e)))?;
            let first = rows.as_ref().map_or(0, |r| r.start);
            return codes
                .iter()
                .enumerate()
                .map(|(i, &c)| {
                    usize::try_from(c).ok().and_then(|c| names.get(c).cloned()).ok_or_else(|| {
                        self.invalid(
                            &format!("{object}[{}]", first + i),
                            format!("code {c} is not one of the {} names in {categories_object}", names.len()),
                        )
                    })
                })
                .collect();
        }
        match rows {
            None => read_strings(&ds),
            Some(r) => read_strings_range(&ds, r),
        }
        .map_err(|e| self.read_failed(&object, e))
    }

    /// The index (names) of a dataframe group such as `obs` or `var`.
    pub fn dataframe_index(&self, group_name: &str) -> Result<Vec<String>, H5adError> {
        self.index_rows(group_name, None)
    }

    /// The cell names, or None when the file has no readable obs index.
    pub fn obs_names(&self) -> Option<Vec<String>> {
        self.dataframe_index("obs").ok()
    }
}

/// An HDF5 filter, by its registered id (the HDF Group's list), as words.
fn filter_name(id: i32) -> String {
    let name = match id {
        1 => "gzip (deflate)",
        2 => "shuffle",
        3 => "fletcher32",
        4 => "szip",
        5 => "n-bit",
        6 => "scale-offset",
        307 => "bzip2",
        32000 => "LZF",
        32001 => "Blosc",
        32004 => "LZ4",
        32008 => "bitshuffle",
        32013 => "ZFP",
        32015 => "Zstandard",
        32017 => "SZ",
        32026 => "Blosc2",
        _ => return "a filter that is not in HDF5's registry".into(),
    };
    format!("the {name} filter")
}

/// Refuses, in plain words, a dataset compressed with a filter this build cannot
/// decode (HDF5's own error names a plugin folder of the build machine instead).
pub(crate) fn check_filters(file: &H5adFile, object: &str, ds: &hdf5::Dataset) -> Result<(), H5adError> {
    for filter in ds.filters() {
        if !filter.is_available() {
            let id = filter.id();
            return Err(file.unsupported(
                object,
                format!(
                    "compressed with {} (HDF5 filter {id}), which deltacells cannot decode (it reads \
                     gzip, LZF, Blosc, shuffle and fletcher32); rewrite the file with one of those, for example \
                     anndata.read_h5ad(path).write_h5ad(new_path, compression=\"gzip\")",
                    filter_name(id)
                ),
            ));
        }
    }
    Ok(())
}

fn check_numeric(file: &H5adFile, object: &str, ds: &hdf5::Dataset) -> Result<(), H5adError> {
    check_filters(file, object, ds)?;
    let desc = ds.dtype().and_then(|t| t.to_descriptor()).map_err(|e| H5adError::UnsupportedBy {
        path: file.path.clone(),
        object: object.to_string(),
        source: Box::new(h5err(e)),
    })?;
    match desc {
        TypeDescriptor::Integer(_) | TypeDescriptor::Unsigned(_) | TypeDescriptor::Float(_) => Ok(()),
        TypeDescriptor::Boolean => Ok(()),
        other => Err(file.unsupported(object, format!("holds {other}, not numbers"))),
    }
}

impl MatrixReader {
    fn invalid(&self, object: &str, message: impl Into<String>) -> H5adError {
        H5adError::Invalid { path: self.path.clone(), object: object.to_string(), message: message.into() }
    }

    fn read_failed(&self, object: &str, source: hdf5::Error) -> H5adError {
        H5adError::Read { path: self.path.clone(), object: object.to_string(), source: Box::new(h5err(source)) }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The HDF5 paths of the matrix's arrays (data, indices, indptr; or the
    /// dense array).
    pub(crate) fn array_paths(&self) -> Vec<String> {
        match self.layout {
            Layout::Dense => vec![self.name.clone()],
            _ => ["data", "indices", "indptr"].iter().map(|part| format!("{}/{part}", self.name)).collect(),
        }
    }

    /// Where the matrix's arrays' bytes are in the file: each contiguous
    /// array's, and each chunk's of a chunked one (none for an array
    /// HDF5 cannot place, which read-ahead then treats as any other bytes).
    pub(crate) fn byte_extents(&self) -> Vec<std::ops::Range<u64>> {
        let mut out = Vec::new();
        for ds in &self.datasets {
            if let Some(offset) = ds.offset() {
                out.push(offset..offset.saturating_add(ds.storage_size()));
            } else if ds.is_chunked() {
                let _ = ds.chunks_visit(|chunk| {
                    out.push(chunk.addr..chunk.addr.saturating_add(chunk.size));
                    0
                });
            }
        }
        out
    }

    /// The bytes of the matrix's arrays as stored uncompressed (their
    /// elements times their sizes).
    pub fn stored_bytes(&self) -> u64 {
        self.datasets.iter().map(|ds| ds.size() as u64 * ds.dtype().map_or(0, |t| t.size() as u64)).sum()
    }

    pub fn n_rows(&self) -> u64 {
        self.n_rows
    }

    pub fn n_cols(&self) -> u64 {
        self.n_cols
    }

    fn object(&self, part: &str) -> String {
        format!("{}/{part}", self.name)
    }

    /// Reads rows `rows` as stored (indices checked to be in range; values not
    /// yet checked as counts).
    pub fn read_rows(&self, rows: Range<u64>) -> Result<RawRows, H5adError> {
        if rows.end > self.n_rows || rows.start > rows.end {
            return Err(self.invalid(&self.name, format!("rows {rows:?} outside 0..{}", self.n_rows)));
        }
        match self.layout {
            Layout::Csr => self.read_csr_rows(rows),
            Layout::Dense => self.read_dense_rows(rows),
            Layout::Csc => Ok(made_once(&self.csc_as_csr, || self.read_csc_as_csr())?.rows(rows)),
        }
    }

    fn read_indptr(&self, range: Range<u64>) -> Result<Vec<u64>, H5adError> {
        let object = self.object("indptr");
        let raw: Vec<i64> = self
            .slice::<i64>(2, range.start as usize..range.end as usize + 1)
            .map_err(|e| self.read_failed(&object, e))?;
        checked_indptr(raw, range.start, self.datasets[0].size() as i64)
            .map_err(|(at, message)| self.invalid(&format!("{object}[{at}]"), message))
    }

    fn read_entries(&self, range: Range<u64>, minor: u64) -> Result<(Vec<u32>, Values), H5adError> {
        let (a, b) = (range.start as usize, range.end as usize);
        let object = self.object("indices");
        let failed = |e: hdf5::Error| self.read_failed(&object, e);
        // Read in the type the file stores where it is a common one, so that
        // HDF5 copies instead of converting each element (most of a
        // conversion's reading time when it asked for i64 and f64).
        let indices = match stored_type(&self.datasets[1]) {
            Some(TypeDescriptor::Integer(IntSize::U4)) => {
                let raw = self.slice::<i32>(1, a..b).map_err(failed)?;
                checked_indices_i32(raw, range.start, minor)
            }
            _ => {
                let raw = self.slice::<i64>(1, a..b).map_err(failed)?;
                checked_indices(&raw, range.start, minor)
            }
        }
        .map_err(|(at, message)| self.invalid(&format!("{object}[{at}]"), message))?;
        let data = &self.datasets[0];
        let failed = |e: hdf5::Error| self.read_failed(&self.object("data"), e);
        // (kept in their stored type: each is widened as it is checked)
        let values: Values = match stored_type(data) {
            Some(TypeDescriptor::Float(FloatSize::U4)) => self.slice::<f32>(0, a..b).map_err(failed)?.into(),
            Some(TypeDescriptor::Integer(IntSize::U4)) => self.slice::<i32>(0, a..b).map_err(failed)?.into(),
            Some(TypeDescriptor::Unsigned(IntSize::U4)) => self.slice::<u32>(0, a..b).map_err(failed)?.into(),
            Some(TypeDescriptor::Float(FloatSize::U8)) => self.slice::<f64>(0, a..b).map_err(failed)?.into(),
            _ => data.read_slice_1d::<f64, _>(a..b).map_err(failed).map(owned)?.into(),
        };
        Ok((indices, values))
    }

    /// Elements `range` of array `k` (data, indices, indptr) in the type
    /// it stores: read without HDF5 where they can be, else through it.
    fn slice<T: direct::Element + hdf5::H5Type>(&self, k: usize, range: Range<usize>) -> Result<Vec<T>, hdf5::Error> {
        if let Some(out) = self.direct.get(k).and_then(Option::as_ref).and_then(|d| d.read::<T>(range.clone())) {
            return Ok(out);
        }
        self.datasets[k].read_slice_1d::<T, _>(range).map(owned)
    }

    fn read_csr_rows(&self, rows: Range<u64>) -> Result<RawRows, H5adError> {
        let indptr = self.read_indptr(rows.clone())?;
        let (lo, hi) = (indptr[0], *indptr.last().expect("at least one entry"));
        let (indices, values) = self.read_entries(lo..hi, self.n_cols)?;
        Ok(RawRows { indptr: indptr.iter().map(|&p| p - lo).collect(), indices, values })
    }

    fn read_dense_rows(&self, rows: Range<u64>) -> Result<RawRows, H5adError> {
        let block = self.datasets[0]
            .read_slice_2d::<f64, _>((rows.start as usize..rows.end as usize, ..))
            .map_err(|e| self.read_failed(&self.name, e))?;
        Ok(RawRows::from_dense_rows(block.rows().into_iter()))
    }

    fn read_csc_as_csr(&self) -> Result<RawRows, H5adError> {
        let colptr = self.read_indptr(0..self.n_cols)?;
        let (rows_of, values) = self.read_entries(0..colptr.last().copied().unwrap_or(0), self.n_rows)?;
        Ok(RawRows::from_columns(&colptr, &rows_of, &values, self.n_rows))
    }
}

/// The element type a dataset stores, when HDF5 can say.
fn stored_type(ds: &hdf5::Dataset) -> Option<TypeDescriptor> {
    ds.dtype().and_then(|t| t.to_descriptor()).ok()
}

/// An array HDF5 read, as a vector: its own buffer when that holds exactly
/// its elements in order (a fresh read does), else a copy.
fn owned<T: Clone>(array: ndarray::Array1<T>) -> Vec<T> {
    let len = array.len();
    if !array.is_standard_layout() {
        return array.to_vec();
    }
    let (mut v, offset) = array.into_raw_vec_and_offset();
    match offset.unwrap_or(0) {
        0 if v.len() == len => v,
        start => {
            v.truncate(start + len);
            v.drain(..start);
            v
        }
    }
}
