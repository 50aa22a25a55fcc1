//! A chunk kept as its decompressed byte planes, from which cells are written
//! out one by one, in any order: a reader that gathers shuffled cells into
//! batches writes each cell's gene indices and counts once, straight into the
//! batch, instead of decoding the chunk into a matrix and copying rows out of
//! it. The planes take 4 bytes per nonzero, half a decoded chunk.
//!
//! Every rule a reader checks is checked either when the planes are made
//! ([`ParsedTile::decode_planes`], by passes that read the planes without
//! writing anything: for planes whose rows are written many times, as a
//! gather's cache does) or row by row as they are written
//! ([`ChunkPlanes::write_row_checked`], for rows written once, as the
//! loader's are). When one finds a problem, the chunk is decoded by the
//! ordinary decoder, which names the rule broken exactly as it does for
//! whole tiles.

use std::ops::Range;

use super::super::error::{Stream, TileError};
use super::decode::{decode_chunk, read_exceptions, DecodedChunk, ParsedTile, MAX_UNCHECKED_CELL};
use super::frames::decompress_exact;
use super::kernels::{prefetch, recombine_counts, recombine_counts_cached, select_gaps_kernel, store_fence};
use super::STREAM_MAX;
use crate::format::{CsrFill, MAX_COUNT};

/// One chunk's planes and exceptions, checked (see the module documentation).
/// `Default` gives an empty one to decode into; its buffers are reused by
/// later calls.
#[derive(Debug, Default)]
pub struct ChunkPlanes {
    /// The tile rows of the chunk.
    cells: Range<u64>,
    /// The tile's genes.
    n_genes: u64,
    /// Offsets into the planes of each cell of the chunk, and the end.
    offsets: Vec<u64>,
    /// Low bytes of every gap, then high bytes.
    gaps: Vec<u8>,
    /// Low bytes of every count, then high bytes.
    vals: Vec<u8>,
    vexc: Vec<(u64, u32)>,
    gexc: Vec<(u64, u32)>,
}

impl ParsedTile<'_> {
    /// Decompresses chunk `c` into `planes` and checks it.
    pub fn decode_planes(&self, c: usize, planes: &mut ChunkPlanes) -> Result<(), TileError> {
        self.decompress_planes(c, planes)?;
        if !planes.follow_the_rules() {
            // The ordinary decoder names the rule that is broken.
            let layout = self.layout();
            let chunk = &layout.chunks[c];
            let n = chunk.n() as usize;
            let (mut indices, mut data) = (vec![0u32; n], vec![0u32; n]);
            decode_chunk(layout, c as u64, chunk, &mut indices, &mut data)?;
        }
        Ok(())
    }

    /// Decompresses chunk `c` into `planes`, checking the frames and the
    /// exceptions' positions but not the rules the values must follow:
    /// [`ChunkPlanes::append_rows_checked`] checks those for the rows it
    /// writes, in the same pass.
    pub fn decompress_planes(&self, c: usize, planes: &mut ChunkPlanes) -> Result<(), TileError> {
        let layout = self.layout();
        let chunk = layout.chunk(c)?;
        let n = chunk.n() as usize;
        let cu = c as u64;
        // Empty until it is whole, so that a failure leaves no rows to write.
        planes.cells = chunk.cell_lo..chunk.cell_lo;
        planes.n_genes = u64::from(layout.header.n_genes);
        planes.offsets.clear();
        planes
            .offsets
            .extend(layout.indptr[chunk.cell_lo as usize..=chunk.cell_hi as usize].iter().map(|&p| p - chunk.nnz_lo));
        grow_to(&mut planes.gaps, 2 * n);
        grow_to(&mut planes.vals, 2 * n);
        decompress_exact(layout.stream(chunk.gaps), &mut planes.gaps, cu, Stream::Gaps)?;
        decompress_exact(layout.stream(chunk.vals), &mut planes.vals, cu, Stream::Vals)?;
        planes.vexc = if chunk.vexc.len > 0 { read_exceptions(layout, cu, chunk, Stream::Vexc)? } else { Vec::new() };
        planes.gexc = if chunk.gexc.len > 0 { read_exceptions(layout, cu, chunk, Stream::Gexc)? } else { Vec::new() };
        planes.cells = chunk.cell_lo..chunk.cell_hi;
        Ok(())
    }
}

/// Resizes `v` to `n` bytes (only the new room is zeroed), growing it to an
/// eighth more than `n` when it must grow: planes taken from a pool for
/// chunks of about the same size then rarely grow again, and never double
/// (a pool kept within a budget of bytes holds fewer of them doubled).
fn grow_to(v: &mut Vec<u8>, n: usize) {
    if v.capacity() < n {
        v.reserve_exact((n + n / 8).saturating_sub(v.len()));
    }
    v.resize(n, 0);
}

impl ParsedTile<'_> {
    /// Appends tile rows `rows` of chunk `c` to `out` from `planes` (made by
    /// [`ParsedTile::decompress_planes`] of that chunk), checked as they are
    /// written; when the planes break a rule, the chunk decoder decodes the
    /// chunk whole and names it (and its rows are the answer, should it
    /// find none).
    pub fn append_chunk_rows(
        &self,
        c: usize,
        planes: &ChunkPlanes,
        rows: Range<u64>,
        out: &mut CsrFill<'_>,
    ) -> Result<(), TileError> {
        if planes.append_rows_checked(rows.clone(), out) {
            return Ok(());
        }
        let mut decoded = DecodedChunk::default();
        self.decode_chunk_into(c, &mut decoded)?;
        decoded.append_rows(rows, out);
        Ok(())
    }
}

impl ChunkPlanes {
    /// Memory held, in bytes (for a cache's budget).
    pub fn heap_bytes(&self) -> u64 {
        let pairs = (self.vexc.capacity() + self.gexc.capacity()) * std::mem::size_of::<(u64, u32)>();
        (self.gaps.capacity() + self.vals.capacity() + 8 * self.offsets.capacity() + pairs) as u64
    }

    /// The tile rows this chunk holds.
    pub fn cells(&self) -> Range<u64> {
        self.cells.clone()
    }

    /// The nonzeros of tile row `row` (a row of this chunk).
    ///
    /// # Panics
    /// If `row` is not in [`ChunkPlanes::cells`].
    pub fn row_nnz(&self, row: u64) -> usize {
        let cell = (row - self.cells.start) as usize;
        (self.offsets[cell + 1] - self.offsets[cell]) as usize
    }

    /// Starts bringing tile row `row`'s part of the planes into the
    /// processor's caches, for a [`ChunkPlanes::write_row`] of it soon after
    /// (a hint: nothing waits for it).
    ///
    /// # Panics
    /// If `row` is not in [`ChunkPlanes::cells`].
    pub fn prefetch_row(&self, row: u64) {
        let cell = (row - self.cells.start) as usize;
        let (s, e) = (self.offsets[cell] as usize, self.offsets[cell + 1] as usize);
        let n = self.gaps.len() / 2;
        for plane in [&self.gaps[..n], &self.gaps[n..], &self.vals[..n], &self.vals[n..]] {
            prefetch(&plane[s..e]);
        }
    }

    /// Writes tile row `row`'s gene indices and counts into `indices` and
    /// `data`, each exactly [`ChunkPlanes::row_nnz`] long. The counts are
    /// written with streaming stores (they are not read again soon): call
    /// [`finish_rows`] before another thread reads them.
    ///
    /// # Panics
    /// If `row` is not in [`ChunkPlanes::cells`] or the outputs are not
    /// `row_nnz(row)` long.
    pub fn write_row(&self, row: u64, indices: &mut [u32], data: &mut [u32]) {
        self.write_row_with(row, indices, data, true);
    }

    /// [`ChunkPlanes::write_row`] with the counts written through the cache
    /// (`stream` false): for a caller that reads the row again at once (to
    /// map it onto a gene vocabulary, or to scale it), which would otherwise
    /// read back from memory what the streaming stores put there.
    ///
    /// # Panics
    /// As [`ChunkPlanes::write_row`].
    pub fn write_row_with(&self, row: u64, indices: &mut [u32], data: &mut [u32], stream: bool) {
        let cell = (row - self.cells.start) as usize;
        let (s, e) = (self.offsets[cell] as usize, self.offsets[cell + 1] as usize);
        assert!(indices.len() == e - s && data.len() == e - s, "row {row} has {} nonzeros", e - s);
        let n = self.gaps.len() / 2;
        let (glo, ghi) = self.gaps.split_at(n);
        let (vlo, vhi) = self.vals.split_at(n);
        // Checked when the planes were made: the sums stay below n_genes, so
        // the kernel's u32 sums never wrap, whatever the row's length.
        select_gaps_kernel()(&glo[s..e], &ghi[s..e], indices);
        for &(p, payload) in within(&self.gexc, s, e) {
            for index in &mut indices[p as usize - s..] {
                *index += payload;
            }
        }
        if stream {
            recombine_counts(&vlo[s..e], &vhi[s..e], data);
        } else {
            recombine_counts_cached(&vlo[s..e], &vhi[s..e], data);
        }
        for &(p, payload) in within(&self.vexc, s, e) {
            data[p as usize - s] = payload;
        }
    }

    /// [`ChunkPlanes::write_row_with`] for planes made by
    /// [`ParsedTile::decompress_planes`] and not checked since: every rule
    /// decoding checks is checked for this row as it is written, at about
    /// the cost of writing it (a reader that writes each row of a chunk
    /// once, as the loader does, so reads the planes once instead of twice).
    /// False when a rule is broken, and `indices` and `data` then hold
    /// nothing of use: [`ParsedTile::decode_planes`] of the chunk names the
    /// rule.
    ///
    /// # Panics
    /// As [`ChunkPlanes::write_row`].
    #[must_use]
    pub fn write_row_checked(&self, row: u64, indices: &mut [u32], data: &mut [u32], stream: bool) -> bool {
        let cell = (row - self.cells.start) as usize;
        let n = (self.offsets[cell + 1] - self.offsets[cell]) as usize;
        assert!(indices.len() == n && data.len() == n, "row {row} has {n} nonzeros");
        self.write_checked(cell..cell + 1, indices, data, stream)
    }

    /// Appends tile rows `rows` (rows of this chunk) to `out` in one pass
    /// over their part of the planes, checking every rule decoding checks
    /// for those rows as it writes them: what [`ParsedTile::decode_planes`]
    /// followed by [`ChunkPlanes::write_row`] of each row gives, for planes
    /// made by [`ParsedTile::decompress_planes`], at the cost of decoding
    /// only those rows. Returns false, with no row added to `out`, when a rule is
    /// broken; the whole-chunk decoder then names it.
    ///
    /// # Panics
    /// If `rows` is not within [`ChunkPlanes::cells`].
    pub fn append_rows_checked(&self, rows: Range<u64>, out: &mut CsrFill<'_>) -> bool {
        let (a, b) = ((rows.start - self.cells.start) as usize, (rows.end - self.cells.start) as usize);
        let (s0, e0) = (self.offsets[a], self.offsets[b]);
        let (indices, data) = out.room((e0 - s0) as usize);
        let written = self.write_checked(a..b, indices, data, true);
        store_fence();
        if written {
            out.end_rows(self.offsets[a + 1..=b].iter().map(|&o| o - s0));
        }
        written
    }

    /// Writes the cells `cells` (of the chunk) into `indices` and `data`
    /// (exactly their nonzeros long), checking the rules; false when one is
    /// broken. The counts go out with streaming stores when `stream`.
    fn write_checked(&self, cells: Range<usize>, indices: &mut [u32], data: &mut [u32], stream: bool) -> bool {
        let n_genes = self.n_genes;
        let (s0, e0) = (self.offsets[cells.start] as usize, self.offsets[cells.end] as usize);
        let n = self.gaps.len() / 2;
        let (glo, ghi) = self.gaps.split_at(n);
        let (vlo, vhi) = self.vals.split_at(n);
        // Gene indices: each cell's prefix sums of its gaps, counting zero
        // gaps (allowed only as a cell's first), as the chunk decoder does.
        let kernel = select_gaps_kernel();
        let (mut bad, mut zero_gaps, mut zero_firsts) = (false, 0u64, 0u64);
        for w in self.offsets[cells.start..=cells.end].windows(2) {
            let (s, e) = (w[0] as usize, w[1] as usize);
            if s == e {
                continue;
            }
            zero_firsts += u64::from(glo[s] == 0 && ghi[s] == 0);
            let cell_out = &mut indices[s - s0..e - s0];
            if e - s > MAX_UNCHECKED_CELL {
                let mut acc = 0u64;
                for (k, index) in (s..e).zip(cell_out) {
                    let g = u64::from(glo[k]) | u64::from(ghi[k]) << 8;
                    zero_gaps += u64::from(g == 0);
                    acc += g;
                    if acc >= n_genes {
                        return false;
                    }
                    *index = acc as u32;
                }
                continue;
            }
            let (last, zeros) = kernel(&glo[s..e], &ghi[s..e], cell_out);
            zero_gaps += u64::from(zeros);
            bad |= u64::from(last) >= n_genes;
        }
        if bad || zero_gaps != zero_firsts {
            return false;
        }
        let recombine = if stream { recombine_counts } else { recombine_counts_cached };
        if recombine(&vlo[s0..e0], &vhi[s0..e0], data) {
            return false;
        }
        for &(p, payload) in within(&self.vexc, s0, e0) {
            let k = p as usize - s0;
            if data[k] != STREAM_MAX || !(STREAM_MAX + 1..=MAX_COUNT).contains(&payload) {
                return false;
            }
            data[k] = payload;
        }
        for &(p, payload) in within(&self.gexc, s0, e0) {
            let p = p as usize;
            let stored = u32::from(glo[p]) | u32::from(ghi[p]) << 8;
            if stored != STREAM_MAX || payload == 0 || u64::from(payload) >= n_genes {
                return false;
            }
            // The exception shifts the rest of the cell that holds it.
            let cell = self.offsets.partition_point(|&o| o as usize <= p) - 1;
            let end = self.offsets[cell + 1] as usize;
            for index in &mut indices[p - s0..end - s0] {
                let shifted = u64::from(*index) + u64::from(payload);
                if shifted >= n_genes {
                    return false;
                }
                *index = shifted as u32;
            }
        }
        true
    }

    /// Whether the planes and exceptions break no rule that decoding checks.
    fn follow_the_rules(&self) -> bool {
        let n_genes = self.n_genes;
        let n = self.gaps.len() / 2;
        let (glo, ghi) = self.gaps.split_at(n);
        let (vlo, vhi) = self.vals.split_at(n);
        if any_zero_count(vlo, vhi) {
            return false;
        }
        let stored = |lo: &[u8], hi: &[u8], p: u64| u32::from(lo[p as usize]) | u32::from(hi[p as usize]) << 8;
        for &(p, payload) in &self.vexc {
            if stored(vlo, vhi, p) != STREAM_MAX || !(STREAM_MAX + 1..=MAX_COUNT).contains(&payload) {
                return false;
            }
        }
        let (mut zero_gaps, mut zero_firsts) = (0u64, 0u64);
        let mut gexc = self.gexc.iter().peekable();
        for w in self.offsets.windows(2) {
            let (s, e) = (w[0] as usize, w[1] as usize);
            if s == e {
                continue;
            }
            zero_firsts += u64::from(glo[s] == 0 && ghi[s] == 0);
            let (sum, zeros) = gap_sum(&glo[s..e], &ghi[s..e]);
            zero_gaps += zeros;
            // The cell's last index, once its exceptions have shifted it, is
            // its largest.
            let mut last = sum;
            while let Some(&&(p, payload)) = gexc.peek().filter(|(p, _)| (*p as usize) < e) {
                if stored(glo, ghi, p) != STREAM_MAX || payload == 0 || u64::from(payload) >= n_genes {
                    return false;
                }
                last += u64::from(payload);
                gexc.next();
            }
            if sum >= n_genes || last >= n_genes {
                return false;
            }
        }
        zero_gaps == zero_firsts
    }
}

/// Makes the rows written by [`ChunkPlanes::write_row`] visible to other
/// threads in order (x86 streaming stores are weakly ordered).
pub fn finish_rows() {
    store_fence();
}

/// The exceptions at positions `s..e` (the list is sorted by position).
fn within(exceptions: &[(u64, u32)], s: usize, e: usize) -> &[(u64, u32)] {
    let lo = exceptions.partition_point(|&(p, _)| (p as usize) < s);
    let hi = exceptions.partition_point(|&(p, _)| (p as usize) < e);
    &exceptions[lo..hi]
}

/// The sum of the gaps whose bytes are `lo` and `hi`, and how many are zero.
fn gap_sum(lo: &[u8], hi: &[u8]) -> (u64, u64) {
    if lo.len() > MAX_UNCHECKED_CELL {
        let mut sum = 0u64;
        let mut zeros = 0u64;
        for (&l, &h) in lo.iter().zip(hi) {
            let g = u64::from(l) | u64::from(h) << 8;
            sum += g;
            zeros += u64::from(g == 0);
        }
        return (sum, zeros);
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the processor supports AVX2, checked just above.
            return unsafe { gap_sum_avx2(lo, hi) };
        }
    }
    gap_sum_u32(lo, hi)
}

/// Sums in u32 lanes: no wrap for at most MAX_UNCHECKED_CELL gaps.
#[inline(always)]
fn gap_sum_u32(lo: &[u8], hi: &[u8]) -> (u64, u64) {
    let mut sum = 0u32;
    let mut zeros = 0u32;
    for (&l, &h) in lo.iter().zip(hi) {
        let g = u32::from(l) | u32::from(h) << 8;
        sum += g;
        zeros += u32::from(g == 0);
    }
    (u64::from(sum), u64::from(zeros))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gap_sum_avx2(lo: &[u8], hi: &[u8]) -> (u64, u64) {
    gap_sum_u32(lo, hi)
}

/// Whether any count whose bytes are `lo` and `hi` is zero.
fn any_zero_count(lo: &[u8], hi: &[u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the processor supports AVX2, checked just above.
            return unsafe { any_zero_count_avx2(lo, hi) };
        }
    }
    any_zero_count_portable(lo, hi)
}

#[inline(always)]
fn any_zero_count_portable(lo: &[u8], hi: &[u8]) -> bool {
    // Whole blocks without an early exit, so that the loop vectorizes.
    lo.chunks(4096).zip(hi.chunks(4096)).any(|(l, h)| l.iter().zip(h).fold(false, |z, (&l, &h)| z | (l | h == 0)))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn any_zero_count_avx2(lo: &[u8], hi: &[u8]) -> bool {
    any_zero_count_portable(lo, hi)
}
