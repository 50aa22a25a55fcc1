//! An input's tables, obs (one row per cell) and var (one row per gene):
//! what conversion asks of them ([`Table`]), their columns as read
//! ([`FrameColumn`]), and a table held in memory whole ([`MemoryTable`]).

use std::ops::Range;
use std::path::PathBuf;

use arrow_array::ArrayRef;

use super::error::InputError;

/// The vocabulary of a categorical column, in its own type.
#[derive(Clone, Debug, PartialEq)]
pub enum Categories {
    Strings(Vec<String>),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Bools(Vec<bool>),
}

impl Categories {
    pub fn len(&self) -> usize {
        match self {
            Categories::Strings(v) => v.len(),
            Categories::Ints(v) => v.len(),
            Categories::Floats(v) => v.len(),
            Categories::Bools(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One column, as read.
#[derive(Clone, Debug)]
pub enum FrameColumn {
    /// Codes (-1 for missing) into `categories`.
    Category {
        codes: Vec<i32>,
        categories: Categories,
        ordered: bool,
    },
    /// An Arrow array of the source's numeric type; missing values (masked, or
    /// NaN in floats) are nulls.
    Numeric(ArrayRef),
    Bool(Vec<Option<bool>>),
    String(Vec<Option<String>>),
}

impl FrameColumn {
    pub fn len(&self) -> usize {
        match self {
            FrameColumn::Category { codes, .. } => codes.len(),
            FrameColumn::Numeric(a) => a.len(),
            FrameColumn::Bool(v) => v.len(),
            FrameColumn::String(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A table of an input: obs (one row per cell) or var (one row per gene).
pub trait Table {
    /// Where the table is, for messages (`obs`, `var`, `raw/var`).
    fn name(&self) -> &str;
    /// The index's name (`_index` when unnamed, as anndata writes it).
    fn index_name(&self) -> Result<String, InputError>;
    /// Rows `rows` (all when None) of the index: the cell or gene names.
    fn index(&self, rows: Option<Range<usize>>) -> Result<Vec<String>, InputError>;
    /// The columns, in order (the index not among them).
    fn columns(&self) -> Result<Vec<String>, InputError>;
    /// Rows `rows` (all when None) of column `name`. A categorical column's
    /// vocabulary is read only `with_categories` (otherwise its length is, to
    /// check the codes, and `categories` is empty).
    fn column(&self, name: &str, rows: Option<&Range<usize>>, with_categories: bool)
        -> Result<FrameColumn, InputError>;
    /// Checks that the index and every column have `rows` rows; `what` names
    /// a row in the message ("cells", "genes").
    fn check_rows(&self, rows: u64, what: &str) -> Result<(), InputError>;
    /// An error about `object` of this table's file.
    fn invalid(&self, object: &str, message: String) -> InputError;
}

/// A table borrowed: what an input that holds its tables in memory returns
/// from [`InputSource::var`](super::InputSource::var) and
/// [`InputSource::obs`](super::InputSource::obs), instead of a copy.
impl<T: Table + ?Sized> Table for &T {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn index_name(&self) -> Result<String, InputError> {
        (**self).index_name()
    }

    fn index(&self, rows: Option<Range<usize>>) -> Result<Vec<String>, InputError> {
        (**self).index(rows)
    }

    fn columns(&self) -> Result<Vec<String>, InputError> {
        (**self).columns()
    }

    fn column(
        &self,
        name: &str,
        rows: Option<&Range<usize>>,
        with_categories: bool,
    ) -> Result<FrameColumn, InputError> {
        (**self).column(name, rows, with_categories)
    }

    fn check_rows(&self, rows: u64, what: &str) -> Result<(), InputError> {
        (**self).check_rows(rows, what)
    }

    fn invalid(&self, object: &str, message: String) -> InputError {
        (**self).invalid(object, message)
    }
}

/// A table held in memory whole: the tables of formats that store them as
/// small arrays or text files (10x features, Matrix Market's features and
/// barcodes), and those of an AnnData object handed over in memory.
#[derive(Clone, Debug)]
pub struct MemoryTable {
    /// The file, for messages.
    pub path: PathBuf,
    /// The table, for messages (`obs`, `var`).
    pub name: String,
    /// The index's name: `_index` when unnamed, as anndata writes it.
    pub index_name: String,
    pub index: Vec<String>,
    pub columns: Vec<(String, FrameColumn)>,
}

impl MemoryTable {
    /// A column of strings with few distinct values, as a categorical whose
    /// vocabulary is sorted (as pandas sorts one it infers).
    pub fn category_of(values: &[String]) -> FrameColumn {
        let mut categories: Vec<String> = values.to_vec();
        categories.sort_unstable();
        categories.dedup();
        let codes = values.iter().map(|v| categories.binary_search(v).map_or(-1, |c| c as i32)).collect();
        FrameColumn::Category { codes, categories: Categories::Strings(categories), ordered: false }
    }
}

impl Table for MemoryTable {
    fn name(&self) -> &str {
        &self.name
    }

    fn index_name(&self) -> Result<String, InputError> {
        Ok(self.index_name.clone())
    }

    fn index(&self, rows: Option<Range<usize>>) -> Result<Vec<String>, InputError> {
        let rows = rows.unwrap_or(0..self.index.len());
        match self.index.get(rows.clone()) {
            Some(names) => Ok(names.to_vec()),
            None => Err(self.invalid(&self.name, format!("rows {rows:?} outside 0..{}", self.index.len()))),
        }
    }

    fn columns(&self) -> Result<Vec<String>, InputError> {
        Ok(self.columns.iter().map(|(n, _)| n.clone()).collect())
    }

    fn column(
        &self,
        name: &str,
        rows: Option<&Range<usize>>,
        with_categories: bool,
    ) -> Result<FrameColumn, InputError> {
        let object = format!("{}/{name}", self.name);
        let Some((_, column)) = self.columns.iter().find(|(n, _)| n == name) else {
            return Err(self.invalid(&object, "not found".into()));
        };
        let rows = rows.cloned().unwrap_or(0..column.len());
        if rows.start > rows.end || rows.end > column.len() {
            return Err(self.invalid(&object, format!("rows {rows:?} outside 0..{}", column.len())));
        }
        Ok(match column {
            FrameColumn::Category { codes, categories, ordered } => FrameColumn::Category {
                codes: codes[rows].to_vec(),
                categories: if with_categories { categories.clone() } else { Categories::Strings(Vec::new()) },
                ordered: *ordered,
            },
            FrameColumn::Numeric(a) => FrameColumn::Numeric(a.slice(rows.start, rows.len())),
            FrameColumn::Bool(v) => FrameColumn::Bool(v[rows].to_vec()),
            FrameColumn::String(v) => FrameColumn::String(v[rows].to_vec()),
        })
    }

    fn check_rows(&self, rows: u64, what: &str) -> Result<(), InputError> {
        let lengths = std::iter::once((self.name.clone(), self.index.len()))
            .chain(self.columns.iter().map(|(n, c)| (format!("{}/{n}", self.name), c.len())));
        for (object, len) in lengths {
            if len as u64 != rows {
                return Err(self.invalid(&object, format!("has {len} rows, but the matrix has {rows} {what}")));
            }
        }
        Ok(())
    }

    fn invalid(&self, object: &str, message: String) -> InputError {
        InputError::Invalid { path: self.path.clone(), object: object.to_string(), message }
    }
}
