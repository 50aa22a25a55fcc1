//! The block cache of the objects read by ranges ([`super::RangedFile`]):
//! each file's blocks, the streams reading them, and the bytes kept over
//! every file of the process, within budgets.

use std::collections::{HashMap, HashSet, VecDeque};

use bytes::Bytes;

/// Bytes per block of the cache: what a read of HDF5 metadata fetches.
pub const BLOCK: u64 = 1 << 18;

/// The budgets of the block cache, a value each conversion carries (in
/// [`RemoteOptions`](super::RemoteOptions)); the command line takes them as
/// `--input-cache-mib` and `--input-readahead-mib`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCacheOptions {
    /// The bytes of blocks kept, over every file the process reads by ranges
    /// (at least 8 blocks, 2 MiB).
    pub budget: u64,
    /// The most bytes fetched ahead of one sequential stream (at least one
    /// block). At 50 ms per request and 100 MB/s, a window must hold several
    /// megabytes for the link, not the latency, to bound a stream; a shard
    /// may fetch up to one window past its share of each stream (X's data
    /// and indices).
    pub read_ahead: u64,
}

impl BlockCacheOptions {
    /// The default budget: 512 MiB.
    pub const DEFAULT_BUDGET: u64 = 512 << 20;
    /// The default read-ahead of a stream: 32 MiB.
    pub const DEFAULT_READ_AHEAD: u64 = 32 << 20;

    /// The bytes of blocks kept, over every file.
    pub(super) fn budget(&self) -> u64 {
        self.budget.max(8 * BLOCK)
    }

    /// The most blocks fetched ahead of one stream.
    pub(super) fn window(&self) -> u64 {
        (self.read_ahead / BLOCK).max(1)
    }

    /// The most bytes the prefetcher fetches ahead of the readers: half the
    /// budget, at most 256 MiB.
    pub(super) fn ahead_limit(&self) -> u64 {
        (self.budget() / 2).min(256 << 20)
    }
}

impl Default for BlockCacheOptions {
    fn default() -> Self {
        BlockCacheOptions { budget: Self::DEFAULT_BUDGET, read_ahead: Self::DEFAULT_READ_AHEAD }
    }
}

/// The bytes of HDF5 structure kept by exact read, over every file (64 MiB:
/// object headers and chunk indexes, some kilobytes a file, so that 1,000
/// inputs opened by every pass need not keep the 256 KiB blocks around them).
pub(super) const STRUCTURE_BUDGET: u64 = 64 << 20;

/// Bytes of structure kept now, over every file.
pub(super) static STRUCTURE_KEPT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes of blocks cached now, over every file.
pub(super) static CACHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes the prefetcher fetched that no read has used yet, over every file.
pub(super) static UNREAD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A sequential stream of reads: the block it reached and how far ahead it fetches.
#[derive(Clone, Copy)]
pub(super) struct Stream {
    pub(super) block: u64,
    pub(super) window: u64,
}

#[derive(Default)]
pub(super) struct Cache {
    pub(super) blocks: HashMap<u64, Bytes>,
    /// Blocks in the order they arrived, for eviction.
    pub(super) order: VecDeque<u64>,
    /// Blocks being fetched.
    pub(super) pending: HashSet<u64>,
    /// Most recent first.
    pub(super) streams: VecDeque<Stream>,
    /// Blocks the prefetcher fetched that no read has used yet.
    pub(super) unread: HashSet<u64>,
    /// The blocks of arrays a reader said it reads whole (first, last; sorted,
    /// apart): a stream's read-ahead stops at the end of the one it is in,
    /// and there is none outside them, so that reading an array (or a table
    /// between them) fetches nothing of its neighbours, which another pass
    /// reads. With none declared, every stream reads ahead.
    pub(super) extents: Vec<(u64, u64)>,
    /// Blocks read as [`ReadOf::Structure`](super::ReadOf::Structure).
    pub(super) structural: HashSet<u64>,
    /// The bytes of each read of HDF5's structure, by (address, length):
    /// every pass that opens the file reads the same object headers again,
    /// and these few kilobytes then need no block (see [`STRUCTURE_BUDGET`]).
    pub(super) structure: HashMap<(u64, usize), Bytes>,
}

impl Cache {
    /// Drops block `b`, keeping the process's counts of cached and unread bytes.
    pub(super) fn remove_block(&mut self, b: u64) {
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
    pub(super) fn mark_read(&mut self, first: u64, last: u64) {
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

impl Cache {
    /// Frees this file's blocks, oldest first (those of its structure too,
    /// or not), until the cache is within its budget or none is left.
    pub(super) fn free_within_budget(&mut self, structure_too: bool, budget: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let mut kept = Vec::new();
        while CACHED.load(Relaxed) > budget {
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
