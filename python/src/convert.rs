//! Conversion from Python: files (`convert_files`, `append_files`,
//! `compact_dataset`), an AnnData
//! object held in memory (`convert_anndata`: the Python layer hands over its
//! tables and a function that gives row blocks of its matrix), and the command
//! line that the package's `deltacells` console script runs.
//!
//! The jobs are the library's (`deltacells::convert`); this file only turns
//! the keyword arguments checked by the package's conversion modules
//! (`deltacells/_convert.py`, `_anndata.py`, `_compact.py`, `_reaching.py`)
//! into its options, reports progress to a Python object, and turns its errors into the
//! package's exceptions.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::ArrayRef;
use numpy::{PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use serde_json::{Map, Value};

use deltacells::convert::{self, AppendOptions, ConvertError, ConvertOptions, ConvertProgress, GivenOrder, ObsOptions};
use deltacells::inputs::remote::BlockCacheOptions;
use deltacells::inputs::{
    checked_indices, checked_indptr, first_rows_are_counts, Categories, FrameColumn, InputError, InputSource,
    MemoryTable, RawRows, Table,
};
use deltacells::inputs::{InputFormat, InputOptions, InputReading, ProvidedInput};
use deltacells::storage::StoreOptions;
use deltacells::writer::WriteOptions;
use deltacells::Dataset;

use crate::allocator::KeepFreedPages;
use crate::errors::{detached, Failure, Kind};
use crate::threads::Threads;

/// Runs the command line `argv` (the program's name first) as the
/// `deltacells` binary does, and returns its exit status. The GIL is released
/// while it runs; a panic is status 2 with a message, never an unwinding
/// into Python.
#[pyfunction]
pub(crate) fn run_command_line(py: Python<'_>, argv: Vec<String>) -> u8 {
    let run = || {
        let _pages = KeepFreedPages::now();
        std::panic::catch_unwind(|| deltacells::run_command_line(argv)).unwrap_or(2)
    };
    py.detach(run)
}

/// The library's conversion defaults, as `_types.ConvertDefaults`: the one
/// definition of them, which the signatures of `convert`, `write_anndata`
/// and `compact` take theirs from (as the command line's do).
#[pyfunction]
pub(crate) fn convert_defaults(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let WriteOptions { tile_size, n_chunks, zstd_level } = WriteOptions::default();
    let ObsOptions { max_categories, tiles_per_file, .. } = ObsOptions::default();
    let dict = pyo3::types::PyDict::new(py);
    dict.set_item("tile_size", tile_size)?;
    dict.set_item("chunks", n_chunks)?;
    dict.set_item("level", zstd_level)?;
    dict.set_item("gene_order_files", ConvertOptions::default().gene_order_files)?;
    dict.set_item("max_categories", max_categories)?;
    dict.set_item("obs_tiles_per_file", tiles_per_file)?;
    dict.set_item("compact_level", deltacells::writer::ARCHIVE_LEVEL)?;
    Ok(dict)
}

/// How inputs are reached and read, and where the output is: the options
/// convert, append, write_anndata and compact share (`_types.py`'s
/// `_Reaching`, checked by `_reaching.py`).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct RawReaching {
    anonymous: bool,
    endpoint: Option<String>,
    input_format: Option<String>,
    feature_type: Option<String>,
    genome: Option<String>,
    download_inputs: bool,
    download_dir: Option<PathBuf>,
    threads: Option<usize>,
}

impl RawReaching {
    /// The pool a job runs on: `threads` workers, and one more for the job
    /// itself, which waits on them (as the command's main thread waits on
    /// its `--threads` workers); all cores when None.
    fn pool(&self) -> Threads {
        Threads::new(self.threads.map(|n| n + 1))
    }

    fn store(&self) -> StoreOptions {
        StoreOptions { anonymous: self.anonymous, endpoint: self.endpoint.clone() }
    }

    /// The library's input options, and the temporary folder inputs at URLs
    /// are downloaded into (removed when dropped), when asked for.
    fn inputs(&self) -> Result<(InputOptions, Option<tempfile::TempDir>), Failure> {
        let format = match self.input_format.as_deref() {
            None => None,
            Some(name) => Some(
                InputFormat::from_name(name)
                    .ok_or_else(|| value(format!("input_format={name:?}: expected {}", InputFormat::names_listed())))?,
            ),
        };
        let mut options = InputOptions {
            reading: InputReading { format, feature_type: self.feature_type.clone(), genome: self.genome.clone() },
            ..InputOptions::default()
        };
        options.remote.store = self.store();
        options.remote.block_cache = block_cache_from_env()?;
        let mut temp = None;
        if self.download_inputs {
            let dir = match &self.download_dir {
                Some(dir) => dir.clone(),
                None => {
                    let made = tempfile::Builder::new()
                        .prefix("deltacells-inputs-")
                        .tempdir()
                        .map_err(|e| Failure { kind: Kind::Other, message: format!("download_inputs: {e}") })?;
                    let dir = made.path().to_path_buf();
                    temp = Some(made);
                    dir
                }
            };
            options.remote.download_dir = Some(dir);
        }
        Ok((options, temp))
    }
}

/// The block cache of inputs read by ranges, as the command line's
/// `--input-cache-mib` and `--input-readahead-mib` default to it: from
/// `$DELTACELLS_INPUT_CACHE_MIB` and `$DELTACELLS_INPUT_READAHEAD_MIB`
/// when set, else the library's defaults.
fn block_cache_from_env() -> Result<BlockCacheOptions, Failure> {
    let mib = |name: &str, default: u64| -> Result<u64, Failure> {
        match std::env::var(name) {
            Err(_) => Ok(default),
            Ok(v) => v
                .trim()
                .parse::<u64>()
                .map(|m| m.saturating_mul(1 << 20))
                .map_err(|_| value(format!("{name}={v:?}: expected a whole number of MiB"))),
        }
    };
    Ok(BlockCacheOptions {
        budget: mib("DELTACELLS_INPUT_CACHE_MIB", BlockCacheOptions::DEFAULT_BUDGET >> 20)?,
        read_ahead: mib("DELTACELLS_INPUT_READAHEAD_MIB", BlockCacheOptions::DEFAULT_READ_AHEAD >> 20)?,
    })
}

/// Every option of `convert`, as `_convert.py` checked it.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct RawConvertOptions {
    matrix: String,
    tile_size: u64,
    chunks: usize,
    level: i32,
    gene_order_files: usize,
    gene_order_from: Option<String>,
    gene_order: Option<PathBuf>,
    genes: String,
    var: bool,
    obs: bool,
    obs_names: bool,
    obs_exclude: Vec<String>,
    max_categories: usize,
    obs_tiles_per_file: u64,
    overwrite: bool,
    metadata: Vec<(String, String)>,
    shuffle: Option<u64>,
    spill_dir: Option<PathBuf>,
}

impl RawConvertOptions {
    fn options(&self, reaching: &RawReaching, inputs: InputOptions) -> Result<ConvertOptions, Failure> {
        let genes = convert::GeneSet::from_name(&self.genes)
            .ok_or_else(|| value(format!("genes={:?}: expected same, intersection or union", self.genes)))?;
        let gene_order = match (&self.gene_order_from, &self.gene_order) {
            (Some(root), _) => {
                let dataset = deltacells::storage::open_with(root, &reaching.store())
                    .map_err(Failure::from)
                    .and_then(|store| Dataset::from_storage(store).map_err(Failure::from))
                    .and_then(|ds| GivenOrder::from_dataset(&ds, root).map_err(Failure::from))
                    .map_err(|f| Failure { message: format!("gene_order_from={root:?}: {}", f.message), ..f })?;
                Some(dataset)
            }
            (None, Some(path)) => Some(GivenOrder::from_npy(path).map_err(|e| {
                let f = failure(e);
                Failure { message: format!("gene_order={:?}: {}", path.display().to_string(), f.message), ..f }
            })?),
            (None, None) => None,
        };
        let mut metadata = Map::new();
        for (k, v) in &self.metadata {
            metadata.insert(k.clone(), Value::String(v.clone()));
        }
        Ok(ConvertOptions {
            matrix: self.matrix.clone(),
            write: WriteOptions { tile_size: self.tile_size, n_chunks: self.chunks, zstd_level: self.level },
            gene_order_files: self.gene_order_files,
            gene_order,
            genes,
            write_var: self.var,
            obs: self.obs.then(|| ObsOptions {
                names: self.obs_names,
                exclude: self.obs_exclude.clone(),
                max_categories: self.max_categories,
                tiles_per_file: self.obs_tiles_per_file,
            }),
            overwrite: self.overwrite,
            metadata,
            shuffle: self.shuffle,
            spill_dir: self.spill_dir.clone(),
            inputs,
            ..ConvertOptions::default()
        })
    }
}

/// Converts `inputs` into a dataset at `out`; returns the summary as JSON.
#[pyfunction]
pub(crate) fn convert_files(
    py: Python<'_>,
    inputs: Vec<String>,
    out: String,
    options: RawConvertOptions,
    reaching: RawReaching,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    let inputs: Vec<PathBuf> = inputs.into_iter().map(PathBuf::from).collect();
    let progress = PyProgress(progress);
    detached(py, || {
        let _pages = KeepFreedPages::now();
        let (reach, _downloads) = reaching.inputs()?;
        let options = options.options(&reaching, reach)?;
        run_conversion(&inputs, &out, &options, &reaching, &progress)
    })
}

/// Converts the AnnData object `source` describes into a dataset at `out`.
#[pyfunction]
pub(crate) fn convert_anndata(
    py: Python<'_>,
    source: RawAnnData,
    out: String,
    options: RawConvertOptions,
    reaching: RawReaching,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    let name = PathBuf::from(&source.name);
    let source = AnnDataSource::new(py, source)?;
    let progress = PyProgress(progress);
    detached(py, || {
        let _pages = KeepFreedPages::now();
        let (mut reach, _) = reaching.inputs()?;
        reach.provided.push(ProvidedInput { name: name.clone(), source: Arc::new(source) });
        let options = options.options(&reaching, reach)?;
        run_conversion(&[name], &out, &options, &reaching, &progress)
    })
}

fn run_conversion(
    inputs: &[PathBuf],
    out: &str,
    options: &ConvertOptions,
    reaching: &RawReaching,
    progress: &PyProgress,
) -> Result<String, Failure> {
    let (_, store) = convert::open_output(out, &reaching.store(), "write to").map_err(failure)?;
    let summary =
        reaching.pool().install(|| convert::convert(inputs, store.as_ref(), options, progress).map_err(failure))?;
    Ok(serde_json::to_string(&summary).unwrap_or_default())
}

/// Every option of `append`, as `_convert.py` checked it.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct RawAppendOptions {
    matrix: Option<String>,
    resume: bool,
    shuffle: Option<u64>,
    spill_dir: Option<PathBuf>,
}

/// Appends `inputs` to the dataset at `dataset` (or completes an interrupted
/// append, with `resume`); returns the summary as JSON.
#[pyfunction]
pub(crate) fn append_files(
    py: Python<'_>,
    dataset: String,
    inputs: Vec<String>,
    options: RawAppendOptions,
    reaching: RawReaching,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    let inputs: Vec<PathBuf> = inputs.into_iter().map(PathBuf::from).collect();
    let progress = PyProgress(progress);
    detached(py, || {
        let _pages = KeepFreedPages::now();
        let (reach, _downloads) = reaching.inputs()?;
        let append_options = AppendOptions {
            matrix: options.matrix.clone(),
            shuffle: options.shuffle,
            spill_dir: options.spill_dir.clone(),
            inputs: reach,
            ..AppendOptions::default()
        };
        let (_, store) = convert::open_output(&dataset, &reaching.store(), "append to").map_err(failure)?;
        let summary = reaching.pool().install(|| {
            if options.resume {
                convert::resume(store.clone(), &append_options, &progress)
            } else {
                convert::append(store.clone(), &inputs, &append_options, &progress)
            }
            .map_err(failure)
        })?;
        Ok(serde_json::to_string(&summary).unwrap_or_default())
    })
}

/// Encodes the tiles of `dataset` again at zstd `level` (`deltacells.compact`).
#[pyfunction]
pub(crate) fn compact_dataset(
    py: Python<'_>,
    dataset: String,
    level: i32,
    reaching: RawReaching,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    let progress = PyProgress(progress);
    detached(py, || {
        let _pages = KeepFreedPages::now();
        let (_, store) = convert::open_output(&dataset, &reaching.store(), "compact").map_err(failure)?;
        let summary = reaching.pool().install(|| convert::compact(store.clone(), level, &progress).map_err(failure))?;
        Ok(serde_json::to_string(&summary).unwrap_or_default())
    })
}

/// Progress, reported to a Python object with the methods `phase(name,
/// total_cells)`, `file(name)`, `advance(cells)` and `note(message)` (what
/// `_jobs.py`'s `Progress` has). Its exceptions are ignored: a bar that
/// fails does not stop a conversion.
struct PyProgress(Option<Py<PyAny>>);

impl PyProgress {
    fn call<A: for<'py> pyo3::call::PyCallArgs<'py>>(&self, method: &str, args: A) {
        if let Some(target) = &self.0 {
            Python::attach(|py| {
                let _ = target.call_method1(py, method, args);
            });
        }
    }
}

impl ConvertProgress for PyProgress {
    fn note(&self, message: &str) {
        self.call("note", (message.to_string(),));
    }
    fn phase(&self, name: &str, total_cells: u64) {
        self.call("phase", (name.to_string(), total_cells));
    }
    fn file(&self, path: &Path) {
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        self.call("file", (deltacells::redact::redact(&name).into_owned(),));
    }
    fn advance(&self, cells: u64) {
        self.call("advance", (cells,));
    }
}

/// An argument the Python layer let through but the library refuses.
fn value(message: String) -> Failure {
    Failure { kind: Kind::Value, message }
}

/// A conversion's error as the exception to raise: a missing input is an
/// InputNotFoundError, an input that is not what it must be (its counts, its
/// genes, its obs) an InvalidInputError, an output that holds a dataset a
/// DatasetExistsError, with the library's message and, where the command
/// line adds the flag that gets past it, the keyword argument instead.
fn failure(e: ConvertError) -> Failure {
    let kind = match &e {
        ConvertError::NotEmpty { .. } => Kind::Exists,
        // An input its store did not serve: not there, or a failure of the
        // store (refused, denied), not of the input.
        ConvertError::Input(InputError::Store(s)) => match s.request_failure() {
            Some(deltacells::storage::RequestFailure::NotFound { .. }) => Kind::InputNotFound,
            _ => Kind::Other,
        },
        ConvertError::Input(InputError::Open { path, .. } | InputError::OpenFailed { path, .. })
            if !deltacells::inputs::remote::is_url(path) && !path.exists() =>
        {
            Kind::InputNotFound
        }
        ConvertError::Input(_) | ConvertError::Genes(_) | ConvertError::GeneOrder(_) | ConvertError::Obs(_) => {
            Kind::Input
        }
        ConvertError::Argument(_) => Kind::Value,
        ConvertError::Dataset(d) => Failure::from_dataset_kind(d),
        _ => Kind::Other,
    };
    let mut message = deltacells::error_chain(&e);
    if let Some(advice) = advice(&e) {
        message = format!("{message}; {advice}");
    }
    Failure { kind, message }
}

/// What to pass to get past `e`, in keyword arguments (the command line's
/// advice names its flags).
fn advice(e: &ConvertError) -> Option<String> {
    use deltacells::convert::genes::GeneError;
    use deltacells::convert::obs_merge::ObsMergeError;
    Some(match e {
        ConvertError::NotEmpty { .. } => "overwrite=True replaces the dataset in it".into(),
        ConvertError::Input(InputError::BadCount(bad)) => format!("matrix={:?} converts it", bad.counts_in.as_ref()?),
        ConvertError::Input(InputError::ColumnType { table, column, .. }) if table == "obs" => {
            format!("obs_exclude=[{column:?}] leaves the column out (or obs=False all of obs)")
        }
        ConvertError::Input(InputError::ColumnType { .. }) => "var=False leaves the gene table out".into(),
        ConvertError::Genes(GeneError::Differ(_)) => "every input must have the same genes (genes=\"intersection\" \
             keeps the genes every input has, genes=\"union\" all of them)"
            .into(),
        ConvertError::Obs(
            ObsMergeError::Missing { column, .. }
            | ObsMergeError::Extra { column, .. }
            | ObsMergeError::Kinds { column, .. }
            | ObsMergeError::Unstorable { column, .. },
        ) => format!("obs_exclude=[{column:?}] leaves it out"),
        ConvertError::Obs(ObsMergeError::NoObs { .. }) => "obs=False converts without obs".into(),
        _ => return None,
    })
}

/// The AnnData object `write_anndata` converts, as `_anndata.py` describes it.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct RawAnnData {
    /// What the object is called among the inputs (in messages and the manifest).
    name: String,
    /// `X`, `raw/X` or `layers/NAME`.
    matrix: String,
    n_rows: u64,
    n_cols: u64,
    /// `rows(matrix, start, end)` -> (indptr, indices, data) of those rows of
    /// the matrix so named, as int64, int64 and float64 arrays.
    rows: Py<PyAny>,
    /// The object's other matrices (name, rows, columns), for the message
    /// that refuses a matrix that is not counts (`raw/X holds counts`).
    others: Vec<(String, u64, u64)>,
    var: RawTable,
    obs: RawTable,
}

/// A table (obs or var) of an AnnData object.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct RawTable {
    index_name: String,
    index: Vec<String>,
    columns: Vec<RawColumn>,
}

/// One column of a table, encoded as anndata writes it: `kind` is
/// `category` (codes, categories of `categories_kind`, ordered), `numeric`
/// (values of a NumPy number type, mask), `bool` (values, mask) or `string`
/// (strings, None for missing).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct RawColumn {
    name: String,
    kind: String,
    values: Py<PyAny>,
    mask: Option<Vec<bool>>,
    categories: Option<Py<PyAny>>,
    categories_kind: Option<String>,
    ordered: bool,
}

/// An AnnData object's matrix, read in row blocks through the Python layer
/// (with the GIL, from whichever thread the conversion reads on), and its
/// tables, taken whole when the conversion starts.
struct AnnDataSource {
    path: PathBuf,
    matrix: String,
    n_rows: u64,
    n_cols: u64,
    rows: Py<PyAny>,
    others: Vec<(String, u64, u64)>,
    var: MemoryTable,
    obs: MemoryTable,
}

impl AnnDataSource {
    fn new(py: Python<'_>, raw: RawAnnData) -> PyResult<AnnDataSource> {
        let path = PathBuf::from(&raw.name);
        let table = |name: &str, t: RawTable| -> PyResult<MemoryTable> {
            let mut columns = Vec::with_capacity(t.columns.len());
            for c in t.columns {
                let column = frame_column(py, &c).map_err(|message| {
                    Failure { kind: Kind::ArgumentType, message: format!("{name}[{:?}]: {message}", c.name) }
                        .into_pyerr(py)
                })?;
                columns.push((c.name, column));
            }
            Ok(MemoryTable { path: path.clone(), name: name.into(), index_name: t.index_name, index: t.index, columns })
        };
        Ok(AnnDataSource {
            var: table("var", raw.var)?,
            obs: table("obs", raw.obs)?,
            path,
            matrix: raw.matrix,
            n_rows: raw.n_rows,
            n_cols: raw.n_cols,
            rows: raw.rows,
            others: raw.others,
        })
    }

    fn invalid(&self, message: String) -> InputError {
        InputError::Invalid { path: self.path.clone(), object: self.matrix.clone(), message }
    }
}

/// A column as the library's inputs give one.
fn frame_column(py: Python<'_>, c: &RawColumn) -> Result<FrameColumn, String> {
    let values = c.values.bind(py);
    let masked = |i: usize| c.mask.as_ref().is_some_and(|m| m.get(i).copied().unwrap_or(false));
    Ok(match c.kind.as_str() {
        "category" => {
            let codes: Vec<i32> = values.extract().map_err(|e: PyErr| format!("codes: {e}"))?;
            let categories = c.categories.as_ref().ok_or("no categories")?.bind(py);
            let categories = match c.categories_kind.as_deref() {
                Some("int") => Categories::Ints(categories.extract::<Vec<i64>>().map_err(|e| e.to_string())?),
                Some("float") => Categories::Floats(categories.extract::<Vec<f64>>().map_err(|e| e.to_string())?),
                Some("bool") => Categories::Bools(categories.extract::<Vec<bool>>().map_err(|e| e.to_string())?),
                _ => Categories::Strings(categories.extract::<Vec<String>>().map_err(|e| e.to_string())?),
            };
            FrameColumn::Category { codes, categories, ordered: c.ordered }
        }
        "bool" => {
            let v: Vec<bool> = values.extract().map_err(|e: PyErr| e.to_string())?;
            FrameColumn::Bool(v.into_iter().enumerate().map(|(i, b)| (!masked(i)).then_some(b)).collect())
        }
        "string" => FrameColumn::String(values.extract().map_err(|e: PyErr| e.to_string())?),
        "numeric" => FrameColumn::Numeric(numeric(values, &masked)?),
        other => return Err(format!("a column of kind {other:?}")),
    })
}

/// A NumPy array of numbers as the Arrow array of its type (NaN and masked
/// values are nulls), as the .h5ad reader makes one.
fn numeric(values: &Bound<'_, PyAny>, masked: &dyn Fn(usize) -> bool) -> Result<ArrayRef, String> {
    use arrow_array::*;
    macro_rules! try_type {
        ($t:ty, $array:ty, $nan:expr) => {
            if let Ok(a) = values.extract::<PyReadonlyArray1<'_, $t>>() {
                let a = a.as_array();
                let nan: fn(&$t) -> bool = $nan;
                let it = a.iter().enumerate().map(|(i, x)| (!nan(x) && !masked(i)).then_some(*x));
                return Ok(Arc::new(it.collect::<$array>()) as ArrayRef);
            }
        };
    }
    try_type!(i8, Int8Array, |_| false);
    try_type!(i16, Int16Array, |_| false);
    try_type!(i32, Int32Array, |_| false);
    try_type!(i64, Int64Array, |_| false);
    try_type!(u8, UInt8Array, |_| false);
    try_type!(u16, UInt16Array, |_| false);
    try_type!(u32, UInt32Array, |_| false);
    try_type!(u64, UInt64Array, |_| false);
    try_type!(f32, Float32Array, |x| x.is_nan());
    try_type!(f64, Float64Array, |x| x.is_nan());
    let dtype = values.getattr("dtype").map(|d| d.to_string()).unwrap_or_else(|_| "?".into());
    Err(format!("numbers of dtype {dtype}, which deltacells cannot store"))
}

impl InputSource for AnnDataSource {
    fn path(&self) -> &Path {
        &self.path
    }

    fn matrix_name(&self) -> &str {
        &self.matrix
    }

    fn n_rows(&self) -> u64 {
        self.n_rows
    }

    fn n_cols(&self) -> u64 {
        self.n_cols
    }

    fn read_rows(&self, rows: Range<u64>) -> Result<RawRows, InputError> {
        if rows.start > rows.end || rows.end > self.n_rows {
            return Err(self.invalid(format!("rows {rows:?} outside 0..{}", self.n_rows)));
        }
        self.rows_of(&self.matrix, rows, self.n_cols)
    }

    fn var(&self) -> Result<Box<dyn Table + '_>, InputError> {
        Ok(Box::new(&self.var))
    }

    fn obs(&self) -> Result<Option<Box<dyn Table + '_>>, InputError> {
        Ok(Some(Box::new(&self.obs)))
    }

    fn counts_elsewhere(&self) -> Option<String> {
        let others = self.others.iter().filter(|(name, _, _)| *name != self.matrix);
        others
            .filter(|(name, n_rows, n_cols)| {
                first_rows_are_counts(*n_rows, *n_cols, |rows| self.rows_of(name, rows, *n_cols))
            })
            .map(|(name, _, _)| name.clone())
            .next()
    }
}

impl AnnDataSource {
    /// Rows `rows` of the object's matrix `matrix` (of `n_cols` columns),
    /// from the Python layer, checked.
    fn rows_of(&self, matrix: &str, rows: Range<u64>, n_cols: u64) -> Result<RawRows, InputError> {
        let (indptr, indices, values) = Python::attach(|py| {
            let block = self.rows.call1(py, (matrix, rows.start, rows.end)).map_err(|e| self.invalid(e.to_string()))?;
            let (indptr, indices, data): (
                PyReadonlyArray1<'_, i64>,
                PyReadonlyArray1<'_, i64>,
                PyReadonlyArray1<'_, f64>,
            ) = block.extract(py).map_err(|e| self.invalid(format!("a row block: {e}")))?;
            if indptr.len() as u64 != rows.end - rows.start + 1 || indices.len() != data.len() {
                return Err(self.invalid(format!(
                    "rows {rows:?}: {} row pointers, {} indices and {} values",
                    indptr.len(),
                    indices.len(),
                    data.len()
                )));
            }
            let copy = |a: &PyReadonlyArray1<'_, i64>| a.as_array().to_vec();
            Ok((copy(&indptr), copy(&indices), data.as_array().to_vec()))
        })?;
        let n_entries = values.len() as i64;
        let first = indptr.first().copied().unwrap_or(0);
        let indptr: Vec<i64> = indptr.into_iter().map(|p| p - first).collect();
        let indptr = checked_indptr(indptr, rows.start, n_entries)
            .map_err(|(at, message)| self.invalid(format!("row pointer {at}: {message}")))?;
        let indices = checked_indices(&indices, 0, n_cols)
            .map_err(|(at, message)| self.invalid(format!("entry {at} of rows {rows:?}: {message}")))?;
        Ok(RawRows { indptr, indices, values: values.into() })
    }
}
