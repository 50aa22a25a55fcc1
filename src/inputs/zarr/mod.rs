//! AnnData zarr stores (zarr v2, and v3 with or without sharding, as anndata
//! writes them) as an input of conversion ([`crate::inputs`]).
//!
//! The arrays are read with the `zarrs` crate, which decodes the codecs
//! anndata uses (Blosc, Zstandard, gzip, sharding) and reads, of a sharded
//! array, only the inner chunks a range touches; the store's bytes come
//! through deltacells' own storage layer, so a store is read the same way
//! from a local folder, `s3://`, `gs://` or `http(s)://`. The layout is the
//! one of an .h5ad file: X (or `raw/X`, `layers/NAME`) as a CSR, CSC or
//! dense matrix, obs and var as dataframes whose columns are read into the
//! same kinds as an .h5ad file's (strings, numbers, booleans, categoricals,
//! nullable integers, booleans and strings).

mod chunks;
mod store;
mod table;

use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

use serde_json::Value;

use crate::inputs::error::InputError;
use crate::inputs::remote::{is_url, RemoteOptions};
use crate::inputs::rows::{checked_indices, checked_indptr, made_once, shape_problem, RawRows, Values};
use crate::inputs::source::{first_rows_are_counts, InputSource};
use crate::inputs::table::Table;
pub use store::{is_zarr, ZarrStore};
use store::{string_attr, Kind, Numeric};
use table::ZarrTable;

/// How a matrix is stored.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Csr,
    Csc,
    Dense,
}

/// An AnnData zarr store and the matrix being converted.
pub struct ZarrSource {
    store: ZarrStore,
    matrix_name: String,
    layout: Layout,
    n_rows: u64,
    n_cols: u64,
    /// data, indices, indptr of a sparse matrix; the 2-D array of a dense one.
    arrays: Vec<Numeric>,
    /// The table of genes that goes with the matrix.
    var_group: String,
    /// A CSC matrix, converted to CSR on first use.
    csc_as_csr: OnceLock<RawRows>,
}

impl ZarrSource {
    /// Opens the store at `path` and its matrix `matrix` (`X`, `raw/X`, `layers/NAME`).
    pub fn open(path: &Path, matrix: &str, remote: &RemoteOptions) -> Result<ZarrSource, InputError> {
        let store = ZarrStore::open(path, remote)?;
        let Some((kind, attrs)) = store.node(matrix)? else {
            let have: Vec<&str> =
                ["X", "raw/X"].into_iter().filter(|m| store.node(m).ok().flatten().is_some()).collect();
            let message = if have.is_empty() {
                "not found".to_string()
            } else {
                format!("not found (this store has: {})", have.join(", "))
            };
            return Err(store.invalid(matrix, message));
        };
        let (layout, shape, arrays) = match kind {
            Kind::Array => {
                let a = Numeric::open(&store, matrix, 2)?;
                let shape = a.array.shape().to_vec();
                (Layout::Dense, shape, vec![a])
            }
            Kind::Group => {
                let layout = match string_attr(&attrs, "encoding-type") {
                    Some("csr_matrix") => Layout::Csr,
                    Some("csc_matrix") => Layout::Csc,
                    other => {
                        return Err(store.unsupported(
                            matrix,
                            format!("encoding-type {other:?}; expected csr_matrix, csc_matrix or a dense array"),
                        ))
                    }
                };
                let shape: Vec<u64> = attrs
                    .get("shape")
                    .and_then(Value::as_array)
                    .map(|s| s.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default();
                let arrays = ["data", "indices", "indptr"]
                    .iter()
                    .map(|part| Numeric::open(&store, &format!("{matrix}/{part}"), 1))
                    .collect::<Result<Vec<_>, _>>()?;
                (layout, shape, arrays)
            }
        };
        let [n_rows, n_cols] = shape[..] else {
            return Err(store.invalid(&format!("{matrix}/@shape"), format!("{shape:?} is not two sizes")));
        };
        if let Some(problem) = shape_problem(n_rows, n_cols) {
            return Err(store.invalid(&format!("{matrix}/@shape"), format!("{shape:?}: {problem}")));
        }
        // (the arrays read by ranges that their declared lengths allow)
        let read_by_range: &[&str] = if layout == Layout::Dense { &[""] } else { &["/data", "/indices"] };
        for (part, array) in read_by_range.iter().zip(&arrays) {
            let elements = array.array.shape().iter().try_fold(1u64, |n, &d| n.checked_mul(d)).unwrap_or(u64::MAX);
            store.check_backed(&format!("{matrix}{part}"), elements)?;
        }
        if layout != Layout::Dense {
            let (data, indices, indptr) = (arrays[0].len(), arrays[1].len(), arrays[2].len());
            if data != indices {
                return Err(store.invalid(matrix, format!("data has {data} entries but indices has {indices}")));
            }
            let major = if layout == Layout::Csr { n_rows } else { n_cols };
            if indptr != major + 1 {
                return Err(store.invalid(
                    &format!("{matrix}/indptr"),
                    format!("has {indptr} entries, but shape [{n_rows}, {n_cols}] needs {}", major + 1),
                ));
            }
        }
        let var_group = if matrix == "raw/X" { "raw/var" } else { "var" }.to_string();
        Ok(ZarrSource {
            store,
            matrix_name: matrix.to_string(),
            layout,
            n_rows,
            n_cols,
            arrays,
            var_group,
            csc_as_csr: OnceLock::new(),
        })
    }

    fn read_indptr(&self, range: Range<u64>) -> Result<Vec<u64>, InputError> {
        let object = format!("{}/indptr", self.matrix_name);
        let raw = self.arrays[2].read_i64(&self.store, range.start..range.end + 1)?;
        checked_indptr(raw, range.start, self.arrays[0].len() as i64)
            .map_err(|(at, message)| self.store.invalid(&format!("{object}[{at}]"), message))
    }

    fn read_entries(&self, range: Range<u64>, minor: u64) -> Result<(Vec<u32>, Values), InputError> {
        let object = format!("{}/indices", self.matrix_name);
        let raw = self.arrays[1].read_i64(&self.store, range.clone())?;
        let indices = checked_indices(&raw, range.start, minor)
            .map_err(|(at, message)| self.store.invalid(&format!("{object}[{at}]"), message))?;
        let values = self.arrays[0].read(&self.store, &[range])?.to_f64().into();
        Ok((indices, values))
    }

    fn read_csc_as_csr(&self) -> Result<RawRows, InputError> {
        let colptr = self.read_indptr(0..self.n_cols)?;
        let (rows_of, values) = self.read_entries(0..colptr.last().copied().unwrap_or(0), self.n_rows)?;
        Ok(RawRows::from_columns(&colptr, &rows_of, &values, self.n_rows))
    }
}

impl InputSource for ZarrSource {
    fn path(&self) -> &Path {
        &self.store.path
    }

    fn matrix_name(&self) -> &str {
        &self.matrix_name
    }

    fn n_rows(&self) -> u64 {
        self.n_rows
    }

    fn n_cols(&self) -> u64 {
        self.n_cols
    }

    fn read_rows(&self, rows: Range<u64>) -> Result<RawRows, InputError> {
        if rows.end > self.n_rows || rows.start > rows.end {
            return Err(self.store.invalid(&self.matrix_name, format!("rows {rows:?} outside 0..{}", self.n_rows)));
        }
        match self.layout {
            Layout::Csr => {
                let indptr = self.read_indptr(rows)?;
                let (lo, hi) = (indptr[0], indptr.last().copied().unwrap_or(indptr[0]));
                let (indices, values) = self.read_entries(lo..hi, self.n_cols)?;
                Ok(RawRows { indptr: indptr.iter().map(|&p| p - lo).collect(), indices, values })
            }
            Layout::Dense => {
                let block = self.arrays[0].read(&self.store, &[rows.clone(), 0..self.n_cols])?.to_f64();
                let n = (rows.end - rows.start) as usize;
                Ok(RawRows::from_dense_rows(block.chunks(self.n_cols.max(1) as usize).take(n)))
            }
            Layout::Csc => Ok(made_once(&self.csc_as_csr, || self.read_csc_as_csr())?.rows(rows)),
        }
    }

    fn var(&self) -> Result<Box<dyn Table + '_>, InputError> {
        Ok(Box::new(ZarrTable { store: &self.store, group: self.var_group.clone() }))
    }

    fn obs(&self) -> Result<Option<Box<dyn Table + '_>>, InputError> {
        Ok(match self.store.node("obs")? {
            Some(_) => Some(Box::new(ZarrTable { store: &self.store, group: "obs".into() })),
            None => None,
        })
    }

    fn counts_elsewhere(&self) -> Option<String> {
        // (a store at a URL is not read again for a hint)
        if is_url(&self.store.path) {
            return None;
        }
        for other in ["raw/X", "X"] {
            if other == self.matrix_name {
                continue;
            }
            let Ok(source) = ZarrSource::open(&self.store.path, other, &RemoteOptions::default()) else { continue };
            if first_rows_are_counts(source.n_rows, source.n_cols, |rows| source.read_rows(rows)) {
                return Some(other.to_string());
            }
        }
        None
    }
}
