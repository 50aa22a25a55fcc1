//! Checking where everything in a tile is before anything is decoded: the
//! header against the manifest, the chunk table, the indptr, and every
//! stream's place (inside the blob, aligned, clear of the fixed parts).

use std::borrow::Cow;
use std::ops::Range;

use super::super::error::{Stream, TileError};
use super::header::{
    parse_header, parse_header_fields, parse_header_sized, ChunkEntry, StreamRef, TileHeader, CHUNK_ENTRY_LEN,
    HEADER_LEN,
};

/// What the manifest says a tile must hold. The header lies outside the CRC, so
/// a reader compares it with the manifest (decisions.md 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileExpectation {
    pub n_cells: u64,
    pub nnz: u64,
    pub n_genes: u32,
}

/// What a reader needs of a tile before it touches any stream: the header,
/// the chunk table and the indptr, each checked, and every stream's place
/// checked to lie inside the tile, aligned and clear of the fixed parts.
/// Owned, so that a reader can keep it and fetch a tile's chunks one at a
/// time (`TileIndex::parse_prefix` reads it from a tile's first bytes).
#[derive(Clone, Debug)]
pub struct TileIndex {
    pub(super) header: TileHeader,
    pub(super) chunks: Vec<ChunkEntry>,
    pub(super) indptr: Vec<u64>,
}

/// A tile's index with the bytes its streams are read from: the whole tile
/// (`base` 0), or a window of it that holds the streams of the chunks to be
/// decoded (`base` is the window's offset in the tile).
pub(super) struct TileLayout<'a> {
    index: Cow<'a, TileIndex>,
    bytes: &'a [u8],
    base: u64,
}

impl std::ops::Deref for TileLayout<'_> {
    type Target = TileIndex;
    fn deref(&self) -> &TileIndex {
        &self.index
    }
}

/// What [`TileIndex::parse_prefix`] found.
#[derive(Debug)]
pub enum IndexParse {
    /// The index, checked.
    Ready(TileIndex),
    /// The prefix given was too short: the index needs the tile's first
    /// this many bytes.
    NeedPrefix(u64),
}

fn layout_err(reason: impl Into<String>) -> TileError {
    TileError::Layout { reason: reason.into() }
}

impl<'a> TileLayout<'a> {
    pub fn parse(blob: &'a [u8], expect: Option<&TileExpectation>) -> Result<Self, TileError> {
        Self::parse_with(blob, expect, true)
    }

    /// [`TileLayout::parse`], checking the CRC only when `check_crc`: bytes
    /// whose CRC was checked before (by the same process, kept unchanged in
    /// memory) need not be hashed again.
    pub fn parse_with(blob: &'a [u8], expect: Option<&TileExpectation>, check_crc: bool) -> Result<Self, TileError> {
        let header = if check_crc { parse_header(blob)? } else { parse_header_fields(blob)? };
        let index = TileIndex::checked(blob, header, expect)?;
        Ok(TileLayout { index: Cow::Owned(index), bytes: blob, base: 0 })
    }

    /// Chunk `c` of a tile whose `index` was checked, with `bytes`, the
    /// tile's bytes from offset `base` on: they must hold every stream of
    /// the chunk (an error names the chunk otherwise).
    pub fn of_chunk(index: &'a TileIndex, c: usize, bytes: &'a [u8], base: u64) -> Result<Self, TileError> {
        let span = index.chunk_span(c)?;
        if span.start < base || span.end > base + bytes.len() as u64 {
            return Err(layout_err(format!(
                "chunk {c}: its streams at bytes {}..{} are not within the {} bytes read at offset {base}",
                span.start,
                span.end,
                bytes.len()
            )));
        }
        Ok(TileLayout { index: Cow::Borrowed(index), bytes, base })
    }

    pub fn stream(&self, r: StreamRef) -> &'a [u8] {
        // Placement was checked when the index was; a stream outside the
        // bytes held (another chunk's, in a window) reads as empty, which
        // every frame check refuses.
        let start = r.off.checked_sub(self.base).unwrap_or(u64::MAX);
        let end = start.saturating_add(r.len);
        usize::try_from(start)
            .ok()
            .zip(usize::try_from(end).ok())
            .and_then(|(s, e)| self.bytes.get(s..e))
            .unwrap_or(&[])
    }
}

impl TileIndex {
    /// Reads the index from a tile's first bytes, `prefix`, of a tile that is
    /// `size` bytes long (the manifest's `tile_bytes`), checked as a whole
    /// tile's is but for the CRC, which needs every byte: the header's
    /// fields against `expect` and `size`, the chunk table, the indptr, every
    /// stream's place. A tile written as the format's writers write it keeps
    /// its index in its first `64 + 96 * n_chunks + 8 * (n_cells + 1)` bytes.
    pub fn parse_prefix(prefix: &[u8], size: u64, expect: Option<&TileExpectation>) -> Result<IndexParse, TileError> {
        let header = parse_header_sized(prefix, size)?;
        let needed = index_end(&header);
        if (prefix.len() as u64) < needed {
            return Ok(IndexParse::NeedPrefix(needed));
        }
        Ok(IndexParse::Ready(TileIndex::checked(prefix, header, expect)?))
    }

    /// The tile rows of chunk `c`.
    pub fn chunk_rows(&self, c: usize) -> Range<u64> {
        self.chunks.get(c).map_or(0..0, |k| k.cell_lo..k.cell_hi)
    }

    /// The chunk holding tile row `row` (chunks with no cells hold none),
    /// or None past the last cell.
    pub fn chunk_of_row(&self, row: u64) -> Option<usize> {
        let c = self.chunks.partition_point(|k| k.cell_hi <= row);
        (c < self.chunks.len()).then_some(c)
    }

    /// The nonzeros of tile row `row` (0 past the last row).
    pub fn row_nnz(&self, row: u64) -> u64 {
        let r = row as usize;
        match (self.indptr.get(r), self.indptr.get(r + 1)) {
            (Some(a), Some(b)) => b - a,
            _ => 0,
        }
    }

    /// The nonzeros of chunk `c`.
    pub fn chunk_nnz(&self, c: usize) -> u64 {
        self.chunks.get(c).map_or(0, ChunkEntry::n)
    }

    /// The bytes from the first of chunk `c`'s streams to the end of its last
    /// (its gaps, vals and exception frames: adjacent, as writers lay them out).
    pub fn chunk_span(&self, c: usize) -> Result<Range<u64>, TileError> {
        let chunk = self.chunk(c)?;
        let streams = [chunk.gaps, chunk.vals, chunk.vexc, chunk.gexc];
        let placed = streams.iter().filter(|r| r.len > 0);
        let start = placed.clone().map(|r| r.off).min().unwrap_or(0);
        let end = placed.map(|r| r.off + r.len).max().unwrap_or(0);
        Ok(start..end.max(start))
    }

    /// Chunk `c`'s table entry, or the error that names a chunk the tile
    /// does not have.
    pub(super) fn chunk(&self, c: usize) -> Result<&ChunkEntry, TileError> {
        self.chunks.get(c).ok_or_else(|| TileError::ChunkTable {
            chunk: c as u64,
            reason: format!("no such chunk: the tile has {}", self.chunks.len()),
        })
    }

    /// Memory held, in bytes (for a cache's budget).
    pub fn heap_bytes(&self) -> u64 {
        (self.chunks.capacity() * std::mem::size_of::<ChunkEntry>() + self.indptr.capacity() * 8) as u64
    }

    /// Checks everything but the CRC of a tile whose header is `header`,
    /// reading the chunk table and indptr from `blob` (the tile's bytes from
    /// offset 0, at least up to the end of both).
    fn checked(blob: &[u8], header: TileHeader, expect: Option<&TileExpectation>) -> Result<TileIndex, TileError> {
        if let Some(expect) = expect {
            for (field, have, want) in [
                ("n_genes", u64::from(header.n_genes), u64::from(expect.n_genes)),
                ("n_cells", header.n_cells, expect.n_cells),
                ("nnz", header.nnz, expect.nnz),
            ] {
                if have != want {
                    return Err(TileError::HeaderMismatch { field, header: have, expected: want });
                }
            }
        }
        let total = header.total_size;
        let table_end = (header.n_chunks as u64)
            .checked_mul(CHUNK_ENTRY_LEN as u64)
            .and_then(|t| t.checked_add(HEADER_LEN as u64))
            .filter(|&end| end <= total)
            .ok_or_else(|| {
                layout_err(format!("chunk table of {} chunks does not fit in {total} bytes", header.n_chunks))
            })?;
        if !header.indptr_off.is_multiple_of(8) {
            return Err(layout_err(format!("indptr_off {} is not a multiple of 8", header.indptr_off)));
        }
        if header.indptr_off < table_end {
            return Err(layout_err(format!(
                "indptr_off {} is inside the chunk table, which ends at {table_end}",
                header.indptr_off
            )));
        }
        let indptr_end = header
            .n_cells
            .checked_add(1)
            .and_then(|n| n.checked_mul(8))
            .and_then(|n| n.checked_add(header.indptr_off))
            .filter(|&end| end <= total)
            .ok_or_else(|| {
                layout_err(format!(
                    "indptr of {} cells at offset {} does not fit in {total} bytes",
                    header.n_cells, header.indptr_off
                ))
            })?;
        let indptr = parse_indptr(&blob[header.indptr_off as usize..indptr_end as usize], header.nnz)?;
        let chunks = parse_chunk_table(blob, &header, &indptr)?;
        let forbidden = [0..table_end, header.indptr_off..indptr_end];
        for (c, chunk) in chunks.iter().enumerate() {
            for (stream, r, optional) in [
                (Stream::Gaps, chunk.gaps, false),
                (Stream::Vals, chunk.vals, false),
                (Stream::Vexc, chunk.vexc, true),
                (Stream::Gexc, chunk.gexc, true),
            ] {
                if optional && r.len == 0 {
                    continue;
                }
                check_stream_place(c as u64, stream, r, total, &forbidden)?;
            }
        }
        Ok(TileIndex { header, chunks, indptr })
    }
}

/// Where the chunk table and the indptr end, whichever is later, at most the
/// tile's size: a prefix that long lets [`TileIndex::checked`] check both
/// (and name what does not fit).
fn index_end(header: &TileHeader) -> u64 {
    let table_end = (header.n_chunks as u64) * CHUNK_ENTRY_LEN as u64 + HEADER_LEN as u64;
    let indptr_end = header.n_cells.saturating_add(1).saturating_mul(8).saturating_add(header.indptr_off);
    table_end.max(indptr_end).min(header.total_size)
}

fn parse_indptr(bytes: &[u8], nnz: u64) -> Result<Vec<u64>, TileError> {
    let mut indptr = Vec::with_capacity(bytes.len() / 8);
    let mut previous = 0i64;
    for (i, word) in bytes.chunks_exact(8).enumerate() {
        let v = i64::from_le_bytes(word.try_into().expect("8 bytes"));
        let err = |reason: String| TileError::Indptr { position: i as u64, reason };
        if i == 0 && v != 0 {
            return Err(err(format!("is {v}, expected 0")));
        }
        if v < previous {
            return Err(err(format!("{v} is below the previous entry {previous}")));
        }
        if v as u64 > nnz {
            return Err(err(format!("{v} is above the tile's nnz {nnz}")));
        }
        previous = v;
        indptr.push(v as u64);
    }
    let last = *indptr.last().expect("n_cells + 1 >= 1 entries");
    if last != nnz {
        return Err(TileError::Indptr {
            position: indptr.len() as u64 - 1,
            reason: format!("last entry is {last}, expected nnz {nnz}"),
        });
    }
    Ok(indptr)
}

fn parse_chunk_table(blob: &[u8], header: &TileHeader, indptr: &[u64]) -> Result<Vec<ChunkEntry>, TileError> {
    if header.n_cells == 0 && header.n_chunks != 0 {
        return Err(TileError::ChunkTable { chunk: 0, reason: "a tile with zero cells must have zero chunks".into() });
    }
    if header.n_cells > 0 && header.n_chunks == 0 {
        return Err(TileError::ChunkTable {
            chunk: 0,
            reason: "a tile with cells must have at least one chunk".into(),
        });
    }
    let mut chunks = Vec::with_capacity(header.n_chunks as usize);
    let (mut cell, mut nnz) = (0u64, 0u64);
    for c in 0..header.n_chunks as usize {
        // The table was checked to fit in the blob (TileLayout::parse).
        let entry = ChunkEntry::read(blob, c);
        let err = |reason: String| TileError::ChunkTable { chunk: c as u64, reason };
        if entry.cell_lo != cell || entry.nnz_lo != nnz {
            return Err(err(format!(
                "starts at cell {} / nonzero {}, but the previous chunk ended at cell {cell} / nonzero {nnz}",
                entry.cell_lo, entry.nnz_lo
            )));
        }
        if entry.cell_hi < entry.cell_lo || entry.cell_hi > header.n_cells {
            return Err(err(format!("cell_hi {} outside {}..{}", entry.cell_hi, entry.cell_lo, header.n_cells)));
        }
        for (name, at, value) in [("nnz_lo", entry.cell_lo, entry.nnz_lo), ("nnz_hi", entry.cell_hi, entry.nnz_hi)] {
            let want = indptr[at as usize];
            if value != want {
                return Err(err(format!("{name} is {value} but indptr[{at}] is {want}")));
            }
        }
        if entry.n() >= 1 << 32 {
            return Err(err(format!("{} nonzeros, 2^32 or more", entry.n())));
        }
        (cell, nnz) = (entry.cell_hi, entry.nnz_hi);
        chunks.push(entry);
    }
    if cell != header.n_cells || nnz != header.nnz {
        return Err(TileError::ChunkTable {
            chunk: header.n_chunks.saturating_sub(1) as u64,
            reason: format!(
                "chunks end at cell {cell} / nonzero {nnz}, but the tile has {} cells / {} nonzeros",
                header.n_cells, header.nnz
            ),
        });
    }
    Ok(chunks)
}

fn check_stream_place(
    chunk: u64,
    stream: Stream,
    r: StreamRef,
    total: u64,
    forbidden: &[Range<u64>],
) -> Result<(), TileError> {
    let err = |reason: String| TileError::Frame { chunk, stream, reason };
    if !r.off.is_multiple_of(8) {
        return Err(err(format!("offset {} is not 8-byte aligned", r.off)));
    }
    let end = r
        .off
        .checked_add(r.len)
        .filter(|&e| e <= total)
        .ok_or_else(|| err(format!("bytes {}..+{} run past the end of the tile ({total} bytes)", r.off, r.len)))?;
    for f in forbidden {
        if r.off < f.end && f.start < end && r.len > 0 {
            return Err(err(format!(
                "bytes {}..{end} overlap the header, chunk table or indptr ({}..{})",
                r.off, f.start, f.end
            )));
        }
    }
    Ok(())
}

/// Every compressed stream of a valid tile (gaps, vals and exception frames, in
/// chunk order), for tools and benchmarks that work on the frames themselves.
pub fn stream_frames(blob: &[u8]) -> Result<Vec<&[u8]>, TileError> {
    let layout = TileLayout::parse(blob, None)?;
    let mut frames = Vec::new();
    for chunk in &layout.chunks {
        for r in [chunk.gaps, chunk.vals, chunk.vexc, chunk.gexc] {
            if r.len > 0 {
                frames.push(layout.stream(r));
            }
        }
    }
    Ok(frames)
}
