//! `RawDataset`: an open dataset, its thread pool, its cache of decoded
//! tiles and its buffers; reading cells, tiles and obs columns.

use std::path::Path;
use std::sync::Arc;

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use deltacells::batch::BatchOutput;
use deltacells::batch::CellWriter;
use deltacells::format::{self, CsrMatrix};
use deltacells::loader::{self, BufferPool, EpochPlan, FloatPool};
use deltacells::storage::{self, StoreOptions};
use deltacells::{Dataset, ReadOptions};

use crate::arrays::{as_i64, cell_vec, formed_arrays, pooled_csr, weight_vec, CsrArrays, FormedArrays, POOLED_BUFFERS};
use crate::batches::{LoaderArgs, RawBatches, RawPlan};
use crate::errors::{detached, Failure, Kind};
use crate::threads::{KeptBuffers, Threads};
use crate::vocabulary::{FormArgs, RawGeneMap};
use deltacells::Selection;

/// An open dataset (`deltacells.open_dataset` wraps it).
#[pyclass(frozen, module = "deltacells._deltacells")]
pub(crate) struct RawDataset {
    dataset: Arc<Dataset>,
    threads: Threads,
    /// Output buffers for whole tiles and gathers: taken back when NumPy
    /// frees the arrays made over them, so that a loop over tiles or
    /// batches decodes into memory that is already mapped instead of
    /// faulting in fresh pages each time.
    buffers: Arc<BufferPool>,
    /// Scaled values of gathers in a batch's form, likewise.
    floats: Arc<FloatPool>,
    /// The loader's buffers, kept from one epoch to the next.
    loader_buffers: KeptBuffers,
}

impl RawDataset {
    /// An open dataset, its thread pool of `threads` made on first use.
    pub(crate) fn wrap(dataset: Arc<Dataset>, threads: Option<usize>) -> RawDataset {
        RawDataset::on_threads(dataset, Threads::new(threads))
    }

    /// An open dataset running on `threads` (a pool shared with others).
    pub(crate) fn on_threads(dataset: Arc<Dataset>, threads: Threads) -> RawDataset {
        RawDataset {
            dataset,
            threads,
            buffers: Arc::new(BufferPool::new(POOLED_BUFFERS)),
            floats: Arc::new(FloatPool::new(POOLED_BUFFERS / 2)),
            loader_buffers: KeptBuffers::default(),
        }
    }

    /// What a plan made over this dataset records of it.
    fn owner(&self) -> usize {
        Arc::as_ptr(&self.dataset) as *const () as usize
    }

    /// Runs `f` on this dataset's thread pool (made on first use).
    fn install<T: Send>(&self, f: impl FnOnce() -> Result<T, Failure> + Send) -> Result<T, Failure> {
        self.threads.install(f)
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

    /// A batch's form with `genes` (and nothing else), checked against this
    /// dataset, or None without a vocabulary.
    fn genes_only(&self, genes: Option<&RawGeneMap>) -> Result<Option<BatchOutput>, Failure> {
        let Some(g) = genes else { return Ok(None) };
        let output = BatchOutput { genes: Some(g.map.clone()), ..BatchOutput::default() };
        output.check(self.dataset.n_genes())?;
        Ok(Some(output))
    }

    /// `m` (stored columns) in `output`'s columns, as CSR counts.
    fn in_genes(&self, m: CsrMatrix, output: Option<&BatchOutput>) -> CsrMatrix {
        match output {
            Some(o) => CellWriter::new(o, self.dataset.n_genes()).form(m).x,
            None => m,
        }
    }

    /// The listed cells (checked).
    /// The listed cells, decoded into pooled buffers (see `buffers`): a
    /// loop of gathers whose results NumPy frees writes into memory already
    /// mapped.
    fn listed_cells(&self, cells: &[i64]) -> Result<CsrMatrix, Failure> {
        let cells = self.check_cells(cells)?;
        self.install(|| {
            let mut out = self.buffers.take_matrix();
            self.dataset.read_into(Selection::List(&cells), &mut out)?;
            Ok(out)
        })
    }

    fn check_cells(&self, cells: &[i64]) -> Result<Vec<u64>, Failure> {
        Ok(self.dataset.checked_cells(cells)?)
    }
}

#[pymethods]
impl RawDataset {
    #[new]
    #[pyo3(signature = (root, threads=None, anonymous=false, endpoint=None, cache_bytes=deltacells::dataset::DEFAULT_CACHE_BYTES, version=None, cache_dir=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        root: String,
        threads: Option<usize>,
        anonymous: bool,
        endpoint: Option<String>,
        cache_bytes: u64,
        version: Option<Vec<u8>>,
        cache_dir: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let dataset = detached(py, move || {
            let options = StoreOptions { anonymous, endpoint };
            let store = storage::open_with(&root, &options)?;
            let read = ReadOptions { cache_bytes, cache_dir, ..ReadOptions::default() };
            Ok(match version {
                Some(version) => Dataset::from_storage_as(store, &read, &version)?,
                None => Dataset::from_storage_with(store, &read)?,
            })
        })?;
        Ok(RawDataset::wrap(Arc::new(dataset), threads))
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

    /// How many later versions (appends, finalizes, compactions) reads
    /// have moved to since the dataset was opened.
    #[getter]
    fn versions_followed(&self) -> u64 {
        self.dataset.versions_followed()
    }

    /// Cells per tile, as an int64 array.
    fn tile_cells<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        as_i64(self.dataset.manifest().tile_cells.clone()).into_pyarray(py)
    }

    /// The storage's requests, bytes fetched and retried attempts so far.
    fn io_stats(&self) -> (u64, u64, u64) {
        let stats = self.dataset.storage().stats();
        let (requests, bytes) = stats.snapshot();
        (requests, bytes, stats.retries())
    }

    /// manifest.json as the dataset holds it, checked.
    fn manifest_json(&self) -> String {
        self.dataset.manifest().to_json()
    }

    /// manifest.json's bytes as read at open: the version this dataset
    /// shows, for opening it as that version in another process.
    fn version<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.dataset.manifest_bytes())
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
    ///
    /// With `genes`, every cell is written in that vocabulary's columns.
    #[pyo3(signature = (cells, genes=None))]
    fn get_batch<'py>(
        &self,
        py: Python<'py>,
        cells: PyReadonlyArray1<'py, i64>,
        genes: Option<PyRef<'py, RawGeneMap>>,
    ) -> PyResult<CsrArrays<'py>> {
        let cells = cell_vec(&cells);
        let output = self.genes_only(genes.as_deref()).map_err(|f| f.into_pyerr(py))?;
        let m = detached(py, || Ok(self.in_genes(self.listed_cells(&cells)?, output.as_ref())))?;
        pooled_csr(py, m, &self.buffers)
    }

    /// Cells `start..end` as CSR arrays (consecutive ranges of one tile
    /// decode it once: see `Dataset::read_into` of a `Selection::Range`).
    #[pyo3(signature = (start, end, genes=None))]
    fn get_range<'py>(
        &self,
        py: Python<'py>,
        start: u64,
        end: u64,
        genes: Option<PyRef<'py, RawGeneMap>>,
    ) -> PyResult<CsrArrays<'py>> {
        let output = self.genes_only(genes.as_deref()).map_err(|f| f.into_pyerr(py))?;
        let m = detached(py, || {
            let m = self.install(|| {
                // Into pooled buffers, which come back when NumPy frees the
                // arrays: a pass in consecutive ranges writes into memory
                // already mapped.
                let mut out = self.buffers.take_matrix();
                self.dataset.read_into(Selection::Range(start..end), &mut out)?;
                Ok(out)
            })?;
            Ok(self.in_genes(m, output.as_ref()))
        })?;
        pooled_csr(py, m, &self.buffers)
    }

    /// The listed cells in a batch's form (see `deltacells::batch`): its gene
    /// vocabulary, scaling, dense or CSR, top-k tokens. Returns
    /// `FormedArrays` (indptr, indices, data, top_k, top_k_values).
    #[pyo3(signature = (cells, form, genes=None))]
    fn get_formed<'py>(
        &self,
        py: Python<'py>,
        cells: PyReadonlyArray1<'py, i64>,
        form: FormArgs,
        genes: Option<PyRef<'py, RawGeneMap>>,
    ) -> PyResult<FormedArrays<'py>> {
        let cells = cell_vec(&cells);
        let output = form
            .output(genes.as_deref())
            .and_then(|o| o.check(self.dataset.n_genes()).map(|()| o).map_err(Failure::from))
            .and_then(|o| {
                let n_cols = o.n_cols(self.dataset.n_genes());
                o.check_rows(cells.len() as u64, n_cols).map(|()| o).map_err(Failure::from)
            })
            .map_err(|f| f.into_pyerr(py))?;
        let formed = detached(py, || {
            let m = self.listed_cells(&cells)?;
            Ok(CellWriter::new(&output, self.dataset.n_genes()).form(m))
        })?;
        formed_arrays(py, formed, &output, Some((&self.buffers, &self.floats)))
    }

    /// Gathers planned ahead: `lists` of cells read in order, each in the
    /// batch's form, on a thread of their own up to `ahead` lists before
    /// the consumer (as `RawBatches`).
    #[pyo3(signature = (lists, form, genes=None, ahead=4))]
    fn gathers(
        &self,
        py: Python<'_>,
        lists: Vec<PyReadonlyArray1<'_, i64>>,
        form: FormArgs,
        genes: Option<PyRef<'_, RawGeneMap>>,
        ahead: usize,
    ) -> PyResult<RawBatches> {
        let lists: Vec<Vec<i64>> = lists.iter().map(cell_vec).collect();
        let output = form
            .output(genes.as_deref())
            .and_then(|o| o.check(self.dataset.n_genes()).map(|()| o).map_err(Failure::from))
            .map_err(|f| f.into_pyerr(py))?;
        detached(py, || {
            let n_cols = output.n_cols(self.dataset.n_genes());
            let lists = lists.iter().map(|l| self.check_cells(l)).collect::<Result<Vec<_>, _>>()?;
            for l in &lists {
                output.check_rows(l.len() as u64, n_cols)?;
            }
            let (dataset, pool, form) = (self.dataset.clone(), self.threads.pool()?, output.clone());
            RawBatches::planned(lists, ahead, output, move |cells, buffers| {
                // (into buffers NumPy gives back, as get_batch)
                let read = || -> Result<_, deltacells::DatasetError> {
                    let mut m = buffers.take_matrix();
                    dataset.read_into(Selection::List(cells), &mut m)?;
                    Ok(CellWriter::new(&form, dataset.n_genes()).form(m))
                };
                pool.install(read).map_err(Failure::from)
            })
        })
    }

    /// The nonzeros of each stored column (uint64), from a pass over every tile.
    fn column_nonzeros<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let counts = detached(py, || self.install(|| Ok(self.dataset.column_nonzeros()?)))?;
        Ok(counts.into_pyarray(py))
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
            self.install(|| Ok(self.dataset.read_into(Selection::Tile(tile), &mut out)?))?;
            Ok(out)
        })?;
        pooled_csr(py, m, &self.buffers)
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
                    self.dataset.read_into(Selection::Tile(tile), &mut out)?;
                    cells += out.n_rows() as u64;
                    nnz += out.nnz() as u64;
                }
                Ok((started.elapsed().as_secs_f64(), cells, nnz))
            })
        })
    }

    /// Plans one epoch's share (see `deltacells::loader::EpochPlan`), once,
    /// for its size and for each reading of it.
    #[pyo3(signature = (cells, options, weights=None, num_samples=None))]
    fn plan_epoch(
        &self,
        py: Python<'_>,
        cells: Option<PyReadonlyArray1<'_, i64>>,
        options: LoaderArgs,
        weights: Option<PyReadonlyArray1<'_, f64>>,
        num_samples: Option<u64>,
    ) -> PyResult<RawPlan> {
        let cells = cells.as_ref().map(cell_vec);
        let weights = weights.as_ref().map(weight_vec);
        let plan = detached(py, || self.plan(cells.as_deref(), weights.as_deref(), num_samples, &options))?;
        Ok(RawPlan { plan: Arc::new(plan), owner: self.owner() })
    }

    /// Starts reading a share planned by `plan_epoch`, in batches, on
    /// background threads.
    #[pyo3(signature = (plan, genes=None, form=None))]
    fn batches(
        &self,
        py: Python<'_>,
        plan: PyRef<'_, RawPlan>,
        genes: Option<PyRef<'_, RawGeneMap>>,
        form: Option<FormArgs>,
    ) -> PyResult<RawBatches> {
        let plan = plan.of(self.owner()).map_err(|f| f.into_pyerr(py))?;
        // (Checked against the dataset when the batches start.)
        let output = match form {
            Some(form) => form.output(genes.as_deref()).map_err(|f| f.into_pyerr(py))?,
            None => loader::BatchOutput { genes: genes.as_deref().map(|g| g.map.clone()), ..Default::default() },
        };
        let kept = output.clone();
        detached(py, || {
            let (n_cells, n_batches) = (plan.n_cells(), plan.n_batches());
            let buffers = self.loader_buffers.for_options(plan.options());
            let pool = Some(self.threads.pool()?);
            let batches = loader::Batches::start_with(self.dataset.clone(), plan, pool, &buffers, output)?;
            let batches = Box::new(batches.map(|b| b.map_err(Failure::from)));
            Ok(RawBatches::new(batches, (buffers.batches, buffers.values), n_cells, n_batches, kept))
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
                let report = self.dataset.localize_obs(&columns, Path::new(&cache_root), force)?;
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
