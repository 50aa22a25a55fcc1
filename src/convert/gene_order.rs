//! A gene order given to a conversion instead of computed from its inputs:
//! another dataset's (so that datasets, or a dataset and the cells appended
//! to it, share their columns) or a .npy file of source columns.
//!
//! A dataset's order is taken by gene name (its var_names.txt), so that inputs
//! listing the same genes in another order still get the dataset's columns;
//! a dataset without var_names.txt gives its gene_order.npy, which only
//! inputs with the same columns in the same order can share.

pub use super::error::GeneOrderError;
use super::error::{ConvertError, Result};
use std::collections::HashMap;
use std::path::Path;

use crate::dataset::{Dataset, DatasetError};
use crate::format::npy;

/// The gene order a conversion is given.
#[derive(Clone, Debug)]
pub enum GivenOrder {
    /// Gene names, in the order they are stored (a dataset's var_names.txt).
    Names { names: Vec<String>, source: String },
    /// Source columns, in the order they are stored: entry j is the input
    /// column stored as column j (gene_order.npy's meaning).
    Columns { columns: Vec<i64>, source: String },
}

impl GivenOrder {
    /// The gene order of `dataset` (whose root is `root`): by name when it has
    /// var_names.txt, else its gene_order.npy.
    pub fn from_dataset(dataset: &Dataset, root: &str) -> Result<GivenOrder, DatasetError> {
        if let Some(names) = dataset.var_names()? {
            return Ok(GivenOrder::Names { names, source: format!("{root} (var_names.txt)") });
        }
        if let Some(order) = dataset.gene_order()? {
            let columns = order.into_iter().map(i64::from).collect();
            return Ok(GivenOrder::Columns { columns, source: format!("{root} (gene_order.npy)") });
        }
        Err(DatasetError::Invalid {
            location: root.to_string(),
            message: "has neither var_names.txt nor gene_order.npy, so its gene order is not known".into(),
        })
    }

    /// Source columns from a .npy file of int32 or int64 (for example
    /// `np.save(path, np.argsort(-totals, kind="stable"))`).
    pub fn from_npy(path: &Path) -> Result<GivenOrder> {
        let source = path.display().to_string();
        let bytes = std::fs::read(path).map_err(ConvertError::io(format!("{source}: cannot read")))?;
        let columns = npy::read_indices(&bytes).map_err(|e| ConvertError::invalid(&source, e))?;
        Ok(GivenOrder::Columns { columns, source })
    }

    /// Where the order comes from, for messages and the manifest's metadata.
    pub fn source(&self) -> &str {
        match self {
            GivenOrder::Names { source, .. } | GivenOrder::Columns { source, .. } => source,
        }
    }

    /// The order as columns of `genes` (the inputs' source genes; `input`
    /// names the first input in messages): entry j is the source gene stored
    /// as column j.
    pub fn resolve(&self, genes: &[String], input: &Path) -> Result<Vec<u32>, GeneOrderError> {
        match self {
            GivenOrder::Columns { columns, source } => {
                npy::check_permutation(columns, genes.len() as u64).map_err(|problem| GeneOrderError::Columns {
                    origin: source.clone(),
                    problem,
                    n_genes: genes.len(),
                })?;
                Ok(columns.iter().map(|&c| c as u32).collect())
            }
            GivenOrder::Names { names, source } => {
                if names.as_slice() == genes {
                    // Same names in the same places: duplicates are fine, by position.
                    return Ok((0..genes.len() as u32).collect());
                }
                let mut column_of: HashMap<&str, u32> = HashMap::with_capacity(genes.len());
                for (g, name) in genes.iter().enumerate() {
                    if column_of.insert(name, g as u32).is_some() {
                        return Err(GeneOrderError::Repeated {
                            origin: input.display().to_string(),
                            name: name.clone(),
                        });
                    }
                }
                let mut order = Vec::with_capacity(names.len());
                let mut given: HashMap<&str, usize> = HashMap::with_capacity(names.len());
                for (j, name) in names.iter().enumerate() {
                    if given.insert(name, j).is_some() {
                        return Err(GeneOrderError::Repeated { origin: source.clone(), name: name.clone() });
                    }
                    match column_of.get(name.as_str()) {
                        Some(&g) => order.push(g),
                        None => {
                            let missing = names.iter().filter(|n| !column_of.contains_key(n.as_str())).count();
                            return Err(GeneOrderError::Missing {
                                input: input.display().to_string(),
                                origin: source.clone(),
                                name: name.clone(),
                                column: j,
                                missing,
                                n_given: names.len(),
                            });
                        }
                    }
                }
                if let Some(extra_name) = genes.iter().find(|g| !given.contains_key(g.as_str())) {
                    return Err(GeneOrderError::Extra {
                        input: input.display().to_string(),
                        origin: source.clone(),
                        name: extra_name.clone(),
                        extra: genes.iter().filter(|g| !given.contains_key(g.as_str())).count(),
                        n_given: names.len(),
                        n_inputs: genes.len(),
                    });
                }
                Ok(order)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn given(list: &[&str]) -> GivenOrder {
        GivenOrder::Names { names: names(list), source: "ds (var_names.txt)".into() }
    }

    #[test]
    fn names_give_the_columns_of_the_inputs_genes() {
        let genes = names(&["A", "B", "C", "D"]);
        assert_eq!(given(&["C", "A", "D", "B"]).resolve(&genes, Path::new("in.h5ad")).unwrap(), vec![2, 0, 3, 1]);
        // Repeated names in the same places are matched by position.
        let twice = names(&["A", "A", "B"]);
        assert_eq!(given(&["A", "A", "B"]).resolve(&twice, Path::new("in.h5ad")).unwrap(), vec![0, 1, 2]);
    }

    #[test]
    fn names_that_differ_are_refused_naming_the_first() {
        let genes = names(&["A", "B", "C"]);
        let e = given(&["C", "X", "A", "Y"]).resolve(&genes, Path::new("in.h5ad")).unwrap_err().to_string();
        assert!(e.starts_with("in.h5ad: has no gene \"X\", which ds (var_names.txt) stores as column 1"), "{e}");
        assert!(e.contains("(2 of its 4 are missing)"), "{e}");
        let e = given(&["C", "A"]).resolve(&genes, Path::new("in.h5ad")).unwrap_err().to_string();
        assert_eq!(
            e,
            "in.h5ad: its gene \"B\" is not among the 2 genes of ds (var_names.txt) (1 of the inputs' 3 genes are not)"
        );
        let e = given(&["A", "B", "A"]).resolve(&names(&["B", "A", "C"]), Path::new("in.h5ad")).unwrap_err();
        assert!(matches!(e, GeneOrderError::Repeated { ref name, .. } if name == "A"), "{e}");
    }

    #[test]
    fn columns_must_be_a_permutation() {
        let genes = names(&["A", "B", "C"]);
        let order = |c: &[i64]| GivenOrder::Columns { columns: c.to_vec(), source: "o.npy".into() };
        assert_eq!(order(&[2, 0, 1]).resolve(&genes, Path::new("in")).unwrap(), vec![2, 0, 1]);
        let e = order(&[2, 0, 0]).resolve(&genes, Path::new("in")).unwrap_err().to_string();
        assert_eq!(
            e,
            "o.npy: entry 2: 0 appears twice (a gene order lists every input column once: the inputs have 3 genes)"
        );
        assert!(order(&[0, 1]).resolve(&genes, Path::new("in")).is_err());
        assert!(order(&[0, 1, -1]).resolve(&genes, Path::new("in")).is_err());
        assert!(order(&[0, 1, 1 << 40]).resolve(&genes, Path::new("in")).is_err());
    }
}
