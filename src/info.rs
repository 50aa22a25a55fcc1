//! What `deltacells info` reports about a dataset, as data.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::dataset::{Dataset, DatasetError};
use crate::format;
use crate::obs;

#[derive(Clone, Debug, Serialize)]
pub struct DatasetInfo {
    pub dataset: String,
    pub version: u64,
    pub n_cells: u64,
    pub n_genes: u64,
    pub n_tiles: usize,
    pub tile_size: u64,
    pub nnz: u64,
    /// Size of the tiles.
    pub tile_bytes: u64,
    /// Size of every file of the dataset.
    pub bytes_on_disk: u64,
    /// Tile bytes per stored nonzero.
    pub bytes_per_nonzero: f64,
    pub n_chunks: u64,
    pub zstd_level: i64,
    pub has_gene_order: bool,
    pub has_var_names: bool,
    pub has_var_table: bool,
    pub has_obs: bool,
    pub obs: Option<ObsInfo>,
    pub var_columns: Option<Vec<VarColumn>>,
    pub metadata: Map<String, Value>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ObsInfo {
    pub shards: usize,
    pub tiles_per_file: u64,
    pub fingerprint: String,
    pub columns: Vec<ObsColumnInfo>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ObsColumnInfo {
    pub name: String,
    pub kind: String,
    pub arrow_type: String,
    pub n_categories: Option<usize>,
}

#[derive(Clone, Debug, Serialize)]
pub struct VarColumn {
    pub name: String,
    pub arrow_type: String,
    pub is_index: bool,
}

/// Gathers the summary of an open dataset. Reads the manifest's figures, the
/// file listing, obs/schema.json and var.parquet's footer; no tile is read.
pub fn dataset_info(ds: &Dataset) -> Result<DatasetInfo, DatasetError> {
    let m = ds.manifest();
    let storage = ds.storage();
    let bytes_on_disk = if storage.can_list() {
        storage.list_sizes("")?.iter().map(|(_, size)| size).sum()
    } else {
        // A store that cannot list (plain HTTP): the files the manifest names.
        let mut total: u64 = m.tile_bytes.iter().sum::<u64>() + m.obs().map_or(0, |o| o.shard_bytes.iter().sum());
        for key in [format::MANIFEST_KEY, format::GENE_ORDER_KEY, format::VAR_NAMES_KEY, format::VAR_TABLE_KEY] {
            total += storage.size(key)?.unwrap_or(0);
        }
        if m.obs().is_some() {
            total += storage.size(format::OBS_SCHEMA_KEY)?.unwrap_or(0);
        }
        total
    };
    let tile_bytes: u64 = m.tile_bytes.iter().sum();
    let nnz: u64 = m.tile_nnz.iter().sum();
    let obs = match m.obs() {
        None => None,
        Some(o) => {
            let schema = obs::read_schema(storage.as_ref())?.schema;
            Some(ObsInfo {
                shards: o.shard_bytes.len(),
                tiles_per_file: o.tiles_per_file,
                fingerprint: o.fingerprint.to_string(),
                columns: schema
                    .columns
                    .iter()
                    .map(|c| ObsColumnInfo {
                        name: c.name.clone(),
                        kind: c.kind.as_str().to_string(),
                        arrow_type: c.arrow_type.clone(),
                        n_categories: c.categories.as_ref().map(Vec::len),
                    })
                    .collect(),
            })
        }
    };
    let var_columns = if m.has_var_table {
        let key = format::VAR_TABLE_KEY;
        let location = storage.location(key);
        let bytes = storage.get(key)?.ok_or_else(|| DatasetError::Missing {
            location: location.clone(),
            what: "has_var_table is true".into(),
        })?;
        let (columns, index) =
            obs::parquet_columns(bytes).map_err(|e| DatasetError::Unreadable { location, source: Box::new(e) })?;
        Some(
            columns
                .into_iter()
                .map(|(name, arrow_type)| VarColumn { is_index: index.contains(&name), name, arrow_type })
                .collect(),
        )
    } else {
        None
    };
    Ok(DatasetInfo {
        dataset: storage.location(""),
        version: m.version,
        n_cells: m.n_cells,
        n_genes: m.n_genes,
        n_tiles: m.n_tiles(),
        tile_size: m.tile_size,
        nnz,
        tile_bytes,
        bytes_on_disk,
        bytes_per_nonzero: if nnz == 0 { 0.0 } else { tile_bytes as f64 / nnz as f64 },
        n_chunks: m.n_chunks,
        zstd_level: m.zstd_level,
        has_gene_order: m.has_gene_order,
        has_var_names: m.has_var_names,
        has_var_table: m.has_var_table,
        has_obs: m.has_obs,
        obs,
        var_columns,
        metadata: m.metadata.clone(),
    })
}
