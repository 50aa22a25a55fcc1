//! The model of a conversion job, shared by its steps: the plan (what to
//! read and how to write it: inputs, layout, obs, what an append keeps), the
//! result record each shard leaves, and where both are kept.
//!
//! A conversion in one process and a sharded one run the same steps on the
//! same plan: plan ([`super::plan()`]), shards ([`super::run_shard`], each a
//! contiguous range of whole obs shards), finalize ([`super::finalize`]);
//! every step is deterministic, so the bytes do not depend on how many
//! shards ran, in which order, or how often.

use super::error::{ConvertError, Result};
use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::Input;
use crate::format::{self, fingerprint};
use crate::storage::Storage;
use crate::writer::WriteOptions;

/// Where the plan is, in the output.
pub(crate) const PLAN_KEY: &str = crate::dataset::PLAN_KEY;

/// Where shard results are, in the output.
pub(crate) const RESULTS_PREFIX: &str = ".plan/results";

pub(crate) const PLAN_FORMAT: &str = "deltacells-plan";

pub(crate) const RESULT_FORMAT: &str = "deltacells-shard-result";

/// The key of shard `k` of `n`'s result record.
pub(crate) fn result_key(k: usize, n: usize) -> String {
    format!("{RESULTS_PREFIX}/shard-{k:05}-of-{n:05}.json")
}

/// (k, n) from a result key.
pub(crate) fn parse_result_key(key: &str) -> Option<(usize, usize)> {
    let name = key.strip_prefix(RESULTS_PREFIX)?.strip_prefix("/shard-")?.strip_suffix(".json")?;
    let (k, n) = name.split_once("-of-")?;
    Some((k.parse().ok()?, n.parse().ok()?))
}

/// What obs the plan stores; the schema itself is obs/schema.json.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PlanObs {
    /// The first column is the cell names.
    pub names: bool,
    pub tiles_per_file: u64,
    /// The last two columns say where each cell was read (`source_file`,
    /// `source_row`: a shuffled dataset's), filled by the shards.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub source: bool,
}

/// Everything a shard worker needs besides the files the plan wrote.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Plan {
    pub format: String,
    pub version: u32,
    /// Identifies this plan; results of another plan are refused.
    pub id: String,
    pub matrix: String,
    pub inputs: Vec<Input>,
    pub n_cells: u64,
    pub n_genes: u64,
    pub tile_size: u64,
    pub n_chunks: usize,
    pub zstd_level: i32,
    pub var_table: bool,
    pub obs: Option<PlanObs>,
    /// The manifest's metadata.
    pub metadata: Map<String, Value>,
    /// What an append keeps of the dataset it extends; None for a conversion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub append: Option<AppendPlan>,
    /// The seed of the order the cells are stored in (`convert --shuffle`);
    /// None for the inputs' order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle: Option<u64>,
    /// How the inputs are read (their format, features), when not told by
    /// each input: every shard reads them so.
    #[serde(default, skip_serializing_if = "crate::inputs::InputReading::is_default")]
    pub reading: crate::inputs::InputReading,
}

/// The part of an append's plan that a conversion's does not have: the
/// dataset's tiles before `first_tile` (and their obs shards) are kept.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AppendPlan {
    /// SHA-256 of the manifest appended to: shards and finalize refuse another.
    pub base: String,
    /// The first tile the shards write (the dataset's last, when not full).
    pub first_tile: usize,
    /// The cells of the tiles before it.
    pub first_cell: u64,
    /// The obs shards before `first_tile`'s, as kept (or as the plan restated
    /// them, under `.append/`).
    pub kept_obs_bytes: Vec<u64>,
    pub kept_obs_sha256: Vec<String>,
    /// Stored obs columns whose type the append changes.
    pub restated: Vec<super::obs_merge::Restated>,
}

impl Plan {
    pub fn n_tiles(&self) -> usize {
        self.n_cells.div_ceil(self.tile_size) as usize
    }

    /// The first tile the shards write: 0, or an append's first.
    pub fn first_tile(&self) -> usize {
        self.append.as_ref().map_or(0, |a| a.first_tile)
    }

    /// The cell that is the first input's first row.
    pub fn first_cell(&self) -> u64 {
        self.append.as_ref().map_or(0, |a| a.first_cell)
    }

    pub fn tile_cells(&self, tile: usize) -> u64 {
        let start = tile as u64 * self.tile_size;
        (start + self.tile_size).min(self.n_cells) - start
    }

    /// Tiles per unit of work: an obs shard's tiles, or one tile without obs.
    pub fn tiles_per_unit(&self) -> usize {
        self.obs.as_ref().map_or(1, |o| o.tiles_per_file.max(1) as usize)
    }

    /// Units of work: more shards than this leave some with nothing to do.
    pub fn n_units(&self) -> usize {
        self.n_tiles().div_ceil(self.tiles_per_unit()) - self.first_tile() / self.tiles_per_unit()
    }

    /// The tiles of shard `k` of `n`: a contiguous range of whole units (an
    /// append's first unit starts at its first tile), the units spread as
    /// evenly as they go.
    pub fn shard_tiles(&self, k: usize, n: usize) -> Range<usize> {
        let (units, per) = (self.n_units(), self.tiles_per_unit());
        let first_unit = self.first_tile() / per;
        let unit = |k: usize| ((first_unit + k * units / n) * per).clamp(self.first_tile(), self.n_tiles());
        unit(k)..unit(k + 1)
    }

    /// The obs shards that tiles `tiles` fall in.
    pub(crate) fn obs_shards_of(&self, tiles: &Range<usize>) -> Range<usize> {
        let per = self.tiles_per_unit();
        if tiles.is_empty() {
            return tiles.start / per..tiles.start / per;
        }
        tiles.start / per..tiles.end.div_ceil(per)
    }

    pub(crate) fn write_options(&self) -> WriteOptions {
        WriteOptions { tile_size: self.tile_size, n_chunks: self.n_chunks, zstd_level: self.zstd_level }
    }

    pub(crate) fn with_id(mut self) -> Plan {
        self.id = String::new();
        let text = serde_json::to_vec(&self).expect("a plan serializes");
        self.id = fingerprint::sha256_hex(&text)[..24].to_string();
        self
    }
}

/// What shard K of N wrote.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ShardResult {
    pub format: String,
    pub plan: String,
    pub shard: usize,
    pub shards: usize,
    pub first_tile: usize,
    pub tile_cells: Vec<u64>,
    pub tile_nnz: Vec<u64>,
    pub tile_bytes: Vec<u64>,
    pub tile_sha256: Vec<String>,
    pub first_obs_shard: usize,
    pub obs_shard_bytes: Vec<u64>,
    pub obs_shard_sha256: Vec<String>,
    /// Nonzeros of genes the dataset does not store (`--genes intersection`).
    #[serde(default)]
    pub dropped_nonzeros: u64,
    /// Entries of a cell and gene that repeated an earlier one, summed into it.
    #[serde(default)]
    pub summed_duplicates: u64,
}

/// Reads the plan of the conversion into `out`.
pub(crate) fn read_plan(out: &dyn Storage) -> Result<Plan> {
    let location = out.location(PLAN_KEY);
    let Some(bytes) = out.get(PLAN_KEY)? else {
        if out.get(format::MANIFEST_KEY)?.is_some() {
            return Err(ConvertError::state(
                out.location(""),
                "the dataset is complete (finalized); there is no plan left to run",
            ));
        }
        return Err(ConvertError::NoPlan { location, root: out.location("") });
    };
    let plan: Plan = serde_json::from_slice(&bytes)
        .map_err(|e| ConvertError::invalid(&location, format!("not a readable plan: {e}")))?;
    if plan.format != PLAN_FORMAT || plan.version != 1 {
        let problem = format!("not a plan of this version (format {:?}, version {})", plan.format, plan.version);
        return Err(ConvertError::invalid(location, problem));
    }
    if plan.tile_size == 0 || plan.first_cell() + plan.inputs.iter().map(|i| i.n_rows).sum::<u64>() != plan.n_cells {
        return Err(ConvertError::invalid(location, "inconsistent plan (tile size or cell count)"));
    }
    if plan.clone().with_id().id != plan.id {
        let problem = "the plan was changed after it was written (its id does not match its content)";
        return Err(ConvertError::invalid(location, problem));
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(n_cells: u64, tile_size: u64, obs_tiles: Option<u64>) -> Plan {
        Plan {
            format: PLAN_FORMAT.into(),
            version: 1,
            id: String::new(),
            matrix: "X".into(),
            inputs: vec![Input {
                path: "a.h5ad".into(),
                n_rows: n_cells,
                bytes: 0,
                etag: None,
                stored_tile: None,
                genes_digest: None,
            }],
            n_cells,
            n_genes: 10,
            tile_size,
            n_chunks: 8,
            zstd_level: 19,
            var_table: true,
            obs: obs_tiles.map(|t| PlanObs { names: true, tiles_per_file: t, source: false }),
            metadata: Map::new(),
            append: None,
            shuffle: None,
            reading: Default::default(),
        }
    }

    #[test]
    fn shards_cover_every_tile_once_in_whole_obs_shards() {
        for (n_cells, tile_size, obs) in [(95, 10, Some(3)), (100, 10, None), (1, 10, Some(1000)), (0, 10, None)] {
            let p = plan(n_cells, tile_size, obs);
            for n in 1..12 {
                let mut next = 0;
                for k in 0..n {
                    let r = p.shard_tiles(k, n);
                    assert_eq!(r.start, next, "{n_cells} cells, shard {k}/{n}");
                    assert!(r.start.is_multiple_of(p.tiles_per_unit()));
                    next = r.end;
                }
                assert_eq!(next, p.n_tiles());
            }
        }
        let p = plan(95, 10, Some(3)); // 10 tiles in 4 obs shards
        assert_eq!((0..3).map(|k| p.shard_tiles(k, 3)).collect::<Vec<_>>(), vec![0..3, 3..6, 6..10]);
    }

    #[test]
    fn result_keys_round_trip() {
        assert_eq!(parse_result_key(&result_key(3, 7)), Some((3, 7)));
        assert_eq!(parse_result_key(".plan/results/other.json"), None);
    }

    #[test]
    fn the_plan_id_covers_its_content() {
        let a = plan(95, 10, Some(3)).with_id();
        let b = plan(96, 10, Some(3)).with_id();
        assert_ne!(a.id, b.id);
        assert_eq!(a.clone().with_id().id, a.id);
    }
}
