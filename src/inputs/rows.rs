//! A matrix's rows as an input stores them ([`RawRows`]: CSR, values in
//! the number type the input stores, not yet checked) and the checks every
//! format makes of a sparse matrix's arrays; their values become counts in
//! [`super::counts`].

use std::ops::Range;

/// Rows of a matrix as stored, before they are checked as counts: CSR with
/// indptr relative to the first row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawRows {
    pub indptr: Vec<u64>,
    pub indices: Vec<u32>,
    pub values: Values,
}

/// A block's stored values in the number type the input stores them, so
/// that they are not copied into a wider array before they are checked
/// (each is widened to f64 as it is checked, which is exact for all four).
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    F64(Vec<f64>),
    F32(Vec<f32>),
    I32(Vec<i32>),
    U32(Vec<u32>),
}

impl Default for Values {
    fn default() -> Values {
        Values::F64(Vec::new())
    }
}

/// A number type [`Values`] holds.
pub trait Value: Copy {
    fn to_f64(self) -> f64;
}

macro_rules! values_of {
    ($($t:ty => $variant:ident),*) => {
        $(
            impl Value for $t {
                fn to_f64(self) -> f64 {
                    f64::from(self)
                }
            }
            impl From<Vec<$t>> for Values {
                fn from(v: Vec<$t>) -> Values {
                    Values::$variant(v)
                }
            }
        )*
    };
}
values_of!(f64 => F64, f32 => F32, i32 => I32, u32 => U32);

/// Evaluates `$body` with `$v` bound to the values' slice in their stored
/// type, so that the body is compiled once per type.
macro_rules! with_values {
    ($values:expr, $v:ident => $body:expr) => {
        match $values {
            $crate::inputs::Values::F64(all) => {
                let $v: &[f64] = all;
                $body
            }
            $crate::inputs::Values::F32(all) => {
                let $v: &[f32] = all;
                $body
            }
            $crate::inputs::Values::I32(all) => {
                let $v: &[i32] = all;
                $body
            }
            $crate::inputs::Values::U32(all) => {
                let $v: &[u32] = all;
                $body
            }
        }
    };
}
pub(crate) use with_values;

impl Values {
    pub fn len(&self) -> usize {
        with_values!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `k`, widened (exactly) to f64.
    pub fn get(&self, k: usize) -> f64 {
        with_values!(self, v => v[k].to_f64())
    }

    /// Values `range`, in the same type.
    pub fn slice(&self, range: Range<usize>) -> Values {
        match self {
            Values::F64(v) => Values::F64(v[range].to_vec()),
            Values::F32(v) => Values::F32(v[range].to_vec()),
            Values::I32(v) => Values::I32(v[range].to_vec()),
            Values::U32(v) => Values::U32(v[range].to_vec()),
        }
    }

    /// Appends `other[range]`, widening both to f64 when their types differ.
    pub fn extend_from(&mut self, other: &Values, range: Range<usize>) {
        match (&mut *self, other) {
            (Values::F64(a), Values::F64(b)) => a.extend_from_slice(&b[range]),
            (Values::F32(a), Values::F32(b)) => a.extend_from_slice(&b[range]),
            (Values::I32(a), Values::I32(b)) => a.extend_from_slice(&b[range]),
            (Values::U32(a), Values::U32(b)) => a.extend_from_slice(&b[range]),
            (mine, _) if mine.is_empty() => *mine = other.slice(range),
            (mine, _) => {
                let mut wide: Vec<f64> = (0..mine.len()).map(|k| mine.get(k)).collect();
                wide.extend(range.map(|k| other.get(k)));
                *mine = Values::F64(wide);
            }
        }
    }
}

impl RawRows {
    /// Rows `rows` of a matrix held whole as one block (the caller checked
    /// that they are rows of it).
    pub fn rows(&self, rows: Range<u64>) -> RawRows {
        let (first, last) = (rows.start as usize, rows.end as usize);
        let (lo, hi) = (self.indptr[first] as usize, self.indptr[last] as usize);
        RawRows {
            indptr: self.indptr[first..=last].iter().map(|&p| p - lo as u64).collect(),
            indices: self.indices[lo..hi].to_vec(),
            values: self.values.slice(lo..hi),
        }
    }

    /// The rows of a dense block, each an iterator of its values; zeros are
    /// left out.
    pub fn from_dense_rows<'a, R: IntoIterator<Item = &'a f64>>(rows: impl Iterator<Item = R>) -> RawRows {
        let (mut indptr, mut indices, mut values) = (vec![0], Vec::new(), Vec::new());
        for row in rows {
            for (j, &v) in row.into_iter().enumerate() {
                if v != 0.0 {
                    indices.push(j as u32);
                    values.push(v);
                }
            }
            indptr.push(indices.len() as u64);
        }
        RawRows { indptr, indices, values: values.into() }
    }

    /// A matrix stored by column (CSC: `colptr` over the columns, each
    /// entry's row in `rows_of`, checked to be below `n_rows`) as rows.
    pub fn from_columns(colptr: &[u64], rows_of: &[u32], values: &Values, n_rows: u64) -> RawRows {
        let mut starts = vec![0u64; n_rows as usize + 1];
        for &r in rows_of {
            starts[r as usize + 1] += 1;
        }
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        let indptr = starts.clone();
        let mut indices = vec![0u32; rows_of.len()];
        let mut out = vec![0f64; rows_of.len()];
        for (col, w) in colptr.windows(2).enumerate() {
            let (lo, hi) = (w[0] as usize, w[1] as usize);
            for (k, &r) in (lo..hi).zip(&rows_of[lo..hi]) {
                let r = r as usize;
                let at = starts[r] as usize;
                indices[at] = col as u32;
                out[at] = values.get(k);
                starts[r] += 1;
            }
        }
        RawRows { indptr, indices, values: out.into() }
    }
}

/// The rows in `cell`, made by `make` on first use: a matrix that is read
/// whole once (CSC, which cannot be read by rows).
pub fn made_once<E>(
    cell: &std::sync::OnceLock<RawRows>,
    make: impl FnOnce() -> Result<RawRows, E>,
) -> Result<&RawRows, E> {
    if let Some(made) = cell.get() {
        return Ok(made);
    }
    let made = make()?;
    Ok(cell.get_or_init(|| made))
}

/// The most genes a dataset holds (format.md: `n_genes` from 1 to 2^31).
pub(crate) const MAX_GENES: u64 = 1 << 31;

/// The most cells an input may declare: 2^32-1, as Matrix Market's reader
/// has always said, and far above any atlas. A shape beyond it is refused
/// before anything is sized by it.
pub(crate) const MAX_CELLS: u64 = u32::MAX as u64;

/// Why a matrix of `n_rows` cells and `n_cols` genes cannot be an input:
/// None when it can.
pub(crate) fn shape_problem(n_rows: u64, n_cols: u64) -> Option<String> {
    if n_rows > MAX_CELLS {
        Some(format!("{n_rows} cells, more than an input may have (2^32-1)"))
    } else if n_cols > MAX_GENES {
        Some(format!("{n_cols} genes, more than a dataset holds (2^31)"))
    } else {
        None
    }
}

/// Elements an array read whole may declare beyond what its stored bytes
/// back, and elements per stored byte: compression of real columns stays
/// far below it, while an array that declares billions of elements in
/// chunks never written (read as its fill value) is refused before they
/// are allocated.
const UNBACKED_ELEMENTS: u64 = 1 << 22;
const ELEMENTS_PER_STORED_BYTE: u64 = 256;

/// Why an array of `declared` elements, of which `stored` bytes are stored,
/// is not read whole: None when it may be.
pub(crate) fn unbacked(declared: u64, stored: u64) -> Option<String> {
    let most = UNBACKED_ELEMENTS.saturating_add(stored.saturating_mul(ELEMENTS_PER_STORED_BYTE));
    (declared > most).then(|| format!("declares {declared} elements, but only {stored} bytes of them are stored"))
}

/// Checks entries `first..` of a sparse matrix's indptr as stored: never
/// decreasing, each within the `n_entries` stored entries. On failure, the
/// entry's position and what is wrong with it.
pub fn checked_indptr(raw: Vec<i64>, first: u64, n_entries: i64) -> Result<Vec<u64>, (u64, String)> {
    for (k, w) in raw.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err((first + k as u64 + 1, format!("{} is below the previous entry {}", w[1], w[0])));
        }
    }
    if let Some((k, &v)) = raw.iter().enumerate().find(|(_, &v)| v < 0 || v > n_entries) {
        return Err((first + k as u64, format!("{v} points outside the {n_entries} stored entries")));
    }
    Ok(raw.into_iter().map(|v| v as u64).collect())
}

/// Checks entries `first..` of a sparse matrix's indices as stored: each
/// below `minor` (the columns of CSR, the rows of CSC). On failure, the
/// entry's position and what is wrong with it.
pub fn checked_indices<T: Copy + Into<i64>>(raw: &[T], first: u64, minor: u64) -> Result<Vec<u32>, (u64, String)> {
    if let Some((k, v)) = raw.iter().map(|&v| v.into()).enumerate().find(|&(_, v)| v < 0 || v as u64 >= minor) {
        return Err((first + k as u64, format!("index {v} outside 0..{minor}")));
    }
    Ok(raw.iter().map(|&v| v.into() as u32).collect())
}

/// [`checked_indices`] of 32-bit indices, which become the result where
/// they are, with no second array.
pub fn checked_indices_i32(raw: Vec<i32>, first: u64, minor: u64) -> Result<Vec<u32>, (u64, String)> {
    if let Some((k, &v)) = raw.iter().enumerate().find(|&(_, &v)| v < 0 || v as u64 >= minor) {
        return Err((first + k as u64, format!("index {v} outside 0..{minor}")));
    }
    // (i32 and u32 have one size and alignment, so the cast cannot fail;
    // were it to, the indices are copied)
    Ok(bytemuck::allocation::try_cast_vec(raw).unwrap_or_else(|(_, raw)| raw.iter().map(|&v| v as u32).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_of_32_bits_are_checked_in_place() {
        assert_eq!(checked_indices_i32(vec![0, 4, 2], 10, 5), Ok(vec![0, 4, 2]));
        assert_eq!(checked_indices_i32(vec![0, 5], 10, 5), Err((11, "index 5 outside 0..5".to_string())));
        assert_eq!(checked_indices_i32(vec![-1], 0, 5), checked_indices(&[-1i32], 0, 5));
    }
}
