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

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Instant;

use error::Result;
use serde_json::{Map, Value};

use crate::format::{self, CsrMatrix, TileEncoder};
use crate::inputs::{self, to_counts, BadCount, BadValue, Cleaned, InputError, InputSource, RawRows};
use crate::storage::Storage;
use crate::writer::{DatasetWriter, WriteOptions};
use obs_merge::ObsPlan;
use obs_shards::{ShardRecord, ShardWriter};

pub mod append;
mod base;
pub mod compact;
mod error;
mod finalize;
pub mod gene_order;
pub mod genes;
mod job;
pub mod obs_merge;
mod obs_shards;
mod plan;
mod shard;
pub mod shuffle;
mod staging;
mod totals;
mod var_table;

pub use append::{append, plan_append, resume, AppendOptions, AppendSummary, Planned};
pub use compact::{compact, CompactSummary};
pub use error::ConvertError;
pub use finalize::finalize;
pub use gene_order::{GeneOrderError, GivenOrder};
pub use genes::GeneSet;
pub use job::{AppendPlan, Plan, ShardResult};
pub use obs_merge::ObsOptions;
pub use obs_merge::{SOURCE_FILE, SOURCE_ROW};
pub use plan::plan;
pub use shard::{read_planned, run_shard};
pub use staging::AppendError;
pub use totals::{plan_totals_shard, TotalsSummary};

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
    /// A gene order to use instead of computing one (`gene_order_files` is
    /// then not used).
    pub gene_order: Option<GivenOrder>,
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
    /// Store the cells of all inputs in an order fixed by this seed, so that
    /// every tile is a random sample of the dataset (obs then records where
    /// each cell was read: [`obs_merge::SOURCE_FILE`], [`obs_merge::SOURCE_ROW`]).
    pub shuffle: Option<u64>,
    /// Where a shuffled conversion spills its cells between its two passes
    /// (default: the system's temporary folder).
    pub spill_dir: Option<PathBuf>,
    /// How inputs at URLs are reached.
    pub inputs: inputs::InputOptions,
}

/// How one process runs a shard of a plan (not part of the plan: any shard
/// may run with any of these, and writes the same bytes).
#[derive(Clone, Debug)]
pub struct ShardOptions {
    /// Tiles read but not yet written, at most.
    pub max_in_flight: usize,
    /// Where a shuffled plan's shard spills its cells (default: the system's
    /// temporary folder); it needs the shard's cells once, compressed.
    pub spill_dir: Option<PathBuf>,
    /// How inputs at URLs are reached.
    pub inputs: inputs::InputOptions,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions { max_in_flight: MAX_IN_FLIGHT, spill_dir: None, inputs: inputs::InputOptions::default() }
    }
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            matrix: "X".into(),
            write: WriteOptions::default(),
            gene_order_files: 10,
            gene_order: None,
            genes: GeneSet::Same,
            write_var: true,
            obs: Some(ObsOptions::default()),
            overwrite: false,
            metadata: Map::new(),
            max_in_flight: MAX_IN_FLIGHT,
            shuffle: None,
            spill_dir: None,
            inputs: inputs::InputOptions::default(),
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
    /// Entries of a cell and gene that repeated an earlier one (summed into it).
    pub summed_duplicates: u64,
    pub seconds: f64,
}

/// One input, as scanned.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Input {
    pub path: PathBuf,
    pub n_rows: u64,
    /// The file's size when it was scanned: a shard refuses a file that changed.
    pub bytes: u64,
    /// The entity tag of an object at a URL when it was scanned, if its
    /// store gives one: a shard refuses an object replaced by one of the
    /// same size, too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// Not a file: the cells of this tile of the dataset being appended to,
    /// read back (its last tile, which the append rewrites); `path` names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_tile: Option<usize>,
    /// [`genes::names_digest`] of the input's gene names, recorded by the
    /// scan: the tiles pass reads the gene table of an input again only when
    /// it differs from the source genes' (its columns are aligned by name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub genes_digest: Option<String>,
}

/// The cells of a dataset's last tile and their obs rows, decoded, as the
/// first input of an append.
pub(crate) struct StoredTail {
    pub rows: CsrMatrix,
    /// In the schema the append writes.
    pub obs: Option<arrow_array::RecordBatch>,
}

impl StoredTail {
    /// Rows `range` as an input would give them, with their obs rows.
    fn read(&self, range: std::ops::Range<u64>) -> (RawRows, Option<arrow_array::RecordBatch>) {
        let (lo, hi) = (self.rows.indptr[range.start as usize], self.rows.indptr[range.end as usize]);
        let rows = RawRows {
            indptr: self.rows.indptr[range.start as usize..=range.end as usize].iter().map(|p| p - lo).collect(),
            indices: self.rows.indices[lo as usize..hi as usize].to_vec(),
            values: self.rows.data[lo as usize..hi as usize].iter().map(|&c| f64::from(c)).collect(),
        };
        let obs = self.obs.as_ref().map(|b| b.slice(range.start as usize, (range.end - range.start) as usize));
        (rows, obs)
    }
}

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

struct EncodedTile {
    blob: Vec<u8>,
    cells: u64,
    nnz: u64,
    /// Nonzeros of genes the dataset does not store; duplicates summed.
    cleaned: Cleaned,
    obs: Option<arrow_array::RecordBatch>,
}

/// Removes an existing dataset from `out` (manifest first, so that it is never
/// complete-looking while half-removed), or refuses a non-empty output.
pub(crate) fn prepare_output(out: &dyn Storage, overwrite: bool) -> Result<()> {
    let keys = out.list("").map_err(|source| ConvertError::Reaching {
        what: format!("cannot list the output {}", out.location("")),
        source,
    })?;
    // Gene totals of `plan --totals-shard` are this plan's input, not a dataset.
    let keys: Vec<String> = keys.into_iter().filter(|k| !k.starts_with(totals::TOTALS_PREFIX)).collect();
    if keys.is_empty() {
        return Ok(());
    }
    if !overwrite {
        if keys.iter().any(|k| k == job::PLAN_KEY) && !keys.iter().any(|k| k == format::MANIFEST_KEY) {
            return Err(crate::dataset::DatasetError::Unfinished { location: out.location("") }.into());
        }
        return Err(ConvertError::NotEmpty { location: out.location("") });
    }
    // Not while an append or finalize changes it.
    let _lock = staging::lock(out)?;
    out.delete(format::MANIFEST_KEY)?;
    for key in keys.iter().filter(|k| is_dataset_key(k)) {
        out.delete(key)?;
    }
    Ok(())
}

/// The sampled inputs of decisions.md 12: k = min(want, n) of them, spread
/// evenly, the first and the last included.
pub(crate) fn sampled_inputs(n: usize, want: usize) -> Vec<usize> {
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

/// Gene order by decreasing total counts; ties keep the source order: entry
/// j is the column stored as column j (what gene_order.npy holds).
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

/// Opens `out` (a local folder, s3:// or gs://) as the output of a job that
/// writes a dataset (`doing`: "write to", "append to"), refusing what cannot
/// hold one: an HTTP server (read-only), a local file. Also returns how the
/// output is named in messages (a local folder as a path).
pub fn open_output(
    out: &str,
    options: &crate::storage::StoreOptions,
    doing: &str,
) -> Result<(String, std::sync::Arc<dyn Storage>)> {
    let name = match crate::storage::Location::parse(out)? {
        crate::storage::Location::Http { .. } => {
            return Err(error::ConvertError::invalid(
                out,
                format!("an HTTP server is read-only; {doing} a local folder, s3:// or gs://"),
            ))
        }
        crate::storage::Location::Local(path) if path.is_file() => {
            return Err(error::ConvertError::invalid(path.display().to_string(), "is a file, not a folder"))
        }
        crate::storage::Location::Local(path) => path.display().to_string(),
        _ => crate::redact::redact(out).into_owned(),
    };
    Ok((name, crate::storage::open_with(out, options)?))
}

/// Converts `inputs` into a dataset in `out`: plan, one shard of every tile,
/// finalize, in this process.
pub fn convert(
    inputs: &[PathBuf],
    out: &dyn Storage,
    options: &ConvertOptions,
    progress: &dyn ConvertProgress,
) -> Result<ConvertSummary> {
    let started = Instant::now();
    plan::plan_then(inputs, out, options, plan::Then::Tiles, progress)?;
    let shard = ShardOptions {
        max_in_flight: options.max_in_flight,
        spill_dir: options.spill_dir.clone(),
        inputs: options.inputs.clone(),
    };
    let done = shard::run_shard(out, 0, 1, &shard, progress).and_then(|_| finalize::finalize(out));
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
        || key.starts_with(".append/")
        || key.contains(".deltacells-")
        || [format::MANIFEST_KEY, format::GENE_ORDER_KEY, format::VAR_NAMES_KEY, format::VAR_TABLE_KEY].contains(&key)
}

/// Opens every input: the matrix's shape, its tables' lengths, and its genes,
/// from which the source genes are chosen as `genes` says. The inputs
/// `read_whole` (indices) are going to be read whole next: those at URLs
/// start being fetched as soon as each is scanned.
pub(crate) fn scan_inputs(
    inputs: &[PathBuf],
    matrix: &str,
    genes: GeneSet,
    read_whole: &[usize],
    reach: &inputs::InputOptions,
    progress: &dyn ConvertProgress,
) -> Result<(Vec<Input>, Vec<String>)> {
    progress.phase("scanning", 0);
    let urls: Vec<&str> =
        inputs.iter().filter(|p| crate::inputs::remote::is_url(p)).filter_map(|p| p.to_str()).collect();
    if !urls.is_empty() {
        crate::inputs::remote::open_ahead(&urls, &reach.remote);
    }
    let mut scanned = Vec::with_capacity(inputs.len());
    let mut source_genes: Option<genes::SourceGenes> = None;
    for (i, path) in inputs.iter().enumerate() {
        progress.file(path);
        let source = inputs::open(path, matrix, reach)?;
        if read_whole.contains(&i) {
            source.will_read_whole();
        }
        let names = source.gene_names()?;
        let genes_digest = Some(genes::names_digest(&names));
        // One row per cell in obs, one per gene in var, as anndata requires.
        if let Some(obs) = source.obs()? {
            obs.check_rows(source.n_rows(), "cells")?;
        }
        source.var()?.check_rows(source.n_cols(), "genes")?;
        match &mut source_genes {
            None => source_genes = Some(genes::SourceGenes::new(genes, path, names)),
            Some(s) => s.add(path, &names)?,
        }
        let version = inputs::input_version(path, reach);
        scanned.push(Input {
            path: path.clone(),
            n_rows: source.n_rows(),
            bytes: version.as_ref().map_or(0, |v| v.size),
            etag: version.and_then(|v| v.etag),
            stored_tile: None,
            genes_digest,
        });
    }
    let source_genes = source_genes.expect("at least one input");
    match source_genes.aligned.as_slice() {
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
    Ok((scanned, source_genes.finish()))
}

/// An input's column -> source gene, given the source genes and their
/// [`genes::names_digest`]; None when they are the same by position, known
/// without reading the input's genes again when the scan found them so.
fn input_columns(
    input: &Input,
    source: &dyn InputSource,
    (source_genes, source_digest): (&[String], &str),
) -> Result<Option<Vec<u32>>> {
    if input.genes_digest.as_deref() == Some(source_digest) {
        return Ok(None);
    }
    Ok(genes::column_map(source.path(), &source.gene_names()?, source_genes)?)
}

/// An input's column -> output column, given the source genes (and their
/// digest) and `remap` (source gene -> output column); None when that is
/// `remap` itself.
fn input_remap(
    input: &Input,
    source: &dyn InputSource,
    source_genes: (&[String], &str),
    remap: &[u32],
) -> Result<Option<Vec<u32>>> {
    let map = input_columns(input, source, source_genes)?;
    Ok(map.map(|map| map.iter().map(|&g| if g == genes::DROPPED { g } else { remap[g as usize] }).collect()))
}

/// Total counts per gene over the sampled inputs.
pub(crate) fn gene_totals(
    scanned: &[Input],
    sampled: &[usize],
    matrix: &str,
    source_genes: &[String],
    reach: &inputs::InputOptions,
    progress: &dyn ConvertProgress,
) -> Result<Vec<u64>> {
    let n_genes = source_genes.len() as u32;
    let source_digest = genes::names_digest(source_genes);
    let mut totals = vec![0u64; n_genes as usize];
    progress.phase("gene order", sampled.iter().map(|&i| scanned[i].n_rows).sum());
    for &i in sampled {
        let input = &scanned[i];
        progress.file(&input.path);
        let source = inputs::open(&input.path, matrix, reach)?;
        source.will_read_whole();
        // The input's column -> source gene (None: the same by position).
        let map = input_columns(input, source.as_ref(), (source_genes, &source_digest))?;
        // Reading (this thread) overlaps checking and summing the block read
        // before (the rayon pool).
        let mut pending: Option<(u64, RawRows)> = None;
        let mut start = 0;
        loop {
            let end = (start + SCAN_ROWS).min(input.n_rows);
            let (next, counted) = rayon::join(
                || if start < input.n_rows { source.read_rows(start..end).map(Some) } else { Ok(None) },
                || {
                    pending.take().map(|(first, raw)| {
                        (first, raw.indptr.len() as u64 - 1, block_totals(&raw, n_genes, map.as_deref()))
                    })
                },
            );
            if let Some((first, rows, result)) = counted {
                let block = result.map_err(|bad| describe_bad_value(source.as_ref(), first + bad.row, &bad))?;
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
    /// The dataset's cell that is the first input's first row (an append's
    /// inputs come after the cells it keeps).
    pub first_cell: u64,
    /// The cells of the input that is a stored tile (an append's).
    pub tail: Option<&'a StoredTail>,
    /// The obs rows of the tiles before `tiles.start` in its obs shard (an
    /// append's, whose first tile may not start a shard), one batch per tile.
    pub obs_prefix: &'a [arrow_array::RecordBatch],
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
            if let Some(shards) = &mut shard_writer {
                for batch in job.obs_prefix {
                    shards.add_tile(batch, writer.storage()).map_err(|e| (0, TileFailure::Other(e)))?;
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
                let encoder = &encoder;
                pool.spawn(move |_| {
                    let _ = done.send(encode_tile(cells, n_genes, encoder));
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

/// Checks, remaps and encodes one tile's cells.
fn encode_tile(cells: TileCells, n_genes: u32, encoder: &TileEncoder) -> Result<EncodedTile, TileFailure> {
    // Where each cell came from is looked up only when encoding fails.
    let (block, origin, obs, dropped) = match cells {
        TileCells::Parts { parts, cells } => {
            let (block, origin, obs, dropped) = assemble(parts, n_genes)?;
            debug_assert_eq!(block.n_rows() as u64, cells);
            (block, TileOrigin::Parts(origin), obs, dropped)
        }
        TileCells::Counts { counts, origins, obs, remaps } => {
            (counts, TileOrigin::Cells(origins, remaps), obs, Cleaned::default())
        }
    };
    let cells = block.n_rows() as u64;
    let nnz = block.nnz() as u64;
    match encoder.encode(&block) {
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

/// Checks and remaps a tile's parts into one block of counts, with their obs
/// rows and the nonzeros of genes left out.
#[allow(clippy::type_complexity)]
fn assemble(
    parts: Vec<Part>,
    n_genes: u32,
) -> Result<(CsrMatrix, Origins, Option<arrow_array::RecordBatch>, Cleaned), TileFailure> {
    let mut block = CsrMatrix::empty(n_genes);
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
fn describe_bad_value(source: &dyn InputSource, row: u64, bad: &BadValue) -> InputError {
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
