//! What a dataset and a collection both keep in the binding: a thread pool
//! made on first use, and the loader's buffers, kept from one epoch to the
//! next.

use std::sync::{Arc, Mutex, OnceLock};

use deltacells::loader::{LoaderBuffers, LoaderOptions};

use crate::errors::{Failure, Kind};

/// The most threads a pool starts (the Python package refuses more, naming
/// the argument; this bound holds for any other caller).
const MAX_THREADS: usize = 1024;

/// A rayon pool of `n` threads (all cores when None), made on first use.
/// Clones share the one pool: a collection's members run on the
/// collection's threads, so a process reading hundreds of members keeps one
/// pool, not one per member.
#[derive(Clone)]
pub(crate) struct Threads {
    n: Option<usize>,
    pool: Arc<OnceLock<Result<Arc<rayon::ThreadPool>, String>>>,
}

impl Threads {
    pub(crate) fn new(n: Option<usize>) -> Threads {
        Threads { n, pool: Arc::new(OnceLock::new()) }
    }

    /// The pool, made on first use.
    pub(crate) fn pool(&self) -> Result<Arc<rayon::ThreadPool>, Failure> {
        let pool = self.pool.get_or_init(|| {
            let mut builder = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("deltacells-{i}"));
            if let Some(n) = self.n {
                builder = builder.num_threads(n.clamp(1, MAX_THREADS));
            }
            builder.build().map(Arc::new).map_err(|e| e.to_string())
        });
        pool.clone().map_err(|e| Failure { kind: Kind::Other, message: format!("cannot start threads: {e}") })
    }

    /// Runs `f` on the pool.
    pub(crate) fn install<T: Send>(&self, f: impl FnOnce() -> Result<T, Failure> + Send) -> Result<T, Failure> {
        self.pool()?.install(f)
    }
}

/// The loader's buffers, kept from one epoch to the next.
#[derive(Default)]
pub(crate) struct KeptBuffers(Mutex<Option<LoaderBuffers>>);

impl KeptBuffers {
    /// The kept buffers (made larger when a loader's windows or queue need more).
    pub(crate) fn for_options(&self, options: &LoaderOptions) -> LoaderBuffers {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let wanted = LoaderBuffers::new(options);
        match &*kept {
            Some(b) if b.planes.keep() >= wanted.planes.keep() && b.batches.keep() >= wanted.batches.keep() => {
                b.clone()
            }
            _ => kept.insert(wanted).clone(),
        }
    }
}
