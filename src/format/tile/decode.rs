//! Decoding a tile whose layout was checked: every frame's declared size
//! before any output is sized, then the chunks in parallel, each straight into
//! its own slice of the output, with every reader rule checked on the way.

use std::cell::RefCell;

use rayon::prelude::*;

use super::super::error::{Stream, TileError};
use super::super::{CsrFill, CsrMatrix};
use super::frames::{decompress_exact, frame_content_size};
use super::header::{u32_at, ChunkEntry};
use super::kernels::{recombine_counts, select_gaps_kernel, store_fence};
use super::layout::{TileExpectation, TileIndex, TileLayout};
use super::STREAM_MAX;

thread_local! {
    static SCRATCH: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Decodes a whole tile, checking every rule of format.md and decisions.md that a
/// reader can check. Chunks are decoded in parallel, each straight into its own
/// slice of the output.
///
/// `expect`, when given, is what the manifest says of this tile.
pub fn decode_tile(blob: &[u8], expect: Option<&TileExpectation>) -> Result<CsrMatrix, TileError> {
    let mut out = CsrMatrix::default();
    decode_tile_into(blob, expect, &mut out)?;
    Ok(out)
}

/// Like [`decode_tile`], but reuses `out`'s buffers, so that a loop over tiles
/// allocates (and the kernel zeroes) nothing once they are large enough. On
/// error, `out` holds unspecified data.
pub fn decode_tile_into(blob: &[u8], expect: Option<&TileExpectation>, out: &mut CsrMatrix) -> Result<(), TileError> {
    ParsedTile::parse(blob, expect)?.decode_sorted_rows_into(None, out)
}

/// Decodes only the chunks of a tile that hold one of `rows` (rows of the
/// tile, in any order): a batch that needs a few cells of a tile decompresses
/// only their chunks. The output has every row of the tile, and the rows of
/// the chunks not decoded are empty: read only `rows` from it.
///
/// What the bytes read must satisfy is checked as by [`decode_tile_into`]:
/// the header, CRC, chunk table, indptr and every frame's declared size for the
/// whole tile, and every decoding rule for the chunks decoded.
pub fn decode_rows_into(
    blob: &[u8],
    expect: Option<&TileExpectation>,
    rows: &[u64],
    out: &mut CsrMatrix,
) -> Result<(), TileError> {
    ParsedTile::parse(blob, expect)?.decode_rows_into(rows, out)
}

/// A tile whose header, CRC, chunk table, indptr and frame sizes were checked,
/// ready to decode any of its chunks: a reader that decodes a tile's chunks at
/// different times checks the whole tile only once.
pub struct ParsedTile<'a> {
    layout: TileLayout<'a>,
}

impl<'a> ParsedTile<'a> {
    /// Checks `blob` as [`decode_tile_into`] does before it decodes.
    pub fn parse(blob: &'a [u8], expect: Option<&TileExpectation>) -> Result<Self, TileError> {
        Self::parse_with(blob, expect, true)
    }

    /// [`ParsedTile::parse`] of bytes that passed it before and have been
    /// kept unchanged in memory since: every check again but the CRC (the
    /// only one whose cost grows with the whole tile). A reader that keeps a
    /// tile's bytes while it decodes the chunks one at a time parses it
    /// again this way for each, instead of keeping a borrow of the bytes.
    pub fn parse_again(blob: &'a [u8], expect: Option<&TileExpectation>) -> Result<Self, TileError> {
        Self::parse_with(blob, expect, false)
    }

    fn parse_with(blob: &'a [u8], expect: Option<&TileExpectation>, check_crc: bool) -> Result<Self, TileError> {
        let layout = TileLayout::parse_with(blob, expect, check_crc)?;
        // Every frame's declared size is checked before the output is sized, so a
        // lying header cannot make us allocate more than the frames would produce.
        for c in 0..layout.chunks.len() {
            check_frame_sizes(&layout, c)?;
        }
        Ok(ParsedTile { layout })
    }

    /// Chunk `c` alone of a tile whose index was read and checked apart
    /// ([`TileIndex::parse_prefix`]), from `bytes`, the tile's bytes from
    /// offset `base` on, which must hold the chunk's streams
    /// ([`TileIndex::chunk_span`]): its frames' declared sizes are checked
    /// here, and every decoding rule when it is decoded. The tile's CRC,
    /// which covers every byte, is not: see docs/guarantees.md. Only chunk
    /// `c` can be decoded from it.
    pub fn of_chunk(index: &'a TileIndex, c: usize, bytes: &'a [u8], base: u64) -> Result<Self, TileError> {
        let layout = TileLayout::of_chunk(index, c, bytes, base)?;
        check_frame_sizes(&layout, c)?;
        Ok(ParsedTile { layout })
    }

    /// The tile's index (header, chunk table, indptr), checked.
    pub fn index(&self) -> &TileIndex {
        &self.layout
    }

    pub(super) fn layout(&self) -> &TileLayout<'a> {
        &self.layout
    }

    /// The cells of each chunk, in order.
    pub fn chunk_cells(&self) -> impl Iterator<Item = std::ops::Range<u64>> + '_ {
        self.layout.chunks.iter().map(|c| c.cell_lo..c.cell_hi)
    }

    /// Like [`decode_rows_into`]: decodes only the chunks holding one of
    /// `rows` (rows of the tile, in any order); the other rows are empty.
    pub fn decode_rows_into(&self, rows: &[u64], out: &mut CsrMatrix) -> Result<(), TileError> {
        let mut sorted = rows.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        self.decode_sorted_rows_into(Some(&sorted), out)
    }

    /// Decodes the chunks holding one of `rows` (sorted), or all of them.
    fn decode_sorted_rows_into(&self, rows: Option<&[u64]>, out: &mut CsrMatrix) -> Result<(), TileError> {
        let layout = &self.layout;
        let wanted: Vec<bool> = layout
            .chunks
            .iter()
            .map(|chunk| {
                rows.is_none_or(|rows| {
                    let first = rows.partition_point(|&r| r < chunk.cell_lo);
                    rows.get(first).is_some_and(|&r| r < chunk.cell_hi)
                })
            })
            .collect();
        let nnz: u64 = layout.chunks.iter().zip(&wanted).filter(|(_, &w)| w).map(|(c, _)| c.n()).sum();
        // Every entry is overwritten by its chunk, so stale values may stay.
        out.indices.resize(nnz as usize, 0);
        out.data.resize(nnz as usize, 0);
        let mut jobs = Vec::with_capacity(layout.chunks.len());
        let (mut rest_i, mut rest_d) = (out.indices.as_mut_slice(), out.data.as_mut_slice());
        for ((c, chunk), _) in layout.chunks.iter().enumerate().zip(&wanted).filter(|(_, &w)| w) {
            let (i, ri) = rest_i.split_at_mut(chunk.n() as usize);
            let (d, rd) = rest_d.split_at_mut(chunk.n() as usize);
            (rest_i, rest_d) = (ri, rd);
            jobs.push((c, chunk, i, d));
        }
        jobs.into_par_iter().try_for_each(|(c, chunk, i, d)| decode_chunk(layout, c as u64, chunk, i, d))?;
        out.n_cols = layout.header.n_genes;
        out.indptr.clear();
        if wanted.iter().all(|&w| w) {
            out.indptr.extend_from_slice(&layout.indptr);
        } else {
            // The rows of the chunks left out are empty; the others keep their lengths.
            out.indptr.reserve(layout.indptr.len());
            out.indptr.push(0);
            let mut base = 0u64;
            for (chunk, &w) in layout.chunks.iter().zip(&wanted) {
                for cell in chunk.cell_lo..chunk.cell_hi {
                    if w {
                        base += layout.indptr[cell as usize + 1] - layout.indptr[cell as usize];
                    }
                    out.indptr.push(base);
                }
            }
        }
        Ok(())
    }
}

/// Checks that chunk `c`'s gaps and vals frames declare the sizes the chunk
/// table gives them (2 bytes per nonzero).
fn check_frame_sizes(layout: &TileLayout<'_>, c: usize) -> Result<(), TileError> {
    let chunk = &layout.chunks[c];
    for (stream, r) in [(Stream::Gaps, chunk.gaps), (Stream::Vals, chunk.vals)] {
        let declared = frame_content_size(layout.stream(r), c as u64, stream)?;
        if declared != 2 * chunk.n() {
            return Err(TileError::FrameSize { chunk: c as u64, stream, expected: 2 * chunk.n(), actual: declared });
        }
    }
    Ok(())
}

/// One chunk decoded whole, kept to copy its rows out of: a pass over a
/// tile in consecutive ranges decodes each chunk once, with the whole-tile
/// decoder's kernel, and each range is then a copy of the rows it holds.
/// `Default` gives an empty one; its buffers are reused by later calls.
#[derive(Debug, Default)]
pub struct DecodedChunk {
    /// The tile rows of the chunk.
    cells: std::ops::Range<u64>,
    /// Offsets into `indices` and `data` of each row of the chunk, and the end.
    offsets: Vec<u64>,
    indices: Vec<u32>,
    data: Vec<u32>,
}

impl ParsedTile<'_> {
    /// Decodes chunk `c` into `out`, checking every rule as [`decode_tile_into`]
    /// does for that chunk. On error, `out` holds no rows.
    pub fn decode_chunk_into(&self, c: usize, out: &mut DecodedChunk) -> Result<(), TileError> {
        let layout = &self.layout;
        let chunk = layout.chunk(c)?;
        let n = chunk.n() as usize;
        out.cells = chunk.cell_lo..chunk.cell_lo;
        // Every entry is overwritten by the decoder, so stale values may stay.
        out.indices.resize(n, 0);
        out.data.resize(n, 0);
        decode_chunk(layout, c as u64, chunk, &mut out.indices, &mut out.data)?;
        out.offsets.clear();
        out.offsets
            .extend(layout.indptr[chunk.cell_lo as usize..=chunk.cell_hi as usize].iter().map(|&p| p - chunk.nnz_lo));
        out.cells = chunk.cell_lo..chunk.cell_hi;
        Ok(())
    }
}

impl DecodedChunk {
    /// The tile rows this chunk holds.
    pub fn cells(&self) -> std::ops::Range<u64> {
        self.cells.clone()
    }

    /// Appends tile rows `rows` (of this chunk's; others are ignored) to `out`.
    pub fn append_rows(&self, rows: std::ops::Range<u64>, out: &mut CsrFill<'_>) {
        let lo = rows.start.max(self.cells.start);
        let hi = rows.end.min(self.cells.end);
        if lo >= hi {
            return;
        }
        let (a, b) = ((lo - self.cells.start) as usize, (hi - self.cells.start) as usize);
        let (from, to) = (self.offsets[a], self.offsets[b]);
        let (indices, data) = out.room((to - from) as usize);
        indices.copy_from_slice(&self.indices[from as usize..to as usize]);
        data.copy_from_slice(&self.data[from as usize..to as usize]);
        out.end_rows(self.offsets[a + 1..=b].iter().map(|&o| o - from));
    }
}

/// Longest cell whose u32 prefix sum of uint16 gaps cannot wrap around.
pub(super) const MAX_UNCHECKED_CELL: usize = (u32::MAX / STREAM_MAX) as usize;

pub(super) fn decode_chunk(
    layout: &TileLayout<'_>,
    c: u64,
    chunk: &ChunkEntry,
    indices: &mut [u32],
    data: &mut [u32],
) -> Result<(), TileError> {
    let n = chunk.n() as usize;
    let n_genes = u64::from(layout.header.n_genes);
    SCRATCH.with(|scratch| {
        let (gaps, vals) = &mut *scratch.borrow_mut();
        gaps.resize(2 * n, 0);
        vals.resize(2 * n, 0);
        // Each plane is turned into output right after it is decompressed,
        // while it is still in the core's cache (a chunk's plane is about 1.7
        // MB, the two together more than a core's L2).
        decompress_exact(layout.stream(chunk.gaps), gaps, c, Stream::Gaps)?;
        let (glo, ghi) = gaps.split_at(n);
        let cell_ptr = &layout.indptr[chunk.cell_lo as usize..=chunk.cell_hi as usize];
        // Gene indices are the prefix sums of the stored gaps within each cell,
        // computed in one pass that also counts zero gaps (allowed only as a
        // cell's first). u32 sums cannot wrap for cells of at most
        // MAX_UNCHECKED_CELL entries; longer ones take a checked path.
        let gaps_kernel = select_gaps_kernel();
        let mut bad = false;
        let mut zero_gaps = 0u32;
        let mut zero_firsts = 0u32;
        for w in cell_ptr.windows(2) {
            let (s, e) = ((w[0] - chunk.nnz_lo) as usize, (w[1] - chunk.nnz_lo) as usize);
            if s == e {
                continue;
            }
            zero_firsts += u32::from(glo[s] == 0 && ghi[s] == 0);
            if e - s > MAX_UNCHECKED_CELL {
                let mut acc = 0u64;
                for k in s..e {
                    let g = u64::from(glo[k]) | u64::from(ghi[k]) << 8;
                    zero_gaps += u32::from(g == 0);
                    acc += g;
                    if acc >= n_genes {
                        bad = true;
                        break;
                    }
                    indices[k] = acc as u32;
                }
                continue;
            }
            let (last, zeros) = gaps_kernel(&glo[s..e], &ghi[s..e], &mut indices[s..e]);
            zero_gaps += zeros;
            bad |= u64::from(last) >= n_genes;
        }
        // A zero gap anywhere but at a cell's start breaks strict increase.
        if bad || zero_gaps != zero_firsts {
            return Err(locate_gap_error(layout, c, chunk, glo, ghi));
        }

        decompress_exact(layout.stream(chunk.vals), vals, c, Stream::Vals)?;
        let (vlo, vhi) = vals.split_at(n);
        let zero_count = recombine_counts(vlo, vhi, data);
        store_fence();
        if zero_count {
            let position = data.iter().position(|&v| v == 0).expect("a zero was seen") as u64;
            return Err(TileError::ZeroCount { chunk: c, position });
        }

        if chunk.vexc.len > 0 {
            let exceptions = read_exceptions(layout, c, chunk, Stream::Vexc)?;
            for (position, payload) in exceptions {
                let p = position as usize;
                if data[p] != STREAM_MAX {
                    let stored = u64::from(data[p]);
                    return Err(TileError::ExceptionStoredValue { chunk: c, stream: Stream::Vexc, position, stored });
                }
                if !(STREAM_MAX + 1..=crate::format::MAX_COUNT).contains(&payload) {
                    return Err(TileError::VexcPayload { chunk: c, position, value: payload.into() });
                }
                data[p] = payload;
            }
        }
        if chunk.gexc.len > 0 {
            let exceptions = read_exceptions(layout, c, chunk, Stream::Gexc)?;
            for (position, payload) in exceptions {
                let p = position as usize;
                let stored = u32::from(glo[p]) | u32::from(ghi[p]) << 8;
                if stored != STREAM_MAX {
                    let stored = u64::from(stored);
                    return Err(TileError::ExceptionStoredValue { chunk: c, stream: Stream::Gexc, position, stored });
                }
                if payload == 0 || u64::from(payload) >= n_genes {
                    return Err(TileError::GexcPayload { chunk: c, position, value: payload.into() });
                }
                // The cell whose indptr range holds this nonzero (decisions.md 5).
                let global = chunk.nnz_lo + position;
                let cell_in_chunk = cell_ptr.partition_point(|&x| x <= global) - 1;
                let cell_end = (cell_ptr[cell_in_chunk + 1] - chunk.nnz_lo) as usize;
                for (k, index) in indices[p..cell_end].iter_mut().enumerate() {
                    let shifted = u64::from(*index) + u64::from(payload);
                    if shifted >= n_genes {
                        return Err(TileError::GeneIndexRange {
                            chunk: c,
                            cell: chunk.cell_lo + cell_in_chunk as u64,
                            position: (p + k) as u64,
                            gene: shifted,
                            n_genes,
                        });
                    }
                    *index = shifted as u32;
                }
            }
        }
        Ok(())
    })
}

/// Finds the first gap that made the fast path fail, for the error message.
fn locate_gap_error(layout: &TileLayout<'_>, c: u64, chunk: &ChunkEntry, glo: &[u8], ghi: &[u8]) -> TileError {
    let n_genes = u64::from(layout.header.n_genes);
    for cell in chunk.cell_lo..chunk.cell_hi {
        let s = (layout.indptr[cell as usize] - chunk.nnz_lo) as usize;
        let e = (layout.indptr[cell as usize + 1] - chunk.nnz_lo) as usize;
        let mut acc = 0u64;
        for k in s..e {
            let g = u64::from(glo[k]) | u64::from(ghi[k]) << 8;
            if k > s && g == 0 {
                return TileError::GeneIndexOrder { chunk: c, cell, position: k as u64 };
            }
            acc += g;
            if acc >= n_genes {
                return TileError::GeneIndexRange { chunk: c, cell, position: k as u64, gene: acc, n_genes };
            }
        }
    }
    unreachable_gap_error(c)
}

#[cold]
fn unreachable_gap_error(chunk: u64) -> TileError {
    // The fast path and this scan apply the same rules; reaching here would be a
    // bug, reported as a layout error rather than a panic.
    TileError::Layout { reason: format!("chunk {chunk}: inconsistent gap check") }
}

/// Reads an exception frame: k uint32 positions then k uint32 payloads, with
/// positions strictly increasing and below the chunk's nnz.
pub(super) fn read_exceptions(
    layout: &TileLayout<'_>,
    c: u64,
    chunk: &ChunkEntry,
    stream: Stream,
) -> Result<Vec<(u64, u32)>, TileError> {
    let r = if stream == Stream::Vexc { chunk.vexc } else { chunk.gexc };
    let frame = layout.stream(r);
    let declared = frame_content_size(frame, c, stream)?;
    if declared % 8 != 0 || declared > 8 * chunk.n() {
        return Err(TileError::FrameSize { chunk: c, stream, expected: 8 * chunk.n(), actual: declared });
    }
    let mut buf = vec![0u8; declared as usize];
    decompress_exact(frame, &mut buf, c, stream)?;
    let k = buf.len() / 8;
    let (positions, payloads) = buf.split_at(4 * k);
    let mut out = Vec::with_capacity(k);
    let mut previous: Option<u32> = None;
    for i in 0..k {
        let position = u32_at(positions, 4 * i);
        let payload = u32_at(payloads, 4 * i);
        let err = |reason: String| TileError::ExceptionPosition { chunk: c, stream, index: i as u64, reason };
        if u64::from(position) >= chunk.n() {
            return Err(err(format!("position {position} is not below the chunk's {} nonzeros", chunk.n())));
        }
        if let Some(prev) = previous {
            if position <= prev {
                return Err(err(format!("position {position} follows {prev}; positions must be strictly increasing")));
            }
        }
        previous = Some(position);
        out.push((u64::from(position), payload));
    }
    Ok(out)
}
