//! Where a dataset's bytes live. One small trait, [`Storage`], with a local-folder
//! backend today; object stores implement the same trait.
//!
//! Keys are `/`-separated paths relative to the dataset root (`manifest.json`,
//! `tiles/tile_000000.dct`). A missing object is `Ok(None)`, never an error, so
//! callers can tell "absent" from "could not read".

mod local;

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

pub use local::LocalStorage;

/// A failure to reach or read stored bytes (not a missing object).
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{location}: {source}")]
    Io { location: String, source: std::io::Error },
    #[error("{location}: range {start}..{end} is past the end of the object ({size} bytes)")]
    Range { location: String, start: u64, end: u64, size: u64 },
    #[error("{location}: {message}")]
    Unsupported { location: String, message: String },
}

/// Requests and bytes a storage backend has served, for `--stats`.
#[derive(Debug, Default)]
pub struct IoStats {
    requests: AtomicU64,
    bytes: AtomicU64,
}

impl IoStats {
    pub fn record(&self, bytes: u64) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// (requests, bytes) so far.
    pub fn snapshot(&self) -> (u64, u64) {
        (self.requests.load(Ordering::Relaxed), self.bytes.load(Ordering::Relaxed))
    }
}

/// A dataset root: local folder or object-store prefix.
pub trait Storage: Send + Sync {
    /// Where `key` is, in the user's terms, for messages.
    fn location(&self, key: &str) -> String;
    /// The size of `key`, or `None` if it does not exist.
    fn size(&self, key: &str) -> Result<Option<u64>, StorageError>;
    /// The whole of `key`, or `None` if it does not exist.
    fn get(&self, key: &str) -> Result<Option<Bytes>, StorageError>;
    /// Several byte ranges of `key`, in the order asked.
    fn get_ranges(&self, key: &str, ranges: &[Range<u64>]) -> Result<Option<Vec<Bytes>>, StorageError>;
    /// Writes `key` atomically: readers see the old object or the whole new one.
    fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError>;
    /// Removes `key`; absent is fine.
    fn delete(&self, key: &str) -> Result<(), StorageError>;
    /// Every key below `prefix` (a folder, `""` for the root), sorted.
    fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError>;
    /// Requests and bytes served so far.
    fn stats(&self) -> &IoStats;
}

/// Opens a dataset root given as a local path or `file://` URL.
pub fn open(root: &str) -> Result<Arc<dyn Storage>, StorageError> {
    if let Some(path) = root.strip_prefix("file://") {
        return Ok(Arc::new(LocalStorage::new(path)));
    }
    if let Some((scheme, _)) = root.split_once("://") {
        return Err(StorageError::Unsupported {
            location: root.to_string(),
            message: format!("{scheme}:// datasets are not supported by this build; use a local folder"),
        });
    }
    Ok(Arc::new(LocalStorage::new(root)))
}

#[cfg(test)]
mod tests;
