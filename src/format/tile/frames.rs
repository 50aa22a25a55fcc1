//! zstd frames: each stream is exactly one frame that records its content
//! size (decisions.md 4). Checked before anything is decompressed, then
//! decompressed into buffers of exactly that size; compressed with one reused
//! context per thread.

use std::cell::RefCell;

use super::super::error::{EncodeError, Stream, TileError};

/// zstd frame magic number, little-endian (RFC 8878, 3.1.1).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// A zstd block produces at most 128 KiB and takes at least 4 bytes (an RLE
/// block), so a frame of `len` bytes never decompresses to more than this many
/// bytes per compressed byte. Used to reject absurd content sizes before any
/// allocation.
const ZSTD_MAX_EXPANSION: u64 = 128 * 1024 / 4;

/// Checks that `frame` is exactly one zstd frame with a content size and no
/// dictionary, and returns that content size.
pub(super) fn frame_content_size(frame: &[u8], chunk: u64, stream: Stream) -> Result<u64, TileError> {
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
}

/// Decompresses `frame` (already checked to declare `dst.len()` bytes) into `dst`.
pub(super) fn decompress_exact(frame: &[u8], dst: &mut [u8], chunk: u64, stream: Stream) -> Result<(), TileError> {
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

thread_local! {
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
}

/// Compresses `data` as one zstd frame with its content size and no checksum
/// (decisions.md 4), reusing this thread's context.
pub fn compress_frame(data: &[u8], level: i32) -> Result<Vec<u8>, EncodeError> {
    COMPRESSOR
        .with(|cell| {
            let mut slot = cell.borrow_mut();
            let compressor = match &mut *slot {
                Some((l, c)) if *l == level => c,
                slot => {
                    let mut c = zstd::bulk::Compressor::new(level)?;
                    c.include_contentsize(true)?;
                    c.include_checksum(false)?;
                    c.include_dictid(false)?;
                    &mut slot.insert((level, c)).1
                }
            };
            compressor.compress(data)
        })
        .map_err(|e| EncodeError::Zstd(e.to_string()))
}
