//! Exporting a dataset as an AnnData `.h5ad` file: its obs and var as the
//! tables of the file, so that `export` gives back what was converted: every
//! obs column (categoricals with their whole vocabulary) with the cell names
//! as the index, and the gene table of var.parquet with its index; and the
//! writer of the file ([`h5ad`]). Reading `.h5ad` files as inputs is
//! [`crate::inputs::h5ad`]'s, not this module's.

pub mod h5ad;

use std::ops::Range;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray, UInt32Array,
};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;

use crate::format::obs_schema::ObsKind;
use crate::obs::localize::{ObsError, ObsSource};
use crate::{format, Dataset, DatasetError};
use h5ad::{Table, TableColumn};

/// Why a dataset's obs or var could not be made into tables.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The obs could not be read.
    #[error(transparent)]
    Obs(#[from] ObsError),
    /// The dataset could not be read.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// A table is not what the format allows.
    #[error("{location}: {message}")]
    Invalid { location: String, message: String },
}

/// A vocabulary (JSON values of one type) as an Arrow array.
fn categories_array(values: &[Value]) -> ArrayRef {
    if values.iter().all(Value::is_string) {
        Arc::new(values.iter().map(|v| v.as_str()).collect::<StringArray>())
    } else if values.iter().all(Value::is_boolean) {
        Arc::new(values.iter().map(Value::as_bool).collect::<BooleanArray>())
    } else if values.iter().all(|v| v.is_i64()) {
        Arc::new(values.iter().map(Value::as_i64).collect::<Int64Array>())
    } else {
        Arc::new(values.iter().map(Value::as_f64).collect::<Float64Array>())
    }
}

/// The cells `range` of every obs column: obs_names as the index (the cell
/// indices when there is none), the others as columns. None without obs.
pub fn obs_table(ds: &Dataset, range: Range<u64>) -> Result<Option<Table>, ExportError> {
    if ds.manifest().obs().is_none() {
        return Ok(None);
    }
    let source = ObsSource::open(ds.storage().as_ref(), ds.manifest())?;
    let location = ds.storage().location(format::OBS_SCHEMA_KEY);
    let mut table = Table {
        index_name: "_index".into(),
        index: range.clone().map(|c| c.to_string()).collect(),
        columns: Vec::new(),
    };
    // Only the tiles the range is in: their row groups of each column.
    let tile_cells = &ds.manifest().tile_cells;
    let (mut first_tile, mut skipped) = (0, 0u64);
    while first_tile < tile_cells.len() && skipped + tile_cells[first_tile] <= range.start {
        skipped += tile_cells[first_tile];
        first_tile += 1;
    }
    let (mut end_tile, mut reached) = (first_tile, skipped);
    while end_tile < tile_cells.len() && reached < range.end {
        reached += tile_cells[end_tile];
        end_tile += 1;
    }
    let range_in = (range.start - skipped)..(range.end - skipped);
    for (i, column) in source.schema.columns.iter().enumerate() {
        let (batches, _, _) = source.fetch_column_of(i, first_tile..end_tile)?;
        let parts: Vec<&dyn Array> = batches.iter().map(|b| b.column(0).as_ref()).collect();
        let whole = arrow_select::concat::concat(&parts).map_err(|e| ExportError::Invalid {
            location: location.clone(),
            message: format!("obs column {:?}: {e}", column.name),
        })?;
        if (whole.len() as u64) < range_in.end {
            return Err(ExportError::Invalid {
                location: location.clone(),
                message: format!("obs column {:?} holds fewer cells than its tiles", column.name),
            });
        }
        let values = whole.slice(range_in.start as usize, (range_in.end - range_in.start) as usize);
        if column.name == "obs_names" {
            let names = values.as_string_opt::<i32>().ok_or_else(|| ExportError::Invalid {
                location: location.clone(),
                message: "obs_names is not a string column".into(),
            })?;
            table.index = (0..names.len()).map(|r| names.value(r).to_string()).collect();
            continue;
        }
        let categories = match column.kind {
            ObsKind::Category => Some(categories_array(column.categories.as_deref().unwrap_or_default())),
            _ => None,
        };
        table.columns.push((column.name.clone(), TableColumn { values, categories }));
    }
    Ok(Some(table))
}

/// Where each cell of an obs table (of a shuffled dataset) was read, as
/// its rank in the inputs' order: cells sorted by input (the code of
/// `source_file`, the inputs in the order given) and row (`source_row`).
/// Also returns the table without those two columns. An error names what is
/// missing when the dataset was not shuffled.
pub fn source_ranks(table: &Table) -> Result<(Vec<u64>, Table), String> {
    use crate::convert::obs_merge::{numeric_as_i64, SOURCE_FILE, SOURCE_ROW};
    let find = |name: &str| table.columns.iter().find(|(n, _)| n == name).map(|(_, c)| &c.values);
    let (Some(file), Some(row)) = (find(SOURCE_FILE), find(SOURCE_ROW)) else {
        return Err(format!(
            "obs has no {SOURCE_FILE} and {SOURCE_ROW} columns: the dataset was not converted with --shuffle, \
             its cells are in the inputs' order already"
        ));
    };
    let ints = |a: &ArrayRef| numeric_as_i64(a).map(|v| v.into_iter().map(|x| x.unwrap_or(-1)).collect::<Vec<i64>>());
    let file = ints(file).ok_or_else(|| format!("obs column {SOURCE_FILE} is not integer codes"))?;
    let row = ints(row).ok_or_else(|| format!("obs column {SOURCE_ROW} is not integers"))?;
    let mut cells: Vec<u32> = (0..file.len() as u32).collect();
    cells.sort_by_key(|&c| (file[c as usize], row[c as usize]));
    let mut ranks = vec![0u64; cells.len()];
    for (rank, &c) in cells.iter().enumerate() {
        ranks[c as usize] = rank as u64;
    }
    let rest = Table {
        index_name: table.index_name.clone(),
        index: cells.iter().map(|&c| table.index[c as usize].clone()).collect(),
        columns: table
            .columns
            .iter()
            .filter(|(n, _)| n != SOURCE_FILE && n != SOURCE_ROW)
            .map(|(n, c)| {
                let values = arrow_select::take::take(c.values.as_ref(), &UInt32Array::from(cells.clone()), None)
                    .map_err(|e| format!("obs column {n:?}: {e}"))?;
                Ok((n.clone(), TableColumn { values, categories: c.categories.clone() }))
            })
            .collect::<Result<_, String>>()?,
    };
    Ok((ranks, rest))
}

/// The gene table of var.parquet (None without one), rows in stored order, or,
/// with `order` (gene_order.npy), in the source files' order.
pub fn var_table(ds: &Dataset, order: Option<&[i32]>) -> Result<Option<Table>, ExportError> {
    if !ds.manifest().has_var_table {
        return Ok(None);
    }
    let storage = ds.storage();
    let location = storage.location(format::VAR_TABLE_KEY);
    let invalid = |message: String| ExportError::Invalid { location: location.clone(), message };
    let bytes = storage
        .get(format::VAR_TABLE_KEY)
        .map_err(DatasetError::from)?
        .ok_or_else(|| DatasetError::Missing { location: location.clone(), what: "has_var_table is true".into() })?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| invalid(e.to_string()))?;
    let schema = reader.schema().clone();
    let index_field = crate::format::var_table::pandas_index_columns(&schema).into_iter().next();
    let batches: Vec<RecordBatch> = reader
        .build()
        .map_err(|e| invalid(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(e.to_string()))?;
    let mut batch = arrow_select::concat::concat_batches(&schema, &batches).map_err(|e| invalid(e.to_string()))?;
    if let Some(order) = order {
        // source row g is stored row j where order[j] = g
        let mut stored_row = vec![0u32; order.len()];
        for (j, &g) in order.iter().enumerate() {
            stored_row[g as usize] = j as u32;
        }
        let rows = UInt32Array::from(stored_row);
        let columns = batch
            .columns()
            .iter()
            .map(|c| arrow_select::take::take(c.as_ref(), &rows, None))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(e.to_string()))?;
        batch = RecordBatch::try_new(schema.clone(), columns).map_err(|e| invalid(e.to_string()))?;
    }
    let mut table = Table { index_name: "_index".into(), index: Vec::new(), columns: Vec::new() };
    for (field, array) in schema.fields().iter().zip(batch.columns()) {
        if Some(field.name()) == index_field.as_ref() {
            let names = array.as_string_opt::<i32>().ok_or_else(|| invalid("the index is not strings".into()))?;
            table.index = (0..names.len()).map(|r| names.value(r).to_string()).collect();
            // pyarrow's name for an unnamed index is anndata's "_index"
            if field.name() != "__index_level_0__" {
                table.index_name = field.name().clone();
            }
            continue;
        }
        let column = match array.data_type() {
            DataType::Dictionary(..) => {
                let dict = array.as_dictionary_opt::<Int32Type>().ok_or_else(|| {
                    invalid(format!("column {:?}: a dictionary with keys other than int32", field.name()))
                })?;
                let codes: Int32Array = dict.keys().iter().map(|k| Some(k.unwrap_or(-1))).collect();
                TableColumn { values: Arc::new(codes), categories: Some(dict.values().clone()) }
            }
            _ => TableColumn { values: array.clone(), categories: None },
        };
        table.columns.push((field.name().clone(), column));
    }
    Ok(Some(table))
}
