//! Cells in a model's gene vocabulary: a [`GeneMap`] says, for each stored
//! column, which column of the output it becomes (or that it is left out),
//! and is applied to each cell as it is written: the output has exactly the
//! vocabulary's columns in its order, genes the dataset lacks are columns
//! with no entries, and every cell's columns come out sorted.
//!
//! A map is built once (from names, or back to the source files' order) and
//! shared by every batch. Applying it costs one table lookup per stored
//! entry; when it reorders columns, each cell's kept entries are put back in
//! column order by a radix sort on the output column's bytes (two passes
//! for up to 65,536 genes), in a space of the cell's size: the cost grows
//! with the cell's entries, not with the vocabulary.

/// The output column of a stored column the vocabulary does not have.
pub(crate) const LEFT_OUT: u32 = u32::MAX;

/// Why a gene map cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum VocabularyError {
    /// The vocabulary has no genes.
    #[error("genes: the list is empty")]
    Empty,
    /// A name given twice.
    #[error("genes: {name:?} is given twice (at positions {first} and {second}); each gene must be listed once")]
    Repeated { name: String, first: usize, second: usize },
    /// More output columns than a batch can index.
    #[error("genes: {n} genes; at most {max} can be asked for")]
    TooMany { n: usize, max: u32 },
    /// The stored columns' order back to the source is not a permutation.
    #[error("genes: the dataset's gene order is not a permutation of its {n_genes} genes")]
    NotAPermutation { n_genes: u32 },
}

/// Where each stored column goes in the output. See the [module](self).
#[derive(Clone, Debug)]
pub struct GeneMap {
    /// Per stored column: its output column, or [`LEFT_OUT`].
    to_output: Columns,
    n_output: u32,
    /// Output columns increase with stored columns and no two stored columns
    /// share one: a cell's entries keep their order.
    in_order: bool,
    /// Output columns some stored column goes to.
    present: u32,
    /// Per output column: the first stored column that goes to it, or
    /// [`LEFT_OUT`] for a gene the dataset lacks. Made when first asked
    /// (top-k ranking, a collection's holders): a collection of hundreds of
    /// datasets keeps one map each, and most never need it.
    from_output: std::sync::OnceLock<Vec<u32>>,
    /// Some output column has several stored columns (their counts are added).
    merges: bool,
    /// Radix passes (bytes) an output column needs.
    passes: usize,
}

/// Maps are equal when they send every stored column to the same place
/// (everything else is derived from that).
impl PartialEq for GeneMap {
    fn eq(&self, other: &Self) -> bool {
        self.n_output == other.n_output && self.to_output == other.to_output
    }
}

impl Eq for GeneMap {}

/// Per stored column, its output column or [`LEFT_OUT`]: 2 bytes a column
/// when the output has fewer than 65,535 columns, 4 otherwise. A collection
/// keeps a table for each dataset whose genes are stored in an order of its
/// own (convert's gene order): 123 KB for 62,710 genes rather than 245.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Columns {
    Narrow(Vec<u16>),
    Wide(Vec<u32>),
}

/// An entry of a [`Columns`] table, as an output column or [`LEFT_OUT`]
/// (a narrow table's `u16::MAX`).
trait Entry: Copy {
    fn column(self) -> u32;
}

impl Entry for u16 {
    #[inline]
    fn column(self) -> u32 {
        if self == u16::MAX {
            LEFT_OUT
        } else {
            u32::from(self)
        }
    }
}

impl Entry for u32 {
    #[inline]
    fn column(self) -> u32 {
        self
    }
}

/// The output column of stored column `stored` (past the table: left out).
#[inline]
fn lookup<T: Entry>(table: &[T], stored: u32) -> u32 {
    table.get(stored as usize).map_or(LEFT_OUT, |&j| j.column())
}

impl Columns {
    /// `table` (every entry below `n_output` or [`LEFT_OUT`]) kept narrow
    /// when it can be.
    fn new(table: Vec<u32>, n_output: u32) -> Columns {
        if n_output < u32::from(u16::MAX) {
            Columns::Narrow(table.into_iter().map(|j| u16::try_from(j).unwrap_or(u16::MAX)).collect())
        } else {
            Columns::Wide(table)
        }
    }

    fn len(&self) -> usize {
        match self {
            Columns::Narrow(t) => t.len(),
            Columns::Wide(t) => t.len(),
        }
    }

    fn get(&self, stored: u32) -> u32 {
        match self {
            Columns::Narrow(t) => lookup(t, stored),
            Columns::Wide(t) => lookup(t, stored),
        }
    }

    /// Every entry, in stored order.
    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.len()).map(|i| self.get(i as u32))
    }
}

/// [`GeneMap::map_row_unordered`] over one kind of table.
#[inline]
fn compact<T: Entry>(table: &[T], indices: &mut [u32], data: &mut [u32]) -> usize {
    let n = indices.len().min(data.len());
    // (Without a branch on whether the entry is kept, as in map_row.)
    let mut kept = 0;
    for i in 0..n {
        let j = lookup(table, indices[i]);
        indices[kept] = j;
        data[kept] = data[i];
        kept += usize::from(j != LEFT_OUT);
    }
    kept
}

/// The kept entries of a row as `output column << 32 | count` at the front
/// of `keys` (at least as long as the row); how many there are.
#[inline]
fn keyed<T: Entry>(table: &[T], indices: &[u32], data: &[u32], keys: &mut [u64]) -> usize {
    let mut m = 0usize;
    for (&g, &c) in indices.iter().zip(data) {
        let j = lookup(table, g);
        keys[m] = u64::from(j) << 32 | u64::from(c);
        m += usize::from(j != LEFT_OUT);
    }
    m
}

/// Per output column of `n_output`, the first stored column `to_output`
/// sends there, or [`LEFT_OUT`].
fn first_stored_of(to_output: impl Iterator<Item = u32>, n_output: u32) -> Vec<u32> {
    let mut from_output = vec![LEFT_OUT; n_output as usize];
    for (stored, j) in to_output.enumerate() {
        if let Some(first) = from_output.get_mut(j as usize).filter(|f| **f == LEFT_OUT) {
            *first = stored as u32;
        }
    }
    from_output
}

impl GeneMap {
    /// The map onto `wanted` (names, in the output's order) of a dataset
    /// whose stored columns are named `stored` (in stored order: var names,
    /// or another var column such as Ensembl IDs). A wanted name the dataset
    /// lacks is an empty column; a stored column whose name is not wanted is
    /// left out. Stored columns that share a name go to the same output
    /// column, their counts added (gene symbols repeat in some 10x files; an
    /// ID column does not).
    pub fn by_name<S: AsRef<str>, W: AsRef<str>>(stored: &[S], wanted: &[W]) -> Result<GeneMap, VocabularyError> {
        if wanted.is_empty() {
            return Err(VocabularyError::Empty);
        }
        let max = LEFT_OUT - 1;
        if wanted.len() > max as usize {
            return Err(VocabularyError::TooMany { n: wanted.len(), max });
        }
        let mut position: std::collections::HashMap<&str, u32> = std::collections::HashMap::with_capacity(wanted.len());
        for (i, name) in wanted.iter().enumerate() {
            if let Some(first) = position.insert(name.as_ref(), i as u32) {
                return Err(VocabularyError::Repeated {
                    name: name.as_ref().to_string(),
                    first: first as usize,
                    second: i,
                });
            }
        }
        let to_output = stored.iter().map(|name| position.get(name.as_ref()).copied().unwrap_or(LEFT_OUT)).collect();
        Ok(GeneMap::from_table(to_output, wanted.len() as u32))
    }

    /// The map whose stored column `i` goes to output column
    /// `to_output[i]` (`u32::MAX`: left out) of `n_output`: a map by name
    /// whose names were matched elsewhere (a collection matches ids). An
    /// output column past `n_output` is left out.
    pub(crate) fn from_columns(mut to_output: Vec<u32>, n_output: usize) -> Result<GeneMap, VocabularyError> {
        let max = LEFT_OUT - 1;
        let n =
            u32::try_from(n_output).ok().filter(|&n| n <= max).ok_or(VocabularyError::TooMany { n: n_output, max })?;
        if n == 0 {
            return Err(VocabularyError::Empty);
        }
        for j in to_output.iter_mut().filter(|j| **j >= n) {
            *j = LEFT_OUT;
        }
        Ok(GeneMap::from_table(to_output, n))
    }

    /// The map back to the source files' gene order: stored column `j` was
    /// source column `gene_order[j]` (gene_order.npy).
    pub fn source_order(gene_order: &[i32]) -> Result<GeneMap, VocabularyError> {
        let n = gene_order.len();
        let n_genes = u32::try_from(n).unwrap_or(u32::MAX);
        let mut seen = vec![false; n];
        let mut to_output = Vec::with_capacity(n);
        for &g in gene_order {
            match usize::try_from(g).ok().filter(|&g| g < n && !seen[g]) {
                Some(g) => {
                    seen[g] = true;
                    to_output.push(g as u32);
                }
                None => return Err(VocabularyError::NotAPermutation { n_genes }),
            }
        }
        if n == 0 {
            return Err(VocabularyError::Empty);
        }
        Ok(GeneMap::from_table(to_output, n_genes))
    }

    fn from_table(to_output: Vec<u32>, n_output: u32) -> GeneMap {
        let from_output = first_stored_of(to_output.iter().copied(), n_output);
        let mut in_order = true;
        let mut last: Option<u32> = None;
        let mut mapped = 0usize;
        for &j in to_output.iter().filter(|&&j| j != LEFT_OUT) {
            in_order &= last.is_none_or(|l| j > l);
            last = Some(j);
            mapped += 1;
        }
        let present = from_output.iter().filter(|&&s| s != LEFT_OUT).count() as u32;
        // a stored column that is not the first of its output column
        let merges = mapped > present as usize;
        let passes = (1..=4).find(|&p| u64::from(n_output.max(1) - 1) >> (8 * p) == 0).unwrap_or(4);
        let to_output = Columns::new(to_output, n_output);
        GeneMap { to_output, n_output, in_order, present, from_output: std::sync::OnceLock::new(), merges, passes }
    }

    /// Columns of the output.
    pub fn n_output(&self) -> u32 {
        self.n_output
    }

    /// Stored columns the map was built for.
    pub fn n_stored(&self) -> usize {
        self.to_output.len()
    }

    /// Output columns that some stored column goes to (the rest are genes
    /// the dataset lacks).
    pub fn present(&self) -> u32 {
        self.present
    }

    /// The output column of stored column `column`, or None when it is left out.
    pub fn output_column(&self, column: u32) -> Option<u32> {
        Some(self.to_output.get(column)).filter(|&j| j != LEFT_OUT)
    }

    /// The first stored column that goes to output column `column` (for a
    /// gene the dataset lacks, or past the output, `u32::MAX`).
    pub fn first_stored(&self, column: u32) -> u32 {
        let from_output = self.from_output.get_or_init(|| first_stored_of(self.to_output.iter(), self.n_output));
        from_output.get(column as usize).copied().unwrap_or(LEFT_OUT)
    }

    /// Whether the map changes nothing: every stored column is the output
    /// column of the same index (a dataset already in the vocabulary).
    pub fn is_identity(&self) -> bool {
        self.in_order && !self.merges && self.present == self.n_output && self.to_output.len() == self.n_output as usize
    }

    /// Whether two stored columns go to one output column (a name stored
    /// twice): their counts are added by [`GeneMap::map_row`] only.
    pub fn merges(&self) -> bool {
        self.merges
    }

    /// [`GeneMap::map_row`] without putting the kept entries in output
    /// column order (they stay in stored order), nor adding the counts of
    /// stored columns that share an output column: for a caller that
    /// scatters them (into a dense row) and a map that does not merge.
    pub fn map_row_unordered(&self, indices: &mut [u32], data: &mut [u32]) -> usize {
        match &self.to_output {
            Columns::Narrow(t) => compact(t, indices, data),
            Columns::Wide(t) => compact(t, indices, data),
        }
    }

    /// [`GeneMap::map_row_unordered`] when `any_order` and the map merges no
    /// columns, else [`GeneMap::map_row`]: what a caller that does not need
    /// the entries in column order (a dense row, an unsorted batch) calls.
    pub fn map_row_in(
        &self,
        indices: &mut [u32],
        data: &mut [u32],
        scratch: &mut RowScratch,
        any_order: bool,
    ) -> usize {
        if any_order && !self.merges {
            self.map_row_unordered(indices, data)
        } else {
            self.map_row(indices, data, scratch)
        }
    }

    /// Rewrites one cell, given as stored columns (increasing) and counts, in
    /// the output's columns: the kept entries move to the front, in output
    /// column order; returns how many there are. `scratch` is reused
    /// between calls.
    pub fn map_row(&self, indices: &mut [u32], data: &mut [u32], scratch: &mut RowScratch) -> usize {
        let n = indices.len().min(data.len());
        if self.in_order {
            // Stored order is output order: compacting is all there is.
            return self.map_row_unordered(indices, data);
        }
        // The kept entries as (output column << 32 | count), put in column
        // order by a radix sort on the column's bytes (least significant
        // first; the passes a column of this output can need), then
        // written back, counts of one column added.
        // (Without a branch on whether the entry is kept: which stored genes a
        // vocabulary keeps is as good as random, and a mispredicted branch
        // per entry cost more than all the rest.)
        let keys = &mut scratch.keys;
        if keys.len() < n {
            keys.resize(n, 0);
        }
        let m = match &self.to_output {
            Columns::Narrow(t) => keyed(t, &indices[..n], &data[..n], keys),
            Columns::Wide(t) => keyed(t, &indices[..n], &data[..n], keys),
        };
        let other = &mut scratch.other;
        if other.len() < m {
            other.resize(m, 0);
        }
        // Every pass's histogram in one read of the keys.
        let mut counts = [[0u32; 256]; 4];
        for &k in &keys[..m] {
            for (pass, c) in counts.iter_mut().enumerate().take(self.passes) {
                c[((k >> (32 + 8 * pass)) & 0xFF) as usize] += 1;
            }
        }
        for (pass, c) in counts.iter_mut().enumerate().take(self.passes) {
            let mut at = 0u32;
            for slot in c.iter_mut() {
                let n = *slot;
                *slot = at;
                at += n;
            }
            let shift = 32 + 8 * pass;
            for &k in &keys[..m] {
                let b = ((k >> shift) & 0xFF) as usize;
                other[c[b] as usize] = k;
                c[b] += 1;
            }
            std::mem::swap(keys, other);
        }
        if !self.merges {
            for (i, &k) in keys[..m].iter().enumerate() {
                indices[i] = (k >> 32) as u32;
                data[i] = k as u32;
            }
            return m;
        }
        let mut kept = 0usize;
        for &k in &keys[..m] {
            let (j, c) = ((k >> 32) as u32, k as u32);
            if kept > 0 && indices[kept - 1] == j {
                data[kept - 1] = data[kept - 1].saturating_add(c);
            } else {
                // (At most one kept entry per entry read: kept < n.)
                indices[kept] = j;
                data[kept] = c;
                kept += 1;
            }
        }
        kept
    }

    /// Nonzeros of the stored columns the map leaves out, given each stored
    /// column's nonzeros.
    pub fn left_out_of(&self, nonzeros_per_column: &[u64]) -> u64 {
        self.to_output.iter().zip(nonzeros_per_column).filter(|&(j, _)| j == LEFT_OUT).map(|(_, &n)| n).sum()
    }
}

/// Reused space for [`GeneMap::map_row`]: a cell's kept entries, twice
/// (the radix sort's two sides).
#[derive(Debug, Default)]
pub struct RowScratch {
    keys: Vec<u64>,
    other: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::CsrMatrix;

    /// Every row of `m` mapped by `map` (what batch::CellWriter does for a
    /// batch with a vocabulary and nothing else).
    fn mapped(map: &GeneMap, m: &CsrMatrix) -> CsrMatrix {
        let mut out = CsrMatrix::empty(map.n_output());
        let mut scratch = RowScratch::default();
        for r in 0..m.n_rows() {
            let (mut idx, mut val) = (m.row(r).0.to_vec(), m.row(r).1.to_vec());
            let kept = map.map_row(&mut idx, &mut val, &mut scratch);
            out.indices.extend_from_slice(&idx[..kept]);
            out.data.extend_from_slice(&val[..kept]);
            out.indptr.push(out.indices.len() as u64);
        }
        out
    }

    fn rows(m: &CsrMatrix) -> Vec<Vec<(u32, u32)>> {
        (0..m.n_rows()).map(|r| m.row(r).0.iter().copied().zip(m.row(r).1.iter().copied()).collect()).collect()
    }

    #[test]
    fn names_map_reorder_drop_and_leave_absent_columns_empty() {
        let stored = ["A", "B", "C", "D"];
        let map = GeneMap::by_name(&stored, &["D", "X", "B"]).unwrap();
        assert_eq!((map.n_output(), map.present()), (3, 2));
        let m = CsrMatrix {
            n_cols: 4,
            indptr: vec![0, 4, 4, 2 + 4],
            indices: vec![0, 1, 2, 3, 0, 3],
            data: vec![1, 2, 3, 4, 5, 6],
        };
        let m = mapped(&map, &m);
        assert_eq!(m.n_cols, 3);
        assert_eq!(rows(&m), vec![vec![(0, 4), (2, 2)], vec![], vec![(0, 6)]]);
    }

    #[test]
    fn a_subset_in_stored_order_is_compacted_without_a_sort() {
        let map = GeneMap::by_name(&["A", "B", "C"], &["A", "C"]).unwrap();
        assert!(map.in_order);
        let (mut idx, mut val) = (vec![0, 1, 2], vec![7, 8, 9]);
        let kept = map.map_row(&mut idx, &mut val, &mut RowScratch::default());
        assert_eq!((&idx[..kept], &val[..kept]), (&[0, 1][..], &[7, 9][..]));
    }

    #[test]
    fn stored_columns_sharing_a_name_are_added() {
        let map = GeneMap::by_name(&["A", "B", "A"], &["B", "A"]).unwrap();
        let (mut idx, mut val) = (vec![0, 1, 2], vec![1, 2, 3]);
        let kept = map.map_row(&mut idx, &mut val, &mut RowScratch::default());
        assert_eq!((&idx[..kept], &val[..kept]), (&[0, 1][..], &[2, 4][..]));
    }

    #[test]
    fn bad_vocabularies_are_refused() {
        assert!(matches!(GeneMap::by_name(&["A"], &[] as &[&str]), Err(VocabularyError::Empty)));
        let e = GeneMap::by_name(&["A"], &["A", "B", "A"]).unwrap_err();
        assert!(matches!(e, VocabularyError::Repeated { first: 0, second: 2, .. }), "{e}");
        assert!(GeneMap::source_order(&[0, 0]).is_err());
        assert!(GeneMap::source_order(&[0, 2]).is_err());
        assert!(GeneMap::source_order(&[-1, 0]).is_err());
    }

    #[test]
    fn source_order_undoes_the_gene_order() {
        // stored column j was source column order[j]
        let map = GeneMap::source_order(&[2, 0, 1]).unwrap();
        let (mut idx, mut val) = (vec![0, 1, 2], vec![10, 20, 30]);
        let kept = map.map_row(&mut idx, &mut val, &mut RowScratch::default());
        assert_eq!((&idx[..kept], &val[..kept]), (&[0, 1, 2][..], &[20, 30, 10][..]));
    }

    #[test]
    fn entries_past_the_map_are_left_out_not_read_past() {
        let map = GeneMap::by_name(&["A", "B"], &["B", "A"]).unwrap();
        let (mut idx, mut val) = (vec![1, 5, u32::MAX], vec![1, 2, 3]);
        let kept = map.map_row(&mut idx, &mut val, &mut RowScratch::default());
        assert_eq!((&idx[..kept], &val[..kept]), (&[0][..], &[1][..]));
    }

    #[test]
    fn tables_are_narrow_below_65535_output_columns_and_wide_above() {
        // the last column a narrow table can hold, and the first it cannot
        for n_output in [65_534u32, 65_535, 70_000] {
            let wanted: Vec<String> = (0..n_output).map(|j| format!("g{j}")).collect();
            let last = format!("g{}", n_output - 1);
            let stored = [last.as_str(), "absent", "g0", "g1"];
            let map = GeneMap::by_name(&stored, &wanted).unwrap();
            assert_eq!(matches!(map.to_output, Columns::Narrow(_)), n_output < 65_535, "{n_output}");
            assert_eq!(map.output_column(0), Some(n_output - 1));
            assert_eq!(map.output_column(1), None);
            assert_eq!(map.first_stored(n_output - 1), 0);
            assert_eq!(map.left_out_of(&[5, 7, 1, 1]), 7);
            let (mut idx, mut val) = (vec![0, 1, 2, 3], vec![10, 20, 30, 40]);
            let kept = map.map_row(&mut idx, &mut val, &mut RowScratch::default());
            assert_eq!((&idx[..kept], &val[..kept]), (&[0, 1, n_output - 1][..], &[30, 40, 10][..]));
        }
    }

    proptest::proptest! {
        #[test]
        fn mapping_matches_a_dense_reference(
            n_stored in 1usize..40,
            picks in proptest::collection::vec(0usize..60, 1..50),
            cells in proptest::collection::vec(proptest::collection::btree_map(0u32..40, 1u32..100, 0..30), 0..6),
        ) {
            let stored: Vec<String> = (0..n_stored).map(|g| format!("g{g}")).collect();
            let mut wanted: Vec<String> = Vec::new();
            for p in picks {
                let name = format!("g{p}");
                if !wanted.contains(&name) { wanted.push(name); }
            }
            let map = GeneMap::by_name(&stored, &wanted).unwrap();
            let mut m = CsrMatrix { n_cols: n_stored as u32, indptr: vec![0], indices: vec![], data: vec![] };
            let mut dense_want = Vec::new();
            for cell in &cells {
                let mut row = vec![0u32; wanted.len()];
                for (&g, &v) in cell.iter().filter(|(&g, _)| (g as usize) < n_stored) {
                    m.indices.push(g);
                    m.data.push(v);
                    if let Some(j) = wanted.iter().position(|w| *w == stored[g as usize]) { row[j] += v; }
                }
                m.indptr.push(m.indices.len() as u64);
                dense_want.push(row);
            }
            let m = mapped(&map, &m);
            for (r, want) in dense_want.iter().enumerate() {
                let (idx, val) = m.row(r);
                proptest::prop_assert!(idx.windows(2).all(|w| w[0] < w[1]), "sorted");
                let mut got = vec![0u32; wanted.len()];
                for (&j, &v) in idx.iter().zip(val) { got[j as usize] = v; }
                proptest::prop_assert_eq!(&got, want);
            }
        }
    }
}
