//! One shard of a plan: a contiguous range of tiles (whole obs shards),
//! encoded from the inputs that hold its cells, with its obs shards, and a
//! result record under `.plan/results/` written last. A shard run twice writes
//! the same bytes again and touches no other shard's objects.

use super::error::{ConvertError, Result};
use bytes::Bytes;

use super::base::{check_base, kept_rows};
use super::job::{read_plan, result_key, Plan, ShardResult, RESULT_FORMAT};
use super::obs_merge::ObsPlan;
use super::staging::Workspace;
use super::{write_tiles, ConvertProgress, ShardOptions, TileJob};
use crate::format::{self, npy};
use crate::storage::Storage;
use crate::writer::DatasetWriter;

/// The plan in `out`: of a conversion into it, or of an append to the
/// dataset in it (`plan --append`).
pub fn read_planned(out: &dyn Storage) -> Result<Plan> {
    read_plan(Workspace::resolve(out)?.out())
}

/// Step 2: encodes shard `k` of `n` (0-based): its tiles, its obs shards, and
/// its result record, last. `out` is the output of [`super::plan()`], or a dataset
/// that `plan --append` planned an append to.
pub fn run_shard(
    out: &dyn Storage,
    k: usize,
    n: usize,
    options: &ShardOptions,
    progress: &dyn ConvertProgress,
) -> Result<ShardResult> {
    if n == 0 || k >= n {
        return Err(ConvertError::Argument(format!(
            "shard {k}/{n}: the index must be below the number of shards (0-based: 0..{n})"
        )));
    }
    let workspace = Workspace::resolve(out)?;
    shard_in(workspace.out(), workspace.base(), k, n, options, progress)
}

/// Shard `k` of `n` of the plan in `out`, reading the gene tables (and what
/// an append keeps) from `base`: `out` itself, or the dataset whose append
/// `out` stages.
pub(crate) fn shard_in(
    out: &dyn Storage,
    base: &dyn Storage,
    k: usize,
    n: usize,
    options: &ShardOptions,
    progress: &dyn ConvertProgress,
) -> Result<ShardResult> {
    let plan = read_plan(out)?;
    let tiles = plan.shard_tiles(k, n);

    let order_location = base.location(format::GENE_ORDER_KEY);
    let order = match base.get(format::GENE_ORDER_KEY)? {
        Some(bytes) => npy::read_i32(&bytes).map_err(|e| ConvertError::invalid(&order_location, e))?,
        // An append to a dataset stored in source order.
        None if plan.append.is_some() => (0..plan.n_genes as i32).collect(),
        None => return Err(ConvertError::invalid(order_location, "missing")),
    };
    npy::check_permutation(&order, plan.n_genes).map_err(|e| ConvertError::invalid(&order_location, e))?;
    let mut remap = vec![0u32; order.len()];
    for (j, &g) in order.iter().enumerate() {
        remap[g as usize] = j as u32;
    }
    // The genes in source order, to map each input's columns by name.
    let names_location = base.location(format::VAR_NAMES_KEY);
    let names_bytes =
        base.get(format::VAR_NAMES_KEY)?.ok_or_else(|| ConvertError::invalid(&names_location, "missing"))?;
    let mut stored_names = crate::dataset::parse_var_names(&names_bytes, plan.n_genes)
        .map_err(|e| ConvertError::Unreadable { location: names_location, source: Box::new(e) })?;
    let mut source_genes = vec![String::new(); order.len()];
    for (j, &g) in order.iter().enumerate() {
        source_genes[g as usize] = std::mem::take(&mut stored_names[j]);
    }

    let obs_plan = match &plan.obs {
        None => None,
        Some(o) => {
            let schema = crate::obs::read_schema(out)?.schema;
            let location = out.location(format::OBS_SCHEMA_KEY);
            Some(ObsPlan::from_schema(schema, o.names, o.source).map_err(|e| ConvertError::invalid(location, e))?)
        }
    };

    // An append's first shard starts with what it keeps of the dataset's
    // last tile and obs shard.
    let (tail, obs_prefix) = match &plan.append {
        Some(a) if !tiles.is_empty() && tiles.start == a.first_tile => kept_rows(base, &plan, obs_plan.as_ref())?,
        Some(a) => {
            check_base(base, a)?;
            (None, None)
        }
        None => (None, None),
    };
    let mut writer = DatasetWriter::starting_at(out, plan.write_options(), plan.n_genes as u32, tiles.start);
    // (the inputs are read as the plan read them)
    let reach = crate::inputs::InputOptions { reading: plan.reading.clone(), ..options.inputs.clone() };
    let job = TileJob {
        inputs: &plan.inputs,
        first_cell: plan.first_cell(),
        tail: tail.as_ref(),
        obs_prefix: obs_prefix.as_ref(),
        matrix: &plan.matrix,
        tiles: tiles.clone(),
        source_genes: &source_genes,
        remap: &remap,
        obs_plan: obs_plan.as_ref(),
        obs_tiles_per_file: plan.tiles_per_unit() as u64,
        write: plan.write_options(),
        max_in_flight: options.max_in_flight,
        shuffle: plan.shuffle,
        spill_dir: options.spill_dir.as_deref(),
        reach: &reach,
    };
    #[cfg(feature = "fault-injection")]
    let stall = StallOnce { inner: progress, label: format!("{k}/{n}") };
    #[cfg(feature = "fault-injection")]
    let progress: &dyn ConvertProgress = &stall;
    let written = if tiles.is_empty() { None } else { Some(write_tiles(&job, &mut writer, progress)?) };
    let cleaned = written.as_ref().map(|w| w.cleaned).unwrap_or_default();
    let shards = written.and_then(|w| w.obs_shards).unwrap_or_default();
    let result = ShardResult {
        format: RESULT_FORMAT.into(),
        plan: plan.id.clone(),
        shard: k,
        shards: n,
        first_tile: tiles.start,
        tile_cells: writer.tiles().iter().map(|t| t.cells).collect(),
        tile_nnz: writer.tiles().iter().map(|t| t.nnz).collect(),
        tile_bytes: writer.tiles().iter().map(|t| t.bytes).collect(),
        tile_sha256: writer.tile_sha256().to_vec(),
        first_obs_shard: plan.obs_shards_of(&tiles).start,
        obs_shard_bytes: shards.iter().map(|s| s.bytes).collect(),
        obs_shard_sha256: shards.iter().map(|s| s.sha256.clone()).collect(),
        dropped_nonzeros: cleaned.dropped,
        summed_duplicates: cleaned.summed,
    };
    let mut text = serde_json::to_vec_pretty(&result)?;
    text.push(b'\n');
    out.put(&result_key(k, n), Bytes::from(text))?;
    Ok(result)
}

/// The tests of a shard killed by a cluster mid-run (a Slurm job requeued)
/// need a shard that is certainly mid-run: with $DELTACELLS_TEST_STALL_SHARD
/// naming a file that does not exist yet, the first shard to write a tile
/// creates that file (holding `K/N`) and then waits until it is killed, with
/// a tile written and its result not. Every other run, the killed shard's
/// rerun among them, finds the file and goes on. Only in builds with the
/// test-only feature `fault-injection`.
#[cfg(feature = "fault-injection")]
struct StallOnce<'a> {
    inner: &'a dyn ConvertProgress,
    label: String,
}

#[cfg(feature = "fault-injection")]
impl ConvertProgress for StallOnce<'_> {
    fn note(&self, message: &str) {
        self.inner.note(message)
    }
    fn phase(&self, name: &str, total_cells: u64) {
        self.inner.phase(name, total_cells)
    }
    fn file(&self, path: &std::path::Path) {
        self.inner.file(path)
    }
    fn advance(&self, cells: u64) {
        self.inner.advance(cells)
    }
    fn tile_done(&self, index: usize, cells: u64, nnz: u64) {
        self.inner.tile_done(index, cells, nnz);
        let Some(marker) = std::env::var_os("DELTACELLS_TEST_STALL_SHARD") else { return };
        let created = std::fs::OpenOptions::new().write(true).create_new(true).open(marker);
        if let Ok(mut file) = created {
            use std::io::Write;
            let _ = writeln!(file, "{}", self.label);
            drop(file);
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
    }
}
