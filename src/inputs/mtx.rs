//! Matrix Market count matrices, as Cell Ranger, STARsolo, DRAGEN, BD Rhapsody
//! and ScaleBio write them, as an input of conversion ([`crate::inputs`]).
//!
//! An input is a folder holding `matrix.mtx[.gz]`, `features.tsv[.gz]` (or
//! `genes.tsv[.gz]`) and `barcodes.tsv[.gz]`, or the matrix file itself with
//! those beside it under the same prefix (GEO's `GSM1_matrix.mtx.gz` goes
//! with `GSM1_features.tsv.gz`). Any file may be gzip-compressed, which is
//! told by its first bytes, not its name. Inputs at URLs are streamed
//! through the storage layer.
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

use std::io::{BufRead, BufReader, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::inputs::remote::{is_url, RemoteOptions};
use crate::inputs::tenx::GENE_EXPRESSION;
use crate::inputs::{FrameColumn, InputError, InputSource, MemoryTable, RawRows, Table, DROPPED_COLUMN};

/// Entries sorted in memory at once before they are written to the
/// temporary file: 16 bytes each, so 64 MiB.
pub const RUN_ENTRIES: usize = 4 << 20;

/// Parsed matrices kept for the process's next openings of the same file.
const KEPT_MATRICES: usize = 4;

/// The bytes of an entry in the temporary file: cell and gene as u32, value
/// as f64, little-endian.
const ENTRY_BYTES: usize = 16;

/// A file of an input: a local path or an object at a URL.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Place {
    File(PathBuf),
    Url(String),
}

impl Place {
    /// Its name, for messages.
    fn name(&self) -> String {
        match self {
            Place::File(p) => p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into()),
            Place::Url(u) => u.rsplit('/').next().unwrap_or(u).to_string(),
        }
    }

    /// The file named `name` beside this one, if it exists.
    fn sibling(&self, name: &str, remote: &RemoteOptions) -> Option<Place> {
        match self {
            Place::File(p) => {
                let other = p.with_file_name(name);
                other.is_file().then_some(Place::File(other))
            }
            Place::Url(u) => {
                let base = &u[..u.rfind('/').map_or(0, |i| i + 1)];
                let other = format!("{base}{name}");
                crate::inputs::remote::ranged::object_version(&other, &remote.store).ok().map(|_| Place::Url(other))
            }
        }
    }

    /// What identifies this version of the file: its size and modification
    /// time, or its size and entity tag.
    fn version(&self, remote: &RemoteOptions) -> Result<String, String> {
        match self {
            Place::File(p) => {
                let m = std::fs::metadata(p).map_err(|e| e.to_string())?;
                let modified = m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
                Ok(format!("{} {:?}", m.len(), modified))
            }
            Place::Url(u) => {
                let v = crate::inputs::remote::ranged::object_version(u, &remote.store)?;
                Ok(format!("{} {:?}", v.size, v.etag))
            }
        }
    }

    /// Its bytes, as a stream (decompressed when they are gzip).
    fn open(&self, remote: &RemoteOptions) -> Result<Box<dyn BufRead + Send>, String> {
        let raw: Box<dyn Read + Send> = match self {
            Place::File(p) => Box::new(std::fs::File::open(p).map_err(|e| e.to_string())?),
            Place::Url(u) => match crate::inputs::remote::downloaded(u, remote)? {
                Some(local) => Box::new(std::fs::File::open(local).map_err(|e| e.to_string())?),
                None => Box::new(UrlReader::open(u, remote)?),
            },
        };
        let mut buffered = BufReader::with_capacity(1 << 20, raw);
        let head = buffered.fill_buf().map_err(|e| e.to_string())?;
        if head.starts_with(&[0x1f, 0x8b]) {
            Ok(Box::new(BufReader::with_capacity(1 << 20, flate2::bufread::MultiGzDecoder::new(buffered))))
        } else {
            Ok(Box::new(buffered))
        }
    }
}

/// An object at a URL read from start to end, fetched ahead.
struct UrlReader {
    file: Arc<crate::inputs::remote::ranged::RangedFile>,
    at: u64,
}

impl UrlReader {
    fn open(url: &str, remote: &RemoteOptions) -> Result<UrlReader, String> {
        let file = crate::inputs::remote::ranged::RangedFile::open(url, &remote.store)?;
        file.set_extents(std::slice::from_ref(&(0..file.size())));
        crate::inputs::remote::ranged::prefetch_whole(&file, &[0]);
        Ok(UrlReader { file, at: 0 })
    }
}

impl Read for UrlReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (self.file.size().saturating_sub(self.at)).min(buf.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.file
            .read(self.at, &mut buf[..n], crate::inputs::remote::ranged::ReadOf::Data)
            .map_err(std::io::Error::other)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// The matrix file of a Matrix Market folder: `matrix.mtx.gz` or
/// `matrix.mtx`, else the one file whose name ends so.
pub fn matrix_file(dir: &Path) -> Result<PathBuf, InputError> {
    let error = |message: String| InputError::Open { path: dir.to_path_buf(), format: "Matrix Market", message };
    for name in ["matrix.mtx.gz", "matrix.mtx"] {
        if dir.join(name).is_file() {
            return Ok(dir.join(name));
        }
    }
    let listing = std::fs::read_dir(dir).map_err(|e| error(e.to_string()))?;
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

/// The matrix's first lines.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Header {
    rows: u64,
    cols: u64,
    entries: u64,
    /// The line of the first entry (1-based).
    first_line: u64,
}

/// Whether the matrix is stored genes x cells.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Orientation {
    GenesByCells,
    CellsByGenes,
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
            Place::Url(path.to_string_lossy().into_owned())
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

        let features = read_tsv(&features_file, remote).map_err(|(line, m)| invalid(at(&features_file, line), m))?;
        let barcodes = read_tsv(&barcodes_file, remote).map_err(|(line, m)| invalid(at(&barcodes_file, line), m))?;
        let header = read_header(&mut matrix.open(remote).map_err(open_error)?)
            .map_err(|(line, m)| invalid(at(&matrix, line), m))?;
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
                Some(types) => crate::inputs::tenx::tally(types),
                None => format!("no feature types (all {} are converted as {GENE_EXPRESSION:?})", ids.len()),
            };
            return Err(invalid(
                features_file.name(),
                format!("no {wanted:?} features; this file has {has}: --feature-type chooses"),
            ));
        }
        let keep = crate::inputs::tenx::kept_columns(&chosen);
        let pick = |values: Vec<String>| crate::inputs::tenx::picked(values, &chosen);
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
        let invalid =
            |object: String, message: String| InputError::Invalid { path: self.path.clone(), object, message };
        let version = self.matrix.version(&self.remote).map_err(|m| invalid(self.matrix.name(), m))?;
        let key = (self.matrix.clone(), version, self.orientation == Orientation::GenesByCells);
        let kept = {
            let kept = PARSED.lock().unwrap_or_else(|e| e.into_inner());
            kept.iter().find(|(k, _)| *k == key).map(|(_, p)| p.clone())
        };
        let parsed = match kept {
            Some(p) => p,
            None => {
                let stream = self.matrix.open(&self.remote).map_err(|m| invalid(self.matrix.name(), m))?;
                let p = Arc::new(
                    parse(stream, self.header, self.orientation, self.n_rows(), RUN_ENTRIES)
                        .map_err(|(line, m)| invalid(at(&self.matrix, line), m))?,
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

/// A failure at a line of a file (0: not at a line).
type LineError = (u64, String);

/// Says what a failed read of text means: a gzip stream that ends early or
/// does not decode, or the read's own failure.
fn read_failure(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "the gzip stream ends early (a truncated file)".into(),
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
            format!("the gzip stream is corrupt ({e})")
        }
        _ => format!("cannot be read: {e}"),
    }
}

/// The lines of a tab-separated text file, each split into its fields.
fn read_tsv(place: &Place, remote: &RemoteOptions) -> Result<Vec<Vec<String>>, LineError> {
    let stream = place.open(remote).map_err(|m| (0, m))?;
    let mut rows = Vec::new();
    for (n, line) in stream.split(b'\n').enumerate() {
        let line = line.map_err(|e| (n as u64 + 1, read_failure(&e)))?;
        let text = std::str::from_utf8(&line).map_err(|_| (n as u64 + 1, "is not UTF-8 text".to_string()))?;
        let text = text.strip_suffix('\r').unwrap_or(text);
        if text.is_empty() {
            continue;
        }
        rows.push(text.split('\t').map(str::to_string).collect());
    }
    Ok(rows)
}

/// Reads the banner and the sizes line.
fn read_header(stream: &mut dyn BufRead) -> Result<Header, LineError> {
    let mut line = Vec::new();
    let mut n = 0u64;
    let mut next = |line: &mut Vec<u8>| -> Result<bool, LineError> {
        line.clear();
        n += 1;
        let read = stream.read_until(b'\n', line).map_err(|e| (n, read_failure(&e)))?;
        Ok(read > 0)
    };
    if !next(&mut line)? {
        return Err((1, "is empty".into()));
    }
    let banner = String::from_utf8_lossy(&line).to_lowercase();
    let words: Vec<&str> = banner.split_whitespace().collect();
    if words.first() != Some(&"%%matrixmarket") {
        return Err((1, "does not start with %%MatrixMarket: not a Matrix Market file".into()));
    }
    match words.get(1..5) {
        Some(["matrix", "coordinate", "integer" | "real", "general"]) => {}
        Some(["matrix", "array", ..]) => {
            return Err((1, "unsupported: a dense (array) matrix; deltacells reads coordinate matrices".into()))
        }
        Some(["matrix", "coordinate", field @ ("pattern" | "complex"), _]) => {
            return Err((1, format!("unsupported: {field} values; counts are integer or real")))
        }
        Some(["matrix", "coordinate", _, symmetry]) => {
            return Err((1, format!("unsupported: a {symmetry} matrix; counts are general")))
        }
        _ => return Err((1, format!("unsupported banner {:?}", String::from_utf8_lossy(&line).trim()))),
    }
    let mut at = 1u64;
    loop {
        if !next(&mut line)? {
            return Err((at + 1, "ends before the line of sizes".into()));
        }
        at += 1;
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if text.is_empty() || text.starts_with('%') {
            continue;
        }
        let sizes: Vec<u64> = text
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| (at, format!("{text:?} is not the three sizes (rows, columns, entries)")))?;
        let [rows, cols, entries] = sizes[..] else {
            return Err((at, format!("{text:?} is not the three sizes (rows, columns, entries)")));
        };
        if rows > u64::from(u32::MAX) || cols > u64::from(u32::MAX) {
            return Err((at, format!("{rows} x {cols} is larger than deltacells stores (2^32-1 cells or genes)")));
        }
        return Ok(Header { rows, cols, entries, first_line: at + 1 });
    }
}

/// The entries of a matrix, sorted by cell, in an unnamed temporary file.
struct Parsed {
    /// Each cell's first entry, and the end (n_cells + 1 values).
    indptr: Vec<u64>,
    file: std::fs::File,
}

/// One entry of the matrix, as kept.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Entry {
    cell: u32,
    gene: u32,
    value: f64,
}

impl Entry {
    fn bytes(&self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[..4].copy_from_slice(&self.cell.to_le_bytes());
        b[4..8].copy_from_slice(&self.gene.to_le_bytes());
        b[8..].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8]) -> Entry {
        let word = |r: Range<usize>| u32::from_le_bytes(b[r].try_into().unwrap_or_default());
        Entry { cell: word(0..4), gene: word(4..8), value: f64::from_le_bytes(b[8..16].try_into().unwrap_or_default()) }
    }
}

/// The fields of an entry's line: row, column (1-based) and value.
fn parse_entry(line: &[u8]) -> Option<(u64, u64, f64)> {
    let mut fields = line.split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty());
    let int = |f: &[u8]| -> Option<u64> {
        if f.is_empty() || f.len() > 19 || !f.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(f.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
    };
    let row = int(fields.next()?)?;
    let col = int(fields.next()?)?;
    let v = fields.next()?;
    let value = match int(v) {
        Some(n) if n < (1 << 53) => n as f64,
        _ => std::str::from_utf8(v).ok()?.parse::<f64>().ok()?,
    };
    if fields.next().is_some() {
        return None;
    }
    Some((row, col, value))
}

/// Parses every entry of the matrix (whose header `header` was read from the
/// start of `stream`) and keeps them sorted by cell.
fn parse(
    mut stream: Box<dyn BufRead + Send>,
    header: Header,
    orientation: Orientation,
    n_cells: u64,
    run_entries: usize,
) -> Result<Parsed, LineError> {
    let temp = |e: std::io::Error| (0, format!("cannot write the temporary file of sorted entries ($TMPDIR): {e}"));
    let mut file = std::io::BufWriter::with_capacity(1 << 20, tempfile::tempfile().map_err(temp)?);
    let mut counts = vec![0u64; n_cells as usize + 1];
    let mut run: Vec<Entry> = Vec::with_capacity(run_entries.min(header.entries as usize));
    // Each run's first entry in the file, and whether each run starts at or
    // after the cells of the one before (then no merge is needed).
    let mut runs: Vec<u64> = vec![0];
    let mut in_order = true;
    let mut last_cell = 0u32;
    let mut written = 0u64;
    let mut flush = |run: &mut Vec<Entry>, file: &mut std::io::BufWriter<std::fs::File>| -> Result<(), LineError> {
        if !run.is_sorted_by_key(|e| (e.cell, e.gene)) {
            run.sort_unstable_by_key(|e| (e.cell, e.gene));
        }
        if let Some(first) = run.first() {
            if first.cell < last_cell {
                in_order = false;
            }
            last_cell = run.last().map_or(last_cell, |e| e.cell);
        }
        for e in run.iter() {
            file.write_all(&e.bytes()).map_err(temp)?;
        }
        written += run.len() as u64;
        runs.push(written);
        run.clear();
        Ok(())
    };

    // Skip the header, counting lines.
    let mut line = Vec::with_capacity(64);
    let mut number = 0u64;
    while number + 1 < header.first_line {
        line.clear();
        number += 1;
        stream.read_until(b'\n', &mut line).map_err(|e| (number, read_failure(&e)))?;
    }
    let mut seen = 0u64;
    let (n_rows, n_cols) = (header.rows, header.cols);
    loop {
        line.clear();
        number += 1;
        let read = stream.read_until(b'\n', &mut line).map_err(|e| (number, read_failure(&e)))?;
        if read == 0 {
            break;
        }
        let text = line.trim_ascii();
        if text.is_empty() || text.starts_with(b"%") {
            continue;
        }
        let Some((r, c, value)) = parse_entry(text) else {
            return Err((number, format!("{:?} is not an entry (row, column, value)", String::from_utf8_lossy(text))));
        };
        if r == 0 || r > n_rows || c == 0 || c > n_cols {
            return Err((
                number,
                format!("entry ({r}, {c}) is outside the header's {n_rows} x {n_cols} (rows and columns count from 1)"),
            ));
        }
        seen += 1;
        if seen > header.entries {
            return Err((number, format!("more entries than the {} the header says", header.entries)));
        }
        let (cell, gene) = match orientation {
            Orientation::GenesByCells => (c - 1, r - 1),
            Orientation::CellsByGenes => (r - 1, c - 1),
        };
        counts[cell as usize + 1] += 1;
        run.push(Entry { cell: cell as u32, gene: gene as u32, value });
        if run.len() >= run_entries {
            flush(&mut run, &mut file)?;
        }
    }
    if seen < header.entries {
        return Err((number, format!("the file ends after {seen} entries, but the header says {}", header.entries)));
    }
    flush(&mut run, &mut file)?;
    let file = file.into_inner().map_err(|e| temp(e.into_error()))?;
    for i in 1..counts.len() {
        counts[i] += counts[i - 1];
    }
    let runs: Vec<Range<u64>> = runs.windows(2).map(|w| w[0]..w[1]).filter(|r| !r.is_empty()).collect();
    let file = if in_order || runs.len() <= 1 { file } else { merge(&file, &runs).map_err(temp)? };
    Ok(Parsed { indptr: counts, file })
}

/// Merges sorted runs of entries (ranges of entries of `file`) into a new
/// temporary file.
fn merge(file: &std::fs::File, runs: &[Range<u64>]) -> std::io::Result<std::fs::File> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    // Each run is read a block at a time.
    const BLOCK: u64 = 1 << 16;
    struct Cursor {
        next: u64,
        end: u64,
        block: Vec<Entry>,
        at: usize,
    }
    let fill = |c: &mut Cursor| -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let n = (c.end - c.next).min(BLOCK);
        let mut bytes = vec![0u8; n as usize * ENTRY_BYTES];
        file.read_exact_at(&mut bytes, c.next * ENTRY_BYTES as u64)?;
        c.block = bytes.chunks_exact(ENTRY_BYTES).map(Entry::from_bytes).collect();
        c.at = 0;
        c.next += n;
        Ok(())
    };
    let mut cursors: Vec<Cursor> = Vec::with_capacity(runs.len());
    let mut heap = BinaryHeap::new();
    for (k, r) in runs.iter().enumerate() {
        let mut c = Cursor { next: r.start, end: r.end, block: Vec::new(), at: 0 };
        fill(&mut c)?;
        heap.push(Reverse((c.block[0].cell, c.block[0].gene, k)));
        cursors.push(c);
    }
    let mut out = std::io::BufWriter::with_capacity(1 << 20, tempfile::tempfile()?);
    while let Some(Reverse((_, _, k))) = heap.pop() {
        let c = &mut cursors[k];
        out.write_all(&c.block[c.at].bytes())?;
        c.at += 1;
        if c.at == c.block.len() {
            if c.next == c.end {
                continue;
            }
            fill(c)?;
        }
        let e = c.block[c.at];
        heap.push(Reverse((e.cell, e.gene, k)));
    }
    out.into_inner().map_err(|e| e.into_error())
}

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
        parsed.file.read_exact_at(&mut bytes, lo * ENTRY_BYTES as u64).map_err(|e| InputError::Invalid {
            path: self.path.clone(),
            object: self.matrix_name().into(),
            message: format!("cannot read the temporary file of sorted entries: {e}"),
        })?;
        let mut out =
            RawRows { indptr: Vec::with_capacity((rows.end - rows.start) as usize + 1), ..Default::default() };
        out.indices.reserve((hi - lo) as usize);
        out.values.reserve((hi - lo) as usize);
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
                    out.values.push(e.value);
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
        Ok(Some(Box::new(&self.obs)))
    }

    fn counts_elsewhere(&self) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(text: &str) -> Result<Header, LineError> {
        read_header(&mut text.as_bytes())
    }

    #[test]
    fn headers_are_read_or_refused() {
        let h = header("%%MatrixMarket matrix coordinate integer general\n%comment\n3 4 5\n1 1 1\n").unwrap();
        assert_eq!(h, Header { rows: 3, cols: 4, entries: 5, first_line: 4 });
        assert!(header("%%MatrixMarket matrix coordinate real general\n\n3 4 5\n").is_ok());
        assert!(header("%%MatrixMarket matrix array real general\n3 4\n").unwrap_err().1.contains("dense"));
        assert!(header("%%MatrixMarket matrix coordinate pattern general\n").unwrap_err().1.contains("pattern"));
        assert!(header("%%MatrixMarket matrix coordinate integer symmetric\n").unwrap_err().1.contains("symmetric"));
        assert!(header("hello\n").unwrap_err().1.contains("not a Matrix Market"));
        assert_eq!(header("%%MatrixMarket matrix coordinate integer general\n3 4\n").unwrap_err().0, 2);
        assert!(header("%%MatrixMarket matrix coordinate integer general\n% only\n").unwrap_err().1.contains("ends"));
    }

    #[test]
    fn entries_are_parsed() {
        assert_eq!(parse_entry(b"3 4 5"), Some((3, 4, 5.0)));
        assert_eq!(parse_entry(b"3\t4  2.5"), Some((3, 4, 2.5)));
        assert_eq!(parse_entry(b"3 4 -1"), Some((3, 4, -1.0)));
        assert_eq!(parse_entry(b"3 4 1e3"), Some((3, 4, 1000.0)));
        assert_eq!(parse_entry(b"3 4"), None);
        assert_eq!(parse_entry(b"3 4 5 6"), None);
        assert_eq!(parse_entry(b"-3 4 5"), None);
        assert_eq!(parse_entry(b"99999999999999999999999 4 5"), None);
    }

    /// Parses `text` (row, column, value lines of a genes x cells matrix),
    /// sorting runs of `run` entries: each cell's (gene, value) pairs.
    fn parsed(text: &str, genes: u64, cells: u64, n: u64, run: usize) -> Result<Vec<Vec<(u32, f64)>>, LineError> {
        use std::os::unix::fs::FileExt;
        let body = format!("%%MatrixMarket matrix coordinate integer general\n{genes} {cells} {n}\n{text}");
        let h = header(&body)?;
        let p = parse(Box::new(std::io::Cursor::new(body.into_bytes())), h, Orientation::GenesByCells, cells, run)?;
        let mut bytes = vec![0u8; *p.indptr.last().unwrap() as usize * ENTRY_BYTES];
        p.file.read_exact_at(&mut bytes, 0).unwrap();
        let entries: Vec<Entry> = bytes.chunks_exact(ENTRY_BYTES).map(Entry::from_bytes).collect();
        let cell = |w: &[u64]| entries[w[0] as usize..w[1] as usize].iter().map(|e| (e.gene, e.value)).collect();
        Ok(p.indptr.windows(2).map(cell).collect())
    }

    #[test]
    fn entries_in_any_order_are_sorted_by_cell() {
        let cells = parsed("2 3 7\n1 1 1\n3 1 2\n% a comment\n1 3 4\n", 3, 3, 4, RUN_ENTRIES).unwrap();
        assert_eq!(cells, vec![vec![(0, 1.0), (2, 2.0)], vec![], vec![(0, 4.0), (1, 7.0)]]);
        // In reverse cell order, in runs of 7 entries: the runs are merged.
        let (n, n_cells) = (1000u64, 30u64);
        let mut text = String::new();
        let mut want = vec![Vec::new(); n_cells as usize];
        for k in (0..n).rev() {
            let (gene, cell, value) = (k % 7, k % n_cells, k % 5 + 1);
            text.push_str(&format!("{} {} {value}\n", gene + 1, cell + 1));
            want[cell as usize].push((gene as u32, value as f64));
        }
        for run in [7, 1, n as usize] {
            let mut cells = parsed(&text, 7, n_cells, n, run).unwrap();
            for (got, want) in cells.iter_mut().zip(&mut want) {
                assert!(got.windows(2).all(|w| w[0].0 <= w[1].0), "each cell is sorted by gene");
                got.sort_by(|a, b| a.partial_cmp(b).unwrap());
                want.sort_by(|a, b| a.partial_cmp(b).unwrap());
                assert_eq!(got, want);
            }
        }
        // In cell order, in several runs: written once, not merged.
        let text: String = (0..n).map(|k| format!("{} {} 1\n", k % 7 + 1, k * n_cells / n + 1)).collect();
        let cells = parsed(&text, 7, n_cells, n, 7).unwrap();
        assert_eq!(cells.iter().map(Vec::len).sum::<usize>() as u64, n);
    }

    #[test]
    fn bad_entries_name_their_line() {
        let parsed = |text: &str, n: u64| parsed(text, 3, 3, n, RUN_ENTRIES);
        let e = parsed("1 1 1\n4 1 1\n", 2).unwrap_err();
        assert_eq!(e.0, 4);
        assert!(e.1.contains("outside the header's 3 x 3"), "{}", e.1);
        assert!(parsed("1 1 1\n", 2).unwrap_err().1.contains("ends after 1 entries"));
        assert!(parsed("1 1 1\n1 2 1\n", 1).unwrap_err().1.contains("more entries"));
        assert_eq!(parsed("1 1 x\n", 1).unwrap_err().0, 3);
    }
}
