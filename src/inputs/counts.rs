//! Stored values turned into counts ([`to_counts`]), the same for every
//! format: each value checked, zeros and dropped genes left out, columns
//! mapped to the dataset's gene order and put in order, duplicates summed.

use std::ops::Range;

use super::rows::{with_values, RawRows, Value};
use crate::format::{CsrMatrix, MAX_COUNT};

/// A value that is not a count, found by [`to_counts`].
#[derive(Clone, Debug, PartialEq)]
pub struct BadValue {
    /// Row within the block.
    pub row: u64,
    pub gene: u64,
    pub problem: String,
}

impl BadValue {
    /// Value `v` of row `row` (within the block), column `gene`, is not a count.
    pub fn not_a_count(row: u64, gene: u32, v: f64) -> BadValue {
        BadValue { row, gene: gene.into(), problem: not_a_count(v) }
    }
}

/// What [`to_counts`] left out or merged, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    /// Nonzeros of genes the dataset does not store.
    pub dropped: u64,
    /// Entries of a cell and gene that another entry of the same cell and
    /// gene came before: summed into it.
    pub summed: u64,
}

impl std::ops::AddAssign for Cleaned {
    fn add_assign(&mut self, other: Cleaned) {
        self.dropped += other.dropped;
        self.summed += other.summed;
    }
}

/// A column that [`to_counts`] leaves out (a gene the dataset does not store).
pub const DROPPED_COLUMN: u32 = u32::MAX;

/// Turns stored rows into counts: every value must be a whole number in
/// 0..2^31-1; zeros are dropped, column indices are mapped through `remap`
/// (source column -> output column) when given, sorted within each row, and
/// duplicates summed. Columns that `remap` maps to [`DROPPED_COLUMN`] are left
/// out (after their values were checked); the second value counts their
/// nonzeros and the duplicates summed.
pub fn to_counts(raw: &RawRows, n_cols: u32, remap: Option<&[u32]>) -> Result<(CsrMatrix, Cleaned), BadValue> {
    with_values!(&raw.values, values => counts_of(raw, values, n_cols, remap))
}

/// [`to_counts`] for values of one stored type.
fn counts_of<T: Value>(
    raw: &RawRows,
    values: &[T],
    n_cols: u32,
    remap: Option<&[u32]>,
) -> Result<(CsrMatrix, Cleaned), BadValue> {
    let mut cleaned = Cleaned::default();
    let mut out = CsrMatrix::empty(n_cols);
    out.indptr.reserve(raw.indptr.len().saturating_sub(1));
    out.indices.reserve(raw.indices.len());
    out.data.reserve(values.len());
    let mut bitmap = ColumnBitmap::default();
    for (r, w) in raw.indptr.windows(2).enumerate() {
        let (first, end) = (w[0] as usize, w[1] as usize);
        // A row whose columns are mapped (to a gene order, where they almost
        // never come out sorted) goes straight into the bitmap when it is
        // dense enough for all the columns; a row it cannot take (a sum past
        // the largest count) goes the way below, which names the problem.
        if let Some(m) = remap.filter(|_| ColumnBitmap::fits(end - first, n_cols)) {
            let (indices, row_values) = (&raw.indices[first..end], &values[first..end]);
            match bitmap.map_row(indices, row_values, m, n_cols, &mut out) {
                Ok(Some(row)) => {
                    cleaned += row;
                    out.indptr.push(out.indices.len() as u64);
                    continue;
                }
                Ok(None) => {}
                Err((source, v)) => return Err(BadValue::not_a_count(r as u64, source, v)),
            }
        }
        let start = out.indices.len();
        let mut sorted = true;
        let mut previous: i64 = -1;
        let (mut low, mut high) = (u32::MAX, 0u32);
        for (&source, &v) in raw.indices[first..end].iter().zip(&values[first..end]) {
            let v = v.to_f64();
            let count = count_of(v).ok_or_else(|| BadValue::not_a_count(r as u64, source, v))?;
            if count == 0 {
                continue;
            }
            let column = remap.map_or(source, |m| m[source as usize]);
            if column == DROPPED_COLUMN {
                cleaned.dropped += 1;
                continue;
            }
            sorted &= i64::from(column) > previous;
            previous = i64::from(column);
            (low, high) = (low.min(column), high.max(column));
            out.indices.push(column);
            out.data.push(count);
        }
        if !sorted {
            // A row whose columns come out of order (a gene order, or an
            // input's own order) is put in order through a bitmap of the
            // columns when the row is dense enough for its span, else sorted.
            let merged = if high < n_cols { bitmap.order(&mut out, start, low..high + 1) } else { None };
            cleaned.summed += match merged {
                Some(summed) => summed,
                None => sort_row(&mut out, start).map_err(|(c, sum)| BadValue {
                    row: r as u64,
                    gene: raw.indices[first..end]
                        .iter()
                        .copied()
                        .find(|&s| remap.map_or(s, |m| m[s as usize]) == c)
                        .unwrap_or(c)
                        .into(),
                    problem: format!("duplicate entries sum to {sum}, above the largest count 2^31-1"),
                })?,
            };
        }
        out.indptr.push(out.indices.len() as u64);
    }
    Ok((out, cleaned))
}

/// A stored value as a count: a whole number in 0..=MAX_COUNT (NaN fails
/// the range), or None.
pub fn count_of(v: f64) -> Option<u32> {
    let count = v as u32;
    (v >= 0.0 && v <= f64::from(MAX_COUNT) && f64::from(count) == v).then_some(count)
}

/// A row is put in order through the bitmap when the 64-column words its
/// columns span are at most this many per entry; a sparser row is sorted.
const BITMAP_WORDS_PER_ENTRY: usize = 4;

/// Sorts the row `out.indices[start..]` (with its counts) by column as
/// (column << 32 | count) keys, so that one integer sort orders it and
/// duplicates sit side by side, and sums duplicates: how many were summed,
/// or the column and the sum of duplicates that pass the largest count.
fn sort_row(out: &mut CsrMatrix, start: usize) -> Result<u64, (u32, u64)> {
    let mut keys: Vec<u64> =
        out.indices[start..].iter().zip(&out.data[start..]).map(|(&c, &v)| u64::from(c) << 32 | u64::from(v)).collect();
    keys.sort_unstable();
    out.indices.truncate(start);
    out.data.truncate(start);
    let mut summed = 0;
    for &key in &keys {
        let (c, v) = ((key >> 32) as u32, key as u32);
        let duplicate = out.indices.len() > start && out.indices.last() == Some(&c);
        if let (true, Some(last)) = (duplicate, out.data.last_mut()) {
            let sum = u64::from(*last) + u64::from(v);
            if sum > u64::from(MAX_COUNT) {
                return Err((c, sum));
            }
            *last = sum as u32;
            summed += 1;
        } else {
            out.indices.push(c);
            out.data.push(v);
        }
    }
    Ok(summed)
}

/// Puts rows in column order without sorting them: a bit per column of the
/// row's span and the row's count at each column it holds, as large as the
/// widest span yet (at most [`BITMAP_WORDS_PER_ENTRY`] words per entry of
/// that row), left empty between rows.
#[derive(Default)]
struct ColumnBitmap {
    bits: Vec<u64>,
    counts: Vec<u32>,
}

impl ColumnBitmap {
    /// Whether a row of `entries` stored entries is dense enough to be put
    /// in order through a bitmap of all `n_cols` columns.
    fn fits(entries: usize, n_cols: u32) -> bool {
        (n_cols.div_ceil(64) as usize) <= entries.saturating_mul(BITMAP_WORDS_PER_ENTRY)
    }

    /// Appends one stored row to `out` as counts in column order, each
    /// column mapped through `remap`, zeros and dropped columns left out and
    /// duplicates summed, with no copy of the row before its order: what was
    /// dropped and summed; None, `out` and the bitmap unchanged, when a
    /// mapped column is outside `n_cols` or a sum passes the largest count;
    /// Err with the column and value of a value that is not a count.
    fn map_row<T: Value>(
        &mut self,
        indices: &[u32],
        values: &[T],
        remap: &[u32],
        n_cols: u32,
        out: &mut CsrMatrix,
    ) -> Result<Option<Cleaned>, (u32, f64)> {
        let words = n_cols.div_ceil(64) as usize;
        if self.bits.len() < words {
            self.bits.resize(words, 0);
            self.counts.resize(words * 64, 0);
        }
        let mut cleaned = Cleaned::default();
        let (mut low, mut high) = (usize::MAX, 0usize);
        let mut refused = false;
        for (&source, &v) in indices.iter().zip(values) {
            let v = v.to_f64();
            let Some(count) = count_of(v) else {
                self.clear(low, high);
                return Err((source, v));
            };
            if count == 0 {
                continue;
            }
            let column = remap[source as usize];
            if column == DROPPED_COLUMN {
                cleaned.dropped += 1;
                continue;
            }
            if column >= n_cols {
                refused = true;
                break;
            }
            let at = column as usize;
            (low, high) = (low.min(at / 64), high.max(at / 64));
            match self.add(at, count) {
                Some(summed) => cleaned.summed += u64::from(summed),
                None => {
                    refused = true;
                    break;
                }
            }
        }
        if refused {
            self.clear(low, high);
            return Ok(None);
        }
        self.drain(low..high.saturating_add(1).min(words), 0, out);
        Ok(Some(cleaned))
    }

    /// Puts `count` at position `at`, or sums it into the count there:
    /// whether it was summed; None, nothing changed, when the sum passes
    /// the largest count.
    #[inline]
    fn add(&mut self, at: usize, count: u32) -> Option<bool> {
        let (word, bit) = (at / 64, 1u64 << (at % 64));
        if self.bits[word] & bit == 0 {
            self.bits[word] |= bit;
            self.counts[at] = count;
            return Some(false);
        }
        let sum = u64::from(self.counts[at]) + u64::from(count);
        if sum > u64::from(MAX_COUNT) {
            return None;
        }
        self.counts[at] = sum as u32;
        Some(true)
    }

    /// Appends the columns set in `words` (column `base` at the first bit
    /// of word 0) to `out` in order, with their counts, and empties them.
    #[inline]
    fn drain(&mut self, words: Range<usize>, base: u32, out: &mut CsrMatrix) {
        for word in words {
            let mut bits = std::mem::take(&mut self.bits[word]);
            while bits != 0 {
                let at = word * 64 + bits.trailing_zeros() as usize;
                out.indices.push(base + at as u32);
                out.data.push(self.counts[at]);
                bits &= bits - 1;
            }
        }
    }

    /// Empties the words `low..=high` (none when `low` is past `high`).
    fn clear(&mut self, low: usize, high: usize) {
        if low <= high {
            self.bits[low..=high].fill(0);
        }
    }

    /// Puts the row `out.indices[start..]` (every column in `span`) in
    /// column order, summing duplicates: how many were summed; None, the
    /// row unchanged, when the row is too sparse for its span (it is then
    /// sorted) or a sum passes the largest count (the sort then names it as
    /// it always has).
    fn order(&mut self, out: &mut CsrMatrix, start: usize, span: Range<u32>) -> Option<u64> {
        let base = span.start / 64 * 64;
        let words = span.end.saturating_sub(base).div_ceil(64) as usize;
        if words > (out.indices.len() - start).saturating_mul(BITMAP_WORDS_PER_ENTRY) {
            return None;
        }
        if self.bits.len() < words {
            self.bits.resize(words, 0);
            self.counts.resize(words * 64, 0);
        }
        let mut summed = 0;
        for (&c, &v) in out.indices[start..].iter().zip(&out.data[start..]) {
            match self.add((c - base) as usize, v) {
                Some(was_summed) => summed += u64::from(was_summed),
                None => {
                    self.bits[..words].fill(0);
                    return None;
                }
            }
        }
        out.indices.truncate(start);
        out.data.truncate(start);
        self.drain(0..words, base, out);
        Some(summed)
    }
}

/// Why a stored value is not a count.
fn not_a_count(v: f64) -> String {
    if v.is_nan() {
        "value NaN is not a count".to_string()
    } else if v < 0.0 {
        format!("value {v} is negative")
    } else if v > f64::from(MAX_COUNT) {
        format!("value {v} is above the largest count 2^31-1")
    } else {
        format!("value {v} is not an integer count")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::rows::{checked_indices, checked_indptr, Values};

    fn raw(rows: &[&[(u32, f64)]]) -> RawRows {
        let (mut r, mut values) = (RawRows { indptr: vec![0], ..Default::default() }, Vec::new());
        for row in rows {
            for &(i, v) in *row {
                r.indices.push(i);
                values.push(v);
            }
            r.indptr.push(r.indices.len() as u64);
        }
        r.values = values.into();
        r
    }

    #[test]
    fn every_stored_type_gives_the_same_counts_and_errors() {
        let indptr = vec![0, 3, 3, 5];
        let indices = vec![4, 1, 4, 2, 0];
        let stored: [Values; 4] = [
            vec![2.0f64, 0.0, 3.0, 7.0, 1.0].into(),
            vec![2.0f32, 0.0, 3.0, 7.0, 1.0].into(),
            vec![2i32, 0, 3, 7, 1].into(),
            vec![2u32, 0, 3, 7, 1].into(),
        ];
        let remap = [1, 0, 3, 2, DROPPED_COLUMN];
        for values in stored {
            let raw = RawRows { indptr: indptr.clone(), indices: indices.clone(), values };
            let (m, cleaned) = to_counts(&raw, 5, None).unwrap();
            assert_eq!((m.indptr, m.indices, m.data), (vec![0, 1, 1, 3], vec![4, 0, 2], vec![5, 1, 7]));
            assert_eq!(cleaned, Cleaned { dropped: 0, summed: 1 });
            let (m, cleaned) = to_counts(&raw, 4, Some(&remap)).unwrap();
            assert_eq!((m.indices, m.data, cleaned.dropped), (vec![1, 3], vec![1, 7], 2));
            // a slice keeps the type, and widening it is exact
            assert_eq!(raw.values.slice(3..5).get(0), 7.0);
        }
        let not_whole = RawRows { indptr: vec![0, 2], indices: vec![0, 1], values: vec![1.0f32, 2.5].into() };
        let as_f64 = RawRows { values: vec![1.0f64, 2.5].into(), ..not_whole.clone() };
        let (a, b) = (to_counts(&not_whole, 2, None).unwrap_err(), to_counts(&as_f64, 2, None).unwrap_err());
        assert_eq!((a.row, a.gene, &a.problem), (0, 1, &b.problem));
        let negative = RawRows { indptr: vec![0, 1], indices: vec![1], values: vec![-3i32].into() };
        assert_eq!(to_counts(&negative, 2, None).unwrap_err().problem, not_a_count(-3.0));
    }

    #[test]
    fn counts_are_cleaned() {
        // explicit zero dropped, unsorted sorted, duplicates summed
        let (m, cleaned) = to_counts(&raw(&[&[(3, 2.0), (1, 0.0), (0, 1.0), (3, 5.0)], &[]]), 5, None).unwrap();
        assert_eq!(cleaned, Cleaned { dropped: 0, summed: 1 });
        assert_eq!(m.indptr, vec![0, 2, 2]);
        assert_eq!(m.indices, vec![0, 3]);
        assert_eq!(m.data, vec![1, 7]);
        // remapped columns are sorted in output order
        let (m, cleaned) = to_counts(&raw(&[&[(0, 1.0), (1, 2.0), (2, 3.0)]]), 3, Some(&[2, 0, 1])).unwrap();
        assert_eq!((m.indices, m.data, cleaned), (vec![0, 1, 2], vec![2, 3, 1], Cleaned::default()));
        // columns mapped to DROPPED_COLUMN are left out and counted
        let (m, cleaned) =
            to_counts(&raw(&[&[(0, 1.0), (1, 2.0), (2, 3.0)], &[(1, 4.0)]]), 2, Some(&[1, DROPPED_COLUMN, 0])).unwrap();
        assert_eq!((m.indptr, m.indices, m.data, cleaned.dropped), (vec![0, 2, 2], vec![0, 1], vec![3, 1], 2));
    }

    #[test]
    fn columns_dense_rows_and_slices_give_the_same_rows() {
        // rows: [(0, 1), (2, 5)], [], [(1, 2)]
        let want = raw(&[&[(0, 1.0), (2, 5.0)], &[], &[(1, 2.0)]]);
        let by_column = RawRows::from_columns(&[0, 1, 2, 3], &[0, 2, 0], &vec![1.0, 2.0, 5.0].into(), 3);
        assert_eq!(by_column, want);
        let dense = [1.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0];
        assert_eq!(RawRows::from_dense_rows(dense.chunks(3)), want);
        assert_eq!(want.rows(1..3), raw(&[&[], &[(1, 2.0)]]));
        assert_eq!(want.rows(2..2), raw(&[]));
        assert_eq!(checked_indptr(vec![0, 2, 2, 3], 5, 3), Ok(vec![0, 2, 2, 3]));
        assert_eq!(checked_indptr(vec![0, 2, 1], 5, 3).unwrap_err().0, 7);
        assert!(checked_indptr(vec![0, 4], 0, 3).unwrap_err().1.contains("outside the 3 stored entries"));
        assert_eq!(checked_indices(&[0i64, 3, 1], 10, 3).unwrap_err(), (11, "index 3 outside 0..3".into()));
        assert_eq!(checked_indices(&[-1i32], 0, 3).unwrap_err().0, 0);
    }

    #[test]
    fn non_counts_are_named() {
        let bad = |v: f64| to_counts(&raw(&[&[], &[(0, 1.0), (4, v)]]), 5, None).unwrap_err();
        let e = bad(2.5);
        assert_eq!((e.row, e.gene), (1, 4));
        assert!(e.problem.contains("2.5 is not an integer"), "{}", e.problem);
        assert!(bad(-1.0).problem.contains("negative"));
        assert!(bad(f64::NAN).problem.contains("NaN"));
        assert!(bad(2147483648.0).problem.contains("above"));
        assert!(to_counts(&raw(&[&[(0, 2147483647.0)]]), 5, None).is_ok());
        let e = to_counts(&raw(&[&[(1, 2147483647.0), (1, 1.0)]]), 5, None).unwrap_err();
        assert!(e.problem.contains("duplicate"), "{}", e.problem);
        // the same through a gene order, rows dense enough to go straight
        // into the bitmap: the stored column is named, not the mapped one
        let reversed: Vec<u32> = (0..5).rev().collect();
        let bad = |v: f64| to_counts(&raw(&[&[(3, 1.0)], &[(0, 1.0), (4, v)]]), 5, Some(&reversed)).unwrap_err();
        let e = bad(2.5);
        assert_eq!((e.row, e.gene), (1, 4));
        assert!(e.problem.contains("2.5 is not an integer"), "{}", e.problem);
        assert!(bad(f64::NAN).problem.contains("NaN"));
        let e = to_counts(&raw(&[&[(1, 2147483647.0), (4, 1.0), (1, 1.0)]]), 5, Some(&reversed)).unwrap_err();
        assert_eq!((e.row, e.gene), (0, 1));
        assert!(e.problem.contains("duplicate entries sum to 2147483648"), "{}", e.problem);
        let (m, cleaned) =
            to_counts(&raw(&[&[(1, 2.0), (4, 1.0), (1, 3.0), (2, 0.0)], &[(0, 7.0)]]), 5, Some(&reversed)).unwrap();
        assert_eq!((m.indptr, m.indices, m.data), (vec![0, 2, 3], vec![0, 3, 4], vec![1, 5, 7]));
        assert_eq!(cleaned, Cleaned { dropped: 0, summed: 1 });
    }

    proptest::proptest! {
        /// Rows put in order through the bitmap (dense for their span) and
        /// rows sorted (sparse) give the same counts as a plain reference:
        /// columns ascending, duplicates summed, zeros and dropped columns
        /// left out; a duplicate sum above the largest count is named with
        /// the same sum whichever way the row went.
        #[test]
        fn rows_come_out_in_order_either_way(
            rows in proptest::collection::vec(
                proptest::collection::vec((0u32..300, proptest::prop_oneof![0u32..4, proptest::strategy::Just(MAX_COUNT)]), 0..60), 1..6),
            wide in proptest::bool::ANY,
        ) {
            use proptest::prelude::*;
            // 300 source columns onto 300 (dense spans) or onto 30,000 (sparse)
            let n_cols: u32 = if wide { 30_000 } else { 300 };
            let remap: Vec<u32> =
                (0..300u32).map(|c| if c % 37 == 5 { DROPPED_COLUMN } else { (c * 7919 + 11) % n_cols }).collect();
            let pairs: Vec<Vec<(u32, f64)>> =
                rows.iter().map(|r| r.iter().map(|&(c, v)| (c, f64::from(v))).collect()).collect();
            let refs: Vec<&[(u32, f64)]> = pairs.iter().map(|r| r.as_slice()).collect();
            let got = to_counts(&raw(&refs), n_cols, Some(&remap));
            let mut want = CsrMatrix::empty(n_cols);
            let mut cleaned = Cleaned::default();
            let mut overflow = None;
            for (r, row) in rows.iter().enumerate() {
                let mut sums = std::collections::BTreeMap::<u32, Vec<u64>>::new();
                for &(c, v) in row {
                    match (v, remap[c as usize]) {
                        (0, _) => {}
                        (_, DROPPED_COLUMN) => cleaned.dropped += 1,
                        (v, out) => sums.entry(out).or_default().push(u64::from(v)),
                    }
                }
                for (&c, values) in &sums {
                    let total: u64 = values.iter().sum();
                    if total > u64::from(MAX_COUNT) && overflow.is_none() {
                        overflow = Some(r);
                    }
                    cleaned.summed += values.len() as u64 - 1;
                    want.indices.push(c);
                    want.data.push(total as u32);
                }
                want.indptr.push(want.indices.len() as u64);
                if overflow.is_some() {
                    break;
                }
            }
            match (got, overflow) {
                (Ok((m, c)), None) => {
                    prop_assert_eq!(m.indptr, want.indptr);
                    prop_assert_eq!(m.indices, want.indices);
                    prop_assert_eq!(m.data, want.data);
                    prop_assert_eq!(c, cleaned);
                }
                (Err(e), Some(r)) => {
                    prop_assert_eq!(e.row, r as u64);
                    prop_assert!(e.problem.starts_with("duplicate entries sum to"), "{}", e.problem);
                    // the sum named is the sorted order's, as before the bitmap
                    let mut sorted = CsrMatrix::empty(n_cols);
                    for &(c, v) in &rows[r] {
                        if v > 0 && remap[c as usize] != DROPPED_COLUMN {
                            sorted.indices.push(remap[c as usize]);
                            sorted.data.push(v);
                        }
                    }
                    let (_, sum) = sort_row(&mut sorted, 0).unwrap_err();
                    prop_assert!(e.problem.contains(&format!("sum to {sum},")), "{}", e.problem);
                }
                (got, overflow) => prop_assert!(false, "{:?} against overflow at {:?}", got.map(|g| g.1), overflow),
            }
        }
    }
}
