//! `RawCollection`: several datasets read as one (`deltacells::collection`),
//! with its thread pool and loader buffers; `collection_file` reads a
//! collection file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use deltacells::collection::{Collection, CollectionError, CollectionFile, CollectionState, GeneChoice};
use deltacells::loader::{self, BufferPool, EpochPlan, FloatPool, TileSource};
use deltacells::storage::StoreOptions;

use crate::arrays::{cell_vec, formed_arrays, weight_vec, FormedArrays, POOLED_BUFFERS};
use crate::batches::{LoaderArgs, RawBatches, RawPlan};
use crate::dataset::RawDataset;
use crate::errors::{detached, Failure, Kind};
use crate::threads::{KeptBuffers, Threads};
use crate::vocabulary::FormArgs;

impl From<CollectionError> for Failure {
    fn from(e: CollectionError) -> Failure {
        match e {
            CollectionError::Member { ref source, .. } => {
                let kind = Failure::from_dataset_kind(source);
                Failure::new(kind, &e)
            }
            CollectionError::Argument(_) | CollectionError::Genes(_) => Failure::new(Kind::Value, &e),
            CollectionError::CellOutOfRange { .. } => Failure::new(Kind::Index, &e),
            CollectionError::Changed { .. } => Failure::new(Kind::Changed, &e),
            CollectionError::File { .. } | CollectionError::Read { .. } => Failure::new(Kind::Value, &e),
        }
    }
}

/// `genes=` as the binding takes it: "union", "intersection" or a list.
pub(crate) struct GenesArg(GeneChoice);

impl<'a, 'py> FromPyObject<'a, 'py> for GenesArg {
    type Error = PyErr;

    fn extract(ob: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(text) = ob.extract::<String>() {
            return match text.as_str() {
                "union" => Ok(GenesArg(GeneChoice::Union)),
                "intersection" => Ok(GenesArg(GeneChoice::Intersection)),
                _ => Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "genes must be 'union', 'intersection' or a list of gene names, not {text:?}"
                ))),
            };
        }
        Ok(GenesArg(GeneChoice::List(ob.extract()?)))
    }
}

/// Several datasets as one (`deltacells.open_collection` wraps it).
#[pyclass(frozen, module = "deltacells._deltacells")]
pub(crate) struct RawCollection {
    collection: Arc<Collection>,
    /// The gene choice it was opened with (for its collection file).
    genes: GeneChoice,
    threads: Threads,
    loader_buffers: KeptBuffers,
    /// Buffers of gathers, taken back when NumPy frees the arrays made
    /// over them (as `RawDataset`'s).
    buffers: Arc<BufferPool>,
    floats: Arc<FloatPool>,
}

impl RawCollection {
    fn wrap(collection: Collection, genes: GeneChoice, threads: Option<usize>) -> RawCollection {
        RawCollection {
            collection: Arc::new(collection),
            genes,
            threads: Threads::new(threads),
            loader_buffers: KeptBuffers::default(),
            buffers: Arc::new(BufferPool::new(POOLED_BUFFERS)),
            floats: Arc::new(FloatPool::new(POOLED_BUFFERS / 2)),
        }
    }

    /// Cells of the collection from signed indices, each checked.
    fn checked(&self, cells: &[i64]) -> Result<Vec<u64>, Failure> {
        let n = self.collection.n_cells();
        cells
            .iter()
            .map(|&c| {
                u64::try_from(c).ok().filter(|&c| c < n).ok_or_else(|| Failure {
                    kind: Kind::Index,
                    message: format!("cell {c} is out of range: the collection has {n} cells"),
                })
            })
            .collect()
    }

    /// What a plan made over this collection records of it.
    fn owner(&self) -> usize {
        Arc::as_ptr(&self.collection) as *const () as usize
    }

    /// One epoch's share: over `cells` (or all), drawn by cell `weights` or
    /// by `dataset_weights` when given.
    fn plan(
        &self,
        cells: Option<&[i64]>,
        (weights, dataset_weights): (Option<&[f64]>, Option<&[f64]>),
        num_samples: Option<u64>,
        options: &LoaderArgs,
    ) -> Result<EpochPlan, Failure> {
        let c = self.collection.as_ref();
        let cells = cells.map(|cells| self.checked(cells)).transpose()?;
        let n = c.n_cells();
        let draws = || num_samples.unwrap_or_else(|| cells.as_ref().map_or(n, |c| c.len() as u64));
        let drawn = match (weights, dataset_weights) {
            (Some(w), _) => Some(loader::draw_by_weight(n, cells.as_deref(), w, draws(), &options.0)?),
            (None, Some(d)) => Some(c.draw_by_dataset(cells.as_deref(), d, draws(), &options.0)?),
            (None, None) => None,
        };
        let listed = drawn.as_deref().or(cells.as_deref());
        Ok(EpochPlan::over(c, listed, &options.0)?)
    }
}

#[pymethods]
impl RawCollection {
    /// Opens the datasets `roots` (named `names`) as one collection, in the
    /// gene vocabulary `genes`; with `digests`, refuses a dataset whose
    /// manifest is not the one recorded.
    #[new]
    #[pyo3(signature = (names, roots, genes, gene_column=None, threads=None, anonymous=false, endpoint=None, digests=None, cache_bytes=deltacells::dataset::DEFAULT_CACHE_BYTES, cache_dir=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        names: Vec<String>,
        roots: Vec<String>,
        genes: GenesArg,
        gene_column: Option<String>,
        threads: Option<usize>,
        anonymous: bool,
        endpoint: Option<String>,
        digests: Option<Vec<Option<String>>>,
        cache_bytes: u64,
        cache_dir: Option<String>,
    ) -> PyResult<Self> {
        if names.len() != roots.len() {
            return Err(pyo3::exceptions::PyValueError::new_err("names and roots differ in length"));
        }
        let store = StoreOptions { anonymous, endpoint };
        let pool = Threads::new(threads);
        let choice = genes.0;
        let collection = detached(py, || {
            let file = CollectionFile {
                datasets: names
                    .into_iter()
                    .zip(roots)
                    .zip(digests.into_iter().flatten().chain(std::iter::repeat(None)))
                    .map(|((n, r), d)| (n, r, d))
                    .collect(),
                genes: choice.clone(),
                gene_column,
                weights: None,
            };
            let collection = pool.install(|| Ok::<_, Failure>(file.open_in(&store, cache_dir.map(PathBuf::from))?))?;
            collection.set_cache_bytes(cache_bytes);
            Ok(collection)
        })?;
        Ok(RawCollection { threads: pool, ..RawCollection::wrap(collection, choice, None) })
    }

    /// The collection `state_json` (from `state_json()`) describes, in this
    /// process: nothing is opened until it is read.
    #[staticmethod]
    #[pyo3(signature = (state_json, genes, threads=None, cache_bytes=deltacells::dataset::DEFAULT_CACHE_BYTES, cache_dir=None))]
    fn from_state(
        py: Python<'_>,
        state_json: &str,
        genes: GenesArg,
        threads: Option<usize>,
        cache_bytes: u64,
        cache_dir: Option<String>,
    ) -> PyResult<Self> {
        let collection = detached(py, || {
            let state: CollectionState = serde_json::from_str(state_json)
                .map_err(|e| Failure { kind: Kind::Value, message: format!("not a collection's state: {e}") })?;
            let collection = Collection::from_state_in(state, cache_dir.map(PathBuf::from))?;
            collection.set_cache_bytes(cache_bytes);
            Ok(collection)
        })?;
        Ok(RawCollection::wrap(collection, genes.0, threads))
    }

    /// What another process needs to read this collection as this one
    /// does, as JSON.
    fn state_json(&self) -> String {
        serde_json::to_string(&self.collection.state()).unwrap_or_default()
    }

    /// The collection file's text, with `weights` (by dataset name) when given.
    #[pyo3(signature = (weights=None))]
    fn file_json(&self, weights: Option<Vec<(String, f64)>>) -> String {
        let c = &self.collection;
        CollectionFile {
            datasets: c.members().map(|m| (m.name.clone(), m.root.clone(), Some(m.manifest_sha256.clone()))).collect(),
            genes: self.genes.clone(),
            gene_column: c.gene_column().map(str::to_string),
            weights,
        }
        .to_json()
    }

    /// Whether dataset `member` is open in this process.
    fn is_open(&self, member: usize) -> bool {
        self.collection.is_open(member)
    }

    /// Dataset `member` (opened now if need be) as a `RawDataset` sharing
    /// this collection's open copy and its threads.
    fn member(&self, py: Python<'_>, member: usize) -> PyResult<RawDataset> {
        let c = self.collection.clone();
        let open = detached(py, move || Ok(c.open_member(member)?))?;
        Ok(RawDataset::on_threads(open.dataset, self.threads.clone()))
    }

    /// Per dataset, whether it holds each gene of the vocabulary: a flat
    /// bool array, datasets x genes, row-major. Opens every dataset.
    fn holders<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<bool>>> {
        let flags = detached(py, || self.threads.install(|| Ok(self.collection.holders()?)))?;
        Ok(flags.into_iter().flatten().collect::<Vec<bool>>().into_pyarray(py))
    }

    /// The listed cells in a batch's form, in the collection's vocabulary
    /// (`FormedArrays`, as `RawDataset.get_formed`).
    fn get_formed<'py>(
        &self,
        py: Python<'py>,
        cells: PyReadonlyArray1<'py, i64>,
        form: FormArgs,
    ) -> PyResult<FormedArrays<'py>> {
        let cells = cell_vec(&cells);
        let output = form.output(None).map_err(|f| f.into_pyerr(py))?;
        let formed = detached(py, || {
            let cells = self.checked(&cells)?;
            self.threads.install(|| Ok(self.collection.read_cells_formed_in(&cells, &output, &self.buffers)?))
        })?;
        formed_arrays(py, formed, &output, Some((&self.buffers, &self.floats)))
    }

    /// Gathers planned ahead, in the collection's vocabulary (as
    /// `RawDataset.gathers`).
    #[pyo3(signature = (lists, form, ahead=4))]
    fn gathers(
        &self,
        py: Python<'_>,
        lists: Vec<PyReadonlyArray1<'_, i64>>,
        form: FormArgs,
        ahead: usize,
    ) -> PyResult<RawBatches> {
        let lists: Vec<Vec<i64>> = lists.iter().map(cell_vec).collect();
        let output = form.output(None).map_err(|f| f.into_pyerr(py))?;
        detached(py, || {
            let lists = lists.iter().map(|l| self.checked(l)).collect::<Result<Vec<_>, _>>()?;
            let (collection, pool, form) = (self.collection.clone(), self.threads.pool()?, output.clone());
            RawBatches::planned(lists, ahead, output, move |cells, buffers| {
                pool.install(|| collection.read_cells_formed_in(cells, &form, buffers)).map_err(Failure::from)
            })
        })
    }

    /// Plans one epoch's share, once, for its size and for each reading of it.
    #[pyo3(signature = (cells, options, weights=None, num_samples=None, dataset_weights=None))]
    fn plan_epoch(
        &self,
        py: Python<'_>,
        cells: Option<PyReadonlyArray1<'_, i64>>,
        options: LoaderArgs,
        weights: Option<PyReadonlyArray1<'_, f64>>,
        num_samples: Option<u64>,
        dataset_weights: Option<Vec<f64>>,
    ) -> PyResult<RawPlan> {
        let cells = cells.as_ref().map(cell_vec);
        let weights = weights.as_ref().map(weight_vec);
        let plan = detached(py, || {
            self.plan(cells.as_deref(), (weights.as_deref(), dataset_weights.as_deref()), num_samples, &options)
        })?;
        Ok(RawPlan { plan: Arc::new(plan), owner: self.owner() })
    }

    /// Starts reading a share planned by `plan_epoch`, in batches, on
    /// background threads.
    #[pyo3(signature = (plan, form=None))]
    fn batches(&self, py: Python<'_>, plan: PyRef<'_, RawPlan>, form: Option<FormArgs>) -> PyResult<RawBatches> {
        let plan = plan.of(self.owner()).map_err(|f| f.into_pyerr(py))?;
        let output = match form {
            Some(form) => form.output(None).map_err(|f| f.into_pyerr(py))?,
            None => loader::BatchOutput::default(),
        };
        let kept = output.clone();
        detached(py, || {
            let (n_cells, n_batches) = (plan.n_cells(), plan.n_batches());
            let buffers = self.loader_buffers.for_options(plan.options());
            let pool = Some(self.threads.pool()?);
            let source: Arc<dyn TileSource> = self.collection.clone();
            let batches = loader::Batches::start_over(source, plan, pool, &buffers, output)?;
            let batches = Box::new(batches.map(|b| b.map_err(Failure::from)));
            Ok(RawBatches::new(batches, (buffers.batches, buffers.values), n_cells, n_batches, kept))
        })
    }
}

/// The collection file at `path`, as JSON: its datasets (name, root resolved
/// against the file's folder, manifest_sha256), genes, gene_column and
/// weights.
#[pyfunction]
pub(crate) fn collection_file(py: Python<'_>, path: String) -> PyResult<String> {
    detached(py, move || {
        let file = CollectionFile::read(Path::new(&path))?;
        let weights =
            file.weights_in_order().map_err(|m| Failure { kind: Kind::Value, message: format!("{path}: {m}") })?;
        let datasets: Vec<serde_json::Value> = file
            .datasets
            .iter()
            .map(|(n, r, d)| serde_json::json!({"name": n, "root": r, "manifest_sha256": d}))
            .collect();
        let genes = file.genes.to_json();
        Ok(serde_json::json!({
            "datasets": datasets,
            "genes": genes,
            "gene_column": file.gene_column,
            "weights": weights,
        })
        .to_string())
    })
}
