//! Checking where everything in a tile is before anything is decoded: the
//! header against the manifest, the chunk table, the indptr, and every
//! stream's place (inside the blob, aligned, clear of the fixed parts).

use std::ops::Range;

use super::super::error::{Stream, TileError};
use super::header::{
    parse_header, parse_header_fields, ChunkEntry, StreamRef, TileHeader, CHUNK_ENTRY_LEN, HEADER_LEN,
};

/// What the manifest says a tile must hold. The header lies outside the CRC, so
/// a reader compares it with the manifest (decisions.md 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileExpectation {
    pub n_cells: u64,
    pub nnz: u64,
    pub n_genes: u32,
}

/// A tile whose header, chunk table, indptr and stream placement have been
/// checked, ready to decode.
pub(super) struct TileLayout<'a> {
    blob: &'a [u8],
    pub header: TileHeader,
    pub chunks: Vec<ChunkEntry>,
    pub indptr: Vec<u64>,
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
        Ok(TileLayout { blob, header, chunks, indptr })
    }

    pub fn stream(&self, r: StreamRef) -> &'a [u8] {
        // Placement was checked in `parse`.
        &self.blob[r.off as usize..(r.off + r.len) as usize]
    }
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
