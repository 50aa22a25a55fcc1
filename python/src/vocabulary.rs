//! `RawGeneMap`: a gene vocabulary's map from a dataset's stored columns,
//! built once and passed to every read that should give batches in it.

use std::sync::Arc;

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;

use deltacells::batch::{BatchOutput, Normalize, OutputError, SumOver};
use deltacells::vocabulary::{GeneMap, VocabularyError};

use crate::errors::{detached, Failure, Kind};

impl From<VocabularyError> for Failure {
    fn from(e: VocabularyError) -> Self {
        Failure::new(Kind::Value, &e)
    }
}

impl From<OutputError> for Failure {
    fn from(e: OutputError) -> Self {
        Failure::new(Kind::Value, &e)
    }
}

/// A batch's form, from the dict the Python layer passes (its `Form`:
/// normalize, normalize_over, log1p, dense, top_k, float32,
/// sorted_columns); with the gene
/// map, a `BatchOutput` (checked by the caller against the dataset).
pub(crate) struct FormArgs {
    normalize: Option<f64>,
    normalize_over: String,
    log1p: bool,
    dense: bool,
    top_k: Option<usize>,
    float32: bool,
    unsorted: bool,
}

impl<'a, 'py> FromPyObject<'a, 'py> for FormArgs {
    type Error = PyErr;

    fn extract(ob: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let get = |name: &str| ob.get_item(name);
        Ok(FormArgs {
            normalize: get("normalize")?.extract()?,
            normalize_over: get("normalize_over")?.extract()?,
            log1p: get("log1p")?.extract()?,
            dense: get("dense")?.extract()?,
            top_k: get("top_k")?.extract()?,
            float32: get("float32")?.extract()?,
            unsorted: !get("sorted_columns")?.extract::<bool>()?,
        })
    }
}

impl FormArgs {
    pub(crate) fn output(&self, genes: Option<&RawGeneMap>) -> Result<BatchOutput, Failure> {
        let over = match self.normalize_over.as_str() {
            "stored" => SumOver::Stored,
            "output" => SumOver::Output,
            other => {
                return Err(Failure {
                    kind: Kind::Value,
                    message: format!(
                        "normalize_over: {other:?} is not 'stored' (every gene the dataset stores for the cell) or \
                         'output' (the genes of the batch)"
                    ),
                })
            }
        };
        Ok(BatchOutput {
            genes: genes.map(|g| g.map.clone()),
            normalize: self.normalize.map(|target_sum| Normalize { target_sum, over }),
            log1p: self.log1p,
            dense: self.dense,
            top_k: self.top_k,
            float32: self.float32,
            unsorted: self.unsorted,
        })
    }
}

/// Where each stored column of a dataset goes in a vocabulary's columns
/// (`deltacells::vocabulary::GeneMap`).
#[pyclass(frozen, module = "deltacells._deltacells")]
pub(crate) struct RawGeneMap {
    pub(crate) map: Arc<GeneMap>,
}

#[pymethods]
impl RawGeneMap {
    /// The map onto `wanted` of stored columns named `stored` (in stored order).
    #[staticmethod]
    fn by_name(py: Python<'_>, stored: Vec<String>, wanted: Vec<String>) -> PyResult<RawGeneMap> {
        let map = detached(py, || Ok(GeneMap::by_name(&stored, &wanted)?))?;
        Ok(RawGeneMap { map: Arc::new(map) })
    }

    /// The map back to the source files' order (gene_order.npy).
    #[staticmethod]
    fn source_order(py: Python<'_>, gene_order: PyReadonlyArray1<'_, i32>) -> PyResult<RawGeneMap> {
        let order = gene_order.as_array().to_vec();
        let map = detached(py, || Ok(GeneMap::source_order(&order)?))?;
        Ok(RawGeneMap { map: Arc::new(map) })
    }

    /// Columns of the output.
    #[getter]
    fn n_output(&self) -> u32 {
        self.map.n_output()
    }

    /// Stored columns the map is for.
    #[getter]
    fn n_stored(&self) -> usize {
        self.map.n_stored()
    }

    /// Output columns that some stored column goes to.
    #[getter]
    fn present(&self) -> u32 {
        self.map.present()
    }

    /// Stored columns the map leaves out.
    #[getter]
    fn left_out(&self) -> usize {
        (0..self.map.n_stored() as u32).filter(|&c| self.map.output_column(c).is_none()).count()
    }

    /// Nonzeros of the stored columns left out, given each one's nonzeros.
    fn left_out_of(&self, nonzeros: PyReadonlyArray1<'_, u64>) -> u64 {
        self.map.left_out_of(&nonzeros.as_array().to_vec())
    }
}
