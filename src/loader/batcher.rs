//! The batching stage: `mix_chunks` decompressed chunks open, each batch's
//! cells drawn from them at random and written straight from their planes
//! into a [`LoaderBatch`]. It decompresses nothing: the decoding stage does.

use std::sync::mpsc::{Receiver, SyncSender};

use rand::RngExt;

use super::buffers::LoaderBatch;
use super::decode::{on, OpenChunk};
use super::options::LoaderError;
use super::plan::{rng_for, EpochPlan};
use crate::batch::{CellWriter, FormedBatch};
use crate::buffers::{BufferPool, FloatPool};
use crate::format::tile::finish_rows;
use crate::vocabulary::RowScratch;
use rayon::prelude::*;

/// A cell drawn for the batch being made: the chunk it is in (its slot in
/// the batcher's `held` chunks), its row and its nonzeros.
struct Drawn {
    chunk: usize,
    row: u64,
    nnz: usize,
}

/// Cells written by one task when a batch's rows are written in parallel.
const ROWS_PER_TASK: usize = 128;

/// The batching thread. It keeps `mix_chunks` decompressed chunks open and
/// draws each batch's cells one at a time, each from an open chunk chosen
/// uniformly at random; a chunk with no cells left is replaced by the next
/// one decompressed (and given back once the batch holding its last cells is
/// written). (Drawing each chunk equally often mixes a batch better than
/// drawing each remaining cell equally often, which gives the nearly spent
/// chunks few cells: 0.90 of random against 0.81 at the defaults, in
/// benches/shuffle_quality.py.) Then the batch's rows are written straight
/// from the chunks' planes into buffers from `buffers`: counts in stored
/// columns on the threads of `pool` at once, each row at its place; any
/// other form one cell after another, as [`CellWriter`] makes it.
pub(super) fn cut_batches(
    plan: &EpochPlan,
    mut writer: CellWriter<'_>,
    chunks: Receiver<Result<Vec<OpenChunk>, LoaderError>>,
    (buffers, floats): (&BufferPool, &FloatPool),
    pool: Option<&rayon::ThreadPool>,
    out: &SyncSender<Result<LoaderBatch, LoaderError>>,
) {
    let options = &plan.options;
    let size = options.batch_size;
    let mut rng = rng_for(options, "cells", &[plan.share as u64]);
    // (Reserved for the cells a batch can hold, not for what batch_size asks.)
    let cells_in_batch = size.min(usize::try_from(plan.n_cells).unwrap_or(usize::MAX));
    let new_batch = |writer: &CellWriter| {
        let (counts, values) = if writer.output().dense && !writer.output().scaled() {
            (buffers.take(), Vec::new())
        } else if writer.output().scaled() {
            (Vec::new(), floats.take())
        } else {
            (Vec::new(), Vec::new())
        };
        writer.start_with(buffers.take_matrix(), counts, values, cells_in_batch)
    };
    let send = |writer: &CellWriter, cells: Vec<u64>, mut batch: FormedBatch| {
        writer.finish(&mut batch);
        finish_rows();
        let FormedBatch { x, values, dense_counts, top_k, top_k_values, .. } = batch;
        out.send(Ok(LoaderBatch { cells, x, values, dense_counts, top_k, top_k_values })).is_ok()
    };
    // In dataset order one open chunk is enough.
    let mix = if options.shuffle { options.mix_chunks } else { 1 };
    // Chunks by slot: those with cells left (`open`, in the order they
    // came), and those spent, kept until the batch being drawn is written.
    let mut held: Vec<Option<OpenChunk>> = Vec::new();
    let (mut open, mut spent, mut free): (Vec<usize>, Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new(), Vec::new());
    let mut exhausted = false;
    // An error from upstream ends the epoch after the full batches the open
    // chunks still make.
    let mut failure: Option<LoaderError> = None;
    let mut drawn_cells: Vec<Drawn> = Vec::with_capacity(cells_in_batch);
    let mut sent = 0u64;
    // The chunks open at first come in one by one, a chunk's cells divided
    // by `mix` draws apart, so that they do not all run out at once (they are
    // drawn equally often): one is then replaced every so many cells, and
    // the decoding keeps up, instead of the batcher waiting for `mix` new
    // chunks together.
    let (mut drawn, mut stagger) = (0usize, 0usize);
    // Chunks come in groups: those of the last group not open yet.
    let mut arrived = std::collections::VecDeque::new();
    let mut next_chunk = || {
        if arrived.is_empty() {
            arrived.extend(chunks.recv()?.map_or_else(|e| vec![Err(e)], |g| g.into_iter().map(Ok).collect()));
        }
        arrived.pop_front().ok_or(std::sync::mpsc::RecvError)
    };
    loop {
        let allowed = drawn.checked_div(stagger).map_or(1, |d| mix.min(1 + d));
        while open.len() < allowed && !exhausted {
            match next_chunk() {
                Ok(Ok(chunk)) => {
                    if stagger == 0 {
                        stagger = (chunk.rows.len() / mix).max(1);
                    }
                    let slot = free.pop().unwrap_or_else(|| {
                        held.push(None);
                        held.len() - 1
                    });
                    held[slot] = Some(chunk);
                    open.push(slot);
                }
                Ok(Err(e)) => {
                    failure = Some(e);
                    exhausted = true;
                }
                Err(_) => exhausted = true,
            }
        }
        if open.is_empty() {
            break;
        }
        let at = if options.shuffle { rng.random_range(0..open.len()) } else { 0 };
        let slot = open[at];
        let chunk = held[slot].as_mut().expect("open chunks are held");
        let row = chunk.rows.pop().expect("open chunks have cells left");
        drawn += 1;
        drawn_cells.push(Drawn { chunk: slot, row, nnz: chunk.planes.row_nnz(row) });
        if chunk.rows.is_empty() {
            spent.push(open.remove(at));
        }
        if drawn_cells.len() == size {
            let batch = new_batch(&writer);
            let (cells, batch) = match write_batch(&mut writer, &held, &drawn_cells, batch, pool) {
                Ok(written) => written,
                Err(e) => {
                    let _ = out.send(Err(e));
                    return;
                }
            };
            drawn_cells.clear();
            for slot in spent.drain(..) {
                // (its planes go back to their pool)
                held[slot] = None;
                free.push(slot);
            }
            sent += 1;
            // After the last batch (with drop_last, before the cells it
            // leaves out) the other stages are stopped by dropping their
            // channels.
            if !send(&writer, cells, batch) || sent == plan.n_batches {
                return;
            }
        }
    }
    if let Some(e) = failure {
        let _ = out.send(Err(e));
        return;
    }
    if !drawn_cells.is_empty() && sent < plan.n_batches {
        let batch = new_batch(&writer);
        match write_batch(&mut writer, &held, &drawn_cells, batch, pool) {
            Ok((cells, batch)) => {
                send(&writer, cells, batch);
            }
            Err(e) => {
                let _ = out.send(Err(e));
            }
        }
    }
}

/// Writes the cells `drawn` (in that order) into `batch`, from the planes
/// of the `held` chunks, each row's rules checked as it is written; returns
/// their global indices and the batch, or the error of the first chunk
/// found to break a rule.
fn write_batch(
    writer: &mut CellWriter<'_>,
    held: &[Option<OpenChunk>],
    drawn: &[Drawn],
    mut batch: FormedBatch,
    pool: Option<&rayon::ThreadPool>,
) -> Result<(Vec<u64>, FormedBatch), LoaderError> {
    let chunk = |d: &Drawn| held[d.chunk].as_ref().expect("a drawn cell's chunk is held until its batch is written");
    let cells: Vec<u64> = drawn.iter().map(|d| chunk(d).start + d.row).collect();
    // Buffers come back from earlier batches with old values: they are
    // resized only to grow (only the new room is zeroed: growing by half
    // at a time zeroed half a batch every other batch), written up to what
    // the batch fills, and cut there by CellWriter::finish.
    let grow = |buffer: &mut Vec<u32>, to: usize| {
        if buffer.len() < to {
            if buffer.capacity() < to {
                buffer.reserve(to + to / 2 - buffer.len());
            }
            buffer.resize(to, 0);
        }
    };
    let output = writer.output();
    if !output.scaled() && !output.dense && output.top_k.is_none() {
        // Counts: every row at its place, known from the nonzeros of the
        // rows before it, so the rows are written at once; rows of a
        // member whose columns map onto the batch's are then mapped in
        // place, at once too, and moved up over what their maps left out.
        // (Mapped one after another, a collection of datasets with genes
        // in orders of their own read its epoch on one core.)
        let total: usize = drawn.iter().map(|d| d.nnz).sum();
        grow(&mut batch.x.indices, total);
        grow(&mut batch.x.data, total);
        let (indices, data) = (&mut batch.x.indices[..total], &mut batch.x.data[..total]);
        on(pool, || write_rows(held, drawn, indices, data)).map_err(|slot| broken(held, slot))?;
        if drawn.iter().all(|d| chunk(d).genes().is_none()) {
            for d in drawn {
                writer.finish_cell_in(&mut batch, d.nnz, None);
            }
            return Ok((cells, batch));
        }
        let unsorted = output.unsorted;
        let kept = on(pool, || map_rows(held, drawn, indices, data, unsorted));
        let (mut from, mut to) = (0usize, 0usize);
        for (d, &n) in drawn.iter().zip(&kept) {
            batch.x.indices.copy_within(from..from + n, to);
            batch.x.data.copy_within(from..from + n, to);
            from += d.nnz;
            to += n;
        }
        for n in kept {
            writer.finish_cell_in(&mut batch, n, None);
        }
        return Ok((cells, batch));
    }
    for (k, d) in drawn.iter().enumerate() {
        if let Some(next) = drawn.get(k + 1) {
            chunk(next).planes.prefetch_row(next.row);
        }
        let chunk = chunk(d);
        let filled = *batch.x.indptr.last().expect("indptr starts at 0") as usize;
        grow(&mut batch.x.indices, filled + d.nnz);
        grow(&mut batch.x.data, filled + d.nnz);
        let (indices, data) = (&mut batch.x.indices[filled..filled + d.nnz], &mut batch.x.data[filled..filled + d.nnz]);
        // (Cached stores: the writer reads the row again.)
        if !chunk.planes.write_row_checked(d.row, indices, data, false) {
            return Err(broken(held, d.chunk));
        }
        writer.finish_cell_in(&mut batch, d.nnz, chunk.genes());
    }
    Ok((cells, batch))
}

/// The error of the held chunk in `slot`, a row of which broke a rule.
fn broken(held: &[Option<OpenChunk>], slot: usize) -> LoaderError {
    held[slot].as_ref().map_or_else(
        || LoaderError::Internal("a chunk was let go before its rows were written".into()),
        OpenChunk::rule_error,
    )
}

/// Maps each row of `drawn`, written one after another in `indices` and
/// `data`, onto the batch's columns by its chunk's map (in output column
/// order unless `unsorted`), in place and in parallel; returns how many
/// entries of each it kept, at the front of its place.
fn map_rows(
    held: &[Option<OpenChunk>],
    drawn: &[Drawn],
    indices: &mut [u32],
    data: &mut [u32],
    unsorted: bool,
) -> Vec<usize> {
    let mut rows = Vec::with_capacity(drawn.len());
    let (mut rest_i, mut rest_d) = (indices, data);
    for d in drawn {
        let (i, ri) = std::mem::take(&mut rest_i).split_at_mut(d.nnz);
        let (v, rv) = std::mem::take(&mut rest_d).split_at_mut(d.nnz);
        (rest_i, rest_d) = (ri, rv);
        let genes = held[d.chunk].as_ref().and_then(OpenChunk::genes);
        rows.push((genes, i, v));
    }
    rows.into_par_iter()
        .with_min_len(ROWS_PER_TASK)
        .map_init(RowScratch::default, |scratch, (genes, i, v)| match genes {
            Some(map) => map.map_row_in(i, v, scratch, unsorted),
            None => i.len(),
        })
        .collect()
}

/// Writes the rows `drawn` one after another into `indices` and `data`
/// (exactly their nonzeros long), in parallel halves down to
/// [`ROWS_PER_TASK`] rows, each checked as it is written; Err with the slot
/// of a chunk whose row broke a rule.
fn write_rows(held: &[Option<OpenChunk>], drawn: &[Drawn], indices: &mut [u32], data: &mut [u32]) -> Result<(), usize> {
    if drawn.len() <= ROWS_PER_TASK {
        // Each row's place, then the rows read chunk by chunk, in order
        // within each (the planes read forwards, not at random).
        let mut places: Vec<(usize, u64, usize, usize)> = Vec::with_capacity(drawn.len());
        let mut at = 0;
        for d in drawn {
            places.push((d.chunk, d.row, at, d.nnz));
            at += d.nnz;
        }
        places.sort_unstable();
        let planes = |chunk: usize| &held[chunk].as_ref().expect("a drawn cell's chunk is held").planes;
        for (k, &(chunk, row, at, n)) in places.iter().enumerate() {
            // The next row's planes are fetched from memory while this one
            // is written (their chunks were decompressed a while ago).
            if let Some(&(next_chunk, next_row, _, _)) = places.get(k + 1) {
                planes(next_chunk).prefetch_row(next_row);
            }
            // (Streaming stores: the batch goes straight out.)
            if !planes(chunk).write_row_checked(row, &mut indices[at..at + n], &mut data[at..at + n], true) {
                return Err(chunk);
            }
        }
        return Ok(());
    }
    let (first, second) = drawn.split_at(drawn.len() / 2);
    let split = first.iter().map(|d| d.nnz).sum();
    let (indices_first, indices_second) = indices.split_at_mut(split);
    let (data_first, data_second) = data.split_at_mut(split);
    let (a, b) = rayon::join(
        || write_rows(held, first, indices_first, data_first),
        || write_rows(held, second, indices_second, data_second),
    );
    a.and(b)
}
