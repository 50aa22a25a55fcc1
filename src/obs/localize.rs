//! The local obs cache (format.md, "Local cache"; decisions.md 22-24): the
//! columns a training job needs, copied once per machine from the shards into
//! `<cache>/<fingerprint>/obs/<quoted name>.arrow`, an uncompressed Arrow IPC
//! file with one record batch per tile, ready to be memory-mapped.
//!
//! Only the bytes needed are read: each shard's footer (one ranged read of its
//! tail, two when the footer is large), then the column's chunk in each row
//! group. Columns are added one at a time under an exclusive lock on
//! `<cache>/<fingerprint>/obs/.lock`, each written to a temporary file and
//! renamed, so concurrent processes fetch every column once.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_schema::{Field, Schema};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::reader::{ChunkReader, Length};
use rayon::prelude::*;
use serde::Serialize;

use crate::format::obs_schema::ObsSchema;
use crate::format::{self, Manifest};
use crate::storage::Storage;

/// Why obs columns could not be read or localized. Each names the object or
/// cache file, and leaves a cause to `source()`.
#[derive(Debug, thiserror::Error)]
pub enum ObsError {
    /// The manifest says the dataset has no obs.
    #[error("{location}: the dataset has no obs")]
    NoObs { location: String },
    /// A column the schema does not have.
    #[error("{location}: no obs column {column:?}")]
    NoColumn { location: String, column: String },
    /// An obs shard the manifest names is not there.
    #[error("{location}: missing")]
    Missing { location: String },
    /// An obs shard is not what the format allows.
    #[error("{location}: {reason}")]
    Shard { location: String, reason: String },
    /// A row group of a shard could not be decoded.
    #[error("{location}: row group {row_group}")]
    RowGroup { location: String, row_group: usize, source: parquet::errors::ParquetError },
    /// The cache folder or a file in it could not be written or read.
    #[error("{path}")]
    Cache { path: String, source: std::io::Error },
    /// The cache's lock could not be taken.
    #[error("{path}: cannot lock")]
    Lock { path: String, source: std::io::Error },
    /// A cache file could not be encoded.
    #[error("{path}: writing the cache file")]
    Write { path: String, source: arrow_schema::ArrowError },
    /// The dataset's bytes could not be reached.
    #[error(transparent)]
    Storage(#[from] crate::storage::StorageError),
    /// The dataset (its manifest, its schema) is not what the format allows.
    #[error(transparent)]
    Dataset(#[from] crate::dataset::DatasetError),
}

fn cache_err(path: &Path) -> impl Fn(std::io::Error) -> ObsError + '_ {
    move |source| ObsError::Cache { path: path.display().to_string(), source }
}

/// The cache root: `explicit`, else $DELTACELLS_CACHE, else
/// $XDG_CACHE_HOME/deltacells, else ~/.cache/deltacells.
pub fn cache_root(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("DELTACELLS_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|x| x.join("deltacells")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/deltacells")))
        .unwrap_or_else(|| PathBuf::from(".cache/deltacells"))
}

/// A column name as a file name: Python's `urllib.parse.quote(name, safe="")`
/// (decisions.md 22).
pub fn quote(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"_.-~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The cache folder of a dataset's obs.
pub fn column_dir(root: &Path, fingerprint: &str) -> PathBuf {
    root.join(fingerprint).join("obs")
}

/// The cache file of a column.
pub fn column_path(root: &Path, fingerprint: &str, column: &str) -> PathBuf {
    column_dir(root, fingerprint).join(format!("{}.arrow", quote(column)))
}

/// The record of a cache file's size and CRC-32, written beside it when it is
/// localized: `<quoted name>.arrow.crc32`. It is ours, not the format's: a
/// cache file written by another reader has none and is checked by structure
/// only.
pub fn checksum_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".crc32");
    path.with_file_name(name)
}

/// `bytes crc32` (decimal size, 8 hex digits) of the file at `path`.
fn file_checksum(path: &Path) -> std::io::Result<String> {
    let data = std::fs::read(path)?;
    Ok(format!("{} {:08x}\n", data.len(), crc32fast::hash(&data)))
}

/// Whether `path` is a complete cache file for a dataset with these tiles: one
/// record batch per tile with that tile's rows, one field named `column`, and,
/// when a checksum was recorded at localize time, the same size and CRC-32 (so
/// that a file damaged in place is not trusted).
pub fn cached_file_is_valid(path: &Path, column: &str, tile_cells: &[u64]) -> bool {
    match std::fs::read_to_string(checksum_path(path)) {
        Ok(recorded) => {
            if file_checksum(path).ok().as_deref() != Some(recorded.as_str()) {
                return false;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(_) => return false,
    }
    let Ok(file) = File::open(path) else { return false };
    let Ok(reader) = arrow_ipc::reader::FileReader::try_new(file, None) else { return false };
    let schema = reader.schema();
    if schema.fields().len() != 1 || schema.field(0).name() != column || reader.num_batches() != tile_cells.len() {
        return false;
    }
    let mut tiles = tile_cells.iter();
    for batch in reader {
        match (batch, tiles.next()) {
            (Ok(b), Some(&cells)) if b.num_rows() as u64 == cells => {}
            _ => return false,
        }
    }
    true
}

/// What a localization did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LocalizeReport {
    /// The dataset's folder in the cache.
    pub cache: String,
    /// Columns fetched into the cache (replaced ones among them).
    pub fetched: Vec<String>,
    /// Columns already in the cache and valid.
    pub already_local: Vec<String>,
    /// Cache files that were invalid and were fetched again.
    pub replaced: Vec<String>,
    /// Read requests and bytes fetched from the dataset's storage.
    pub requests: u64,
    pub bytes: u64,
    /// How long it took.
    pub seconds: f64,
}

/// A Parquet file of which only some byte ranges were fetched; reading
/// anything else is an error, which is how we know only those were needed.
#[derive(Clone)]
struct SparseFile {
    len: u64,
    parts: Arc<Vec<(u64, Bytes)>>,
}

impl SparseFile {
    fn slice(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        for (at, bytes) in self.parts.iter() {
            if start >= *at && start + length as u64 <= at + bytes.len() as u64 {
                let from = (start - at) as usize;
                return Ok(bytes.slice(from..from + length));
            }
        }
        Err(parquet::errors::ParquetError::General(format!("bytes {start}..+{length} were not fetched")))
    }
}

impl Length for SparseFile {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for SparseFile {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let (at, bytes) = self
            .parts
            .iter()
            .find(|(at, b)| start >= *at && start < at + b.len() as u64)
            .ok_or_else(|| parquet::errors::ParquetError::General(format!("byte {start} was not fetched")))?;
        Ok(bytes::Buf::reader(bytes.slice((start - at) as usize..)))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.slice(start, length)
    }
}

/// Bytes read from the end of a shard in the first request: most footers fit.
const TAIL_GUESS: u64 = 64 * 1024;

/// One shard's footer, fetched.
struct Footer {
    len: u64,
    /// The version of the shard it was read from, which the column's reads
    /// ask for (bytes of one version, or [`crate::storage::StorageError::Changed`]).
    etag: Option<String>,
    tail: (u64, Bytes),
    metadata: Arc<ParquetMetaData>,
}

/// Shard `key`'s footer, from its last bytes up to `size`, the manifest's.
fn read_footer(storage: &dyn Storage, key: &str, size: u64, requests: &mut u64) -> Result<Footer, ObsError> {
    let location = storage.location(key);
    let bad = |reason: String| ObsError::Shard { location: location.clone(), reason };
    if size < 12 {
        return Err(bad(format!("{size} bytes is too short for a Parquet file")));
    }
    let start = size.saturating_sub(TAIL_GUESS);
    // The version of the shard read first pins every later read of it (a
    // shard a writer rewrote since is another size, so its footer is not
    // where the manifest says either, and the read fails).
    let (mut tail, etag) = fetch(storage, key, start..size, None, requests)?;
    let n = tail.len();
    if &tail[n - 4..] != b"PAR1" {
        return Err(bad("not a Parquet file (no PAR1 at the end)".into()));
    }
    let meta_len = u64::from(u32::from_le_bytes(tail[n - 8..n - 4].try_into().expect("4 bytes")));
    if meta_len + 8 > size {
        return Err(bad(format!("footer length {meta_len} exceeds the file ({size} bytes)")));
    }
    let mut tail_start = start;
    if meta_len + 8 > n as u64 {
        tail_start = size - meta_len - 8;
        tail = fetch(storage, key, tail_start..size, etag.as_deref(), requests)?.0;
    }
    let footer = &tail[tail.len() - 8 - meta_len as usize..tail.len() - 8];
    let metadata = ParquetMetaDataReader::decode_metadata(footer).map_err(|e| bad(format!("footer: {e}")))?;
    Ok(Footer { len: size, etag, tail: (tail_start, tail), metadata: Arc::new(metadata) })
}

/// One range of `key` (of the version `etag` names, when it names one),
/// with the version it was read from.
fn fetch(
    storage: &dyn Storage,
    key: &str,
    range: Range<u64>,
    etag: Option<&str>,
    requests: &mut u64,
) -> Result<(Bytes, Option<String>), ObsError> {
    *requests += 1;
    let range_len = range.end - range.start;
    let request =
        crate::storage::PinnedRequest { key: key.to_string(), ranges: vec![range], etag: etag.map(str::to_string) };
    let (mut parts, tag) = storage
        .get_ranges_pinned(std::slice::from_ref(&request))
        .pop()
        .unwrap_or(Ok(None))?
        .ok_or_else(|| ObsError::Missing { location: storage.location(key) })?;
    if parts.len() != 1 || parts[0].len() as u64 != range_len {
        let reason = format!("{} bytes were read of {range_len} asked", parts.iter().map(Bytes::len).sum::<usize>());
        return Err(ObsError::Shard { location: storage.location(key), reason });
    }
    Ok((parts.swap_remove(0), tag))
}

/// The obs of one dataset, for localizing and for `obs info`.
pub struct ObsSource<'a> {
    storage: &'a dyn Storage,
    /// The cells of each tile of the version read as (the version whose
    /// shards are read, or an earlier one, whose rows of each tile come
    /// first in the later one's row group of it).
    tile_cells: &'a [u64],
    manifest: &'a Manifest,
    pub schema: ObsSchema,
    footers: Vec<Footer>,
    /// Requests made to open it: the schema and the footers.
    requests: u64,
    schema_bytes: u64,
}

impl<'a> ObsSource<'a> {
    /// Reads obs/schema.json and every shard's footer (in parallel).
    pub fn open(storage: &'a dyn Storage, manifest: &'a Manifest) -> Result<ObsSource<'a>, ObsError> {
        ObsSource::open_as(storage, manifest, &manifest.tile_cells)
    }

    /// The obs of the version whose tiles hold `tile_cells`, read from the
    /// shards `manifest` lists: that version's, or a later one's (a writer
    /// that changed the dataset since it was opened).
    pub fn open_as(
        storage: &'a dyn Storage,
        manifest: &'a Manifest,
        tile_cells: &'a [u64],
    ) -> Result<ObsSource<'a>, ObsError> {
        let obs = manifest.obs().ok_or_else(|| ObsError::NoObs { location: storage.location("") })?;
        let k = obs.tiles_per_file.max(1) as usize;
        let shards = tile_cells.len().div_ceil(k);
        if tile_cells.len() > manifest.n_tiles() || shards > obs.shard_bytes.len() {
            let location = storage.location("");
            let reason = format!("the manifest lists {} obs shards, {shards} are needed", obs.shard_bytes.len());
            return Err(ObsError::Shard { location, reason });
        }
        let stored = super::read_schema(storage)?;
        let (schema, schema_bytes) = (stored.schema, stored.text.len() as u64);
        let results: Vec<Result<(Footer, u64), ObsError>> = obs.shard_bytes[..shards]
            .par_iter()
            .enumerate()
            .map(|(s, &size)| {
                let mut requests = 0;
                let footer = read_footer(storage, &format::obs_shard_key(s), size, &mut requests)?;
                Ok((footer, requests))
            })
            .collect();
        let mut footers = Vec::with_capacity(results.len());
        let mut requests = 1;
        for r in results {
            let (footer, n) = r?;
            footers.push(footer);
            requests += n;
        }
        Ok(ObsSource { storage, tile_cells, manifest, schema, footers, requests, schema_bytes })
    }

    /// What opening the obs costs, before any column: obs/schema.json and
    /// each shard's footer (requests, bytes).
    pub fn opening_cost(&self) -> (u64, u64) {
        (self.requests, self.schema_bytes + self.footers.iter().map(|f| f.tail.1.len() as u64).sum::<u64>())
    }

    /// The byte ranges of `column` in each shard: its chunk in the row group
    /// of every tile of `wanted`.
    fn column_ranges(&self, column: usize, wanted: &Range<usize>) -> Vec<Vec<Range<u64>>> {
        self.footers
            .iter()
            .enumerate()
            .map(|(s, footer)| {
                let first = self.tiles_of(s).start;
                self.wanted_of(s, wanted)
                    .filter_map(|t| footer.metadata.row_groups().get(t - first))
                    .map(|rg| {
                        let (start, len) = rg.column(column).byte_range();
                        start..start.saturating_add(len)
                    })
                    .collect()
            })
            .collect()
    }

    /// The tiles of `wanted` whose rows shard `s` holds.
    fn wanted_of(&self, s: usize, wanted: &Range<usize>) -> Range<usize> {
        let tiles = self.tiles_of(s);
        let start = tiles.start.max(wanted.start);
        start..tiles.end.min(wanted.end).max(start)
    }

    /// The requests and bytes a localize of `column` reads after opening: the
    /// column's chunks, merged as the storage merges nearby ranges.
    pub fn column_cost(&self, column: usize) -> (u64, u64) {
        self.cost_of(&self.column_ranges(column, &(0..self.tile_cells.len())))
    }

    /// The tiles whose rows shard `s` holds, of the version read as.
    fn tiles_of(&self, s: usize) -> Range<usize> {
        let k = self.manifest.obs_tiles_per_file.unwrap_or(1).max(1) as usize;
        (s * k).min(self.tile_cells.len())..((s + 1) * k).min(self.tile_cells.len())
    }

    fn cost_of(&self, ranges: &[Vec<Range<u64>>]) -> (u64, u64) {
        ranges.iter().map(|r| self.storage.read_cost(r)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// Every tile's values of `column`, read with ranged reads of its chunks
    /// only; with the requests and bytes that took.
    pub fn fetch_column(&self, column: usize) -> Result<(Vec<RecordBatch>, u64, u64), ObsError> {
        self.fetch_column_of(column, 0..self.tile_cells.len())
    }

    /// The values of `column` of the tiles `wanted` (one batch each), read
    /// with ranged reads of their chunks only; with the requests and bytes
    /// that took. Shards that hold none of them are not read.
    pub fn fetch_column_of(
        &self,
        column: usize,
        wanted: Range<usize>,
    ) -> Result<(Vec<RecordBatch>, u64, u64), ObsError> {
        let mut all = Vec::new();
        let (requests, bytes) = self.for_each_tile(column, wanted, |batch| {
            all.push(batch);
            Ok(())
        })?;
        Ok((all, requests, bytes))
    }

    /// Calls `each` with the values of `column` of every tile of `wanted`,
    /// in order, one tile decoded at a time (the column's compressed chunks
    /// fetched first: each shard's in one call, which the storage merges
    /// and issues concurrently, the shards in parallel); returns the
    /// requests and bytes that took. Shards that hold none of them are not
    /// read.
    pub fn for_each_tile(
        &self,
        column: usize,
        wanted: Range<usize>,
        mut each: impl FnMut(RecordBatch) -> Result<(), ObsError>,
    ) -> Result<(u64, u64), ObsError> {
        let ranges = self.column_ranges(column, &wanted);
        let (requests, bytes) = self.cost_of(&ranges);
        let fetched: Vec<Result<Option<FetchedShard>, ObsError>> = self
            .footers
            .par_iter()
            .zip(&ranges)
            .enumerate()
            .map(|(s, (footer, shard_ranges))| self.fetch_shard(s, footer, shard_ranges, column, &wanted))
            .collect();
        for shard in fetched {
            let Some(shard) = shard? else { continue };
            for t in shard.wanted.clone() {
                let i = t - shard.first_tile;
                let rows_stored = shard.meta.metadata().row_group(i).num_rows();
                let batch = read_row_group(shard.file.clone(), shard.meta.clone(), shard.mask.clone(), i, rows_stored)
                    .map_err(|source| ObsError::RowGroup { location: shard.location.clone(), row_group: i, source })?;
                // The tile's cells of the version read as come first.
                let rows = self.tile_cells[t] as usize;
                if batch.num_rows() < rows {
                    return Err(ObsError::Shard {
                        location: shard.location,
                        reason: format!("row group {i} has {} rows, tile {t} {rows} cells", batch.num_rows()),
                    });
                }
                each(batch.slice(0, rows))?;
            }
        }
        Ok((requests, bytes))
    }

    /// Shard `s`'s chunks of `column` in the row groups of the tiles of
    /// `wanted` it holds (None when it holds none), its row groups checked
    /// against its tiles.
    fn fetch_shard(
        &self,
        s: usize,
        footer: &Footer,
        shard_ranges: &[Range<u64>],
        column: usize,
        wanted: &Range<usize>,
    ) -> Result<Option<FetchedShard>, ObsError> {
        let wanted = self.wanted_of(s, wanted);
        if wanted.is_empty() {
            return Ok(None);
        }
        let key = format::obs_shard_key(s);
        let chunks = self
            .storage
            .get_ranges_of(&key, shard_ranges, footer.etag.as_deref())?
            .ok_or_else(|| ObsError::Missing { location: self.storage.location(&key) })?;
        let mut parts = vec![footer.tail.clone()];
        parts.extend(shard_ranges.iter().map(|r| r.start).zip(chunks));
        let file = SparseFile { len: footer.len, parts: Arc::new(parts) };
        let location = self.storage.location(&key);
        let meta = ArrowReaderMetadata::try_new(footer.metadata.clone(), ArrowReaderOptions::new())
            .map_err(|e| ObsError::Shard { location: location.clone(), reason: format!("footer: {e}") })?;
        let mask = ProjectionMask::roots(meta.parquet_schema(), [column]);
        let tiles = self.tiles_of(s);
        let groups = footer.metadata.row_groups();
        // One row group per tile; a later version's shard may hold more
        // tiles than the version read as.
        let later = self.manifest.n_tiles() > self.tile_cells.len();
        if groups.len() < tiles.len() || (!later && groups.len() != tiles.len()) {
            return Err(ObsError::Shard {
                location,
                reason: format!("{} row groups, expected {} (one per tile)", groups.len(), tiles.len()),
            });
        }
        Ok(Some(FetchedShard { file, meta, mask, location, wanted, first_tile: tiles.start }))
    }
}

/// One shard's chunks of a column, fetched, for [`ObsSource::for_each_tile`]
/// to decode a tile at a time.
struct FetchedShard {
    file: SparseFile,
    meta: ArrowReaderMetadata,
    mask: ProjectionMask,
    location: String,
    /// The tiles wanted of those the shard holds, the first of which is
    /// `first_tile` (its row group 0).
    wanted: Range<usize>,
    first_tile: usize,
}

/// Row group `i` of `file`, column(s) `mask`, as one batch.
fn read_row_group(
    file: SparseFile,
    meta: ArrowReaderMetadata,
    mask: ProjectionMask,
    i: usize,
    rows: i64,
) -> parquet::errors::Result<RecordBatch> {
    // (batches of at most 64 Ki rows whatever the footer claims, joined
    // after: a row count read from a file does not size a buffer)
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta)
        .with_row_groups(vec![i])
        .with_projection(mask)
        .with_batch_size(rows.clamp(1, 1 << 16) as usize)
        .build()?;
    let schema = reader.schema();
    let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>()?;
    Ok(arrow_select::concat::concat_batches(&schema, &batches)?)
}

/// A column's cache file being written: an uncompressed Arrow IPC file at
/// `path`, one record batch per tile as each arrives, through a temporary
/// file in the same folder renamed into place by [`IpcOut::finish`]
/// (dropped before, the temporary file goes with it).
struct IpcOut<'p> {
    path: &'p Path,
    column: &'p str,
    writer: Option<(arrow_ipc::writer::FileWriter<tempfile::NamedTempFile>, Arc<Schema>)>,
}

impl<'p> IpcOut<'p> {
    fn new(path: &'p Path, column: &'p str) -> Self {
        IpcOut { path, column, writer: None }
    }

    fn arrow(&self) -> impl Fn(arrow_schema::ArrowError) -> ObsError + '_ {
        |source| ObsError::Write { path: self.path.display().to_string(), source }
    }

    /// The writer, made for `field` (the column's, named `column`) if none is yet.
    fn writer(
        &mut self,
        field: Option<&Field>,
    ) -> Result<&mut (arrow_ipc::writer::FileWriter<tempfile::NamedTempFile>, Arc<Schema>), ObsError> {
        if self.writer.is_none() {
            let field = field.cloned().unwrap_or_else(|| Field::new(self.column, arrow_schema::DataType::Utf8, true));
            let schema = Arc::new(Schema::new(vec![field.with_name(self.column)]));
            let dir = self.path.parent().expect("cache files are in a folder");
            let tmp = crate::storage::temp_file_in(dir).map_err(cache_err(self.path))?;
            let writer = arrow_ipc::writer::FileWriter::try_new(tmp, &schema).map_err(self.arrow())?;
            self.writer = Some((writer, schema));
        }
        Ok(self.writer.as_mut().expect("made above"))
    }

    /// Writes the next tile's values.
    fn write(&mut self, batch: &RecordBatch) -> Result<(), ObsError> {
        let (writer, schema) = self.writer(Some(batch.schema().field(0)))?;
        let batch = RecordBatch::try_new(schema.clone(), batch.columns().to_vec());
        let written = batch.and_then(|b| writer.write(&b));
        written.map_err(self.arrow())
    }

    /// Finishes the file, syncs it, renames it into place and writes its
    /// checksum beside it.
    fn finish(mut self) -> Result<(), ObsError> {
        self.writer(None)?;
        let (writer, _) = self.writer.take().expect("made above");
        let tmp = writer.into_inner().map_err(self.arrow())?;
        let io = cache_err(self.path);
        tmp.as_file().sync_all().map_err(&io)?;
        let checksum = file_checksum(tmp.path()).map_err(&io)?;
        tmp.persist(self.path).map_err(|e| io(e.error))?;
        let dir = self.path.parent().expect("cache files are in a folder");
        let mut sum = crate::storage::temp_file_in(dir).map_err(&io)?;
        std::io::Write::write_all(&mut sum, checksum.as_bytes()).map_err(&io)?;
        sum.persist(checksum_path(self.path)).map_err(|e| io(e.error))?;
        Ok(())
    }
}

fn remove_stale_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".deltacells-") && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Localizes `columns` of the dataset into the cache under `root`.
///
/// A column already in the cache and valid ([`cached_file_is_valid`]) is not
/// fetched again, unless `force`.
pub fn localize(
    storage: &dyn Storage,
    manifest: &Manifest,
    columns: &[String],
    root: &Path,
    force: bool,
) -> Result<LocalizeReport, ObsError> {
    localize_as(storage, (manifest, manifest), columns, root, force)
}

/// [`localize`] of the version `versions.0` describes (its fingerprint, its
/// tiles' cells), from the shards of the version `versions.1` describes:
/// the same one, or a later one (see [`ObsSource::open_as`]).
pub(crate) fn localize_as(
    storage: &dyn Storage,
    versions: (&Manifest, &Manifest),
    columns: &[String],
    root: &Path,
    force: bool,
) -> Result<LocalizeReport, ObsError> {
    let (manifest, files) = versions;
    let started = Instant::now();
    let obs = manifest.obs().ok_or_else(|| ObsError::NoObs { location: storage.location("") })?;
    let dir = column_dir(root, obs.fingerprint);
    std::fs::create_dir_all(&dir).map_err(cache_err(&dir))?;
    let mut report = LocalizeReport { cache: dir.display().to_string(), ..Default::default() };
    let mut source: Option<ObsSource<'_>> = None;
    for name in columns {
        let lock_path = dir.join(".lock");
        let lock =
            File::options().create(true).truncate(false).write(true).open(&lock_path).map_err(cache_err(&lock_path))?;
        lock.lock().map_err(|source| ObsError::Lock { path: lock_path.display().to_string(), source })?;
        // Cache files are written only under the lock: a temporary file found
        // while holding it belongs to a process that died mid-write.
        remove_stale_temporaries(&dir);
        let path = column_path(root, obs.fingerprint, name);
        if path.exists() {
            if !force && cached_file_is_valid(&path, name, &manifest.tile_cells) {
                report.already_local.push(name.clone());
                continue;
            }
            std::fs::remove_file(&path).map_err(cache_err(&path))?;
            let _ = std::fs::remove_file(checksum_path(&path));
            report.replaced.push(name.clone());
        }
        let src = match &mut source {
            Some(src) => &*src,
            slot => &*slot.insert(ObsSource::open_as(storage, files, &manifest.tile_cells)?),
        };
        let index = src
            .schema
            .columns
            .iter()
            .position(|c| &c.name == name)
            .ok_or_else(|| ObsError::NoColumn { location: storage.location(""), column: name.clone() })?;
        // written as it is read, a tile at a time: a column of 100 million
        // cells is never in memory whole
        let mut out = IpcOut::new(&path, name);
        let (requests, bytes) = src.for_each_tile(index, 0..manifest.tile_cells.len(), |b| out.write(&b))?;
        out.finish()?;
        report.requests += requests;
        report.bytes += bytes;
        report.fetched.push(name.clone());
        drop(lock);
    }
    if let Some(src) = &source {
        let (requests, bytes) = src.opening_cost();
        report.requests += requests;
        report.bytes += bytes;
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}
