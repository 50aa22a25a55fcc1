//! Reading consecutive cells: a range's whole tiles decoded in parallel,
//! its partial edge tiles through the tile the last range ended in, so that a
//! pass in consecutive ranges fetches, checks and decompresses each tile once.

use std::ops::Range;

use rayon::prelude::*;

use crate::buffers::BufferPool;
use crate::format::{self, CsrFill, CsrMatrix};

use super::follow::Current;
use super::{Dataset, DatasetError};

/// The tile a range read ended in: its bytes, checked (CRC included) once,
/// and its chunks decompressed last, as planes. A pass over the cells in
/// consecutive ranges (an inference or export loop of `read_into` a `Selection::Range`) then
/// fetches and checks each tile once and decompresses each chunk once,
/// instead of once per range, and each range decodes its rows from the
/// planes straight into the output. Holds one compressed tile and at most
/// [`RECENT_CHUNKS`] chunks' planes (4 bytes per nonzero).
#[derive(Default)]
pub(super) struct Recent {
    /// The version (`follow.rs`) the tile is of.
    generation: u64,
    tile: Option<usize>,
    blob: bytes::Bytes,
    chunks: Vec<(usize, format::tile::ChunkPlanes)>,
}

/// Decoded chunks a [`Recent`] keeps.
const RECENT_CHUNKS: usize = 2;

/// Decoded tiles whose buffers a [`Dataset`] keeps for reuse.
pub(super) const KEPT_TILES: usize = 4;

/// A tile decoded into buffers of a pool, which get them back when it is dropped.
struct PooledTile<'a> {
    matrix: CsrMatrix,
    pool: &'a BufferPool,
}

impl std::borrow::Borrow<CsrMatrix> for PooledTile<'_> {
    fn borrow(&self) -> &CsrMatrix {
        &self.matrix
    }
}

impl Drop for PooledTile<'_> {
    fn drop(&mut self) {
        self.pool.give_matrix(std::mem::take(&mut self.matrix));
    }
}

impl Dataset {
    /// Cells `range` (a [`Selection::Range`]) into `out`, decoding the tiles
    /// it touches in parallel; of a tile it covers in part, only the chunks
    /// holding its cells are decoded.
    pub(super) fn range_into(&self, range: Range<u64>, out: &mut CsrMatrix) -> Result<(), DatasetError> {
        if range.end > self.n_cells() || range.start > range.end {
            let cell = range.end.max(range.start);
            return Err(DatasetError::CellOutOfRange { cell, n_cells: self.n_cells() });
        }
        if range.is_empty() {
            CsrFill::new(out, self.n_genes()).finish();
            return Ok(());
        }
        self.on_current(|current| self.read_range_of(current, range.clone(), out))
    }

    /// [`Dataset::range_into`] of a range that is not empty, from the
    /// tiles of `current`.
    fn read_range_of(&self, current: &Current, range: Range<u64>, out: &mut CsrMatrix) -> Result<(), DatasetError> {
        let mut fill = CsrFill::new(out, self.n_genes());
        let first = self.locate(range.start)?.0;
        let last = self.locate(range.end - 1)?.0;
        // The rows of tile t the range holds, and whether that is all of them.
        let span = |t: usize| {
            let cells = self.tile_cells(t);
            let rows = range.start.max(cells.start) - cells.start..range.end.min(cells.end) - cells.start;
            let whole = rows.start == 0 && rows.end == cells.end - cells.start;
            (rows, whole)
        };
        // A range's partial tiles (its first and last; the one tile of a
        // range within a tile) are read through the tile the last range ended
        // in, so that a pass in consecutive ranges decodes each chunk once;
        // the tiles between, whole, are decoded in parallel.
        let (first_rows, first_whole) = span(first);
        if !first_whole {
            self.read_rows_of_recent(current, first, first_rows, &mut fill)?;
            if first == last {
                fill.finish();
                return Ok(());
            }
        }
        let (last_rows, last_whole) = span(last);
        let whole = if first_whole { first } else { first + 1 }..if last_whole { last + 1 } else { last };
        let tiles: Vec<PooledTile<'_>> = whole
            .into_par_iter()
            .map(|t| {
                let mut tile = PooledTile { matrix: self.buffers.take_matrix(), pool: &self.buffers };
                self.read_tile_of(current, t, &mut tile.matrix)?;
                Ok::<_, DatasetError>(tile)
            })
            .collect::<Result<_, _>>()?;
        for tile in &tiles {
            fill.append(&tile.matrix);
        }
        if !last_whole {
            self.read_rows_of_recent(current, last, last_rows, &mut fill)?;
        }
        fill.finish();
        Ok(())
    }

    /// Appends rows `rows` of tile `tile` to `out`, through [`Recent`]: the
    /// tile's bytes are fetched and checked unless they are the recent
    /// tile's, and each chunk is decompressed unless it is one of the recent
    /// chunks.
    fn read_rows_of_recent(
        &self,
        current: &Current,
        tile: usize,
        rows: Range<u64>,
        out: &mut CsrFill<'_>,
    ) -> Result<(), DatasetError> {
        let generation = current.generation;
        let taken = {
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            (recent.tile == Some(tile) && recent.generation == generation)
                .then(|| (recent.blob.clone(), std::mem::take(&mut recent.chunks)))
        };
        let (blob, mut chunks, checked) = match taken {
            Some((blob, chunks)) => (blob, chunks, true),
            None => (self.tile_blob(current, tile)?.1, Vec::new(), false),
        };
        let expect = current.expectation(tile);
        let parsed = if checked {
            self.parse_tile_again_as(tile, &blob, &expect)?
        } else {
            format::ParsedTile::parse(&blob, Some(&expect)).map_err(|e| self.tile_error(tile, e))?
        };
        let spans: Vec<Range<u64>> = parsed.chunk_cells().collect();
        let mut used = Vec::new();
        for (c, cells) in spans.iter().enumerate() {
            let (lo, hi) = (rows.start.max(cells.start), rows.end.min(cells.end));
            if lo >= hi {
                continue;
            }
            let planes = match chunks.iter().position(|(k, _)| *k == c) {
                Some(at) => chunks.swap_remove(at).1,
                None => {
                    // (The buffers of a kept chunk this range does not need.)
                    let needless = |k: usize| spans[k].end <= rows.start || spans[k].start >= rows.end;
                    let spare = chunks.iter().position(|(k, _)| needless(*k));
                    let mut planes = spare.map(|at| chunks.swap_remove(at).1).unwrap_or_default();
                    parsed.decompress_planes(c, &mut planes).map_err(|e| self.tile_error(tile, e))?;
                    planes
                }
            };
            parsed.append_chunk_rows(c, &planes, lo..hi, out).map_err(|e| self.tile_error(tile, e))?;
            used.push((c, planes));
        }
        // The chunks used last are kept (the last one first to be found).
        let keep = used.len().saturating_sub(RECENT_CHUNKS);
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        *recent = Recent { generation, tile: Some(tile), blob, chunks: used.split_off(keep) };
        Ok(())
    }
}
