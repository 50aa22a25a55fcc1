//! The dataset's small files: manifest.json (and why it is missing), the
//! gene order, the gene names and the gene table.

use crate::format::{self, npy, Manifest};
use crate::storage::Storage;

use super::{Dataset, DatasetError};

impl Dataset {
    fn flagged_file(&self, key: &str, flag: &str) -> Result<(String, bytes::Bytes), DatasetError> {
        let location = self.storage.location(key);
        match self.storage.get(key)? {
            Some(bytes) => Ok((location, bytes)),
            None => Err(DatasetError::Missing { location, what: format!("{flag} is true") }),
        }
    }

    /// gene_order.npy, when the dataset has it: `gene_order[j]` is the source
    /// column stored as column j.
    pub fn gene_order(&self) -> Result<Option<Vec<i32>>, DatasetError> {
        if !self.manifest.has_gene_order {
            return Ok(None);
        }
        let (location, bytes) = self.flagged_file(format::GENE_ORDER_KEY, "has_gene_order")?;
        let order = npy::read_i32(&bytes)
            .map_err(|e| DatasetError::Invalid { location: location.clone(), message: e.to_string() })?;
        npy::check_permutation(&order, self.manifest.n_genes)
            .map_err(|message| DatasetError::Invalid { location, message })?;
        Ok(Some(order))
    }

    /// The genes in stored column order as a vocabulary matches them: the
    /// gene names (var_names.txt, else var.parquet's index), or var.parquet's
    /// column `column` as text. Errors name the dataset and what it lacks.
    pub fn gene_keys(&self, column: Option<&str>) -> Result<Vec<String>, DatasetError> {
        let location = self.storage.location("");
        if column.is_none() {
            if let Some(names) = self.var_names()? {
                return Ok(names);
            }
        }
        if !self.manifest.has_var_table {
            let what = match column {
                None => "no gene names (no var_names.txt or var.parquet) to match genes against".to_string(),
                Some(c) => format!("no var table (var.parquet) with a column {c:?} to match genes against"),
            };
            return Err(DatasetError::Invalid { location, message: what });
        }
        let (location, bytes) = self.flagged_file(format::VAR_TABLE_KEY, "has_var_table")?;
        crate::format::var_table::text_column(bytes, column, self.manifest.n_genes).map_err(|e| match e {
            crate::format::var_table::TextColumnError::NoColumn { name, have } => {
                DatasetError::NoVarColumn { location, name, have }
            }
            crate::format::var_table::TextColumnError::Invalid(message) => DatasetError::Invalid { location, message },
        })
    }

    /// var_names.txt, when the dataset has it: gene names in column order.
    pub fn var_names(&self) -> Result<Option<Vec<String>>, DatasetError> {
        if !self.manifest.has_var_names {
            return Ok(None);
        }
        let (location, bytes) = self.flagged_file(format::VAR_NAMES_KEY, "has_var_names")?;
        parse_var_names(&bytes, self.manifest.n_genes)
            .map(Some)
            .map_err(|e| DatasetError::Unreadable { location, source: Box::new(e) })
    }
}

/// Reads and checks manifest.json.
pub fn read_manifest(storage: &dyn Storage) -> Result<Manifest, DatasetError> {
    read_manifest_bytes(storage).map(|(manifest, _)| manifest)
}

/// Reads and checks manifest.json; with the bytes read.
pub(super) fn read_manifest_bytes(storage: &dyn Storage) -> Result<(Manifest, bytes::Bytes), DatasetError> {
    let key = format::MANIFEST_KEY;
    let bytes = storage.get(key)?.ok_or_else(|| no_manifest(storage))?;
    let manifest = Manifest::parse_checked(&bytes)
        .map_err(|source| DatasetError::Manifest { location: storage.location(key), source })?;
    Ok((manifest, bytes))
}

/// Why there is no manifest: nothing at all there (or, in a store, no such
/// bucket: the listing's error says so), or an incomplete dataset.
pub(crate) fn no_manifest(storage: &dyn Storage) -> DatasetError {
    let location = storage.location("");
    if !storage.can_list() {
        // A plain HTTP server cannot list: look for the files a dataset (or an
        // unfinished conversion) holds besides its manifest.
        let probes = [PLAN_KEY, APPEND_KEY, format::GENE_ORDER_KEY, format::VAR_NAMES_KEY, &format::tile_key(0)];
        return match probes.iter().map(|k| storage.size(k).map(|s| (k, s))).find(|r| !matches!(r, Ok((_, None)))) {
            Some(Err(e)) => DatasetError::Storage(e),
            Some(Ok((&k, _))) if k == PLAN_KEY => DatasetError::Unfinished { location },
            Some(Ok((&k, _))) if k == APPEND_KEY => DatasetError::AppendUnfinished { location },
            Some(Ok(_)) => DatasetError::Incomplete { location },
            None => DatasetError::Nothing { location },
        };
    }
    match storage.list("") {
        Err(e) => DatasetError::Storage(e),
        Ok(keys) if keys.is_empty() => DatasetError::Nothing { location },
        Ok(keys) if keys.iter().any(|k| k == PLAN_KEY) => DatasetError::Unfinished { location },
        Ok(keys) if keys.iter().any(|k| k == APPEND_KEY) => DatasetError::AppendUnfinished { location },
        Ok(_) => DatasetError::Incomplete { location },
    }
}

/// Where a conversion keeps its plan until the manifest is written
/// (`convert::plan`).
pub(crate) const PLAN_KEY: &str = ".plan/plan.json";

/// The record of an append, until it is complete (`convert::append`).
pub(crate) const APPEND_KEY: &str = ".append/append.json";

/// Cumulative sums: `limits[i]` is the first cell after tile i.
pub(crate) fn cumulative(tile_cells: &[u64]) -> Vec<u64> {
    tile_cells
        .iter()
        .scan(0u64, |acc, &c| {
            *acc += c;
            Some(*acc)
        })
        .collect()
}

/// Why var_names.txt is not what the format says.
#[derive(Debug, thiserror::Error)]
pub enum VarNamesError {
    #[error("not UTF-8")]
    NotUtf8(#[source] std::str::Utf8Error),
    #[error("the last line does not end in a newline")]
    NoLastNewline,
    #[error("has {lines} lines, expected n_genes {n_genes}")]
    Lines { lines: usize, n_genes: u64 },
}

/// var_names.txt: UTF-8, one name per line, every line ending in "\n"
/// (decisions.md 13).
pub(crate) fn parse_var_names(bytes: &[u8], n_genes: u64) -> Result<Vec<String>, VarNamesError> {
    let text = std::str::from_utf8(bytes).map_err(VarNamesError::NotUtf8)?;
    if !text.is_empty() && !text.ends_with('\n') {
        return Err(VarNamesError::NoLastNewline);
    }
    let names: Vec<String> = text.split_terminator('\n').map(str::to_string).collect();
    if names.len() as u64 != n_genes {
        return Err(VarNamesError::Lines { lines: names.len(), n_genes });
    }
    Ok(names)
}
