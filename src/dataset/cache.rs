//! What gathers keep between calls, each within a byte budget, least
//! recently used out first: tiles' indexes (header, chunk table, indptr:
//! what says where a cell's bytes are) and decompressed chunks (their byte
//! planes, checked, 4 bytes per nonzero), so that cells drawn again (controls
//! reused across steps, a validation set) cost no read and no decompression.
//! Shared by every thread reading the dataset; it owns no I/O.
//!
//! Entries are of one version of the dataset's files (`follow.rs`): each is
//! kept under its version's generation, and following a later version drops
//! the older ones' (a tile re-encoded by a writer has other chunks).

use std::hash::Hash;
use std::sync::{Arc, Mutex};

use crate::format::tile::{ChunkPlanes, TileIndex};

/// How an open dataset reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOptions {
    /// Bytes of decompressed chunks that gathers keep (4 bytes per nonzero);
    /// 0 keeps none.
    pub cache_bytes: u64,
    /// How long a read waits for a writer that is committing a new version
    /// of the dataset (its manifest.json removed, not yet written again)
    /// before it fails saying the dataset is incomplete.
    pub writer_wait: std::time::Duration,
    /// The cache folder, where the record of a local dataset's tiles whose
    /// CRC was checked is kept; `None`: the default one
    /// ($DELTACELLS_CACHE, else $XDG_CACHE_HOME/deltacells, else
    /// ~/.cache/deltacells).
    pub cache_dir: Option<std::path::PathBuf>,
    /// Whether a local tile's CRC, checked when a gather first touches it
    /// (the tile read whole), is remembered on this machine, so that later
    /// processes read only the chunks they need of that version of its
    /// file; `false` checks each tile once per open dataset, every process.
    pub remember_checks: bool,
}

/// The default [`ReadOptions::writer_wait`]: 2 minutes, the time a store's
/// failing requests are retried (a commit in a bucket copies each new tile).
pub const DEFAULT_WRITER_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The default budget of decompressed chunks: 512 MiB, about 134 million
/// nonzeros (a few hundred thousand cells), which a training node spares
/// per process and which holds a validation set or a pool of controls.
pub const DEFAULT_CACHE_BYTES: u64 = 512 << 20;

/// Tiles' indexes kept, at most, in bytes: 256 MiB, about 32 million
/// cells' indptr (8 bytes a cell). Random gathers touch every tile, so a
/// budget smaller than the dataset's indexes reads each tile's index again
/// for every batch (at 64 MiB, 10 million cells did).
const INDEX_BUDGET: u64 = 256 << 20;

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            cache_bytes: DEFAULT_CACHE_BYTES,
            writer_wait: DEFAULT_WRITER_WAIT,
            cache_dir: None,
            remember_checks: true,
        }
    }
}

/// A map from keys to shared values within a byte budget, least recently
/// used out first.
struct Budgeted<K: Hash + Eq, V> {
    budget: u64,
    used: u64,
    entries: lru::LruCache<K, (Arc<V>, u64)>,
}

impl<K: Hash + Eq, V> Budgeted<K, V> {
    fn new(budget: u64) -> Self {
        Budgeted { budget, used: 0, entries: lru::LruCache::unbounded() }
    }

    /// A new budget: the least recently used go until the rest fit.
    fn set_budget(&mut self, budget: u64) {
        self.budget = budget;
        while self.used > self.budget {
            match self.entries.pop_lru() {
                Some((_, (_, old))) => self.used -= old,
                None => break,
            }
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.used = 0;
    }

    fn get(&mut self, key: &K) -> Option<Arc<V>> {
        self.entries.get(key).map(|(v, _)| v.clone())
    }

    /// Keeps `value` (of `size` bytes), dropping the least recently used to
    /// make room; a value larger than the whole budget is not kept. Returns
    /// the values dropped, so that the caller can reuse their memory.
    fn put(&mut self, key: K, value: Arc<V>, size: u64) -> Vec<Arc<V>> {
        let mut dropped = Vec::new();
        if size > self.budget {
            return dropped;
        }
        if let Some((old_value, old)) = self.entries.pop(&key) {
            self.used -= old;
            dropped.push(old_value);
        }
        while self.used + size > self.budget {
            match self.entries.pop_lru() {
                Some((_, (old_value, old))) => {
                    self.used -= old;
                    dropped.push(old_value);
                }
                None => break,
            }
        }
        self.used += size;
        self.entries.put(key, (value, size));
        dropped
    }
}

/// A tile's index as read, with the version of the tile's object it was
/// read from (its entity tag, or a local file's identity), which the
/// chunks' reads ask for.
pub(super) struct PinnedIndex {
    pub(super) index: TileIndex,
    pub(super) etag: Option<String>,
}

/// A key of a version: (generation, what).
type Of<K> = (u64, K);

/// The caches of one open dataset.
pub(super) struct GatherCache {
    indexes: Mutex<Budgeted<Of<usize>, PinnedIndex>>,
    chunks: Mutex<Budgeted<Of<(usize, usize)>, ChunkPlanes>>,
    /// The oldest generation kept: what older reads put is not kept.
    oldest: std::sync::atomic::AtomicU64,
}

impl GatherCache {
    pub(super) fn new(options: &ReadOptions) -> Self {
        GatherCache {
            indexes: Mutex::new(Budgeted::new(INDEX_BUDGET)),
            chunks: Mutex::new(Budgeted::new(options.cache_bytes)),
            oldest: Default::default(),
        }
    }

    fn stale(&self, generation: u64) -> bool {
        generation < self.oldest.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Drops what reads of generations before `generation` kept.
    pub(super) fn forget_before(&self, generation: u64) {
        self.oldest.fetch_max(generation, std::sync::atomic::Ordering::AcqRel);
        self.indexes.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.chunks.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub(super) fn index(&self, generation: u64, tile: usize) -> Option<Arc<PinnedIndex>> {
        self.indexes.lock().unwrap_or_else(|p| p.into_inner()).get(&(generation, tile))
    }

    pub(super) fn put_index(&self, generation: u64, tile: usize, index: Arc<PinnedIndex>) {
        if self.stale(generation) {
            return;
        }
        let size = index.index.heap_bytes();
        self.indexes.lock().unwrap_or_else(|p| p.into_inner()).put((generation, tile), index, size);
    }

    pub(super) fn chunk(&self, generation: u64, tile: usize, chunk: usize) -> Option<Arc<ChunkPlanes>> {
        self.chunks.lock().unwrap_or_else(|p| p.into_inner()).get(&(generation, (tile, chunk)))
    }

    /// Keeps a chunk's planes; returns those it dropped to make room (the
    /// caller's to reuse: a gather that touches more chunks than the budget
    /// holds would otherwise free and allocate planes for every chunk).
    pub(super) fn put_chunk(
        &self,
        generation: u64,
        tile: usize,
        chunk: usize,
        planes: Arc<ChunkPlanes>,
    ) -> Vec<Arc<ChunkPlanes>> {
        if self.stale(generation) {
            return Vec::new();
        }
        let size = planes.heap_bytes();
        self.chunks.lock().unwrap_or_else(|p| p.into_inner()).put((generation, (tile, chunk)), planes, size)
    }

    /// A new budget for decompressed chunks.
    pub(super) fn set_chunk_budget(&self, budget: u64) {
        self.chunks.lock().unwrap_or_else(|p| p.into_inner()).set_budget(budget);
    }

    /// Bytes of decompressed chunks kept now.
    pub(super) fn chunk_bytes(&self) -> u64 {
        self.chunks.lock().unwrap_or_else(|p| p.into_inner()).used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_keeps_the_most_recently_used() {
        let mut cache: Budgeted<u32, u32> = Budgeted::new(100);
        for k in 0..3 {
            cache.put(k, Arc::new(k), 30);
        }
        assert!(cache.get(&0).is_some()); // 1 is now the least recently used
        let dropped = cache.put(3, Arc::new(3), 30); // returned, for the caller to reuse
        assert_eq!(dropped.iter().map(|v| **v).collect::<Vec<_>>(), [1]);
        assert!(cache.get(&1).is_none());
        assert!([0, 2, 3].iter().all(|k| cache.get(k).is_some()));
        assert_eq!(cache.used, 90);
        // larger than the budget: not kept, nothing dropped
        cache.put(9, Arc::new(9), 101);
        assert!(cache.get(&9).is_none());
        assert_eq!(cache.used, 90);
        // the same key again replaces it
        assert_eq!(cache.put(0, Arc::new(10), 10).iter().map(|v| **v).collect::<Vec<_>>(), [0]);
        assert_eq!(cache.get(&0).as_deref(), Some(&10));
        assert_eq!(cache.used, 70);
        // a smaller budget drops the least recently used (2) until the rest fit
        cache.set_budget(40);
        assert_eq!(cache.used, 40);
        assert!(cache.get(&2).is_none() && cache.get(&3).is_some() && cache.get(&0).is_some());
        let mut none: Budgeted<u32, u32> = Budgeted::new(0);
        none.put(0, Arc::new(0), 1);
        assert!(none.get(&0).is_none());
    }
}
