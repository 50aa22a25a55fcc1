//! Gene totals summed ahead of a plan (`plan --totals-shard K/N`): N jobs
//! each sum a share of the inputs sampled for the gene order and store it in
//! the output, and the plan that follows adds them up instead of reading
//! those inputs' X itself; totals of other inputs or options are refused.

use super::error::{ConvertError, Result};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{gene_totals, sampled_inputs, scan_inputs, ConvertOptions, ConvertProgress, Input};
use crate::format::fingerprint;
use crate::storage::Storage;

/// Where `plan --totals-shard` puts the gene totals of its share of the
/// sampled inputs, in the output.
pub(crate) const TOTALS_PREFIX: &str = ".plan/totals";

const TOTALS_FORMAT: &str = "deltacells-gene-totals";

fn totals_key(k: usize, n: usize) -> String {
    format!("{TOTALS_PREFIX}/shard-{k:05}-of-{n:05}.json")
}

/// The gene totals of one share of the sampled inputs.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct TotalsShard {
    format: String,
    /// What the totals are of (the sampled inputs with their sizes, the
    /// matrix, the source genes): a plan takes only totals of what it samples.
    of: String,
    shard: usize,
    shards: usize,
    inputs: Vec<String>,
    cells: u64,
    totals: Vec<u64>,
}

/// What a totals shard did.
#[derive(Clone, Debug, Serialize)]
pub struct TotalsSummary {
    pub shard: usize,
    pub shards: usize,
    /// The sampled inputs this share summed.
    pub inputs: Vec<PathBuf>,
    pub cells: u64,
    pub seconds: f64,
}

/// The identity of the totals a plan of `scanned` samples.
pub(crate) fn totals_identity(scanned: &[Input], sampled: &[usize], matrix: &str, genes: &[String]) -> String {
    let files: Vec<_> = sampled.iter().map(|&i| (&scanned[i].path, scanned[i].bytes, scanned[i].n_rows)).collect();
    let text = serde_json::to_vec(&json!({"files": files, "matrix": matrix, "genes": genes})).expect("serializes");
    fingerprint::sha256_hex(&text)[..24].to_string()
}

/// The sampled inputs (indices into `sampled`) that share `k` of `n` sums:
/// consecutive, as even as they go.
fn totals_share(n_sampled: usize, k: usize, n: usize) -> Range<usize> {
    k * n_sampled / n..(k + 1) * n_sampled / n
}

/// Plan step 0, optional: sums the gene totals of share `k` of `n` (0-based)
/// of the inputs the plan samples, and stores them in `out` for [`super::plan()`] to
/// add up instead of reading those inputs' X itself. Run with the inputs and
/// options the plan will have; the plan refuses totals of anything else.
pub fn plan_totals_shard(
    inputs: &[PathBuf],
    out: &dyn Storage,
    options: &ConvertOptions,
    k: usize,
    n: usize,
    progress: &dyn ConvertProgress,
) -> Result<TotalsSummary> {
    let started = std::time::Instant::now();
    if n == 0 || k >= n {
        return Err(ConvertError::Argument(format!("totals share {k}/{n}: K must be from 0 to N-1")));
    }
    if inputs.is_empty() {
        return Err(ConvertError::NoInputs);
    }
    let sampled = sampled_inputs(inputs.len(), options.gene_order_files);
    let mine: Vec<usize> = sampled[totals_share(sampled.len(), k, n)].to_vec();
    let (scanned, var_names) = scan_inputs(inputs, &options.matrix, options.genes, &mine, &options.inputs, progress)?;
    let keys = out.list("").map_err(|source| ConvertError::Reaching {
        what: format!("cannot list the output {}", out.location("")),
        source,
    })?;
    if keys.iter().any(|key| !key.starts_with(TOTALS_PREFIX)) {
        return Err(ConvertError::NotEmpty { location: out.location("") });
    }
    let totals = gene_totals(&scanned, &mine, &options.matrix, &var_names, &options.inputs, progress)?;
    let record = TotalsShard {
        format: TOTALS_FORMAT.into(),
        of: totals_identity(&scanned, &sampled, &options.matrix, &var_names),
        shard: k,
        shards: n,
        inputs: mine.iter().map(|&i| scanned[i].path.display().to_string()).collect(),
        cells: mine.iter().map(|&i| scanned[i].n_rows).sum(),
        totals,
    };
    let mut text = serde_json::to_vec(&record)?;
    text.push(b'\n');
    out.put(&totals_key(k, n), Bytes::from(text))?;
    Ok(TotalsSummary {
        shard: k,
        shards: n,
        inputs: mine.iter().map(|&i| scanned[i].path.clone()).collect(),
        cells: record.cells,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Whether `out` holds gene totals of `plan --totals-shard` (checked by
/// [`stored_totals`] once the inputs are scanned).
pub(crate) fn has_stored_totals(out: &dyn Storage) -> bool {
    out.list(TOTALS_PREFIX).is_ok_and(|keys| !keys.is_empty())
}

/// The gene totals `plan --totals-shard` stored in `out`, summed, when there
/// are any: every share of one count N must be there, and of the inputs and
/// options this plan samples (`identity`).
pub(crate) fn stored_totals(out: &dyn Storage, identity: &str, n_genes: usize) -> Result<Option<Vec<u64>>> {
    let keys = out.list(TOTALS_PREFIX)?;
    if keys.is_empty() {
        return Ok(None);
    }
    let totals_location = out.location(TOTALS_PREFIX);
    let unusable =
        |location: String, problem: String| ConvertError::Totals { location, problem, totals: totals_location.clone() };
    let mut shares: BTreeMap<usize, TotalsShard> = BTreeMap::new();
    let mut count = None;
    for key in &keys {
        let location = out.location(key);
        let bytes = out.get(key)?.ok_or_else(|| ConvertError::invalid(&location, "vanished while planning"))?;
        let Some(r) = serde_json::from_slice(&bytes)
            .ok()
            .filter(|r: &TotalsShard| r.format == TOTALS_FORMAT && r.shard < r.shards && r.totals.len() == n_genes)
        else {
            return Err(unusable(location, format!("not gene totals of this plan's {n_genes} genes")));
        };
        if r.of != identity {
            let problem = "gene totals of other inputs or options (the matrix, the gene set, the number of files \
                           sampled, or an input changed since)";
            return Err(unusable(location, problem.into()));
        }
        if *count.get_or_insert(r.shards) != r.shards {
            let problem = format!("totals of {} shares beside totals of {}", r.shards, count.unwrap_or(0));
            return Err(unusable(location, problem));
        }
        shares.insert(r.shard, r);
    }
    let n = count.unwrap_or(0);
    let missing: Vec<String> = (0..n).filter(|k| !shares.contains_key(k)).map(|k| format!("{k}/{n}")).collect();
    if !missing.is_empty() {
        let problem = format!("the gene totals of shares {} are missing", missing.join(", "));
        return Err(unusable(out.location(TOTALS_PREFIX), problem));
    }
    let mut totals = vec![0u64; n_genes];
    for share in shares.values() {
        for (t, s) in totals.iter_mut().zip(&share.totals) {
            *t = t.saturating_add(*s);
        }
    }
    Ok(Some(totals))
}
