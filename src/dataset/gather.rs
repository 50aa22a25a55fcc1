//! Reading cells in any order (a random batch, a sampler's draw, an obs
//! query's cells) by reading only what they need: each touched tile's index
//! (header, chunk table, indptr: kept in the dataset's cache), then only the
//! touched chunks' streams, fetched for all tiles at once (positioned reads
//! of a local file; on a bucket, ranged requests, coalesced and concurrent),
//! decompressed in parallel and kept (decompressed, checked) in the
//! dataset's cache; then each cell written from its chunk's planes straight
//! into its place in the output.
//!
//! What is checked, since a tile read in ranges cannot have its CRC checked
//! (the CRC covers every byte of the tile): the index as a whole tile's is
//! (the header against the manifest and the object's size, the chunk table,
//! the indptr, every stream's place); each chunk's frames' declared and
//! actual sizes; every decoding rule over every nonzero of each chunk
//! decompressed. A local dataset also reads each tile whole, CRC included,
//! the first time a gather of this open dataset touches it (a tile found
//! damaged is refused, naming it); a dataset in a bucket is not read whole,
//! and relies there on the store's own checks of what it serves.
//!
//! A gather runs whole against one version of the dataset (`follow.rs`): a
//! tile's chunks are read pinned to the version its index was read from
//! (its entity tag, or a local file's identity), so that a tile a writer
//! replaced in between is an error that moves the gather to the new
//! version, never chunks of one version read by the index of another.

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use super::cache::PinnedIndex;
use super::follow::Current;
use crate::format::tile::{ChunkPlanes, IndexParse, ParsedTile, TileIndex};
use crate::format::{self, CsrMatrix};
use crate::storage::{PinnedRanges, PinnedRequest};

use super::{Dataset, DatasetError};

/// Streams of one tile closer than this are read in one piece.
const MERGE_GAP: u64 = 4 << 10;

/// The most planes a gather holds decompressed at once (beyond what the
/// cache keeps): its chunks are decompressed and written in windows of
/// about this many bytes (4 per nonzero), so that a batch touching
/// thousands of large chunks needs no more memory than this. It is below
/// [`KEPT_PLANE_BYTES`], so that the next window decompresses into the
/// planes of the last: with windows of 128 MiB, a batch from a million
/// cells at the default chunking faulted in 1.4 GB of fresh pages.
/// (In the tests, 4 KiB: their small datasets then take many windows.)
const WINDOW_BYTES: u64 = if cfg!(test) { 4 << 10 } else { 48 << 20 };

/// Decompressed chunks kept for reuse when the cache does not keep them: as
/// many as a batch of small chunks touches, within a budget of bytes. (With
/// 16 kept, a batch from a store of 1,024 chunks a tile allocated and freed
/// about a thousand planes; under perf, the page faults of the new ones and
/// the pages given back were each about 15% of its time.)
pub(super) const KEPT_PLANES: usize = 4096;

/// The most bytes of decompressed chunks kept for reuse (see [`KEPT_PLANES`]).
pub(super) const KEPT_PLANE_BYTES: u64 = 64 << 20;

/// What a gather reads of one tile: its place among the tiles needed, the
/// chunks to read (each with its place among the planes), and the byte
/// ranges that hold them.
type ChunkReads = (usize, Vec<(usize, usize)>, Vec<Range<u64>>);

impl Dataset {
    /// The listed cells (a [`Selection::List`]) into `out`, in the order
    /// given, repeats allowed (see the module documentation for what is
    /// read).
    pub(super) fn list_into(&self, cells: &[u64], out: &mut CsrMatrix) -> Result<(), DatasetError> {
        let located: Vec<(usize, u64)> = cells.iter().map(|&c| self.locate(c)).collect::<Result<_, _>>()?;
        self.on_current(|current| self.gather(current, &located, out))
    }

    /// [`Dataset::list_into`] of the cells `located` (tile, row),
    /// from the tiles of `current`.
    fn gather(&self, current: &Current, located: &[(usize, u64)], out: &mut CsrMatrix) -> Result<(), DatasetError> {
        let mut tiles: Vec<usize> = located.iter().map(|&(t, _)| t).collect();
        tiles.sort_unstable();
        tiles.dedup();
        let indexes = self.tile_indexes(current, &tiles)?;
        // Each cell's tile (its place in `tiles`) and chunk; the chunks
        // needed, in order.
        let mut placed = Vec::with_capacity(located.len());
        for &(tile, row) in located {
            let slot = tiles.binary_search(&tile).unwrap_or_default();
            let chunk = indexes[slot]
                .index
                .chunk_of_row(row)
                .ok_or_else(|| self.tile_error(tile, index_error(format!("row {row} is in no chunk of the tile"))))?;
            placed.push((slot, chunk, row));
        }
        let mut wanted: Vec<(usize, usize)> = placed.iter().map(|&(slot, chunk, _)| (slot, chunk)).collect();
        wanted.sort_unstable();
        wanted.dedup();
        // The output's rows, sized from the indexes before anything is
        // decompressed: every entry is written below, so old values may stay.
        out.n_cols = self.n_genes();
        out.indptr.clear();
        out.indptr.reserve(placed.len() + 1);
        out.indptr.push(0);
        let mut nnz = 0u64;
        for &(slot, _, row) in &placed {
            nnz += indexes[slot].index.row_nnz(row);
            out.indptr.push(nnz);
        }
        out.indices.resize(nnz as usize, 0);
        out.data.resize(nnz as usize, 0);
        // Each cell's slices of the output, taken by the window of chunks
        // that holds its chunk.
        let mut slices: Vec<Option<(&mut [u32], &mut [u32])>> = Vec::with_capacity(placed.len());
        let (mut rest_i, mut rest_d) = (out.indices.as_mut_slice(), out.data.as_mut_slice());
        for w in out.indptr.windows(2) {
            let n = (w[1] - w[0]) as usize;
            let (i, ri) = std::mem::take(&mut rest_i).split_at_mut(n);
            let (d, rd) = std::mem::take(&mut rest_d).split_at_mut(n);
            (rest_i, rest_d) = (ri, rd);
            slices.push(Some((i, d)));
        }
        let mut cells_of: Vec<Vec<usize>> = vec![Vec::new(); wanted.len()];
        for (cell, &(slot, chunk, _)) in placed.iter().enumerate() {
            let k = wanted.binary_search(&(slot, chunk)).unwrap_or_default();
            cells_of[k].push(cell);
        }
        // Windows of chunks, each decompressed whole (at most
        // WINDOW_BYTES of planes at once, the cache's aside), then their
        // cells written: memory stays bounded whatever the batch touches.
        let mut start = 0;
        while start < wanted.len() {
            let mut end = start;
            let mut bytes = 0u64;
            while end < wanted.len() && (end == start || bytes < WINDOW_BYTES) {
                let (slot, chunk) = wanted[end];
                bytes += 4 * indexes[slot].index.chunk_nnz(chunk);
                end += 1;
            }
            let planes = self.chunk_planes(current, &tiles, &indexes, &wanted[start..end])?;
            let mut jobs: Vec<(&ChunkPlanes, u64, &mut [u32], &mut [u32])> = Vec::new();
            for (k, chunk) in (start..end).zip(&planes) {
                for &cell in &cells_of[k] {
                    let (slot, c, row) = placed[cell];
                    let Some((i, d)) = slices[cell].take() else { continue };
                    // Planes and index come from the same bytes; a tile
                    // replaced between them is refused, never written from.
                    if !chunk.cells().contains(&row) || chunk.row_nnz(row) != i.len() {
                        let reason =
                            format!("chunk {c}: row {row} disagrees with the tile's index (the tile changed?)");
                        return Err(self.tile_error(tiles[slot], index_error(reason)));
                    }
                    jobs.push((&**chunk, row, i, d));
                }
            }
            write_rows(jobs);
            give_back(planes, self);
            start = end;
        }
        Ok(())
    }

    /// The indexes of `tiles`, from the cache or read now (for every tile
    /// not cached, at once).
    fn tile_indexes(&self, current: &Current, tiles: &[usize]) -> Result<Vec<Arc<PinnedIndex>>, DatasetError> {
        let generation = current.generation;
        let mut found: Vec<Option<Arc<PinnedIndex>>> = tiles.iter().map(|&t| self.cache.index(generation, t)).collect();
        let missing: Vec<usize> = (0..tiles.len()).filter(|&i| found[i].is_none()).collect();
        if missing.is_empty() {
            return Ok(found.into_iter().flatten().collect());
        }
        let read = if self.storage.is_local() {
            missing.par_iter().map(|&i| self.index_checked_whole(current, tiles[i])).collect::<Result<Vec<_>, _>>()?
        } else {
            self.indexes_from_prefixes(current, &missing.iter().map(|&i| tiles[i]).collect::<Vec<_>>(), &[])?
        };
        for (i, index) in missing.into_iter().zip(read) {
            self.cache.put_index(generation, tiles[i], index.clone());
            found[i] = Some(index);
        }
        Ok(found.into_iter().flatten().collect())
    }

    /// Tile `tile`'s index, from the whole tile, every check (CRC included)
    /// made, the first time this open dataset reads that version of its
    /// file; from its first bytes after. Either read is pinned to the
    /// version whose size was compared with the manifest.
    fn index_checked_whole(&self, current: &Current, tile: usize) -> Result<Arc<PinnedIndex>, DatasetError> {
        let key = format::tile_key(tile);
        let want = current.manifest.tile_bytes[tile];
        let location = || self.storage.location(&key);
        let Some(version) = self.storage.version(&key)? else {
            return Err(DatasetError::Missing { location: location(), what: format!("tile {tile}") });
        };
        if version.size != want {
            let message = format!("tile is {} bytes, the manifest says {want}", version.size);
            return Err(DatasetError::Invalid { location: location(), message });
        }
        // (a store that tells no versions apart: its size stands for one)
        let identity = version.etag.clone().unwrap_or_else(|| format!("{} bytes", version.size));
        // (a file a writer replaced is checked again, one it left alone is
        // not, whatever manifest is read)
        if self.checked.contains(tile, &identity) {
            return Ok(self.indexes_from_prefixes(current, &[tile], &[version.etag])?.remove(0));
        }
        let told = version.etag.is_some();
        let request = PinnedRequest { key, ranges: std::iter::once(0..want).collect(), etag: version.etag };
        let answer = self.storage.get_ranges_pinned(&[request]).pop().unwrap_or(Ok(None));
        let (mut parts, etag) = self.answer(current, tile, answer)?;
        let blob = parts.pop().unwrap_or_default();
        let parsed = format::ParsedTile::parse(&blob, Some(&current.expectation(tile)))
            .map_err(|source| self.tile_error(tile, source))?;
        self.checked.add_checked(tile, &identity, told);
        Ok(Arc::new(PinnedIndex { index: parsed.index().clone(), etag }))
    }

    /// The indexes of `tiles`, each read from its tile's first bytes (all at
    /// once; a tile whose index lies further in is read again, up to it).
    /// Each read is of the version `etags` names, where it names one.
    fn indexes_from_prefixes(
        &self,
        current: &Current,
        tiles: &[usize],
        etags: &[Option<String>],
    ) -> Result<Vec<Arc<PinnedIndex>>, DatasetError> {
        let m = &current.manifest;
        let mut want: Vec<u64> = tiles
            .iter()
            .map(|&t| {
                let guess = 64 + 96 * m.n_chunks.max(1) + 8 * (m.tile_cells[t] + 1);
                guess.min(m.tile_bytes[t])
            })
            .collect();
        let mut out: Vec<Option<Arc<PinnedIndex>>> = vec![None; tiles.len()];
        // Twice at most: the writers' layout needs one read; another layout
        // says in the first how much it needs.
        for _ in 0..2 {
            let pending: Vec<usize> = (0..tiles.len()).filter(|&i| out[i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let requests: Vec<PinnedRequest> = pending
                .iter()
                .map(|&i| PinnedRequest {
                    key: format::tile_key(tiles[i]),
                    ranges: std::iter::once(0..want[i]).collect(),
                    etag: etags.get(i).cloned().flatten(),
                })
                .collect();
            let answers = self.storage.get_ranges_pinned(&requests);
            for (&i, answer) in pending.iter().zip(answers) {
                let tile = tiles[i];
                let (mut parts, etag) = self.answer(current, tile, answer)?;
                let prefix = parts.swap_remove(0);
                let expect = current.expectation(tile);
                match TileIndex::parse_prefix(&prefix, m.tile_bytes[tile], Some(&expect))
                    .map_err(|e| self.tile_error(tile, e))?
                {
                    IndexParse::Ready(index) => out[i] = Some(Arc::new(PinnedIndex { index, etag })),
                    IndexParse::NeedPrefix(n) if n > want[i] => want[i] = n,
                    IndexParse::NeedPrefix(n) => {
                        return Err(self.tile_error(tile, index_error(format!("index needs {n} bytes"))))
                    }
                }
            }
        }
        out.into_iter()
            .zip(tiles)
            .map(|(index, &tile)| {
                index.ok_or_else(|| self.tile_error(tile, index_error("the index could not be read".into())))
            })
            .collect()
    }

    /// The bytes (and version) of an answer of `get_ranges_pinned` for tile
    /// `tile` of `current`.
    fn answer(
        &self,
        current: &Current,
        tile: usize,
        answer: PinnedRanges,
    ) -> Result<(Vec<bytes::Bytes>, Option<String>), DatasetError> {
        let location = self.storage.location(&format::tile_key(tile));
        match answer {
            Ok(Some((parts, etag))) if !parts.is_empty() => Ok((parts, etag)),
            Ok(Some(_)) => Err(DatasetError::Invalid { location, message: "no bytes were read".into() }),
            Ok(None) => Err(DatasetError::Missing { location, what: format!("tile {tile}") }),
            Err(crate::storage::StorageError::Range { size, .. }) => Err(DatasetError::Invalid {
                location,
                message: format!("tile is {size} bytes, the manifest says {}", current.manifest.tile_bytes[tile]),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// The planes of the chunks `wanted` ((place in `tiles`, chunk),
    /// sorted), in order: kept ones from the cache; the others read (every
    /// tile's at once), decompressed and checked in parallel, and put in the
    /// cache.
    fn chunk_planes(
        &self,
        current: &Current,
        tiles: &[usize],
        indexes: &[Arc<PinnedIndex>],
        wanted: &[(usize, usize)],
    ) -> Result<Vec<Arc<ChunkPlanes>>, DatasetError> {
        let generation = current.generation;
        let mut planes: Vec<Option<Arc<ChunkPlanes>>> =
            wanted.iter().map(|&(slot, c)| self.cache.chunk(generation, tiles[slot], c)).collect();
        // Per tile: the chunks to read (with their places), and the byte ranges holding them.
        let mut reads: Vec<ChunkReads> = Vec::new();
        for (at, &(slot, c)) in wanted.iter().enumerate() {
            if planes[at].is_some() {
                continue;
            }
            match reads.last_mut() {
                Some((s, missing, _)) if *s == slot => missing.push((at, c)),
                _ => reads.push((slot, vec![(at, c)], Vec::new())),
            }
        }
        for (slot, missing, ranges) in &mut reads {
            let spans = missing
                .iter()
                .map(|&(_, c)| indexes[*slot].index.chunk_span(c))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| self.tile_error(tiles[*slot], e))?;
            *ranges = crate::storage::merge_ranges(spans, MERGE_GAP);
        }
        let requests: Vec<PinnedRequest> = reads
            .iter()
            .map(|(slot, _, ranges)| PinnedRequest {
                key: format::tile_key(tiles[*slot]),
                ranges: ranges.clone(),
                etag: indexes[*slot].etag.clone(),
            })
            .collect();
        let answers = self.storage.get_ranges_pinned(&requests);
        let mut jobs = Vec::new();
        for ((slot, missing, ranges), answer) in reads.iter().zip(answers) {
            // (shared by the tile's chunks: one count, not one copy, each)
            let parts = Arc::new(self.answer(current, tiles[*slot], answer)?.0);
            for &(at, c) in missing {
                jobs.push((*slot, at, c, ranges, parts.clone()));
            }
        }
        let decoded: Vec<(usize, Arc<ChunkPlanes>)> = jobs
            .into_par_iter()
            .map(|(slot, at, c, ranges, parts)| {
                let (tile, index) = (tiles[slot], &indexes[slot].index);
                let err = |e| self.tile_error(tile, e);
                let span = index.chunk_span(c).map_err(err)?;
                // The piece that holds the chunk: the last to start at or
                // before it (merge_ranges keeps each span whole in one).
                let k = ranges.partition_point(|r| r.start <= span.start).saturating_sub(1);
                let Some((range, bytes)) = ranges.get(k).zip(parts.get(k)) else {
                    return Err(err(index_error(format!("chunk {c}: no bytes were read for it"))));
                };
                let parsed = ParsedTile::of_chunk(index, c, bytes, range.start).map_err(err)?;
                let mut chunk = self.planes.take();
                parsed.decode_planes(c, &mut chunk).map_err(err)?;
                let chunk = Arc::new(chunk);
                for evicted in self.cache.put_chunk(generation, tile, c, chunk.clone()) {
                    if let Ok(planes) = Arc::try_unwrap(evicted) {
                        self.planes.give(planes);
                    }
                }
                Ok((at, chunk))
            })
            .collect::<Result<_, DatasetError>>()?;
        for (at, chunk) in decoded {
            planes[at] = Some(chunk);
        }
        Ok(planes.into_iter().flatten().collect())
    }
}

/// A problem with a tile's index found by the gather itself.
fn index_error(reason: String) -> format::TileError {
    format::TileError::Layout { reason }
}

/// Writes each cell (a chunk's planes, a tile row in it, and the cell's
/// slices of the output) in parallel, each thread a run of cells.
fn write_rows(mut jobs: Vec<(&ChunkPlanes, u64, &mut [u32], &mut [u32])>) {
    let group = (jobs.len() / (4 * rayon::current_num_threads().max(1))).max(16);
    jobs.par_chunks_mut(group).for_each(|g| {
        for k in 0..g.len() {
            // The next cell's planes come from memory while this one is written.
            if let Some((planes, row, _, _)) = g.get(k + 1) {
                planes.prefetch_row(*row);
            }
            let (planes, row, i, d) = &mut g[k];
            planes.write_row_with(*row, i, d, false);
        }
    });
}

/// The planes not kept by the cache go back to the dataset's pool.
fn give_back(planes: Vec<Arc<ChunkPlanes>>, ds: &Dataset) {
    for p in planes {
        if let Ok(p) = Arc::try_unwrap(p) {
            ds.planes.give(p);
        }
    }
}
