//! Writing a dataset: tiles as they are encoded, optional files, and the
//! manifest last, so that a folder without manifest.json is never mistaken for
//! a complete dataset. Every object is written atomically by the storage layer.

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::format::{self, manifest, CsrMatrix, Manifest, TileEncoder};
use crate::storage::{Storage, StorageError};

/// The zstd level of an archive: the smallest tiles, at about 1/50 of the
/// speed of [`FAST_LEVEL`] when encoding (decoding is as fast); what
/// `compact` encodes at unless told.
pub const ARCHIVE_LEVEL: i32 = 19;

/// The zstd level a conversion encodes at unless told: the fastest, for about
/// 8% more bytes than [`ARCHIVE_LEVEL`] (docs/benchmarks/conversion.md, "The default level, chosen").
pub const FAST_LEVEL: i32 = 1;

/// Settings of the tile layout and encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteOptions {
    /// Cells per tile (every tile but the last).
    pub tile_size: u64,
    /// Chunks per tile: units of parallel decoding.
    pub n_chunks: usize,
    /// zstd level, 1 to 22.
    pub zstd_level: i32,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions { tile_size: 10_000, n_chunks: 8, zstd_level: FAST_LEVEL }
    }
}

/// What one written tile contributes to the manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TileRecord {
    pub cells: u64,
    pub nnz: u64,
    pub bytes: u64,
}

/// Writes tiles, then the manifest.
pub(crate) struct DatasetWriter<'a> {
    storage: &'a dyn Storage,
    options: WriteOptions,
    n_genes: u32,
    first_tile: usize,
    tiles: Vec<TileRecord>,
    tile_sha256: Vec<String>,
}

impl<'a> DatasetWriter<'a> {
    pub fn new(storage: &'a dyn Storage, options: WriteOptions, n_genes: u32) -> Self {
        Self::starting_at(storage, options, n_genes, 0)
    }

    /// A writer of tiles `first_tile..` (one shard of a conversion).
    pub fn starting_at(storage: &'a dyn Storage, options: WriteOptions, n_genes: u32, first_tile: usize) -> Self {
        DatasetWriter { storage, options, n_genes, first_tile, tiles: Vec::new(), tile_sha256: Vec::new() }
    }

    /// What has been written, tile by tile.
    #[cfg_attr(not(feature = "convert"), allow(dead_code))] // convert's shards use it
    pub fn tiles(&self) -> &[TileRecord] {
        &self.tiles
    }

    /// The SHA-256 (hex) of each tile written.
    #[cfg_attr(not(feature = "convert"), allow(dead_code))] // convert's shards use it
    pub fn tile_sha256(&self) -> &[String] {
        &self.tile_sha256
    }

    #[cfg_attr(not(feature = "convert"), allow(dead_code))] // convert's shards use it
    pub fn storage(&self) -> &'a dyn Storage {
        self.storage
    }

    /// Writes an encoded tile as tile number `index`; tiles must come in order.
    pub fn put_tile(&mut self, index: usize, blob: Vec<u8>, cells: u64, nnz: u64) -> Result<(), StorageError> {
        assert_eq!(index, self.first_tile + self.tiles.len(), "tiles are written in order");
        let bytes = blob.len() as u64;
        let sha256 = format::fingerprint::sha256_hex(&blob);
        self.storage.put(&format::tile_key(index), Bytes::from(blob))?;
        self.tiles.push(TileRecord { cells, nnz, bytes });
        self.tile_sha256.push(sha256);
        Ok(())
    }

    /// The manifest of what has been written so far.
    pub fn manifest(&self, flags: ManifestFlags, metadata: Map<String, Value>) -> Manifest {
        manifest_of(self.options, self.n_genes, &self.tiles, flags, metadata)
    }

    /// Writes manifest.json, last.
    pub fn finish(self, manifest: &Manifest) -> Result<(), StorageError> {
        self.storage.put(format::MANIFEST_KEY, Bytes::from(manifest.to_json()))
    }
}

/// The manifest of a dataset of `tiles`, without obs (the caller adds it).
pub(crate) fn manifest_of(
    options: WriteOptions,
    n_genes: u32,
    tiles: &[TileRecord],
    flags: ManifestFlags,
    metadata: Map<String, Value>,
) -> Manifest {
    Manifest {
        format: manifest::FORMAT_NAME.to_string(),
        version: manifest::FORMAT_VERSION,
        n_cells: tiles.iter().map(|t| t.cells).sum(),
        n_genes: n_genes.into(),
        tile_size: options.tile_size,
        tile_cells: tiles.iter().map(|t| t.cells).collect(),
        tile_nnz: tiles.iter().map(|t| t.nnz).collect(),
        tile_bytes: tiles.iter().map(|t| t.bytes).collect(),
        n_chunks: options.n_chunks as u64,
        zstd_level: options.zstd_level.into(),
        has_gene_order: flags.gene_order,
        has_var_names: flags.var_names,
        has_var_table: flags.var_table,
        has_obs: false,
        obs_tiles_per_file: None,
        obs_shard_bytes: None,
        obs_shard_sha256: None,
        obs_fingerprint: None,
        metadata,
    }
}

/// Which optional files a dataset has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ManifestFlags {
    pub gene_order: bool,
    pub var_names: bool,
    pub var_table: bool,
}

/// Why a dataset could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A block of cells that no tile can hold.
    #[error("encoding a tile")]
    Encode(#[from] crate::format::EncodeError),
    /// The storage refused a write.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Writes a whole in-memory matrix as a dataset (tiles and manifest only). For
/// tests, examples and benchmarks; `convert` streams instead.
pub fn write_matrix(storage: &dyn Storage, matrix: &CsrMatrix, options: WriteOptions) -> Result<Manifest, WriteError> {
    write_named_matrix(storage, matrix, options, None)
}

/// [`write_matrix`], with gene names (var_names.txt) when `names` has them,
/// one per column.
pub fn write_named_matrix(
    storage: &dyn Storage,
    matrix: &CsrMatrix,
    options: WriteOptions,
    names: Option<&[String]>,
) -> Result<Manifest, WriteError> {
    let encoder = TileEncoder::new(options.n_chunks, options.zstd_level);
    let mut writer = DatasetWriter::new(storage, options, matrix.n_cols);
    let n = matrix.n_rows() as u64;
    let mut start = 0u64;
    while start < n {
        let end = (start + options.tile_size).min(n);
        let mut block = CsrMatrix::empty(matrix.n_cols);
        for r in start..end {
            block.push_row_from(matrix, r as usize);
        }
        let blob = encoder.encode(&block)?;
        let index = writer.first_tile + writer.tiles.len();
        writer.put_tile(index, blob, end - start, block.nnz() as u64)?;
        start = end;
    }
    let mut flags = ManifestFlags::default();
    if let Some(names) = names {
        let text: String = names.iter().map(|n| format!("{n}\n")).collect();
        storage.put(crate::format::VAR_NAMES_KEY, bytes::Bytes::from(text))?;
        flags.var_names = true;
    }
    let manifest = writer.manifest(flags, Map::new());
    writer.finish(&manifest)?;
    Ok(manifest)
}
