//! Obs shards: Parquet files of per-cell metadata beside the tiles, one row group
//! per tile (format.md, "Obs"). This module checks shards against the schema and
//! the manifest; it knows the Parquet side, `format::obs_schema` the JSON side.

use arrow_array::{Array, ArrayRef, Int16Array, Int32Array, Int64Array, Int8Array};
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;

use crate::causes::Whole;
use crate::dataset::DatasetError;
use crate::format::obs_schema::{ObsKind, ObsSchema, ObsSchemaError};
use crate::format::var_table::pandas_index_columns;
use crate::storage::Storage;

pub mod localize;

/// The Arrow types obs may use, under their pyarrow names (decisions.md 15):
/// the one table both directions are read from.
const ARROW_TYPES: [(&str, DataType); 12] = [
    ("int8", DataType::Int8),
    ("int16", DataType::Int16),
    ("int32", DataType::Int32),
    ("int64", DataType::Int64),
    ("uint8", DataType::UInt8),
    ("uint16", DataType::UInt16),
    ("uint32", DataType::UInt32),
    ("uint64", DataType::UInt64),
    ("float", DataType::Float32),
    ("double", DataType::Float64),
    ("bool", DataType::Boolean),
    ("string", DataType::Utf8),
];

/// The pyarrow name of an Arrow type, if it is one obs may use.
pub fn arrow_type_name(dt: &DataType) -> Option<&'static str> {
    ARROW_TYPES.iter().find(|(_, t)| t == dt).map(|(name, _)| *name)
}

/// The Arrow type of an obs/schema.json type name (the inverse of [`arrow_type_name`]).
pub fn arrow_type_from_name(name: &str) -> Option<DataType> {
    ARROW_TYPES.iter().find(|(n, _)| *n == name).map(|(_, t)| t.clone())
}

/// A dataset's obs/schema.json: its exact text (which the obs fingerprint
/// hashes) and what it says.
pub struct StoredSchema {
    /// The file's text, as the fingerprint hashes it.
    pub text: String,
    /// What it says, checked.
    pub schema: ObsSchema,
}

/// Reads and checks a dataset's obs/schema.json.
pub fn read_schema(storage: &dyn Storage) -> Result<StoredSchema, DatasetError> {
    let key = crate::format::OBS_SCHEMA_KEY;
    let location = storage.location(key);
    let bytes = storage.get(key)?.ok_or_else(|| DatasetError::Missing {
        location: location.clone(),
        what: "the manifest says the dataset has obs".into(),
    })?;
    let text = String::from_utf8(bytes.to_vec())
        .map_err(|e| DatasetError::Invalid { location: location.clone(), message: format!("not UTF-8: {e}") })?;
    let schema = ObsSchema::parse(text.as_bytes()).map_err(|e| match e {
        ObsSchemaError::Rule(message) => DatasetError::Invalid { location, message },
        e => DatasetError::Unreadable { location, source: Box::new(e) },
    })?;
    Ok(StoredSchema { text, schema })
}

/// Checks one shard's Parquet content: row groups (one per tile, each with that
/// tile's cells), column names and Arrow types against the schema, and category
/// codes within their vocabulary. Returns (rule, message) for each problem.
pub(crate) fn check_shard(bytes: Bytes, schema: &ObsSchema, tile_cells: &[u64]) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    let builder = match ParquetRecordBatchReaderBuilder::try_new(bytes) {
        Ok(b) => b,
        Err(e) => return vec![("obs-parquet", format!("not a readable Parquet file: {e}"))],
    };
    let meta = builder.metadata().clone();
    if meta.num_row_groups() != tile_cells.len() {
        problems.push((
            "obs-row-groups",
            format!("has {} row groups, expected one per tile: {}", meta.num_row_groups(), tile_cells.len()),
        ));
    } else {
        for (i, (rg, &cells)) in meta.row_groups().iter().zip(tile_cells).enumerate() {
            if rg.num_rows() as u64 != cells {
                problems.push((
                    "obs-row-groups",
                    format!("row group {i} has {} rows, its tile has {cells} cells", rg.num_rows()),
                ));
            }
        }
    }
    let arrow_schema = builder.schema().clone();
    let names: Vec<&str> = arrow_schema.fields().iter().map(|f| f.name().as_str()).collect();
    let want: Vec<&str> = schema.columns.iter().map(|c| c.name.as_str()).collect();
    if names != want {
        problems.push(("obs-columns", format!("columns are {names:?}, the schema says {want:?}")));
        return problems;
    }
    let mut category_columns = Vec::new();
    for (i, (field, col)) in arrow_schema.fields().iter().zip(&schema.columns).enumerate() {
        let have = arrow_type_name(field.data_type());
        let type_ok = match col.kind {
            // decisions.md 16: any signed integer type that holds the codes
            ObsKind::Category => matches!(have, Some("int8" | "int16" | "int32" | "int64")),
            _ => have == Some(col.arrow_type.as_str()),
        };
        if !type_ok {
            problems.push((
                "obs-types",
                format!("column {:?} is {}, the schema says {}", col.name, field.data_type(), col.arrow_type),
            ));
        } else if col.kind == ObsKind::Category {
            category_columns.push(i);
        }
    }
    if category_columns.is_empty() {
        return problems;
    }
    let mask = ProjectionMask::roots(builder.parquet_schema(), category_columns.iter().copied());
    let reader = match builder.with_projection(mask).build() {
        Ok(r) => r,
        Err(e) => {
            problems.push(("obs-parquet", format!("cannot read category columns: {e}")));
            return problems;
        }
    };
    let mut row = 0u64;
    for batch in reader {
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                problems.push(("obs-parquet", format!("cannot read category columns at row {row}: {e}")));
                return problems;
            }
        };
        for (array, &i) in batch.columns().iter().zip(&category_columns) {
            let col = &schema.columns[i];
            let n_categories = col.categories.as_ref().map_or(0, Vec::len) as i64;
            if let Some((r, code)) = first_bad_code(array, n_categories) {
                problems.push((
                    "obs-codes",
                    format!(
                        "column {:?}, row {}: code {code} outside -1..{} (it has {n_categories} categories)",
                        col.name,
                        row + r as u64,
                        n_categories
                    ),
                ));
            }
        }
        row += batch.num_rows() as u64;
    }
    problems
}

fn first_bad_code(array: &ArrayRef, n_categories: i64) -> Option<(usize, i64)> {
    fn scan<T: Into<i64> + Copy>(values: impl Iterator<Item = Option<T>>, n: i64) -> Option<(usize, i64)> {
        values.enumerate().find_map(|(i, v)| {
            let v: i64 = v?.into();
            (v < -1 || v >= n).then_some((i, v))
        })
    }
    let any = array.as_any();
    if let Some(a) = any.downcast_ref::<Int8Array>() {
        scan(a.iter(), n_categories)
    } else if let Some(a) = any.downcast_ref::<Int16Array>() {
        scan(a.iter(), n_categories)
    } else if let Some(a) = any.downcast_ref::<Int32Array>() {
        scan(a.iter(), n_categories)
    } else {
        array.as_any().downcast_ref::<Int64Array>().and_then(|a| scan(a.iter(), n_categories))
    }
}

/// The row groups of an obs shard (one per tile), each read as one batch
/// only when asked for: an append that rewrites a shard of many tiles holds
/// one tile's rows at a time, not the shard's.
#[cfg_attr(not(feature = "convert"), allow(dead_code))] // append restates them
pub(crate) struct RowGroups {
    bytes: Bytes,
    meta: parquet::arrow::arrow_reader::ArrowReaderMetadata,
}

#[cfg_attr(not(feature = "convert"), allow(dead_code))]
impl RowGroups {
    /// Reads the footer of the shard `bytes`.
    pub(crate) fn open(bytes: Bytes) -> Result<Self, UnreadableParquet> {
        // (the pages' encoding statistics kept whole, not as a mask: a row
        // group copied as it is keeps its footer's record of them, so that
        // the new shard is the one a conversion writes, byte for byte)
        let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new().with_encoding_stats_as_mask(false);
        let meta = parquet::arrow::arrow_reader::ArrowReaderMetadata::load(&bytes, options)
            .map_err(|e| UnreadableParquet(Whole(e)))?;
        Ok(RowGroups { bytes, meta })
    }

    /// The number of row groups.
    pub(crate) fn len(&self) -> usize {
        self.meta.metadata().num_row_groups()
    }

    /// The Arrow schema the rows are read in.
    pub(crate) fn arrow_schema(&self) -> &arrow_schema::SchemaRef {
        self.meta.schema()
    }

    /// The file's bytes and row group `g`'s metadata (None past the last).
    pub(crate) fn encoded(&self, g: usize) -> Option<(&Bytes, &parquet::file::metadata::RowGroupMetaData)> {
        (g < self.len()).then(|| (&self.bytes, self.meta.metadata().row_group(g)))
    }

    /// Row group `g`'s rows, as one batch.
    pub(crate) fn get(&self, g: usize) -> Result<arrow_array::RecordBatch, RowGroupError> {
        if g >= self.len() {
            return Err(RowGroupError::Missing { group: g, len: self.len() });
        }
        // (read in batches of at most 64 Ki rows whatever the footer claims,
        // then joined: a row count is not trusted to size a buffer)
        let rows = self.meta.metadata().row_group(g).num_rows().clamp(1, 1 << 16) as usize;
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(self.bytes.clone(), self.meta.clone())
            .with_row_groups(vec![g])
            .with_batch_size(rows)
            .build()
            .map_err(|e| RowGroupError::Parquet { group: g, source: Whole(e) })?;
        let arrow = |e| RowGroupError::Arrow { group: g, source: Whole(e) };
        let batches = reader.collect::<Result<Vec<_>, _>>().map_err(arrow)?;
        arrow_select::concat::concat_batches(self.meta.schema(), &batches).map_err(arrow)
    }
}

/// Why a row group of an obs shard could not be read: not in the file, or
/// the parquet crate's or Arrow's error (kept whole: its text can hold its
/// own cause's).
#[derive(Debug, thiserror::Error)]
pub enum RowGroupError {
    #[error("row group {group}: the file has {len}")]
    Missing { group: usize, len: usize },
    #[error("row group {group}")]
    Parquet { group: usize, source: Whole<parquet::errors::ParquetError> },
    #[error("row group {group}")]
    Arrow { group: usize, source: Whole<arrow_schema::ArrowError> },
}

/// A Parquet file whose footer the parquet crate could not read (its error,
/// kept whole: its text can hold its own cause's).
#[derive(Debug, thiserror::Error)]
#[error("not a readable Parquet file")]
pub struct UnreadableParquet(#[source] pub Whole<parquet::errors::ParquetError>);

/// The number of rows of a Parquet file, from its footer.
pub(crate) fn parquet_rows(bytes: Bytes) -> Result<u64, UnreadableParquet> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| UnreadableParquet(Whole(e)))?;
    Ok(builder.metadata().file_metadata().num_rows() as u64)
}

/// A Parquet file's columns as (name, Arrow type name), and the names of the
/// columns that its pandas metadata marks as the index.
pub type ParquetColumns = (Vec<(String, String)>, Vec<String>);

/// The columns of a Parquet file, from its footer.
pub(crate) fn parquet_columns(bytes: Bytes) -> Result<ParquetColumns, UnreadableParquet> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| UnreadableParquet(Whole(e)))?;
    let schema = builder.schema();
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            (f.name().clone(), arrow_type_name(f.data_type()).map_or_else(|| f.data_type().to_string(), str::to_string))
        })
        .collect();
    let index = pandas_index_columns(schema);
    Ok((columns, index))
}
