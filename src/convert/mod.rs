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

use std::path::PathBuf;
use std::time::Instant;

use error::Result;

use crate::format::{self, CsrMatrix};
use crate::inputs::{self, count_of, BadValue, InputSource, RawRows, DROPPED_COLUMN};
use crate::storage::Storage;

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
mod options;
mod plan;
mod shard;
pub mod shuffle;
mod staging;
mod tiles;
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
pub use options::{ConvertOptions, ConvertProgress, ConvertSummary, NoProgress, ShardOptions, MAX_IN_FLIGHT};
pub use plan::plan;
pub use shard::{read_planned, run_shard};
pub use staging::AppendError;
pub(crate) use tiles::{
    describe_bad_value, input_obs_table, open_unchanged, source_code, write_tiles, Dispatch, TileCells, TileJob,
};
pub use totals::{plan_totals_shard, TotalsSummary};

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
            values: self.rows.data[lo as usize..hi as usize].to_vec().into(),
        };
        let obs = self.obs.as_ref().map(|b| b.slice(range.start as usize, (range.end - range.start) as usize));
        (rows, obs)
    }
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
pub(crate) fn input_remap(
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

/// Checks one block's values as counts and sums them per gene (`map`: the
/// input's column -> gene, when not the same). Duplicate entries are added
/// as they come: a sum of them above the largest count is refused by the
/// tiles, which read every input.
fn block_totals(raw: &RawRows, n_genes: u32, map: Option<&[u32]>) -> Result<Vec<u64>, BadValue> {
    crate::inputs::with_values!(&raw.values, values => totals_of(raw, values, n_genes, map))
}

/// [`block_totals`] for values of one stored type.
fn totals_of<T: crate::inputs::Value>(
    raw: &RawRows,
    values: &[T],
    n_genes: u32,
    map: Option<&[u32]>,
) -> Result<Vec<u64>, BadValue> {
    let mut totals = vec![0u64; n_genes as usize];
    for (r, w) in raw.indptr.windows(2).enumerate() {
        let (first, end) = (w[0] as usize, w[1] as usize);
        for (&source, &v) in raw.indices[first..end].iter().zip(&values[first..end]) {
            let v = v.to_f64();
            let count = count_of(v).ok_or_else(|| BadValue::not_a_count(r as u64, source, v))?;
            let gene = map.map_or(source, |m| m[source as usize]);
            if count > 0 && gene != DROPPED_COLUMN {
                totals[gene as usize] += u64::from(count);
            }
        }
    }
    Ok(totals)
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
