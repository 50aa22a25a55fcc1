//! The tile pipeline of every job that writes tiles (convert, a shard,
//! append): cells read from the inputs in tile order, each tile checked,
//! remapped and encoded on the pool, and written in order by one writer
//! thread, with its obs shards.

use std::path::Path;
use std::sync::mpsc;

use super::base::StoredObsRows;
use super::error::Result;
use super::obs_merge::ObsPlan;
use super::obs_shards::{ShardRecord, ShardWriter};
use super::{genes, input_remap, shuffle, ConvertError, ConvertProgress, Input, StoredTail};
use crate::format::{CsrMatrix, TileEncoder};
use crate::inputs::{self, to_counts, BadCount, BadValue, Cleaned, InputError, InputSource, RawRows};
use crate::writer::{DatasetWriter, WriteOptions};

/// Cells of one input that belong to one tile.
pub(crate) struct Part {
    input: usize,
    first_row: u64,
    rows: RawRows,
    /// The input's column -> output column.
    remap: std::sync::Arc<Vec<u32>>,
    obs: Option<arrow_array::RecordBatch>,
}

/// Why a tile could not be produced; turned into a message that names the file,
/// cell and gene on the calling thread, where HDF5 may be used.
enum TileFailure {
    BadValue { input: usize, row: u64, gene: u64, problem: String },
    Other(ConvertError),
}

/// A tile encoded, with what the writer records of it.
struct EncodedTile {
    blob: Vec<u8>,
    cells: u64,
    nnz: u64,
    /// Nonzeros of genes the dataset does not store; duplicates summed.
    cleaned: Cleaned,
    obs: Option<arrow_array::RecordBatch>,
}

/// Rows read from HDF5 at a time while converting: a tile is gathered from
/// blocks of at most this many rows, so that progress moves (and a change of
/// input shows) within a tile, not a whole tile at a time.
const READ_ROWS: u64 = 2_048;

/// The tiles one run writes, and how.
pub(crate) struct TileJob<'a> {
    pub inputs: &'a [Input],
    /// The dataset's cell that is the first input's first row (an append's
    /// inputs come after the cells it keeps).
    pub first_cell: u64,
    /// The cells of the input that is a stored tile (an append's).
    pub tail: Option<&'a StoredTail>,
    /// The obs rows of the tiles before `tiles.start` in its obs shard (an
    /// append's, whose first tile may not start a shard), read a tile at a
    /// time as the shard is written again.
    pub obs_prefix: Option<&'a StoredObsRows>,
    pub matrix: &'a str,
    pub tiles: std::ops::Range<usize>,
    /// The dataset's genes in source order (before sorting by counts).
    pub source_genes: &'a [String],
    /// Source gene -> output column.
    pub remap: &'a [u32],
    pub obs_plan: Option<&'a ObsPlan>,
    pub obs_tiles_per_file: u64,
    pub write: WriteOptions,
    pub max_in_flight: usize,
    /// Store the cells in the order of this seed's permutation.
    pub shuffle: Option<u64>,
    /// Where a shuffled job spills its cells (default: the system's
    /// temporary folder).
    pub spill_dir: Option<&'a Path>,
    /// How inputs at URLs are reached.
    pub reach: &'a inputs::InputOptions,
}

/// What [`write_tiles`] wrote besides the tiles.
pub(crate) struct TilesWritten {
    /// The obs shards' records, when there is obs.
    pub obs_shards: Option<Vec<ShardRecord>>,
    /// Nonzeros of genes the dataset does not store; duplicates summed.
    pub cleaned: Cleaned,
}

/// A tile being encoded: where its result will arrive.
type Pending = mpsc::Receiver<Result<EncodedTile, TileFailure>>;

/// Streams the cells of tiles `job.tiles` (from the inputs that hold them) into
/// tiles, encodes them in parallel and writes them in order, with their obs
/// shards.
///
/// The reader (this thread) hands each tile to the rayon pool and sends the
/// receiver of its result to the writer thread through one bounded channel; the
/// writer takes the receivers in order and waits on each. The channel's bound
/// is both the order and the memory bound: at most `max_in_flight` tiles are
/// encoding or waiting to be written while the next one is read. When the
/// writer stops (a failure), the channel closes and the reader stops too.
pub(crate) fn write_tiles(
    job: &TileJob<'_>,
    writer: &mut DatasetWriter<'_>,
    progress: &dyn ConvertProgress,
) -> Result<TilesWritten> {
    let TileJob { inputs, matrix, remap, obs_plan, .. } = *job;
    let shared_remap = std::sync::Arc::new(remap.to_vec());
    let tile_size = job.write.tile_size;
    let n_genes = remap.len() as u32;
    let encoder = TileEncoder::new(job.write.n_chunks, job.write.zstd_level);
    let blocks = BlockPool::new(job.max_in_flight.max(1) + 1);
    let n_cells: u64 = job.first_cell + inputs.iter().map(|i| i.n_rows).sum::<u64>();
    let cells = (job.tiles.start as u64 * tile_size).min(n_cells)..(job.tiles.end as u64 * tile_size).min(n_cells);
    // A rendezvous channel for one tile in flight: the reader can hand over
    // tile k + 1 only once the writer has finished tile k and waits for it.
    let (queue, pending) = mpsc::sync_channel::<Pending>(job.max_in_flight.max(1) - 1);

    let (read_result, write_result) = std::thread::scope(|threads| {
        let per_file = job.obs_tiles_per_file.max(1);
        let mut shard_writer = obs_plan
            .map(|p| ShardWriter::starting_at(p.arrow_schema().clone(), per_file, job.tiles.start / per_file as usize));
        let writer_thread = threads.spawn(move || -> Result<TilesWritten, (usize, TileFailure)> {
            let mut cleaned = Cleaned::default();
            if let (Some(shards), Some(prefix), Some(plan)) = (&mut shard_writer, job.obs_prefix, obs_plan) {
                for i in 0..prefix.len() {
                    shards.add_kept(prefix, i, plan, writer.storage()).map_err(|e| (0, TileFailure::Other(e)))?;
                }
            }
            for (next, tile) in pending.into_iter().enumerate() {
                let index = job.tiles.start + next;
                // A pool task that died without sending is a failure too.
                let tile = tile
                    .recv()
                    .unwrap_or_else(|_| {
                        Err(TileFailure::Other(ConvertError::Stopped(format!("tile {index}: encoding stopped"))))
                    })
                    .map_err(|f| (next, f))?;
                writer
                    .put_tile(index, tile.blob, tile.cells, tile.nnz)
                    .map_err(ConvertError::from)
                    .and_then(|()| match (&mut shard_writer, &tile.obs) {
                        (Some(shards), Some(batch)) => shards.add_tile(batch, writer.storage()),
                        _ => Ok(()),
                    })
                    .map_err(|e| (next, TileFailure::Other(e)))?;
                cleaned += tile.cleaned;
                progress.tile_done(index, tile.cells, tile.nnz);
            }
            let obs_shards = match shard_writer {
                Some(shards) => Some(shards.finish(writer.storage()).map_err(|e| (0, TileFailure::Other(e)))?),
                None => None,
            };
            Ok(TilesWritten { obs_shards, cleaned })
        });

        let read_result = rayon::in_place_scope(|pool| -> Result<Cleaned> {
            // Hands a tile's cells to the pool; false once the writer has stopped.
            let mut dispatch = |cells: TileCells| {
                let (done, result) = mpsc::sync_channel(1);
                if queue.send(result).is_err() {
                    return false;
                }
                let (encoder, blocks) = (&encoder, &blocks);
                pool.spawn(move |_| {
                    let _ = done.send(encode_tile(cells, n_genes, encoder, blocks));
                });
                true
            };
            match job.shuffle {
                None => read_in_order(job, cells.clone(), &shared_remap, &mut dispatch, progress)
                    .map(|()| Cleaned::default()),
                Some(seed) => shuffle::read_shuffled(job, seed, cells.clone(), &mut dispatch, progress),
            }
        });
        // Closing the queue ends the writer's loop once it has what was sent.
        drop(queue);
        let write_result = writer_thread.join().expect("the writer thread does not panic");
        (read_result, write_result)
    });
    match write_result {
        Ok(mut written) => {
            // (nonzeros of genes left out while cells were spilled)
            written.cleaned += read_result?;
            Ok(written)
        }
        // A failure of the writer comes first: it is why the reader stopped.
        Err((_, TileFailure::Other(e))) => Err(e),
        Err((_, TileFailure::BadValue { input, row, gene, problem })) => {
            let source = inputs::open(&inputs[input].path, matrix, job.reach)?;
            Err(describe_bad_value(source.as_ref(), row, &BadValue { row, gene, problem }).into())
        }
    }
}

/// Where a tile reader hands each tile's cells; false once the writer has
/// stopped (the reader then stops too).
pub(crate) type Dispatch<'d> = dyn FnMut(TileCells) -> bool + 'd;

/// The cells of `cells` as the inputs hold them, one after another, cut into
/// tiles of parts (blocks of rows of one input).
fn read_in_order(
    job: &TileJob<'_>,
    cells: std::ops::Range<u64>,
    shared_remap: &std::sync::Arc<Vec<u32>>,
    dispatch: &mut Dispatch<'_>,
    progress: &dyn ConvertProgress,
) -> Result<()> {
    let TileJob { inputs, matrix, source_genes, remap, obs_plan, .. } = *job;
    let source_digest = genes::names_digest(source_genes);
    let tile_size = job.write.tile_size;
    let n_genes = remap.len() as u32;
    progress.phase("converting", cells.end - cells.start);
    let mut parts: Vec<Part> = Vec::new();
    let mut cells_in_tile = 0u64;
    // Blocks of rows of input `i` (read by `read`) into tiles; false once
    // the writer has stopped.
    type ReadBlock<'r> = dyn FnMut(std::ops::Range<u64>) -> Result<(RawRows, Option<arrow_array::RecordBatch>)> + 'r;
    let mut feed = |i: usize,
                    rows: std::ops::Range<u64>,
                    remap: &std::sync::Arc<Vec<u32>>,
                    read: &mut ReadBlock<'_>|
     -> Result<bool> {
        let mut row = rows.start;
        while row < rows.end {
            let take = (tile_size - cells_in_tile).min(rows.end - row).min(READ_ROWS);
            let (block, obs) = read(row..row + take)?;
            parts.push(Part { input: i, first_row: row, rows: block, remap: remap.clone(), obs });
            progress.advance(take);
            row += take;
            cells_in_tile += take;
            if cells_in_tile == tile_size {
                if !dispatch(TileCells::Parts { parts: std::mem::take(&mut parts), cells: cells_in_tile }) {
                    return Ok(false);
                }
                cells_in_tile = 0;
            }
        }
        Ok(true)
    };
    // Only the inputs that hold the job's cells, and only those rows.
    let mut offset = job.first_cell;
    for (i, input) in inputs.iter().enumerate() {
        let here = offset..offset + input.n_rows;
        offset = here.end;
        let (start, end) = (here.start.max(cells.start), here.end.min(cells.end));
        if start >= end {
            continue;
        }
        let rows = start - here.start..end - here.start;
        progress.file(&input.path);
        if input.stored_tile.is_some() {
            let tail = job.tail.ok_or_else(|| {
                ConvertError::invalid(input.path.display().to_string(), "the stored tile was not read")
            })?;
            let identity = std::sync::Arc::new((0..n_genes).collect::<Vec<u32>>());
            if !feed(i, rows, &identity, &mut |r| Ok(tail.read(r)))? {
                return Ok(());
            }
            continue;
        }
        let source = open_unchanged(input, matrix, job.reach)?;
        if rows.start == 0 && rows.end == input.n_rows {
            source.will_read_whole();
        }
        let input_remap = match input_remap(input, source.as_ref(), (source_genes, &source_digest), remap)? {
            Some(r) => std::sync::Arc::new(r),
            None => shared_remap.clone(),
        };
        let obs_table = input_obs_table(input, source.as_ref(), obs_plan)?;
        let input_obs =
            obs_plan.zip(obs_table.as_deref()).map(|(p, t)| p.for_input(t, source_code(inputs, p, i))).transpose()?;
        let mut read = |r: std::ops::Range<u64>| -> Result<_> {
            let obs = match (obs_plan, &input_obs, obs_table.as_deref()) {
                (Some(p), Some(maps), Some(t)) => Some(p.batch(maps, t, r.clone())?),
                _ => None,
            };
            Ok((source.read_rows(r)?, obs))
        };
        if !feed(i, rows, &input_remap, &mut read)? {
            return Ok(());
        }
    }
    if cells_in_tile > 0 {
        dispatch(TileCells::Parts { parts: std::mem::take(&mut parts), cells: cells_in_tile });
    }
    Ok(())
}

/// Input `i`'s code in `source_file`: its number among the inputs that are
/// files (an append's first input may be the dataset's own last tile).
pub(crate) fn source_code(inputs: &[Input], plan: &ObsPlan, i: usize) -> usize {
    let tiles = inputs.iter().filter(|x| x.stored_tile.is_some()).count();
    plan.source_code(i.saturating_sub(tiles), inputs.len() - tiles)
}

/// Opens an input for its tiles, refusing one whose size or entity tag
/// changed since the plan scanned it.
pub(crate) fn open_unchanged(
    input: &Input,
    matrix: &str,
    reach: &inputs::InputOptions,
) -> Result<Box<dyn InputSource>> {
    // (a file that cannot be read at all fails in open, below)
    if let Some(now) = inputs::input_version(&input.path, reach) {
        let was = crate::storage::Version { size: input.bytes, etag: input.etag.clone() };
        // (tags are compared when both sides have one: a plan made before
        // they were recorded has none)
        let retagged = matches!((&was.etag, &now.etag), (Some(a), Some(b)) if a != b);
        if now.size != was.size || retagged {
            return Err(InputError::Changed {
                path: input.path.clone(),
                was: inputs::describe_version(&was),
                now: inputs::describe_version(&now),
            }
            .into());
        }
    }
    Ok(inputs::open(&input.path, matrix, reach)?)
}

/// An input's obs table, when the plan stores obs.
pub(crate) fn input_obs_table<'s>(
    input: &Input,
    source: &'s dyn InputSource,
    obs_plan: Option<&ObsPlan>,
) -> Result<Option<Box<dyn inputs::Table + 's>>> {
    match obs_plan {
        Some(_) => Ok(Some(source.obs()?.ok_or_else(|| {
            ConvertError::invalid(input.path.display().to_string(), "has no obs table, but the plan has obs")
        })?)),
        None => Ok(None),
    }
}

/// One tile's cells, as a reader hands them to the encoder.
pub(crate) enum TileCells {
    /// Blocks of rows as the inputs hold them, to check and remap.
    Parts { parts: Vec<Part>, cells: u64 },
    /// Counts already checked and in the stored gene order (a shuffled
    /// tile's, gathered from the spill).
    Counts {
        counts: CsrMatrix,
        origins: Vec<shuffle::Origin>,
        obs: Option<arrow_array::RecordBatch>,
        /// Each input's column -> output column, to name a gene in a message.
        remaps: std::sync::Arc<Vec<std::sync::Arc<Vec<u32>>>>,
    },
}

/// Tiles' blocks of counts kept for the next tiles to fill, so that each
/// tile's parts are joined into memory already in use instead of into
/// fresh pages (the faults of fresh pages were a sixth to a fifth of an
/// uncompressed conversion's CPU samples, most of them here and in reading).
struct BlockPool {
    kept: std::sync::Mutex<Vec<CsrMatrix>>,
    most: usize,
}

impl BlockPool {
    fn new(most: usize) -> BlockPool {
        BlockPool { kept: std::sync::Mutex::new(Vec::new()), most }
    }

    /// An empty block of `n_cols` columns, with the room of one kept.
    fn take(&self, n_cols: u32) -> CsrMatrix {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut block = kept.unwrap_or_else(|| CsrMatrix::empty(n_cols));
        block.n_cols = n_cols;
        block.indptr.clear();
        block.indptr.push(0);
        block.indices.clear();
        block.data.clear();
        block
    }

    /// Keeps `block`'s room for a later tile (up to `most` blocks).
    fn give_back(&self, block: CsrMatrix) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < self.most {
            kept.push(block);
        }
    }
}

/// Checks, remaps and encodes one tile's cells.
fn encode_tile(
    cells: TileCells,
    n_genes: u32,
    encoder: &TileEncoder,
    blocks: &BlockPool,
) -> Result<EncodedTile, TileFailure> {
    // Where each cell came from is looked up only when encoding fails.
    // (only blocks taken from the pool go back to it: a shuffled tile's
    // counts come made, and keeping them would only hold their memory)
    let (block, origin, obs, dropped, pooled) = match cells {
        TileCells::Parts { parts, cells } => {
            let (block, origin, obs, dropped) = assemble(parts, blocks.take(n_genes))?;
            debug_assert_eq!(block.n_rows() as u64, cells);
            (block, TileOrigin::Parts(origin), obs, dropped, true)
        }
        TileCells::Counts { counts, origins, obs, remaps } => {
            (counts, TileOrigin::Cells(origins, remaps), obs, Cleaned::default(), false)
        }
    };
    let cells = block.n_rows() as u64;
    let nnz = block.nnz() as u64;
    let encoded = encoder.encode(&block);
    if pooled {
        blocks.give_back(block);
    }
    match encoded {
        Ok(blob) => Ok(EncodedTile { blob, cells, nnz, cleaned: dropped, obs }),
        Err(e) => match e.cell_and_gene() {
            Some((cell, gene)) => {
                let (input, row, remap) = origin.of(cell);
                let source_gene = remap.iter().position(|&j| j == gene).unwrap_or(gene as usize) as u64;
                Err(TileFailure::BadValue { input, row, gene: source_gene, problem: e.problem() })
            }
            None => Err(TileFailure::Other(e.into())),
        },
    }
}

/// Where a tile's cells came from, for the message of a value that cannot
/// be encoded.
enum TileOrigin {
    /// Runs of rows of one input each (see [`Origins`]).
    Parts(Origins),
    /// Each cell's input and row, and each input's column -> output column.
    Cells(Vec<shuffle::Origin>, std::sync::Arc<Vec<std::sync::Arc<Vec<u32>>>>),
}

impl TileOrigin {
    /// The input, row and column map of the tile's cell `cell`.
    fn of(&self, cell: u64) -> (usize, u64, &[u32]) {
        match self {
            TileOrigin::Parts(runs) => {
                let (input, first_row, first_cell, remap) =
                    runs.iter().rev().find(|o| o.2 <= cell).expect("every cell comes from a part");
                (*input, first_row + (cell - first_cell), remap)
            }
            TileOrigin::Cells(origins, remaps) => {
                let o = origins[cell as usize];
                (o.input as usize, o.row, &remaps[o.input as usize])
            }
        }
    }
}

/// Where each run of a tile's cells came from: (input, first row, first cell
/// in the tile, the input's column -> output column).
type Origins = Vec<(usize, u64, u64, std::sync::Arc<Vec<u32>>)>;

/// Checks and remaps a tile's parts into `block` (empty), with their obs
/// rows and the nonzeros of genes left out.
#[allow(clippy::type_complexity)]
fn assemble(
    parts: Vec<Part>,
    mut block: CsrMatrix,
) -> Result<(CsrMatrix, Origins, Option<arrow_array::RecordBatch>, Cleaned), TileFailure> {
    let n_genes = block.n_cols;
    let mut origin: Origins = Vec::with_capacity(parts.len());
    let obs_parts: Vec<arrow_array::RecordBatch> = parts.iter().filter_map(|p| p.obs.clone()).collect();
    let obs = match obs_parts.first() {
        Some(first) => Some(
            arrow_select::concat::concat_batches(&first.schema(), &obs_parts)
                .map_err(|e| TileFailure::Other(e.into()))?,
        ),
        None => None,
    };
    drop(obs_parts);
    // Each part is checked and remapped on its own, in parallel (a tile holds
    // several parts of at most READ_ROWS rows), then appended in order; the
    // first part in order that fails names the value.
    use rayon::prelude::*;
    let counted: Vec<_> = parts
        .into_par_iter()
        .map(|part| {
            let result = to_counts(&part.rows, n_genes, Some(&part.remap));
            (part.input, part.first_row, part.remap, result)
        })
        .collect();
    let mut dropped = Cleaned::default();
    let nnz: usize = counted.iter().map(|c| c.3.as_ref().map_or(0, |(m, _)| m.nnz())).sum();
    block.indices.reserve(nnz);
    block.data.reserve(nnz);
    for (input, first_row, remap, result) in counted {
        origin.push((input, first_row, block.n_rows() as u64, remap));
        let (counts, part_dropped) = result.map_err(|bad| TileFailure::BadValue {
            input,
            row: first_row + bad.row,
            gene: bad.gene,
            problem: bad.problem,
        })?;
        dropped += part_dropped;
        block.append(&counts);
    }
    Ok((block, origin, obs, dropped))
}

/// The error for a value that is not a count: file, matrix, cell (row and obs
/// name), gene (index and name), the value, and a hint when another matrix of
/// the file holds counts.
pub(crate) fn describe_bad_value(source: &dyn InputSource, row: u64, bad: &BadValue) -> InputError {
    let name_of = |table: Option<Box<dyn inputs::Table + '_>>, at: u64| {
        table
            .and_then(|t| t.index(Some(at as usize..at as usize + 1)).ok())
            .and_then(|names| names.into_iter().next())
            .map(|n| format!(" ({n})"))
            .unwrap_or_default()
    };
    let obs_name = name_of(source.obs().ok().flatten(), row);
    let var_name = name_of(source.var().ok(), bad.gene);
    InputError::BadCount(Box::new(BadCount {
        path: source.path().to_path_buf(),
        matrix: source.matrix_name().to_string(),
        row,
        obs_name,
        gene: bad.gene,
        var_name,
        problem: bad.problem.clone(),
        counts_in: source.counts_elsewhere(),
    }))
}
