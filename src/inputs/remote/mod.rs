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

pub use cache::{BlockCacheOptions, BLOCK};
pub use prefetch::prefetch_whole;
pub use ranged::{input_stats, object_version, RangedFile};
use ranged::{open_all, sized_object};
pub(crate) use ranged::{Failure, ReadOf};

use crate::storage::{self, StorageError, StoreOptions};

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
    /// The block cache of the inputs read by ranges.
    pub block_cache: BlockCacheOptions,
}

/// The local copy of the object at `url` when inputs are downloaded: made on
/// first use (in pieces of 64 MiB, under a temporary name), then reused.
/// Its name is the URL's digest and the object's name without a query (a
/// pre-signed URL's signature is not put into a path that messages show).
pub(crate) fn downloaded(url: &str, options: &RemoteOptions) -> Result<Option<std::path::PathBuf>, StorageError> {
    let Some(dir) = options.download_dir.clone() else { return Ok(None) };
    let without_query = url.split(['?', '#']).next().unwrap_or(url);
    let name = without_query.rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or("input.h5ad");
    let digest = crate::format::fingerprint::sha256_hex(url.as_bytes());
    let path = dir.join(format!("{}-{name}", &digest[..12]));
    if path.is_file() {
        return Ok(Some(path));
    }
    let (store, key, storage::Version { size, etag }) = sized_object(url, &options.store)?;
    let local = |source: std::io::Error| StorageError::Io { location: dir.display().to_string(), source };
    std::fs::create_dir_all(&dir).map_err(local)?;
    let mut tmp = crate::storage::temp_file_in(&dir).map_err(local)?;
    const PIECE: u64 = 64 << 20;
    let mut at = 0;
    while at < size {
        let range = at..(at + PIECE).min(size);
        let bytes = match store.get_ranges_of(&key, std::slice::from_ref(&range), etag.as_deref())? {
            Some(mut parts) => parts.remove(0),
            None => {
                return Err(StorageError::Remote {
                    location: store.location(&key),
                    message: "vanished while being downloaded".into(),
                })
            }
        };
        input_stats().record(bytes.len() as u64);
        std::io::Write::write_all(&mut tmp, &bytes).map_err(local)?;
        at = range.end;
    }
    tmp.persist(&path).map_err(|e| StorageError::Io { location: path.display().to_string(), source: e.error })?;
    Ok(Some(path))
}

/// Opens the objects at `urls` at once (their sizes and first blocks), so
/// that reading them one after another does not wait a round trip per
/// file; failures are left for the opening that needs the file.
pub fn open_ahead(urls: &[&str], options: &RemoteOptions) {
    if options.download_dir.is_some() {
        return; // they are downloaded whole instead
    }
    open_all(urls, &options.store, options.block_cache);
}
