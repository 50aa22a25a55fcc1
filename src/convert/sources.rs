//! Where an input is and which format reads it: the one place that knows
//! the formats (every input is an .h5ad file today) and the facts of inputs
//! at URLs (their size and entity tag), so that the input types
//! ([`super::input`]) and the formats that implement them never import each
//! other.

use std::path::Path;

use super::input::{InputError, InputSource};

/// How inputs at URLs are reached (credentials, endpoint, or downloaded
/// whole first): part of each conversion's options.
pub use crate::h5ad::remote::RemoteOptions as InputOptions;

/// The size of an input in bytes (of the object, for a URL), if it can be had.
pub fn input_size(path: &Path, options: &InputOptions) -> Option<u64> {
    input_version(path, options).map(|v| v.size)
}

/// The size of an input and, for an object at a URL, its entity tag: what a
/// shard compares with the plan's record to refuse a file that changed.
pub fn input_version(path: &Path, options: &InputOptions) -> Option<crate::storage::Version> {
    if crate::h5ad::remote::is_url(path) {
        return crate::storage::ranged::object_version(&path.to_string_lossy(), &options.store).ok();
    }
    std::fs::metadata(path).map(|m| crate::storage::Version { size: m.len(), etag: None }).ok()
}

/// How a version reads in a message: `37393704 bytes`, `, ETag "..."` after
/// it when there is one.
pub(crate) fn describe_version(version: &crate::storage::Version) -> String {
    match &version.etag {
        Some(tag) => format!("{} bytes, ETag {tag}", version.size),
        None => format!("{} bytes", version.size),
    }
}

/// Opens `path` (a local file, or an s3://, gs:// or http(s):// URL, read by
/// ranges) for conversion of its matrix `matrix` (`X`, `raw/X`,
/// `layers/NAME`). Every input is an .h5ad file today.
pub fn open(path: &Path, matrix: &str, options: &InputOptions) -> Result<Box<dyn InputSource>, InputError> {
    Ok(Box::new(crate::h5ad::H5adSource::open_with(path, matrix, options)?))
}
