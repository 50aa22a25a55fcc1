//! Converting .h5ad files into a dataset, in three steps that may run in one
//! process ([`convert`]) or as separate jobs on many machines ([`plan()`]):
//! plan (scan the inputs, choose the gene order and obs schema, fix the tile
//! layout, write the gene and obs tables), shards (each encodes a contiguous
//! range of tiles and their obs shards), and finalize (check every shard's
//! result and write the manifest last).
//!
//! Reading HDF5 stays on the calling thread (HDF5 serializes every call). Each
//! full tile is handed to the rayon pool, which checks its values, maps its genes
//! to the output order and encodes it (its chunks in parallel too). A single
//! writer thread writes finished tiles in order. At most `max_in_flight` tiles
//! exist between reading and writing, so memory does not grow with the input.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::{Map, Value};

use crate::format::{self, CsrMatrix, TileEncoder};
use crate::h5ad::{to_counts, BadCount, BadValue, H5adError, H5adFile, MatrixReader, RawRows};
use crate::obs::shard::{ShardRecord, ShardWriter};
use crate::storage::Storage;
use crate::writer::{DatasetWriter, WriteOptions};
use obs_merge::ObsPlan;

pub mod genes;
pub mod obs_merge;
pub mod plan;
pub mod var_table;

pub use genes::GeneSet;
pub use obs_merge::ObsOptions;
pub use plan::{finalize, plan, run_shard, Plan, ShardResult};

/// Tiles read but not yet written, by default. Each tile's chunks already use
/// every core; one tile encoding while the next is read keeps memory at two
/// tiles whatever the input size.
pub const MAX_IN_FLIGHT: usize = 1;

/// What to convert and how.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// `X`, `raw/X` or `layers/NAME`.
    pub matrix: String,
    pub write: WriteOptions,
    /// How many inputs are sampled for the gene order (decisions.md 12); 0
    /// keeps the source order.
    pub gene_order_files: usize,
    /// Which genes are stored when the inputs' genes differ.
    pub genes: GeneSet,
    /// Write var.parquet.
    pub write_var: bool,
    /// What to store of obs; None for no obs.
    pub obs: Option<ObsOptions>,
    /// Replace an existing dataset in the output.
    pub overwrite: bool,
    /// Added to the manifest's metadata, after what convert records itself.
    pub metadata: Map<String, Value>,
    /// Tiles read but not yet written, at most.
    pub max_in_flight: usize,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            matrix: "X".into(),
            write: WriteOptions::default(),
            gene_order_files: 10,
            genes: GeneSet::Same,
            write_var: true,
            obs: Some(ObsOptions::default()),
            overwrite: false,
            metadata: Map::new(),
            max_in_flight: MAX_IN_FLIGHT,
        }
    }
}

/// Progress of a conversion, for a progress bar.
pub trait ConvertProgress: Sync {
    /// Something the user should know that is not an error (inputs aligned by
    /// gene name, for example).
    fn note(&self, _message: &str) {}
    /// A new phase begins ("scanning", "gene order", "converting").
    fn phase(&self, _name: &str, _total_cells: u64) {}
    /// Reading moved to another input file.
    fn file(&self, _path: &Path) {}
    /// `cells` more cells were processed in the current phase.
    fn advance(&self, _cells: u64) {}
    /// Tile `index` (of `cells` cells and `nnz` nonzeros) was written.
    fn tile_done(&self, _index: usize, _cells: u64, _nnz: u64) {}
}

/// No progress reporting.
pub struct NoProgress;

impl ConvertProgress for NoProgress {}

/// What a finished conversion produced.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ConvertSummary {
    pub n_cells: u64,
    pub n_genes: u64,
    pub n_tiles: usize,
    pub nnz: u64,
    pub tile_bytes: u64,
    pub bytes_per_nonzero: f64,
    /// Nonzeros of genes left out (`--genes intersection`).
    pub dropped_nonzeros: u64,
    pub seconds: f64,
}

/// One input, as scanned.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Input {
    pub path: PathBuf,
    pub n_rows: u64,
    /// The file's size when it was scanned: a shard refuses a file that changed.
    pub bytes: u64,
}

/// Cells of one input that belong to one tile.
struct Part {
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
    Other(anyhow::Error),
}

struct EncodedTile {
    blob: Vec<u8>,
    cells: u64,
    nnz: u64,
    /// Nonzeros of genes the dataset does not store.
    dropped: u64,
    obs: Option<arrow_array::RecordBatch>,
}

/// Removes an existing dataset from `out` (manifest first, so that it is never
/// complete-looking while half-removed), or refuses a non-empty output.
pub(crate) fn prepare_output(out: &dyn Storage, overwrite: bool) -> anyhow::Result<()> {
    let keys = out.list("").with_context(|| format!("cannot list the output {}", out.location("")))?;
    if keys.is_empty() {
        return Ok(());
    }
    if !overwrite {
        if keys.iter().any(|k| k == plan::PLAN_KEY) && !keys.iter().any(|k| k == format::MANIFEST_KEY) {
            return Err(crate::dataset::DatasetError::Unfinished { location: out.location("") }.into());
        }
        bail!("{} is not empty; use --overwrite to replace the dataset in it", out.location(""));
    }
    out.delete(format::MANIFEST_KEY)?;
    for key in keys.iter().filter(|k| is_dataset_key(k)) {
        out.delete(key)?;
    }
    Ok(())
}

/// The sampled inputs of decisions.md 12: k = min(want, n) of them, spread
/// evenly, the first and the last included.
pub fn sampled_inputs(n: usize, want: usize) -> Vec<usize> {
    let k = want.min(n);
    match k {
        0 => Vec::new(),
        1 => vec![0],
        _ => {
            let mut picked: Vec<usize> =
                (0..k).map(|i| ((i * (n - 1)) as f64 / (k - 1) as f64).round() as usize).collect();
            picked.dedup();
            picked
        }
    }
}

/// Gene order by decreasing total counts; ties keep the source order.
pub fn gene_order_from_totals(totals: &[u64]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..totals.len() as u32).collect();
    order.sort_by_key(|&g| std::cmp::Reverse(totals[g as usize]));
    order
}

/// Rows read from HDF5 at a time while computing totals.
const SCAN_ROWS: u64 = 10_000;

/// Rows read from HDF5 at a time while converting: a tile is gathered from
/// blocks of at most this many rows, so that progress moves (and a change of
/// input shows) within a tile, not a whole tile at a time.
const READ_ROWS: u64 = 2_048;

/// Converts `inputs` into a dataset in `out`: plan, one shard of every tile,
/// finalize, in this process.
pub fn convert(
    inputs: &[PathBuf],
    out: &dyn Storage,
    options: &ConvertOptions,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<ConvertSummary> {
    let started = Instant::now();
    plan::plan(inputs, out, options, progress)?;
    let done = plan::run_shard(out, 0, 1, options.max_in_flight, progress).and_then(|_| plan::finalize(out));
    match done {
        Ok(mut summary) => {
            summary.seconds = started.elapsed().as_secs_f64();
            Ok(summary)
        }
        Err(e) => {
            // The output held no dataset when the plan was written: leave it
            // as empty as it was, rather than a plan that would fail again.
            if let Ok(keys) = out.list("") {
                for key in keys.iter().filter(|k| is_dataset_key(k)) {
                    let _ = out.delete(key);
                }
            }
            Err(e)
        }
    }
}

/// Whether `key` is one convert writes.
fn is_dataset_key(key: &str) -> bool {
    key.starts_with("tiles/")
        || key.starts_with("obs/")
        || key.starts_with(".plan/")
        || key.contains(".deltacells-")
        || [format::MANIFEST_KEY, format::GENE_ORDER_KEY, format::VAR_NAMES_KEY, format::VAR_TABLE_KEY].contains(&key)
}

/// The gene names of `file` that go with its matrix `m`, checked to be one per column.
pub(crate) fn input_genes(file: &H5adFile, matrix: &str, m: &MatrixReader<'_>) -> Result<Vec<String>, H5adError> {
    let var_group = file.var_group_for(matrix);
    let names = file.dataframe_index(var_group)?;
    if names.len() as u64 != m.n_cols() {
        return Err(
            file.invalid(var_group, format!("has {} genes but {matrix} has {} columns", names.len(), m.n_cols()))
        );
    }
    Ok(names)
}

/// Checks that the tables that go with matrix `m` have its shape: obs (index
/// and every column) one row per cell, the var table one row per gene.
fn check_table_rows(file: &H5adFile, matrix: &str, m: &MatrixReader<'_>) -> Result<(), H5adError> {
    if file.exists("obs") {
        crate::h5ad::frame::check_rows(file, "obs", m.n_rows(), "cells")?;
    }
    crate::h5ad::frame::check_rows(file, file.var_group_for(matrix), m.n_cols(), "genes")
}

/// Opens every input: the matrix's shape, and its genes, from which the source
/// genes are chosen as `genes` says.
pub(crate) fn scan_inputs(
    inputs: &[PathBuf],
    matrix: &str,
    genes: GeneSet,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<(Vec<Input>, Vec<String>)> {
    progress.phase("scanning", 0);
    let mut scanned = Vec::with_capacity(inputs.len());
    let mut source: Option<genes::SourceGenes> = None;
    for path in inputs {
        progress.file(path);
        let file = H5adFile::open(path)?;
        let m = file.matrix(matrix)?;
        let names = input_genes(&file, matrix, &m)?;
        check_table_rows(&file, matrix, &m)?;
        match &mut source {
            None => source = Some(genes::SourceGenes::new(genes, path, names)),
            Some(s) => s.add(path, &names)?,
        }
        let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        scanned.push(Input { path: path.clone(), n_rows: m.n_rows(), bytes });
    }
    let source = source.expect("at least one input");
    match source.aligned.as_slice() {
        [] => {}
        [one] => progress.note(&format!(
            "{one} has the same genes as {} in another order; its columns are aligned by gene name",
            inputs[0].display()
        )),
        many => progress.note(&format!(
            "{} inputs have the same genes as {} in another order; their columns are aligned by gene name: {}{}",
            many.len(),
            inputs[0].display(),
            many[..many.len().min(5)].join(", "),
            if many.len() > 5 { ", ..." } else { "" }
        )),
    }
    Ok((scanned, source.finish()))
}

/// `file`'s column -> output column, given the source genes and `remap`
/// (source gene -> output column).
fn input_remap(
    file: &H5adFile,
    matrix: &str,
    m: &MatrixReader<'_>,
    source_genes: &[String],
    remap: &[u32],
) -> anyhow::Result<Option<Vec<u32>>> {
    let names = input_genes(file, matrix, m)?;
    let map = genes::column_map(file.path(), &names, source_genes)?;
    Ok(map.map(|map| map.iter().map(|&g| if g == genes::DROPPED { g } else { remap[g as usize] }).collect()))
}

/// Total counts per gene over the sampled inputs.
pub(crate) fn gene_totals(
    scanned: &[Input],
    sampled: &[usize],
    matrix: &str,
    source_genes: &[String],
    progress: &dyn ConvertProgress,
) -> anyhow::Result<Vec<u64>> {
    let n_genes = source_genes.len() as u32;
    let identity: Vec<u32> = (0..n_genes).collect();
    let mut totals = vec![0u64; n_genes as usize];
    progress.phase("gene order", sampled.iter().map(|&i| scanned[i].n_rows).sum());
    for &i in sampled {
        let input = &scanned[i];
        progress.file(&input.path);
        let file = H5adFile::open(&input.path)?;
        let mut m = file.matrix(matrix)?;
        let map = input_remap(&file, matrix, &m, source_genes, &identity)?;
        // Reading (HDF5, this thread) overlaps checking and summing the block
        // read before (the rayon pool).
        let mut pending: Option<(u64, RawRows)> = None;
        let mut start = 0;
        loop {
            let end = (start + SCAN_ROWS).min(input.n_rows);
            let (next, counted) = rayon::join(
                || if start < input.n_rows { m.read_rows(start..end).map(Some) } else { Ok(None) },
                || {
                    pending.take().map(|(first, raw)| {
                        (first, raw.indptr.len() as u64 - 1, block_totals(&raw, n_genes, map.as_deref()))
                    })
                },
            );
            if let Some((first, rows, result)) = counted {
                let block = result.map_err(|bad| describe_bad_value(&file, matrix, first + bad.row, &bad))?;
                for (t, b) in totals.iter_mut().zip(&block) {
                    *t += b;
                }
                progress.advance(rows);
            }
            match next? {
                Some(raw) => pending = Some((start, raw)),
                None => break,
            }
            start = end;
        }
    }
    Ok(totals)
}

/// Checks one block's values as counts and sums them per gene.
fn block_totals(raw: &RawRows, n_genes: u32, map: Option<&[u32]>) -> Result<Vec<u64>, BadValue> {
    let (counts, _) = to_counts(raw, n_genes, map)?;
    let mut totals = vec![0u64; n_genes as usize];
    for (&g, &c) in counts.indices.iter().zip(&counts.data) {
        totals[g as usize] += u64::from(c);
    }
    Ok(totals)
}

/// The tiles one run writes, and how.
pub(crate) struct TileJob<'a> {
    pub inputs: &'a [Input],
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
}

/// What [`write_tiles`] wrote besides the tiles.
pub(crate) struct TilesWritten {
    /// The obs shards' records, when there is obs.
    pub obs_shards: Option<Vec<ShardRecord>>,
    /// Nonzeros of genes the dataset does not store.
    pub dropped_nonzeros: u64,
}

/// Streams the cells of tiles `job.tiles` (from the inputs that hold them) into
/// tiles, encodes them in parallel and writes them in order, with their obs
/// shards.
pub(crate) fn write_tiles(
    job: &TileJob<'_>,
    writer: &mut DatasetWriter<'_>,
    progress: &dyn ConvertProgress,
) -> anyhow::Result<TilesWritten> {
    let TileJob { inputs, matrix, source_genes, remap, obs_plan, .. } = *job;
    let shared_remap = std::sync::Arc::new(remap.to_vec());
    let tile_size = job.write.tile_size;
    let n_genes = remap.len() as u32;
    let encoder = TileEncoder::new(job.write.n_chunks, job.write.zstd_level);
    let in_flight = job.max_in_flight.max(1);
    let n_cells: u64 = inputs.iter().map(|i| i.n_rows).sum();
    let cells = (job.tiles.start as u64 * tile_size).min(n_cells)..(job.tiles.end as u64 * tile_size).min(n_cells);
    progress.phase("converting", cells.end - cells.start);

    // A token is taken before a tile is handed out and returned once it is
    // written (or dropped after a failure): a counting semaphore on channels.
    let (token_tx, token_rx) = mpsc::sync_channel::<()>(in_flight);
    for _ in 0..in_flight {
        token_tx.send(()).expect("the receiver is alive");
    }
    let (done_tx, done_rx) = mpsc::channel::<(usize, Result<EncodedTile, TileFailure>)>();
    let abort = AtomicBool::new(false);

    let (read_result, write_result) = std::thread::scope(|threads| {
        let abort = &abort;
        let per_file = job.obs_tiles_per_file.max(1);
        let mut shard_writer = obs_plan
            .map(|p| ShardWriter::starting_at(p.arrow_schema().clone(), per_file, job.tiles.start / per_file as usize));
        let writer_thread = threads.spawn(move || {
            // indices relative to the first tile of the job
            let mut pending: BTreeMap<usize, EncodedTile> = BTreeMap::new();
            let mut next = 0usize;
            let mut dropped_nonzeros = 0u64;
            let mut failure: Option<(usize, TileFailure)> = None;
            for (index, result) in done_rx {
                match result {
                    Ok(tile) if failure.is_none() => {
                        pending.insert(index, tile);
                    }
                    Ok(_) => {
                        let _ = token_tx.send(());
                    }
                    Err(e) => {
                        abort.store(true, Ordering::Relaxed);
                        // Keep the failure of the earliest tile: the first bad cell in input order.
                        if failure.as_ref().is_none_or(|(i, _)| index < *i) {
                            failure = Some((index, e));
                        }
                        // Nothing more is written: return the tokens of the tiles
                        // held back and of this one, so the reader can stop.
                        for _ in 0..=std::mem::take(&mut pending).len() {
                            let _ = token_tx.send(());
                        }
                    }
                }
                while failure.is_none() {
                    let Some(tile) = pending.remove(&next) else { break };
                    let written = writer
                        .put_tile(job.tiles.start + next, tile.blob, tile.cells, tile.nnz)
                        .map_err(anyhow::Error::from)
                        .and_then(|()| match (&mut shard_writer, &tile.obs) {
                            (Some(shards), Some(batch)) => shards.add_tile(batch, writer.storage()),
                            _ => Ok(()),
                        });
                    if let Err(e) = written {
                        abort.store(true, Ordering::Relaxed);
                        failure = Some((next, TileFailure::Other(e)));
                        // As above: tiles held back will never be written.
                        for _ in 0..std::mem::take(&mut pending).len() {
                            let _ = token_tx.send(());
                        }
                    }
                    dropped_nonzeros += tile.dropped;
                    progress.tile_done(job.tiles.start + next, tile.cells, tile.nnz);
                    next += 1;
                    let _ = token_tx.send(());
                }
            }
            let obs_shards = match failure {
                Some((_, f)) => return Err(f),
                None => match shard_writer {
                    Some(shards) => Some(shards.finish(writer.storage()).map_err(TileFailure::Other)?),
                    None => None,
                },
            };
            Ok(TilesWritten { obs_shards, dropped_nonzeros })
        });

        let read_result = rayon::in_place_scope(|pool| -> anyhow::Result<()> {
            let mut parts: Vec<Part> = Vec::new();
            let mut cells_in_tile = 0u64;
            let mut tile_index = 0usize; // relative to job.tiles.start
            let dispatch = |parts: Vec<Part>, cells: u64, index: usize| {
                if token_rx.recv().is_err() {
                    return;
                }
                let done = done_tx.clone();
                let encoder = &encoder;
                pool.spawn(move |_| {
                    let result = encode_tile(parts, cells, n_genes, encoder);
                    let _ = done.send((index, result));
                });
            };
            // Only the inputs that hold the job's cells, and only those rows.
            let mut offset = 0u64;
            for (i, input) in inputs.iter().enumerate() {
                let here = offset..offset + input.n_rows;
                offset = here.end;
                let (start, end) = (here.start.max(cells.start), here.end.min(cells.end));
                if start >= end {
                    continue;
                }
                if abort.load(Ordering::Relaxed) {
                    break;
                }
                progress.file(&input.path);
                // (a file that cannot be read at all fails in open, below)
                if let Ok(now) = std::fs::metadata(&input.path).map(|m| m.len()) {
                    if now != input.bytes {
                        return Err(H5adError::Changed { path: input.path.clone(), was: input.bytes, now }.into());
                    }
                }
                let file = H5adFile::open(&input.path)?;
                let mut m = file.matrix(matrix)?;
                let input_remap = match input_remap(&file, matrix, &m, source_genes, remap)? {
                    Some(r) => std::sync::Arc::new(r),
                    None => shared_remap.clone(),
                };
                let input_obs = obs_plan.map(|p| p.for_input(&file)).transpose()?;
                let mut row = start - here.start;
                let last = end - here.start;
                while row < last && !abort.load(Ordering::Relaxed) {
                    let take = (tile_size - cells_in_tile).min(last - row).min(READ_ROWS);
                    let rows = m.read_rows(row..row + take)?;
                    let obs = match (obs_plan, &input_obs) {
                        (Some(p), Some(maps)) => Some(p.batch(maps, &file, row..row + take)?),
                        _ => None,
                    };
                    parts.push(Part { input: i, first_row: row, rows, remap: input_remap.clone(), obs });
                    progress.advance(take);
                    row += take;
                    cells_in_tile += take;
                    if cells_in_tile == tile_size {
                        dispatch(std::mem::take(&mut parts), cells_in_tile, tile_index);
                        tile_index += 1;
                        cells_in_tile = 0;
                    }
                }
            }
            if cells_in_tile > 0 && !abort.load(Ordering::Relaxed) {
                dispatch(std::mem::take(&mut parts), cells_in_tile, tile_index);
            }
            Ok(())
        });
        if read_result.is_err() {
            abort.store(true, Ordering::Relaxed);
        }
        drop(done_tx);
        let write_result = writer_thread.join().expect("the writer thread does not panic");
        (read_result, write_result)
    });
    read_result?;
    match write_result {
        Ok(shards) => Ok(shards),
        Err(TileFailure::Other(e)) => Err(e),
        Err(TileFailure::BadValue { input, row, gene, problem }) => {
            let path = &inputs[input].path;
            let file = H5adFile::open(path)?;
            let bad = BadValue { row, gene, problem };
            Err(describe_bad_value(&file, matrix, row, &bad).into())
        }
    }
}

/// Checks, remaps and encodes one tile's cells.
fn encode_tile(parts: Vec<Part>, cells: u64, n_genes: u32, encoder: &TileEncoder) -> Result<EncodedTile, TileFailure> {
    let mut block = CsrMatrix::empty(n_genes);
    // (input, first_row, first cell in tile, the input's remap)
    let mut origin: Vec<(usize, u64, u64, std::sync::Arc<Vec<u32>>)> = Vec::with_capacity(parts.len());
    let obs_parts: Vec<arrow_array::RecordBatch> = parts.iter().filter_map(|p| p.obs.clone()).collect();
    let obs = match obs_parts.first() {
        Some(first) => Some(
            arrow_select::concat::concat_batches(&first.schema(), &obs_parts)
                .map_err(|e| TileFailure::Other(anyhow::anyhow!("joining obs rows: {e}")))?,
        ),
        None => None,
    };
    drop(obs_parts);
    let mut dropped = 0u64;
    for part in parts {
        origin.push((part.input, part.first_row, block.n_rows() as u64, part.remap.clone()));
        let (counts, part_dropped) =
            to_counts(&part.rows, n_genes, Some(&part.remap)).map_err(|bad| TileFailure::BadValue {
                input: part.input,
                row: part.first_row + bad.row,
                gene: bad.gene,
                problem: bad.problem,
            })?;
        drop(part.rows);
        dropped += part_dropped;
        block.append(&counts);
    }
    debug_assert_eq!(block.n_rows() as u64, cells);
    let nnz = block.nnz() as u64;
    match encoder.encode(&block) {
        Ok(blob) => Ok(EncodedTile { blob, cells, nnz, dropped, obs }),
        Err(e) => match e.cell_and_gene() {
            Some((cell, gene)) => {
                let (input, first_row, first_cell, remap) =
                    origin.iter().rev().find(|o| o.2 <= cell).expect("every cell comes from a part");
                let source_gene = remap.iter().position(|&j| j == gene).unwrap_or(gene as usize) as u64;
                Err(TileFailure::BadValue {
                    input: *input,
                    row: first_row + (cell - first_cell),
                    gene: source_gene,
                    problem: e.problem(),
                })
            }
            None => Err(TileFailure::Other(e.into())),
        },
    }
}

/// The error for a value that is not a count: file, matrix, cell (row and obs
/// name), gene (index and name), the value, and a hint when another matrix of
/// the file holds counts.
fn describe_bad_value(file: &H5adFile, matrix: &str, row: u64, bad: &BadValue) -> H5adError {
    let obs_name = file
        .obs_names()
        .and_then(|names| names.get(row as usize).cloned())
        .map(|n| format!(" ({n})"))
        .unwrap_or_default();
    let gene_name =
        file.dataframe_index(file.var_group_for(matrix)).ok().and_then(|n| n.get(bad.gene as usize).cloned());
    let var_name = gene_name.map(|n| format!(" ({n})")).unwrap_or_default();
    let hint = counts_hint(file, matrix).map(|m| format!("; {m} holds counts: use --matrix {m}")).unwrap_or_default();
    H5adError::BadCount(Box::new(BadCount {
        path: file.path().to_path_buf(),
        matrix: matrix.to_string(),
        row,
        obs_name,
        gene: bad.gene,
        var_name,
        problem: bad.problem.clone(),
        hint,
    }))
}

/// Another matrix of the file whose first rows are whole non-negative numbers.
fn counts_hint(file: &H5adFile, matrix: &str) -> Option<String> {
    for other in file.matrix_names() {
        if other == matrix {
            continue;
        }
        let Ok(mut m) = file.matrix(&other) else { continue };
        let rows = m.n_rows().min(1000);
        if rows == 0 {
            continue;
        }
        if let Ok(raw) = m.read_rows(0..rows) {
            if to_counts(&raw, m.n_cols() as u32, None).is_ok() {
                return Some(other);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_spreads_evenly_with_first_and_last() {
        assert_eq!(sampled_inputs(1, 10), vec![0]);
        assert_eq!(sampled_inputs(3, 10), vec![0, 1, 2]);
        assert_eq!(sampled_inputs(100, 10), vec![0, 11, 22, 33, 44, 55, 66, 77, 88, 99]);
        assert_eq!(sampled_inputs(5, 2), vec![0, 4]);
        assert_eq!(sampled_inputs(5, 0), Vec::<usize>::new());
    }

    #[test]
    fn gene_order_is_decreasing_totals_stable_on_ties() {
        assert_eq!(gene_order_from_totals(&[5, 9, 5, 0, 9]), vec![1, 4, 0, 2, 3]);
    }
}
