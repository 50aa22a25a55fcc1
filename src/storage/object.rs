//! Datasets in object stores (S3 and S3-compatible stores, Google Cloud Storage,
//! plain HTTP servers) through the `object_store` crate.
//!
//! The [`Storage`] trait is synchronous; every call here runs its requests on one
//! process-wide tokio runtime and waits for them. Callers already work in parallel
//! (rayon), so `--threads` calls mean that many requests in flight.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use super::{IoStats, Location, RequestFailure, Storage, StorageError, StoreKind};
use crate::redact::redact;

/// Objects larger than this are uploaded in parts.
pub const MULTIPART_THRESHOLD: usize = 64 << 20;
/// The size of each part of a multipart upload (S3 asks for at least 5 MiB).
pub const PART_SIZE: usize = 16 << 20;
/// Ranges of one object closer than this are fetched in one request.
pub const COALESCE_GAP: u64 = 64 << 10;

/// The runtime every object-store request of this process runs on.
///
/// A forked child (a DataLoader worker started with `fork`) inherits the
/// parent's runtime without its threads, so blocking on it would hang: each
/// process makes its own, and the child leaves the parent's unused (dropping
/// it would wait for threads that do not exist there).
fn runtime() -> Arc<tokio::runtime::Runtime> {
    static RUNTIME: Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> = Mutex::new(None);
    let mut slot = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    match &*slot {
        Some((owner, runtime)) if *owner == pid => runtime.clone(),
        _ => {
            if let Some(inherited) = slot.take() {
                std::mem::forget(inherited);
            }
            let runtime = Arc::new(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("deltacells-io")
                    .enable_all()
                    .build()
                    .expect("cannot start the I/O runtime"),
            );
            *slot = Some((pid, runtime.clone()));
            runtime
        }
    }
}

/// A dataset under a prefix of an object store.
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    prefix: StorePath,
    /// The root as the user wrote it, without a trailing `/` and with its
    /// credentials redacted: for messages only.
    url: String,
    kind: StoreKind,
    /// The server's `host:port`, when it is known (an endpoint, an HTTP URL).
    server: Option<String>,
    can_list: bool,
    stats: IoStats,
    multipart_threshold: usize,
    part_size: usize,
}

impl std::fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStorage")
            .field("url", &self.url)
            .field("store", &redact(&self.store.to_string()))
            .finish()
    }
}

impl ObjectStorage {
    /// A dataset at `prefix` of `store`; `url` names it in messages (with
    /// its credentials [`redact`]ed).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, url: &str) -> Self {
        ObjectStorage {
            store,
            prefix: join(&StorePath::default(), prefix),
            url: redact(url.trim_end_matches('/')).into_owned(),
            kind: StoreKind::of(url),
            server: None,
            can_list: true,
            stats: IoStats::default(),
            multipart_threshold: MULTIPART_THRESHOLD,
            part_size: PART_SIZE,
        }
    }

    /// The server's address, `host:port`, for messages (an endpoint's or an
    /// HTTP URL's; none for a cloud store's own).
    fn with_server(mut self, address: Option<&str>) -> Self {
        self.server = address.and_then(server_of);
        self
    }

    /// These stats instead of new ones (those whose retry counter the
    /// store's HTTP client was given).
    fn with_stats(mut self, stats: IoStats) -> Self {
        self.stats = stats;
        self
    }

    /// The store underneath.
    pub fn into_store(self) -> Arc<dyn ObjectStore> {
        self.store
    }

    /// Plain HTTP servers cannot list.
    pub fn without_listing(mut self) -> Self {
        self.can_list = false;
        self
    }

    /// Upload objects larger than `threshold` bytes in parts of `part_size`.
    pub fn with_multipart(mut self, threshold: usize, part_size: usize) -> Self {
        self.multipart_threshold = threshold;
        self.part_size = part_size.max(1);
        self
    }

    fn path(&self, key: &str) -> StorePath {
        join(&self.prefix, key)
    }

    /// The store's error as ours: a request it did not serve for a reason
    /// of its own (refused, timed out, denied, not found) says so and what
    /// to check; any other keeps the store's words.
    fn err(&self, key: &str, e: object_store::Error) -> StorageError {
        match request_failure(&e, self.kind, &self.server) {
            Some(failure) => StorageError::Request { location: self.location(key), failure },
            None => StorageError::Remote { location: self.location(key), message: describe(&e) },
        }
    }
}

mod fetch;

fn join(base: &StorePath, key: &str) -> StorePath {
    key.split('/').filter(|p| !p.is_empty()).fold(base.clone(), |p, part| p.clone().join(part))
}

/// The error with its chain of causes, where the HTTP status is.
fn describe(e: &object_store::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    // One line, without the HTML page some servers send with an error, and
    // without the credentials of the URL it quotes.
    let mut line = redact(&text).split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some(at) = line.find(" <!DOCTYPE").or_else(|| line.find(" <html")).or_else(|| line.find(" <?xml")) {
        line.truncate(at);
    }
    if line.len() > 600 {
        let cut = (0..=600).rev().find(|&i| line.is_char_boundary(i)).unwrap_or(0);
        line.truncate(cut);
        line.push_str(" ...");
    }
    line
}

/// `host:port` of a URL (no userinfo, path or query).
fn server_of(url: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    let host = url.host_str()?;
    Some(match url.port_or_known_default() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    })
}

/// Why the store did not serve a request, when it is one of the failures
/// a user can act on: the variant object_store gives for an HTTP status,
/// else the kind of the HTTP client's error down its chain of causes.
pub(super) fn request_failure(
    e: &object_store::Error,
    kind: StoreKind,
    server: &Option<String>,
) -> Option<RequestFailure> {
    use object_store::client::{HttpError, HttpErrorKind};
    use object_store::Error as E;
    // (object_store keeps the response's body, where S3 names its code, only
    // in the text of a cause: each cause's own text is searched)
    let code = || {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
        std::iter::from_fn(|| {
            let c = cause?;
            cause = c.source();
            Some(c)
        })
        .find_map(|c| error_code(&c.to_string()))
    };
    match e {
        E::NotFound { .. } => return Some(RequestFailure::NotFound { kind }),
        E::PermissionDenied { .. } => return Some(RequestFailure::Denied { kind, status: 403, code: code() }),
        E::Unauthenticated { .. } => return Some(RequestFailure::Denied { kind, status: 401, code: code() }),
        _ => {}
    }
    let server = server.clone();
    let mut http = None;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<HttpError>() {
            http = Some(h.kind());
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return Some(RequestFailure::Refused { kind, server }),
                std::io::ErrorKind::TimedOut => return Some(RequestFailure::TimedOut { kind, server }),
                _ => {}
            }
        }
        source = s.source();
    }
    match http? {
        HttpErrorKind::Timeout => Some(RequestFailure::TimedOut { kind, server }),
        HttpErrorKind::Connect => Some(RequestFailure::Unreachable { kind, server, cause: innermost(e) }),
        _ => None,
    }
}

/// The last cause of `e`'s chain, redacted: what the network said.
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(next) = last.source() {
        last = next;
    }
    redact(&last.to_string()).into_owned()
}

/// The store's own name for an error, from the XML body S3 and GCS send
/// (`<Code>InvalidAccessKeyId</Code>`).
fn error_code(text: &str) -> Option<String> {
    let start = text.find("<Code>")? + "<Code>".len();
    let len = text[start..].find("</Code>")?;
    let code = &text[start..start + len];
    (!code.is_empty() && code.len() <= 64 && code.chars().all(|c| c.is_ascii_alphanumeric() || c == '.'))
        .then(|| code.to_string())
}

fn is_not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. })
}

impl Storage for ObjectStorage {
    /// A lease ([`super::lease`]): of the writers of this prefix, one at a time.
    fn try_lock_root(&self) -> Result<super::RootLock, StorageError> {
        let key = super::lease::LEASE_KEY;
        match super::lease::acquire(self.store.clone(), self.path(key), runtime(), &|e| self.err(key, e)) {
            Ok(lease) => Ok(super::RootLock::Leased(lease)),
            Err(super::lease::Refused::Held { holder, age, seconds }) => Ok(super::RootLock::Busy {
                holder: Some(format!(
                    "{holder}, renewed {age} s ago; a lease not renewed for {seconds} s expires and may be taken over"
                )),
            }),
            Err(super::lease::Refused::Store(e)) => Err(e),
        }
    }

    fn location(&self, key: &str) -> String {
        if key.is_empty() {
            self.url.clone()
        } else {
            // A key can hold the query of a URL the root was split from.
            redact(&format!("{}/{key}", self.url)).into_owned()
        }
    }

    fn size(&self, key: &str) -> Result<Option<u64>, StorageError> {
        Ok(self.version(key)?.map(|v| v.size))
    }

    fn version(&self, key: &str) -> Result<Option<super::Version>, StorageError> {
        let path = self.path(key);
        let result = runtime().block_on(self.store.head(&path));
        self.stats.record(0);
        match result {
            Ok(meta) => Ok(Some(super::Version { size: meta.size, etag: meta.e_tag })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.err(key, e)),
        }
    }

    fn get(&self, key: &str) -> Result<Option<Bytes>, StorageError> {
        let path = self.path(key);
        let result = runtime().block_on(async {
            let got = self.store.get(&path).await?;
            got.bytes().await
        });
        match result {
            Ok(bytes) => {
                self.stats.record(bytes.len() as u64);
                Ok(Some(bytes))
            }
            Err(e) if is_not_found(&e) => {
                self.stats.record(0);
                Ok(None)
            }
            Err(e) => Err(self.err(key, e)),
        }
    }

    fn get_ranges(&self, key: &str, ranges: &[Range<u64>]) -> Result<Option<Vec<Bytes>>, StorageError> {
        self.get_ranges_of(key, ranges, None)
    }

    fn get_ranges_of(
        &self,
        key: &str,
        ranges: &[Range<u64>],
        etag: Option<&str>,
    ) -> Result<Option<Vec<Bytes>>, StorageError> {
        let answer = runtime().block_on(self.fetch_all(&[(key, ranges, etag)])).pop().unwrap_or(Ok(None));
        answer.map(|a| a.map(|(parts, _)| parts))
    }

    fn get_ranges_many(&self, requests: &[(String, Vec<Range<u64>>)]) -> Vec<super::ManyRanges> {
        let requests: Vec<fetch::Request<'_>> =
            requests.iter().map(|(k, r)| (k.as_str(), r.as_slice(), None)).collect();
        let answers = runtime().block_on(self.fetch_all(&requests));
        answers.into_iter().map(|a| a.map(|a| a.map(|(parts, _)| parts))).collect()
    }

    fn get_ranges_pinned(&self, requests: &[super::PinnedRequest]) -> Vec<super::PinnedRanges> {
        let requests: Vec<fetch::Request<'_>> =
            requests.iter().map(|r| (r.key.as_str(), r.ranges.as_slice(), r.etag.as_deref())).collect();
        runtime().block_on(self.fetch_all(&requests))
    }

    fn read_cost(&self, ranges: &[Range<u64>]) -> (u64, u64) {
        // (as fetch_all merges them)
        let pieces = super::merge_ranges(ranges.to_vec(), COALESCE_GAP);
        (pieces.len() as u64, pieces.iter().map(|p| p.end - p.start).sum())
    }

    fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
        let path = self.path(key);
        let len = data.len() as u64;
        let result = runtime().block_on(async {
            if data.len() <= self.multipart_threshold {
                self.store.put(&path, PutPayload::from(data)).await.map(|_| ())
            } else {
                // An object store makes an object visible only when its upload
                // completes, so a failed upload leaves nothing under `key`.
                let upload = self.store.put_multipart(&path).await?;
                let mut writer = WriteMultipart::new_with_chunk_size(upload, self.part_size);
                writer.put(data);
                writer.finish().await.map(|_| ())
            }
        });
        result.map_err(|e| self.err(key, e))?;
        self.stats.record_upload(len);
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<(), StorageError> {
        match runtime().block_on(self.store.delete(&self.path(key))) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(self.err(key, e)),
        }
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), StorageError> {
        // A server-side copy, then a delete (object_store's rename).
        runtime().block_on(self.store.rename(&self.path(from), &self.path(to))).map_err(|e| self.err(from, e))
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        Ok(self.list_sizes(prefix)?.into_iter().map(|(k, _)| k).collect())
    }

    fn list_sizes(&self, prefix: &str) -> Result<Vec<(String, u64)>, StorageError> {
        if !self.can_list {
            return Err(StorageError::Unsupported {
                location: self.location(prefix),
                message: "this store cannot list its objects".to_string(),
            });
        }
        let base = self.path(prefix);
        let metas: Vec<_> = runtime()
            .block_on(self.store.list(Some(&base)).try_collect::<Vec<_>>())
            .map_err(|e| self.err(prefix, e))?;
        self.stats.record(0);
        let skip = self.prefix.parts().count();
        let mut keys: Vec<(String, u64)> = metas
            .into_iter()
            .filter_map(|m| {
                let parts: Vec<String> = m.location.parts().map(|p| p.as_ref().to_string()).collect();
                (parts.len() > skip).then(|| (parts[skip..].join("/"), m.size))
            })
            .collect();
        keys.sort();
        Ok(keys)
    }

    fn can_list(&self) -> bool {
        self.can_list
    }

    fn stats(&self) -> &IoStats {
        &self.stats
    }
}

/// How to reach an object store, beyond what the URL says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// No credentials: public buckets.
    pub anonymous: bool,
    /// The store's address, for S3-compatible stores and emulators.
    pub endpoint: Option<String>,
}

fn retry_config() -> object_store::RetryConfig {
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
            base: 2.0,
        },
        max_retries: 8,
        retry_timeout: Duration::from_secs(120),
    }
}

fn client_options(endpoint: Option<&str>) -> object_store::ClientOptions {
    // A whole obs shard (tens of MB) must fit in one request's time on a slow link.
    let mut options = object_store::ClientOptions::new()
        .with_timeout(Duration::from_secs(300))
        .with_connect_timeout(Duration::from_secs(10));
    if endpoint.is_some_and(|e| e.starts_with("http://")) {
        options = options.with_allow_http(true);
    }
    options
}

/// A GCS client that sends no credentials and never looks for any. (Skipping
/// signatures alone still fetches a token before an upload.)
pub fn anonymous_gcs(
    builder: object_store::gcp::GoogleCloudStorageBuilder,
) -> object_store::gcp::GoogleCloudStorageBuilder {
    let none = object_store::gcp::GcpCredential { bearer: String::new() };
    builder.with_skip_signature(true).with_credentials(Arc::new(object_store::StaticCredentialProvider::new(none)))
}

/// The HTTP client of a store: reqwest's, with every attempt that fails in a
/// way object_store tries again (a 5xx or 429 answer, a connection that
/// failed) counted, for [`IoStats::retries`].
#[derive(Debug)]
struct CountingConnector(Arc<AtomicU64>);

impl object_store::client::HttpConnector for CountingConnector {
    fn connect(&self, options: &object_store::ClientOptions) -> object_store::Result<object_store::client::HttpClient> {
        let inner = object_store::client::ReqwestConnector::default().connect(options)?;
        Ok(object_store::client::HttpClient::new(CountingService { inner, retries: self.0.clone() }))
    }
}

#[derive(Debug)]
struct CountingService {
    inner: object_store::client::HttpClient,
    retries: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl object_store::client::HttpService for CountingService {
    async fn call(
        &self,
        request: object_store::client::HttpRequest,
    ) -> Result<object_store::client::HttpResponse, object_store::client::HttpError> {
        let answer = self.inner.execute(request).await;
        let failed = match &answer {
            Ok(response) => response.status().is_server_error() || response.status().as_u16() == 429,
            Err(_) => true,
        };
        if failed {
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
        answer
    }
}

/// Opens the remote `location` (parsed from `url`, which names it in messages).
pub(super) fn open(url: &str, location: &Location, options: &StoreOptions) -> Result<ObjectStorage, StorageError> {
    let fail = |message: String| StorageError::Unsupported { location: redact(url).into_owned(), message };
    let stats = IoStats::default();
    let connector = || CountingConnector(stats.retry_counter());
    match location {
        Location::S3 { bucket, prefix } => {
            let mut builder = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_http_connector(connector())
                .with_retry(retry_config())
                .with_skip_signature(options.anonymous);
            let endpoint = options.endpoint.clone().or_else(|| std::env::var("AWS_ENDPOINT_URL").ok());
            if let Some(endpoint) = &endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            let env_endpoint = std::env::var("AWS_ENDPOINT").ok();
            builder = builder.with_client_options(client_options(endpoint.as_deref().or(env_endpoint.as_deref())));
            if !options.anonymous {
                builder = super::aws_profile::apply(builder);
            }
            if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
                builder = builder.with_region(super::aws_profile::region().unwrap_or_else(|| "us-east-1".to_string()));
            }
            let store = builder.build().map_err(|e| fail(describe(&e)))?;
            let server = endpoint.as_deref().or(env_endpoint.as_deref());
            Ok(ObjectStorage::new(Arc::new(store), prefix, url).with_server(server).with_stats(stats))
        }
        Location::Gcs { bucket, prefix } => {
            let mut builder = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_http_connector(connector())
                .with_retry(retry_config());
            if options.anonymous {
                builder = anonymous_gcs(builder);
            }
            let endpoint = options.endpoint.clone().or_else(|| std::env::var("STORAGE_EMULATOR_HOST").ok());
            if let Some(endpoint) = &endpoint {
                builder = builder.with_base_url(endpoint);
            }
            builder = builder.with_client_options(client_options(endpoint.as_deref()));
            let store = builder.build().map_err(|e| fail(describe(&e)))?;
            Ok(ObjectStorage::new(Arc::new(store), prefix, url).with_server(endpoint.as_deref()).with_stats(stats))
        }
        Location::Http { url: http_url } => {
            let store = object_store::http::HttpBuilder::new()
                .with_url(http_url)
                .with_http_connector(connector())
                .with_retry(retry_config())
                .with_client_options(client_options(Some(url)))
                .build()
                .map_err(|e| fail(describe(&e)))?;
            Ok(ObjectStorage::new(Arc::new(store), "", url)
                .with_server(Some(http_url.as_str()))
                .without_listing()
                .with_stats(stats))
        }
        Location::Local(_) => Err(fail("a local folder is not an object store".into())),
    }
}
