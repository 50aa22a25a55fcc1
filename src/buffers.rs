//! Buffers kept for reuse: a loop over tiles or batches that writes into
//! memory already mapped, instead of faulting in fresh pages for every tile
//! (which costs about as much as decoding the tile).

use std::sync::Mutex;

use crate::format::CsrMatrix;

/// A pool of `u32` buffers (the indices and counts of decoded matrices).
#[derive(Debug)]
pub struct BufferPool {
    free: Mutex<Vec<Vec<u32>>>,
    keep: usize,
}

impl BufferPool {
    /// A pool that keeps at most `keep` buffers.
    pub fn new(keep: usize) -> BufferPool {
        BufferPool { free: Mutex::new(Vec::new()), keep }
    }

    /// Buffers kept at most.
    pub fn keep(&self) -> usize {
        self.keep
    }

    /// A buffer from the pool, or a new one. It may hold old values: a
    /// decoder overwrites them (resizing only writes past the old length),
    /// and whoever appends clears it first.
    pub fn take(&self) -> Vec<u32> {
        self.free.lock().map(|mut f| f.pop()).ok().flatten().unwrap_or_default()
    }

    /// Gives `v` back, unless the pool is full.
    pub fn give(&self, v: Vec<u32>) {
        if v.capacity() == 0 {
            return;
        }
        if let Ok(mut free) = self.free.lock() {
            if free.len() < self.keep {
                free.push(v);
            }
        }
    }

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
