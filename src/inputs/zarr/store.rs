//! A zarr store read through deltacells' storage layer: its nodes (arrays
//! and groups, v2 or v3 metadata) and its arrays' values, of any numeric
//! type or strings.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde_json::{Map, Value};
use zarrs::array::{Array, ArraySubset};
use zarrs::storage::byte_range::{ByteRange, ByteRangeIterator};
use zarrs::storage::{MaybeBytesIterator, ReadableStorageTraits, StorageError, StoreKey};

use super::chunks::{chunk_limit, ChunkLimit, MAX_CHUNK_BYTES};
use crate::inputs::error::{Advised, Cause, Context, InputError, Whole};
use crate::inputs::remote::{is_url, RemoteOptions};

/// A store's bytes, through deltacells' storage layer, and what each
/// array opened so far says its chunks decode to (by the array's key
/// prefix), which every chunk served is checked against.
pub(super) struct StoreBytes(Arc<dyn crate::storage::Storage>, RwLock<Vec<(String, ChunkLimit)>>);

impl StoreBytes {
    /// Refuses a chunk of `key` whose codec says it decodes to more than a
    /// chunk of its array holds.
    fn check(&self, key: &StoreKey, chunk: &[u8]) -> Result<(), StorageError> {
        let key = key.as_str();
        if [".zarray", ".zattrs", ".zgroup", "zarr.json"].iter().any(|m| key.ends_with(m)) {
            return Ok(());
        }
        let limits = self.1.read().unwrap_or_else(|e| e.into_inner());
        let Some((_, limit)) =
            limits.iter().filter(|(prefix, _)| key.starts_with(prefix.as_str())).max_by_key(|(p, _)| p.len())
        else {
            return Ok(());
        };
        match limit.problem(chunk) {
            // (a rule broken, as zarrs's text: no library's error is under it)
            Some(problem) => Err(StorageError::Other(format!("chunk {key}: {problem}"))),
            None => Ok(()),
        }
    }
}

/// Our store's failure as zarrs's: zarrs's error holds another library's only
/// as an `io::Error`, which holds ours as the value it is and prints its text.
fn store_failure(e: crate::storage::StorageError) -> StorageError {
    StorageError::from(std::io::Error::other(e))
}

impl ReadableStorageTraits for StoreBytes {
    fn get_partial_many<'a>(
        &'a self,
        key: &StoreKey,
        byte_ranges: ByteRangeIterator<'a>,
    ) -> Result<MaybeBytesIterator<'a>, StorageError> {
        let ranges: Vec<ByteRange> = byte_ranges.collect();
        if let [ByteRange::FromStart(0, None)] = ranges[..] {
            let Some(bytes) = self.0.get(key.as_str()).map_err(store_failure)? else { return Ok(None) };
            self.check(key, &bytes)?;
            return Ok(Some(Box::new(std::iter::once(Ok(bytes)))));
        }
        let open_ended = ranges.iter().any(|r| matches!(r, ByteRange::Suffix(_) | ByteRange::FromStart(_, None)));
        let size = if open_ended {
            match self.0.size(key.as_str()).map_err(store_failure)? {
                Some(size) => size,
                None => return Ok(None),
            }
        } else {
            u64::MAX
        };
        let ranges: Vec<Range<u64>> = ranges.iter().map(|r| r.to_range(size)).collect();
        let Some(parts) = self.0.get_ranges(key.as_str(), &ranges).map_err(store_failure)? else { return Ok(None) };
        for part in &parts {
            self.check(key, part)?;
        }
        Ok(Some(Box::new(parts.into_iter().map(Ok))))
    }

    fn size_key(&self, key: &StoreKey) -> Result<Option<u64>, StorageError> {
        self.0.size(key.as_str()).map_err(store_failure)
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
pub(super) enum Kind {
    Array,
    Group,
}

/// A node's kind and attributes.
pub(super) type Node = (Kind, Map<String, Value>);

/// An open zarr store.
pub struct ZarrStore {
    pub(super) path: PathBuf,
    bytes: Arc<StoreBytes>,
}

impl ZarrStore {
    /// Opens the store at `path` (a local folder or a URL).
    pub fn open(path: &Path, remote: &RemoteOptions) -> Result<ZarrStore, InputError> {
        let open_error = |message: String| InputError::Open { path: path.to_path_buf(), format: "zarr", message };
        if !is_url(path) && !path.is_dir() {
            return Err(open_error(if path.exists() { "not a folder" } else { "no such folder" }.into()));
        }
        let storage = crate::storage::open_with(&path.to_string_lossy(), &remote.store)?;
        let store = ZarrStore { path: path.to_path_buf(), bytes: Arc::new(StoreBytes(storage, RwLock::default())) };
        match store.node("")? {
            Some((Kind::Group, _)) => Ok(store),
            Some((Kind::Array, _)) => Err(open_error("the root is an array, not an AnnData group".into())),
            // At a URL, where a folder is only its objects: nothing there.
            None if is_url(path) => Err(InputError::Store(crate::storage::StorageError::Request {
                location: store.bytes.0.location(""),
                failure: crate::storage::RequestFailure::NotFound {
                    kind: crate::storage::StoreKind::of(&path.to_string_lossy()),
                },
            })),
            None => Err(open_error("no zarr.json or .zgroup at the root: not a zarr store".into())),
        }
    }

    pub(super) fn invalid(&self, object: &str, message: impl Into<String>) -> InputError {
        InputError::Invalid { path: self.path.clone(), object: object.to_string(), message: message.into() }
    }

    pub(super) fn unsupported(&self, object: &str, message: impl Into<String>) -> InputError {
        InputError::Unsupported { path: self.path.clone(), object: object.to_string(), message: message.into() }
    }

    /// `object` could not be read: `source` says why.
    pub(super) fn read_failed(&self, object: &str, source: impl Into<Cause>) -> InputError {
        InputError::Read { path: self.path.clone(), object: object.to_string(), source: source.into() }
    }

    fn json(&self, key: &str) -> Result<Option<Map<String, Value>>, InputError> {
        let object = key.rsplit_once('/').map_or("/", |(node, _)| node);
        // A store that does not serve the object fails as a store (refused,
        // denied), not as this node of the format.
        let got = self.bytes.0.get(key).map_err(|e| match e.request_failure() {
            Some(_) => InputError::Store(e),
            None => self.read_failed(object, e),
        });
        let Some(bytes) = got? else {
            return Ok(None);
        };
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(map)) => Ok(Some(map)),
            Ok(_) => Err(self.invalid(key, "is not a JSON object")),
            Err(e) => Err(self.read_failed(key, Context::new("is not JSON", e))),
        }
    }

    /// The node at `path` (`""` for the root, `obs/cell_type`): whether it
    /// is an array or a group, and its attributes; None when there is none.
    pub(super) fn node(&self, path: &str) -> Result<Option<Node>, InputError> {
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

    /// Refuses an array (at `path`) that declares `declared` elements when
    /// its chunks hold far too few bytes to back them (chunks never written
    /// read as the fill value): it is not read, whole or by ranges that its
    /// declared length allows, before its elements are allocated. A store
    /// that cannot be listed (a plain HTTP server) is not checked.
    pub(super) fn check_backed(&self, path: &str, declared: u64) -> Result<(), InputError> {
        if declared == 0 || !self.bytes.0.can_list() {
            return Ok(());
        }
        let listed = self.bytes.0.list_sizes(&format!("{path}/")).map_err(|e| match e.request_failure() {
            Some(_) => InputError::Store(e),
            None => self.read_failed(path, e),
        })?;
        let stored = listed.iter().map(|(_, size)| size).sum();
        match crate::inputs::rows::unbacked(declared, stored) {
            Some(problem) => Err(self.invalid(path, problem)),
            None => Ok(()),
        }
    }

    pub(super) fn array(&self, path: &str) -> Result<Array<StoreBytes>, InputError> {
        let array = self.open_array(path)?;
        let metadata = serde_json::to_value(array.metadata()).ok();
        if let Some(limit) = metadata.as_ref().and_then(Value::as_object).and_then(chunk_limit) {
            if limit.bytes > MAX_CHUNK_BYTES {
                return Err(self.unsupported(
                    path,
                    format!("chunks of {} bytes, more than deltacells decodes ({MAX_CHUNK_BYTES})", limit.bytes),
                ));
            }
            let mut limits = self.bytes.1.write().unwrap_or_else(|e| e.into_inner());
            let prefix = format!("{path}/");
            limits.retain(|(p, _)| *p != prefix);
            limits.push((prefix, limit));
        }
        Ok(array)
    }

    fn open_array(&self, path: &str) -> Result<Array<StoreBytes>, InputError> {
        Array::open(self.bytes.clone(), &format!("/{path}")).map_err(|e| {
            let text = e.to_string();
            if text.contains("unsupported") || text.contains("not supported") || text.contains("unknown") {
                InputError::UnsupportedBy {
                    path: self.path.clone(),
                    object: path.to_string(),
                    source: Box::new(Advised {
                        error: e,
                        advice: "deltacells reads the codecs anndata writes: Blosc, Zstandard, gzip, sharding",
                    }),
                }
            } else {
                self.read_failed(path, Whole(e))
            }
        })
    }
}

pub(super) fn string_attr<'a>(attrs: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    attrs.get(name).and_then(Value::as_str)
}

/// A 1-D array's values, of whatever numeric type it holds.
pub(super) enum Values {
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
    pub(super) fn to_f64(&self) -> Vec<f64> {
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
    pub(super) fn to_i64(&self) -> Option<Vec<i64>> {
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
pub(super) fn type_name(array: &Array<StoreBytes>) -> String {
    use zarrs::plugin::ExtensionName;
    array.data_type().name(zarrs::plugin::ZarrVersion::V3).map(|n| n.to_string()).unwrap_or_default()
}

/// A numeric array of the store.
pub(super) struct Numeric {
    pub(super) array: Array<StoreBytes>,
    path: String,
}

impl Numeric {
    pub(super) fn open(store: &ZarrStore, path: &str, dims: usize) -> Result<Numeric, InputError> {
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

    pub(super) fn type_name(&self) -> String {
        type_name(&self.array)
    }

    pub(super) fn len(&self) -> u64 {
        self.array.shape().first().copied().unwrap_or(0)
    }

    /// Elements `ranges` (one range per dimension).
    pub(super) fn read(&self, store: &ZarrStore, ranges: &[Range<u64>]) -> Result<Values, InputError> {
        let subset = ArraySubset::new_with_ranges(ranges);
        macro_rules! read {
            ($t:ty, $variant:ident) => {
                Values::$variant(caught(store, &self.path, || self.array.retrieve_array_subset::<Vec<$t>>(&subset))?)
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

    pub(super) fn read_1d(&self, store: &ZarrStore, rows: Option<&Range<usize>>) -> Result<Values, InputError> {
        let range = rows.map_or(0..self.len(), |r| r.start as u64..r.end as u64);
        if range.start > range.end || range.end > self.len() {
            return Err(store.invalid(&self.path, format!("rows {range:?} outside 0..{}", self.len())));
        }
        if rows.is_none() {
            store.check_backed(&self.path, self.len())?;
        }
        self.read(store, &[range])
    }

    pub(super) fn read_i64(&self, store: &ZarrStore, range: Range<u64>) -> Result<Vec<i64>, InputError> {
        self.read(store, &[range])?
            .to_i64()
            .ok_or_else(|| store.unsupported(&self.path, format!("holds {}, not integers", self.type_name())))
    }
}

/// A string array of the store.
pub(super) fn read_strings(
    store: &ZarrStore,
    path: &str,
    rows: Option<&Range<usize>>,
) -> Result<Vec<String>, InputError> {
    let array = store.array(path)?;
    let len = array.shape().first().copied().unwrap_or(0);
    let range = rows.map_or(0..len, |r| r.start as u64..r.end as u64);
    if array.dimensionality() != 1 || range.start > range.end || range.end > len {
        return Err(store.invalid(path, format!("rows {range:?} of an array of shape {:?}", array.shape())));
    }
    if rows.is_none() {
        store.check_backed(path, len)?;
    }
    caught(store, path, || array.retrieve_array_subset::<Vec<String>>(&ArraySubset::new_with_ranges(&[range])))
}

/// What `read` (a read by `zarrs`) gives, its failure as the array's error.
/// zarrs 0.23 panics on some malformed chunks (its v2 `vlen-utf8` decoder
/// slices by a string length it did not check against the chunk): such a
/// panic is the chunk's error too, not the process's end.
fn caught<T>(
    store: &ZarrStore,
    path: &str,
    read: impl FnOnce() -> Result<T, zarrs::array::ArrayError>,
) -> Result<T, InputError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)) {
        Ok(result) => result.map_err(|e| store.read_failed(path, Whole(e))),
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(store.invalid(path, format!("a malformed chunk (decoding it failed: {why})")))
        }
    }
}
