//! var.parquet: the gene table of the first input, rows in output column order,
//! with the "pandas" metadata that makes `pandas.read_parquet` restore the index
//! and its name (decisions.md 14).

use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, BooleanArray, DictionaryArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    UInt32Array,
};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde_json::{json, Value};

use crate::inputs::{Categories, FrameColumn, InputError, Table};

/// The name pyarrow gives an unnamed pandas index.
const UNNAMED_INDEX: &str = "__index_level_0__";

fn pandas_type(dt: &DataType) -> (&'static str, &'static str) {
    match dt {
        DataType::Utf8 => ("unicode", "object"),
        DataType::Boolean => ("bool", "bool"),
        DataType::Int8 => ("int8", "int8"),
        DataType::Int16 => ("int16", "int16"),
        DataType::Int32 => ("int32", "int32"),
        DataType::Int64 => ("int64", "int64"),
        DataType::UInt8 => ("uint8", "uint8"),
        DataType::UInt16 => ("uint16", "uint16"),
        DataType::UInt32 => ("uint32", "uint32"),
        DataType::UInt64 => ("uint64", "uint64"),
        DataType::Float32 => ("float32", "float32"),
        DataType::Float64 => ("float64", "float64"),
        DataType::Dictionary(..) => ("categorical", "int32"),
        _ => ("object", "object"),
    }
}

/// One column's rows taken in `rows` (None: a null), as Arrow.
fn to_arrow(column: &FrameColumn, rows: &[Option<u32>]) -> Result<ArrayRef, String> {
    let take = |a: &ArrayRef| {
        arrow_select::take::take(a.as_ref(), &rows.iter().copied().collect::<UInt32Array>(), None)
            .map_err(|e| e.to_string())
    };
    Ok(match column {
        FrameColumn::Numeric(a) => take(a)?,
        FrameColumn::Bool(v) => Arc::new(rows.iter().map(|i| i.and_then(|i| v[i as usize])).collect::<BooleanArray>()),
        FrameColumn::String(v) => {
            Arc::new(rows.iter().map(|i| i.and_then(|i| v[i as usize].as_deref())).collect::<StringArray>())
        }
        FrameColumn::Category { codes, categories, .. } => {
            let keys: Int32Array = rows.iter().map(|i| i.map(|i| codes[i as usize]).filter(|&c| c >= 0)).collect();
            let values: ArrayRef = match categories {
                Categories::Strings(v) => Arc::new(StringArray::from_iter_values(v)),
                Categories::Ints(v) => Arc::new(Int64Array::from(v.clone())),
                Categories::Floats(v) => Arc::new(Float64Array::from(v.clone())),
                Categories::Bools(v) => Arc::new(BooleanArray::from(v.clone())),
            };
            Arc::new(DictionaryArray::<Int32Type>::try_new(keys, values).map_err(|e| e.to_string())?)
        }
    })
}

/// A whole table: its index and every column, in order.
struct Frame {
    index_name: String,
    index: Vec<String>,
    columns: Vec<(String, FrameColumn)>,
}

fn read_frame(table: &dyn Table) -> Result<Frame, InputError> {
    let index = table.index(None)?;
    let mut columns = Vec::new();
    for name in table.columns()? {
        let column = table.column(&name, None, true)?;
        if column.len() != index.len() {
            return Err(table.invalid(
                &format!("{}/{name}", table.name()),
                format!("has {} rows but the index has {}", column.len(), index.len()),
            ));
        }
        columns.push((name, column));
    }
    Ok(Frame { index_name: table.index_name()?, index, columns })
}

/// Builds var.parquet from the gene table `table`: one row per stored gene,
/// named `names[j]`, with the columns of the table's row `rows[j]` (nulls where
/// the input lacks that gene).
pub fn build(table: &dyn Table, rows: &[Option<u32>], names: &[&str]) -> Result<Vec<u8>, InputError> {
    let group = table.name();
    let frame = read_frame(table)?;
    if let Some(&row) = rows.iter().flatten().find(|&&r| r as usize >= frame.index.len()) {
        return Err(table.invalid(group, format!("has {} rows, row {row} was asked for", frame.index.len())));
    }
    let mut fields = Vec::new();
    let mut arrays: Vec<ArrayRef> = Vec::new();
    let mut pandas_columns = Vec::new();
    for (name, column) in &frame.columns {
        let array = to_arrow(column, rows).map_err(|e| table.invalid(&format!("{group}/{name}"), e))?;
        let (pandas, numpy) = pandas_type(array.data_type());
        let metadata = match column {
            FrameColumn::Category { categories, ordered, .. } => {
                json!({"num_categories": categories.len(), "ordered": ordered})
            }
            _ => Value::Null,
        };
        pandas_columns.push(
            json!({"name": name, "field_name": name, "pandas_type": pandas, "numpy_type": numpy, "metadata": metadata}),
        );
        fields.push(Field::new(name, array.data_type().clone(), true));
        arrays.push(array);
    }
    // anndata names an unnamed index "_index"; pandas calls it None.
    let (field_name, index_name) = if frame.index_name == "_index" {
        (UNNAMED_INDEX.to_string(), Value::Null)
    } else {
        (frame.index_name.clone(), Value::String(frame.index_name.clone()))
    };
    let index: ArrayRef = Arc::new(StringArray::from_iter_values(names.iter()));
    pandas_columns.push(json!({"name": index_name, "field_name": field_name, "pandas_type": "unicode", "numpy_type": "object", "metadata": null}));
    fields.push(Field::new(&field_name, DataType::Utf8, false));
    arrays.push(index);
    let pandas = json!({
        "index_columns": [field_name],
        "column_indexes": [{"name": null, "field_name": null, "pandas_type": "unicode", "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
        "columns": pandas_columns,
        "attributes": {},
        "creator": {"library": "deltacells", "version": env!("CARGO_PKG_VERSION")},
        "pandas_version": "2.0.0",
    });
    let schema = Arc::new(Schema::new(fields).with_metadata([("pandas".to_string(), pandas.to_string())]));
    let batch = RecordBatch::try_new(schema.clone(), arrays).map_err(|e| table.invalid(group, e.to_string()))?;
    write_parquet(&batch).map_err(|e| table.invalid(group, format!("writing var.parquet: {e}")))
}

fn write_parquet(batch: &RecordBatch) -> parquet::errors::Result<Vec<u8>> {
    let props = WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?)).build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(props))?;
    writer.write(batch)?;
    writer.close()?;
    Ok(out)
}
