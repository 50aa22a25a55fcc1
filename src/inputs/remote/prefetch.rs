//! The prefetcher: objects that will be read whole, fetched in order ahead
//! of their reader, on a thread of its own.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

use super::cache::{Cache, BLOCK, UNREAD};
use super::ranged::{RangedFile, WAITING};

/// Blocks per request of the prefetcher (2 MiB): small enough that a read
/// HDF5 waits for is not queued long behind them on a shared link, large
/// enough that a few in flight keep the link busy through the latency.
const PIECE_BLOCKS: u64 = 8;

/// Requests of the prefetcher in flight at once.
const PIECES_IN_FLIGHT: usize = 4;

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
/// starting cold. At most half the block budget (256 MiB at most) is fetched before a read
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
        // (ahead of the first file's reader, within its conversion's budget)
        let limit = p.queue.front().map_or(0, |(file, _)| file.limits().ahead_limit());
        let room =
            p.in_flight < PIECES_IN_FLIGHT && UNREAD.load(Relaxed) + piece <= limit && WAITING.load(Relaxed) == 0;
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
