//! Inputs in buckets and on HTTP servers, for every format: where each input
//! is reached from ([`RemoteOptions`]), objects read by byte ranges through
//! a block cache with read-ahead ([`RangedFile`]) and a prefetcher for those
//! read whole ([`prefetch_whole`]), and the fallback that downloads an input
//! whole first. The formats read through these (HDF5 through its driver in
//! [`crate::inputs::h5ad`], Matrix Market as a stream); zarr stores read
//! their chunks through the storage layer itself.

use std::path::Path;

mod cache;
mod prefetch;
mod ranged;
#[cfg(test)]
mod tests;

pub use cache::{cache_budget, max_window, BLOCK};
pub use prefetch::prefetch_whole;
pub(crate) use ranged::ReadOf;
pub use ranged::{input_stats, object_version, RangedFile};
use ranged::{open_all, sized_object};

use crate::storage::{self, StoreOptions};

/// Whether `path` names an object in a bucket or on a server rather than a
/// local file.
pub fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(|s| s.contains("://") && !s.starts_with("file://"))
}

/// How inputs at URLs are reached: a value each conversion carries (two in
/// one process may differ), not a setting of the process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteOptions {
    /// The stores' options: credentials, endpoint.
    pub store: StoreOptions,
    /// Download each input whole into this folder before reading it (a
    /// fallback for servers that do not answer ranged reads), instead of
    /// reading the ranges it needs.
    pub download_dir: Option<std::path::PathBuf>,
}

/// The local copy of the object at `url` when inputs are downloaded: made on
/// first use (in pieces of 64 MiB, under a temporary name), then reused.
pub(crate) fn downloaded(url: &str, options: &RemoteOptions) -> Result<Option<std::path::PathBuf>, String> {
    let Some(dir) = options.download_dir.clone() else { return Ok(None) };
    let name = url.rsplit('/').next().unwrap_or("input.h5ad");
    let digest = crate::format::fingerprint::sha256_hex(url.as_bytes());
    let path = dir.join(format!("{}-{name}", &digest[..12]));
    if path.is_file() {
        return Ok(Some(path));
    }
    let (store, key, storage::Version { size, etag }) = sized_object(url, &options.store)?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut tmp = crate::storage::temp_file_in(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    const PIECE: u64 = 64 << 20;
    let mut at = 0;
    while at < size {
        let range = at..(at + PIECE).min(size);
        let bytes = match store.get_ranges_of(&key, std::slice::from_ref(&range), etag.as_deref()) {
            Ok(Some(mut parts)) => parts.remove(0),
            Ok(None) => return Err("vanished while being downloaded".into()),
            Err(e) => return Err(crate::error_chain(&e)),
        };
        input_stats().record(bytes.len() as u64);
        std::io::Write::write_all(&mut tmp, &bytes).map_err(|e| format!("{}: {e}", dir.display()))?;
        at = range.end;
    }
    tmp.persist(&path).map_err(|e| format!("{}: {}", path.display(), e.error))?;
    Ok(Some(path))
}

/// Opens the objects at `urls` at once (their sizes and first blocks), so
/// that reading them one after another does not wait a round trip per
/// file; failures are left for the opening that needs the file.
pub fn open_ahead(urls: &[&str], options: &RemoteOptions) {
    if options.download_dir.is_some() {
        return; // they are downloaded whole instead
    }
    open_all(urls, &options.store);
}
