//! One tile: a block of consecutive cells in CSR form, encoded as format.md's
//! "Tile layout" describes (64-byte header, chunk table, int64 indptr, and per
//! chunk a gaps, a vals and optional exception streams, each one zstd frame).
//!
//! The encoder follows the writer rules of decisions.md 2-6 exactly, so that its
//! output is a function of its input and settings only. The decoder accepts any
//! layout the specification allows (decisions.md 2, 3) and rejects everything it
//! forbids, without panicking and without allocating from an unchecked length.

//! The code is split by concern: [`header`] (the fixed parts, read and written
//! through one set of named offsets), `layout` (where everything is, checked),
//! `frames` (zstd), `kernels` (the inner loops), `decode`, `planes` (chunks
//! kept decompressed, written out cell by cell) and `encode`.

mod decode;
mod encode;
mod frames;
pub mod header;
mod kernels;
mod layout;
mod planes;

pub use decode::{decode_rows_into, decode_tile, decode_tile_into, ParsedTile};
pub use encode::{chunk_boundaries, exception_limit, TileEncoder};
pub use frames::compress_frame;
pub use header::{parse_header, TileHeader, CHUNK_ENTRY_LEN, HEADER_LEN, MAGIC, VERSION};
pub use layout::{stream_frames, IndexParse, TileExpectation, TileIndex};
pub use planes::{finish_rows, ChunkPlanes};

/// Streams hold uint16 values; larger gaps and counts are exceptions
/// (format.md, "Exceptions").
const STREAM_MAX: u32 = 65535;

#[cfg(test)]
mod tests;
