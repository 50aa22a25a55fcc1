//! Reading var.parquet, the gene table: the index pandas marks in its
//! metadata, and any column as text (the keys a gene vocabulary is matched
//! against).

use arrow_array::cast::AsArray;
use arrow_array::types::{Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// The index columns that the "pandas" schema metadata of a Parquet file names.
pub(crate) fn pandas_index_columns(schema: &arrow_schema::Schema) -> Vec<String> {
    schema
        .metadata()
        .get("pandas")
        .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
        .and_then(|v| v.get("index_columns").and_then(|c| c.as_array()).cloned())
        .map(|cols| cols.iter().filter_map(|c| c.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Why a column of the gene table could not be read as text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TextColumnError {
    /// The table has no such column (a name the caller gave).
    #[error("var has no column {name:?}; it has {have:?}")]
    NoColumn { name: String, have: Vec<String> },
    /// The file or the column breaks a rule.
    #[error("{0}")]
    Invalid(String),
}

impl From<String> for TextColumnError {
    fn from(message: String) -> Self {
        TextColumnError::Invalid(message)
    }
}

impl From<&str> for TextColumnError {
    fn from(message: &str) -> Self {
        TextColumnError::Invalid(message.to_string())
    }
}

/// Column `column` of the gene table in `bytes` (None: its pandas index) as
/// text, one value per gene (`n_genes` rows expected). Strings, categories
/// of strings and integers are read; a missing value is the empty string.
pub fn text_column(bytes: Bytes, column: Option<&str>, n_genes: u64) -> Result<Vec<String>, TextColumnError> {
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| format!("not a readable Parquet file: {e}"))?;
    let schema = builder.schema().clone();
    let name = match column {
        Some(c) => c.to_string(),
        None => pandas_index_columns(&schema)
            .into_iter()
            .next()
            .ok_or("no gene names: var.parquet has no index column in its pandas metadata")?,
    };
    let Some(at) = schema.fields().iter().position(|f| *f.name() == name) else {
        let have: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        return Err(TextColumnError::NoColumn { name, have });
    };
    let mask = parquet::arrow::ProjectionMask::roots(builder.parquet_schema(), [at]);
    let reader = builder.with_projection(mask).build().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| format!("column {name:?}: {e}"))?;
        append_text(batch.column(0), &mut out).map_err(|e| format!("column {name:?}: {e}"))?;
        if out.len() as u64 > n_genes {
            break;
        }
    }
    if out.len() as u64 != n_genes {
        return Err(format!("column {name:?} has {} values, expected n_genes {n_genes}", out.len()).into());
    }
    Ok(out)
}

/// The values of `array` as text, appended to `out`.
fn append_text(array: &ArrayRef, out: &mut Vec<String>) -> Result<(), String> {
    macro_rules! ints {
        ($($t:ty),*) => {
            match array.data_type() {
                $(dt if dt == &<$t as arrow_array::types::ArrowPrimitiveType>::DATA_TYPE => {
                    let a = array.as_primitive::<$t>();
                    out.extend((0..a.len()).map(|i| if a.is_null(i) { String::new() } else { a.value(i).to_string() }));
                    return Ok(());
                })*
                _ => {}
            }
        };
    }
    ints!(Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type);
    match array.data_type() {
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            out.extend((0..a.len()).map(|i| if a.is_null(i) { "" } else { a.value(i) }.to_string()));
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            out.extend((0..a.len()).map(|i| if a.is_null(i) { "" } else { a.value(i) }.to_string()));
        }
        DataType::Utf8View => {
            let a = array.as_string_view();
            out.extend((0..a.len()).map(|i| if a.is_null(i) { "" } else { a.value(i) }.to_string()));
        }
        DataType::Dictionary(key, _) if **key == DataType::Int32 => {
            let d = array.as_dictionary::<Int32Type>();
            let mut values = Vec::new();
            append_text(d.values(), &mut values)?;
            for k in d.keys().iter() {
                let text = k.and_then(|k| usize::try_from(k).ok()).and_then(|k| values.get(k));
                out.push(text.cloned().unwrap_or_default());
            }
        }
        other => return Err(format!("values of type {other} are not gene names (strings or integers)")),
    }
    Ok(())
}
