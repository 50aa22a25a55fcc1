//! Reading a dataset: the manifest, then cells by tile, by range or by list.
//!
//! This file owns the open dataset and its tiles' bytes; the ways of reading
//! cells have files of their own: `ranges` (consecutive cells), `gather`
//! (cells in any order, reading only the chunks they are in) with the caches
//! it keeps in `cache`, and `files` (the manifest and the gene files).
//! It knows nothing of the loader, which streams whole tiles.

mod cache;
mod checked;
mod error;
mod files;
mod follow;
mod gather;
mod ranges;
mod read;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rayon::prelude::*;

use crate::buffers::BufferPool;
use crate::format::{self, CsrMatrix, Manifest, TileError, TileExpectation};
use crate::storage::{self, Storage};

pub use cache::{ReadOptions, DEFAULT_CACHE_BYTES, DEFAULT_WRITER_WAIT};
pub(crate) use checked::CheckedRecord;
pub use error::DatasetError;
use files::read_manifest_bytes;
pub(crate) use files::{cumulative, no_manifest, parse_var_names};
pub use files::{read_manifest, VarNamesError};
#[cfg(feature = "convert")]
pub(crate) use files::{APPEND_KEY, PLAN_KEY};
use follow::{keep_rows, Current};
use ranges::{Recent, KEPT_TILES};
pub use read::Selection;

/// An open dataset: the version of it read at open (its cells, genes and
/// obs), whose cells are read on from later versions while writers append
/// to it or compact it (see `follow.rs` and docs/guarantees.md).
///
/// ```no_run
/// use deltacells::{Dataset, Selection};
///
/// let ds = Dataset::open("out/pbmc")?;
/// println!("{} cells x {} genes in {} tiles", ds.n_cells(), ds.n_genes(), ds.n_tiles());
/// let first = ds.read(Selection::Tile(0))?; // one tile as CSR
/// let some = ds.read(Selection::Range(100..200))?; // a range of cells
/// let picked = ds.read(Selection::List(&[7, 3, 7]))?; // any cells, in the order given
/// assert_eq!(picked.n_rows(), 3);
/// # Ok::<(), deltacells::DatasetError>(())
/// ```
pub struct Dataset {
    storage: Arc<dyn Storage>,
    manifest: Manifest,
    /// SHA-256 of manifest.json's bytes, in hex: what a collection records
    /// to notice a dataset that changed.
    manifest_sha256: String,
    /// manifest.json's bytes, as read at open.
    manifest_bytes: bytes::Bytes,
    /// limits[i] = first cell after tile i (cumulative tile_cells).
    limits: Vec<u64>,
    /// The buffers of tiles decoded for a range or list of cells, kept for
    /// the next read (up to [`KEPT_TILES`] tiles' worth).
    buffers: BufferPool,
    /// What gathers keep: tiles' indexes and decompressed chunks.
    cache: cache::GatherCache,
    /// The tiles whose CRC this process, or (remembered) another on this
    /// machine, checked.
    checked: checked::CheckedRecord,
    /// Chunks' planes the cache did not keep, for the next gather (their
    /// buffers written over, not zeroed and faulted in again).
    planes: crate::buffers::Pool<format::tile::ChunkPlanes>,
    /// The tile the last range read ended in, for the next range.
    recent: std::sync::Mutex<Recent>,
    /// The version whose tiles reads go to: the one opened, or a later one.
    current: RwLock<Arc<Current>>,
    /// How long a read waits for a writer that is committing a new version.
    writer_wait: Duration,
}

impl Dataset {
    /// Opens the dataset at `root`, a local folder (or `file://` URL), and checks
    /// its manifest.
    pub fn open(root: &str) -> Result<Dataset, DatasetError> {
        Dataset::from_storage(storage::open(root)?)
    }

    /// Opens a dataset in any storage backend, with the default
    /// [`ReadOptions`].
    pub fn from_storage(storage: Arc<dyn Storage>) -> Result<Dataset, DatasetError> {
        Dataset::from_storage_with(storage, &ReadOptions::default())
    }

    /// Opens a dataset in any storage backend, reading as `options` say.
    pub fn from_storage_with(storage: Arc<dyn Storage>, options: &ReadOptions) -> Result<Dataset, DatasetError> {
        let (manifest, bytes) = read_manifest_bytes(storage.as_ref())?;
        Ok(Dataset::with_manifest(storage, options, manifest, bytes))
    }

    /// Opens the dataset in `storage` as the version whose manifest.json is
    /// `version` (the bytes [`Dataset::manifest_bytes`] gave, in another
    /// process): its cells, read from the tiles of the version in place now
    /// when that is a later version of it (see [`Dataset::manifest`]).
    /// Refused when the dataset in place is not that version or a later one.
    pub fn from_storage_as(
        storage: Arc<dyn Storage>,
        options: &ReadOptions,
        version: &[u8],
    ) -> Result<Dataset, DatasetError> {
        let location = storage.location(format::MANIFEST_KEY);
        let manifest =
            Manifest::parse_checked(version).map_err(|source| DatasetError::Manifest { location, source })?;
        let dataset = Dataset::with_manifest(storage, options, manifest, bytes::Bytes::copy_from_slice(version));
        dataset.follow_at_open()?;
        Ok(dataset)
    }

    fn with_manifest(
        storage: Arc<dyn Storage>,
        options: &ReadOptions,
        manifest: Manifest,
        bytes: bytes::Bytes,
    ) -> Dataset {
        let limits = cumulative(&manifest.tile_cells);
        let manifest_sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        let current = RwLock::new(Arc::new(Current::new(manifest.clone(), manifest_sha256.clone())));
        let checked = checked::CheckedRecord::new(storage.as_ref(), options);
        Dataset {
            storage,
            manifest,
            manifest_sha256,
            manifest_bytes: bytes,
            limits,
            buffers: BufferPool::new(2 * KEPT_TILES),
            cache: cache::GatherCache::new(options),
            checked,
            planes: crate::buffers::Pool::within(gather::KEPT_PLANES, gather::KEPT_PLANE_BYTES),
            recent: std::sync::Mutex::new(Recent::default()),
            current,
            writer_wait: options.writer_wait,
        }
    }

    /// manifest.json's bytes as read at open: the version this open
    /// dataset shows (for [`Dataset::from_storage_as`]).
    pub fn manifest_bytes(&self) -> &bytes::Bytes {
        &self.manifest_bytes
    }

    /// SHA-256 of manifest.json as read at open, in hex: it changes whenever
    /// the dataset does (an append, a compaction, a new conversion), since
    /// the manifest lists every tile's size.
    pub fn manifest_sha256(&self) -> &str {
        &self.manifest_sha256
    }

    /// How many later versions of the dataset (each a writer's change: an
    /// append, a finalize, a compaction) its reads have moved to since it
    /// was opened; 0 while they read the version opened.
    pub fn versions_followed(&self) -> u64 {
        self.current().generation
    }

    /// Bytes of decompressed chunks that gathers keep now (at most the
    /// [`ReadOptions::cache_bytes`] the dataset was opened with).
    pub fn cached_chunk_bytes(&self) -> u64 {
        self.cache.chunk_bytes()
    }

    /// Sets the budget of decompressed chunks that gathers keep (see
    /// [`ReadOptions::cache_bytes`]); what no longer fits is dropped.
    pub fn set_cache_bytes(&self, bytes: u64) {
        self.cache.set_chunk_budget(bytes);
    }

    /// The checked manifest, as read at open: the version this open
    /// dataset shows, even once its tiles are read from a later one.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Where the dataset's bytes are.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The first cell after each tile (cumulative cells per tile).
    pub fn tile_limits(&self) -> &[u64] {
        &self.limits
    }

    /// Cells (rows) of the matrix.
    pub fn n_cells(&self) -> u64 {
        self.manifest.n_cells
    }

    /// Genes (columns) of the matrix.
    pub fn n_genes(&self) -> u32 {
        self.manifest.n_genes as u32
    }

    /// Tiles, of `manifest().tile_size` cells each but the last.
    pub fn n_tiles(&self) -> usize {
        self.manifest.n_tiles()
    }

    /// The cells of tile `tile`.
    pub fn tile_cells(&self, tile: usize) -> Range<u64> {
        let start = if tile == 0 { 0 } else { self.limits[tile - 1] };
        start..self.limits[tile]
    }

    /// Signed cell indices (NumPy's int64) as cells of this dataset, each
    /// checked to be from 0 to `n_cells() - 1`; the first that is not is the
    /// error.
    pub fn checked_cells(&self, cells: &[i64]) -> Result<Vec<u64>, DatasetError> {
        let n_cells = self.n_cells();
        cells
            .iter()
            .map(|&cell| match u64::try_from(cell) {
                Ok(c) if c < n_cells => Ok(c),
                Ok(c) => Err(DatasetError::CellOutOfRange { cell: c, n_cells }),
                Err(_) => Err(DatasetError::NegativeCell { cell, n_cells }),
            })
            .collect()
    }

    /// The tile holding global cell `cell`, and its row in that tile.
    pub fn locate(&self, cell: u64) -> Result<(usize, u64), DatasetError> {
        if cell >= self.n_cells() {
            return Err(DatasetError::CellOutOfRange { cell, n_cells: self.n_cells() });
        }
        let tile = self.limits.partition_point(|&l| l <= cell);
        Ok((tile, cell - self.tile_cells(tile).start))
    }

    /// What the manifest of the version read now says tile `tile` holds
    /// (a later version's last tile may hold more cells than the opened
    /// version's: the opened version's come first).
    pub fn tile_expectation(&self, tile: usize) -> TileExpectation {
        self.current().expectation(tile)
    }

    /// Tile `tile`'s cells (a [`Selection::Tile`]), decoded into `out`,
    /// checked against the manifest.
    fn tile_into(&self, tile: usize, out: &mut CsrMatrix) -> Result<(), DatasetError> {
        self.check_tile(tile)?;
        self.on_current(|current| self.read_tile_of(current, tile, out))
    }

    /// The opened version's rows of tile `tile`, from `current`'s tile.
    fn read_tile_of(&self, current: &Current, tile: usize, out: &mut CsrMatrix) -> Result<(), DatasetError> {
        let (location, blob) = self.tile_blob(current, tile)?;
        format::decode_tile_into(&blob, Some(&current.expectation(tile)), out)
            .map_err(|source| DatasetError::Tile { location, tile, source })?;
        keep_rows(out, self.manifest.tile_cells[tile]);
        Ok(())
    }

    /// The bytes of tile `tile`, checked to be the size the manifest of the
    /// version read now says, not yet decoded: with [`Dataset::parse_tile`],
    /// for readers that fetch ahead and decode later.
    pub fn fetch_tile(&self, tile: usize) -> Result<bytes::Bytes, DatasetError> {
        self.check_tile(tile)?;
        self.on_current(|current| Ok(self.tile_blob(current, tile)?.1))
    }

    /// The bytes of tile `tile`, every check made (header, CRC, chunk
    /// table, against the manifest of the version they are of), and what
    /// that manifest says of the tile, for
    /// [`Dataset::parse_tile_again_as`]: a reader that fetches ahead and
    /// decodes later, whatever version it decodes by then.
    pub fn fetch_checked_tile(&self, tile: usize) -> Result<(bytes::Bytes, TileExpectation), DatasetError> {
        self.check_tile(tile)?;
        self.on_current(|current| {
            let before = self.checked.version(self.storage.as_ref(), tile);
            let blob = self.tile_blob(current, tile)?.1;
            let expect = current.expectation(tile);
            format::ParsedTile::parse(&blob, Some(&expect)).map_err(|source| self.tile_error(tile, source))?;
            self.checked.add_if_unchanged(self.storage.as_ref(), tile, before);
            Ok((blob, expect))
        })
    }

    /// Checks tile `tile`'s bytes (header, CRC, chunk table, against the
    /// manifest of the version read now) once, for decoding its chunks one
    /// by one.
    pub fn parse_tile<'a>(&self, tile: usize, blob: &'a [u8]) -> Result<format::ParsedTile<'a>, DatasetError> {
        format::ParsedTile::parse(blob, Some(&self.tile_expectation(tile)))
            .map_err(|source| self.tile_error(tile, source))
    }

    /// [`Dataset::parse_tile`] again, for bytes that passed it before and
    /// were kept unchanged since (every check but the CRC; see
    /// [`format::ParsedTile::parse_again`]).
    pub fn parse_tile_again<'a>(&self, tile: usize, blob: &'a [u8]) -> Result<format::ParsedTile<'a>, DatasetError> {
        self.parse_tile_again_as(tile, blob, &self.tile_expectation(tile))
    }

    /// [`Dataset::parse_tile_again`] against `expect`, what
    /// [`Dataset::fetch_checked_tile`] gave with the bytes.
    pub fn parse_tile_again_as<'a>(
        &self,
        tile: usize,
        blob: &'a [u8],
        expect: &TileExpectation,
    ) -> Result<format::ParsedTile<'a>, DatasetError> {
        format::ParsedTile::parse_again(blob, Some(expect)).map_err(|source| self.tile_error(tile, source))
    }

    /// A tile's decoding error, naming the tile's file.
    pub fn tile_error(&self, tile: usize, source: TileError) -> DatasetError {
        DatasetError::Tile { location: self.storage.location(&format::tile_key(tile)), tile, source }
    }

    /// Refuses a tile the opened version does not have.
    fn check_tile(&self, tile: usize) -> Result<(), DatasetError> {
        if tile >= self.n_tiles() {
            return Err(DatasetError::NoTile {
                location: self.storage.location(&format::tile_key(tile)),
                n_tiles: self.n_tiles(),
            });
        }
        Ok(())
    }

    /// The bytes of tile `tile` (one the opened version has), checked to be
    /// the size the manifest of `current` says.
    fn tile_blob(&self, current: &Current, tile: usize) -> Result<(String, bytes::Bytes), DatasetError> {
        let key = format::tile_key(tile);
        let location = self.storage.location(&key);
        let blob = self
            .storage
            .get(&key)?
            .ok_or_else(|| DatasetError::Missing { location: location.clone(), what: format!("tile {tile}") })?;
        let want = current.manifest.tile_bytes[tile];
        if blob.len() as u64 != want {
            return Err(DatasetError::Invalid {
                location,
                message: format!("tile is {} bytes, the manifest says {want}", blob.len()),
            });
        }
        Ok((location, blob))
    }

    /// The nonzeros of each stored column over every cell: every tile is
    /// read and decoded (in parallel, a few at a time), none kept.
    pub fn column_nonzeros(&self) -> Result<Vec<u64>, DatasetError> {
        let n = self.n_genes() as usize;
        let tiles: Vec<usize> = (0..self.n_tiles()).collect();
        let mut total = vec![0u64; n];
        for group in tiles.chunks(rayon::current_num_threads().max(1) * 2) {
            let counts = group
                .par_iter()
                .map(|&t| {
                    let m = self.read(Selection::Tile(t))?;
                    let mut counts = vec![0u64; n];
                    for &g in &m.indices {
                        if let Some(c) = counts.get_mut(g as usize) {
                            *c += 1;
                        }
                    }
                    Ok(counts)
                })
                .collect::<Result<Vec<_>, DatasetError>>()?;
            for c in counts {
                total.iter_mut().zip(c).for_each(|(t, c)| *t += c);
            }
        }
        Ok(total)
    }
}
