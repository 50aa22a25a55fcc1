//! A dataframe group of an AnnData zarr store (obs, var, raw/var) as an
//! input's table: its index and columns, read into the same kinds as an
//! .h5ad file's.

use std::ops::Range;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, UInt16Array, UInt32Array,
    UInt64Array, UInt8Array,
};
use serde_json::{Map, Value};

use super::store::{read_strings, string_attr, type_name, Kind, Numeric, Values, ZarrStore};
use crate::inputs::error::InputError;
use crate::inputs::table::{Categories, FrameColumn, Table};

/// A dataframe group of the store (obs, var, raw/var).
pub(super) struct ZarrTable<'s> {
    pub(super) store: &'s ZarrStore,
    pub(super) group: String,
}

impl ZarrTable<'_> {
    fn attrs(&self) -> Result<Map<String, Value>, InputError> {
        match self.store.node(&self.group)? {
            Some((Kind::Group, attrs)) => Ok(attrs),
            Some((Kind::Array, _)) => Err(self.store.unsupported(&self.group, "an array, not a dataframe group")),
            None => Err(self.store.invalid(&self.group, "missing")),
        }
    }

    fn column_type(&self, column: &str, what: impl std::fmt::Display) -> InputError {
        InputError::ColumnType {
            path: self.store.path.clone(),
            table: self.group.clone(),
            column: column.to_string(),
            what: what.to_string(),
        }
    }

    /// The number of rows of a column, from its metadata.
    fn column_len(&self, name: &str) -> Result<Option<u64>, InputError> {
        let object = format!("{}/{name}", self.group);
        match self.store.node(&object)? {
            Some((Kind::Array, _)) => Ok(Some(self.store.array(&object)?.shape().first().copied().unwrap_or(0))),
            Some((Kind::Group, _)) => {
                for member in ["codes", "values"] {
                    let path = format!("{object}/{member}");
                    if let Some((Kind::Array, _)) = self.store.node(&path)? {
                        return Ok(Some(self.store.array(&path)?.shape().first().copied().unwrap_or(0)));
                    }
                }
                Ok(None)
            }
            None => Err(self.store.invalid(&object, "missing")),
        }
    }

    fn numeric(
        &self,
        object: &str,
        mask: Option<&[bool]>,
        rows: Option<&Range<usize>>,
    ) -> Result<ArrayRef, InputError> {
        let values = Numeric::open(self.store, object, 1)?.read_1d(self.store, rows)?;
        let missing = |i: usize| mask.is_some_and(|m| m.get(i).copied().unwrap_or(false));
        macro_rules! ints {
            ($v:expr, $array:ty) => {
                Arc::new($v.iter().enumerate().map(|(i, &x)| (!missing(i)).then_some(x)).collect::<$array>())
                    as ArrayRef
            };
        }
        macro_rules! floats {
            ($v:expr, $array:ty) => {
                Arc::new(
                    $v.iter().enumerate().map(|(i, &x)| (!x.is_nan() && !missing(i)).then_some(x)).collect::<$array>(),
                ) as ArrayRef
            };
        }
        Ok(match &values {
            Values::I8(v) => ints!(v, Int8Array),
            Values::I16(v) => ints!(v, Int16Array),
            Values::I32(v) => ints!(v, Int32Array),
            Values::I64(v) => ints!(v, Int64Array),
            Values::U8(v) => ints!(v, UInt8Array),
            Values::U16(v) => ints!(v, UInt16Array),
            Values::U32(v) => ints!(v, UInt32Array),
            Values::U64(v) => ints!(v, UInt64Array),
            Values::F32(v) => floats!(v, Float32Array),
            Values::F64(v) => floats!(v, Float64Array),
            Values::Bool(_) => return Err(self.store.invalid(object, "holds booleans where numbers were expected")),
        })
    }

    fn bools(&self, object: &str, rows: Option<&Range<usize>>) -> Result<Vec<bool>, InputError> {
        match Numeric::open(self.store, object, 1)?.read_1d(self.store, rows)? {
            Values::Bool(v) => Ok(v),
            other => Ok(other.to_f64().into_iter().map(|x| x != 0.0).collect()),
        }
    }

    fn categories(&self, object: &str) -> Result<Categories, InputError> {
        let array = self.store.array(object)?;
        if type_name(&array) == "string" {
            return Ok(Categories::Strings(read_strings(self.store, object, None)?));
        }
        let values = Numeric::open(self.store, object, 1)?.read_1d(self.store, None)?;
        Ok(match (&values, values.to_i64()) {
            (Values::Bool(v), _) => Categories::Bools(v.clone()),
            (_, Some(ints)) => Categories::Ints(ints),
            _ => Categories::Floats(values.to_f64()),
        })
    }
}

impl Table for ZarrTable<'_> {
    fn name(&self) -> &str {
        &self.group
    }

    fn index_name(&self) -> Result<String, InputError> {
        Ok(string_attr(&self.attrs()?, "_index").unwrap_or("_index").to_string())
    }

    fn index(&self, rows: Option<Range<usize>>) -> Result<Vec<String>, InputError> {
        let index = self.index_name()?;
        read_strings(self.store, &format!("{}/{index}", self.group), rows.as_ref())
    }

    fn columns(&self) -> Result<Vec<String>, InputError> {
        let attrs = self.attrs()?;
        Ok(match attrs.get("column-order") {
            Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).map(str::to_string).collect(),
            _ => Vec::new(),
        })
    }

    fn column(
        &self,
        name: &str,
        rows: Option<&Range<usize>>,
        with_categories: bool,
    ) -> Result<FrameColumn, InputError> {
        let object = format!("{}/{name}", self.group);
        let Some((kind, attrs)) = self.store.node(&object)? else {
            return Err(self.store.invalid(&object, "missing"));
        };
        if kind == Kind::Array {
            let array = self.store.array(&object)?;
            if array.dimensionality() != 1 {
                return Err(self.column_type(name, format!("a {}-D array", array.dimensionality())));
            }
            if type_name(&array) == "string" {
                return Ok(FrameColumn::String(
                    read_strings(self.store, &object, rows)?.into_iter().map(Some).collect(),
                ));
            }
            if type_name(&array) == "bool" {
                return Ok(FrameColumn::Bool(self.bools(&object, rows)?.into_iter().map(Some).collect()));
            }
            return Ok(FrameColumn::Numeric(self.numeric(&object, None, rows)?));
        }
        let member = |m: &str| format!("{object}/{m}");
        let mask = || self.bools(&member("mask"), rows);
        match string_attr(&attrs, "encoding-type") {
            Some("categorical") => {
                let categories_object = member("categories");
                let (categories, n) = if with_categories {
                    let c = self.categories(&categories_object)?;
                    let n = c.len();
                    (c, n)
                } else {
                    let n = self.store.array(&categories_object)?.shape().first().copied().unwrap_or(0) as usize;
                    (Categories::Strings(Vec::new()), n)
                };
                let codes_object = member("codes");
                let codes = Numeric::open(self.store, &codes_object, 1)?
                    .read_1d(self.store, rows)?
                    .to_i64()
                    .ok_or_else(|| self.store.invalid(&codes_object, "codes are not integers"))?;
                let codes = codes
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| {
                        if c < -1 || c >= n as i64 {
                            Err(self
                                .store
                                .invalid(&format!("{codes_object}[{i}]"), format!("code {c} outside -1..{n}")))
                        } else {
                            Ok(c as i32)
                        }
                    })
                    .collect::<Result<Vec<i32>, _>>()?;
                let ordered = attrs.get("ordered").and_then(Value::as_bool).unwrap_or(false);
                Ok(FrameColumn::Category { codes, categories, ordered })
            }
            Some("nullable-integer") => {
                let m = mask()?;
                Ok(FrameColumn::Numeric(self.numeric(&member("values"), Some(&m), rows)?))
            }
            Some("nullable-boolean") => {
                let m = mask()?;
                let v = self.bools(&member("values"), rows)?;
                Ok(FrameColumn::Bool(v.iter().zip(&m).map(|(&v, &missing)| (!missing).then_some(v)).collect()))
            }
            Some("nullable-string-array") => {
                let m = mask()?;
                let v = read_strings(self.store, &member("values"), rows)?;
                Ok(FrameColumn::String(v.into_iter().zip(&m).map(|(v, &missing)| (!missing).then_some(v)).collect()))
            }
            other => Err(self.column_type(name, format!("encoding-type {}", other.unwrap_or("(none)")))),
        }
    }

    fn check_rows(&self, rows: u64, what: &str) -> Result<(), InputError> {
        let index = self.index_name()?;
        let mut lengths = vec![(index.clone(), self.column_len(&index)?)];
        for name in self.columns()? {
            let n = self.column_len(&name)?;
            lengths.push((name, n));
        }
        for (name, n) in lengths {
            if let Some(n) = n.filter(|&n| n != rows) {
                return Err(self.store.invalid(
                    &format!("{}/{name}", self.group),
                    format!(
                        "has {n} rows, but the matrix has {rows} {what}; anndata requires one row per {}",
                        what.trim_end_matches('s')
                    ),
                ));
            }
        }
        Ok(())
    }

    fn invalid(&self, object: &str, message: String) -> InputError {
        self.store.invalid(object, message)
    }
}
