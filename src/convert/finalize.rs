//! Finalize: checks that the shards' results cover every tile and obs shard
//! and agree with the plan and the stored objects, writes manifest.json last,
//! then removes the plan. For an append the manifest is staged and then
//! committed (see [`super::staging`]).

use super::error::{ConvertError, Result};
use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{json, Value};

use super::base::check_base;
use super::job::{parse_result_key, read_plan, Plan, ShardResult, RESULTS_PREFIX, RESULT_FORMAT};
use super::staging::{clean_up, commit, finish_interrupted, lock, Workspace};
use super::ConvertSummary;
use crate::format::{self, fingerprint};
use crate::storage::Storage;
use crate::writer::{manifest_of, ManifestFlags, TileRecord};

/// One tile or obs shard as the results have it: (size, sha256, nnz) and who wrote it.
type Entry = ((u64, String, u64), (usize, usize));

fn record(
    map: &mut BTreeMap<usize, Entry>,
    index: usize,
    value: (u64, String, u64),
    by: (usize, usize),
    what: &str,
) -> Result<()> {
    if let Some((old, old_by)) = map.get(&index) {
        if *old != value {
            return Err(ConvertError::invalid(
                format!("shard results {}/{} and {}/{}", old_by.0, old_by.1, by.0, by.1),
                format!("they disagree about {what} {index}; re-run one of them"),
            ));
        }
        return Ok(());
    }
    map.insert(index, (value, by));
    Ok(())
}

/// Checks one result record against the plan; returns it parsed.
fn check_result(out: &dyn Storage, plan: &Plan, key: &str, k: usize, n: usize) -> Result<ShardResult> {
    let location = out.location(key);
    let failed = |problem: String| ConvertError::ShardResult {
        location: location.clone(),
        problem,
        root: out.location(""),
        shard: k,
        shards: n,
    };
    let bytes = out.get(key)?.ok_or_else(|| ConvertError::invalid(&location, "vanished while finalizing"))?;
    let r: ShardResult = serde_json::from_slice(&bytes).map_err(|e| failed(format!("corrupt shard result ({e})")))?;
    let expected = plan.shard_tiles(k, n);
    let expected_obs = plan.obs_shards_of(&expected);
    let n_obs = if plan.obs.is_some() { expected_obs.len() } else { 0 };
    let problem = if r.format != RESULT_FORMAT {
        Some(format!("format {:?} is not {RESULT_FORMAT:?}", r.format))
    } else if r.plan != plan.id {
        Some(format!("it belongs to another plan ({}, not {})", r.plan, plan.id))
    } else if (r.shard, r.shards) != (k, n) {
        Some(format!("it says it is shard {}/{}", r.shard, r.shards))
    } else if r.first_tile != expected.start
        || [r.tile_cells.len(), r.tile_nnz.len(), r.tile_bytes.len(), r.tile_sha256.len()] != [expected.len(); 4]
    {
        Some(format!("it does not hold tiles {}..{}", expected.start, expected.end))
    } else if let Some(t) = expected.clone().find(|&t| r.tile_cells[t - expected.start] != plan.tile_cells(t)) {
        Some(format!("tile {t} has {} cells, the plan says {}", r.tile_cells[t - expected.start], plan.tile_cells(t)))
    } else if r.first_obs_shard != expected_obs.start
        || r.obs_shard_bytes.len() != n_obs
        || r.obs_shard_sha256.len() != n_obs
    {
        Some(format!("it does not hold obs shards {}..{}", expected_obs.start, expected_obs.start + n_obs))
    } else {
        None
    };
    if let Some(p) = problem {
        return Err(failed(format!("inconsistent shard result: {p}")));
    }
    Ok(r)
}

/// Step 3: checks every shard's result and writes manifest.json, last; then
/// removes the plan.
///
/// For an append (`out` is the dataset), the manifest is staged, and then
/// the staged files are moved into place and the manifest replaced; a
/// finalize that was interrupted then completes when run again.
pub fn finalize(out: &dyn Storage) -> Result<ConvertSummary> {
    let started = std::time::Instant::now();
    let _lock = lock(out)?;
    if let Some(manifest) = finish_interrupted(out)? {
        return Ok(summary_of_manifest(&manifest, (0, 0), started));
    }
    let workspace = Workspace::resolve(out)?;
    let (summary, staged) = finalize_in(workspace.out(), workspace.base())?;
    if workspace.is_append() {
        commit(out, &staged)?;
        clean_up(out)?;
    }
    Ok(summary)
}

/// What a finished dataset's manifest says of it.
fn summary_of_manifest(
    m: &crate::format::Manifest,
    (dropped_nonzeros, summed_duplicates): (u64, u64),
    started: std::time::Instant,
) -> ConvertSummary {
    let nnz: u64 = m.tile_nnz.iter().sum();
    let tile_bytes: u64 = m.tile_bytes.iter().sum();
    ConvertSummary {
        n_cells: m.n_cells,
        n_genes: m.n_genes,
        n_tiles: m.n_tiles(),
        nnz,
        tile_bytes,
        bytes_per_nonzero: if nnz == 0 { 0.0 } else { tile_bytes as f64 / nnz as f64 },
        dropped_nonzeros,
        summed_duplicates,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Whether `key` is a temporary file of ours (`.deltacells-*.tmp`), left by
/// a writer killed before it renamed it into place.
fn is_temporary(key: &str) -> bool {
    let name = key.rsplit('/').next().unwrap_or(key);
    name.starts_with(".deltacells-") && name.ends_with(".tmp")
}

/// Finalize's checks and manifest, in `out` (which holds the plan and the
/// shards' results), with `base` the dataset an append extends (else `out`).
/// Returns the manifest written.
pub(crate) fn finalize_in(out: &dyn Storage, base: &dyn Storage) -> Result<(ConvertSummary, Bytes)> {
    let started = std::time::Instant::now();
    let plan = read_plan(out)?;
    let n_tiles = plan.n_tiles();
    let first_tile = plan.first_tile();
    let written_obs = plan.obs_shards_of(&(first_tile..n_tiles));
    let n_obs_shards = if plan.obs.is_some() { written_obs.end } else { 0 };
    let base_manifest = match &plan.append {
        Some(a) => Some(check_base(base, a)?),
        None => None,
    };

    let mut tiles: BTreeMap<usize, Entry> = BTreeMap::new();
    let mut obs: BTreeMap<usize, Entry> = BTreeMap::new();
    let mut seen: Vec<(usize, usize)> = Vec::new();
    // Per first tile, so that a shard whose result appears twice (as K/N and
    // as another split) is counted once.
    let mut dropped: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for key in out.list(RESULTS_PREFIX)? {
        // A shard killed while it wrote its result leaves its temporary
        // file (deleted with the plan below); its re-run wrote the result.
        if is_temporary(&key) {
            continue;
        }
        let Some((k, n)) = parse_result_key(&key).filter(|(k, n)| k < n) else {
            return Err(ConvertError::invalid(out.location(&key), "not a shard result name (shard-K-of-N.json)"));
        };
        let r = check_result(out, &plan, &key, k, n)?;
        for (i, t) in (r.first_tile..).zip(0..r.tile_cells.len()) {
            record(&mut tiles, i, (r.tile_bytes[t], r.tile_sha256[t].clone(), r.tile_nnz[t]), (k, n), "tile")?;
        }
        for (i, s) in (r.first_obs_shard..).zip(0..r.obs_shard_bytes.len()) {
            record(&mut obs, i, (r.obs_shard_bytes[s], r.obs_shard_sha256[s].clone(), 0), (k, n), "obs shard")?;
        }
        dropped.insert(r.first_tile, (r.dropped_nonzeros, r.summed_duplicates));
        seen.push((k, n));
    }
    let dropped_nonzeros: u64 = dropped.values().map(|d| d.0).sum();
    let summed_duplicates: u64 = dropped.values().map(|d| d.1).sum();

    let missing_tiles: Vec<usize> = (first_tile..n_tiles).filter(|t| !tiles.contains_key(t)).collect();
    if !missing_tiles.is_empty() {
        let mut counts: Vec<usize> = seen.iter().map(|s| s.1).collect();
        counts.sort_unstable();
        counts.dedup();
        let which = match counts.as_slice() {
            [n] => {
                let missing: Vec<String> =
                    (0..*n).filter(|k| !seen.contains(&(*k, *n))).map(|k| format!("{k}/{n}")).collect();
                format!("the results of shards {} are missing", missing.join(", "))
            }
            [] => "no shard has finished".to_string(),
            _ => format!("{} tiles are not covered by any result", missing_tiles.len()),
        };
        return Err(ConvertError::state(
            out.location(""),
            format!(
                "cannot finalize: {which} (first missing tile: {}); run those shards, then finalize again",
                missing_tiles[0]
            ),
        ));
    }

    // The objects the results describe must be there, with their sizes.
    let stored: BTreeMap<String, u64> = out.list_sizes("tiles")?.into_iter().chain(out.list_sizes("obs")?).collect();
    let check_size = |key: String, bytes: u64, by: (usize, usize)| -> Result<()> {
        match stored.get(&key) {
            Some(&size) if size == bytes => Ok(()),
            found => Err(ConvertError::invalid(
                out.location(&key),
                format!(
                    "{} (shard {}/{} recorded {bytes} bytes); re-run that shard",
                    found.map_or("missing".to_string(), |s| format!("{s} bytes")),
                    by.0,
                    by.1
                ),
            )),
        }
    };
    for (&t, ((bytes, _, _), by)) in &tiles {
        check_size(format::tile_key(t), *bytes, *by)?;
    }
    for s in written_obs.start.min(n_obs_shards)..n_obs_shards {
        let Some(((bytes, _, _), by)) = obs.get(&s) else {
            return Err(ConvertError::state(
                out.location(""),
                format!("cannot finalize: no result holds obs shard {s}"),
            ));
        };
        check_size(format::obs_shard_key(s), *bytes, *by)?;
    }

    // The kept tiles as the dataset's manifest has them, then the new ones.
    let kept = base_manifest.iter().flat_map(|m| {
        (0..first_tile).map(|t| TileRecord { cells: m.tile_cells[t], nnz: m.tile_nnz[t], bytes: m.tile_bytes[t] })
    });
    let records: Vec<TileRecord> = kept
        .chain(tiles.iter().map(|(&t, ((bytes, _, nnz), _))| TileRecord {
            cells: plan.tile_cells(t),
            nnz: *nnz,
            bytes: *bytes,
        }))
        .collect();
    let flags = match &base_manifest {
        Some(m) => {
            ManifestFlags { gene_order: m.has_gene_order, var_names: m.has_var_names, var_table: m.has_var_table }
        }
        None => ManifestFlags { gene_order: true, var_names: true, var_table: plan.var_table },
    };
    let mut metadata = plan.metadata.clone();
    if let (None, Some(Value::Object(convert))) = (&plan.append, metadata.get_mut("convert")) {
        if convert.get("genes").is_some_and(|g| g == "intersection") {
            convert.insert("dropped_nonzeros".into(), json!(dropped_nonzeros));
        }
    }
    let mut m = manifest_of(plan.write_options(), plan.n_genes as u32, &records, flags, metadata);
    if let Some(o) = &plan.obs {
        let text = crate::obs::read_schema(out)?.text;
        let (mut sizes, mut sha256) = match &plan.append {
            Some(a) => (a.kept_obs_bytes.clone(), a.kept_obs_sha256.clone()),
            None => (Vec::new(), Vec::new()),
        };
        for s in sizes.len()..n_obs_shards {
            sizes.push(obs[&s].0 .0);
            sha256.push(obs[&s].0 .1.clone());
        }
        m.has_obs = true;
        m.obs_tiles_per_file = Some(o.tiles_per_file);
        m.obs_shard_bytes = Some(sizes);
        m.obs_fingerprint = Some(fingerprint::obs_fingerprint(&text, &m.tile_cells, &sha256));
        m.obs_shard_sha256 = Some(sha256);
        // An append stages the schema for its shards; where it did not
        // change, the dataset's stays as it is.
        if plan.append.is_some() && crate::obs::read_schema(base)?.text == text {
            out.delete(format::OBS_SCHEMA_KEY)?;
        }
    }
    // Temporary files of killed shard runs (their re-runs wrote the objects).
    for key in stored.keys().filter(|k| k.contains("/.deltacells-")) {
        out.delete(key)?;
    }
    if let Some(problem) = m.check().into_iter().next() {
        return Err(ConvertError::invalid(
            out.location(""),
            format!("the manifest would be inconsistent ({problem}); nothing was changed"),
        ));
    }
    let text = Bytes::from(m.to_json());
    out.put(format::MANIFEST_KEY, text.clone())?;
    // The dataset is complete (an append's is staged); the plan's files are
    // no longer needed.
    for key in out.list(".plan")? {
        out.delete(&key)?;
    }
    Ok((summary_of_manifest(&m, (dropped_nonzeros, summed_duplicates), started), text))
}
