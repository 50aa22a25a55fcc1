//! Objects read by byte ranges through a block cache: what the formats read
//! inputs at URLs through (HDF5 through its driver), plain Rust over any
//! [`Storage`].
//!
//! A file is kept in blocks of [`BLOCK`](super::BLOCK) bytes. A read
//! fetches the blocks it lacks (contiguous ones in one request), and a read
//! that continues where an earlier one ended also starts fetching the blocks
//! after it in the background, a window that doubles with each block the
//! stream enters, up to the conversion's read-ahead
//! ([`BlockCacheOptions`](super::BlockCacheOptions), 32 MiB by default):
//! latency is hidden behind decoding, and the bytes read past a worker's
//! share are at most one window per stream. The blocks of the files opened
//! stay cached, up to the conversion's budget in all (512 MiB by default;
//! over it, those of the files opened last go first), and that budget is the only bound on what is kept: a conversion
//! reads the sampled inputs' X for the gene order, then again for the tiles,
//! and small inputs are then fetched once, as the page cache serves local
//! files the second time.
//!
//! A file that is going to be read whole is also given to the prefetcher
//! ([`prefetch_whole`](super::prefetch_whole)): one thread fetches such
//! files in order, a few requests of 2 MiB in flight, at most 256 MiB (half
//! the cache) ahead of the reads. While a reader waits for a block it asked
//! for, the prefetcher starts no request (the store's link is shared).

use std::sync::{Arc, Condvar, Mutex, OnceLock};

use bytes::Bytes;

use super::cache::{BlockCacheOptions, Cache, Stream, BLOCK, CACHED, STRUCTURE_BUDGET, STRUCTURE_KEPT};
use crate::storage::{IoStats, RequestFailure, Storage, StorageError, StoreKind, StoreOptions};

/// Blocks fetched at each end of a file when it is opened (256 KiB: the
/// superblock, and the root group as h5py leaves it at the end; 1 MiB at
/// each end brought the first chunks of X too, which at many inputs were
/// pushed out of the cache before the pass that reads them).
const HEAD_BLOCKS: u64 = 1;

/// Sequential streams tracked per file (X's data and indices, obs columns).
const STREAMS: usize = 8;

/// Requests and bytes fetched for inputs at URLs, by every file of the process.
pub fn input_stats() -> &'static IoStats {
    static STATS: OnceLock<IoStats> = OnceLock::new();
    STATS.get_or_init(IoStats::default)
}

/// The storage holding the object at `url`, and its key there.
pub(crate) fn storage_of(
    url: &str,
    store: &StoreOptions,
) -> Result<(Arc<dyn Storage>, String), crate::storage::StorageError> {
    let (parent, key) = url.rsplit_once('/').unwrap_or(("", url));
    Ok((crate::storage::open_with(parent, store)?, key.to_string()))
}

/// The size and entity tag of the object at `url`, or why they cannot be
/// had: those this process read it by, when it has it open.
pub fn object_version(url: &str, store: &StoreOptions) -> Result<crate::storage::Version, StorageError> {
    let recent = RECENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, file)) = recent.iter().find(|(u, (o, _), _)| u == url && o == store) {
        return Ok(file.version.clone());
    }
    drop(recent);
    sized_object(url, store).map(|(_, _, version)| version)
}

/// The storage and key of the object at `url`, and its version; an object
/// that is not there is the store's 404.
pub(crate) fn sized_object(
    url: &str,
    store: &StoreOptions,
) -> Result<(Arc<dyn Storage>, String, crate::storage::Version), StorageError> {
    let (store, key) = storage_of(url, store)?;
    match store.version(&key)? {
        Some(version) => Ok((store, key, version)),
        None => Err(StorageError::Request {
            location: store.location(&key),
            failure: RequestFailure::NotFound { kind: StoreKind::of(url) },
        }),
    }
}

/// What a read is of: whether it reads ahead, and how long its blocks stay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadOf {
    /// An array's elements (and, as HDF5 reads them, the heap of a table's
    /// strings): a sequential stream of them fetches ahead.
    Data,
    /// HDF5's structure (object headers, indexes of chunks): read in small
    /// pieces, not ahead, and again by every pass that opens the file; kept
    /// by exact read, and its blocks are the last a full cache lets go.
    Structure,
}

/// Reads of HDF5 metadata waiting for blocks they fetch themselves.
pub(super) static WAITING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Why a read through the HDF5 driver failed, kept for the error HDF5's own
/// leaves out: the store's error, or a read that panicked.
#[derive(Clone, Debug)]
pub(crate) struct Failure(pub(crate) Arc<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// One object read by ranges, with its block cache.
pub struct RangedFile {
    storage: Arc<dyn Storage>,
    key: String,
    /// The version read (its size and entity tag): every range comes from
    /// it as long as the store keeps it.
    version: crate::storage::Version,
    pub(super) cache: Mutex<Cache>,
    pub(super) arrived: Condvar,
    /// The first failure of a read, for the error message (HDF5 reports only
    /// that a read failed).
    pub(crate) failure: Mutex<Option<Failure>>,
    /// Whether the object was given to the prefetcher ([`prefetch_whole`](super::prefetch_whole)).
    pub(super) prefetching: std::sync::atomic::AtomicBool,
    /// The budgets of the conversion that opened it.
    limits: BlockCacheOptions,
}

/// Files opened lately, most recent last: a conversion opens each input
/// several times (scan, obs, gene totals, tiles), and their HDF5 metadata and
/// the blocks still cached are not fetched again. What is kept is bounded by
/// the block budget (which [`evict_other_files`] enforces),
/// not by a count of files: a file is forgotten only once none of its blocks
/// is cached and nothing has it open, and then only past [`RECENT_FILES`]
/// files. (Bounding the files by count made every pass over more inputs than
/// that fetch them all again.)
static RECENT: Mutex<Vec<Recent>> = Mutex::new(Vec::new());

/// A file of [`RECENT`]: its URL and the options it was reached with (a
/// conversion with other credentials or budgets opens it afresh).
type Recent = (String, Reached, Arc<RangedFile>);

/// How a file was reached: the store's options and the block cache's.
type Reached = (StoreOptions, BlockCacheOptions);

/// How many files [`RECENT`] keeps at least, cached blocks or not.
const RECENT_FILES: usize = 32;

impl RangedFile {
    /// The object at `url`, with the blocks of a recent opening of it.
    pub(crate) fn open(
        url: &str,
        store: &StoreOptions,
        limits: BlockCacheOptions,
    ) -> Result<Arc<RangedFile>, StorageError> {
        let mut recent = RECENT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = recent.iter().position(|(u, (o, l), _)| u == url && o == store && *l == limits) {
            let entry = recent.remove(i);
            let file = entry.2.clone();
            recent.push(entry);
            drop(recent);
            // Opened again (by the next pass over the inputs): what it reads
            // first continues no stream of the pass before, whose window
            // would fetch ahead of it.
            file.cache.lock().unwrap_or_else(|e| e.into_inner()).streams.clear();
            return Ok(file);
        }
        drop(recent);
        let file = Self::open_new(url, store, limits)?;
        let mut recent = RECENT.lock().unwrap_or_else(|e| e.into_inner());
        recent.push((url.to_string(), (store.clone(), limits), file.clone()));
        forget_empty_files(&mut recent);
        Ok(file)
    }

    fn open_new(url: &str, store: &StoreOptions, limits: BlockCacheOptions) -> Result<Arc<RangedFile>, StorageError> {
        let (storage, key, version) = sized_object(url, store)?;
        Self::over(storage, key, version, limits)
    }

    /// The budgets of the conversion that opened it.
    pub(super) fn limits(&self) -> BlockCacheOptions {
        self.limits
    }

    /// Object `key` of `storage`, of version `version`, read by ranges
    /// (its first and last blocks fetched now).
    pub fn over(
        storage: Arc<dyn Storage>,
        key: String,
        version: crate::storage::Version,
        limits: BlockCacheOptions,
    ) -> Result<Arc<RangedFile>, StorageError> {
        let file = Arc::new(RangedFile {
            storage,
            key,
            version,
            cache: Mutex::new(Cache::default()),
            arrived: Condvar::new(),
            failure: Mutex::new(None),
            prefetching: std::sync::atomic::AtomicBool::new(false),
            limits,
        });
        // The start of an HDF5 file holds its superblock and the headers of
        // what was written first (X, as anndata writes it); its end, those of
        // what was written last (obs, var): two requests at once instead of a
        // round trip for each header.
        let n = file.n_blocks();
        let mut ends: Vec<u64> = (0..n.min(HEAD_BLOCKS)).chain(n.saturating_sub(HEAD_BLOCKS)..n).collect();
        ends.dedup();
        let fetched = file.fetch(&ends)?;
        let mut cache = file.cache.lock().unwrap_or_else(|e| e.into_inner());
        file.insert(&mut cache, fetched);
        drop(cache);
        Ok(file)
    }

    /// Why the last read failed, if one did.
    pub(crate) fn failure(&self) -> Option<Failure> {
        self.failure.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The object's size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.version.size
    }

    pub(super) fn n_blocks(&self) -> u64 {
        self.size().div_ceil(BLOCK)
    }

    fn block_range(&self, b: u64) -> std::ops::Range<u64> {
        b * BLOCK..((b + 1) * BLOCK).min(self.size())
    }

    /// Fetches `blocks` (sorted), contiguous runs in one request each.
    pub(super) fn fetch(&self, blocks: &[u64]) -> Result<Vec<(u64, Bytes)>, StorageError> {
        let mut runs: Vec<(u64, u64)> = Vec::new(); // (first block, count)
        for &b in blocks {
            match runs.last_mut() {
                Some((first, count)) if *first + *count == b => *count += 1,
                _ => runs.push((b, 1)),
            }
        }
        let ranges: Vec<std::ops::Range<u64>> =
            runs.iter().map(|&(first, count)| first * BLOCK..((first + count) * BLOCK).min(self.size())).collect();
        let fetched = match self.storage.get_ranges_of(&self.key, &ranges, self.version.etag.as_deref()) {
            Ok(Some(parts)) => parts,
            Ok(None) => {
                return Err(StorageError::Remote {
                    location: self.storage.location(&self.key),
                    message: "vanished while being read".into(),
                })
            }
            Err(e) => return Err(e),
        };
        let stats = input_stats();
        let mut out = Vec::with_capacity(blocks.len());
        for ((first, count), (range, bytes)) in runs.iter().zip(ranges.iter().zip(fetched)) {
            stats.record(bytes.len() as u64);
            if bytes.len() as u64 != range.end - range.start {
                return Err(StorageError::Range {
                    location: self.storage.location(&self.key),
                    start: range.start,
                    end: range.end,
                    size: range.start + bytes.len() as u64,
                });
            }
            for b in *first..first + count {
                let r = self.block_range(b);
                out.push((b, bytes.slice((r.start - range.start) as usize..(r.end - range.start) as usize)));
            }
        }
        Ok(out)
    }

    pub(super) fn insert(&self, cache: &mut Cache, fetched: Vec<(u64, Bytes)>) {
        for (b, bytes) in fetched {
            cache.pending.remove(&b);
            let len = bytes.len() as u64;
            match cache.blocks.insert(b, bytes) {
                None => {
                    cache.order.push_back(b);
                    CACHED.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
                }
                Some(old) => {
                    CACHED.fetch_sub(old.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    CACHED.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        // Over the budget: this file's oldest blocks go first, then those of
        // the files opened last (never the blocks of this read).
        use std::sync::atomic::Ordering::Relaxed;
        let budget = self.limits.budget();
        while CACHED.load(Relaxed) > budget && cache.order.len() as u64 > self.limits.window() * 2 {
            let Some(old) = cache.order.pop_front() else { break };
            cache.remove_block(old);
        }
        if CACHED.load(Relaxed) > budget {
            evict_other_files(self);
        }
    }

    /// Fills `buf` with the bytes at `addr` (zeros past the end of the object).
    /// A read of HDF5 metadata (not [`ReadOf::Data`]) holds back the
    /// prefetcher while it waits: opening objects is one such read after
    /// another.
    pub(crate) fn read(self: &Arc<Self>, addr: u64, buf: &mut [u8], of: ReadOf) -> Result<(), StorageError> {
        let metadata = of != ReadOf::Data;
        buf.fill(0);
        let end = addr.saturating_add(buf.len() as u64).min(self.size());
        if addr >= end {
            return Ok(());
        }
        let (first, last) = (addr / BLOCK, (end - 1) / BLOCK);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let n = (end - addr) as usize;
        if of == ReadOf::Structure {
            if let Some(kept) = cache.structure.get(&(addr, n)) {
                buf[..n].copy_from_slice(kept);
                return Ok(());
            }
        }
        // Wait for blocks already on their way; fetch the others now.
        loop {
            let missing: Vec<u64> = (first..=last).filter(|b| !cache.blocks.contains_key(b)).collect();
            if missing.is_empty() {
                break;
            }
            let now: Vec<u64> = missing.into_iter().filter(|b| !cache.pending.contains(b)).collect();
            if now.is_empty() {
                cache = self.arrived.wait(cache).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            cache.pending.extend(&now);
            drop(cache);
            if metadata {
                WAITING.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let fetched = self.fetch(&now);
            if metadata {
                WAITING.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            }
            cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            match fetched {
                Ok(blocks) => self.insert(&mut cache, blocks),
                Err(e) => {
                    for b in &now {
                        cache.pending.remove(b);
                    }
                    self.arrived.notify_all();
                    return Err(e);
                }
            }
            self.arrived.notify_all();
        }
        for b in first..=last {
            let block = &cache.blocks[&b];
            let r = self.block_range(b);
            let (from, to) = (addr.max(r.start), end.min(r.end));
            buf[(from - addr) as usize..(to - addr) as usize]
                .copy_from_slice(&block[(from - r.start) as usize..(to - r.start) as usize]);
        }
        cache.mark_read(first, last);
        if of == ReadOf::Structure {
            cache.structural.extend(first..=last);
            use std::sync::atomic::Ordering::Relaxed;
            if STRUCTURE_KEPT.load(Relaxed) + n as u64 <= STRUCTURE_BUDGET {
                STRUCTURE_KEPT.fetch_add(n as u64, Relaxed);
                if let Some(old) = cache.structure.insert((addr, n), Bytes::copy_from_slice(&buf[..n])) {
                    STRUCTURE_KEPT.fetch_sub(old.len() as u64, Relaxed);
                }
            }
        }
        self.read_ahead(&mut cache, first, last, of);
        Ok(())
    }

    /// Notes the byte ranges of arrays that are going to be read whole
    /// (a matrix's data, indices, indptr): read-ahead keeps within them, and
    /// there is none outside them. Ranges less than a block apart are one.
    pub(crate) fn set_extents(&self, ranges: &[std::ops::Range<u64>]) {
        let mut blocks: Vec<(u64, u64)> =
            ranges.iter().filter(|r| r.end > r.start).map(|r| (r.start / BLOCK, (r.end - 1) / BLOCK)).collect();
        blocks.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(blocks.len());
        for (lo, hi) in blocks {
            match merged.last_mut() {
                Some((_, last)) if lo <= *last + 1 => *last = (*last).max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).extents = merged;
    }

    /// Continues the stream that reached block `first` (or starts one), and
    /// fetches its window of blocks after `last` in the background.
    fn read_ahead(self: &Arc<Self>, cache: &mut Cache, first: u64, last: u64, of: ReadOf) {
        if of == ReadOf::Structure {
            // HDF5's structure (object headers, chunk indexes among the
            // chunks) is read in small pieces, and what follows it is often
            // an array another pass reads: fetched ahead, at many inputs it
            // pushed out of the cache the blocks the next pass needed (100
            // inputs of 11.6 MB through 512 MiB: 1.34x their bytes fetched,
            // 1.19x without).
            return;
        }
        let extent = cache.extents.iter().find(|&&(_, hi)| hi >= last).copied();
        let found = cache.streams.iter().position(|s| s.block == first || s.block + 1 == first);
        let mut stream = match found {
            Some(i) => cache.streams.remove(i).expect("found"),
            // A read that continues none is not a stream yet: one that
            // continues it is, and fetches ahead from then on. (Fetching
            // ahead of every read, the metadata and the first rows read by
            // each pass over a file brought 1 MiB after each of them, which
            // at many inputs pushed out the blocks the next pass needed.)
            None => Stream { block: first, window: 2 },
        };
        if found.is_some() && last > stream.block {
            stream.window = (stream.window * 2).clamp(1, self.limits.window());
        }
        stream.block = last;
        let window = if found.is_some() { stream.window } else { 0 };
        cache.streams.push_front(stream);
        cache.streams.truncate(STREAMS);
        let bound = match extent {
            Some((lo, hi)) if lo <= last => hi,
            // Outside the arrays a pass reads whole (a table's columns read
            // between them), no read-ahead: the next bytes are another
            // array's, or another pass's.
            _ if !cache.extents.is_empty() => return,
            _ => u64::MAX,
        };
        let ahead: Vec<u64> = (last + 1..=(last + window).min(bound))
            .filter(|b| *b < self.n_blocks() && !cache.blocks.contains_key(b) && !cache.pending.contains(b))
            .collect();
        if ahead.is_empty() {
            return;
        }
        let file = self.clone();
        let blocks = ahead.clone();
        // The blocks are marked as on their way only once a thread fetches
        // them (this file's lock, held here, keeps it from finishing first).
        let started = std::thread::Builder::new().spawn(move || {
            let fetched = file.fetch(&ahead);
            let mut cache = file.cache.lock().unwrap_or_else(|e| e.into_inner());
            match fetched {
                Ok(blocks) => file.insert(&mut cache, blocks),
                // A reader that needs these blocks fetches them itself, and
                // meets the error there.
                Err(_) => {
                    for b in &ahead {
                        cache.pending.remove(b);
                    }
                }
            }
            file.arrived.notify_all();
        });
        if started.is_ok() {
            cache.pending.extend(&blocks);
        }
    }
}

impl Drop for RangedFile {
    fn drop(&mut self) {
        let cache = self.cache.get_mut().unwrap_or_else(|e| e.into_inner());
        let blocks: Vec<u64> = cache.blocks.keys().copied().collect();
        for b in blocks {
            cache.remove_block(b);
        }
        let kept: u64 = cache.structure.drain().map(|(_, bytes)| bytes.len() as u64).sum();
        STRUCTURE_KEPT.fetch_sub(kept, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Forgets, oldest first, the files past [`RECENT_FILES`] that hold no
/// cached block and that no reader has open.
fn forget_empty_files(recent: &mut Vec<Recent>) {
    let mut excess = recent.len().saturating_sub(RECENT_FILES);
    recent.retain(|(_, _, file)| {
        if excess == 0 || Arc::strong_count(file) > 1 {
            return true;
        }
        // try_lock: a file whose reader holds its lock is in use.
        // (A file whose structure is kept is not empty: opened again, it
        // would fetch its ends and headers again.)
        let empty =
            file.cache.try_lock().is_ok_and(|c| c.blocks.is_empty() && c.pending.is_empty() && c.structure.is_empty());
        if empty {
            excess -= 1;
        }
        !empty
    });
}

/// Frees the cached blocks of the files opened most recently (not `keep`'s)
/// until the cache is within its budget. A conversion reads its inputs in
/// the same order pass after pass (their layout, their obs, their X): the
/// files opened last in a pass are needed last in the next, and the files
/// opened longest ago, first. (Freeing those first, 70 inputs of 11.6 MB
/// through the 512 MiB budget were fetched 1.89 times their bytes, and
/// 1.23 times so.)
fn evict_other_files(keep: &RangedFile) {
    use std::sync::atomic::Ordering::Relaxed;
    // Files nobody holds but this list (neither a reader nor the
    // prefetcher's queue) first: those in use are being read, or soon.
    let files: Vec<(Arc<RangedFile>, bool)> = RECENT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(_, _, f)| (f.clone(), Arc::strong_count(f) == 1))
        .collect();
    // The blocks of the files' structure (read again by every pass that
    // opens them) only when nothing else is left to free.
    for structure_too in [false, true] {
        let idle = files.iter().rev().filter(|(_, idle)| *idle);
        let in_use = files.iter().rev().filter(|(_, idle)| !*idle);
        for (file, _) in idle.chain(in_use).filter(|(f, _)| !std::ptr::eq(Arc::as_ptr(f), keep)) {
            if CACHED.load(Relaxed) <= keep.limits.budget() {
                return;
            }
            // try_lock: a file whose reader holds its lock is being read now.
            let Ok(mut cache) = file.cache.try_lock() else { continue };
            cache.free_within_budget(structure_too, keep.limits.budget());
        }
    }
}

/// Opens the objects at `urls` at once (their sizes and first blocks), so
/// that reading them one after another does not wait a round trip per
/// file; failures are left for the opening that needs the file.
pub fn open_all(urls: &[&str], store: &StoreOptions, limits: BlockCacheOptions) {
    let fresh: Vec<String> = {
        let recent = RECENT.lock().unwrap_or_else(|e| e.into_inner());
        let known = |url: &str| recent.iter().any(|(r, (o, l), _)| r == url && o == store && *l == limits);
        urls.iter().filter(|u| !known(u)).map(|u| u.to_string()).collect()
    };
    std::thread::scope(|threads| {
        for chunk in fresh.chunks(fresh.len().div_ceil(8).max(1)) {
            threads.spawn(move || {
                for url in chunk {
                    let _ = RangedFile::open(url, store, limits);
                }
            });
        }
    });
}
