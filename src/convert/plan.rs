//! Planning a conversion: scan the inputs, choose the gene order and the obs
//! schema, fix the tile layout, and write into the output everything the
//! shards need: the final gene and obs tables at the dataset's own keys, and
//! `.plan/plan.json` (the [`Plan`]) last.

use super::error::{ConvertError, Result};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::job::{Plan, PlanObs, PLAN_FORMAT, PLAN_KEY};
use super::obs_merge::ObsPlan;
use super::totals::{has_stored_totals, stored_totals, totals_identity};
use super::{
    gene_order_from_totals, gene_totals, prepare_output, sampled_inputs, scan_inputs, ConvertOptions, ConvertProgress,
};
use crate::format::{self, npy, MAX_GENES};
use crate::storage::Storage;

/// Step 1: scans the inputs and writes the plan, the gene tables and the obs
/// schema into `out` (plan.json last).
pub fn plan(
    inputs: &[PathBuf],
    out: &dyn Storage,
    options: &ConvertOptions,
    progress: &dyn ConvertProgress,
) -> Result<Plan> {
    plan_then(inputs, out, options, Then::Nothing, progress)
}

/// What the process does after a plan: the inputs it reads whole, fetched
/// ahead while they are scanned when they are at URLs.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Then {
    /// Nothing: the shards run elsewhere (the plan reads the sampled inputs).
    Nothing,
    /// Every tile, here (convert reads every input whole).
    Tiles,
}

/// [`plan`], with what follows it.
pub(crate) fn plan_then(
    inputs: &[PathBuf],
    out: &dyn Storage,
    options: &ConvertOptions,
    then: Then,
    progress: &dyn ConvertProgress,
) -> Result<Plan> {
    if inputs.is_empty() {
        return Err(ConvertError::NoInputs);
    }
    if options.write.tile_size == 0 {
        return Err(ConvertError::Argument("the tile size must be at least 1".into()));
    }
    // The sampled inputs' X is read for the gene totals (unless they were
    // summed by plan --totals-shard), and every input's for the tiles.
    let mut read_whole = match options.gene_order {
        Some(_) => Vec::new(),
        None if has_stored_totals(out) => Vec::new(),
        None => sampled_inputs(inputs.len(), options.gene_order_files),
    };
    if then == Then::Tiles {
        let rest: Vec<usize> = (0..inputs.len()).filter(|i| !read_whole.contains(i)).collect();
        read_whole.extend(rest);
    }
    let (scanned, var_names) =
        scan_inputs(inputs, &options.matrix, options.genes, &read_whole, &options.inputs, progress)?;
    let n_genes = var_names.len() as u64;
    if n_genes == 0 || n_genes > MAX_GENES {
        let problem = format!("{} has {n_genes} genes; a dataset needs 1..2^31", options.matrix);
        return Err(ConvertError::invalid(inputs[0].display().to_string(), problem));
    }
    let mut obs_plan = match &options.obs {
        Some(o) => {
            progress.phase("reading obs", 0);
            let paths: Vec<&Path> = scanned.iter().map(|i| i.path.as_path()).collect();
            ObsPlan::new(&paths, &options.matrix, o, &options.inputs)?
        }
        None => None,
    };
    if let (Some(p), Some(_)) = (&mut obs_plan, options.shuffle) {
        let names: Vec<String> = scanned.iter().map(|i| i.path.display().to_string()).collect();
        p.add_source_columns(&names)?;
    }
    prepare_output(out, options.overwrite)?;

    let (sampled, order) = match &options.gene_order {
        Some(given) => (Vec::new(), given.resolve(&var_names, &scanned[0].path)?),
        None => {
            let sampled = sampled_inputs(scanned.len(), options.gene_order_files);
            let identity = totals_identity(&scanned, &sampled, &options.matrix, &var_names);
            let totals = match stored_totals(out, &identity, var_names.len())? {
                Some(totals) => {
                    progress.note("gene totals summed from the partial totals stored in the output");
                    totals
                }
                None => gene_totals(&scanned, &sampled, &options.matrix, &var_names, &options.inputs, progress)?,
            };
            (sampled, gene_order_from_totals(&totals))
        }
    };
    let order_i32: Vec<i32> = order.iter().map(|&g| g as i32).collect();
    out.put(format::GENE_ORDER_KEY, Bytes::from(npy::write_i32(&order_i32)))?;
    let mut names_text = String::new();
    for &g in &order {
        names_text.push_str(&var_names[g as usize]);
        names_text.push('\n');
    }
    out.put(format::VAR_NAMES_KEY, Bytes::from(names_text))?;
    if options.write_var {
        let first = crate::inputs::open(&scanned[0].path, &options.matrix, &options.inputs)?;
        let first_genes = first.gene_names()?;
        // The first input's row of each stored gene (none for genes only later inputs have).
        let first_rows: Vec<Option<u32>> = match super::genes::column_map(&scanned[0].path, &first_genes, &var_names)? {
            None => order.iter().map(|&g| Some(g)).collect(),
            Some(map) => {
                let mut row_of = vec![None; var_names.len()];
                for (row, &g) in map.iter().enumerate() {
                    if g != super::genes::DROPPED {
                        row_of[g as usize] = Some(row as u32);
                    }
                }
                order.iter().map(|&g| row_of[g as usize]).collect()
            }
        };
        let stored_names: Vec<&str> = order.iter().map(|&g| var_names[g as usize].as_str()).collect();
        let table = super::var_table::build(first.var()?.as_ref(), &first_rows, &stored_names)?;
        out.put(format::VAR_TABLE_KEY, Bytes::from(table))?;
    }
    if let Some(p) = &obs_plan {
        out.put(format::OBS_SCHEMA_KEY, Bytes::from(p.schema_text()))?;
    }

    let mut metadata = Map::new();
    metadata.insert("generator".into(), json!(format!("deltacells {}", env!("CARGO_PKG_VERSION"))));
    metadata.insert(
        "convert".into(),
        json!({
            "inputs": scanned.iter().map(|i| crate::redact::path(&i.path)).collect::<Vec<_>>(),
            "matrix": options.matrix,
            "genes": options.genes.as_str(),
            "gene_order_files": sampled.iter().map(|&i| crate::redact::path(&scanned[i].path)).collect::<Vec<_>>(),
            "tile_size": options.write.tile_size,
            "n_chunks": options.write.n_chunks,
            "zstd_level": options.write.zstd_level,
        }),
    );
    if let (Some(seed), Some(Value::Object(record))) = (options.shuffle, metadata.get_mut("convert")) {
        record.insert(
            "shuffle".into(),
            json!({
                "seed": seed,
                "source_columns": obs_plan.is_some(),
            }),
        );
    }
    if let (false, Some(Value::Object(record))) = (options.inputs.reading.is_default(), metadata.get_mut("convert")) {
        record.insert("reading".into(), json!(options.inputs.reading));
    }
    if let (Some(given), Some(Value::Object(record))) = (&options.gene_order, metadata.get_mut("convert")) {
        record.insert("gene_order_from".into(), json!(crate::redact::redact(given.source())));
    }
    // What an append needs to merge more inputs' obs as this plan did.
    if let (Some(o), Some(p), Some(Value::Object(record))) = (&options.obs, &obs_plan, metadata.get_mut("convert")) {
        record.insert(
            "obs".into(),
            json!({
                "names": o.names,
                "exclude": o.exclude,
                "max_categories": o.max_categories,
                "categories_as_strings": p.categories_as_strings(),
            }),
        );
    }
    metadata.extend(options.metadata.clone());
    let plan = Plan {
        format: PLAN_FORMAT.into(),
        version: 1,
        id: String::new(),
        matrix: options.matrix.clone(),
        n_cells: scanned.iter().map(|i| i.n_rows).sum(),
        inputs: scanned,
        n_genes,
        tile_size: options.write.tile_size,
        n_chunks: options.write.n_chunks,
        zstd_level: options.write.zstd_level,
        var_table: options.write_var,
        obs: obs_plan.as_ref().zip(options.obs.as_ref()).map(|(_, o)| PlanObs {
            names: o.names,
            tiles_per_file: o.tiles_per_file.max(1),
            source: options.shuffle.is_some(),
        }),
        metadata,
        append: None,
        shuffle: options.shuffle,
        reading: options.inputs.reading.clone(),
    }
    .with_id();
    let mut text = serde_json::to_vec_pretty(&plan)?;
    text.push(b'\n');
    out.put(PLAN_KEY, Bytes::from(text))?;
    Ok(plan)
}
