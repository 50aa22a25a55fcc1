//! The Rust side of the `deltacells` Python package: a thin binding over the
//! library's reading core. It owns bytes, threads and decoding; the Python
//! layer (`python/deltacells/`) owns the API's shape, pandas and scipy.
//!
//! Every call releases the GIL while it reads and decodes, hands its buffers to
//! NumPy without copying them, turns every library error into an exception of
//! the package's own hierarchy (with the library's message, each cause once),
//! and catches panics, so that none reaches Python. Nothing is started at
//! import: the thread pool of a dataset is made on its first read.

use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use deltacells::format::{self, CsrMatrix};
use deltacells::loader::{self, BufferPool, EpochPlan, LoaderBuffers, LoaderError, LoaderOptions};
use deltacells::obs::localize::{self, ObsError};
use deltacells::storage::{self, StorageError, StoreOptions};
use deltacells::{error_chain, Dataset, DatasetError};

/// Which exception of `deltacells._errors` an error is.
#[derive(Clone, Copy)]
enum Kind {
    /// No dataset, or an incomplete one (also a FileNotFoundError).
    NotFound,
    /// Bytes that break a rule of the format (also a ValueError).
    Corrupt,
    /// A cell index out of range (also an IndexError).
    Index,
    /// An argument out of its range (an InvalidArgumentError, also a ValueError).
    Value,
    /// Anything else: storage unreachable, cache not writable...
    Other,
}

/// A library error, as the exception to raise.
struct Failure {
    kind: Kind,
    message: String,
}

impl Failure {
    fn new(kind: Kind, error: &(dyn std::error::Error + 'static)) -> Failure {
        Failure { kind, message: error_chain(error) }
    }
}

impl From<DatasetError> for Failure {
    fn from(e: DatasetError) -> Failure {
        let kind = match &e {
            DatasetError::Incomplete { .. }
            | DatasetError::Unfinished { .. }
            | DatasetError::AppendUnfinished { .. }
            | DatasetError::Nothing { .. } => Kind::NotFound,
            DatasetError::Manifest { .. }
            | DatasetError::Missing { .. }
            | DatasetError::Invalid { .. }
            | DatasetError::Tile { .. } => Kind::Corrupt,
            DatasetError::CellOutOfRange { .. } => Kind::Index,
            DatasetError::Storage(_) => Kind::Other,
        };
        Failure::new(kind, &e)
    }
}

impl From<StorageError> for Failure {
    fn from(e: StorageError) -> Failure {
        Failure::new(Kind::Other, &e)
    }
}

impl From<ObsError> for Failure {
    fn from(e: ObsError) -> Failure {
        match e {
            ObsError::Dataset(d) => d.into(),
            ObsError::Shard { .. } | ObsError::RowGroup { .. } | ObsError::Missing { .. } => {
                Failure::new(Kind::Corrupt, &e)
            }
            ObsError::NoObs { .. } | ObsError::NoColumn { .. } => Failure::new(Kind::Index, &e),
            _ => Failure::new(Kind::Other, &e),
        }
    }
}

impl From<LoaderError> for Failure {
    fn from(e: LoaderError) -> Failure {
        match e {
            LoaderError::Dataset(d) => d.into(),
            LoaderError::Options(_) => Failure::new(Kind::Value, &e),
            LoaderError::Internal(_) => Failure::new(Kind::Other, &e),
        }
    }
}

impl Failure {
    fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let name = match self.kind {
            Kind::NotFound => "DatasetNotFoundError",
            Kind::Corrupt => "CorruptDatasetError",
            Kind::Index => "CellIndexError",
            Kind::Value => "InvalidArgumentError",
            Kind::Other => "DeltacellsError",
        };
        let class = py.import("deltacells._errors").and_then(|m| m.getattr(name));
        match class {
            Ok(class) => match class.call1((self.message.clone(),)) {
                Ok(instance) => PyErr::from_value(instance),
                Err(e) => e,
            },
            Err(e) => e,
        }
    }
}

/// Runs `f` without the GIL, catching panics: a panic becomes a
/// DeltacellsError that says it is a bug, never a PanicException.
fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, Failure> + Send) -> PyResult<T> {
    let result = py.detach(|| catch_unwind(AssertUnwindSafe(f)));
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(failure)) => Err(failure.into_pyerr(py)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(Failure { kind: Kind::Other, message: format!("internal error (a bug in deltacells): {what}") }
                .into_pyerr(py))
        }
    }
}

/// A Vec<u32> as a Vec<i32>, without copying (the format's indices and counts
/// are below 2^31, so every value is the same number).
fn as_i32(v: Vec<u32>) -> Vec<i32> {
    let mut v = ManuallyDrop::new(v);
    // SAFETY: u32 and i32 have the same size and alignment, and every bit
    // pattern is a valid i32; the allocation is handed over whole.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<i32>(), v.len(), v.capacity()) }
}

/// A Vec<u64> as a Vec<i64>, without copying (offsets are far below 2^63).
fn as_i64(v: Vec<u64>) -> Vec<i64> {
    let mut v = ManuallyDrop::new(v);
    // SAFETY: as in `as_i32`, for u64 and i64.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<i64>(), v.len(), v.capacity()) }
}

/// The cells of a NumPy int64 array (contiguous or not), copied out so that
/// the GIL can be released while they are used.
fn cell_vec(cells: &PyReadonlyArray1<'_, i64>) -> Vec<i64> {
    cells.as_slice().map(<[i64]>::to_vec).unwrap_or_else(|_| cells.as_array().to_vec())
}

/// A NumPy float64 array's values, copied out as `cell_vec` copies cells.
fn weight_vec(weights: &PyReadonlyArray1<'_, f64>) -> Vec<f64> {
    weights.as_slice().map(<[f64]>::to_vec).unwrap_or_else(|_| weights.as_array().to_vec())
}

type CsrArrays<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i32>>, Bound<'py, PyArray1<i32>>);

fn csr_arrays(py: Python<'_>, m: CsrMatrix) -> CsrArrays<'_> {
    (as_i64(m.indptr).into_pyarray(py), as_i32(m.indices).into_pyarray(py), as_i32(m.data).into_pyarray(py))
}

/// Buffers kept for whole tiles: two per tile (indices and data), for a loop
/// that holds a tile or two at a time.
const POOLED_BUFFERS: usize = 4;

/// The owner of a pooled buffer while a NumPy array is made over it; it
/// returns the buffer to the pool when NumPy lets the array go.
#[pyclass(frozen)]
struct PooledBuffer {
    data: std::sync::Mutex<Vec<u32>>,
    pool: Arc<BufferPool>,
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Ok(data) = self.data.get_mut() {
            self.pool.give(std::mem::take(data));
        }
    }
}

/// A NumPy int32 array over `v` (no copy), whose buffer goes back to `pool`.
fn pooled_array<'py>(py: Python<'py>, v: Vec<u32>, pool: &Arc<BufferPool>) -> PyResult<Bound<'py, PyArray1<i32>>> {
    let (ptr, len) = (v.as_ptr().cast::<i32>(), v.len());
    let owner = Bound::new(py, PooledBuffer { data: std::sync::Mutex::new(v), pool: pool.clone() })?;
    // SAFETY: the view covers the `len` initialized entries of the buffer,
    // whose allocation `owner` keeps, unmoved and unchanged, for as long as
    // the array lives (NumPy holds `owner` as the array's base); u32 values
    // below 2^31 are the same i32 values.
    unsafe {
        let view = numpy::ndarray::ArrayView1::from_shape_ptr(len, ptr);
        Ok(PyArray1::borrow_from_array(&view, owner.into_any()))
    }
}

/// Decoded tiles kept for repeated access, least recently used out first,
/// within a byte budget (8 bytes per nonzero and per cell).
#[derive(Default)]
struct TileCache {
    budget: u64,
    used: u64,
    /// (tile, decoded), most recently used last.
    tiles: Vec<(usize, Arc<CsrMatrix>)>,
}

fn decoded_bytes(m: &CsrMatrix) -> u64 {
    8 * (m.nnz() as u64 + m.n_rows() as u64 + 1)
}

impl TileCache {
    fn get(&mut self, tile: usize) -> Option<Arc<CsrMatrix>> {
        let at = self.tiles.iter().position(|(t, _)| *t == tile)?;
        let entry = self.tiles.remove(at);
        let found = entry.1.clone();
        self.tiles.push(entry);
        Some(found)
    }

    fn put(&mut self, tile: usize, decoded: Arc<CsrMatrix>) {
        let size = decoded_bytes(&decoded);
        if size > self.budget || self.tiles.iter().any(|(t, _)| *t == tile) {
            return;
        }
        while self.used + size > self.budget {
            let (_, old) = self.tiles.remove(0);
            self.used -= decoded_bytes(&old);
        }
        self.used += size;
        self.tiles.push((tile, decoded));
    }
}

/// An open dataset (`deltacells.open_dataset` wraps it).
#[pyclass(frozen, module = "deltacells._deltacells")]
struct RawDataset {
    dataset: Arc<Dataset>,
    threads: Option<usize>,
    pool: OnceLock<Result<Arc<rayon::ThreadPool>, String>>,
    /// Decoded tiles, when `cache_bytes` > 0.
    cache: std::sync::Mutex<TileCache>,
    /// Output buffers for whole tiles: taken back when NumPy frees the arrays
    /// made over them, so that a loop over tiles decodes into memory that is
    /// already mapped instead of faulting in fresh pages for every tile.
    buffers: Arc<BufferPool>,
    /// The loader's buffers, kept from one epoch to the next.
    loader_buffers: std::sync::Mutex<Option<LoaderBuffers>>,
}

impl RawDataset {
    /// Runs `f` on this dataset's thread pool (made on first use).
    fn install<T: Send>(&self, f: impl FnOnce() -> Result<T, Failure> + Send) -> Result<T, Failure> {
        self.thread_pool()?.install(f)
    }

    /// This dataset's thread pool, made on first use.
    fn thread_pool(&self) -> Result<Arc<rayon::ThreadPool>, Failure> {
        let pool = self.pool.get_or_init(|| {
            let mut builder = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("deltacells-{i}"));
            if let Some(n) = self.threads {
                builder = builder.num_threads(n.max(1));
            }
            builder.build().map(Arc::new).map_err(|e| e.to_string())
        });
        pool.clone().map_err(|e| Failure { kind: Kind::Other, message: format!("cannot start threads: {e}") })
    }

    /// Whether decoded tiles are kept (`cache_bytes` > 0).
    fn caching(&self) -> bool {
        self.cache.lock().map_or(0, |c| c.budget) > 0
    }

    /// The listed cells, in order, from whole decoded tiles: the cache's, or
    /// decoded now (in parallel, each once) and put in the cache.
    fn cells_via_cache(&self, cells: &[u64]) -> Result<CsrMatrix, Failure> {
        self.dataset.read_cell_list_with(cells, |tile, _rows| {
            let hit = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(tile);
            match hit {
                Some(m) => Ok(m),
                None => {
                    let m = Arc::new(self.dataset.read_tile(tile)?);
                    self.cache.lock().unwrap_or_else(|p| p.into_inner()).put(tile, m.clone());
                    Ok::<_, Failure>(m)
                }
            }
        })
    }

    /// The loader's buffers, kept from one epoch to the next (and made larger
    /// when a loader's windows or queue need more).
    fn loader_buffers(&self, options: &LoaderOptions) -> LoaderBuffers {
        let mut kept = self.loader_buffers.lock().unwrap_or_else(|p| p.into_inner());
        let wanted = LoaderBuffers::new(options);
        match &*kept {
            Some(b) if b.planes.keep() >= wanted.planes.keep() && b.batches.keep() >= wanted.batches.keep() => {
                b.clone()
            }
            _ => kept.insert(wanted).clone(),
        }
    }

    /// One epoch's share over `cells` (or every cell); with `weights`, over
    /// `num_samples` cells drawn from them by weight (default: as many as
    /// there are).
    fn plan(
        &self,
        cells: Option<&[i64]>,
        weights: Option<&[f64]>,
        num_samples: Option<u64>,
        options: &LoaderArgs,
    ) -> Result<EpochPlan, Failure> {
        let cells = cells.map(|c| self.check_cells(c)).transpose()?;
        let Some(weights) = weights else {
            return Ok(EpochPlan::new(&self.dataset, cells.as_deref(), &options.0)?);
        };
        let n = self.dataset.n_cells();
        let draws = num_samples.unwrap_or_else(|| cells.as_ref().map_or(n, |c| c.len() as u64));
        let drawn = loader::draw_by_weight(n, cells.as_deref(), weights, draws, &options.0)?;
        Ok(EpochPlan::new(&self.dataset, Some(&drawn), &options.0)?)
    }

    fn check_cells(&self, cells: &[i64]) -> Result<Vec<u64>, Failure> {
        let n = self.dataset.n_cells();
        cells
            .iter()
            .map(|&c| {
                u64::try_from(c).ok().filter(|&c| c < n).ok_or_else(|| Failure {
                    kind: Kind::Index,
                    message: format!("cell {c} is out of range: the dataset has {n} cells"),
                })
            })
            .collect()
    }
}

#[pymethods]
impl RawDataset {
    #[new]
    #[pyo3(signature = (root, threads=None, anonymous=false, endpoint=None, cache_bytes=0))]
    fn new(
        py: Python<'_>,
        root: String,
        threads: Option<usize>,
        anonymous: bool,
        endpoint: Option<String>,
        cache_bytes: u64,
    ) -> PyResult<Self> {
        let dataset = detached(py, move || {
            let options = StoreOptions { anonymous, endpoint };
            let store = storage::open_with(&root, &options)?;
            Ok(Dataset::from_storage(store)?)
        })?;
        let cache = std::sync::Mutex::new(TileCache { budget: cache_bytes, ..TileCache::default() });
        Ok(RawDataset {
            dataset: Arc::new(dataset),
            threads,
            pool: OnceLock::new(),
            cache,
            buffers: Arc::new(BufferPool::new(POOLED_BUFFERS)),
            loader_buffers: std::sync::Mutex::new(None),
        })
    }

    #[getter]
    fn n_cells(&self) -> u64 {
        self.dataset.n_cells()
    }

    #[getter]
    fn n_genes(&self) -> u32 {
        self.dataset.n_genes()
    }

    #[getter]
    fn n_tiles(&self) -> usize {
        self.dataset.n_tiles()
    }

    #[getter]
    fn location(&self) -> String {
        self.dataset.storage().location("")
    }

    /// Cells per tile, as an int64 array.
    fn tile_cells<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        as_i64(self.dataset.manifest().tile_cells.clone()).into_pyarray(py)
    }

    /// manifest.json as the dataset holds it, checked.
    fn manifest_json(&self) -> String {
        self.dataset.manifest().to_json()
    }

    fn var_names(&self, py: Python<'_>) -> PyResult<Option<Vec<String>>> {
        let dataset = self.dataset.clone();
        detached(py, move || Ok(dataset.var_names()?))
    }

    fn gene_order<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray1<i32>>>> {
        let dataset = self.dataset.clone();
        Ok(detached(py, move || Ok(dataset.gene_order()?))?.map(|o| o.into_pyarray(py)))
    }

    /// The bytes of var.parquet, when the dataset has it.
    fn var_parquet<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        if !self.dataset.manifest().has_var_table {
            return Ok(None);
        }
        let dataset = self.dataset.clone();
        let bytes = detached(py, move || {
            let storage = dataset.storage();
            storage.get(format::VAR_TABLE_KEY)?.ok_or_else(|| Failure {
                kind: Kind::Corrupt,
                message: format!("{}: missing (has_var_table is true)", storage.location(format::VAR_TABLE_KEY)),
            })
        })?;
        Ok(Some(PyBytes::new(py, &bytes)))
    }

    /// The listed cells (int64 array), in the order given, as CSR arrays
    /// (indptr int64, indices int32, data int32). Each tile needed is read and
    /// decoded once, on the dataset's threads, without the GIL.
    fn get_batch<'py>(&self, py: Python<'py>, cells: PyReadonlyArray1<'py, i64>) -> PyResult<CsrArrays<'py>> {
        let cells = cell_vec(&cells);
        let m = detached(py, || {
            let cells = self.check_cells(&cells)?;
            self.install(|| {
                if self.caching() {
                    self.cells_via_cache(&cells)
                } else {
                    Ok(self.dataset.read_cell_list(&cells)?)
                }
            })
        })?;
        Ok(csr_arrays(py, m))
    }

    /// Cells `start..end` as CSR arrays (through the tile cache when there is
    /// one, so that consecutive ranges of one tile decode it once).
    fn get_range<'py>(&self, py: Python<'py>, start: u64, end: u64) -> PyResult<CsrArrays<'py>> {
        let m = detached(py, || {
            self.install(|| {
                let n = self.dataset.n_cells();
                if self.caching() && start <= end && end <= n {
                    self.cells_via_cache(&(start..end).collect::<Vec<u64>>())
                } else {
                    Ok(self.dataset.read_cells(start..end)?)
                }
            })
        })?;
        Ok(csr_arrays(py, m))
    }

    /// Tile `tile`, whole, as CSR arrays, decoded into pooled buffers.
    fn read_tile<'py>(&self, py: Python<'py>, tile: usize) -> PyResult<CsrArrays<'py>> {
        let n = self.dataset.n_tiles();
        let m = detached(py, || {
            if tile >= n {
                return Err(Failure {
                    kind: Kind::Index,
                    message: format!("tile {tile} is out of range: the dataset has {n} tiles"),
                });
            }
            let mut out = self.buffers.take_matrix();
            self.install(|| Ok(self.dataset.read_tile_into(tile, &mut out)?))?;
            Ok(out)
        })?;
        let indptr = as_i64(m.indptr).into_pyarray(py);
        Ok((indptr, pooled_array(py, m.indices, &self.buffers)?, pooled_array(py, m.data, &self.buffers)?))
    }

    /// Reads and decodes every tile in order, on this dataset's threads, into
    /// one reused buffer: the Rust ceiling a pass through Python is measured
    /// against (benches/reader.py). Returns (seconds, cells, nonzeros).
    fn decode_all(&self, py: Python<'_>) -> PyResult<(f64, u64, u64)> {
        detached(py, || {
            self.install(|| {
                let started = std::time::Instant::now();
                let mut out = CsrMatrix::default();
                let (mut cells, mut nnz) = (0u64, 0u64);
                for tile in 0..self.dataset.n_tiles() {
                    self.dataset.read_tile_into(tile, &mut out)?;
                    cells += out.n_rows() as u64;
                    nnz += out.nnz() as u64;
                }
                Ok((started.elapsed().as_secs_f64(), cells, nnz))
            })
        })
    }

    /// Plans one epoch's share (see `deltacells::loader::EpochPlan`):
    /// (cells, batches) it yields.
    #[pyo3(signature = (cells, options, weights=None, num_samples=None))]
    fn epoch_size(
        &self,
        py: Python<'_>,
        cells: Option<PyReadonlyArray1<'_, i64>>,
        options: LoaderArgs,
        weights: Option<PyReadonlyArray1<'_, f64>>,
        num_samples: Option<u64>,
    ) -> PyResult<(u64, u64)> {
        let cells = cells.as_ref().map(cell_vec);
        let weights = weights.as_ref().map(weight_vec);
        detached(py, || {
            let plan = self.plan(cells.as_deref(), weights.as_deref(), num_samples, &options)?;
            Ok((plan.n_cells(), plan.n_batches()))
        })
    }

    /// Starts reading one epoch's share in batches, on background threads.
    #[pyo3(signature = (cells, options, weights=None, num_samples=None))]
    fn batches(
        &self,
        py: Python<'_>,
        cells: Option<PyReadonlyArray1<'_, i64>>,
        options: LoaderArgs,
        weights: Option<PyReadonlyArray1<'_, f64>>,
        num_samples: Option<u64>,
    ) -> PyResult<RawBatches> {
        let cells = cells.as_ref().map(cell_vec);
        let weights = weights.as_ref().map(weight_vec);
        detached(py, || {
            let plan = self.plan(cells.as_deref(), weights.as_deref(), num_samples, &options)?;
            let (n_cells, n_batches) = (plan.n_cells(), plan.n_batches());
            let buffers = self.loader_buffers(&options.0);
            let batches = loader::Batches::start(self.dataset.clone(), plan, Some(self.thread_pool()?), &buffers)?;
            Ok(RawBatches { batches: std::sync::Mutex::new(batches), buffers: buffers.batches, n_cells, n_batches })
        })
    }

    /// obs/schema.json's text, when the dataset has obs.
    fn obs_schema_json(&self, py: Python<'_>) -> PyResult<Option<String>> {
        if self.dataset.manifest().obs().is_none() {
            return Ok(None);
        }
        let dataset = self.dataset.clone();
        Ok(Some(detached(py, move || Ok(deltacells::obs::read_schema(dataset.storage().as_ref())?.text))?))
    }

    /// Localizes `columns` into the cache under `cache_root`; the report as
    /// JSON. `threads` is the requests in flight (the dataset's threads when
    /// None).
    #[pyo3(signature = (columns, cache_root, force=false, threads=None))]
    fn localize(
        &self,
        py: Python<'_>,
        columns: Vec<String>,
        cache_root: String,
        force: bool,
        threads: Option<usize>,
    ) -> PyResult<String> {
        detached(py, || {
            let run = || {
                let report = localize::localize(
                    self.dataset.storage().as_ref(),
                    self.dataset.manifest(),
                    &columns,
                    Path::new(&cache_root),
                    force,
                )?;
                Ok(serde_json::to_string(&report).unwrap_or_default())
            };
            match threads {
                None => self.install(run),
                Some(n) => match rayon::ThreadPoolBuilder::new().num_threads(n.max(1)).build() {
                    Ok(pool) => pool.install(run),
                    Err(e) => Err(Failure { kind: Kind::Other, message: format!("cannot start threads: {e}") }),
                },
            }
        })
    }
}

/// The Rust loader's default options, as the dict `RawDataset.batches`
/// takes: the one definition of the defaults, which the Python signatures
/// (`Dataset.batches`, `CellDataset`) take theirs from.
#[pyfunction]
fn loader_defaults(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    // Every field by name: a field added to LoaderOptions fails to compile
    // here until it is exported.
    let LoaderOptions {
        batch_size,
        shuffle,
        seed,
        epoch,
        rank,
        world_size,
        worker,
        num_workers,
        drop_last,
        window_tiles,
        mix_chunks,
        prefetch,
    } = LoaderOptions::default();
    let dict = pyo3::types::PyDict::new(py);
    dict.set_item("batch_size", batch_size)?;
    dict.set_item("shuffle", shuffle)?;
    dict.set_item("seed", seed)?;
    dict.set_item("epoch", epoch)?;
    dict.set_item("rank", rank)?;
    dict.set_item("world_size", world_size)?;
    dict.set_item("worker", worker)?;
    dict.set_item("num_workers", num_workers)?;
    dict.set_item("drop_last", drop_last)?;
    dict.set_item("window_tiles", window_tiles)?;
    dict.set_item("mix_chunks", mix_chunks)?;
    dict.set_item("prefetch", prefetch)?;
    Ok(dict)
}

/// The loader's options, from a dict with every field of `LoaderOptions`
/// (the keys of `loader_defaults`).
struct LoaderArgs(LoaderOptions);

impl<'a, 'py> FromPyObject<'a, 'py> for LoaderArgs {
    type Error = PyErr;

    fn extract(ob: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let get = |name: &str| ob.get_item(name);
        Ok(LoaderArgs(LoaderOptions {
            batch_size: get("batch_size")?.extract()?,
            shuffle: get("shuffle")?.extract()?,
            seed: get("seed")?.extract()?,
            epoch: get("epoch")?.extract()?,
            rank: get("rank")?.extract()?,
            world_size: get("world_size")?.extract()?,
            worker: get("worker")?.extract()?,
            num_workers: get("num_workers")?.extract()?,
            drop_last: get("drop_last")?.extract()?,
            window_tiles: get("window_tiles")?.extract()?,
            mix_chunks: get("mix_chunks")?.extract()?,
            prefetch: get("prefetch")?.extract()?,
        }))
    }
}

/// One epoch's share of batches being read on background threads
/// (`RawDataset.batches`). Dropping it stops them.
#[pyclass(module = "deltacells._deltacells")]
struct RawBatches {
    batches: std::sync::Mutex<loader::Batches>,
    /// Where each batch's indices and data go back when NumPy frees them.
    buffers: Arc<BufferPool>,
    n_cells: u64,
    n_batches: u64,
}

type BatchArrays<'py> =
    (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i32>>, Bound<'py, PyArray1<i32>>);

#[pymethods]
impl RawBatches {
    #[getter]
    fn n_cells(&self) -> u64 {
        self.n_cells
    }

    #[getter]
    fn n_batches(&self) -> u64 {
        self.n_batches
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch: (cells int64, indptr int64, indices int32, data int32),
    /// waiting without the GIL until it is ready.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<BatchArrays<'py>>> {
        let next = detached(py, || {
            let mut batches = self.batches.lock().unwrap_or_else(|p| p.into_inner());
            batches.next().transpose().map_err(Failure::from)
        })?;
        let Some(batch) = next else { return Ok(None) };
        let x = batch.x;
        Ok(Some((
            as_i64(batch.cells).into_pyarray(py),
            as_i64(x.indptr).into_pyarray(py),
            pooled_array(py, x.indices, &self.buffers)?,
            pooled_array(py, x.data, &self.buffers)?,
        )))
    }
}

/// The cache root: `explicit`, else $DELTACELLS_CACHE, $XDG_CACHE_HOME/deltacells,
/// ~/.cache/deltacells.
#[pyfunction]
#[pyo3(signature = (explicit=None))]
fn cache_root(explicit: Option<String>) -> String {
    localize::cache_root(explicit.as_deref().map(Path::new)).display().to_string()
}

/// The cache file of `column` for the obs of fingerprint `fingerprint`.
#[pyfunction]
fn column_path(root: String, fingerprint: String, column: String) -> String {
    localize::column_path(Path::new(&root), &fingerprint, &column).display().to_string()
}

#[pymodule]
fn _deltacells(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RawDataset>()?;
    m.add_class::<RawBatches>()?;
    m.add_function(wrap_pyfunction!(cache_root, m)?)?;
    m.add_function(wrap_pyfunction!(column_path, m)?)?;
    m.add_function(wrap_pyfunction!(loader_defaults, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
