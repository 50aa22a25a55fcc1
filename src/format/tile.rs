//! One tile: a block of consecutive cells in CSR form, encoded as format.md's
//! "Tile layout" describes (64-byte header, chunk table, int64 indptr, and per
//! chunk a gaps, a vals and optional exception streams, each one zstd frame).
//!
//! The encoder follows the writer rules of decisions.md 2-6 exactly, so that its
//! output is a function of its input and settings only. The decoder accepts any
//! layout the specification allows (decisions.md 2, 3) and rejects everything it
//! forbids, without panicking and without allocating from an unchecked length.

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use super::error::{EncodeError, Stream, TileError};
use super::CsrMatrix;

/// format.md, "Header (64 bytes)".
pub const HEADER_LEN: usize = 64;
/// format.md, "Chunk table entry (96 bytes ...)".
pub const CHUNK_ENTRY_LEN: usize = 96;
pub const MAGIC: &[u8; 8] = b"DELTACEL";
pub const VERSION: u32 = 2;
/// Streams hold uint16 values; larger gaps and counts are exceptions.
const STREAM_MAX: u32 = 65535;
/// zstd frame magic number, little-endian (RFC 8878, 3.1.1).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// A zstd block produces at most 128 KiB and takes at least 4 bytes (an RLE
/// block), so a frame of `len` bytes never decompresses to more than this many
/// bytes per compressed byte. Used to reject absurd content sizes before any
/// allocation.
const ZSTD_MAX_EXPANSION: u64 = 128 * 1024 / 4;

/// The fixed 64-byte header of a tile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileHeader {
    pub n_cells: u64,
    pub nnz: u64,
    pub n_genes: u32,
    pub n_chunks: u32,
    pub indptr_off: u64,
    pub total_size: u64,
    pub crc32: u32,
}

/// What the manifest says a tile must hold. The header lies outside the CRC, so
/// a reader compares it with the manifest (decisions.md 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileExpectation {
    pub n_cells: u64,
    pub nnz: u64,
    pub n_genes: u32,
}

/// A stream's place in the blob.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct StreamRef {
    off: u64,
    len: u64,
}

/// One 96-byte chunk table entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ChunkEntry {
    cell_lo: u64,
    cell_hi: u64,
    nnz_lo: u64,
    nnz_hi: u64,
    gaps: StreamRef,
    vals: StreamRef,
    vexc: StreamRef,
    gexc: StreamRef,
}

impl ChunkEntry {
    fn n(&self) -> u64 {
        self.nnz_hi - self.nnz_lo
    }
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// Parses and checks the header of `blob`: magic, version, flags, reserved field,
/// n_genes range, total size and CRC.
pub fn parse_header(blob: &[u8]) -> Result<TileHeader, TileError> {
    if cfg!(target_endian = "big") {
        return Err(TileError::BigEndianHost);
    }
    if blob.len() < HEADER_LEN {
        return Err(TileError::ShortHeader { len: blob.len() as u64 });
    }
    if &blob[0..8] != MAGIC {
        return Err(TileError::Magic { found: String::from_utf8_lossy(&blob[0..8]).into_owned() });
    }
    let version = u32_at(blob, 8);
    if version != VERSION {
        return Err(TileError::Version { found: version });
    }
    let flags = u32_at(blob, 12);
    if flags != 0 {
        return Err(TileError::Flags { found: flags });
    }
    let reserved = u32_at(blob, 60);
    if reserved != 0 {
        return Err(TileError::Reserved { found: reserved });
    }
    let header = TileHeader {
        n_cells: u64_at(blob, 16),
        nnz: u64_at(blob, 24),
        n_genes: u32_at(blob, 32),
        n_chunks: u32_at(blob, 36),
        indptr_off: u64_at(blob, 40),
        total_size: u64_at(blob, 48),
        crc32: u32_at(blob, 56),
    };
    if header.n_genes == 0 || u64::from(header.n_genes) > super::MAX_GENES {
        return Err(TileError::NGenesRange { found: header.n_genes.into() });
    }
    if header.total_size != blob.len() as u64 {
        return Err(TileError::TotalSize { header: header.total_size, actual: blob.len() as u64 });
    }
    let computed = crc32fast::hash(&blob[HEADER_LEN..]);
    if computed != header.crc32 {
        return Err(TileError::Checksum { stored: header.crc32, computed });
    }
    Ok(header)
}

/// A tile whose header, chunk table, indptr and stream placement have been
/// checked, ready to decode.
struct TileLayout<'a> {
    blob: &'a [u8],
    header: TileHeader,
    chunks: Vec<ChunkEntry>,
    indptr: Vec<u64>,
}

fn layout_err(reason: impl Into<String>) -> TileError {
    TileError::Layout { reason: reason.into() }
}

impl<'a> TileLayout<'a> {
    fn parse(blob: &'a [u8], expect: Option<&TileExpectation>) -> Result<Self, TileError> {
        let header = parse_header(blob)?;
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

    fn stream(&self, r: StreamRef) -> &'a [u8] {
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
        let base = HEADER_LEN + c * CHUNK_ENTRY_LEN;
        let f = |i: usize| u64_at(blob, base + 8 * i);
        let entry = ChunkEntry {
            cell_lo: f(0),
            cell_hi: f(1),
            nnz_lo: f(2),
            nnz_hi: f(3),
            gaps: StreamRef { off: f(4), len: f(5) },
            vals: StreamRef { off: f(6), len: f(7) },
            vexc: StreamRef { off: f(8), len: f(9) },
            gexc: StreamRef { off: f(10), len: f(11) },
        };
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

/// Checks that `frame` is exactly one zstd frame with a content size and no
/// dictionary, and returns that content size.
fn frame_content_size(frame: &[u8], chunk: u64, stream: Stream) -> Result<u64, TileError> {
    let err = |reason: String| TileError::Frame { chunk, stream, reason };
    if frame.len() < 4 || frame[0..4] != ZSTD_MAGIC {
        return Err(err("not a zstd frame (a skippable frame or bad magic)".into()));
    }
    let size = match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(size)) => size,
        Ok(None) => return Err(err("zstd frame does not record its content size".into())),
        Err(_) => return Err(err("zstd frame header is invalid".into())),
    };
    if zstd::zstd_safe::get_dict_id_from_frame(frame).is_some() {
        return Err(err("zstd frame needs a dictionary".into()));
    }
    match zstd::zstd_safe::find_frame_compressed_size(frame) {
        Ok(n) if n == frame.len() => {}
        Ok(n) => return Err(err(format!("{} trailing bytes after the zstd frame", frame.len() - n))),
        Err(_) => return Err(err("zstd frame is truncated or invalid".into())),
    }
    if size > (frame.len() as u64).saturating_mul(ZSTD_MAX_EXPANSION) {
        return Err(err(format!("a {}-byte frame cannot hold the {size} bytes it declares", frame.len())));
    }
    Ok(size)
}

thread_local! {
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    static SCRATCH: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Decompresses `frame` (already checked to declare `dst.len()` bytes) into `dst`.
fn decompress_exact(frame: &[u8], dst: &mut [u8], chunk: u64, stream: Stream) -> Result<(), TileError> {
    let written = DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?);
        }
        slot.as_mut().expect("set above").decompress_to_buffer(frame, dst).map_err(|e| e.to_string())
    });
    match written {
        Ok(n) if n == dst.len() => Ok(()),
        Ok(n) => Err(TileError::FrameSize { chunk, stream, expected: dst.len() as u64, actual: n as u64 }),
        Err(e) => Err(TileError::Frame { chunk, stream, reason: format!("zstd: {e}") }),
    }
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
    let layout = TileLayout::parse(blob, expect)?;
    // Every frame's declared size is checked before the output is sized, so a
    // lying header cannot make us allocate more than the frames would produce.
    for (c, chunk) in layout.chunks.iter().enumerate() {
        for (stream, r) in [(Stream::Gaps, chunk.gaps), (Stream::Vals, chunk.vals)] {
            let declared = frame_content_size(layout.stream(r), c as u64, stream)?;
            if declared != 2 * chunk.n() {
                return Err(TileError::FrameSize {
                    chunk: c as u64,
                    stream,
                    expected: 2 * chunk.n(),
                    actual: declared,
                });
            }
        }
    }
    let nnz = layout.header.nnz as usize;
    // Every entry is overwritten by its chunk, so stale values may stay: only
    // growth is zero-filled.
    out.indices.resize(nnz, 0);
    out.data.resize(nnz, 0);
    let mut jobs = Vec::with_capacity(layout.chunks.len());
    let (mut rest_i, mut rest_d) = (out.indices.as_mut_slice(), out.data.as_mut_slice());
    for (c, chunk) in layout.chunks.iter().enumerate() {
        let (i, ri) = rest_i.split_at_mut(chunk.n() as usize);
        let (d, rd) = rest_d.split_at_mut(chunk.n() as usize);
        (rest_i, rest_d) = (ri, rd);
        jobs.push((c, chunk, i, d));
    }
    jobs.into_par_iter().try_for_each(|(c, chunk, i, d)| decode_chunk(&layout, c as u64, chunk, i, d))?;
    out.n_cols = layout.header.n_genes;
    out.indptr = layout.indptr;
    Ok(())
}

/// Longest cell whose u32 prefix sum of uint16 gaps cannot wrap around.
const MAX_UNCHECKED_CELL: usize = (u32::MAX / STREAM_MAX) as usize;

fn decode_chunk(
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
        decompress_exact(layout.stream(chunk.gaps), gaps, c, Stream::Gaps)?;
        decompress_exact(layout.stream(chunk.vals), vals, c, Stream::Vals)?;

        let (vlo, vhi) = vals.split_at(n);
        if recombine_counts(vlo, vhi, data) {
            let position = data.iter().position(|&v| v == 0).expect("a zero was seen") as u64;
            return Err(TileError::ZeroCount { chunk: c, position });
        }

        let (glo, ghi) = gaps.split_at(n);
        let cell_ptr = &layout.indptr[chunk.cell_lo as usize..=chunk.cell_hi as usize];
        // Gene indices: a prefix sum of the gaps within each cell. The rules
        // (no gap of 0 after a cell's first, last index below n_genes) are
        // checked in separate passes that keep this loop tight; u32 sums cannot
        // wrap for cells of at most MAX_UNCHECKED_CELL entries, and longer ones
        // take the checked path.
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

        if chunk.vexc.len > 0 {
            let exceptions = read_exceptions(layout, c, chunk, Stream::Vexc)?;
            for (position, payload) in exceptions {
                let p = position as usize;
                if data[p] != STREAM_MAX {
                    let stored = u64::from(data[p]);
                    return Err(TileError::ExceptionStoredValue { chunk: c, stream: Stream::Vexc, position, stored });
                }
                if !(STREAM_MAX + 1..=super::MAX_COUNT).contains(&payload) {
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

/// Writes the counts whose low and high bytes are `lo` and `hi` into `out`;
/// returns whether any is zero. Uses an AVX2 build of the same loop where the
/// processor has it (detection is cached by std).
#[inline]
fn recombine_counts(lo: &[u8], hi: &[u8], out: &mut [u32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the processor supports AVX2, checked just above.
            return unsafe { recombine_counts_avx2(lo, hi, out) };
        }
    }
    recombine_counts_portable(lo, hi, out)
}

#[inline(always)]
fn recombine_counts_portable(lo: &[u8], hi: &[u8], out: &mut [u32]) -> bool {
    let mut zero = false;
    for ((o, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
        let v = u32::from(l) | u32::from(h) << 8;
        zero |= v == 0;
        *o = v;
    }
    zero
}

/// The same loop, compiled for AVX2 so that it runs 8 lanes wide.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn recombine_counts_avx2(lo: &[u8], hi: &[u8], out: &mut [u32]) -> bool {
    recombine_counts_portable(lo, hi, out)
}

/// A function that writes the (wrapping) prefix sums of the gaps whose low and
/// high bytes are `lo` and `hi` into `out`, and returns the last sum and the
/// number of zero gaps.
type GapsKernel = fn(&[u8], &[u8], &mut [u32]) -> (u32, u32);

/// The fastest gaps kernel this processor runs (detection is cached by std).
fn select_gaps_kernel() -> GapsKernel {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            return |lo, hi, out| {
                // SAFETY: the processor supports AVX2, checked above.
                unsafe { cell_gaps_avx2(lo, hi, out) }
            };
        }
        cell_gaps_sse2
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        |lo, hi, out| cell_gaps_scalar(lo, hi, out, 0)
    }
}

/// Eight gaps at a time: prefix sums within each 128-bit half, the first
/// half's total added to the second, then the running total of the block
/// before.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn cell_gaps_avx2(lo: &[u8], hi: &[u8], out: &mut [u32]) -> (u32, u32) {
    use std::arch::x86_64::*;
    let n = out.len().min(lo.len()).min(hi.len());
    let blocks = n / 8;
    let zero = _mm256_setzero_si256();
    let mut carry = zero;
    let mut zeros = zero;
    let last_of_first_half = _mm256_set1_epi32(3);
    let last = _mm256_set1_epi32(7);
    let upper_half = _mm256_set_epi32(-1, -1, -1, -1, 0, 0, 0, 0);
    for b in 0..blocks {
        // SAFETY: each load reads the 8 bytes at 8 * b of `lo` and `hi`, and the
        // store writes the 8 u32 at 8 * b of `out`, all below n.
        let l = _mm_loadl_epi64(lo.as_ptr().add(8 * b) as *const __m128i);
        let h = _mm_loadl_epi64(hi.as_ptr().add(8 * b) as *const __m128i);
        let mut x = _mm256_cvtepu16_epi32(_mm_unpacklo_epi8(l, h));
        zeros = _mm256_sub_epi32(zeros, _mm256_cmpeq_epi32(x, zero));
        x = _mm256_add_epi32(x, _mm256_slli_si256::<4>(x));
        x = _mm256_add_epi32(x, _mm256_slli_si256::<8>(x));
        let first_total = _mm256_and_si256(_mm256_permutevar8x32_epi32(x, last_of_first_half), upper_half);
        x = _mm256_add_epi32(_mm256_add_epi32(x, first_total), carry);
        _mm256_storeu_si256(out.as_mut_ptr().add(8 * b) as *mut __m256i, x);
        carry = _mm256_permutevar8x32_epi32(x, last);
    }
    let mut lanes = [0u32; 8];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, zeros);
    let block_zeros = lanes.iter().fold(0u32, |a, &z| a.wrapping_add(z));
    let acc = _mm256_extract_epi32::<0>(carry) as u32;
    let t = 8 * blocks;
    let (last_sum, tail_zeros) = cell_gaps_scalar(&lo[t..n], &hi[t..n], &mut out[t..n], acc);
    (last_sum, block_zeros + tail_zeros)
}

#[inline]
fn cell_gaps_scalar(lo: &[u8], hi: &[u8], out: &mut [u32], mut acc: u32) -> (u32, u32) {
    let mut zeros = 0u32;
    for ((o, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
        let g = u32::from(l) | u32::from(h) << 8;
        zeros += u32::from(g == 0);
        acc = acc.wrapping_add(g);
        *o = acc;
    }
    (acc, zeros)
}

/// Four gaps at a time: interleaving the low and high bytes gives the uint16
/// values, widened to u32 lanes; two shifted adds give the prefix sums within
/// the register, and the running total of the previous block is added. SSE2
/// is part of every x86_64 processor, so no runtime detection is needed.
#[cfg(target_arch = "x86_64")]
#[inline]
fn cell_gaps_sse2(lo: &[u8], hi: &[u8], out: &mut [u32]) -> (u32, u32) {
    use std::arch::x86_64::*;
    let n = out.len().min(lo.len()).min(hi.len());
    let blocks = n / 4;
    // SAFETY: SSE2 is always available on x86_64. Every load reads 4 bytes at
    // 4 * b of `lo` and `hi` and every store writes 4 u32 at 4 * b of `out`,
    // with b < n / 4, so all accesses stay inside the slices.
    unsafe {
        let zero = _mm_setzero_si128();
        let mut carry = zero;
        let mut zeros = zero;
        for b in 0..blocks {
            let l = _mm_cvtsi32_si128(i32::from_le_bytes(lo[4 * b..4 * b + 4].try_into().expect("4")));
            let h = _mm_cvtsi32_si128(i32::from_le_bytes(hi[4 * b..4 * b + 4].try_into().expect("4")));
            let mut x = _mm_unpacklo_epi16(_mm_unpacklo_epi8(l, h), zero);
            zeros = _mm_sub_epi32(zeros, _mm_cmpeq_epi32(x, zero));
            x = _mm_add_epi32(x, _mm_slli_si128::<4>(x));
            x = _mm_add_epi32(x, _mm_slli_si128::<8>(x));
            x = _mm_add_epi32(x, carry);
            _mm_storeu_si128(out.as_mut_ptr().add(4 * b) as *mut __m128i, x);
            carry = _mm_shuffle_epi32::<0xFF>(x);
        }
        let mut lanes = [0u32; 4];
        _mm_storeu_si128(lanes.as_mut_ptr() as *mut __m128i, zeros);
        let block_zeros = lanes.iter().fold(0u32, |a, &z| a.wrapping_add(z));
        let acc = _mm_cvtsi128_si32(carry) as u32;
        let t = 4 * blocks;
        let (last, tail_zeros) = cell_gaps_scalar(&lo[t..n], &hi[t..n], &mut out[t..n], acc);
        (last, block_zeros + tail_zeros)
    }
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
fn read_exceptions(
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

/// Encodes blocks of cells as tiles, exactly as decisions.md 2-6 prescribe.
#[derive(Clone, Debug)]
pub struct TileEncoder {
    n_chunks: usize,
    level: i32,
}

/// The encoded streams of one chunk, before they are placed in the blob.
struct EncodedChunk {
    cells: Range<u64>,
    nnz: Range<u64>,
    gaps: Vec<u8>,
    vals: Vec<u8>,
    vexc: Option<Vec<u8>>,
    gexc: Option<Vec<u8>>,
}

thread_local! {
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
}

/// Compresses `data` as one zstd frame with its content size and no checksum
/// (decisions.md 4), reusing this thread's context.
pub fn compress_frame(data: &[u8], level: i32) -> Result<Vec<u8>, EncodeError> {
    COMPRESSOR
        .with(|cell| {
            let mut slot = cell.borrow_mut();
            if !matches!(&*slot, Some((l, _)) if *l == level) {
                let mut c = zstd::bulk::Compressor::new(level)?;
                c.include_contentsize(true)?;
                c.include_checksum(false)?;
                c.include_dictid(false)?;
                *slot = Some((level, c));
            }
            slot.as_mut().expect("set above").1.compress(data)
        })
        .map_err(|e| EncodeError::Zstd(e.to_string()))
}

/// The exception limit of decisions.md 6: max(1024, nnz / 200) of either kind.
pub fn exception_limit(nnz: u64) -> u64 {
    (nnz / 200).max(1024)
}

impl TileEncoder {
    /// An encoder that splits tiles into up to `n_chunks` chunks (at least 1) and
    /// compresses at zstd `level`.
    pub fn new(n_chunks: usize, level: i32) -> Self {
        TileEncoder { n_chunks: n_chunks.max(1), level }
    }

    /// Encodes the rows of `block` as one tile. The block must hold what a tile
    /// can: gene indices strictly increasing within each row and below `n_cols`,
    /// counts in 1..2^31-1, and few values above 65535.
    pub fn encode(&self, block: &CsrMatrix) -> Result<Vec<u8>, EncodeError> {
        validate_block(block)?;
        let n_cells = block.n_rows() as u64;
        let nnz = block.nnz() as u64;
        let bounds = chunk_boundaries(&block.indptr, self.n_chunks);
        let chunks: Vec<EncodedChunk> =
            bounds.par_windows(2).map(|w| self.encode_chunk(block, w[0], w[1])).collect::<Result<_, _>>()?;

        let n_chunks = chunks.len();
        let indptr_off = (HEADER_LEN + CHUNK_ENTRY_LEN * n_chunks) as u64;
        let mut pos = indptr_off + 8 * (n_cells + 1);
        let mut table = Vec::with_capacity(n_chunks);
        for ch in &chunks {
            let mut place = |bytes: Option<&Vec<u8>>| match bytes {
                Some(b) => {
                    pos = pos.next_multiple_of(8);
                    let r = StreamRef { off: pos, len: b.len() as u64 };
                    pos += r.len;
                    r
                }
                None => StreamRef::default(),
            };
            let gaps = place(Some(&ch.gaps));
            let vals = place(Some(&ch.vals));
            let vexc = place(ch.vexc.as_ref());
            let gexc = place(ch.gexc.as_ref());
            table.push(ChunkEntry {
                cell_lo: ch.cells.start,
                cell_hi: ch.cells.end,
                nnz_lo: ch.nnz.start,
                nnz_hi: ch.nnz.end,
                gaps,
                vals,
                vexc,
                gexc,
            });
        }
        let total = pos;
        let mut blob = vec![0u8; total as usize];
        blob[0..8].copy_from_slice(MAGIC);
        blob[8..12].copy_from_slice(&VERSION.to_le_bytes());
        blob[16..24].copy_from_slice(&n_cells.to_le_bytes());
        blob[24..32].copy_from_slice(&nnz.to_le_bytes());
        blob[32..36].copy_from_slice(&block.n_cols.to_le_bytes());
        blob[36..40].copy_from_slice(&(n_chunks as u32).to_le_bytes());
        blob[40..48].copy_from_slice(&indptr_off.to_le_bytes());
        blob[48..56].copy_from_slice(&total.to_le_bytes());
        for (c, e) in table.iter().enumerate() {
            let base = HEADER_LEN + c * CHUNK_ENTRY_LEN;
            let fields = [
                e.cell_lo, e.cell_hi, e.nnz_lo, e.nnz_hi, e.gaps.off, e.gaps.len, e.vals.off, e.vals.len, e.vexc.off,
                e.vexc.len, e.gexc.off, e.gexc.len,
            ];
            for (i, v) in fields.iter().enumerate() {
                blob[base + 8 * i..base + 8 * i + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
        for (i, &p) in block.indptr.iter().enumerate() {
            let at = indptr_off as usize + 8 * i;
            blob[at..at + 8].copy_from_slice(&(p as i64).to_le_bytes());
        }
        for (ch, e) in chunks.iter().zip(&table) {
            for (bytes, r) in [
                (Some(&ch.gaps), e.gaps),
                (Some(&ch.vals), e.vals),
                (ch.vexc.as_ref(), e.vexc),
                (ch.gexc.as_ref(), e.gexc),
            ] {
                if let Some(b) = bytes {
                    blob[r.off as usize..(r.off + r.len) as usize].copy_from_slice(b);
                }
            }
        }
        let crc = crc32fast::hash(&blob[HEADER_LEN..]);
        blob[56..60].copy_from_slice(&crc.to_le_bytes());
        Ok(blob)
    }

    fn encode_chunk(&self, block: &CsrMatrix, cell_lo: usize, cell_hi: usize) -> Result<EncodedChunk, EncodeError> {
        let nnz_lo = block.indptr[cell_lo] as usize;
        let nnz_hi = block.indptr[cell_hi] as usize;
        let n = nnz_hi - nnz_lo;
        if n as u64 >= 1 << 32 {
            return Err(EncodeError::ChunkTooLarge(n as u64));
        }
        let mut gaps = vec![0u8; 2 * n];
        let mut vals = vec![0u8; 2 * n];
        let (mut vexc_pos, mut vexc_val, mut gexc_pos, mut gexc_val) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for cell in cell_lo..cell_hi {
            let (s, e) = (block.indptr[cell] as usize, block.indptr[cell + 1] as usize);
            let mut previous = 0u32;
            for k in s..e {
                let local = k - nnz_lo;
                let gene = block.indices[k];
                let gap = if k == s { gene } else { gene - previous };
                previous = gene;
                let stored_gap = gap.min(STREAM_MAX);
                if gap > STREAM_MAX {
                    gexc_pos.push(local as u32);
                    gexc_val.push(gap - STREAM_MAX);
                }
                gaps[local] = stored_gap as u8;
                gaps[n + local] = (stored_gap >> 8) as u8;
                let count = block.data[k];
                let stored = count.min(STREAM_MAX);
                if count > STREAM_MAX {
                    vexc_pos.push(local as u32);
                    vexc_val.push(count);
                }
                vals[local] = stored as u8;
                vals[n + local] = (stored >> 8) as u8;
            }
        }
        let exception_frame = |pos: &[u32], val: &[u32]| -> Result<Option<Vec<u8>>, EncodeError> {
            if pos.is_empty() {
                return Ok(None);
            }
            let raw: Vec<u8> = pos.iter().chain(val).flat_map(|v| v.to_le_bytes()).collect();
            compress_frame(&raw, self.level).map(Some)
        };
        // The two planes compress as separate tasks: twice the units of work
        // per tile, so the last chunks of a tile leave fewer cores idle.
        let (gaps, vals) = rayon::join(|| compress_frame(&gaps, self.level), || compress_frame(&vals, self.level));
        Ok(EncodedChunk {
            cells: cell_lo as u64..cell_hi as u64,
            nnz: nnz_lo as u64..nnz_hi as u64,
            gaps: gaps?,
            vals: vals?,
            vexc: exception_frame(&vexc_pos, &vexc_val)?,
            gexc: exception_frame(&gexc_pos, &gexc_val)?,
        })
    }
}

fn validate_block(block: &CsrMatrix) -> Result<(), EncodeError> {
    let n_genes = block.n_cols;
    if n_genes == 0 || u64::from(n_genes) > super::MAX_GENES {
        return Err(EncodeError::NGenes(n_genes.into()));
    }
    if block.indptr.first() != Some(&0) {
        return Err(EncodeError::Indptr("must start with 0".into()));
    }
    if block.indices.len() != block.data.len() || *block.indptr.last().expect("checked") != block.indices.len() as u64 {
        return Err(EncodeError::Indptr(format!(
            "ends at {} but there are {} indices and {} counts",
            block.indptr.last().expect("checked"),
            block.indices.len(),
            block.data.len()
        )));
    }
    if let Some(i) = block.indptr.windows(2).position(|w| w[1] < w[0]) {
        return Err(EncodeError::Indptr(format!("decreases at row {i}")));
    }
    // Exceptions are counted here, before any compression, so that a block that
    // is not raw counts fails fast (decisions.md 6).
    let limit = exception_limit(block.nnz() as u64);
    let (mut n_vexc, mut n_gexc) = (0u64, 0u64);
    for cell in 0..block.n_rows() {
        let (genes, counts) = block.row(cell);
        for (k, (&gene, &count)) in genes.iter().zip(counts).enumerate() {
            let cell = cell as u64;
            if gene >= n_genes {
                return Err(EncodeError::GeneRange { cell, gene, n_genes });
            }
            if k > 0 && gene <= genes[k - 1] {
                return Err(EncodeError::GeneOrder { cell, gene, previous: genes[k - 1] });
            }
            if count == 0 || count > super::MAX_COUNT {
                return Err(EncodeError::Count { cell, gene, count });
            }
            let gap = if k == 0 { gene } else { gene - genes[k - 1] };
            n_vexc += u64::from(count > STREAM_MAX);
            n_gexc += u64::from(gap > STREAM_MAX);
            if n_vexc > limit {
                return Err(EncodeError::TooManyExceptions { what: "counts", limit, cell, gene });
            }
            if n_gexc > limit {
                return Err(EncodeError::TooManyExceptions { what: "gene gaps", limit, cell, gene });
            }
        }
    }
    Ok(())
}

/// Chunk boundaries (cell indices, first 0 and last n_cells) by decisions.md 3:
/// min(n_chunks, n_cells) chunks; boundary k is the cell boundary whose
/// cumulative nnz is nearest to nnz * k / C, the lower on a tie, forced strictly
/// increasing so that every chunk has at least one cell.
pub fn chunk_boundaries(indptr: &[u64], n_chunks: usize) -> Vec<usize> {
    let n_cells = indptr.len() - 1;
    let c = n_chunks.min(n_cells);
    if c == 0 {
        return vec![0];
    }
    let nnz = u128::from(indptr[n_cells]);
    let mut bounds = Vec::with_capacity(c + 1);
    bounds.push(0);
    for k in 1..c {
        let target = nnz * k as u128; // compare indptr[b] * c with nnz * k, exactly
        let scaled = |b: usize| u128::from(indptr[b]) * c as u128;
        let hi = indptr.partition_point(|&p| u128::from(p) * (c as u128) < target);
        // hi is the first boundary at or above the target; the best boundary
        // below it is the first one holding the value just below.
        let mut best = hi.min(n_cells);
        if hi > 0 {
            let below_value = indptr[hi - 1];
            let lo = indptr.partition_point(|&p| p < below_value);
            let d_lo = target - scaled(lo);
            let d_hi = if hi <= n_cells { scaled(hi) - target } else { u128::MAX };
            if d_lo <= d_hi {
                best = lo;
            }
        }
        let previous = *bounds.last().expect("starts with 0");
        bounds.push(best.max(previous + 1).min(n_cells - (c - k)));
    }
    bounds.push(n_cells);
    bounds
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

#[cfg(test)]
mod tests;
