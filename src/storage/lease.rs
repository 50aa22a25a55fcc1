//! A writer's lease on a dataset in an object store: what serializes the
//! writers of one bucket prefix (append, its resume, finalize, convert
//! --overwrite), as the OS lock on the folder serializes them locally.
//!
//! The lease is one object, [`LEASE_KEY`], created with a conditional write
//! (`If-None-Match: *`: only when there is none), so that of two writers that
//! start at once exactly one gets it. Its holder rewrites it every quarter of
//! [`LEASE_SECONDS`], each time on the condition that it is still the version
//! it wrote (`If-Match`), and deletes it when done. A lease that nobody has
//! renewed for [`LEASE_SECONDS`] (its writer was killed) may be taken over,
//! again by a conditional write on the version found, so that of two writers
//! that find it expired one takes it. Its age is measured from the store's own
//! clock (the object's last-modified time) against this machine's, so clocks
//! more than a few seconds apart shorten or lengthen the wait by that much.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use super::StorageError;

/// The lease object, at the dataset's root.
pub const LEASE_KEY: &str = ".deltacells-lease.json";

/// How long a lease holds without renewal: a writer killed while holding
/// it keeps the others out this long at most.
pub const LEASE_SECONDS: u64 = 60;

/// What the lease object says.
#[derive(Debug, Serialize, Deserialize)]
struct LeaseRecord {
    /// Who holds it: host, process and start time, for the message that
    /// refuses another writer.
    holder: String,
    /// How long it holds without renewal.
    seconds: u64,
}

/// Why a lease could not be had.
pub enum Refused {
    /// Another writer holds it: who, and seconds since it was last renewed.
    Held { holder: String, age: u64, seconds: u64 },
    /// The store failed.
    Store(StorageError),
}

/// A lease held: renewed by a thread of its own until dropped, then deleted.
pub struct Lease {
    /// Set when another writer took the lease over (it had expired): it is
    /// theirs, and is not deleted with this one.
    lost: Arc<AtomicBool>,
    stop: Option<mpsc::Sender<()>>,
    renewer: Option<std::thread::JoinHandle<()>>,
    store: Arc<dyn ObjectStore>,
    path: StorePath,
    runtime: Arc<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("path", &self.path.to_string()).finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(renewer) = self.renewer.take() {
            let _ = renewer.join();
        }
        // (a lease left behind by a failed delete expires)
        if !self.lost.load(Ordering::Relaxed) {
            let _ = self.runtime.block_on(self.store.delete(&self.path));
        }
    }
}

/// The holder's name: this host, this process, and when it asked.
fn holder_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "a host".into());
    let since = humantime::format_rfc3339_seconds(SystemTime::now());
    format!("process {} on {host}, since {since}", std::process::id())
}

/// How long a lease lasts: [`LEASE_SECONDS`], or in builds with the
/// test-only feature `fault-injection`, $DELTACELLS_TEST_LEASE_SECONDS (the
/// tests of a killed writer do not wait a minute).
fn lease_seconds() -> u64 {
    #[cfg(feature = "fault-injection")]
    if let Some(s) = std::env::var("DELTACELLS_TEST_LEASE_SECONDS").ok().and_then(|s| s.parse().ok()) {
        return s;
    }
    LEASE_SECONDS
}

/// Takes the lease at `path` of `store` if it is free or expired.
pub(super) fn acquire(
    store: Arc<dyn ObjectStore>,
    path: StorePath,
    runtime: Arc<tokio::runtime::Runtime>,
    err: &dyn Fn(object_store::Error) -> StorageError,
) -> Result<Lease, Refused> {
    let seconds = lease_seconds();
    let record = LeaseRecord { holder: holder_name(), seconds };
    let body = serde_json::to_vec(&record).expect("a lease record serializes");
    let put = |mode: PutMode| {
        let options = PutOptions { mode, ..Default::default() };
        runtime.block_on(store.put_opts(&path, PutPayload::from(body.clone()), options))
    };
    let written = match put(PutMode::Create) {
        Ok(written) => written,
        Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => {
            // Held: expired, or not?
            let found = match runtime.block_on(store.get(&path)) {
                Ok(found) => found,
                // released since: ask again, once
                Err(object_store::Error::NotFound { .. }) => {
                    return put(PutMode::Create)
                        .map(|w| start(store.clone(), path.clone(), runtime.clone(), &body, w))
                        .map_err(|e| busy_or(e, "another writer", 0, seconds, err))
                }
                Err(e) => return Err(Refused::Store(err(e))),
            };
            let meta = found.meta.clone();
            let text = runtime.block_on(found.bytes()).map_err(|e| Refused::Store(err(e)))?;
            let theirs: Option<LeaseRecord> = serde_json::from_slice(&text).ok();
            let their_seconds = theirs.as_ref().map_or(seconds, |r| r.seconds);
            let holder = theirs.map_or_else(|| "another writer".to_string(), |r| r.holder);
            let age = SystemTime::now()
                .duration_since(SystemTime::from(meta.last_modified))
                .unwrap_or(Duration::ZERO)
                .as_secs();
            if age < their_seconds {
                return Err(Refused::Held { holder, age, seconds: their_seconds });
            }
            // Expired: take it over, unless another writer does first.
            let version = UpdateVersion { e_tag: meta.e_tag.clone(), version: meta.version.clone() };
            put(PutMode::Update(version)).map_err(|e| busy_or(e, &holder, age, their_seconds, err))?
        }
        Err(e) => return Err(Refused::Store(err(e))),
    };
    Ok(start(store, path, runtime, &body, written))
}

/// A conditional write's failure: another writer was first, or the store failed.
fn busy_or(
    e: object_store::Error,
    holder: &str,
    age: u64,
    seconds: u64,
    err: &dyn Fn(object_store::Error) -> StorageError,
) -> Refused {
    match e {
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
            Refused::Held { holder: holder.to_string(), age, seconds }
        }
        e => Refused::Store(err(e)),
    }
}

/// The lease just written, and the thread that renews it.
fn start(
    store: Arc<dyn ObjectStore>,
    path: StorePath,
    runtime: Arc<tokio::runtime::Runtime>,
    body: &[u8],
    written: object_store::PutResult,
) -> Lease {
    let (stop, stopped) = mpsc::channel::<()>();
    let every = Duration::from_millis(lease_seconds() * 1000 / 4).max(Duration::from_millis(100));
    let (renew_store, renew_path, renew_runtime, body) = (store.clone(), path.clone(), runtime.clone(), body.to_vec());
    let lost = Arc::new(AtomicBool::new(false));
    let renew_lost = lost.clone();
    let renewer = std::thread::Builder::new()
        .name("deltacells-lease".into())
        .spawn(move || {
            let mut version = UpdateVersion { e_tag: written.e_tag, version: written.version };
            // Until the lease is dropped (the sender with it), or lost (another
            // writer took it over after it expired: then it is theirs).
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                let options = PutOptions { mode: PutMode::Update(version.clone()), ..Default::default() };
                match renew_runtime.block_on(renew_store.put_opts(&renew_path, PutPayload::from(body.clone()), options))
                {
                    Ok(done) => version = UpdateVersion { e_tag: done.e_tag, version: done.version },
                    Err(object_store::Error::Precondition { .. }) => {
                        renew_lost.store(true, Ordering::Relaxed);
                        return;
                    }
                    // (a renewal that fails is tried again at the next turn)
                    Err(_) => {}
                }
            }
        })
        .ok();
    Lease { lost, stop: Some(stop), renewer, store, path, runtime }
}
