//! The genes of a collection's datasets, kept once while its vocabulary is
//! built. Each dataset's names become small ids in one table as the dataset
//! is opened, so that opening hundreds of datasets of 60,000 genes holds
//! each distinct name once plus 4 bytes per stored gene, not every dataset's
//! names as text (100 datasets of the atlas' 62,710 genes took 287 MiB at
//! the peak of opening that way).

use indexmap::IndexSet;

use super::CollectionError;
use crate::vocabulary::{GeneMap, LEFT_OUT};

/// Distinct gene names, each with its id (its place in the set).
#[derive(Default)]
pub(super) struct GeneIds {
    names: IndexSet<String>,
}

impl GeneIds {
    /// `keys` (one dataset's names, in stored order) as ids, the names not
    /// seen before moved into the table.
    pub(super) fn intern(&mut self, keys: Vec<String>) -> Result<Vec<u32>, CollectionError> {
        let mut ids = Vec::with_capacity(keys.len());
        for name in keys {
            let (id, _) = self.names.insert_full(name);
            let id = u32::try_from(id).ok().filter(|&id| id != LEFT_OUT).ok_or_else(|| {
                CollectionError::Argument(format!("the datasets name more than {} distinct genes", LEFT_OUT - 1))
            })?;
            ids.push(id);
        }
        Ok(ids)
    }

    /// The union (or intersection) of the datasets' genes, given as the ids
    /// of each dataset in the collection's order: see the [module](super).
    pub(super) fn combined(&self, datasets: &[&[u32]], union: bool) -> Vec<String> {
        let mut seen = vec![false; self.names.len()];
        let mut chosen = Vec::new();
        if union {
            for &id in datasets.iter().flat_map(|ids| ids.iter()) {
                if !std::mem::replace(&mut seen[id as usize], true) {
                    chosen.push(id);
                }
            }
        } else if let Some((first, rest)) = datasets.split_first() {
            // in how many datasets each id is, each dataset counted once
            let mut holders = vec![0usize; self.names.len()];
            let mut last = vec![usize::MAX; self.names.len()];
            for (d, ids) in datasets.iter().enumerate() {
                for &id in ids.iter() {
                    if std::mem::replace(&mut last[id as usize], d) != d {
                        holders[id as usize] += 1;
                    }
                }
            }
            for &id in first.iter() {
                if holders[id as usize] == rest.len() + 1 && !std::mem::replace(&mut seen[id as usize], true) {
                    chosen.push(id);
                }
            }
        }
        chosen.iter().map(|&id| self.names[id as usize].clone()).collect()
    }

    /// Per id, its column in `vocabulary` (whose names are distinct), or
    /// [`LEFT_OUT`].
    pub(super) fn columns_in(&self, vocabulary: &[String]) -> Vec<u32> {
        let mut columns = vec![LEFT_OUT; self.names.len()];
        for (j, name) in vocabulary.iter().enumerate() {
            if let Some(id) = self.names.get_index_of(name.as_str()) {
                columns[id] = j as u32;
            }
        }
        columns
    }
}

/// The map of a dataset whose stored genes have the ids `ids`, onto the
/// vocabulary whose columns [`GeneIds::columns_in`] gave.
pub(super) fn map_of(ids: &[u32], columns: &[u32], n_vocabulary: usize) -> Result<GeneMap, CollectionError> {
    let to_output = ids.iter().map(|&id| columns.get(id as usize).copied().unwrap_or(LEFT_OUT)).collect();
    Ok(GeneMap::from_columns(to_output, n_vocabulary)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Vec<String> {
        list.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn names_are_kept_once_and_combined_in_the_collections_order() {
        let mut table = GeneIds::default();
        let a = table.intern(names("B A C")).unwrap();
        let b = table.intern(names("D C C A")).unwrap();
        let c = table.intern(names("A C E")).unwrap();
        assert_eq!(a, [0, 1, 2]);
        assert_eq!(b, [3, 2, 2, 1]);
        assert_eq!(table.names.len(), 5);
        let all = [a.as_slice(), b.as_slice(), c.as_slice()];
        assert_eq!(table.combined(&all, true), names("B A C D E"));
        // C twice in b is one dataset holding it
        assert_eq!(table.combined(&all, false), names("A C"));
        assert_eq!(table.combined(&all[..2], false), names("A C"));
        assert_eq!(table.combined(&all[1..2], false), names("D C A"));

        let vocabulary = names("C X A");
        let columns = table.columns_in(&vocabulary);
        let map = map_of(&b, &columns, vocabulary.len()).unwrap();
        let by_name = GeneMap::by_name(&names("D C C A"), &vocabulary).unwrap();
        assert_eq!(map, by_name);
        assert!(map.merges());
        assert_eq!(map.output_column(0), None);
        assert_eq!(map.output_column(3), Some(2));
    }
}
