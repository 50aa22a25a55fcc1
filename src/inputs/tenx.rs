//! 10x Genomics feature-barcode matrices in HDF5 (`filtered_feature_bc_matrix.h5`
//! and `raw_`), as an input of conversion ([`crate::inputs`]).
//!
//! Cell Ranger 3 and later write one group, `matrix`: `data`, `indices`,
//! `indptr` and `shape` of a features x barcodes matrix stored by barcode
//! (CSC), `barcodes`, and `features/{id,name,feature_type,genome}`. Cell Ranger
//! 2 wrote one such group per genome, named after it, with `genes` (ids) and
//! `gene_names` instead of `features`. Stored by barcode, each cell's entries
//! are one run, so the cells are read in blocks as a CSR matrix's rows are:
//! a slice of `indptr`, then the matching slice of `indices` and `data`.
//!
//! Only the features of one type are converted, `Gene Expression` unless
//! told, and of one genome: a file of several (a barnyard experiment) is
//! refused with their list unless one is named. The barcodes are the cell
//! names; var is indexed by feature id (unique, unlike the names) with the
//! columns `name`, `feature_type` and `genome`.

use std::ops::Range;
use std::path::Path;

use crate::inputs::counts::DROPPED_COLUMN;
use crate::inputs::error::{Hdf5Error, InputError};
pub use crate::inputs::features::GENE_EXPRESSION;
use crate::inputs::features::{kept_columns, picked, tally};
use crate::inputs::h5ad::{read_strings, read_strings_range, H5adFile, Layout, MatrixReader};
use crate::inputs::rows::{shape_problem, RawRows};
use crate::inputs::source::InputSource;
use crate::inputs::table::{FrameColumn, MemoryTable, Table};

/// Whether `file` is laid out as Cell Ranger writes its matrices (and not as
/// anndata writes an .h5ad file).
pub fn is_tenx(file: &H5adFile) -> bool {
    let h5 = file.file();
    if h5.link_exists("X") || h5.link_exists("obs") {
        return false;
    }
    h5.group("matrix").is_ok_and(|g| g.link_exists("indptr") && g.link_exists("barcodes"))
        || !genome_groups(file).is_empty()
}

/// The groups of a Cell Ranger 2 file: one per genome, each a matrix with its genes.
fn genome_groups(file: &H5adFile) -> Vec<String> {
    let h5 = file.file();
    let mut names = h5.member_names().unwrap_or_default();
    names.retain(|n| {
        h5.group(n).is_ok_and(|g| g.link_exists("indptr") && g.link_exists("genes") && g.link_exists("barcodes"))
    });
    names
}

/// An open 10x .h5 file and the features converted.
pub struct TenxSource {
    file: H5adFile,
    /// `matrix`, or the genome's group in a Cell Ranger 2 file.
    group: String,
    /// Rows are barcodes, columns every feature of the file.
    matrix: MatrixReader,
    /// Each feature's column among those converted, or [`DROPPED_COLUMN`];
    /// None when every feature is converted.
    keep: Option<Vec<u32>>,
    var: MemoryTable,
}

impl TenxSource {
    /// Reads the layout of `file` and chooses its features: those of type
    /// `feature_type` (default [`GENE_EXPRESSION`]) of genome `genome` (which
    /// must be named when the file has several).
    pub fn open(file: H5adFile, feature_type: Option<&str>, genome: Option<&str>) -> Result<TenxSource, InputError> {
        let h5 = file.file();
        let (group, layout_3) = if h5.link_exists("matrix") {
            ("matrix".to_string(), true)
        } else {
            let genomes = genome_groups(&file);
            let group = match (genome, genomes.as_slice()) {
                (_, []) => {
                    return Err(file
                        .unsupported("/", "neither Cell Ranger's layout (a matrix group) nor AnnData's (X, obs, var)"))
                }
                (None, [one]) => one.clone(),
                (None, _) => {
                    return Err(file.unsupported(
                        "/",
                        format!(
                            "a matrix of each of the genomes {}: --genome chooses which one is converted",
                            genomes.join(", ")
                        ),
                    ))
                }
                (Some(g), _) if genomes.iter().any(|n| n == g) => g.to_string(),
                (Some(g), _) => {
                    return Err(file.invalid("/", format!("no genome {g:?}; this file has {}", genomes.join(", "))))
                }
            };
            if let Some(t) = feature_type.filter(|t| *t != GENE_EXPRESSION) {
                return Err(file
                    .invalid(&group, format!("no {t:?} features: a Cell Ranger 2 file holds {GENE_EXPRESSION} only")));
            }
            (group, false)
        };
        let g = h5.group(&group).map_err(|e| file.read_failed(&group, Hdf5Error::new(e)))?;
        let shape_object = format!("{group}/shape");
        let shape_ds = g.dataset("shape").map_err(|e| file.read_failed(&shape_object, Hdf5Error::first_line(e)))?;
        if shape_ds.size() > 16 {
            return Err(file.invalid(&shape_object, format!("has {} entries, not two sizes", shape_ds.size())));
        }
        let shape: Vec<i64> =
            shape_ds.read_raw::<i64>().map_err(|e| file.read_failed(&shape_object, Hdf5Error::first_line(e)))?;
        let [n_features, n_barcodes] = shape[..] else {
            return Err(file.invalid(&shape_object, format!("{shape:?} is not two sizes")));
        };
        if n_features < 0 || n_barcodes < 0 {
            return Err(file.invalid(&shape_object, format!("{shape:?} is negative")));
        }
        if let Some(problem) = shape_problem(n_barcodes as u64, n_features as u64) {
            return Err(file.invalid(&shape_object, format!("{shape:?}: {problem}")));
        }
        // Stored by barcode, it reads as a barcodes x features CSR matrix.
        let matrix = file.sparse_matrix(&group, &g, Layout::Csr, n_barcodes as u64, n_features as u64)?;
        let strings = |object: &str| -> Result<Vec<String>, InputError> {
            let path = format!("{group}/{object}");
            let ds = h5.dataset(&path).map_err(|_| file.invalid(&path, "missing"))?;
            let values = read_strings(&ds).map_err(|e| file.read_failed(&path, e))?;
            if values.len() as i64 != n_features {
                return Err(file.invalid(
                    &path,
                    format!("has {} entries, but {shape_object} says {n_features} features", values.len()),
                ));
            }
            Ok(values)
        };
        let (ids, names, types, genomes) = if layout_3 {
            let types = strings("features/feature_type")?;
            let genomes = if h5.link_exists(&format!("{group}/features/genome")) {
                strings("features/genome")?
            } else {
                vec![String::new(); n_features as usize]
            };
            (strings("features/id")?, strings("features/name")?, types, genomes)
        } else {
            let n = n_features as usize;
            (strings("genes")?, strings("gene_names")?, vec![GENE_EXPRESSION.to_string(); n], vec![group.clone(); n])
        };
        let wanted = feature_type.unwrap_or(GENE_EXPRESSION);
        let mut chosen: Vec<bool> = types.iter().map(|t| t == wanted).collect();
        if !chosen.contains(&true) {
            return Err(file.invalid(
                &format!("{group}/features/feature_type"),
                format!("no {wanted:?} features; this file has {}: --feature-type chooses", tally(&types)),
            ));
        }
        let mut of_type: Vec<&String> = genomes.iter().zip(&chosen).filter(|(_, &c)| c).map(|(g, _)| g).collect();
        of_type.sort_unstable();
        of_type.dedup();
        match genome {
            Some(name) if layout_3 => {
                if !of_type.iter().any(|g| *g == name) {
                    return Err(file.invalid(
                        &format!("{group}/features/genome"),
                        format!("no {wanted:?} features of genome {name:?}; they are of {}", join(&of_type)),
                    ));
                }
                for (c, g) in chosen.iter_mut().zip(&genomes) {
                    *c &= g == name;
                }
            }
            None if of_type.len() > 1 => {
                return Err(file.unsupported(
                    &format!("{group}/features/genome"),
                    format!(
                        "{wanted:?} features of the genomes {}: --genome chooses which are converted",
                        join(&of_type)
                    ),
                ))
            }
            _ => {}
        }
        let keep = kept_columns(&chosen);
        let pick = |values: Vec<String>| picked(values, &chosen);
        let names = pick(names);
        let types = pick(types);
        let genomes = pick(genomes);
        let mut columns = vec![
            ("name".to_string(), FrameColumn::String(names.into_iter().map(Some).collect())),
            ("feature_type".to_string(), MemoryTable::category_of(&types)),
        ];
        if genomes.iter().any(|g| !g.is_empty()) {
            columns.push(("genome".to_string(), MemoryTable::category_of(&genomes)));
        }
        let var = MemoryTable {
            path: file.path().to_path_buf(),
            name: "var".into(),
            index_name: "_index".into(),
            index: pick(ids),
            columns,
        };
        Ok(TenxSource { file, group, matrix, keep, var })
    }
}

fn join(values: &[&String]) -> String {
    values.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(", ")
}

/// The barcodes, read by ranges: obs, with no columns.
struct Barcodes<'f> {
    file: &'f H5adFile,
    object: String,
}

impl Barcodes<'_> {
    fn dataset(&self) -> Result<hdf5::Dataset, InputError> {
        self.file.file().dataset(&self.object).map_err(|_| self.file.invalid(&self.object, "missing"))
    }
}

impl Table for Barcodes<'_> {
    fn name(&self) -> &str {
        "obs"
    }

    fn index_name(&self) -> Result<String, InputError> {
        Ok("_index".into())
    }

    fn index(&self, rows: Option<Range<usize>>) -> Result<Vec<String>, InputError> {
        let ds = self.dataset()?;
        match rows {
            None => read_strings(&ds),
            Some(r) if r.end <= ds.size() => read_strings_range(&ds, r),
            Some(r) => Err(format!("rows {r:?} outside 0..{}", ds.size()).into()),
        }
        .map_err(|e| self.file.with_read_failure(self.file.read_failed(&self.object, e)))
    }

    fn columns(&self) -> Result<Vec<String>, InputError> {
        Ok(Vec::new())
    }

    fn column(&self, name: &str, _: Option<&Range<usize>>, _: bool) -> Result<FrameColumn, InputError> {
        Err(self.file.invalid(&format!("obs/{name}"), "not found (the barcodes are all a 10x file has of obs)"))
    }

    fn check_rows(&self, rows: u64, what: &str) -> Result<(), InputError> {
        let n = self.dataset()?.size() as u64;
        if n != rows {
            return Err(self.file.invalid(&self.object, format!("has {n} barcodes, but the matrix has {rows} {what}")));
        }
        Ok(())
    }

    fn invalid(&self, object: &str, message: String) -> InputError {
        self.file.invalid(object, message)
    }
}

impl InputSource for TenxSource {
    fn path(&self) -> &Path {
        self.file.path()
    }

    fn matrix_name(&self) -> &str {
        &self.group
    }

    fn n_rows(&self) -> u64 {
        self.matrix.n_rows()
    }

    fn n_cols(&self) -> u64 {
        self.var.index.len() as u64
    }

    fn read_rows(&self, rows: Range<u64>) -> Result<RawRows, InputError> {
        let raw = self.matrix.read_rows(rows).map_err(|e| self.file.with_read_failure(e))?;
        let Some(keep) = &self.keep else { return Ok(raw) };
        // (indices were checked to be features of the file)
        let mut out = RawRows { indptr: Vec::with_capacity(raw.indptr.len()), ..Default::default() };
        out.values = raw.values.slice(0..0);
        out.indptr.push(0);
        for w in raw.indptr.windows(2) {
            for k in w[0] as usize..w[1] as usize {
                let column = keep[raw.indices[k] as usize];
                if column != DROPPED_COLUMN {
                    out.indices.push(column);
                    out.values.extend_from(&raw.values, k..k + 1);
                }
            }
            out.indptr.push(out.indices.len() as u64);
        }
        Ok(out)
    }

    fn var(&self) -> Result<Box<dyn Table + '_>, InputError> {
        Ok(Box::new(&self.var))
    }

    fn obs(&self) -> Result<Option<Box<dyn Table + '_>>, InputError> {
        Ok(Some(Box::new(Barcodes { file: &self.file, object: format!("{}/barcodes", self.group) })))
    }

    fn will_read_whole(&self) {
        self.file.prefetch_matrix(&self.matrix);
    }

    fn counts_elsewhere(&self) -> Option<String> {
        None
    }
}
