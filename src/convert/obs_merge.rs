//! Merging the obs tables of many inputs into one schema (decisions.md 15-19):
//! the same columns and kinds in every file, one global vocabulary per
//! categorical column (unused categories included, in order of first
//! appearance), a common numeric type, and categorical columns with more than
//! `max_categories` entries stored as strings. Then each block of rows is
//! turned into an Arrow batch of that schema.

pub use super::error::ObsMergeError;
use super::error::{ConvertError, Result};
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BooleanArray, Int16Array, Int32Array, Int64Array, Int8Array, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use serde_json::Value;

use crate::format::obs_schema::{ObsColumn, ObsKind, ObsSchema, SCHEMA_FORMAT, SCHEMA_VERSION};
use crate::inputs;
use crate::inputs::{Categories, FrameColumn, InputError, Table};
use crate::obs::{arrow_type_from_name, arrow_type_name};

mod numeric;
pub(crate) use numeric::numeric_as_i64;
use numeric::{code_type, common_numeric, widen};

/// What convert stores of obs.
#[derive(Clone, Debug)]
pub struct ObsOptions {
    /// Store the cell names as the first column, obs_names.
    pub names: bool,
    /// Columns left out.
    pub exclude: Vec<String>,
    /// A categorical column with more categories than this is stored as strings.
    pub max_categories: usize,
    /// Tiles (row groups) per shard.
    pub tiles_per_file: u64,
}

impl Default for ObsOptions {
    fn default() -> Self {
        ObsOptions { names: true, exclude: Vec::new(), max_categories: 20_000, tiles_per_file: 1000 }
    }
}

/// A column as one file has it (or as a dataset stores it, when appending).
#[derive(Clone, Debug, PartialEq)]
enum Shape {
    /// The vocabulary, each category as its JSON value.
    Category(Vec<Value>),
    /// A categorical column that a dataset stores as strings (its vocabulary
    /// grew past `max_categories`): it takes categorical columns.
    CategoryAsStrings,
    Numeric(DataType),
    Bool,
    String,
}

impl Shape {
    fn kind_name(&self) -> &'static str {
        match self {
            Shape::Category(_) | Shape::CategoryAsStrings => "categorical",
            Shape::Numeric(_) => "numeric",
            Shape::Bool => "bool",
            Shape::String => "string",
        }
    }
}

/// One output column: its kind and type as obs/schema.json has them.
struct PlannedColumn {
    name: String,
    kind: ObsKind,
    data_type: DataType,
    /// For categorical columns: a category's JSON text -> its global code.
    codes: HashMap<String, i32>,
}

/// The merged obs schema and how to build batches of it. Everything a batch
/// needs is in obs/schema.json and the input file itself, so a plan can be
/// rebuilt from the schema by a process that reads only some of the inputs.
pub struct ObsPlan {
    names: bool,
    columns: Vec<PlannedColumn>,
    arrow_schema: SchemaRef,
    schema: ObsSchema,
    /// Categorical columns stored as strings (more than `max_categories`).
    categories_as_strings: Vec<String>,
    /// The schema ends with [`SOURCE_FILE`] and [`SOURCE_ROW`], which say
    /// where each cell was read (a shuffled dataset's).
    source: bool,
}

/// The obs column of a shuffled dataset that names each cell's input file
/// (a category of the inputs' paths, in the order given).
pub const SOURCE_FILE: &str = "source_file";
/// The obs column of a shuffled dataset that holds each cell's row in its
/// input file.
pub const SOURCE_ROW: &str = "source_row";

/// The vocabulary of [`SOURCE_FILE`] when a schema ends with the columns that
/// say where each cell was read (a shuffled dataset's).
pub fn source_files(schema: &ObsSchema) -> Option<Vec<String>> {
    let n = schema.columns.len();
    let [file, row] = schema.columns.get(n.checked_sub(2)?..)? else { return None };
    if (file.name.as_str(), file.kind, row.name.as_str(), row.kind)
        != (SOURCE_FILE, ObsKind::Category, SOURCE_ROW, ObsKind::Numeric)
    {
        return None;
    }
    let values = file.categories.as_ref()?;
    Some(values.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string)).collect())
}

/// A dataset's obs, as an append extends it.
pub struct StoredObs<'a> {
    /// The dataset, for messages.
    pub location: &'a str,
    pub schema: &'a ObsSchema,
    /// Its categorical columns stored as strings (as convert recorded them).
    pub categories_as_strings: &'a [String],
}

/// A stored column whose type an append changes: every obs shard is rewritten.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Restated {
    pub column: String,
    /// "category (int8 codes)", "numeric (int32)".
    pub was: String,
    pub now: String,
}

/// How one input's categorical columns map into the plan, per column: local
/// code -> global code (categorical), or the local categories (stored as strings).
pub struct InputObs {
    /// The input's code in `source_file` (see [`ObsPlan::source_code`]).
    input: usize,
    code_maps: Vec<Option<Vec<i32>>>,
    local_strings: Vec<Option<Vec<String>>>,
}

fn category_value(categories: &Categories, i: usize) -> Value {
    match categories {
        Categories::Strings(v) => Value::String(v[i].clone()),
        Categories::Ints(v) => Value::from(v[i]),
        Categories::Floats(v) => serde_json::Number::from_f64(v[i]).map_or(Value::Null, Value::Number),
        Categories::Bools(v) => Value::Bool(v[i]),
    }
}

fn category_string(categories: &Categories, i: usize) -> String {
    match category_value(categories, i) {
        Value::String(s) => s,
        other => other.to_string(),
    }
}

fn shape_of(column: FrameColumn) -> Shape {
    match column {
        FrameColumn::Category { categories, .. } => {
            Shape::Category((0..categories.len()).map(|i| category_value(&categories, i)).collect())
        }
        FrameColumn::Numeric(a) => Shape::Numeric(a.data_type().clone()),
        FrameColumn::Bool(_) => Shape::Bool,
        FrameColumn::String(_) => Shape::String,
    }
}

impl ObsPlan {
    /// Reads every input's obs columns (their types and vocabularies, not their
    /// values) and merges them. None when no input has an obs table at all.
    pub fn new(
        inputs: &[&Path],
        matrix: &str,
        options: &ObsOptions,
        reach: &inputs::InputOptions,
    ) -> Result<Option<ObsPlan>> {
        merge(None, inputs, matrix, options, reach)
    }

    /// The schema of a dataset's obs extended by more inputs (an append): the
    /// inputs must have the stored columns, of the same kinds; their
    /// categories not in a stored vocabulary are added at its end, so stored
    /// codes keep their meaning. Also returns the stored columns whose type
    /// changes (codes that must widen, a vocabulary past `max_categories`, a
    /// numeric type that must widen): their stored rows must be restated.
    pub fn extend(
        stored: &StoredObs<'_>,
        inputs: &[&Path],
        matrix: &str,
        options: &ObsOptions,
        reach: &inputs::InputOptions,
    ) -> Result<(ObsPlan, Vec<Restated>)> {
        // The columns that say where each cell was read are not the inputs':
        // merged without them, then added back, the new inputs' paths at the
        // end of the stored vocabulary of files.
        let stored_files = source_files(stored.schema);
        let mut without = stored.schema.clone();
        if stored_files.is_some() {
            without.columns.truncate(without.columns.len() - 2);
        }
        let stripped = StoredObs { location: stored.location, schema: &without, ..*stored };
        let mut plan = merge(Some(&stripped), inputs, matrix, options, reach)?
            .ok_or_else(|| ConvertError::invalid(stored.location, "no obs plan from a stored schema"))?;
        if let Some(files) = stored_files {
            let new: Vec<String> = inputs.iter().map(|p| p.display().to_string()).collect();
            plan.add_source_columns_after(&files, &new)?;
        }
        let describe = |c: &ObsColumn| match c.kind {
            ObsKind::Category => format!("categorical ({} codes)", c.arrow_type),
            kind => format!("{} ({})", kind.as_str(), c.arrow_type),
        };
        let restated = stored
            .schema
            .columns
            .iter()
            .zip(&plan.schema.columns)
            .filter(|(old, new)| (old.kind, &old.arrow_type) != (new.kind, &new.arrow_type))
            .map(|(old, new)| Restated { column: old.name.clone(), was: describe(old), now: describe(new) })
            .collect();
        Ok((plan, restated))
    }

    /// The code of [`SOURCE_FILE`] of the file input `file` of `n_files` (the
    /// inputs of this conversion or append, after the files of the appends
    /// before it).
    pub fn source_code(&self, file: usize, n_files: usize) -> usize {
        let known = self.schema.columns.iter().rev().nth(1).and_then(|c| c.categories.as_ref()).map_or(0, Vec::len);
        known.saturating_sub(n_files) + file
    }

    /// The plan of an obs/schema.json; `names` says whether its first column is
    /// the cell names (read from the obs index, not from a column).
    /// With `source`, its last two columns are where each cell was read (a
    /// shuffled dataset's), filled by [`ObsPlan::batch`], not read from obs.
    pub fn from_schema(schema: ObsSchema, names: bool, source: bool) -> Result<ObsPlan, String> {
        if names && schema.columns.first().is_none_or(|c| c.name != "obs_names") {
            return Err("the obs schema does not start with obs_names".into());
        }
        let n = schema.columns.len();
        if source
            && (n < 2
                || (schema.columns[n - 2].name.as_str(), schema.columns[n - 1].name.as_str())
                    != (SOURCE_FILE, SOURCE_ROW))
        {
            return Err(format!("the obs schema of a shuffled dataset does not end with {SOURCE_FILE}, {SOURCE_ROW}"));
        }
        let mut fields = Vec::with_capacity(schema.columns.len());
        let mut columns = Vec::with_capacity(schema.columns.len());
        for (i, c) in schema.columns.iter().enumerate() {
            let data_type = arrow_type_from_name(&c.arrow_type)
                .ok_or_else(|| format!("obs column {:?}: unknown Arrow type {:?}", c.name, c.arrow_type))?;
            fields.push(Field::new(&c.name, data_type.clone(), true));
            if (names && i == 0) || (source && i + 2 >= n) {
                continue;
            }
            let codes = c
                .categories
                .iter()
                .flatten()
                .enumerate()
                .map(|(code, value)| (value.to_string(), code as i32))
                .collect();
            columns.push(PlannedColumn { name: c.name.clone(), kind: c.kind, data_type, codes });
        }
        Ok(ObsPlan {
            names,
            columns,
            arrow_schema: Arc::new(Schema::new(fields)),
            schema,
            categories_as_strings: Vec::new(),
            source,
        })
    }

    /// Adds the columns that say where each cell was read: [`SOURCE_FILE`],
    /// a category of `inputs` (in this order), and [`SOURCE_ROW`], int64.
    pub fn add_source_columns(&mut self, inputs: &[String]) -> Result<(), ObsMergeError> {
        self.add_source_columns_after(&[], inputs)
    }

    /// [`ObsPlan::add_source_columns`] for the inputs of an append to a
    /// dataset whose vocabulary of files is `stored`: theirs follow it (a
    /// path already there is told apart by " #2", " #3", ...).
    pub fn add_source_columns_after(&mut self, stored: &[String], new: &[String]) -> Result<(), ObsMergeError> {
        let mut inputs: Vec<String> = stored.to_vec();
        for path in new {
            let mut name = path.clone();
            let mut k = 1;
            while inputs.contains(&name) {
                k += 1;
                name = format!("{path} #{k}");
            }
            inputs.push(name);
        }
        for name in [SOURCE_FILE, SOURCE_ROW] {
            if self.schema.columns.iter().any(|c| c.name == name) {
                return Err(ObsMergeError::SourceTaken { column: name.into() });
            }
        }
        let codes =
            if inputs.len() <= i16::MAX as usize { ("int16", DataType::Int16) } else { ("int32", DataType::Int32) };
        self.schema.columns.push(ObsColumn {
            name: SOURCE_FILE.into(),
            kind: ObsKind::Category,
            arrow_type: codes.0.into(),
            categories: Some(inputs.iter().map(|p| Value::String(p.clone())).collect()),
        });
        self.schema.columns.push(ObsColumn {
            name: SOURCE_ROW.into(),
            kind: ObsKind::Numeric,
            arrow_type: "int64".into(),
            categories: None,
        });
        let mut fields: Vec<Field> = self.arrow_schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(SOURCE_FILE, codes.1, true));
        fields.push(Field::new(SOURCE_ROW, DataType::Int64, true));
        self.arrow_schema = Arc::new(Schema::new(fields));
        self.source = true;
        Ok(())
    }

    /// Reads an input's categories (from its obs table) and maps them into
    /// the plan's vocabularies.
    /// `input` is the input's code in `source_file`, when the plan has it
    /// ([`ObsPlan::source_code`]).
    pub fn for_input(&self, obs: &dyn Table, input: usize) -> Result<InputObs, InputError> {
        let mut maps = InputObs { input, code_maps: Vec::new(), local_strings: Vec::new() };
        for c in &self.columns {
            let (mut map, mut strings) = (None, None);
            if matches!(c.kind, ObsKind::Category | ObsKind::String) {
                if let FrameColumn::Category { categories, .. } = obs.column(&c.name, Some(&(0..0)), true)? {
                    if c.kind == ObsKind::Category {
                        let mut codes = Vec::with_capacity(categories.len());
                        for i in 0..categories.len() {
                            let value = category_value(&categories, i);
                            let Some(&code) = c.codes.get(&value.to_string()) else {
                                return Err(obs.invalid(
                                    &format!("obs/{}", c.name),
                                    format!("category {value} is not in the planned vocabulary (did the file change after plan?)"),
                                ));
                            };
                            codes.push(code);
                        }
                        map = Some(codes);
                    } else {
                        strings = Some((0..categories.len()).map(|i| category_string(&categories, i)).collect());
                    }
                }
            }
            maps.code_maps.push(map);
            maps.local_strings.push(strings);
        }
        Ok(maps)
    }

    pub fn schema(&self) -> &ObsSchema {
        &self.schema
    }

    /// Categorical columns the merge stored as strings (for the manifest's
    /// record, which an append reads back); empty for a plan read from a schema.
    pub fn categories_as_strings(&self) -> &[String] {
        &self.categories_as_strings
    }

    /// Rows stored under schema `old` (one obs shard's row group) as a batch
    /// of this plan's schema, which [`ObsPlan::extend`] made from `old`: the
    /// same rows convert would write for those cells.
    pub fn restate(&self, old: &ObsSchema, batch: &RecordBatch) -> Result<RecordBatch, String> {
        if old.columns.len() != self.schema.columns.len() || batch.num_columns() != old.columns.len() {
            return Err(format!(
                "{} stored columns, {} in the schema, {} planned",
                batch.num_columns(),
                old.columns.len(),
                self.schema.columns.len()
            ));
        }
        let mut arrays = Vec::with_capacity(old.columns.len());
        for ((was, now), array) in old.columns.iter().zip(&self.schema.columns).zip(batch.columns()) {
            let to = arrow_type_from_name(&now.arrow_type).ok_or("unknown planned type")?;
            let restated: ArrayRef = match (was.kind, now.kind) {
                _ if array.data_type() == &to && was.kind == now.kind => array.clone(),
                (ObsKind::Category, ObsKind::Category) => {
                    let codes = numeric_as_i64(array).ok_or_else(|| format!("obs column {:?}: codes", was.name))?;
                    let codes = codes.into_iter().map(|c| c.unwrap_or(-1));
                    match to {
                        DataType::Int8 => Arc::new(codes.map(|c| c as i8).collect::<Int8Array>()),
                        DataType::Int16 => Arc::new(codes.map(|c| c as i16).collect::<Int16Array>()),
                        DataType::Int32 => Arc::new(codes.map(|c| c as i32).collect::<Int32Array>()),
                        _ => Arc::new(codes.map(Some).collect::<Int64Array>()),
                    }
                }
                (ObsKind::Category, ObsKind::String) => {
                    let codes = numeric_as_i64(array).ok_or_else(|| format!("obs column {:?}: codes", was.name))?;
                    let vocabulary = was.categories.as_deref().unwrap_or_default();
                    let text = |v: &Value| match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    let strings: Vec<Option<String>> = codes
                        .into_iter()
                        .map(|c| c.filter(|&c| c >= 0).and_then(|c| vocabulary.get(c as usize)).map(text))
                        .collect();
                    Arc::new(StringArray::from(strings))
                }
                (ObsKind::Numeric, ObsKind::Numeric) => widen(array.clone(), &to)?,
                (a, b) => {
                    return Err(format!("obs column {:?}: {} cannot become {}", was.name, a.as_str(), b.as_str()))
                }
            };
            arrays.push(restated);
        }
        RecordBatch::try_new(self.arrow_schema.clone(), arrays).map_err(|e| e.to_string())
    }

    pub fn arrow_schema(&self) -> &SchemaRef {
        &self.arrow_schema
    }

    /// The exact text of obs/schema.json.
    ///
    /// # Panics
    ///
    /// Never: a schema holds strings and JSON values, which always serialize.
    pub fn schema_text(&self) -> String {
        let mut text = serde_json::to_string_pretty(&self.schema).expect("a schema serializes");
        text.push('\n');
        text
    }

    /// Rows `rows` of an input's obs table (whose categories `input` maps) as
    /// a batch of the schema.
    pub fn batch(&self, input: &InputObs, obs: &dyn Table, rows: Range<u64>) -> Result<RecordBatch, InputError> {
        let range = rows.start as usize..rows.end as usize;
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.columns.len() + 1);
        if self.names {
            let names = obs.index(Some(range.clone()))?;
            arrays.push(Arc::new(StringArray::from(names)));
        }
        for (k, c) in self.columns.iter().enumerate() {
            let object = format!("obs/{}", c.name);
            let column = obs.column(&c.name, Some(&range), false)?;
            if column.len() != range.len() {
                return Err(
                    obs.invalid(&object, format!("has {} rows where {} were expected", column.len(), range.len()))
                );
            }
            arrays.push(convert_column(c, input, k, column).map_err(|e| obs.invalid(&object, e))?);
        }
        if self.source {
            let n = range.len();
            let code = input.input as i64;
            arrays.push(match self.arrow_schema.field(arrays.len()).data_type() {
                DataType::Int16 => Arc::new(Int16Array::from(vec![code as i16; n])),
                _ => Arc::new(Int32Array::from(vec![code as i32; n])),
            });
            arrays.push(Arc::new(Int64Array::from_iter_values(rows.start as i64..rows.end as i64)));
        }
        RecordBatch::try_new(self.arrow_schema.clone(), arrays).map_err(|e| obs.invalid("obs", e.to_string()))
    }
}

/// The merge of [`ObsPlan::new`] and [`ObsPlan::extend`]: the stored
/// schema, when there is one, comes first, as the first input would.
fn merge(
    stored: Option<&StoredObs<'_>>,
    inputs: &[&Path],
    matrix: &str,
    options: &ObsOptions,
    reach: &inputs::InputOptions,
) -> Result<Option<ObsPlan>> {
    // Who defines the columns (for messages): the dataset, else the first
    // input with obs.
    let mut sources: Vec<String> = Vec::new();
    let mut first: Option<String> = None;
    let mut first_without: Option<usize> = None;
    let mut names: Vec<String> = Vec::new();
    // Every obs column of any input, to check the excluded names against.
    let mut every_name: Vec<String> = Vec::new();
    // per column: per source, its shape
    let mut shapes: HashMap<String, Vec<Shape>> = HashMap::new();
    if let Some(s) = stored {
        let skip = usize::from(options.names);
        for c in s.schema.columns.iter().skip(skip) {
            let shape = match c.kind {
                ObsKind::Category => Shape::Category(c.categories.clone().unwrap_or_default()),
                ObsKind::String if s.categories_as_strings.contains(&c.name) => Shape::CategoryAsStrings,
                ObsKind::String => Shape::String,
                ObsKind::Bool => Shape::Bool,
                ObsKind::Numeric => Shape::Numeric(arrow_type_from_name(&c.arrow_type).unwrap_or(DataType::Float64)),
            };
            names.push(c.name.clone());
            shapes.insert(c.name.clone(), vec![shape]);
        }
        every_name = names.clone();
        first = Some(s.location.to_string());
        sources.push(s.location.to_string());
    }
    // One pass, each file opened once: which inputs have obs, and the
    // columns and shapes of those that do.
    for (i, path) in inputs.iter().enumerate() {
        let source = inputs::open(path, matrix, reach)?;
        let Some(obs) = source.obs()? else {
            first_without.get_or_insert(i);
            continue;
        };
        let all_here = obs.columns()?;
        for n in &all_here {
            if !every_name.contains(n) {
                every_name.push(n.clone());
            }
        }
        let here: Vec<String> = all_here.into_iter().filter(|n| !options.exclude.contains(n)).collect();
        match &first {
            None => {
                first = Some(path.display().to_string());
                names = here.clone();
            }
            Some(first) => {
                if let Some(n) = names.iter().find(|n| !here.contains(n)) {
                    return Err(ObsMergeError::Missing {
                        path: path.display().to_string(),
                        column: n.clone(),
                        first: first.clone(),
                    }
                    .into());
                }
                if let Some(n) = here.iter().find(|n| !names.contains(n)) {
                    return Err(ObsMergeError::Extra {
                        path: path.display().to_string(),
                        column: n.clone(),
                        first: first.clone(),
                    }
                    .into());
                }
            }
        }
        for n in &names {
            let column = obs.column(n, Some(&(0..0)), true)?;
            shapes.entry(n.clone()).or_default().push(shape_of(column));
        }
        sources.push(path.display().to_string());
    }
    if let Some(unknown) = options.exclude.iter().find(|n| !every_name.contains(n)) {
        return Err(ObsMergeError::UnknownExclude {
            column: unknown.clone(),
            columns: every_name.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", "),
        }
        .into());
    }
    let Some(first) = first else { return Ok(None) };
    if let Some(i) = first_without {
        return Err(ObsMergeError::NoObs { path: inputs[i].display().to_string(), first }.into());
    }
    let mut schema_columns = Vec::new();
    if options.names {
        schema_columns.push(ObsColumn {
            name: "obs_names".into(),
            kind: ObsKind::String,
            arrow_type: "string".into(),
            categories: None,
        });
    }
    let mut categories_as_strings = Vec::new();
    for name in &names {
        if options.names && name == "obs_names" {
            return Err(ObsMergeError::ObsNamesTaken { path: sources[0].clone() }.into());
        }
        let column = plan_column(name, &shapes[name], &sources, options.max_categories)?;
        if column.kind == ObsKind::String && shapes[name][0].kind_name() == "categorical" {
            categories_as_strings.push(name.clone());
        }
        schema_columns.push(column);
    }
    let schema = ObsSchema { format: SCHEMA_FORMAT.into(), version: SCHEMA_VERSION, columns: schema_columns };
    let mut plan = ObsPlan::from_schema(schema, options.names, false)
        .map_err(|e| ConvertError::invalid("the planned obs schema", e))?;
    plan.categories_as_strings = categories_as_strings;
    Ok(Some(plan))
}

/// The stored kind, type and vocabulary of one column, from its shape in every input.
fn plan_column(name: &str, shapes: &[Shape], sources: &[String], max_categories: usize) -> Result<ObsColumn> {
    let first = &shapes[0];
    for (i, s) in shapes.iter().enumerate().skip(1) {
        if s.kind_name() != first.kind_name() {
            return Err(ObsMergeError::Kinds {
                column: name.to_string(),
                kind: first.kind_name(),
                path: sources[0].clone(),
                other_kind: s.kind_name(),
                other: sources[i].clone(),
            }
            .into());
        }
    }
    let (kind, data_type, categories) = match first {
        Shape::Bool => (ObsKind::Bool, DataType::Boolean, None),
        Shape::String => (ObsKind::String, DataType::Utf8, None),
        Shape::Numeric(_) => {
            let mut dt = DataType::Null;
            for s in shapes {
                if let Shape::Numeric(t) = s {
                    dt = if dt == DataType::Null { t.clone() } else { common_numeric(&dt, t) };
                }
            }
            if arrow_type_name(&dt).is_none() {
                return Err(ObsMergeError::Unstorable { column: name.to_string(), data_type: dt.to_string() }.into());
            }
            (ObsKind::Numeric, dt, None)
        }
        Shape::CategoryAsStrings => (ObsKind::String, DataType::Utf8, None),
        Shape::Category(_) => {
            let mut vocabulary: Vec<Value> = Vec::new();
            let mut seen: HashMap<String, ()> = HashMap::new();
            let mut as_strings = false;
            for s in shapes {
                match s {
                    Shape::Category(values) => {
                        for value in values {
                            if seen.insert(value.to_string(), ()).is_none() {
                                vocabulary.push(value.clone());
                            }
                        }
                    }
                    _ => as_strings = true, // CategoryAsStrings: kinds were checked
                }
            }
            if as_strings || vocabulary.len() > max_categories {
                (ObsKind::String, DataType::Utf8, None)
            } else {
                (ObsKind::Category, code_type(vocabulary.len()), Some(vocabulary))
            }
        }
    };
    Ok(ObsColumn {
        name: name.to_string(),
        kind,
        arrow_type: arrow_type_name(&data_type).expect("planned types have names").into(),
        categories,
    })
}

fn convert_column(c: &PlannedColumn, input: &InputObs, k: usize, column: FrameColumn) -> Result<ArrayRef, String> {
    Ok(match (c.kind, column) {
        (ObsKind::Category, FrameColumn::Category { codes, .. }) => {
            let map = input.code_maps[k].as_ref().ok_or("has no categories")?;
            if let Some(&bad) = codes.iter().find(|&&k| k >= map.len() as i32) {
                return Err(format!("code {bad} is past its {} categories", map.len()));
            }
            let global = codes.iter().map(|&k| if k < 0 { -1 } else { map[k as usize] });
            match c.data_type {
                DataType::Int8 => Arc::new(global.map(|g| g as i8).collect::<Int8Array>()),
                DataType::Int16 => Arc::new(global.map(|g| g as i16).collect::<Int16Array>()),
                _ => Arc::new(global.collect::<Int32Array>()),
            }
        }
        (ObsKind::String, FrameColumn::Category { codes, .. }) => {
            let local = input.local_strings[k].as_ref().ok_or("has no categories")?;
            if let Some(&bad) = codes.iter().find(|&&k| k >= local.len() as i32) {
                return Err(format!("code {bad} is past its {} categories", local.len()));
            }
            Arc::new(codes.iter().map(|&k| (k >= 0).then(|| local[k as usize].as_str())).collect::<StringArray>())
        }
        (ObsKind::String, FrameColumn::String(v)) => Arc::new(v.iter().map(|s| s.as_deref()).collect::<StringArray>()),
        (ObsKind::Bool, FrameColumn::Bool(v)) => Arc::new(BooleanArray::from(v)),
        (ObsKind::Numeric, FrameColumn::Numeric(a)) => widen(a, &c.data_type)?,
        (kind, other) => return Err(format!("is {other:?}-shaped, the plan says {}", kind.as_str())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_types_meet_in_a_common_type() {
        use DataType::*;
        assert_eq!(common_numeric(&Int8, &Int32), Int32);
        assert_eq!(common_numeric(&UInt8, &UInt16), UInt16);
        assert_eq!(common_numeric(&UInt8, &Int8), Int16);
        assert_eq!(common_numeric(&UInt32, &Int16), Int64);
        assert_eq!(common_numeric(&UInt64, &Int8), Float64);
        assert_eq!(common_numeric(&Int64, &Float32), Float64);
        assert_eq!(common_numeric(&Float32, &Float32), Float32);
        assert_eq!(common_numeric(&Float32, &Float64), Float64);
    }

    #[test]
    fn code_types_follow_pandas() {
        assert_eq!(code_type(126), DataType::Int8);
        assert_eq!(code_type(127), DataType::Int16);
        assert_eq!(code_type(32766), DataType::Int16);
        assert_eq!(code_type(32767), DataType::Int32);
    }
}
