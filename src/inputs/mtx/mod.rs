//! Matrix Market count matrices, as Cell Ranger, STARsolo, DRAGEN, BD Rhapsody
//! and ScaleBio write them, as an input of conversion ([`crate::inputs`]).
//!
//! An input is a folder holding `matrix.mtx[.gz]`, `features.tsv[.gz]` (or
//! `genes.tsv[.gz]`) and `barcodes.tsv[.gz]`, or the matrix file itself with
//! those beside it under the same prefix (GEO's `GSM1_matrix.mtx.gz` goes
//! with `GSM1_features.tsv.gz`). Any file may be gzip-compressed, which is
//! told by its first bytes, not its name. Inputs at URLs are streamed
//! by ranges ([`crate::inputs::remote`]).
//!
//! The matrix is `coordinate` `integer` or `real` (whole values) `general`,
//! genes x cells (as the pipelines write it) or cells x genes: its
//! orientation is decided from its sizes against the features and
//! barcodes, and refused when both would fit. Entries may come in any order.
//! Before the first read, the entries are parsed once and kept, sorted by
//! cell, in an unnamed temporary file ($TMPDIR): 16 bytes an entry, in runs
//! of at most [`RUN_ENTRIES`] entries sorted in memory and then merged, so
//! memory stays bounded whatever the file's size; a file already in cell
//! order (Cell Ranger's) is written once and not merged. The parsed matrix
//! is kept for the process's next openings of the same file (a conversion
//! opens each input several times), a few files at most.
//!
//! Features of one type are converted (`Gene Expression` unless told; all of
//! them when the features file has no type column). var is indexed by the
//! features' first column (the id), with `name` and `feature_type` when the
//! file has them; the barcodes are the cell names.

mod entries;
mod place;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::inputs::counts::DROPPED_COLUMN;
use crate::inputs::error::InputError;
use crate::inputs::features::{kept_columns, picked, tally, GENE_EXPRESSION};
use crate::inputs::remote::{is_url, RemoteOptions};
use crate::inputs::rows::RawRows;
use crate::inputs::source::InputSource;
use crate::inputs::table::{FrameColumn, MemoryTable, Table};
pub use entries::RUN_ENTRIES;
use entries::{parse, read_header, Entry, Header, Orientation, Parsed, ENTRY_BYTES};
use place::{read_tsv, LineError, LineProblem, Place};

/// Parsed matrices kept for the process's next openings of the same file.
const KEPT_MATRICES: usize = 4;

/// The matrix file of a Matrix Market folder: `matrix.mtx.gz` or
/// `matrix.mtx`, else the one file whose name ends so.
pub fn matrix_file(dir: &Path) -> Result<PathBuf, InputError> {
    let error = |message: String| InputError::Open { path: dir.to_path_buf(), format: "Matrix Market", message };
    for name in ["matrix.mtx.gz", "matrix.mtx"] {
        if dir.join(name).is_file() {
            return Ok(dir.join(name));
        }
    }
    let listing = std::fs::read_dir(dir).map_err(|e| InputError::OpenFailed {
        path: dir.to_path_buf(),
        format: "Matrix Market",
        source: Box::new(e),
    })?;
    let mut found: Vec<PathBuf> = listing
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
            p.is_file() && (n.ends_with("matrix.mtx") || n.ends_with("matrix.mtx.gz"))
        })
        .collect();
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(error("no matrix.mtx or matrix.mtx.gz in this folder".into())),
        _ => Err(error(format!(
            "several matrices in this folder ({}): give the one to convert",
            found.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// A Matrix Market input, open for conversion.
pub struct MtxSource {
    /// The input as given (a folder or the matrix file).
    path: PathBuf,
    remote: RemoteOptions,
    matrix: Place,
    header: Header,
    orientation: Orientation,
    /// Each feature's column among those converted, or [`DROPPED_COLUMN`].
    keep: Option<Vec<u32>>,
    var: MemoryTable,
    obs: MemoryTable,
    /// The entries sorted by cell, once parsed.
    parsed: std::sync::OnceLock<Arc<Parsed>>,
}

impl MtxSource {
    /// Opens the input at `path` (a folder or the matrix file, local or at a
    /// URL): reads its features and barcodes and the matrix's header, and
    /// chooses the features of type `feature_type` (default
    /// [`GENE_EXPRESSION`]).
    pub fn open(path: &Path, remote: &RemoteOptions, feature_type: Option<&str>) -> Result<MtxSource, InputError> {
        let open_error =
            |message: String| InputError::Open { path: path.to_path_buf(), format: "Matrix Market", message };
        let matrix = if is_url(path) {
            let url = path.to_string_lossy().into_owned();
            // A store that does not serve the matrix says why (refused,
            // denied, not there) before its siblings are looked for.
            crate::inputs::remote::object_version(&url, &remote.store)?;
            Place::Url(url)
        } else if path.is_dir() {
            Place::File(matrix_file(path)?)
        } else if path.is_file() {
            Place::File(path.to_path_buf())
        } else {
            return Err(open_error("no such file or folder".into()));
        };
        let matrix_name = matrix.name();
        let lower = matrix_name.to_lowercase();
        let prefix_len = ["matrix.mtx.gz", "matrix.mtx"]
            .iter()
            .find(|s| lower.ends_with(*s))
            .map_or(0, |s| matrix_name.len() - s.len());
        let prefix = &matrix_name[..prefix_len];
        let find = |stems: &[&str]| -> Result<Place, InputError> {
            let names: Vec<String> =
                stems.iter().flat_map(|s| [format!("{prefix}{s}.gz"), format!("{prefix}{s}")]).collect();
            names
                .iter()
                .find_map(|n| matrix.sibling(n, remote))
                .ok_or_else(|| open_error(format!("{matrix_name} has no {} beside it", names.join(" or "))))
        };
        let features_file = find(&["features.tsv", "genes.tsv"])?;
        let barcodes_file = find(&["barcodes.tsv"])?;
        let invalid =
            |object: String, message: String| InputError::Invalid { path: path.to_path_buf(), object, message };

        let opened = |place: &Place| {
            place.open(remote).map_err(|source| InputError::Read {
                path: path.to_path_buf(),
                object: at(place, 0),
                source,
            })
        };
        let features = read_tsv(opened(&features_file)?).map_err(|e| line_error(path, &features_file, e))?;
        let barcodes = read_tsv(opened(&barcodes_file)?).map_err(|e| line_error(path, &barcodes_file, e))?;
        let header = read_header(&mut matrix.open(remote).map_err(|source| InputError::OpenFailed {
            path: path.to_path_buf(),
            format: "Matrix Market",
            source,
        })?)
        .map_err(|e| line_error(path, &matrix, e))?;
        let (n_features, n_barcodes) = (features.len() as u64, barcodes.len() as u64);
        let sizes = format!(
            "{} x {} (header), {n_features} features in {}, {n_barcodes} barcodes in {}",
            header.rows,
            header.cols,
            features_file.name(),
            barcodes_file.name()
        );
        let genes_by_cells = (header.rows, header.cols) == (n_features, n_barcodes);
        let cells_by_genes = (header.rows, header.cols) == (n_barcodes, n_features);
        let orientation = match (genes_by_cells, cells_by_genes) {
            (true, false) => Orientation::GenesByCells,
            (false, true) => Orientation::CellsByGenes,
            (true, true) => {
                return Err(invalid(
                    at(&matrix, header.first_line - 1),
                    format!("{sizes}: as many features as barcodes, so whether rows are genes or cells cannot be told"),
                ))
            }
            (false, false) => {
                return Err(invalid(at(&matrix, header.first_line - 1), format!("the sizes disagree: {sizes}")));
            }
        };

        // var: the first column is the id; then the name and the type.
        let column = |k: usize| -> Option<Vec<String>> {
            features.iter().all(|f| f.len() > k).then(|| features.iter().map(|f| f[k].clone()).collect())
        };
        let ids = column(0).unwrap_or_default();
        let names = column(1);
        let types = column(2);
        let wanted = feature_type.unwrap_or(GENE_EXPRESSION);
        let chosen: Vec<bool> = match &types {
            Some(types) => types.iter().map(|t| t == wanted).collect(),
            None if wanted == GENE_EXPRESSION => vec![true; ids.len()],
            None => Vec::new(),
        };
        if !chosen.contains(&true) && !ids.is_empty() {
            let has = match &types {
                Some(types) => tally(types),
                None => format!("no feature types (all {} are converted as {GENE_EXPRESSION:?})", ids.len()),
            };
            return Err(invalid(
                features_file.name(),
                format!("no {wanted:?} features; this file has {has}: --feature-type chooses"),
            ));
        }
        let keep = kept_columns(&chosen);
        let pick = |values: Vec<String>| picked(values, &chosen);
        let mut columns = Vec::new();
        if let Some(names) = names {
            columns.push(("name".to_string(), FrameColumn::String(pick(names).into_iter().map(Some).collect())));
        }
        if let Some(types) = types {
            columns.push(("feature_type".to_string(), MemoryTable::category_of(&pick(types))));
        }
        let var = MemoryTable {
            path: path.to_path_buf(),
            name: "var".into(),
            index_name: "_index".into(),
            index: pick(ids),
            columns,
        };
        let obs = MemoryTable {
            path: path.to_path_buf(),
            name: "obs".into(),
            index_name: "_index".into(),
            index: barcodes.into_iter().map(|mut b| b.swap_remove(0)).collect(),
            columns: Vec::new(),
        };
        Ok(MtxSource {
            path: path.to_path_buf(),
            remote: remote.clone(),
            matrix,
            header,
            orientation,
            keep,
            var,
            obs,
            parsed: std::sync::OnceLock::new(),
        })
    }

    /// The entries, sorted by cell: parsed on first use, or kept from an
    /// earlier opening of the same file.
    fn parsed(&self) -> Result<&Arc<Parsed>, InputError> {
        if let Some(p) = self.parsed.get() {
            return Ok(p);
        }
        let version = self.matrix.version(&self.remote).map_err(|source| InputError::Read {
            path: self.path.clone(),
            object: self.matrix.name(),
            source,
        })?;
        let key = (self.matrix.clone(), version, self.orientation == Orientation::GenesByCells);
        let kept = {
            let kept = PARSED.lock().unwrap_or_else(|e| e.into_inner());
            kept.iter().find(|(k, _)| *k == key).map(|(_, p)| p.clone())
        };
        let parsed = match kept {
            Some(p) => p,
            None => {
                let stream = self.matrix.open(&self.remote).map_err(|source| InputError::Read {
                    path: self.path.clone(),
                    object: self.matrix.name(),
                    source,
                })?;
                let p = Arc::new(
                    parse(stream, self.header, self.orientation, self.n_rows(), RUN_ENTRIES)
                        .map_err(|e| line_error(&self.path, &self.matrix, e))?,
                );
                let mut kept = PARSED.lock().unwrap_or_else(|e| e.into_inner());
                kept.retain(|(k, _)| *k != key);
                kept.push((key, p.clone()));
                if kept.len() > KEPT_MATRICES {
                    kept.remove(0);
                }
                p
            }
        };
        Ok(self.parsed.get_or_init(|| parsed))
    }
}

/// The input's error for a failure at a line of `place` (of the input at
/// `path`): a rule broken, or a failed read with its cause.
fn line_error(path: &Path, place: &Place, (line, problem): LineError) -> InputError {
    let (path, object) = (path.to_path_buf(), at(place, line));
    match problem {
        LineProblem::Rule(message) => InputError::Invalid { path, object, message },
        problem => InputError::Read { path, object, source: Box::new(problem) },
    }
}

/// `matrix.mtx.gz, line 12` (line 0: the file as a whole).
fn at(place: &Place, line: u64) -> String {
    if line == 0 {
        place.name()
    } else {
        format!("{}, line {line}", place.name())
    }
}

type Kept = ((Place, String, bool), Arc<Parsed>);

static PARSED: Mutex<Vec<Kept>> = Mutex::new(Vec::new());

impl InputSource for MtxSource {
    fn path(&self) -> &Path {
        &self.path
    }

    fn matrix_name(&self) -> &str {
        // (for messages: the matrix file's name)
        match &self.matrix {
            Place::File(p) => p.file_name().and_then(|n| n.to_str()).unwrap_or("matrix.mtx"),
            Place::Url(u) => u.rsplit('/').next().unwrap_or("matrix.mtx"),
        }
    }

    fn n_rows(&self) -> u64 {
        self.obs.index.len() as u64
    }

    fn n_cols(&self) -> u64 {
        self.var.index.len() as u64
    }

    fn read_rows(&self, rows: Range<u64>) -> Result<RawRows, InputError> {
        use std::os::unix::fs::FileExt;
        if rows.start > rows.end || rows.end > self.n_rows() {
            return Err(InputError::Invalid {
                path: self.path.clone(),
                object: self.matrix_name().into(),
                message: format!("rows {rows:?} outside 0..{}", self.n_rows()),
            });
        }
        let parsed = self.parsed()?;
        let (lo, hi) = (parsed.indptr[rows.start as usize], parsed.indptr[rows.end as usize]);
        let mut bytes = vec![0u8; (hi - lo) as usize * ENTRY_BYTES];
        parsed.file.read_exact_at(&mut bytes, lo * ENTRY_BYTES as u64).map_err(|e| InputError::Read {
            path: self.path.clone(),
            object: self.matrix_name().into(),
            source: Box::new(crate::inputs::Context::new("cannot read the temporary file of sorted entries", e)),
        })?;
        let mut out =
            RawRows { indptr: Vec::with_capacity((rows.end - rows.start) as usize + 1), ..Default::default() };
        out.indices.reserve((hi - lo) as usize);
        let mut values = Vec::with_capacity((hi - lo) as usize);
        out.indptr.push(0);
        let mut entries = bytes.chunks_exact(ENTRY_BYTES).map(Entry::from_bytes);
        for w in parsed.indptr[rows.start as usize..=rows.end as usize].windows(2) {
            for e in entries.by_ref().take((w[1] - w[0]) as usize) {
                let column = match &self.keep {
                    Some(keep) => keep[e.gene as usize],
                    None => e.gene,
                };
                if column != DROPPED_COLUMN {
                    out.indices.push(column);
                    values.push(e.value);
                }
            }
            out.indptr.push(out.indices.len() as u64);
        }
        out.values = values.into();
        Ok(out)
    }

    fn var(&self) -> Result<Box<dyn Table + '_>, InputError> {
        Ok(Box::new(&self.var))
    }

    fn obs(&self) -> Result<Option<Box<dyn Table + '_>>, InputError> {
        Ok(Some(Box::new(&self.obs)))
    }

    fn counts_elsewhere(&self) -> Option<String> {
        None
    }
}
