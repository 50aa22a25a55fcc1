//! The dataset an append extends: what its conversion recorded (matrix, obs
//! options), the check that it is the one the append was planned on, and
//! what the append's first shard keeps of it (its last tile's cells, the obs
//! rows before them in their shard, restated when a column's type changes).

use super::error::{ConvertError, Result};
use serde_json::Value;

use super::job::{AppendPlan, Plan};
use super::obs_merge::ObsPlan;
use super::{ObsOptions, StoredTail};
use crate::format::{self, fingerprint, Manifest, TileExpectation};
use crate::storage::Storage;

/// What convert recorded of itself in the manifest, with what appends added.
pub(crate) struct Recorded {
    pub(crate) matrix: String,
    pub(crate) obs: ObsOptions,
    pub(crate) categories_as_strings: Vec<String>,
}

pub(crate) fn recorded(manifest: &Manifest, schema: Option<&format::obs_schema::ObsSchema>) -> Recorded {
    let convert = manifest.metadata.get("convert");
    let obs = convert.and_then(|c| c.get("obs"));
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array).into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect()
    };
    let defaults = ObsOptions::default();
    let mut categories_as_strings = strings(obs.and_then(|o| o.get("categories_as_strings")));
    for a in manifest.metadata.get("appends").and_then(Value::as_array).into_iter().flatten() {
        categories_as_strings.extend(strings(a.get("categories_as_strings")));
    }
    Recorded {
        matrix: convert.and_then(|c| c.get("matrix")).and_then(Value::as_str).unwrap_or("X").to_string(),
        obs: ObsOptions {
            names: obs
                .and_then(|o| o.get("names"))
                .and_then(Value::as_bool)
                .unwrap_or_else(|| schema.and_then(|s| s.columns.first()).is_some_and(|c| c.name == "obs_names")),
            exclude: strings(obs.and_then(|o| o.get("exclude"))),
            max_categories: obs
                .and_then(|o| o.get("max_categories"))
                .and_then(Value::as_u64)
                .map_or(defaults.max_categories, |n| n as usize),
            tiles_per_file: manifest.obs_tiles_per_file.unwrap_or(defaults.tiles_per_file),
        },
        categories_as_strings,
    }
}

/// The manifest of the dataset an append extends, checked to be the one it
/// was planned on.
pub(crate) fn check_base(base: &dyn Storage, append: &AppendPlan) -> Result<Manifest> {
    let bytes = base.get(format::MANIFEST_KEY)?.ok_or_else(|| crate::dataset::no_manifest(base))?;
    if fingerprint::sha256_hex(&bytes) != append.base {
        return Err(ConvertError::state(
            base.location(format::MANIFEST_KEY),
            "the dataset changed since the append was planned (its manifest is not the one planned on); \
             plan the append again",
        ));
    }
    Manifest::parse_checked(&bytes).map_err(|source| {
        crate::dataset::DatasetError::Manifest { location: base.location(format::MANIFEST_KEY), source }.into()
    })
}

/// The obs rows of an obs shard of a stored dataset, read a tile at a time
/// and restated into a plan's schema: a shard holds up to
/// `obs_tiles_per_file` tiles (10 million cells at the default), which an
/// append that rewrites it must not hold in memory at once.
pub(crate) struct StoredObsRows {
    groups: crate::obs::RowGroups,
    old: format::obs_schema::ObsSchema,
    location: String,
    /// The tiles' rows taken, from the first.
    count: usize,
}

impl StoredObsRows {
    /// Obs shard `s` of `base`, whose stored schema is `old`: its bytes
    /// checked against the SHA-256 `manifest` records for it (they may be
    /// copied into the new shard as they are), its footer read, no row yet.
    pub(crate) fn open(
        base: &dyn Storage,
        s: usize,
        old: &format::obs_schema::ObsSchema,
        manifest: &Manifest,
    ) -> Result<Self> {
        let key = format::obs_shard_key(s);
        let location = base.location(&key);
        let bytes =
            base.get(&key)?.ok_or_else(|| ConvertError::invalid(&location, "missing (the manifest lists it)"))?;
        let recorded = manifest.obs_shard_sha256.as_deref().and_then(|h| h.get(s));
        if recorded.is_some_and(|h| *h != fingerprint::sha256_hex(&bytes)) {
            return Err(ConvertError::invalid(
                &location,
                "its SHA-256 is not the one the manifest records (the shard was damaged or replaced); \
                 `deltacells verify` the dataset",
            ));
        }
        let groups = crate::obs::RowGroups::open(bytes)
            .map_err(|e| ConvertError::Unreadable { location: location.clone(), source: Box::new(e) })?;
        let count = groups.len();
        Ok(StoredObsRows { groups, old: old.clone(), location, count })
    }

    /// The number of tiles' rows taken.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// The rows of the shard's tile `i`, restated into `plan`'s schema.
    pub(crate) fn restated(&self, i: usize, plan: &ObsPlan) -> Result<arrow_array::RecordBatch> {
        let batch = self
            .groups
            .get(i)
            .map_err(|e| ConvertError::Unreadable { location: self.location.clone(), source: Box::new(e) })?;
        plan.restate(&self.old, &batch).map_err(|e| ConvertError::invalid(&self.location, e))
    }

    /// Whether the shard's rows need no restating into `plan`'s schema: every
    /// column keeps its name, kind and type, so the row groups' encoded
    /// bytes can be copied into a shard of that schema as they are.
    pub(crate) fn unchanged_in(&self, plan: &ObsPlan) -> bool {
        let (stored, planned) = (self.groups.arrow_schema(), plan.arrow_schema());
        stored.fields().len() == planned.fields().len()
            && self.old.columns.len() == plan.schema().columns.len()
            && self
                .old
                .columns
                .iter()
                .zip(&plan.schema().columns)
                .all(|(was, now)| was.kind == now.kind && was.arrow_type == now.arrow_type)
            && stored
                .fields()
                .iter()
                .zip(planned.fields())
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type())
    }

    /// The shard's bytes and the footer's record of its tile `i`'s row group,
    /// for copying it as it is.
    pub(crate) fn encoded(&self, i: usize) -> Option<(&bytes::Bytes, &parquet::file::metadata::RowGroupMetaData)> {
        (i < self.count).then(|| self.groups.encoded(i)).flatten()
    }

    /// Where the shard is, for messages.
    pub(crate) fn location(&self) -> &str {
        &self.location
    }

    /// Keeps the first `n` tiles' rows only.
    fn truncate(&mut self, n: usize) {
        self.count = self.count.min(n);
    }
}

/// What an append's first shard keeps of `base`: the cells of its last tile
/// when the plan rewrites it (decoded, with their obs rows), and the obs rows
/// of the tiles before it in its obs shard, restated into the plan's schema.
pub(crate) fn kept_rows(
    base: &dyn Storage,
    plan: &Plan,
    obs_plan: Option<&ObsPlan>,
) -> Result<(Option<StoredTail>, Option<StoredObsRows>)> {
    let a = plan.append.as_ref().expect("an append's plan");
    let manifest = check_base(base, a)?;
    let per = plan.tiles_per_unit();
    let shard = a.first_tile / per;
    let tail_tile = plan.inputs.first().and_then(|i| i.stored_tile);
    let mut prefix = None;
    let mut tail_obs = None;
    if let Some(obs_plan) = obs_plan {
        if !a.first_tile.is_multiple_of(per) || tail_tile.is_some() {
            let old = crate::obs::read_schema(base)?;
            let mut rows = StoredObsRows::open(base, shard, &old.schema, &manifest)?;
            let in_shard = a.first_tile - shard * per;
            if tail_tile.is_some() {
                if in_shard >= rows.len() {
                    return Err(ConvertError::invalid(
                        base.location(&format::obs_shard_key(shard)),
                        format!("no row group for tile {}", a.first_tile),
                    ));
                }
                tail_obs = Some(rows.restated(in_shard, obs_plan)?);
            }
            rows.truncate(in_shard);
            prefix = Some(rows);
        }
    }
    let tail = match tail_tile {
        Some(t) => {
            let key = format::tile_key(t);
            let location = base.location(&key);
            let blob =
                base.get(&key)?.ok_or_else(|| ConvertError::invalid(&location, format!("missing (tile {t})")))?;
            if blob.len() as u64 != manifest.tile_bytes[t] {
                return Err(ConvertError::invalid(
                    location,
                    format!("tile is {} bytes, the manifest says {}", blob.len(), manifest.tile_bytes[t]),
                ));
            }
            let expect = TileExpectation {
                n_cells: manifest.tile_cells[t],
                nnz: manifest.tile_nnz[t],
                n_genes: plan.n_genes as u32,
            };
            let rows = format::decode_tile(&blob, Some(&expect))
                .map_err(|source| crate::dataset::DatasetError::Tile { location, tile: t, source })?;
            Some(StoredTail { rows, obs: tail_obs })
        }
        None => None,
    };
    Ok((tail, prefix))
}
