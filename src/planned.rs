//! Gathers planned ahead: a sequence of cell lists known before training
//! starts (a perturbed cell and its matched controls per step, the cell sets
//! of a set-based model, a sampler's batches) read in order on a thread of
//! its own, up to `ahead` lists before the consumer, so that the next lists
//! are read while the model trains on the current one.
//!
//! It owns the order and the read-ahead only; each list is read by the
//! caller's function (a dataset's or a collection's gather in a batch's
//! form), which decides the threads it decodes on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::batch::FormedBatch;
use crate::loader::{LoaderBatch, MAX_PREFETCH};

/// The lists of a plan, read in order: each yields its cells and their rows.
pub struct PlannedGathers<E> {
    next: Option<Receiver<Result<LoaderBatch, E>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl<E: Send + 'static> PlannedGathers<E> {
    /// Starts reading `lists` in order with `read`, on a thread of its own,
    /// at most `ahead` lists (1 to [`MAX_PREFETCH`], clamped) before the
    /// consumer. An error ends the sequence after the lists before it.
    /// Fails only when the thread cannot be started.
    pub fn start<F>(lists: Vec<Vec<u64>>, ahead: usize, mut read: F) -> std::io::Result<PlannedGathers<E>>
    where
        F: FnMut(&[u64]) -> Result<FormedBatch, E> + Send + 'static,
    {
        let (tx, rx) = sync_channel(ahead.clamp(1, MAX_PREFETCH));
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new().name("deltacells-gathers".into()).spawn(move || {
            for cells in lists {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let batch = read(&cells).map(|formed| LoaderBatch {
                    cells,
                    x: formed.x,
                    values: formed.values,
                    dense_counts: formed.dense_counts,
                    top_k: formed.top_k,
                    top_k_values: formed.top_k_values,
                });
                let failed = batch.is_err();
                // The consumer gone: stop.
                if tx.send(batch).is_err() || failed {
                    return;
                }
            }
        })?;
        Ok(PlannedGathers { next: Some(rx), stop, thread: Some(thread) })
    }
}

impl<E> Iterator for PlannedGathers<E> {
    type Item = Result<LoaderBatch, E>;

    fn next(&mut self) -> Option<Self::Item> {
        // The thread ends after the last list (or an error): then None.
        self.next.as_ref()?.recv().ok()
    }
}

impl<E> Drop for PlannedGathers<E> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Dropping the receiver wakes a thread waiting to send.
        drop(self.next.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::CsrMatrix;

    fn formed(cells: &[u64]) -> FormedBatch {
        let mut x = CsrMatrix::empty(1);
        for &c in cells {
            x.indices.push(0);
            x.data.push(c as u32 + 1);
            x.indptr.push(x.indices.len() as u64);
        }
        FormedBatch {
            rows: cells.len(),
            n_cols: 1,
            x,
            values: vec![],
            dense_counts: vec![],
            top_k: vec![],
            top_k_values: vec![],
        }
    }

    #[test]
    fn lists_come_in_order_and_an_error_ends_them() {
        let lists: Vec<Vec<u64>> = (0..20).map(|i| vec![i, i + 100, i]).collect();
        let got: Vec<_> = PlannedGathers::<String>::start(lists.clone(), 3, |c| Ok(formed(c))).unwrap().collect();
        assert_eq!(got.len(), 20);
        for (batch, want) in got.into_iter().zip(&lists) {
            let batch = batch.unwrap();
            assert_eq!(&batch.cells, want);
            assert_eq!(batch.x.data, want.iter().map(|&c| c as u32 + 1).collect::<Vec<_>>());
        }
        let failing =
            PlannedGathers::start(lists, 2, |c| if c[0] == 5 { Err(format!("cell {}", c[0])) } else { Ok(formed(c)) })
                .unwrap();
        let got: Vec<_> = failing.collect();
        assert_eq!(got.len(), 6);
        assert_eq!(got[5].as_ref().unwrap_err(), "cell 5");
    }

    #[test]
    fn dropping_it_early_stops_the_thread() {
        let lists: Vec<Vec<u64>> = (0..10_000).map(|i| vec![i]).collect();
        let mut gathers = PlannedGathers::<String>::start(lists, 4, |c| Ok(formed(c))).unwrap();
        assert_eq!(gathers.next().unwrap().unwrap().cells, vec![0]);
        drop(gathers); // joins the thread: the test ends only if it stopped
    }
}
