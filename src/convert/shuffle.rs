//! `convert --shuffle SEED`: the cells of all inputs stored in an order fixed
//! by the seed, so that every tile is a random sample of the dataset.
//!
//! Where a cell goes is a keyed permutation of the cell numbers (a Feistel
//! network walked back into range), computed cell by cell: no table of the
//! order is held, and every shard computes the same positions.
//!
//! A shard writes its tiles in two passes. The first reads every input in
//! order and spills each of its cells (counts already checked and mapped to
//! the stored gene order, with its obs row) to the spill file of the bucket
//! of tiles its position falls in; the second reads one bucket at a time,
//! puts its cells in position order and hands its tiles to the encoder.
//! Memory holds one bucket, and the spill buffers; disk holds the shard's
//! cells once, compressed.

use super::error::{ConvertError, Result};
use std::fs::OpenOptions;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

use arrow_array::{RecordBatch, UInt32Array};
use arrow_schema::SchemaRef;

use super::{
    describe_bad_value, input_obs_table, input_remap, open_unchanged, source_code, Dispatch, TileCells, TileJob,
};
use super::{ConvertProgress, SCAN_ROWS};
use crate::format::CsrMatrix;
use crate::inputs::{to_counts, BadValue, Cleaned, RawRows};

/// Rounds of the Feistel network.
const ROUNDS: usize = 8;

/// A bijection of `0..n` chosen by a seed.
#[derive(Clone, Debug)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; ROUNDS],
}

/// The SplitMix64 finalizer: a well-mixed 64-bit hash.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Permutation {
    pub fn new(n: u64, seed: u64) -> Permutation {
        // The network permutes 0..2^(2h), the smallest even power of two that
        // holds n cells; positions past n walk on until they fall below it.
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let mut keys = [0u64; ROUNDS];
        let mut state = mix64(seed ^ 0x6465_6c74_6163_656c);
        for key in &mut keys {
            state = mix64(state.wrapping_add(0x9e37_79b9_7f4a_7c15));
            *key = state;
        }
        Permutation { n, half_bits, keys }
    }

    fn network(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for key in &self.keys {
            let next = left ^ (mix64(right ^ key) & mask);
            left = right;
            right = next;
        }
        (left << self.half_bits) | right
    }

    /// The position of cell `cell` (below n).
    pub fn position(&self, cell: u64) -> u64 {
        debug_assert!(cell < self.n);
        // The network's domain is under 4n, so fewer than 4 steps on average.
        let mut x = self.network(cell);
        while x >= self.n {
            x = self.network(x);
        }
        x
    }
}

/// Where each cell of a conversion or an append goes: the first `kept` in
/// place (an append's, which it does not move), the others in the order of
/// the permutation, after them.
struct Placement {
    kept: u64,
    permutation: Permutation,
}

impl Placement {
    fn position(&self, cell: u64) -> u64 {
        if cell < self.kept {
            cell
        } else {
            self.kept + self.permutation.position(cell - self.kept)
        }
    }
}

/// Bytes of spilled cells a bucket buffers before it compresses them into
/// its file.
const FLUSH_BYTES: usize = 256 * 1024;

/// At most this many buckets (spill files) per shard: a bucket is a run of
/// whole tiles, and the second pass holds one bucket in memory.
pub const MAX_BUCKETS: u64 = 1024;

/// Where a spilled cell came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    pub input: u32,
    pub row: u64,
}

#[derive(Default)]
struct Bucket {
    cells: Vec<u8>,
    obs: Vec<RecordBatch>,
    obs_bytes: usize,
}

/// The first pass's output: the shard's cells, spilled by bucket.
pub struct Scatter {
    dir: tempfile::TempDir,
    positions: Range<u64>,
    bucket_cells: u64,
    buckets: Vec<Bucket>,
    obs_schema: Option<SchemaRef>,
}

impl Scatter {
    /// Spill files for the cells of `positions`, in buckets of `bucket_cells`
    /// (whole tiles), in a new temporary folder in `dir`.
    pub fn new(dir: &Path, positions: Range<u64>, bucket_cells: u64, obs_schema: Option<SchemaRef>) -> Result<Scatter> {
        let dir = tempfile::Builder::new()
            .prefix("deltacells-shuffle-")
            .tempdir_in(dir)
            .map_err(ConvertError::io(format!("cannot create a spill folder in {}", dir.display())))?;
        let n = (positions.end - positions.start).div_ceil(bucket_cells.max(1));
        let buckets = (0..n).map(|_| Bucket::default()).collect();
        Ok(Scatter { dir, positions, bucket_cells: bucket_cells.max(1), buckets, obs_schema })
    }

    pub fn n_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// The positions of bucket `b`.
    pub fn bucket_positions(&self, b: usize) -> Range<u64> {
        let start = self.positions.start + b as u64 * self.bucket_cells;
        start..(start + self.bucket_cells).min(self.positions.end)
    }

    fn path(&self, b: usize, what: &str) -> PathBuf {
        self.dir.path().join(format!("{b:05}.{what}"))
    }

    /// Spills the rows of `counts` whose position (`positions`, one per row)
    /// falls in this scatter's range; `origins` and `obs` are those rows'.
    pub fn add(
        &mut self,
        positions: &[u64],
        origins: &[Origin],
        counts: &CsrMatrix,
        obs: Option<&RecordBatch>,
    ) -> Result<()> {
        let mut obs_rows: Vec<Vec<u32>> = vec![Vec::new(); if obs.is_some() { self.buckets.len() } else { 0 }];
        let mut touched: Vec<usize> = Vec::new();
        for (r, (&pos, origin)) in positions.iter().zip(origins).enumerate() {
            if !self.positions.contains(&pos) {
                continue;
            }
            let b = ((pos - self.positions.start) / self.bucket_cells) as usize;
            let (indices, data) = counts.row(r);
            let out = &mut self.buckets[b].cells;
            out.extend_from_slice(&pos.to_le_bytes());
            out.extend_from_slice(&origin.input.to_le_bytes());
            out.extend_from_slice(&origin.row.to_le_bytes());
            out.extend_from_slice(&(indices.len() as u32).to_le_bytes());
            // Genes as differences from the one before (sorted within a
            // cell): small numbers that compress to a third.
            let mut previous = 0u32;
            for &i in indices {
                out.extend_from_slice(&i.wrapping_sub(previous).to_le_bytes());
                previous = i;
            }
            for &d in data {
                out.extend_from_slice(&d.to_le_bytes());
            }
            if let Some(rows) = obs_rows.get_mut(b) {
                rows.push(r as u32);
            }
            touched.push(b);
        }
        touched.sort_unstable();
        touched.dedup();
        for b in touched {
            if let (Some(batch), Some(rows)) = (obs, obs_rows.get_mut(b)) {
                let taken = arrow_select::take::take_record_batch(batch, &UInt32Array::from(std::mem::take(rows)))?;
                self.buckets[b].obs_bytes += taken.get_array_memory_size();
                self.buckets[b].obs.push(taken);
            }
            if self.buckets[b].cells.len() >= FLUSH_BYTES || self.buckets[b].obs_bytes >= FLUSH_BYTES {
                self.flush(b)?;
            }
        }
        Ok(())
    }

    /// Appends one compressed frame of bucket `b`'s buffered cells (and one
    /// of its obs rows) to its files.
    fn flush(&mut self, b: usize) -> Result<()> {
        let cells = std::mem::take(&mut self.buckets[b].cells);
        if !cells.is_empty() {
            let frame = zstd::bulk::compress(&cells, 1).map_err(ConvertError::io("compressing spilled cells"))?;
            append_frame(&self.path(b, "cells"), &frame)?;
        }
        let obs = std::mem::take(&mut self.buckets[b].obs);
        self.buckets[b].obs_bytes = 0;
        if let (false, Some(schema)) = (obs.is_empty(), &self.obs_schema) {
            let mut bytes = Vec::new();
            {
                let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut bytes, schema)?;
                for batch in &obs {
                    writer.write(batch)?;
                }
                writer.finish()?;
            }
            append_frame(&self.path(b, "obs"), &bytes)?;
        }
        Ok(())
    }

    /// Flushes every bucket: the first pass is over.
    pub fn finish(&mut self) -> Result<()> {
        for b in 0..self.buckets.len() {
            self.flush(b)?;
        }
        Ok(())
    }

    /// Bucket `b`'s cells in position order, with their origins and obs rows.
    /// Every position of the bucket must have been spilled exactly once.
    pub fn gather(&self, b: usize, n_genes: u32) -> Result<Gathered> {
        let range = self.bucket_positions(b);
        let n = (range.end - range.start) as usize;
        let cells_path = self.path(b, "cells");
        let corrupt = |what: &str| {
            ConvertError::invalid(cells_path.display().to_string(), format!("spilled cells are corrupt ({what})"))
        };
        // slot (position - start) -> (origin, offset and length in the arena)
        let mut slots: Vec<Option<(Origin, usize, usize)>> = vec![None; n];
        let mut arena_indices: Vec<u32> = Vec::new();
        let mut arena_data: Vec<u32> = Vec::new();
        let mut spilled_order: Vec<u32> = Vec::with_capacity(n);
        for frame in read_frames(&cells_path)? {
            let bytes = zstd::stream::decode_all(frame.as_slice()).map_err(|_| corrupt("a frame"))?;
            let mut at = 0usize;
            while at < bytes.len() {
                let pos = u64::from_le_bytes(take_bytes(&bytes, &mut at).ok_or_else(|| corrupt("short record"))?);
                let input = u32::from_le_bytes(take_bytes(&bytes, &mut at).ok_or_else(|| corrupt("short record"))?);
                let row = u64::from_le_bytes(take_bytes(&bytes, &mut at).ok_or_else(|| corrupt("short record"))?);
                let nnz: [u8; 4] = take_bytes(&bytes, &mut at).ok_or_else(|| corrupt("short record"))?;
                let nnz = u32::from_le_bytes(nnz) as usize;
                let values =
                    take_slice(&bytes, &mut at, nnz.saturating_mul(8)).ok_or_else(|| corrupt("short record"))?;
                let (indices, data) = values.split_at(nnz * 4);
                let start = arena_indices.len();
                let mut gene = 0u32;
                arena_indices.extend(indices.chunks_exact(4).map(|c| {
                    gene = gene.wrapping_add(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                    gene
                }));
                arena_data.extend(data.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
                if !range.contains(&pos) {
                    return Err(corrupt(&format!("position {pos} outside {}..{}", range.start, range.end)));
                }
                let slot = (pos - range.start) as usize;
                if slots[slot].replace((Origin { input, row }, start, nnz)).is_some() {
                    return Err(corrupt(&format!("position {pos} spilled twice")));
                }
                spilled_order.push(slot as u32);
            }
        }
        let mut counts = CsrMatrix::empty(n_genes);
        counts.indices.reserve(arena_indices.len());
        counts.data.reserve(arena_data.len());
        let mut origins = Vec::with_capacity(n);
        for (k, slot) in slots.iter().enumerate() {
            let Some((origin, start, nnz)) = *slot else {
                return Err(corrupt(&format!("position {} was not spilled", range.start + k as u64)));
            };
            counts.indices.extend_from_slice(&arena_indices[start..start + nnz]);
            counts.data.extend_from_slice(&arena_data[start..start + nnz]);
            counts.indptr.push(counts.indices.len() as u64);
            origins.push(origin);
        }
        drop((arena_indices, arena_data));
        let obs = match &self.obs_schema {
            None => None,
            Some(schema) => {
                let obs_path = self.path(b, "obs");
                let mut batches = Vec::new();
                for frame in read_frames(&obs_path)? {
                    let corrupt =
                        |e| ConvertError::invalid(obs_path.display().to_string(), format!("spilled obs rows: {e}"));
                    let reader =
                        arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(frame), None).map_err(corrupt)?;
                    for batch in reader {
                        batches.push(batch.map_err(corrupt)?);
                    }
                }
                let all = arrow_select::concat::concat_batches(schema, &batches)?;
                if all.num_rows() != n {
                    let problem = format!("{} spilled obs rows for {n} cells", all.num_rows());
                    return Err(ConvertError::invalid(obs_path.display().to_string(), problem));
                }
                // Row k of the spill is the cell of slot spilled_order[k]:
                // invert that to take the rows in position order.
                let mut row_of_slot = vec![0u32; n];
                for (k, &slot) in spilled_order.iter().enumerate() {
                    row_of_slot[slot as usize] = k as u32;
                }
                Some(arrow_select::take::take_record_batch(&all, &UInt32Array::from(row_of_slot))?)
            }
        };
        Ok(Gathered { first: range.start, counts, origins, obs })
    }
}

/// One bucket's cells in position order.
pub struct Gathered {
    /// The position of the first cell.
    pub first: u64,
    pub counts: CsrMatrix,
    pub origins: Vec<Origin>,
    pub obs: Option<RecordBatch>,
}

/// The next `len` bytes of `bytes` from `at`, moving `at` past them.
fn take_slice<'b>(bytes: &'b [u8], at: &mut usize, len: usize) -> Option<&'b [u8]> {
    let end = at.checked_add(len).filter(|&e| e <= bytes.len())?;
    let s = &bytes[*at..end];
    *at = end;
    Some(s)
}

/// The next N bytes of `bytes` from `at`, as an array.
fn take_bytes<const N: usize>(bytes: &[u8], at: &mut usize) -> Option<[u8; N]> {
    take_slice(bytes, at, N).map(|s| s.try_into().expect("N bytes"))
}

fn append_frame(path: &Path, frame: &[u8]) -> Result<()> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(ConvertError::io(format!("cannot write the spill file {}", path.display())))?;
    file.write_all(&(frame.len() as u64).to_le_bytes())
        .and_then(|()| file.write_all(frame))
        .map_err(ConvertError::io(format!("cannot write the spill file {}", path.display())))
}

/// The frames of a spill file (none when the bucket spilled nothing).
fn read_frames(path: &Path) -> Result<Vec<Vec<u8>>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ConvertError::io(format!("cannot read the spill file {}", path.display()))(e)),
    };
    let mut frames = Vec::new();
    let mut rest = bytes.as_slice();
    while !rest.is_empty() {
        let corrupt = |problem| ConvertError::invalid(path.display().to_string(), problem);
        let (len, tail) = rest.split_at_checked(8).ok_or_else(|| corrupt("the file ends inside a frame length"))?;
        let len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
        let len = usize::try_from(len).ok().filter(|&l| l <= tail.len());
        let len = len.ok_or_else(|| corrupt("a frame runs past the end of the file"))?;
        frames.push(tail[..len].to_vec());
        rest = &tail[len..];
    }
    Ok(frames)
}

/// Reads the cells of positions `cells` (whole tiles of the job) from every
/// input, spills them, and hands their tiles to `dispatch` in order. Returns
/// the nonzeros of genes left out (`--genes intersection`) of those cells and
/// the duplicate entries summed.
pub(crate) fn read_shuffled(
    job: &TileJob<'_>,
    seed: u64,
    cells: Range<u64>,
    dispatch: &mut Dispatch<'_>,
    progress: &dyn ConvertProgress,
) -> Result<Cleaned> {
    let TileJob { inputs, matrix, source_genes, remap, obs_plan, .. } = *job;
    let source_digest = super::genes::names_digest(source_genes);
    let n_genes = remap.len() as u32;
    let n_cells: u64 = job.first_cell + inputs.iter().map(|i| i.n_rows).sum::<u64>();
    // An append's cells before its new ones (those of the tiles it keeps, and
    // of the last tile, which it rewrites) keep their places.
    let kept = job.first_cell + inputs.iter().filter(|i| i.stored_tile.is_some()).map(|i| i.n_rows).sum::<u64>();
    let placement = Placement { kept, permutation: Permutation::new(n_cells - kept, seed) };
    let tile_size = job.write.tile_size;
    let n_tiles = (cells.end - cells.start).div_ceil(tile_size);
    let bucket_cells = n_tiles.div_ceil(MAX_BUCKETS).max(1) * tile_size;
    let spill_dir = job.spill_dir.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let mut scatter =
        Scatter::new(&spill_dir, cells.clone(), bucket_cells, obs_plan.map(|p| p.arrow_schema().clone()))?;
    let keep_all = cells == (job.first_cell..n_cells);

    // Pass 1: every input, in order; reading a block (this thread, HDF5)
    // overlaps checking and spilling the one before (the pool).
    progress.phase("shuffling", n_cells - job.first_cell);
    let shared_remap = std::sync::Arc::new(remap.to_vec());
    let mut remaps: Vec<std::sync::Arc<Vec<u32>>> = Vec::with_capacity(inputs.len());
    let mut dropped = Cleaned::default();
    let mut offset = job.first_cell;
    for (i, input) in inputs.iter().enumerate() {
        progress.file(&input.path);
        if input.stored_tile.is_some() {
            // The dataset's last tile (an append's): its cells, in place, in
            // the first shard's tiles only.
            let here = offset..offset + input.n_rows;
            if here.end <= cells.start || here.start >= cells.end {
                offset += input.n_rows;
                progress.advance(input.n_rows);
                remaps.push(std::sync::Arc::new(Vec::new()));
                continue;
            }
            let tail = job.tail.ok_or_else(|| {
                ConvertError::invalid(input.path.display().to_string(), "the stored tile was not read")
            })?;
            let identity = (0..n_genes).collect::<Vec<u32>>();
            let (raw, obs) = tail.read(0..input.n_rows);
            let cells = offset..offset + input.n_rows;
            let block = (i as u32, 0, cells);
            if let Err((_, bad)) =
                spill_block(&mut scatter, &placement, block, &raw, obs.as_ref(), keep_all, (n_genes, &identity))?
            {
                return Err(ConvertError::invalid(input.path.display().to_string(), bad.problem));
            }
            remaps.push(std::sync::Arc::new(identity));
            offset += input.n_rows;
            progress.advance(input.n_rows);
            continue;
        }
        let source = open_unchanged(input, matrix, job.reach)?;
        source.will_read_whole();
        let input_remap = match input_remap(input, source.as_ref(), (source_genes, &source_digest), remap)? {
            Some(r) => std::sync::Arc::new(r),
            None => shared_remap.clone(),
        };
        remaps.push(input_remap.clone());
        let obs_table = input_obs_table(input, source.as_ref(), obs_plan)?;
        let input_obs =
            obs_plan.zip(obs_table.as_deref()).map(|(p, t)| p.for_input(t, source_code(inputs, p, i))).transpose()?;
        // (obs tables are read on this thread only: they are not Sync)
        let read_obs = |rows: Range<u64>| -> Result<Option<RecordBatch>> {
            match (obs_plan, &input_obs, obs_table.as_deref()) {
                (Some(p), Some(maps), Some(t)) => Ok(Some(p.batch(maps, t, rows)?)),
                _ => Ok(None),
            }
        };
        let mut pending: Option<(u64, RawRows, Option<RecordBatch>)> = None;
        let mut start = 0;
        loop {
            let end = (start + SCAN_ROWS).min(input.n_rows);
            let obs = if start < input.n_rows { read_obs(start..end)? } else { None };
            let source = source.as_ref();
            let (next, spilled) = rayon::join(
                || if start < input.n_rows { source.read_rows(start..end).map(Some) } else { Ok(None) },
                || {
                    pending.take().map(|(first, raw, obs)| {
                        let rows = raw.indptr.len() as u64 - 1;
                        let cells = offset + first..offset + first + rows;
                        let spilled = spill_block(
                            &mut scatter,
                            &placement,
                            (i as u32, first, cells),
                            &raw,
                            obs.as_ref(),
                            keep_all,
                            (n_genes, input_remap.as_slice()),
                        );
                        (rows, spilled)
                    })
                },
            );
            if let Some((rows, spilled)) = spilled {
                match spilled? {
                    Ok(d) => dropped += d,
                    Err((row, bad)) => return Err(describe_bad_value(source, row, &bad).into()),
                }
                progress.advance(rows);
            }
            match next? {
                Some(raw) => pending = Some((start, raw, obs)),
                None => break,
            }
            start = end;
        }
        offset += input.n_rows;
    }
    scatter.finish()?;

    // Pass 2: one bucket at a time, its tiles in order.
    progress.phase("converting", cells.end - cells.start);
    let remaps = std::sync::Arc::new(remaps);
    for b in 0..scatter.n_buckets() {
        let gathered = scatter.gather(b, n_genes)?;
        let n = gathered.origins.len();
        let mut first = 0;
        while first < n {
            let last = (first + tile_size as usize).min(n);
            let tile = TileCells::Counts {
                counts: rows_of(&gathered.counts, first..last),
                origins: gathered.origins[first..last].to_vec(),
                obs: gathered.obs.as_ref().map(|o| o.slice(first, last - first)),
                remaps: remaps.clone(),
            };
            if !dispatch(tile) {
                return Ok(dropped);
            }
            progress.advance((last - first) as u64);
            first = last;
        }
    }
    Ok(dropped)
}

/// Checks and spills one block of an input's rows: `(input, first row, its
/// cells' numbers)`. Only rows whose position is the scatter's are checked
/// (unless `keep_all`, when all are). The error of a value that is not a
/// count carries the input's row.
#[allow(clippy::type_complexity)]
fn spill_block(
    scatter: &mut Scatter,
    placement: &Placement,
    (input, first, cells): (u32, u64, Range<u64>),
    raw: &RawRows,
    obs: Option<&RecordBatch>,
    keep_all: bool,
    (n_genes, remap): (u32, &[u32]),
) -> Result<Result<Cleaned, (u64, BadValue)>> {
    let positions: Vec<u64> = cells.clone().map(|c| placement.position(c)).collect();
    let kept: Vec<usize> = if keep_all {
        (0..positions.len()).collect()
    } else {
        (0..positions.len()).filter(|&r| scatter.positions.contains(&positions[r])).collect()
    };
    if kept.is_empty() {
        return Ok(Ok(Cleaned::default()));
    }
    let selected;
    let (rows, obs_rows) = if kept.len() == positions.len() {
        (raw, obs.cloned())
    } else {
        selected = select_rows(raw, &kept);
        let taken = obs
            .map(|o| {
                arrow_select::take::take_record_batch(o, &UInt32Array::from_iter_values(kept.iter().map(|&r| r as u32)))
            })
            .transpose()?;
        (&selected, taken)
    };
    let (counts, dropped) = match to_counts(rows, n_genes, Some(remap)) {
        Ok(c) => c,
        Err(bad) => return Ok(Err((first + kept[bad.row as usize] as u64, bad))),
    };
    let positions: Vec<u64> = kept.iter().map(|&r| positions[r]).collect();
    let origins: Vec<Origin> = kept.iter().map(|&r| Origin { input, row: first + r as u64 }).collect();
    scatter.add(&positions, &origins, &counts, obs_rows.as_ref())?;
    Ok(Ok(dropped))
}

/// Rows `rows` (indices into `raw`) of a block, as a block of their own.
fn select_rows(raw: &RawRows, rows: &[usize]) -> RawRows {
    let mut out = RawRows { indptr: vec![0], indices: Vec::new(), values: raw.values.slice(0..0) };
    for &r in rows {
        let (lo, hi) = (raw.indptr[r] as usize, raw.indptr[r + 1] as usize);
        out.indices.extend_from_slice(&raw.indices[lo..hi]);
        out.values.extend_from(&raw.values, lo..hi);
        out.indptr.push(out.indices.len() as u64);
    }
    out
}

/// Rows `rows` of a matrix, as a matrix of their own.
fn rows_of(m: &CsrMatrix, rows: Range<usize>) -> CsrMatrix {
    let (lo, hi) = (m.indptr[rows.start] as usize, m.indptr[rows.end] as usize);
    CsrMatrix {
        n_cols: m.n_cols,
        indptr: m.indptr[rows.start..=rows.end].iter().map(|&p| p - lo as u64).collect(),
        indices: m.indices[lo..hi].to_vec(),
        data: m.data[lo..hi].to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_bijection_for_any_size() {
        for n in [1u64, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4097, 65_537] {
            let p = Permutation::new(n, 42);
            let mut seen = vec![false; n as usize];
            for cell in 0..n {
                let pos = p.position(cell);
                assert!(pos < n, "n {n}: cell {cell} -> {pos}");
                assert!(!seen[pos as usize], "n {n}: position {pos} twice");
                seen[pos as usize] = true;
            }
        }
    }

    #[test]
    fn seeds_give_different_orders_and_the_same_seed_the_same() {
        let n = 10_000;
        let (a, b, c) = (Permutation::new(n, 1), Permutation::new(n, 2), Permutation::new(n, 1));
        let order = |p: &Permutation| (0..n).map(|i| p.position(i)).collect::<Vec<_>>();
        assert_eq!(order(&a), order(&c));
        let same = order(&a).iter().zip(order(&b)).filter(|(x, y)| **x == *y).count();
        assert!(same < 20, "{same} of {n} cells at the same position under two seeds");
    }

    #[test]
    fn consecutive_cells_land_far_apart() {
        // Cells of one input (consecutive numbers) spread over the whole
        // range: the first 1,000 of 100,000 fall in each tenth about equally.
        let n = 100_000;
        let p = Permutation::new(n, 7);
        let mut tenths = [0u32; 10];
        for cell in 0..1_000 {
            tenths[(p.position(cell) * 10 / n) as usize] += 1;
        }
        assert!(tenths.iter().all(|&t| (60..=140).contains(&t)), "{tenths:?}");
    }

    #[test]
    fn scatter_and_gather_give_cells_in_position_order() {
        let dir = tempfile::tempdir().unwrap();
        let n = 50u64;
        let p = Permutation::new(n, 3);
        // Rows 0..50 of one input; row r has one nonzero, gene r % 7, count r + 1.
        let mut counts = CsrMatrix::empty(7);
        for r in 0..n {
            counts.indices.push((r % 7) as u32);
            counts.data.push(r as u32 + 1);
            counts.indptr.push(counts.indices.len() as u64);
        }
        let positions: Vec<u64> = (0..n).map(|c| p.position(c)).collect();
        let origins: Vec<Origin> = (0..n).map(|row| Origin { input: 0, row }).collect();
        // The shard of positions 10..40, in buckets of 8.
        let mut scatter = Scatter::new(dir.path(), 10..40, 8, None).unwrap();
        scatter.add(&positions[..20], &origins[..20], &slice(&counts, 0..20), None).unwrap();
        scatter.add(&positions[20..], &origins[20..], &slice(&counts, 20..50), None).unwrap();
        scatter.finish().unwrap();
        assert_eq!(scatter.n_buckets(), 4);
        let mut next = 10;
        for b in 0..scatter.n_buckets() {
            let g = scatter.gather(b, 7).unwrap();
            assert_eq!(g.first, next);
            for (k, origin) in g.origins.iter().enumerate() {
                assert_eq!(positions[origin.row as usize], next + k as u64);
                assert_eq!(g.counts.row(k), (&[(origin.row % 7) as u32][..], &[origin.row as u32 + 1][..]));
            }
            next += g.origins.len() as u64;
        }
        assert_eq!(next, 40);
    }

    #[test]
    fn a_missing_position_is_an_error_not_a_hole() {
        let dir = tempfile::tempdir().unwrap();
        let mut scatter = Scatter::new(dir.path(), 0..4, 4, None).unwrap();
        let counts = CsrMatrix { n_cols: 3, indptr: vec![0, 0, 0, 0], indices: vec![], data: vec![] };
        let origins: Vec<Origin> = (0..3).map(|row| Origin { input: 0, row }).collect();
        scatter.add(&[0, 1, 3], &origins, &counts, None).unwrap();
        scatter.finish().unwrap();
        let err = scatter.gather(0, 3).err().unwrap().to_string();
        assert!(err.contains("position 2 was not spilled"), "{err}");
    }

    fn slice(m: &CsrMatrix, rows: Range<usize>) -> CsrMatrix {
        let mut out = CsrMatrix::empty(m.n_cols);
        for r in rows {
            out.push_row_from(m, r);
        }
        out
    }
}
