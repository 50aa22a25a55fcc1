//! An .h5ad file as an input of conversion ([`crate::inputs`]): its
//! matrix, its var table (the one that goes with the matrix) and its obs.

use std::ops::Range;
use std::path::Path;

use super::frame::{check_rows, column_names, read_column};
use super::{H5adFile, MatrixReader};
use crate::inputs::error::InputError;
use crate::inputs::remote::RemoteOptions;
use crate::inputs::rows::RawRows;
use crate::inputs::source::{first_rows_are_counts, InputSource};
use crate::inputs::table::{FrameColumn, Table};

/// An open .h5ad file and the matrix being converted.
pub struct H5adSource {
    file: H5adFile,
    matrix_name: String,
    matrix: MatrixReader,
}

impl H5adSource {
    /// Opens `path` and its matrix `matrix` (`X`, `raw/X`, `layers/NAME`).
    pub fn open(path: &Path, matrix: &str) -> Result<H5adSource, InputError> {
        Self::open_with(path, matrix, &RemoteOptions::default())
    }

    /// [`H5adSource::open`], reaching a file at a URL as `remote` says.
    pub fn open_with(path: &Path, matrix: &str, remote: &RemoteOptions) -> Result<H5adSource, InputError> {
        Self::from_file(H5adFile::open_with(path, remote)?, matrix)
    }

    /// The matrix `matrix` of a file already open.
    pub fn from_file(file: H5adFile, matrix: &str) -> Result<H5adSource, InputError> {
        let reader = file.matrix(matrix)?;
        Ok(H5adSource { file, matrix_name: matrix.to_string(), matrix: reader })
    }

    /// The file underneath.
    pub fn file(&self) -> &H5adFile {
        &self.file
    }
}

/// A dataframe group of an .h5ad file (obs, var, raw/var).
struct H5adTable<'f> {
    file: &'f H5adFile,
    group: &'static str,
}

impl Table for H5adTable<'_> {
    fn name(&self) -> &str {
        self.group
    }

    fn index_name(&self) -> Result<String, InputError> {
        Ok(self.file.index_dataset(self.group)?.0)
    }

    fn index(&self, rows: Option<Range<usize>>) -> Result<Vec<String>, InputError> {
        self.file.index_rows(self.group, rows).map_err(|e| self.file.with_read_failure(e))
    }

    fn columns(&self) -> Result<Vec<String>, InputError> {
        column_names(self.file, self.group)
    }

    fn column(
        &self,
        name: &str,
        rows: Option<&Range<usize>>,
        with_categories: bool,
    ) -> Result<FrameColumn, InputError> {
        // (a read of a file at a URL that failed says why, as X's reads do)
        read_column(self.file, self.group, name, rows, with_categories).map_err(|e| self.file.with_read_failure(e))
    }

    fn check_rows(&self, rows: u64, what: &str) -> Result<(), InputError> {
        check_rows(self.file, self.group, rows, what)
    }

    fn invalid(&self, object: &str, message: String) -> InputError {
        self.file.invalid(object, message)
    }
}

impl InputSource for H5adSource {
    fn path(&self) -> &Path {
        self.file.path()
    }

    fn matrix_name(&self) -> &str {
        &self.matrix_name
    }

    fn n_rows(&self) -> u64 {
        self.matrix.n_rows()
    }

    fn n_cols(&self) -> u64 {
        self.matrix.n_cols()
    }

    fn read_rows(&self, rows: Range<u64>) -> Result<RawRows, InputError> {
        self.matrix.read_rows(rows).map_err(|e| self.file.with_read_failure(e))
    }

    fn var(&self) -> Result<Box<dyn Table + '_>, InputError> {
        Ok(Box::new(H5adTable { file: &self.file, group: self.file.var_group_for(&self.matrix_name) }))
    }

    fn obs(&self) -> Result<Option<Box<dyn Table + '_>>, InputError> {
        Ok(self.file.exists("obs").then(|| Box::new(H5adTable { file: &self.file, group: "obs" }) as Box<dyn Table>))
    }

    fn will_read_whole(&self) {
        self.file.prefetch_matrix(&self.matrix);
    }

    fn counts_elsewhere(&self) -> Option<String> {
        // Another matrix of the file whose first rows are whole non-negative numbers.
        for other in self.file.matrix_names() {
            if other == self.matrix_name {
                continue;
            }
            let Ok(m) = self.file.matrix(&other) else { continue };
            if first_rows_are_counts(m.n_rows(), m.n_cols(), |rows| m.read_rows(rows)) {
                return Some(other);
            }
        }
        None
    }
}
