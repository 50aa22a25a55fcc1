//! Which genes a dataset stores when its inputs do not all list the same genes
//! in the same order.
//!
//! The dataset has one list of genes, the *source genes* (the columns before
//! they are sorted by total counts). Every input's columns are mapped onto it
//! by name: an input with the same names in the same positions is taken as it
//! is (so duplicate names keep working, by position); one with the same names
//! in another order is aligned; and inputs whose gene sets differ are refused
//! unless the user chose the intersection (genes every input has) or the union
//! (genes any input has; an input's missing genes are zeros for its cells).

use std::collections::{HashMap, HashSet};
use std::path::Path;

/// How the source genes are chosen from the inputs' genes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GeneSet {
    /// Every input must have the first input's genes (in any order).
    #[default]
    Same,
    /// The first input's genes that every input has, in its order.
    Intersection,
    /// The first input's genes, then every other input's new genes in order of
    /// first appearance.
    Union,
}

impl GeneSet {
    /// The set of name `name` (as [`GeneSet::as_str`] spells it).
    pub fn from_name(name: &str) -> Option<GeneSet> {
        [GeneSet::Same, GeneSet::Intersection, GeneSet::Union].into_iter().find(|g| g.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GeneSet::Same => "same",
            GeneSet::Intersection => "intersection",
            GeneSet::Union => "union",
        }
    }
}

/// A column an input has but the dataset does not store (intersection).
pub use crate::inputs::DROPPED_COLUMN as DROPPED;

/// Why an input's genes cannot be mapped onto the source genes.
#[derive(Debug, thiserror::Error)]
pub enum GeneError {
    #[error(transparent)]
    Differ(Box<DifferentGenes>),
    #[error(
        "{path}: its genes are in another order than in {first}, and cannot be aligned by name: \
         the gene name {name:?} appears more than once"
    )]
    Duplicate { path: String, first: String, name: String },
    #[error("{path}: none of its genes are among the dataset's genes")]
    NoneShared { path: String },
}

/// An input whose genes are not the first input's: how many differ, with examples.
#[derive(Debug, thiserror::Error)]
#[error(
    "{path}: genes differ from {first}: {only_here} of its {n_here} genes are not in the first file{examples_here}, \
     and {only_first} of the first file's {n_first} are not in it{examples_first}"
)]
pub struct DifferentGenes {
    pub path: String,
    pub first: String,
    pub n_here: usize,
    pub n_first: usize,
    pub only_here: usize,
    pub only_first: usize,
    examples_here: String,
    examples_first: String,
}

/// Up to three names, as ` (e.g. "A", "B", "C")`.
fn examples<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let some: Vec<String> = names.take(3).map(|n| format!("{n:?}")).collect();
    if some.is_empty() {
        String::new()
    } else {
        format!(" (e.g. {})", some.join(", "))
    }
}

fn first_repeated(names: &[String]) -> Option<&String> {
    let mut seen = HashSet::new();
    names.iter().find(|n| !seen.insert(*n))
}

/// The source genes of a conversion, built from the inputs' gene names in order.
pub struct SourceGenes {
    mode: GeneSet,
    first_path: String,
    names: Vec<String>,
    /// For intersection: the genes kept so far (a subset of `names`).
    kept: Option<HashSet<String>>,
    /// For union: every name in `names`.
    known: HashSet<String>,
    /// Inputs that were aligned by name, for a note.
    pub aligned: Vec<String>,
}

impl SourceGenes {
    /// Starts from the first input's genes.
    pub fn new(mode: GeneSet, first_path: &Path, names: Vec<String>) -> SourceGenes {
        let known = if mode == GeneSet::Union { names.iter().cloned().collect() } else { HashSet::new() };
        let kept = (mode == GeneSet::Intersection).then(|| names.iter().cloned().collect());
        SourceGenes { mode, first_path: first_path.display().to_string(), names, kept, known, aligned: Vec::new() }
    }

    /// Takes in another input's genes.
    pub fn add(&mut self, path: &Path, names: &[String]) -> Result<(), GeneError> {
        if names == self.names.as_slice() {
            return Ok(());
        }
        let here: HashSet<&String> = names.iter().collect();
        match self.mode {
            GeneSet::Same => {
                let first: HashSet<&String> = self.names.iter().collect();
                if here == first {
                    if here.len() != names.len() || first.len() != self.names.len() {
                        return Err(self.duplicate(path, names));
                    }
                    self.aligned.push(path.display().to_string());
                    return Ok(());
                }
                let only_here: Vec<&String> = names.iter().filter(|n| !first.contains(n)).collect();
                let only_first: Vec<&String> = self.names.iter().filter(|n| !here.contains(n)).collect();
                Err(GeneError::Differ(Box::new(DifferentGenes {
                    path: path.display().to_string(),
                    first: self.first_path.clone(),
                    n_here: names.len(),
                    n_first: self.names.len(),
                    only_here: only_here.len(),
                    only_first: only_first.len(),
                    examples_here: examples(only_here.into_iter()),
                    examples_first: examples(only_first.into_iter()),
                })))
            }
            GeneSet::Intersection => {
                if here.len() != names.len() {
                    return Err(self.duplicate(path, names));
                }
                if let Some(kept) = &mut self.kept {
                    kept.retain(|n| here.contains(n));
                }
                Ok(())
            }
            GeneSet::Union => {
                if here.len() != names.len() {
                    return Err(self.duplicate(path, names));
                }
                for n in names {
                    if self.known.insert(n.clone()) {
                        self.names.push(n.clone());
                    }
                }
                Ok(())
            }
        }
    }

    fn duplicate(&self, path: &Path, names: &[String]) -> GeneError {
        let name = first_repeated(names).or_else(|| first_repeated(&self.names)).cloned().unwrap_or_default();
        GeneError::Duplicate { path: path.display().to_string(), first: self.first_path.clone(), name }
    }

    /// The source genes, once every input was added.
    pub fn finish(self) -> Vec<String> {
        match self.kept {
            Some(kept) => self.names.into_iter().filter(|n| kept.contains(n)).collect(),
            None => self.names,
        }
    }
}

/// A digest of a list of gene names, in order: two inputs whose digests
/// are equal list the same genes in the same order, so a pass that already
/// knows an input's digest need not read its gene table again to know that
/// its columns are the source genes by position.
pub fn names_digest(names: &[String]) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    for name in names {
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// How one input's columns map onto the source genes: `None` when they are the
/// same by position, else, for each of its columns, the source gene (or
/// [`DROPPED`]).
pub fn column_map(path: &Path, names: &[String], source: &[String]) -> Result<Option<Vec<u32>>, GeneError> {
    if names == source {
        return Ok(None);
    }
    let index: HashMap<&str, u32> = source.iter().enumerate().map(|(i, n)| (n.as_str(), i as u32)).collect();
    if let Some(name) = first_repeated(source).or_else(|| first_repeated(names)) {
        return Err(GeneError::Duplicate {
            path: path.display().to_string(),
            first: "the dataset".into(),
            name: name.clone(),
        });
    }
    let map: Vec<u32> = names.iter().map(|n| index.get(n.as_str()).copied().unwrap_or(DROPPED)).collect();
    if !names.is_empty() && map.iter().all(|&m| m == DROPPED) {
        return Err(GeneError::NoneShared { path: path.display().to_string() });
    }
    Ok(Some(map))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &str) -> Vec<String> {
        s.split(',').map(String::from).collect()
    }

    #[test]
    fn same_genes_in_another_order_are_aligned() {
        let mut genes = SourceGenes::new(GeneSet::Same, Path::new("a"), names("A,B,C"));
        genes.add(Path::new("b"), &names("C,A,B")).unwrap();
        assert_eq!(genes.aligned, vec!["b".to_string()]);
        assert_eq!(genes.finish(), names("A,B,C"));
        assert_eq!(column_map(Path::new("b"), &names("C,A,B"), &names("A,B,C")).unwrap(), Some(vec![2, 0, 1]));
        assert_eq!(column_map(Path::new("a"), &names("A,B,C"), &names("A,B,C")).unwrap(), None);
    }

    #[test]
    fn differing_sets_are_counted_and_named() {
        let mut genes = SourceGenes::new(GeneSet::Same, Path::new("a.h5ad"), names("A,B,C,D"));
        let e = genes.add(Path::new("b.h5ad"), &names("A,B,E")).unwrap_err().to_string();
        assert!(e.starts_with("b.h5ad: genes differ from a.h5ad: 1 of its 3 genes are not in the first file (e.g. \"E\"), and 2 of the first file's 4 are not in it (e.g. \"C\", \"D\")"), "{e}");
        assert!(!e.contains("--genes"), "the library does not tell its user to type a flag: {e}");
    }

    #[test]
    fn intersection_and_union() {
        let mut i = SourceGenes::new(GeneSet::Intersection, Path::new("a"), names("A,B,C,D"));
        i.add(Path::new("b"), &names("D,B,E")).unwrap();
        i.add(Path::new("c"), &names("B,D,A")).unwrap();
        let kept = i.finish();
        assert_eq!(kept, names("B,D"));
        assert_eq!(column_map(Path::new("b"), &names("D,B,E"), &kept).unwrap(), Some(vec![1, 0, DROPPED]));

        let mut u = SourceGenes::new(GeneSet::Union, Path::new("a"), names("A,B"));
        u.add(Path::new("b"), &names("C,B")).unwrap();
        u.add(Path::new("c"), &names("D,A,C")).unwrap();
        assert_eq!(u.finish(), names("A,B,C,D"));
    }

    #[test]
    fn duplicates_work_by_position_only() {
        let mut genes = SourceGenes::new(GeneSet::Same, Path::new("a"), names("A,A,B"));
        genes.add(Path::new("b"), &names("A,A,B")).unwrap();
        let e = genes.add(Path::new("c"), &names("B,A,A")).unwrap_err().to_string();
        assert!(e.contains("\"A\" appears more than once"), "{e}");
    }
}
