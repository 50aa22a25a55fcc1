//! The deltacells dataset format, version 2: tiles, manifest, gene order, obs schema
//! and fingerprint.
//!
//! This module owns the bytes of the specification and nothing else: it knows
//! nothing of HDF5, of where bytes are stored, of command lines or progress bars.
//! Every decoder here reads from `&[u8]` with bounds-checked helpers and returns a
//! typed error that names the rule it enforces; none of them panics on bad bytes
//! or allocates from a length it has not checked.

mod csr;
mod error;
pub mod fingerprint;
pub mod manifest;
pub mod npy;
pub mod obs_schema;
pub mod tile;
pub mod var_table;

pub use csr::{CsrFill, CsrMatrix};
pub use error::{EncodeError, Stream, TileError};
pub use manifest::{Manifest, ManifestError};
pub use tile::{decode_rows_into, decode_tile, decode_tile_into, ParsedTile, TileEncoder, TileExpectation, TileHeader};

/// Largest count a tile can hold, and the largest gene count (format.md, "Limits").
pub const MAX_COUNT: u32 = i32::MAX as u32;
/// Largest number of genes (format.md, header field n_genes: 1 .. 2^31).
pub const MAX_GENES: u64 = 1 << 31;

/// File name of tile `index` inside `tiles/` (decisions.md 11).
pub fn tile_key(index: usize) -> String {
    format!("tiles/tile_{index:06}.dct")
}

/// File name of obs shard `index` (decisions.md 11).
pub fn obs_shard_key(index: usize) -> String {
    format!("obs/obs_{index:04}.parquet")
}

pub const MANIFEST_KEY: &str = "manifest.json";
pub const GENE_ORDER_KEY: &str = "gene_order.npy";
pub const VAR_NAMES_KEY: &str = "var_names.txt";
pub const VAR_TABLE_KEY: &str = "var.parquet";
pub const OBS_SCHEMA_KEY: &str = "obs/schema.json";
