//! Chunks whose codec lies about its size, refused before they are decoded.
//!
//! The `zarrs` crate sizes what it decodes by what the encoded chunk says:
//! a Zstandard frame's content size, a Blosc header's `nbytes`, and a gzip
//! stream read to its end. A chunk of a few bytes that says 2^40 would be an
//! allocation of 2^40 bytes (an abort, not an error). The store knows, from
//! each array's metadata, the most bytes one of its chunks decodes to (its
//! chunk shape, or its inner chunks' of a sharded array, times its element
//! size), and checks every chunk it serves against that before `zarrs`
//! sees it.

use serde_json::{Map, Value};

/// The largest chunk deltacells decodes: far above what anndata writes.
pub(super) const MAX_CHUNK_BYTES: u64 = 1 << 30;

/// What `zstd`'s bound of a frame without its content size may exceed the
/// chunk's bytes by (two blocks of at most 128 KiB).
const ZSTD_BLOCK_SLACK: u64 = 2 << 17;

/// What the chunks of one array may decode to.
#[derive(Clone, Debug)]
pub(super) struct ChunkLimit {
    /// Bytes of one (inner) chunk, decoded.
    pub(super) bytes: u64,
    zstd: bool,
    blosc: bool,
    gzip: bool,
}

/// The bytes of an element of a zarr data type (v3 name, or v2 `<f4`-like),
/// None for one of variable size (strings).
fn element_bytes(v3: Option<&str>, v2: Option<&str>) -> Option<u64> {
    if let Some(name) = v3 {
        return match name {
            "bool" | "int8" | "uint8" => Some(1),
            "int16" | "uint16" | "float16" => Some(2),
            "int32" | "uint32" | "float32" => Some(4),
            "int64" | "uint64" | "float64" | "complex64" => Some(8),
            "complex128" => Some(16),
            _ => None,
        };
    }
    let dtype = v2?;
    let kind = dtype.as_bytes().get(1)?;
    b"biufc".contains(kind).then(|| dtype.get(2..)?.parse().ok()).flatten()
}

fn shape(value: Option<&Value>) -> Option<Vec<u64>> {
    value?.as_array()?.iter().map(Value::as_u64).collect()
}

/// The limit of an array's chunks, from its metadata (as its `zarr.json` or
/// `.zarray` holds it); None when its elements have no fixed size.
pub(super) fn chunk_limit(meta: &Map<String, Value>) -> Option<ChunkLimit> {
    let v3_codecs = meta.get("codecs").and_then(Value::as_array);
    let (chunk, codecs): (Option<Vec<u64>>, Vec<&str>) = match v3_codecs {
        Some(codecs) => {
            let sharding = codecs.iter().find(|c| c.get("name").and_then(Value::as_str) == Some("sharding_indexed"));
            match sharding.and_then(|s| s.get("configuration")) {
                // A shard's object holds many inner chunks and their index,
                // not one stream: its bytes are not checked as one chunk.
                Some(_) => return None,
                None => (
                    shape(
                        meta.get("chunk_grid").and_then(|g| g.get("configuration")).and_then(|c| c.get("chunk_shape")),
                    ),
                    codecs.iter().filter_map(codec_name).collect(),
                ),
            }
        }
        None => (
            shape(meta.get("chunks")),
            meta.get("compressor").and_then(|c| c.get("id")).and_then(Value::as_str).into_iter().collect(),
        ),
    };
    let element =
        element_bytes(meta.get("data_type").and_then(Value::as_str), meta.get("dtype").and_then(Value::as_str))?;
    let bytes = chunk?.iter().try_fold(element, |n, &d| n.checked_mul(d)).unwrap_or(u64::MAX);
    Some(ChunkLimit {
        bytes,
        zstd: codecs.contains(&"zstd"),
        blosc: codecs.contains(&"blosc"),
        gzip: codecs.contains(&"gzip"),
    })
}

fn codec_name(codec: &Value) -> Option<&str> {
    codec.get("name").and_then(Value::as_str)
}

impl ChunkLimit {
    /// Why `chunk` (a chunk, an inner chunk of a shard, or a shard's
    /// index) cannot be one of this array's: None when it may be.
    pub(super) fn problem(&self, chunk: &[u8]) -> Option<String> {
        let says = |codec: &str, n: u64| {
            format!("its {codec} header says {n} bytes, but a chunk of this array holds {} at most", self.bytes)
        };
        if self.zstd && chunk.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            // (a frame without its content size is bounded by its blocks,
            // 128 KiB each: a block or two of slack for those)
            match zstd::zstd_safe::decompress_bound(chunk) {
                Ok(n) if n > self.bytes.saturating_add(ZSTD_BLOCK_SLACK) => return Some(says("zstd", n)),
                Ok(_) => {}
                // (frames without their size: what they decode to, counted)
                Err(_) => {
                    let decoder = zstd::stream::read::Decoder::with_buffer(chunk);
                    if let Some(n) = decoded_beyond(decoder.ok()?, self.bytes) {
                        return Some(format!("it decodes (zstd) to {n} bytes or more, {} at most", self.bytes));
                    }
                }
            }
        }
        if self.blosc && chunk.len() >= 16 {
            let word =
                |at: usize| u64::from(u32::from_le_bytes([chunk[at], chunk[at + 1], chunk[at + 2], chunk[at + 3]]));
            let (nbytes, cbytes) = (word(4), word(12));
            if cbytes <= chunk.len() as u64 && nbytes > self.bytes {
                return Some(says("blosc", nbytes));
            }
        }
        if self.gzip && chunk.starts_with(&[0x1f, 0x8b]) {
            if let Some(n) = decoded_beyond(flate2::read::MultiGzDecoder::new(chunk), self.bytes) {
                return Some(format!("it decodes (gzip) to {n} bytes or more, {} at most", self.bytes));
            }
        }
        None
    }
}

/// The bytes `stream` decodes to when more than `most` (counting stops
/// there); None when it stays within, or fails (which the codec reports).
fn decoded_beyond(stream: impl std::io::Read, most: u64) -> Option<u64> {
    let n = std::io::copy(&mut stream.take(most.saturating_add(1)), &mut std::io::sink()).ok()?;
    (n > most).then_some(n)
}
