//! Encoding blocks of cells as tiles, exactly as decisions.md 2-6 prescribe,
//! so that the bytes are a function of the block and the settings alone:
//! chunk boundaries, byte planes, exceptions, and the placement of streams.

use std::ops::Range;

use rayon::prelude::*;

use super::super::error::EncodeError;
use super::super::CsrMatrix;
use super::frames::compress_frame;
use super::header::{seal, ChunkEntry, StreamRef, TileHeader, CHUNK_ENTRY_LEN, HEADER_LEN};
use super::STREAM_MAX;

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
        let header = TileHeader {
            n_cells,
            nnz,
            n_genes: block.n_cols,
            n_chunks: n_chunks as u32,
            indptr_off,
            total_size: total,
            crc32: 0,
        };
        header.write(&mut blob);
        for (c, e) in table.iter().enumerate() {
            e.write(&mut blob, c);
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
        seal(&mut blob);
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
    if n_genes == 0 || u64::from(n_genes) > crate::format::MAX_GENES {
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
            if count == 0 || count > crate::format::MAX_COUNT {
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
        let previous = bounds.last().copied().unwrap_or(0);
        bounds.push(best.max(previous + 1).min(n_cells - (c - k)));
    }
    bounds.push(n_cells);
    bounds
}
