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

impl Reusable for ChunkPlanes {}

/// A pool of values kept for reuse, at most `keep` of them.
#[derive(Debug)]
pub struct Pool<T> {
    free: Mutex<Vec<T>>,
    keep: usize,
}

/// A pool of `u32` buffers (the indices and counts of decoded matrices).
pub type BufferPool = Pool<Vec<u32>>;

/// A pool of `f32` buffers (scaled values of batches).
pub type FloatPool = Pool<Vec<f32>>;

impl<T: Reusable> Pool<T> {
    /// A pool that keeps at most `keep` values.
    pub fn new(keep: usize) -> Pool<T> {
        Pool { free: Mutex::new(Vec::new()), keep }
    }

    /// Values kept at most.
    pub fn keep(&self) -> usize {
        self.keep
    }

    /// A value from the pool, or a new one. It may hold old contents: a
    /// decoder overwrites them (resizing only writes past the old length),
    /// and whoever appends clears it first.
    pub fn take(&self) -> T {
        self.free.lock().map(|mut f| f.pop()).ok().flatten().unwrap_or_default()
    }

    /// Gives `value` back, unless the pool is full or it is not worth keeping.
    pub fn give(&self, value: T) {
        if !value.worth_keeping() {
            return;
        }
        if let Ok(mut free) = self.free.lock() {
            if free.len() < self.keep {
                free.push(value);
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
}
