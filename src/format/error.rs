use std::fmt;

/// One of the four compressed streams of a chunk (format.md, "Streams", "Exceptions").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Gaps,
    Vals,
    Vexc,
    Gexc,
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stream::Gaps => "gaps",
            Stream::Vals => "vals",
            Stream::Vexc => "vexc",
            Stream::Gexc => "gexc",
        })
    }
}

/// Why a tile was rejected. Each variant carries the facts and names, through
/// [`TileError::rule`], the rule of format.md or decisions.md that it enforces.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TileError {
    #[error("tiles cannot be read on a big-endian host")]
    BigEndianHost,
    #[error("tile is {len} bytes, shorter than the 64-byte header")]
    ShortHeader { len: u64 },
    #[error("bad magic {found:?}, expected \"DELTACEL\"")]
    Magic { found: String },
    #[error("unsupported tile version {found}, expected 2")]
    Version { found: u32 },
    #[error("unknown flags {found:#x}, expected 0")]
    Flags { found: u32 },
    #[error("reserved header field is {found}, expected 0")]
    Reserved { found: u32 },
    #[error("header total_size is {header} but the tile is {actual} bytes")]
    TotalSize { header: u64, actual: u64 },
    #[error("crc32 mismatch: header says {stored:#010x}, bytes give {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("n_genes {found} outside 1..2^31")]
    NGenesRange { found: u64 },
    #[error("header {field} is {header} but {expected} was expected")]
    HeaderMismatch { field: &'static str, header: u64, expected: u64 },
    #[error("layout: {reason}")]
    Layout { reason: String },
    #[error("chunk {chunk}: {reason}")]
    ChunkTable { chunk: u64, reason: String },
    #[error("indptr[{position}]: {reason}")]
    Indptr { position: u64, reason: String },
    #[error("chunk {chunk} {stream} stream: {reason}")]
    Frame { chunk: u64, stream: Stream, reason: String },
    #[error("chunk {chunk} {stream} stream: frame holds {actual} bytes, expected {expected}")]
    FrameSize { chunk: u64, stream: Stream, expected: u64, actual: u64 },
    #[error("chunk {chunk}, cell {cell}, nonzero {position}: gene index {gene} is not below n_genes {n_genes}")]
    GeneIndexRange { chunk: u64, cell: u64, position: u64, gene: u64, n_genes: u64 },
    #[error("chunk {chunk}, cell {cell}, nonzero {position}: gene indices are not strictly increasing (gap of 0)")]
    GeneIndexOrder { chunk: u64, cell: u64, position: u64 },
    #[error("chunk {chunk}, nonzero {position}: stored count is 0")]
    ZeroCount { chunk: u64, position: u64 },
    #[error("chunk {chunk} {stream} exception {index}: {reason}")]
    ExceptionPosition { chunk: u64, stream: Stream, index: u64, reason: String },
    #[error("chunk {chunk} vexc at nonzero {position}: payload {value} outside 65536..2^31-1")]
    VexcPayload { chunk: u64, position: u64, value: u64 },
    #[error("chunk {chunk} gexc at nonzero {position}: payload {value} outside 1..n_genes-1")]
    GexcPayload { chunk: u64, position: u64, value: u64 },
    #[error("chunk {chunk} {stream} exception at nonzero {position}: stored value is {stored}, expected 65535")]
    ExceptionStoredValue { chunk: u64, stream: Stream, position: u64, stored: u64 },
}

impl TileError {
    /// A short, stable name of the rule that was broken, as used by `verify --json`
    /// and by the conformance vectors in `shared/golden/INDEX.json`.
    pub fn rule(&self) -> &'static str {
        match self {
            TileError::BigEndianHost => "tile:endianness",
            TileError::ShortHeader { .. } | TileError::TotalSize { .. } => "tile:total-size",
            TileError::Magic { .. } => "tile:magic",
            TileError::Version { .. } => "tile:version",
            TileError::Flags { .. } => "tile:flags",
            TileError::Reserved { .. } => "tile:reserved",
            TileError::Checksum { .. } => "tile:crc32",
            TileError::NGenesRange { .. } => "tile:n-genes",
            TileError::HeaderMismatch { field, .. } => match *field {
                "n_genes" => "tile:n-genes",
                "nnz" => "tile-nnz",
                _ => "tile-cells",
            },
            TileError::Layout { .. } => "tile:layout",
            TileError::ChunkTable { .. } => "tile:chunk-table",
            TileError::Indptr { .. } => "tile:indptr",
            TileError::Frame { .. } => "tile:frame",
            TileError::FrameSize { .. } => "tile:frame-size",
            TileError::GeneIndexRange { .. } => "tile:gene-index-range",
            TileError::GeneIndexOrder { .. } => "tile:gene-index-order",
            TileError::ZeroCount { .. } => "tile:zero-count",
            TileError::ExceptionPosition { .. } => "tile:exc-positions",
            TileError::VexcPayload { .. } => "tile:vexc-payload",
            TileError::GexcPayload { .. } => "tile:gexc-payload",
            TileError::ExceptionStoredValue { .. } => "tile:exc-stored-value",
        }
    }
}

/// Why a block of cells could not be encoded as a tile.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum EncodeError {
    #[error("n_genes {0} outside 1..2^31")]
    NGenes(u64),
    #[error("indptr: {0}")]
    Indptr(String),
    #[error("cell {cell}: gene {gene} is not below n_genes {n_genes}")]
    GeneRange { cell: u64, gene: u32, n_genes: u32 },
    #[error("cell {cell}: gene {gene} follows gene {previous}; genes must be strictly increasing")]
    GeneOrder { cell: u64, gene: u32, previous: u32 },
    #[error("cell {cell}, gene {gene}: count {count} outside 1..2^31-1")]
    Count { cell: u64, gene: u32, count: u32 },
    #[error("cell {cell}, gene {gene}: more than {limit} {what} above 65535 in one tile; this does not look like raw counts")]
    TooManyExceptions { what: &'static str, limit: u64, cell: u64, gene: u32 },
    #[error("a chunk would hold {0} nonzeros, 2^32 or more; use more chunks")]
    ChunkTooLarge(u64),
    #[error("zstd: {0}")]
    Zstd(String),
}

impl EncodeError {
    /// The tile-local cell and the gene an error is about, when it is about one.
    pub fn cell_and_gene(&self) -> Option<(u64, u32)> {
        match *self {
            EncodeError::GeneRange { cell, gene, .. }
            | EncodeError::GeneOrder { cell, gene, .. }
            | EncodeError::Count { cell, gene, .. }
            | EncodeError::TooManyExceptions { cell, gene, .. } => Some((cell, gene)),
            _ => None,
        }
    }

    /// The error without its cell and gene, for messages that name them
    /// another way.
    pub fn problem(&self) -> String {
        match self {
            EncodeError::TooManyExceptions { what, limit, .. } => {
                format!("more than {limit} {what} above 65535 in one tile; this does not look like raw counts")
            }
            EncodeError::Count { count, .. } => format!("count {count} outside 1..2^31-1"),
            other => other.to_string(),
        }
    }
}
