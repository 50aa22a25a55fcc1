//! The fixed parts of a tile: the 64-byte header and the 96-byte chunk table
//! entries (format.md, "Header (64 bytes)" and "Chunk table entry"), read and
//! written through the same named offsets, so that reader and writer cannot
//! disagree about where a field is.

use super::super::error::TileError;

/// format.md, "Header (64 bytes)".
pub const HEADER_LEN: usize = 64;
/// format.md, "Chunk table entry (96 bytes ...)": twelve uint64 fields.
pub const CHUNK_ENTRY_LEN: usize = 96;
pub const MAGIC: &[u8; 8] = b"DELTACEL";
pub const VERSION: u32 = 2;

/// Byte offsets of the header's fields (format.md, "Header (64 bytes)").
mod at {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const FLAGS: usize = 12;
    pub const N_CELLS: usize = 16;
    pub const NNZ: usize = 24;
    pub const N_GENES: usize = 32;
    pub const N_CHUNKS: usize = 36;
    pub const INDPTR_OFF: usize = 40;
    pub const TOTAL_SIZE: usize = 48;
    pub const CRC32: usize = 56;
    pub const RESERVED: usize = 60;
}

/// The little-endian u32 at `off`; the caller has checked that `b` holds it.
pub(super) fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(word)
}

/// The little-endian u64 at `off`; the caller has checked that `b` holds it.
pub(super) fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(word)
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

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

impl TileHeader {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `blob` (magic,
    /// version, zero flags and reserved field included). The CRC is written as
    /// it is in `self`; [`seal`] computes it once the rest of the blob is final.
    pub(super) fn write(&self, blob: &mut [u8]) {
        blob[at::MAGIC..at::MAGIC + 8].copy_from_slice(MAGIC);
        put_u32(blob, at::VERSION, VERSION);
        put_u32(blob, at::FLAGS, 0);
        put_u64(blob, at::N_CELLS, self.n_cells);
        put_u64(blob, at::NNZ, self.nnz);
        put_u32(blob, at::N_GENES, self.n_genes);
        put_u32(blob, at::N_CHUNKS, self.n_chunks);
        put_u64(blob, at::INDPTR_OFF, self.indptr_off);
        put_u64(blob, at::TOTAL_SIZE, self.total_size);
        put_u32(blob, at::CRC32, self.crc32);
        put_u32(blob, at::RESERVED, 0);
    }
}

/// Computes and stores the CRC of a tile whose bytes after the header are final.
pub(super) fn seal(blob: &mut [u8]) {
    let crc = crc32fast::hash(&blob[HEADER_LEN..]);
    put_u32(blob, at::CRC32, crc);
}

/// Parses and checks the header of `blob`: magic, version, flags, reserved field,
/// n_genes range, total size and CRC.
pub fn parse_header(blob: &[u8]) -> Result<TileHeader, TileError> {
    let header = parse_header_fields(blob)?;
    let computed = crc32fast::hash(&blob[HEADER_LEN..]);
    if computed != header.crc32 {
        return Err(TileError::Checksum { stored: header.crc32, computed });
    }
    Ok(header)
}

/// Every check of [`parse_header`] but the CRC, for bytes whose CRC this
/// process has already checked.
pub(super) fn parse_header_fields(blob: &[u8]) -> Result<TileHeader, TileError> {
    parse_header_sized(blob, blob.len() as u64)
}

/// Every check of [`parse_header`] but the CRC, of a tile's first bytes
/// `prefix` (at least the header) when the whole tile is `size` bytes.
pub(super) fn parse_header_sized(blob: &[u8], size: u64) -> Result<TileHeader, TileError> {
    if cfg!(target_endian = "big") {
        return Err(TileError::BigEndianHost);
    }
    if blob.len() < HEADER_LEN {
        return Err(TileError::ShortHeader { len: blob.len() as u64 });
    }
    if &blob[at::MAGIC..at::MAGIC + 8] != MAGIC {
        return Err(TileError::Magic { found: String::from_utf8_lossy(&blob[at::MAGIC..at::MAGIC + 8]).into_owned() });
    }
    let version = u32_at(blob, at::VERSION);
    if version != VERSION {
        return Err(TileError::Version { found: version });
    }
    let flags = u32_at(blob, at::FLAGS);
    if flags != 0 {
        return Err(TileError::Flags { found: flags });
    }
    let reserved = u32_at(blob, at::RESERVED);
    if reserved != 0 {
        return Err(TileError::Reserved { found: reserved });
    }
    let header = TileHeader {
        n_cells: u64_at(blob, at::N_CELLS),
        nnz: u64_at(blob, at::NNZ),
        n_genes: u32_at(blob, at::N_GENES),
        n_chunks: u32_at(blob, at::N_CHUNKS),
        indptr_off: u64_at(blob, at::INDPTR_OFF),
        total_size: u64_at(blob, at::TOTAL_SIZE),
        crc32: u32_at(blob, at::CRC32),
    };
    if header.n_genes == 0 || u64::from(header.n_genes) > crate::format::MAX_GENES {
        return Err(TileError::NGenesRange { found: header.n_genes.into() });
    }
    if header.total_size != size {
        return Err(TileError::TotalSize { header: header.total_size, actual: size });
    }
    Ok(header)
}

/// A stream's place in the blob.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct StreamRef {
    pub off: u64,
    pub len: u64,
}

/// One 96-byte chunk table entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct ChunkEntry {
    pub cell_lo: u64,
    pub cell_hi: u64,
    pub nnz_lo: u64,
    pub nnz_hi: u64,
    pub gaps: StreamRef,
    pub vals: StreamRef,
    pub vexc: StreamRef,
    pub gexc: StreamRef,
}

impl ChunkEntry {
    /// The chunk's nonzeros.
    pub fn n(&self) -> u64 {
        self.nnz_hi - self.nnz_lo
    }

    /// The twelve fields in their order in the table.
    fn words(&self) -> [u64; 12] {
        let (g, v, ve, ge) = (self.gaps, self.vals, self.vexc, self.gexc);
        [
            self.cell_lo,
            self.cell_hi,
            self.nnz_lo,
            self.nnz_hi,
            g.off,
            g.len,
            v.off,
            v.len,
            ve.off,
            ve.len,
            ge.off,
            ge.len,
        ]
    }

    /// Entry `index` of the chunk table of `blob`, which the caller has checked
    /// to hold it.
    pub fn read(blob: &[u8], index: usize) -> ChunkEntry {
        let base = HEADER_LEN + index * CHUNK_ENTRY_LEN;
        let w = |i: usize| u64_at(blob, base + 8 * i);
        ChunkEntry {
            cell_lo: w(0),
            cell_hi: w(1),
            nnz_lo: w(2),
            nnz_hi: w(3),
            gaps: StreamRef { off: w(4), len: w(5) },
            vals: StreamRef { off: w(6), len: w(7) },
            vexc: StreamRef { off: w(8), len: w(9) },
            gexc: StreamRef { off: w(10), len: w(11) },
        }
    }

    /// Writes this entry as entry `index` of the chunk table of `blob`.
    pub fn write(&self, blob: &mut [u8], index: usize) {
        let base = HEADER_LEN + index * CHUNK_ENTRY_LEN;
        for (i, v) in self.words().into_iter().enumerate() {
            put_u64(blob, base + 8 * i, v);
        }
    }
}
