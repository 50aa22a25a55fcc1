//! The loader's options as the binding takes them, and `RawBatches`: batches
//! read on background threads (one epoch's share of the loader, or a plan of
//! gathers).

use std::sync::Arc;

use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;

use deltacells::batch::{BatchOutput, FormedBatch};
use deltacells::loader::{self, BufferPool, FloatPool, LoaderBatch, LoaderOptions};
use deltacells::planned::PlannedGathers;

use crate::arrays::{as_i64, formed_arrays};
use crate::errors::{detached, Failure, Kind};

/// The Rust loader's default options, as the dict `RawDataset.batches`
/// takes: the one definition of the defaults, which the Python signatures
/// (`Dataset.batches`, `CellDataset`) take theirs from.
#[pyfunction]
pub(crate) fn loader_defaults(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
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
pub(crate) struct LoaderArgs(pub(crate) LoaderOptions);

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

/// Batches being read on background threads (`RawDataset.batches`,
/// `RawDataset.gathers`). Dropping it stops them.
/// One epoch's share, planned (`deltacells::loader::EpochPlan`): made once
/// by `RawDataset.plan` or `RawCollection.plan`, for the loader's size and
/// for each reading of it by their `batches`.
#[pyclass(module = "deltacells._deltacells", frozen)]
pub(crate) struct RawPlan {
    pub(crate) plan: Arc<loader::EpochPlan>,
    /// The address of the dataset or collection it was made over: another
    /// refuses it.
    pub(crate) owner: usize,
}

impl RawPlan {
    /// The plan, when it was made over `owner`.
    pub(crate) fn of(&self, owner: usize) -> Result<Arc<loader::EpochPlan>, Failure> {
        if self.owner != owner {
            return Err(Failure { kind: Kind::Value, message: "plan: made over another dataset".into() });
        }
        Ok(self.plan.clone())
    }
}

#[pymethods]
impl RawPlan {
    /// Cells the share yields (before `drop_last` drops a partial batch).
    fn n_cells(&self) -> u64 {
        self.plan.n_cells()
    }

    /// Batches the share yields.
    fn n_batches(&self) -> u64 {
        self.plan.n_batches()
    }
}

#[pyclass(module = "deltacells._deltacells")]
pub(crate) struct RawBatches {
    batches: std::sync::Mutex<BatchSource>,
    /// The form the batches are in.
    output: BatchOutput,
    /// Where each batch's indices and data go back when NumPy frees them.
    buffers: Arc<BufferPool>,
    /// Where each batch's scaled values go back.
    floats: Arc<FloatPool>,
    n_cells: u64,
    n_batches: u64,
}

/// Where batches come from: the loader's pipeline or a plan of gathers.
pub(crate) type BatchSource = Box<dyn Iterator<Item = Result<LoaderBatch, Failure>> + Send>;

pub(crate) type BatchArrays<'py> = (
    Bound<'py, PyArray1<i64>>,
    Option<Bound<'py, PyArray1<i64>>>,
    Option<Bound<'py, PyArray1<i32>>>,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
);

impl RawBatches {
    /// Batches being read, whose buffers go back to `buffers`.
    pub(crate) fn new(
        batches: BatchSource,
        (buffers, floats): (Arc<BufferPool>, Arc<FloatPool>),
        n_cells: u64,
        n_batches: u64,
        output: BatchOutput,
    ) -> Self {
        RawBatches { batches: std::sync::Mutex::new(batches), output, buffers, floats, n_cells, n_batches }
    }
}

impl RawBatches {
    /// Gathers planned ahead: `lists` read in order by `read`, on a thread
    /// of their own, up to `ahead` before the consumer, in `output`'s form.
    pub(crate) fn planned(
        lists: Vec<Vec<u64>>,
        ahead: usize,
        output: BatchOutput,
        mut read: impl FnMut(&[u64], &BufferPool) -> Result<FormedBatch, Failure> + Send + 'static,
    ) -> Result<RawBatches, Failure> {
        let (n_cells, n_batches) = (lists.iter().map(|l| l.len() as u64).sum(), lists.len() as u64);
        // Buffers for the lists read ahead, the one the consumer holds and
        // the one being read (two each), given back when NumPy frees them
        // and read into again by `read`.
        let keep = ahead.clamp(1, 16) + 2;
        let pools = (Arc::new(BufferPool::new(2 * keep)), Arc::new(FloatPool::new(keep)));
        let buffers = pools.0.clone();
        let planned = PlannedGathers::start(lists, ahead, move |cells| read(cells, &buffers))
            .map_err(|e| Failure { kind: Kind::Other, message: format!("cannot start a thread: {e}") })?;
        Ok(RawBatches::new(Box::new(planned), pools, n_cells, n_batches, output))
    }
}

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

    /// The next batch: (cells int64, indptr, indices, data, top_k,
    /// top_k_values) as `arrays::FormedArrays` describes them, waiting
    /// without the GIL until it is ready.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<BatchArrays<'py>>> {
        let next = detached(py, || {
            let mut batches = self.batches.lock().unwrap_or_else(|p| p.into_inner());
            batches.next().transpose()
        })?;
        let Some(batch) = next else { return Ok(None) };
        let rows = batch.cells.len();
        let cells = as_i64(batch.cells).into_pyarray(py);
        let formed = FormedBatch {
            rows,
            n_cols: batch.x.n_cols,
            x: batch.x,
            values: batch.values,
            dense_counts: batch.dense_counts,
            top_k: batch.top_k,
            top_k_values: batch.top_k_values,
        };
        let (indptr, indices, data, top_k, top_k_values) =
            formed_arrays(py, formed, &self.output, Some((&self.buffers, &self.floats)))?;
        Ok(Some((cells, indptr, indices, data, top_k, top_k_values)))
    }
}
