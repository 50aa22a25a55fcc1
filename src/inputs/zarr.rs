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

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow_array::{
    ArrayRef, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, UInt16Array, UInt32Array,
    UInt64Array, UInt8Array,
};
use serde_json::{Map, Value};
use zarrs::array::{Array, ArraySubset};
use zarrs::storage::byte_range::{ByteRange, ByteRangeIterator};
use zarrs::storage::{MaybeBytesIterator, ReadableStorageTraits, StorageError, StoreKey};

use crate::inputs::remote::{is_url, RemoteOptions};
use crate::inputs::{
    checked_indices, checked_indptr, made_once, Categories, FrameColumn, InputError, InputSource, RawRows, Table,
};

/// A store's bytes, through deltacells' storage layer.
struct StoreBytes(Arc<dyn crate::storage::Storage>);

impl ReadableStorageTraits for StoreBytes {
    fn get_partial_many<'a>(
        &'a self,
        key: &StoreKey,
        byte_ranges: ByteRangeIterator<'a>,
    ) -> Result<MaybeBytesIterator<'a>, StorageError> {
        let ranges: Vec<ByteRange> = byte_ranges.collect();
        let fail = |e: crate::storage::StorageError| StorageError::Other(e.to_string());
        if let [ByteRange::FromStart(0, None)] = ranges[..] {
            return Ok(self.0.get(key.as_str()).map_err(fail)?.map(|b| Box::new(std::iter::once(Ok(b))) as _));
        }
        let open_ended = ranges.iter().any(|r| matches!(r, ByteRange::Suffix(_) | ByteRange::FromStart(_, None)));
        let size = if open_ended {
            match self.0.size(key.as_str()).map_err(fail)? {
                Some(size) => size,
                None => return Ok(None),
            }
        } else {
            u64::MAX
        };
        let ranges: Vec<Range<u64>> = ranges.iter().map(|r| r.to_range(size)).collect();
        Ok(self
            .0
            .get_ranges(key.as_str(), &ranges)
            .map_err(fail)?
            .map(|parts| Box::new(parts.into_iter().map(Ok)) as _))
    }

    fn size_key(&self, key: &StoreKey) -> Result<Option<u64>, StorageError> {
        self.0.size(key.as_str()).map_err(|e| StorageError::Other(e.to_string()))
    }

    fn supports_get_partial(&self) -> bool {
        true
    }
}

/// Whether `path` is a zarr store: its name ends in `.zarr`, or (a local
/// folder) it holds a root group's metadata.
pub fn is_zarr(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
    let name = name.trim_end_matches('/');
    name.ends_with(".zarr")
        || (!is_url(path) && path.is_dir() && (path.join("zarr.json").is_file() || path.join(".zgroup").is_file()))
}

/// What a node of the store is.
#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Array,
    Group,
}

/// A node's kind and attributes.
type Node = (Kind, Map<String, Value>);

/// An open zarr store.
pub struct ZarrStore {
    path: PathBuf,
    bytes: Arc<StoreBytes>,
}

impl ZarrStore {
    /// Opens the store at `path` (a local folder or a URL).
    pub fn open(path: &Path, remote: &RemoteOptions) -> Result<ZarrStore, InputError> {
        let open_error = |message: String| InputError::Open { path: path.to_path_buf(), format: "zarr", message };
        if !is_url(path) && !path.is_dir() {
            return Err(open_error(if path.exists() { "not a folder" } else { "no such folder" }.into()));
        }
        let storage = crate::storage::open_with(&path.to_string_lossy(), &remote.store)
            .map_err(|e| open_error(crate::error_chain(&e)))?;
        let store = ZarrStore { path: path.to_path_buf(), bytes: Arc::new(StoreBytes(storage)) };
        match store.node("")? {
            Some((Kind::Group, _)) => Ok(store),
            Some((Kind::Array, _)) => Err(open_error("the root is an array, not an AnnData group".into())),
            None => Err(open_error("no zarr.json or .zgroup at the root: not a zarr store".into())),
        }
    }

    fn invalid(&self, object: &str, message: impl Into<String>) -> InputError {
        InputError::Invalid { path: self.path.clone(), object: object.to_string(), message: message.into() }
    }

    fn unsupported(&self, object: &str, message: impl Into<String>) -> InputError {
        InputError::Unsupported { path: self.path.clone(), object: object.to_string(), message: message.into() }
    }

    fn json(&self, key: &str) -> Result<Option<Map<String, Value>>, InputError> {
        let object = key.rsplit_once('/').map_or("/", |(node, _)| node);
        let Some(bytes) = self.bytes.0.get(key).map_err(|e| self.invalid(object, crate::error_chain(&e)))? else {
            return Ok(None);
        };
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(map)) => Ok(Some(map)),
            Ok(_) => Err(self.invalid(key, "is not a JSON object")),
            Err(e) => Err(self.invalid(key, format!("is not JSON: {e}"))),
        }
    }

    /// The node at `path` (`""` for the root, `obs/cell_type`): whether it
    /// is an array or a group, and its attributes; None when there is none.
    fn node(&self, path: &str) -> Result<Option<Node>, InputError> {
        let at = |name: &str| if path.is_empty() { name.to_string() } else { format!("{path}/{name}") };
        if let Some(mut meta) = self.json(&at("zarr.json"))? {
            let kind = match meta.get("node_type").and_then(Value::as_str) {
                Some("array") => Kind::Array,
                Some("group") => Kind::Group,
                other => return Err(self.invalid(&at("zarr.json"), format!("node_type {other:?}"))),
            };
            let attrs = match meta.remove("attributes") {
                Some(Value::Object(a)) => a,
                _ => Map::new(),
            };
            return Ok(Some((kind, attrs)));
        }
        let kind = if self.json(&at(".zarray"))?.is_some() {
            Kind::Array
        } else if self.json(&at(".zgroup"))?.is_some() {
            Kind::Group
        } else {
            return Ok(None);
        };
        Ok(Some((kind, self.json(&at(".zattrs"))?.unwrap_or_default())))
    }

    fn array(&self, path: &str) -> Result<Array<StoreBytes>, InputError> {
        Array::open(self.bytes.clone(), &format!("/{path}")).map_err(|e| {
            let text = e.to_string();
            if text.contains("unsupported") || text.contains("not supported") || text.contains("unknown") {
                self.unsupported(
                    path,
                    format!("{text}; deltacells reads the codecs anndata writes: Blosc, Zstandard, gzip, sharding"),
                )
            } else {
                self.invalid(path, text)
            }
        })
    }
}

fn string_attr<'a>(attrs: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    attrs.get(name).and_then(Value::as_str)
}

/// A 1-D array's values, of whatever numeric type it holds.
enum Values {
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
}

impl Values {
    fn to_f64(&self) -> Vec<f64> {
        match self {
            Values::I8(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Values::I16(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Values::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Values::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Values::U8(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Values::U16(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Values::U32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Values::U64(v) => v.iter().map(|&x| x as f64).collect(),
            Values::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Values::F64(v) => v.clone(),
            Values::Bool(v) => v.iter().map(|&x| f64::from(u8::from(x))).collect(),
        }
    }

    /// As integers; None for floats (or a u64 above i64's range).
    fn to_i64(&self) -> Option<Vec<i64>> {
        Some(match self {
            Values::I8(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Values::I16(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Values::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Values::I64(v) => v.clone(),
            Values::U8(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Values::U16(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Values::U32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Values::U64(v) => v.iter().map(|&x| i64::try_from(x).ok()).collect::<Option<_>>()?,
            Values::F32(_) | Values::F64(_) | Values::Bool(_) => return None,
        })
    }
}

/// The zarr v3 name of an array's data type (`float32`, `string`, `bool`).
fn type_name(array: &Array<StoreBytes>) -> String {
    use zarrs::plugin::ExtensionName;
    array.data_type().name(zarrs::plugin::ZarrVersion::V3).map(|n| n.to_string()).unwrap_or_default()
}

/// A numeric array of the store.
struct Numeric {
    array: Array<StoreBytes>,
    path: String,
}

impl Numeric {
    fn open(store: &ZarrStore, path: &str, dims: usize) -> Result<Numeric, InputError> {
        let array = store.array(path)?;
        if array.dimensionality() != dims {
            return Err(store.invalid(path, format!("must be {dims}-D, has shape {:?}", array.shape())));
        }
        let numeric = Numeric { array, path: path.to_string() };
        if numeric.type_name() == "string" {
            return Err(store.unsupported(path, "holds strings, not numbers"));
        }
        Ok(numeric)
    }

    fn type_name(&self) -> String {
        type_name(&self.array)
    }

    fn len(&self) -> u64 {
        self.array.shape().first().copied().unwrap_or(0)
    }

    /// Elements `ranges` (one range per dimension).
    fn read(&self, store: &ZarrStore, ranges: &[Range<u64>]) -> Result<Values, InputError> {
        let subset = ArraySubset::new_with_ranges(ranges);
        let err = |e: zarrs::array::ArrayError| store.invalid(&self.path, e.to_string());
        macro_rules! read {
            ($t:ty, $variant:ident) => {
                Values::$variant(self.array.retrieve_array_subset::<Vec<$t>>(&subset).map_err(err)?)
            };
        }
        Ok(match self.type_name().as_str() {
            "int8" => read!(i8, I8),
            "int16" => read!(i16, I16),
            "int32" => read!(i32, I32),
            "int64" => read!(i64, I64),
            "uint8" => read!(u8, U8),
            "uint16" => read!(u16, U16),
            "uint32" => read!(u32, U32),
            "uint64" => read!(u64, U64),
            "float32" => read!(f32, F32),
            "float64" => read!(f64, F64),
            "bool" => read!(bool, Bool),
            other => return Err(store.unsupported(&self.path, format!("holds {other}, not numbers deltacells reads"))),
        })
    }

    fn read_1d(&self, store: &ZarrStore, rows: Option<&Range<usize>>) -> Result<Values, InputError> {
        let range = rows.map_or(0..self.len(), |r| r.start as u64..r.end as u64);
        if range.start > range.end || range.end > self.len() {
            return Err(store.invalid(&self.path, format!("rows {range:?} outside 0..{}", self.len())));
        }
        self.read(store, &[range])
    }

    fn read_i64(&self, store: &ZarrStore, range: Range<u64>) -> Result<Vec<i64>, InputError> {
        self.read(store, &[range])?
            .to_i64()
            .ok_or_else(|| store.unsupported(&self.path, format!("holds {}, not integers", self.type_name())))
    }
}

/// A string array of the store.
fn read_strings(store: &ZarrStore, path: &str, rows: Option<&Range<usize>>) -> Result<Vec<String>, InputError> {
    let array = store.array(path)?;
    let len = array.shape().first().copied().unwrap_or(0);
    let range = rows.map_or(0..len, |r| r.start as u64..r.end as u64);
    if array.dimensionality() != 1 || range.start > range.end || range.end > len {
        return Err(store.invalid(path, format!("rows {range:?} of an array of shape {:?}", array.shape())));
    }
    array
        .retrieve_array_subset::<Vec<String>>(&ArraySubset::new_with_ranges(&[range]))
        .map_err(|e| store.invalid(path, e.to_string()))
}

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

    fn read_entries(&self, range: Range<u64>, minor: u64) -> Result<(Vec<u32>, Vec<f64>), InputError> {
        let object = format!("{}/indices", self.matrix_name);
        let raw = self.arrays[1].read_i64(&self.store, range.clone())?;
        let indices = checked_indices(raw, range.start, minor)
            .map_err(|(at, message)| self.store.invalid(&format!("{object}[{at}]"), message))?;
        let values = self.arrays[0].read(&self.store, &[range])?.to_f64();
        Ok((indices, values))
    }

    fn read_csc_as_csr(&self) -> Result<RawRows, InputError> {
        let colptr = self.read_indptr(0..self.n_cols)?;
        let (rows_of, values) = self.read_entries(0..colptr.last().copied().unwrap_or(0), self.n_rows)?;
        Ok(RawRows::from_columns(&colptr, &rows_of, &values, self.n_rows))
    }
}

/// A dataframe group of the store (obs, var, raw/var).
struct ZarrTable<'s> {
    store: &'s ZarrStore,
    group: String,
}

impl ZarrTable<'_> {
    fn attrs(&self) -> Result<Map<String, Value>, InputError> {
        match self.store.node(&self.group)? {
            Some((Kind::Group, attrs)) => Ok(attrs),
            Some((Kind::Array, _)) => Err(self.store.unsupported(&self.group, "an array, not a dataframe group")),
            None => Err(self.store.invalid(&self.group, "missing")),
        }
    }

    fn column_type(&self, column: &str, what: impl std::fmt::Display) -> InputError {
        InputError::ColumnType {
            path: self.store.path.clone(),
            table: self.group.clone(),
            column: column.to_string(),
            what: what.to_string(),
        }
    }

    /// The number of rows of a column, from its metadata.
    fn column_len(&self, name: &str) -> Result<Option<u64>, InputError> {
        let object = format!("{}/{name}", self.group);
        match self.store.node(&object)? {
            Some((Kind::Array, _)) => Ok(Some(self.store.array(&object)?.shape().first().copied().unwrap_or(0))),
            Some((Kind::Group, _)) => {
                for member in ["codes", "values"] {
                    let path = format!("{object}/{member}");
                    if let Some((Kind::Array, _)) = self.store.node(&path)? {
                        return Ok(Some(self.store.array(&path)?.shape().first().copied().unwrap_or(0)));
                    }
                }
                Ok(None)
            }
            None => Err(self.store.invalid(&object, "missing")),
        }
    }

    fn numeric(
        &self,
        object: &str,
        mask: Option<&[bool]>,
        rows: Option<&Range<usize>>,
    ) -> Result<ArrayRef, InputError> {
        let values = Numeric::open(self.store, object, 1)?.read_1d(self.store, rows)?;
        let missing = |i: usize| mask.is_some_and(|m| m.get(i).copied().unwrap_or(false));
        macro_rules! ints {
            ($v:expr, $array:ty) => {
                Arc::new($v.iter().enumerate().map(|(i, &x)| (!missing(i)).then_some(x)).collect::<$array>())
                    as ArrayRef
            };
        }
        macro_rules! floats {
            ($v:expr, $array:ty) => {
                Arc::new(
                    $v.iter().enumerate().map(|(i, &x)| (!x.is_nan() && !missing(i)).then_some(x)).collect::<$array>(),
                ) as ArrayRef
            };
        }
        Ok(match &values {
            Values::I8(v) => ints!(v, Int8Array),
            Values::I16(v) => ints!(v, Int16Array),
            Values::I32(v) => ints!(v, Int32Array),
            Values::I64(v) => ints!(v, Int64Array),
            Values::U8(v) => ints!(v, UInt8Array),
            Values::U16(v) => ints!(v, UInt16Array),
            Values::U32(v) => ints!(v, UInt32Array),
            Values::U64(v) => ints!(v, UInt64Array),
            Values::F32(v) => floats!(v, Float32Array),
            Values::F64(v) => floats!(v, Float64Array),
            Values::Bool(_) => return Err(self.store.invalid(object, "holds booleans where numbers were expected")),
        })
    }

    fn bools(&self, object: &str, rows: Option<&Range<usize>>) -> Result<Vec<bool>, InputError> {
        match Numeric::open(self.store, object, 1)?.read_1d(self.store, rows)? {
            Values::Bool(v) => Ok(v),
            other => Ok(other.to_f64().into_iter().map(|x| x != 0.0).collect()),
        }
    }

    fn categories(&self, object: &str) -> Result<Categories, InputError> {
        let array = self.store.array(object)?;
        if type_name(&array) == "string" {
            return Ok(Categories::Strings(read_strings(self.store, object, None)?));
        }
        let values = Numeric::open(self.store, object, 1)?.read_1d(self.store, None)?;
        Ok(match (&values, values.to_i64()) {
            (Values::Bool(v), _) => Categories::Bools(v.clone()),
            (_, Some(ints)) => Categories::Ints(ints),
            _ => Categories::Floats(values.to_f64()),
        })
    }
}

impl Table for ZarrTable<'_> {
    fn name(&self) -> &str {
        &self.group
    }

    fn index_name(&self) -> Result<String, InputError> {
        Ok(string_attr(&self.attrs()?, "_index").unwrap_or("_index").to_string())
    }

    fn index(&self, rows: Option<Range<usize>>) -> Result<Vec<String>, InputError> {
        let index = self.index_name()?;
        read_strings(self.store, &format!("{}/{index}", self.group), rows.as_ref())
    }

    fn columns(&self) -> Result<Vec<String>, InputError> {
        let attrs = self.attrs()?;
        Ok(match attrs.get("column-order") {
            Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).map(str::to_string).collect(),
            _ => Vec::new(),
        })
    }

    fn column(
        &self,
        name: &str,
        rows: Option<&Range<usize>>,
        with_categories: bool,
    ) -> Result<FrameColumn, InputError> {
        let object = format!("{}/{name}", self.group);
        let Some((kind, attrs)) = self.store.node(&object)? else {
            return Err(self.store.invalid(&object, "missing"));
        };
        if kind == Kind::Array {
            let array = self.store.array(&object)?;
            if array.dimensionality() != 1 {
                return Err(self.column_type(name, format!("a {}-D array", array.dimensionality())));
            }
            if type_name(&array) == "string" {
                return Ok(FrameColumn::String(
                    read_strings(self.store, &object, rows)?.into_iter().map(Some).collect(),
                ));
            }
            if type_name(&array) == "bool" {
                return Ok(FrameColumn::Bool(self.bools(&object, rows)?.into_iter().map(Some).collect()));
            }
            return Ok(FrameColumn::Numeric(self.numeric(&object, None, rows)?));
        }
        let member = |m: &str| format!("{object}/{m}");
        let mask = || self.bools(&member("mask"), rows);
        match string_attr(&attrs, "encoding-type") {
            Some("categorical") => {
                let categories_object = member("categories");
                let (categories, n) = if with_categories {
                    let c = self.categories(&categories_object)?;
                    let n = c.len();
                    (c, n)
                } else {
                    let n = self.store.array(&categories_object)?.shape().first().copied().unwrap_or(0) as usize;
                    (Categories::Strings(Vec::new()), n)
                };
                let codes_object = member("codes");
                let codes = Numeric::open(self.store, &codes_object, 1)?
                    .read_1d(self.store, rows)?
                    .to_i64()
                    .ok_or_else(|| self.store.invalid(&codes_object, "codes are not integers"))?;
                let codes = codes
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| {
                        if c < -1 || c >= n as i64 {
                            Err(self
                                .store
                                .invalid(&format!("{codes_object}[{i}]"), format!("code {c} outside -1..{n}")))
                        } else {
                            Ok(c as i32)
                        }
                    })
                    .collect::<Result<Vec<i32>, _>>()?;
                let ordered = attrs.get("ordered").and_then(Value::as_bool).unwrap_or(false);
                Ok(FrameColumn::Category { codes, categories, ordered })
            }
            Some("nullable-integer") => {
                let m = mask()?;
                Ok(FrameColumn::Numeric(self.numeric(&member("values"), Some(&m), rows)?))
            }
            Some("nullable-boolean") => {
                let m = mask()?;
                let v = self.bools(&member("values"), rows)?;
                Ok(FrameColumn::Bool(v.iter().zip(&m).map(|(&v, &missing)| (!missing).then_some(v)).collect()))
            }
            Some("nullable-string-array") => {
                let m = mask()?;
                let v = read_strings(self.store, &member("values"), rows)?;
                Ok(FrameColumn::String(v.into_iter().zip(&m).map(|(v, &missing)| (!missing).then_some(v)).collect()))
            }
            other => Err(self.column_type(name, format!("encoding-type {}", other.unwrap_or("(none)")))),
        }
    }

    fn check_rows(&self, rows: u64, what: &str) -> Result<(), InputError> {
        let index = self.index_name()?;
        let mut lengths = vec![(index.clone(), self.column_len(&index)?)];
        for name in self.columns()? {
            let n = self.column_len(&name)?;
            lengths.push((name, n));
        }
        for (name, n) in lengths {
            if let Some(n) = n.filter(|&n| n != rows) {
                return Err(self.store.invalid(
                    &format!("{}/{name}", self.group),
                    format!(
                        "has {n} rows, but the matrix has {rows} {what}; anndata requires one row per {}",
                        what.trim_end_matches('s')
                    ),
                ));
            }
        }
        Ok(())
    }

    fn invalid(&self, object: &str, message: String) -> InputError {
        self.store.invalid(object, message)
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
            if crate::inputs::first_rows_are_counts(source.n_rows, source.n_cols, |rows| source.read_rows(rows)) {
                return Some(other.to_string());
            }
        }
        None
    }
}
