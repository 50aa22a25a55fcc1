//! Where a dataset's bytes live. One small trait, [`Storage`], with a local-folder
//! backend and an object-store backend (S3, GCS, HTTP) behind it.
//!
//! Keys are `/`-separated paths relative to the dataset root (`manifest.json`,
//! `tiles/tile_000000.dct`). A missing object is `Ok(None)`, never an error, so
//! callers can tell "absent" from "could not read".

mod aws_profile;
pub mod conformance;
pub mod lease;
mod local;
mod object;

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

pub(crate) use local::temp_file_in;
pub use local::LocalStorage;
pub use object::{anonymous_gcs, ObjectStorage, StoreOptions};

use crate::redact::redact;

/// A failure to reach or read stored bytes (not a missing object).
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A local file could not be read or written (the cause is left to
    /// `source()`, so that a chain is printed once).
    #[error("{location}")]
    Io { location: String, source: std::io::Error },
    /// A read asked for bytes the object does not have.
    #[error("{location}: range {start}..{end} is past the end of the object ({size} bytes)")]
    Range { location: String, start: u64, end: u64, size: u64 },
    /// An object store's error, with the HTTP status where there was one.
    #[error("{location}: {message}")]
    Remote { location: String, message: String },
    /// A location or operation this backend cannot serve.
    #[error("{location}: {message}")]
    Unsupported { location: String, message: String },
    /// The object is no longer the version being read (its entity tag changed).
    #[error("{location}: the object changed while it was being read (it is no longer ETag {etag})")]
    Changed { location: String, etag: String },
    /// A request the store did not serve, for a reason of its own: the
    /// connection refused or timed out, access denied, nothing there. Says
    /// which, and what to check.
    #[error("{location}: {failure}")]
    Request { location: String, failure: RequestFailure },
}

impl StorageError {
    /// The store's failure to serve a request, if that is what this is
    /// (rather than a problem of the bytes it sent).
    pub fn request_failure(&self) -> Option<&RequestFailure> {
        match self {
            StorageError::Request { failure, .. } => Some(failure),
            _ => None,
        }
    }
}

/// Which kind of store a location is in, for the advice of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    S3,
    Gcs,
    Http,
    /// Any other (an in-memory store, a test's).
    Other,
}

impl StoreKind {
    /// The kind of store a URL names.
    pub fn of(url: &str) -> StoreKind {
        let scheme = url.split_once("://").map_or("", |(s, _)| s).to_ascii_lowercase();
        match scheme.as_str() {
            "s3" | "s3a" => StoreKind::S3,
            "gs" => StoreKind::Gcs,
            "http" | "https" => StoreKind::Http,
            _ => StoreKind::Other,
        }
    }

    /// Where the address of such a store is set.
    fn address(self) -> &'static str {
        match self {
            StoreKind::S3 => "the endpoint (--endpoint, AWS_ENDPOINT_URL)",
            StoreKind::Gcs => "the endpoint (--endpoint, STORAGE_EMULATOR_HOST)",
            _ => "the URL's host and port",
        }
    }

    /// Where the credentials of such a store come from.
    fn credentials(self) -> &'static str {
        match self {
            StoreKind::S3 => {
                "check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, or AWS_PROFILE's in ~/.aws/credentials) and that they may read this bucket; --anonymous for a public bucket"
            }
            StoreKind::Gcs => {
                "check the credentials (GOOGLE_APPLICATION_CREDENTIALS) and that they may read this bucket; --anonymous for a public bucket"
            }
            _ => "check the URL's credentials, or whether its signature has expired (ask for a new pre-signed URL)",
        }
    }

    fn missing(self) -> &'static str {
        match self {
            StoreKind::S3 | StoreKind::Gcs => "check the bucket's name and the path",
            _ => "check the URL's path",
        }
    }
}

/// Why a store did not serve a request, and what to check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestFailure {
    /// The server refused the connection: nothing listens at the address.
    Refused { kind: StoreKind, server: Option<String> },
    /// No connection, or no answer, in the time allowed.
    TimedOut { kind: StoreKind, server: Option<String> },
    /// No connection for another reason (`cause`: the host's name did not
    /// resolve, the network is unreachable, TLS failed).
    Unreachable { kind: StoreKind, server: Option<String>, cause: String },
    /// The store refused access (HTTP 401 or 403; `code`: the store's own
    /// name for why, as S3's `InvalidAccessKeyId`).
    Denied { kind: StoreKind, status: u16, code: Option<String> },
    /// Nothing at this location (HTTP 404): the object, or its bucket.
    NotFound { kind: StoreKind },
}

impl std::fmt::Display for RequestFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = |server: &Option<String>| server.as_ref().map(|s| format!(" {s}")).unwrap_or_default();
        match self {
            RequestFailure::Refused { kind, server } => write!(
                f,
                "connection refused{}: nothing is listening there; check {} and that the server is running",
                server.as_ref().map(|s| format!(" by {s}")).unwrap_or_default(),
                kind.address()
            ),
            RequestFailure::TimedOut { kind, server } => write!(
                f,
                "no answer from{} in time (timed out): check the network (a proxy, a firewall), {} and that the server is up",
                at(server),
                kind.address()
            ),
            RequestFailure::Unreachable { kind, server, cause } => {
                write!(f, "cannot connect to{} ({cause}): check {} and the network", at(server), kind.address())
            }
            RequestFailure::Denied { kind, status, code } => {
                let what = if *status == 401 { "not authenticated" } else { "access denied" };
                let code = code.as_ref().map(|c| format!(", {c}")).unwrap_or_default();
                write!(f, "{what} (HTTP {status}{code}): {}", kind.credentials())
            }
            RequestFailure::NotFound { kind } => write!(f, "not found (HTTP 404): {}", kind.missing()),
        }
    }
}

/// Requests and bytes a storage backend has served, for `--stats`.
#[derive(Debug, Default)]
pub struct IoStats {
    requests: AtomicU64,
    bytes: AtomicU64,
    uploads: AtomicU64,
    uploaded: AtomicU64,
    /// Attempts that failed in a way that is tried again (shared with the
    /// HTTP client that counts them).
    retries: Arc<AtomicU64>,
}

impl IoStats {
    /// One read request (GET, HEAD, listing) that fetched `bytes`.
    pub fn record(&self, bytes: u64) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// One object of `bytes` written.
    pub fn record_upload(&self, bytes: u64) {
        self.uploads.fetch_add(1, Ordering::Relaxed);
        self.uploaded.fetch_add(bytes, Ordering::Relaxed);
    }

    /// (requests, bytes) read so far.
    pub fn snapshot(&self) -> (u64, u64) {
        (self.requests.load(Ordering::Relaxed), self.bytes.load(Ordering::Relaxed))
    }

    /// HTTP attempts of this store's requests that failed in a way that is
    /// tried again (a 5xx or 429 answer, a connection that failed or was
    /// dropped), so far. Each was retried, but for the last attempt of a
    /// request whose retries ran out (which then failed).
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// The counter of [`IoStats::retries`], for the client that counts them.
    pub(crate) fn retry_counter(&self) -> Arc<AtomicU64> {
        self.retries.clone()
    }

    /// (objects, bytes) written so far.
    pub fn uploads(&self) -> (u64, u64) {
        (self.uploads.load(Ordering::Relaxed), self.uploaded.load(Ordering::Relaxed))
    }
}

/// One version of an object: its size, and the entity tag the store gives
/// it (an object replaced by one of the same size has another).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub size: u64,
    pub etag: Option<String>,
}

/// What [`Storage::try_lock_root`] got.
pub enum RootLock {
    /// The lock, held until this is dropped (or the process ends, however it ends).
    Held(std::fs::File),
    /// An object store's lease ([`lease`]), renewed until this is dropped.
    Leased(lease::Lease),
    /// Another process holds it: who, when the store says (a lease's holder
    /// and how long ago it was renewed).
    Busy { holder: Option<String> },
    /// This storage has no such lock (an object store, or a file system
    /// without locks).
    Unsupported,
}

/// The non-empty `spans` in order of their start, those at most `gap`
/// bytes apart joined into one: each span lies whole in one of the ranges
/// returned (fewer, larger reads, for at most `gap` bytes read in vain
/// between two).
pub fn merge_ranges(mut spans: Vec<Range<u64>>, gap: u64) -> Vec<Range<u64>> {
    spans.retain(|s| s.start < s.end);
    spans.sort_unstable_by_key(|s| s.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(spans.len());
    for s in spans {
        match out.last_mut() {
            Some(last) if s.start <= last.end.saturating_add(gap) => last.end = last.end.max(s.end),
            _ => out.push(s),
        }
    }
    out
}

/// One answer of [`Storage::get_ranges_many`]: the ranges' bytes, or None
/// when the object does not exist.
pub type ManyRanges = Result<Option<Vec<Bytes>>, StorageError>;

/// One request of [`Storage::get_ranges_pinned`]: byte ranges of `key`, of
/// the version `etag` names when it names one.
#[derive(Clone, Debug)]
pub struct PinnedRequest {
    pub key: String,
    pub ranges: Vec<Range<u64>>,
    pub etag: Option<String>,
}

/// One answer of [`Storage::get_ranges_pinned`]: the ranges' bytes and the
/// version they are of (None where the store does not tell versions
/// apart), or None when the object does not exist.
pub type PinnedRanges = Result<Option<(Vec<Bytes>, Option<String>)>, StorageError>;

/// A dataset root: local folder or object-store prefix.
pub trait Storage: Send + Sync {
    /// Takes the root's exclusive lock if it is free, for a writer that
    /// changes a finished dataset in place (append, finalize). A local folder
    /// has one: an OS lock on the folder itself, which the system releases
    /// when the process ends, killed or not.
    fn try_lock_root(&self) -> Result<RootLock, StorageError> {
        Ok(RootLock::Unsupported)
    }
    /// Where `key` is, in the user's terms, for messages.
    fn location(&self, key: &str) -> String;
    /// The size of `key`, or `None` if it does not exist.
    fn size(&self, key: &str) -> Result<Option<u64>, StorageError>;
    /// The size and entity tag of `key`, or `None` if it does not exist (a
    /// store without tags gives the size alone).
    fn version(&self, key: &str) -> Result<Option<Version>, StorageError> {
        Ok(self.size(key)?.map(|size| Version { size, etag: None }))
    }
    /// The whole of `key`, or `None` if it does not exist.
    fn get(&self, key: &str) -> Result<Option<Bytes>, StorageError>;
    /// Several byte ranges of `key`, in the order asked.
    fn get_ranges(&self, key: &str, ranges: &[Range<u64>]) -> Result<Option<Vec<Bytes>>, StorageError>;
    /// [`Storage::get_ranges`] of the version of `key` whose entity tag is
    /// `etag` (from [`Storage::version`]): a store holding another version
    /// now answers [`StorageError::Changed`] rather than bytes of two
    /// versions. A store without tags reads as `get_ranges` does.
    fn get_ranges_of(
        &self,
        key: &str,
        ranges: &[Range<u64>],
        etag: Option<&str>,
    ) -> Result<Option<Vec<Bytes>>, StorageError> {
        let _ = etag;
        self.get_ranges(key, ranges)
    }
    /// [`Storage::get_ranges`] of several keys, each request's answer in
    /// its place: an object store fetches them all at once (a gather's
    /// chunks of many tiles cost one round trip, not one a tile).
    fn get_ranges_many(&self, requests: &[(String, Vec<Range<u64>>)]) -> Vec<ManyRanges> {
        requests.iter().map(|(key, ranges)| self.get_ranges(key, ranges)).collect()
    }
    /// [`Storage::get_ranges_many`], each request of the version its
    /// `etag` names (a store holding another version now answers
    /// [`StorageError::Changed`]), each answer with the version it read: a
    /// reader that reads a tile's index, then its chunks, pinned to the
    /// version of the index, gets bytes of one version or an error. A
    /// local file's version is its identity (inode, size and times: our
    /// writers replace a file by renaming a new one over it). This default,
    /// for a store without tags, reads as `get_ranges_of` does and claims no
    /// version (None): it pins nothing it cannot check.
    fn get_ranges_pinned(&self, requests: &[PinnedRequest]) -> Vec<PinnedRanges> {
        requests
            .iter()
            .map(|r| Ok(self.get_ranges_of(&r.key, &r.ranges, r.etag.as_deref())?.map(|parts| (parts, None))))
            .collect()
    }
    /// Whether the bytes are on this machine (a local folder): reading a
    /// tile whole costs little more than reading a part of it.
    fn is_local(&self) -> bool {
        false
    }
    /// The requests and bytes that `get_ranges` with these ranges costs (a
    /// store that merges nearby ranges counts the merged requests).
    fn read_cost(&self, ranges: &[Range<u64>]) -> (u64, u64) {
        let nonempty = ranges.iter().filter(|r| r.start < r.end);
        (nonempty.clone().count() as u64, nonempty.map(|r| r.end - r.start).sum())
    }
    /// Writes `key` atomically: readers see the old object or the whole new one.
    fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError>;
    /// A temporary file to write `key`'s bytes into, for
    /// [`Storage::put_spooled`]: what is too large to build in memory (an
    /// obs shard of a thousand tiles). This default puts it in the system's
    /// temporary folder, readable by this account only (the folder is
    /// shared); a local folder puts it beside `key`.
    fn spool(&self, key: &str) -> Result<Spool, StorageError> {
        let file = tempfile::Builder::new()
            .prefix(".deltacells-")
            .suffix(".tmp")
            .tempfile()
            .map_err(|source| StorageError::Io { location: self.location(key), source })?;
        Ok(Spool { file })
    }
    /// Stores what was written to `spool` as `key`, atomically as
    /// [`Storage::put`] does. This default reads it back and puts it; a
    /// local folder renames the file into place.
    fn put_spooled(&self, key: &str, spool: Spool) -> Result<(), StorageError> {
        let data = spool.into_bytes().map_err(|source| StorageError::Io { location: self.location(key), source })?;
        self.put(key, data)
    }
    /// Removes `key`; absent is fine.
    fn delete(&self, key: &str) -> Result<(), StorageError>;
    /// Moves `from` to `to`, replacing `to`. Readers of `to` see the old
    /// object or the whole new one; once it returns, `from` is gone. Not
    /// atomic as a whole in object stores (a copy, then a delete): a move
    /// interrupted there leaves both, and moving again completes it.
    fn rename(&self, from: &str, to: &str) -> Result<(), StorageError> {
        let data = self.get(from)?.ok_or_else(|| StorageError::Io {
            location: self.location(from),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })?;
        self.put(to, data)?;
        self.delete(from)
    }
    /// Every key below `prefix` (a folder, `""` for the root), sorted.
    fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError>;
    /// Every key below `prefix` with its size, sorted.
    fn list_sizes(&self, prefix: &str) -> Result<Vec<(String, u64)>, StorageError> {
        let mut out = Vec::new();
        for key in self.list(prefix)? {
            if let Some(size) = self.size(&key)? {
                out.push((key, size));
            }
        }
        Ok(out)
    }
    /// Whether `list` works (a plain HTTP server cannot list).
    fn can_list(&self) -> bool {
        true
    }
    /// Requests and bytes served so far.
    fn stats(&self) -> &IoStats;
}

/// A key's bytes being written to a temporary file (see [`Storage::spool`]);
/// dropped without being put, the file is removed.
pub struct Spool {
    file: tempfile::NamedTempFile,
}

impl Spool {
    /// What was written, read back (for a store that takes bytes).
    fn into_bytes(self) -> std::io::Result<Bytes> {
        std::fs::read(self.file.path()).map(Bytes::from)
    }
}

impl std::io::Write for Spool {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// The keys of another storage below `prefix`: what a writer writes here lands
/// at `prefix/key` there (an append stages its files this way).
#[cfg(feature = "convert")]
pub(crate) struct Within<'a> {
    inner: &'a dyn Storage,
    /// Ends with `/`.
    prefix: String,
}

#[cfg(feature = "convert")]
impl<'a> Within<'a> {
    pub(crate) fn new(inner: &'a dyn Storage, prefix: &str) -> Self {
        Within { inner, prefix: format!("{}/", prefix.trim_end_matches('/')) }
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}

#[cfg(feature = "convert")]
impl Storage for Within<'_> {
    fn location(&self, key: &str) -> String {
        self.inner.location(&self.key(key))
    }
    fn size(&self, key: &str) -> Result<Option<u64>, StorageError> {
        self.inner.size(&self.key(key))
    }
    fn version(&self, key: &str) -> Result<Option<Version>, StorageError> {
        self.inner.version(&self.key(key))
    }
    fn get(&self, key: &str) -> Result<Option<Bytes>, StorageError> {
        self.inner.get(&self.key(key))
    }
    fn get_ranges(&self, key: &str, ranges: &[Range<u64>]) -> Result<Option<Vec<Bytes>>, StorageError> {
        self.inner.get_ranges(&self.key(key), ranges)
    }
    fn get_ranges_of(
        &self,
        key: &str,
        ranges: &[Range<u64>],
        etag: Option<&str>,
    ) -> Result<Option<Vec<Bytes>>, StorageError> {
        self.inner.get_ranges_of(&self.key(key), ranges, etag)
    }
    fn get_ranges_pinned(&self, requests: &[PinnedRequest]) -> Vec<PinnedRanges> {
        let within: Vec<PinnedRequest> =
            requests.iter().map(|r| PinnedRequest { key: self.key(&r.key), ..r.clone() }).collect();
        self.inner.get_ranges_pinned(&within)
    }
    fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
        self.inner.put(&self.key(key), data)
    }
    fn spool(&self, key: &str) -> Result<Spool, StorageError> {
        self.inner.spool(&self.key(key))
    }
    fn put_spooled(&self, key: &str, spool: Spool) -> Result<(), StorageError> {
        self.inner.put_spooled(&self.key(key), spool)
    }
    fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.inner.delete(&self.key(key))
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let keys = self.inner.list(&self.key(prefix))?;
        Ok(keys.into_iter().filter_map(|k| k.strip_prefix(&self.prefix).map(str::to_string)).collect())
    }
    fn stats(&self) -> &IoStats {
        self.inner.stats()
    }
}

/// Where a dataset root is, as the user named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A local folder (a path, or a `file://` URL).
    Local(std::path::PathBuf),
    /// `s3://bucket/prefix` (also `s3a://`).
    S3 { bucket: String, prefix: String },
    /// `gs://bucket/prefix`.
    Gcs { bucket: String, prefix: String },
    /// `http://` or `https://`: read-only, no listing. An https address of a
    /// bucket's host is read as plain HTTP too; use `s3://` or `gs://` for the
    /// bucket's own API.
    Http { url: String },
}

impl Location {
    /// Parses a dataset root: anything with `://` is a URL, read by
    /// object_store's own scheme parser; anything else a local path.
    pub fn parse(root: &str) -> Result<Location, StorageError> {
        use object_store::ObjectStoreScheme as Scheme;
        if !root.contains("://") {
            return Ok(Location::Local(root.into()));
        }
        let fail = |message: String| StorageError::Unsupported { location: redact(root).into_owned(), message };
        let unsupported = || {
            fail(format!(
                "{} is not a supported dataset location (use a local path, file://, s3://, gs://, http:// or https://)",
                root.split_once("://").map_or(root, |(scheme, _)| scheme).to_string() + "://"
            ))
        };
        let url = url::Url::parse(root).map_err(|e| fail(format!("not a valid URL: {e}")))?;
        if matches!(url.scheme(), "http" | "https") {
            return Ok(Location::Http { url: root.trim_end_matches('/').to_string() });
        }
        let (scheme, path) = Scheme::parse(&url).map_err(|_| unsupported())?;
        let bucket = || url.host_str().unwrap_or_default().to_string();
        match scheme {
            Scheme::Local => url.to_file_path().map(Location::Local).map_err(|()| fail("not a local file path".into())),
            Scheme::AmazonS3 => Ok(Location::S3 { bucket: bucket(), prefix: path.to_string() }),
            Scheme::GoogleCloudStorage => Ok(Location::Gcs { bucket: bucket(), prefix: path.to_string() }),
            _ => Err(unsupported()),
        }
    }

    /// Whether this is a bucket or server rather than a local folder.
    pub fn is_remote(&self) -> bool {
        !matches!(self, Location::Local(_))
    }
}

/// Opens a dataset root given as a local path, `file://` URL, or object-store
/// URL (`s3://`, `gs://`, `http(s)://`), with default [`StoreOptions`].
pub fn open(root: &str) -> Result<Arc<dyn Storage>, StorageError> {
    open_with(root, &StoreOptions::default())
}

/// Opens a dataset root, reaching object stores as `options` say.
pub fn open_with(root: &str, options: &StoreOptions) -> Result<Arc<dyn Storage>, StorageError> {
    Ok(match Location::parse(root)? {
        Location::Local(path) => Arc::new(LocalStorage::new(path)),
        remote => Arc::new(object::open(root, &remote, options)?),
    })
}

#[cfg(test)]
mod tests;
