//! Objects read by byte ranges through a block cache: what the HDF5 driver
//! of inputs at URLs ([`crate::inputs::remote`]) reads through, plain Rust over
//! any [`Storage`].
//!
//! A file is kept in blocks of [`BLOCK`] bytes. A read fetches the blocks it
//! lacks (contiguous ones in one request), and a read that continues where
//! an earlier one ended also starts fetching the blocks after it in the
//! background, a window that doubles with each block the stream enters, up
//! to [`max_window`] blocks: latency is hidden behind decoding, and the bytes
//! read past a worker's share are at most one window per stream. The blocks
//! of the files opened stay cached, up to [`cache_budget`] bytes in all (512
//! MiB, or `DELTACELLS_INPUT_CACHE_MIB`; over it, those of the files opened
//! last go first), and that budget is the only bound on what is kept: a
//! conversion reads the sampled inputs' X for the gene order, then again for
//! the tiles, and small inputs are then fetched once, as the page cache
//! serves local files the second time.
//!
//! A file that is going to be read whole is also given to the prefetcher
//! ([`prefetch_whole`]): one thread fetches such files in order, a few
//! requests of 2 MiB in flight, at most 256 MiB (half the cache) ahead of
//! the reads. While a reader waits for a block it asked for, the prefetcher
//! starts no request (the store's link is shared).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use bytes::Bytes;

use crate::storage::{IoStats, Storage, StoreOptions};

/// Bytes per block of the cache: what a read of HDF5 metadata fetches.
pub const BLOCK: u64 = 1 << 18;

/// The most blocks fetched ahead of one sequential stream: 32 MiB, or
/// `DELTACELLS_INPUT_READAHEAD_MIB` MiB. At 50 ms per request and 100 MB/s,
/// a window must hold several megabytes for the link, not the latency, to
/// bound a stream; a shard may fetch up to one window past its share of each
/// stream (X's data and indices).
pub fn max_window() -> u64 {
    static WINDOW: OnceLock<u64> = OnceLock::new();
    *WINDOW.get_or_init(|| {
        let mib = std::env::var("DELTACELLS_INPUT_READAHEAD_MIB").ok().and_then(|v| v.trim().parse::<u64>().ok());
        ((mib.unwrap_or(32) << 20) / BLOCK).max(1)
    })
}

/// The bytes of blocks kept, over every file of the process: 512 MiB, or
/// `DELTACELLS_INPUT_CACHE_MIB` MiB.
pub fn cache_budget() -> u64 {
    static BUDGET: OnceLock<u64> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let mib = std::env::var("DELTACELLS_INPUT_CACHE_MIB").ok().and_then(|v| v.trim().parse::<u64>().ok());
        mib.unwrap_or(512).max(8 * BLOCK / (1 << 20)) << 20
    })
}

/// The bytes of HDF5 structure kept by exact read, over every file (64 MiB:
/// object headers and chunk indexes, some kilobytes a file, so that 1,000
/// inputs opened by every pass need not keep the 256 KiB blocks around them).
const STRUCTURE_BUDGET: u64 = 64 << 20;

/// Bytes of structure kept now, over every file.
static STRUCTURE_KEPT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes of blocks cached now, over every file.
static CACHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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
pub fn object_version(url: &str, store: &StoreOptions) -> Result<crate::storage::Version, String> {
    let recent = RECENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, file)) = recent.iter().find(|(u, o, _)| u == url && o == store) {
        return Ok(file.version.clone());
    }
    drop(recent);
    sized_object(url, store).map(|(_, _, version)| version)
}

/// The storage and key of the object at `url`, and its version.
pub(crate) fn sized_object(
    url: &str,
    store: &StoreOptions,
) -> Result<(Arc<dyn Storage>, String, crate::storage::Version), String> {
    let (store, key) = storage_of(url, store).map_err(|e| e.to_string())?;
    match store.version(&key) {
        Ok(Some(version)) => Ok((store, key, version)),
        Ok(None) => Err("no such object".into()),
        Err(e) => Err(crate::error_chain(&e)),
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

/// A sequential stream of reads: the block it reached and how far ahead it fetches.
#[derive(Clone, Copy)]
struct Stream {
    block: u64,
    window: u64,
}

#[derive(Default)]
struct Cache {
    blocks: HashMap<u64, Bytes>,
    /// Blocks in the order they arrived, for eviction.
    order: VecDeque<u64>,
    /// Blocks being fetched.
    pending: HashSet<u64>,
    /// Most recent first.
    streams: VecDeque<Stream>,
    /// Blocks the prefetcher fetched that no read has used yet.
    unread: HashSet<u64>,
    /// The blocks of arrays a reader said it reads whole (first, last; sorted,
    /// apart): a stream's read-ahead stops at the end of the one it is in,
    /// and there is none outside them, so that reading an array (or a table
    /// between them) fetches nothing of its neighbours, which another pass
    /// reads. With none declared, every stream reads ahead.
    extents: Vec<(u64, u64)>,
    /// Blocks read as [`ReadOf::Structure`].
    structural: HashSet<u64>,
    /// The bytes of each read of HDF5's structure, by (address, length):
    /// every pass that opens the file reads the same object headers again,
    /// and these few kilobytes then need no block (see [`STRUCTURE_BUDGET`]).
    structure: HashMap<(u64, usize), Bytes>,
}

impl Cache {
    /// Drops block `b`, keeping the process's counts of cached and unread bytes.
    fn remove_block(&mut self, b: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        if let Some(bytes) = self.blocks.remove(&b) {
            self.structural.remove(&b);
            CACHED.fetch_sub(bytes.len() as u64, Relaxed);
            if self.unread.remove(&b) {
                UNREAD.fetch_sub(bytes.len() as u64, Relaxed);
            }
        }
    }

    /// Notes that a read used blocks `first..=last`.
    fn mark_read(&mut self, first: u64, last: u64) {
        if self.unread.is_empty() {
            return;
        }
        for b in first..=last {
            if self.unread.remove(&b) {
                let len = self.blocks.get(&b).map_or(0, |bytes| bytes.len() as u64);
                UNREAD.fetch_sub(len, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

/// One object read by ranges, with its block cache.
pub struct RangedFile {
    storage: Arc<dyn Storage>,
    key: String,
    /// The version read (its size and entity tag): every range comes from
    /// it as long as the store keeps it.
    version: crate::storage::Version,
    cache: Mutex<Cache>,
    arrived: Condvar,
    /// The first failure of a read, for the error message (HDF5 reports only
    /// that a read failed).
    pub(crate) failure: Mutex<Option<String>>,
    /// Whether the object was given to the prefetcher ([`prefetch_whole`]).
    prefetching: std::sync::atomic::AtomicBool,
}

/// Files opened lately, most recent last: a conversion opens each input
/// several times (scan, obs, gene totals, tiles), and their HDF5 metadata and
/// the blocks still cached are not fetched again. What is kept is bounded by
/// the block budget ([`cache_budget`], which [`evict_other_files`] enforces),
/// not by a count of files: a file is forgotten only once none of its blocks
/// is cached and nothing has it open, and then only past [`RECENT_FILES`]
/// files. (Bounding the files by count made every pass over more inputs than
/// that fetch them all again.)
static RECENT: Mutex<Vec<Recent>> = Mutex::new(Vec::new());

/// A file of [`RECENT`]: its URL and the options it was reached with (a
/// conversion with other credentials opens it afresh).
type Recent = (String, StoreOptions, Arc<RangedFile>);

/// How many files [`RECENT`] keeps at least, cached blocks or not.
const RECENT_FILES: usize = 32;

impl RangedFile {
    /// The object at `url`, with the blocks of a recent opening of it.
    pub(crate) fn open(url: &str, store: &StoreOptions) -> Result<Arc<RangedFile>, String> {
        let mut recent = RECENT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = recent.iter().position(|(u, o, _)| u == url && o == store) {
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
        let file = Self::open_new(url, store)?;
        let mut recent = RECENT.lock().unwrap_or_else(|e| e.into_inner());
        recent.push((url.to_string(), store.clone(), file.clone()));
        forget_empty_files(&mut recent);
        Ok(file)
    }

    fn open_new(url: &str, store: &StoreOptions) -> Result<Arc<RangedFile>, String> {
        let (storage, key, version) = sized_object(url, store)?;
        Self::over(storage, key, version)
    }

    /// Object `key` of `storage`, of version `version`, read by ranges
    /// (its first and last blocks fetched now).
    pub fn over(
        storage: Arc<dyn Storage>,
        key: String,
        version: crate::storage::Version,
    ) -> Result<Arc<RangedFile>, String> {
        let file = Arc::new(RangedFile {
            storage,
            key,
            version,
            cache: Mutex::new(Cache::default()),
            arrived: Condvar::new(),
            failure: Mutex::new(None),
            prefetching: std::sync::atomic::AtomicBool::new(false),
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
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The object's size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.version.size
    }

    fn n_blocks(&self) -> u64 {
        self.size().div_ceil(BLOCK)
    }

    fn block_range(&self, b: u64) -> std::ops::Range<u64> {
        b * BLOCK..((b + 1) * BLOCK).min(self.size())
    }

    /// Fetches `blocks` (sorted), contiguous runs in one request each.
    fn fetch(&self, blocks: &[u64]) -> Result<Vec<(u64, Bytes)>, String> {
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
            Ok(None) => return Err(format!("{}: vanished while being read", self.storage.location(&self.key))),
            Err(e) => return Err(crate::error_chain(&e)),
        };
        let stats = input_stats();
        let mut out = Vec::with_capacity(blocks.len());
        for ((first, count), (range, bytes)) in runs.iter().zip(ranges.iter().zip(fetched)) {
            stats.record(bytes.len() as u64);
            if bytes.len() as u64 != range.end - range.start {
                return Err(format!(
                    "{}: asked for bytes {}..{}, got {}",
                    self.storage.location(&self.key),
                    range.start,
                    range.end,
                    bytes.len()
                ));
            }
            for b in *first..first + count {
                let r = self.block_range(b);
                out.push((b, bytes.slice((r.start - range.start) as usize..(r.end - range.start) as usize)));
            }
        }
        Ok(out)
    }

    fn insert(&self, cache: &mut Cache, fetched: Vec<(u64, Bytes)>) {
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
        while CACHED.load(Relaxed) > cache_budget() && cache.order.len() as u64 > max_window() * 2 {
            let Some(old) = cache.order.pop_front() else { break };
            cache.remove_block(old);
        }
        if CACHED.load(Relaxed) > cache_budget() {
            evict_other_files(self);
        }
    }

    /// Fills `buf` with the bytes at `addr` (zeros past the end of the object).
    /// A read of HDF5 metadata (not [`ReadOf::Data`]) holds back the
    /// prefetcher while it waits: opening objects is one such read after
    /// another.
    pub(crate) fn read(self: &Arc<Self>, addr: u64, buf: &mut [u8], of: ReadOf) -> Result<(), String> {
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
            stream.window = (stream.window * 2).clamp(1, max_window());
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

// ---- The prefetcher: objects that will be read whole, fetched in order ahead
// of their reader.

/// Blocks per request of the prefetcher (2 MiB): small enough that a read
/// HDF5 waits for is not queued long behind them on a shared link, large
/// enough that a few in flight keep the link busy through the latency.
const PIECE_BLOCKS: u64 = 8;

/// Requests of the prefetcher in flight at once.
const PIECES_IN_FLIGHT: usize = 4;

/// Bytes the prefetcher fetched that no read has used yet, over every file.
static UNREAD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Reads of HDF5 metadata waiting for blocks they fetch themselves.
static WAITING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The most bytes fetched ahead of the readers: half the cache, at most
/// 256 MiB.
fn ahead_limit() -> u64 {
    (cache_budget() / 2).min(256 << 20)
}

/// A part of a file the prefetcher fetches, and the block it reached.
struct Region {
    blocks: std::ops::Range<u64>,
    next: u64,
}

impl Region {
    fn done(&self) -> f64 {
        (self.next - self.blocks.start) as f64 / (self.blocks.end - self.blocks.start).max(1) as f64
    }
}

#[derive(Default)]
struct Prefetch {
    /// Files to fetch, in order, and their regions.
    queue: VecDeque<(Arc<RangedFile>, Vec<Region>)>,
    in_flight: usize,
    started: bool,
}

static PREFETCH: Mutex<Prefetch> = Mutex::new(Prefetch { queue: VecDeque::new(), in_flight: 0, started: false });

static PREFETCH_CHANGED: Condvar = Condvar::new();

/// Fetches the whole of `file` ahead of its reader, after the files given
/// before it: a conversion reads its inputs' X whole, in order, and the link
/// then stays busy through the latency of each request (a few of 2 MiB in
/// flight) and from one file to the next, instead of each file's streams
/// starting cold. At most `ahead_limit()` bytes are fetched before a read
/// uses them; blocks already cached or on their way are skipped. A failed
/// fetch stops the prefetching of that file: its reader fetches the blocks
/// itself and meets the error there.
///
/// `starts` are where the arrays read together begin (their object headers:
/// HDF5 writes an array's chunks after its header): the parts between them
/// are fetched side by side, each as far as the others in proportion, as
/// the reader reads X's data and indices side by side.
pub fn prefetch_whole(file: &Arc<RangedFile>, starts: &[u64]) {
    if file.prefetching.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let n = file.n_blocks();
    let mut bounds: Vec<u64> = starts.iter().map(|a| a / BLOCK).filter(|&b| b < n).chain([0, n]).collect();
    bounds.sort_unstable();
    bounds.dedup();
    let regions: Vec<Region> = bounds.windows(2).map(|w| Region { blocks: w[0]..w[1], next: w[0] }).collect();
    let mut p = PREFETCH.lock().unwrap_or_else(|e| e.into_inner());
    p.queue.push_back((file.clone(), regions));
    if !p.started {
        // Without the thread (none could be started), the reads fetch alone.
        p.started = std::thread::Builder::new().name("deltacells-prefetch".into()).spawn(prefetcher).is_ok();
    }
    PREFETCH_CHANGED.notify_all();
}

/// The prefetch thread: hands the queue's next run of missing blocks to a
/// fetching thread whenever a request may start and the bytes ahead allow.
fn prefetcher() {
    use std::sync::atomic::Ordering::Relaxed;
    let piece = PIECE_BLOCKS * BLOCK;
    let mut p = PREFETCH.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let room = p.in_flight < PIECES_IN_FLIGHT
            && UNREAD.load(Relaxed) + piece <= ahead_limit()
            && WAITING.load(Relaxed) == 0;
        if p.queue.is_empty() {
            p = PREFETCH_CHANGED.wait(p).unwrap_or_else(|e| e.into_inner());
            continue;
        }
        if !room {
            // Reads free room without a signal: look again shortly.
            p = PREFETCH_CHANGED
                .wait_timeout(p, std::time::Duration::from_millis(5))
                .unwrap_or_else(|e| e.into_inner())
                .0;
            continue;
        }
        let (file, regions) = p.queue.front_mut().expect("not empty");
        let file = file.clone();
        // The region furthest behind, in proportion to its length.
        let open = regions.iter_mut().filter(|r| r.next < r.blocks.end);
        let Some(region) = open.min_by(|a, b| a.done().total_cmp(&b.done())) else {
            p.queue.pop_front();
            continue;
        };
        let blocks: Vec<u64> = {
            let mut cache = file.cache.lock().unwrap_or_else(|e| e.into_inner());
            let have = |cache: &Cache, b: u64| cache.blocks.contains_key(&b) || cache.pending.contains(&b);
            let end = region.blocks.end;
            let mut b = region.next;
            while b < end && have(&cache, b) {
                b += 1;
            }
            let start = b;
            while b < end && b - start < PIECE_BLOCKS && !have(&cache, b) {
                b += 1;
            }
            region.next = b;
            cache.pending.extend(start..b);
            (start..b).collect()
        };
        if blocks.is_empty() {
            continue;
        }
        p.in_flight += 1;
        drop(p);
        let (unfetched, unstarted) = (file.clone(), blocks.clone());
        let started = std::thread::Builder::new().spawn(move || {
            let fetched = file.fetch(&blocks);
            let mut cache = file.cache.lock().unwrap_or_else(|e| e.into_inner());
            let failed = match fetched {
                Ok(fetched) => {
                    for (b, bytes) in &fetched {
                        if cache.unread.insert(*b) {
                            UNREAD.fetch_add(bytes.len() as u64, Relaxed);
                        }
                    }
                    file.insert(&mut cache, fetched);
                    false
                }
                Err(_) => {
                    for b in &blocks {
                        cache.pending.remove(b);
                    }
                    true
                }
            };
            drop(cache);
            file.arrived.notify_all();
            let mut p = PREFETCH.lock().unwrap_or_else(|e| e.into_inner());
            p.in_flight -= 1;
            if failed {
                p.queue.retain(|(f, _)| !Arc::ptr_eq(f, &file));
            }
            PREFETCH_CHANGED.notify_all();
        });
        if started.is_err() {
            // No thread to fetch them: the reads will.
            let mut cache = unfetched.cache.lock().unwrap_or_else(|e| e.into_inner());
            for b in &unstarted {
                cache.pending.remove(b);
            }
            drop(cache);
            unfetched.arrived.notify_all();
            let mut p = PREFETCH.lock().unwrap_or_else(|e| e.into_inner());
            p.in_flight -= 1;
            p.queue.clear();
            p.started = false; // the next file tries again
            return;
        }
        p = PREFETCH.lock().unwrap_or_else(|e| e.into_inner());
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
            if CACHED.load(Relaxed) <= cache_budget() {
                return;
            }
            // try_lock: a file whose reader holds its lock is being read now.
            let Ok(mut cache) = file.cache.try_lock() else { continue };
            cache.free_within_budget(structure_too);
        }
    }
}

impl Cache {
    /// Frees this file's blocks, oldest first (those of its structure too,
    /// or not), until the cache is within its budget or none is left.
    fn free_within_budget(&mut self, structure_too: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let mut kept = Vec::new();
        while CACHED.load(Relaxed) > cache_budget() {
            let Some(old) = self.order.pop_front() else { break };
            if !structure_too && self.structural.contains(&old) {
                kept.push(old);
            } else {
                self.remove_block(old);
            }
        }
        for b in kept.into_iter().rev() {
            self.order.push_front(b);
        }
    }
}

// ---- The HDF5 driver. Its structs follow H5FDdevelop.h of the HDF5 that
// hdf5-metno-src builds (2.x): the crate's own bindings of them are older.

/// Opens the objects at `urls` at once (their sizes and first blocks), so
/// that reading them one after another does not wait a round trip per
/// file; failures are left for the opening that needs the file.
pub fn open_all(urls: &[&str], store: &StoreOptions) {
    let fresh: Vec<String> = {
        let recent = RECENT.lock().unwrap_or_else(|e| e.into_inner());
        urls.iter().filter(|u| !recent.iter().any(|(r, o, _)| r == *u && o == store)).map(|u| u.to_string()).collect()
    };
    std::thread::scope(|threads| {
        for chunk in fresh.chunks(fresh.len().div_ceil(8).max(1)) {
            threads.spawn(move || {
                for url in chunk {
                    let _ = RangedFile::open(url, store);
                }
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::ObjectStorage;

    /// An object of `len` bytes (byte i is i * 7 mod 251) in an in-memory store.
    fn object(len: usize) -> (Arc<ObjectStorage>, Vec<u8>) {
        let memory: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let store = Arc::new(ObjectStorage::new(memory, "inputs", "mem://inputs"));
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        store.put("in.h5ad", Bytes::from(bytes.clone())).unwrap();
        (store, bytes)
    }

    fn open(store: &Arc<ObjectStorage>) -> Arc<RangedFile> {
        let version = store.version("in.h5ad").unwrap().unwrap();
        RangedFile::over(store.clone(), "in.h5ad".into(), version).unwrap()
    }

    #[test]
    fn reads_at_any_offset_give_the_object_bytes() {
        let len = 20 * BLOCK as usize + 12_345;
        let (store, bytes) = object(len);
        let file = open(&store);
        assert_eq!(file.size(), len as u64);
        for (addr, n) in
            [(0usize, 10usize), (BLOCK as usize - 3, 7), (5 * BLOCK as usize, 3 * BLOCK as usize + 1), (len - 5, 5)]
        {
            let mut buf = vec![0u8; n];
            file.read(addr as u64, &mut buf, ReadOf::Structure).unwrap();
            assert_eq!(buf, bytes[addr..addr + n], "{n} bytes at {addr}");
        }
        // past the end reads as zeros, as HDF5's own drivers give it
        let mut buf = vec![9u8; 10];
        file.read(len as u64 - 5, &mut buf, ReadOf::Structure).unwrap();
        assert_eq!(buf[..5], bytes[len - 5..]);
        assert_eq!(buf[5..], [0u8; 5]);
        file.read(u64::MAX - 3, &mut buf, ReadOf::Structure).unwrap();
        assert_eq!(buf, [0u8; 10]);
    }

    #[test]
    fn a_block_once_fetched_is_not_fetched_again() {
        let (store, bytes) = object(16 * BLOCK as usize);
        let file = open(&store);
        let mut buf = vec![0u8; 1000];
        file.read(8 * BLOCK, &mut buf, ReadOf::Structure).unwrap();
        let (requests, _) = store.stats().snapshot();
        for _ in 0..5 {
            file.read(8 * BLOCK + 10, &mut buf, ReadOf::Structure).unwrap();
        }
        assert_eq!(store.stats().snapshot().0, requests, "cached blocks served the reads");
        assert_eq!(buf, bytes[8 * BLOCK as usize + 10..8 * BLOCK as usize + 1010]);
    }

    #[test]
    fn a_read_of_structure_is_kept_when_its_blocks_are_let_go() {
        let (store, bytes) = object(16 * BLOCK as usize);
        let file = open(&store);
        let mut header = [0u8; 300];
        file.read(5 * BLOCK + 17, &mut header, ReadOf::Structure).unwrap();
        {
            let mut cache = file.cache.lock().unwrap();
            let blocks: Vec<u64> = cache.blocks.keys().copied().collect();
            for b in blocks {
                cache.remove_block(b);
            }
        }
        let before = store.stats().snapshot();
        let mut again = [0u8; 300];
        file.read(5 * BLOCK + 17, &mut again, ReadOf::Structure).unwrap();
        assert_eq!(again, header);
        assert_eq!(&again[..], &bytes[(5 * BLOCK + 17) as usize..(5 * BLOCK + 317) as usize]);
        assert_eq!(store.stats().snapshot(), before, "the same read of structure fetched nothing");
        // Another read of the same bytes (not structure) needs the block.
        file.read(5 * BLOCK + 17, &mut again, ReadOf::Data).unwrap();
        assert!(store.stats().snapshot().0 > before.0);
    }

    #[test]
    fn read_ahead_follows_data_streams_within_the_arrays_declared() {
        let (store, _) = object(64 * BLOCK as usize);
        let file = open(&store);
        let fetched = || {
            // (Read-ahead runs on threads of its own.)
            std::thread::sleep(std::time::Duration::from_millis(150));
            store.stats().snapshot().1
        };
        let read = |blocks: std::ops::Range<u64>, of: ReadOf| {
            for b in blocks {
                file.read(b * BLOCK + 10, &mut [0u8; 100], of).unwrap();
            }
        };
        // Opening fetched the first and last blocks.
        let opened = fetched();
        // One read fetches its block alone; metadata read on fetches no more.
        read(20..21, ReadOf::Data);
        assert_eq!(fetched(), opened + BLOCK);
        read(21..27, ReadOf::Structure);
        assert_eq!(fetched(), opened + 7 * BLOCK);
        // A data stream within an array declared (blocks 30..=40) reads
        // ahead up to its end, not past it.
        file.set_extents(std::slice::from_ref(&(30 * BLOCK..41 * BLOCK - 1)));
        read(30..33, ReadOf::Data);
        let within = fetched();
        assert!(within > opened + 10 * BLOCK, "the stream read ahead");
        read(33..41, ReadOf::Data);
        assert_eq!(fetched(), opened + 18 * BLOCK, "nothing past the array");
        // Outside the arrays declared, data read on fetches what it reads.
        read(44..48, ReadOf::Data);
        assert_eq!(fetched(), opened + 22 * BLOCK);
    }

    #[test]
    fn a_sequential_stream_reads_ahead_and_a_whole_read_is_prefetched() {
        let len = 64 * BLOCK as usize;
        let (store, bytes) = object(len);
        let file = open(&store);
        // Reading on from where the last read ended fetches ahead: the bytes
        // fetched grow past what was read.
        let mut buf = vec![0u8; BLOCK as usize];
        for b in 4..12 {
            file.read(b * BLOCK, &mut buf, ReadOf::Data).unwrap();
            assert_eq!(buf, bytes[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize]);
        }
        let read_ahead = (0..30).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            store.stats().snapshot().1 > 16 * BLOCK
        });
        assert!(read_ahead, "{} bytes fetched for 16 blocks read", store.stats().snapshot().1);
        // The prefetcher fetches the rest of a file that is read whole.
        prefetch_whole(&file, &[0]);
        let whole = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            store.stats().snapshot().1 >= len as u64
        });
        assert!(whole, "{} of {len} bytes prefetched", store.stats().snapshot().1);
        let before = store.stats().snapshot().0;
        let mut all = vec![0u8; len];
        file.read(0, &mut all, ReadOf::Data).unwrap();
        assert_eq!(all, bytes);
        assert_eq!(store.stats().snapshot().0, before, "the whole file came from the cache");
    }
}
