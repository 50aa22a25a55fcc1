//! Buffers kept for reuse: a loop over tiles or batches that writes into
//! memory already mapped, instead of faulting in fresh pages for every tile
//! (which costs about as much as decoding the tile).

use std::sync::Mutex;

use crate::format::tile::ChunkPlanes;
use crate::format::CsrMatrix;

/// What a [`Pool`] holds: a value whose memory is worth reusing.
pub trait Reusable: Default {
    /// Whether a value given back is worth keeping (an empty buffer is not).
    fn worth_keeping(&self) -> bool {
        true
    }

    /// The memory it holds, in bytes, for a pool kept within a budget of
    /// bytes (0 where no pool of it has one).
    fn held_bytes(&self) -> u64 {
        0
    }
}

impl Reusable for Vec<u32> {
    fn worth_keeping(&self) -> bool {
        self.capacity() > 0
    }
}

impl Reusable for Vec<f32> {
    fn worth_keeping(&self) -> bool {
        self.capacity() > 0
    }
}

impl Reusable for ChunkPlanes {
    fn held_bytes(&self) -> u64 {
        self.heap_bytes()
    }
}

/// A pool of values kept for reuse, at most `keep` of them (and, if it
/// has a budget, at most that many bytes of them).
#[derive(Debug)]
pub struct Pool<T> {
    free: Mutex<Free<T>>,
    keep: usize,
    budget: u64,
}

/// The values a [`Pool`] holds, and their bytes.
#[derive(Debug)]
struct Free<T> {
    values: Vec<T>,
    bytes: u64,
    /// Values [`Pool::take`] made new, having none to give.
    made: usize,
}

/// A pool of `u32` buffers (the indices and counts of decoded matrices).
pub type BufferPool = Pool<Vec<u32>>;

/// A pool of `f32` buffers (scaled values of batches).
pub type FloatPool = Pool<Vec<f32>>;

impl<T: Reusable> Pool<T> {
    /// A pool that keeps at most `keep` values.
    pub fn new(keep: usize) -> Pool<T> {
        Pool::within(keep, u64::MAX)
    }

    /// A pool that keeps at most `keep` values, holding at most `budget`
    /// bytes between them (by [`Reusable::held_bytes`]).
    pub fn within(keep: usize, budget: u64) -> Pool<T> {
        Pool { free: Mutex::new(Free { values: Vec::new(), bytes: 0, made: 0 }), keep, budget }
    }

    /// Values kept at most.
    pub fn keep(&self) -> usize {
        self.keep
    }

    /// How many values it holds, and how many [`Pool::take`] has made new:
    /// when nothing taken is still out, the two are equal unless some were
    /// not given back (or not kept).
    pub fn counts(&self) -> (usize, usize) {
        self.free.lock().map_or((0, 0), |free| (free.values.len(), free.made))
    }

    /// A value from the pool, or a new one. It may hold old contents: a
    /// decoder overwrites them (resizing only writes past the old length),
    /// and whoever appends clears it first.
    pub fn take(&self) -> T {
        let Ok(mut free) = self.free.lock() else { return T::default() };
        let Some(value) = free.values.pop() else {
            free.made += 1;
            return T::default();
        };
        free.bytes = free.bytes.saturating_sub(value.held_bytes());
        value
    }

    /// Gives `value` back, unless the pool is full (in values or bytes) or
    /// it is not worth keeping.
    pub fn give(&self, value: T) {
        if !value.worth_keeping() {
            return;
        }
        let bytes = value.held_bytes();
        if let Ok(mut free) = self.free.lock() {
            if free.values.len() < self.keep && free.bytes.saturating_add(bytes) <= self.budget {
                free.bytes += bytes;
                free.values.push(value);
            }
        }
    }
}

impl BufferPool {
    /// A matrix whose `indices` and `data` come from the pool.
    pub fn take_matrix(&self) -> CsrMatrix {
        CsrMatrix { indices: self.take(), data: self.take(), ..CsrMatrix::default() }
    }

    /// Gives back a matrix's `indices` and `data`.
    pub fn give_matrix(&self, m: CsrMatrix) {
        self.give(m.indices);
        self.give(m.data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_keep_values_worth_keeping() {
        let pool = BufferPool::new(2);
        pool.give(Vec::new());
        assert_eq!(pool.take().capacity(), 0, "an empty buffer is not kept");
        for n in [10, 20, 30] {
            pool.give(Vec::with_capacity(n));
        }
        let kept: Vec<usize> = (0..3).map(|_| pool.take().capacity()).collect();
        assert!(kept[0] >= 20 && kept[1] >= 10 && kept[2] == 0, "{kept:?}");
    }

    /// A value of `bytes` bytes, for a pool with a budget.
    #[derive(Default)]
    struct Sized(u64);

    impl Reusable for Sized {
        fn held_bytes(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn a_budget_bounds_the_bytes_kept_and_frees_room_as_values_are_taken() {
        let pool = Pool::within(10, 100);
        for bytes in [60, 50, 40] {
            pool.give(Sized(bytes));
        }
        // 60 + 50 is over the budget: the 50 was dropped, the 40 kept.
        assert_eq!(pool.take().0, 40);
        assert_eq!(pool.take().0, 60);
        assert_eq!(pool.take().0, 0, "nothing more was kept");
        pool.give(Sized(100));
        assert_eq!(pool.take().0, 100, "taking gave the budget back");
    }
}
