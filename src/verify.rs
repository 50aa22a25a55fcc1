//! Checking a whole dataset: everything a reader can check, every problem
//! reported rather than only the first. Tiles are checked in parallel, and
//! each tile's chunks in parallel within it.

use std::collections::BTreeSet;

use arrow_array::Array;
use rayon::prelude::*;
use serde::Serialize;

use crate::dataset::{parse_var_names, CheckedRecord, DatasetError, ReadOptions};
use crate::format::{self, fingerprint, npy, obs_schema::ObsSchema, Manifest, TileExpectation};
use crate::obs;
use crate::storage::{Storage, StorageError};

/// One thing wrong with a dataset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The file (key relative to the dataset root) it is in.
    pub file: String,
    /// The tile, when it is a tile's problem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tile: Option<usize>,
    /// The rule broken, e.g. `tile:crc32` or `obs-fingerprint`.
    pub rule: String,
    /// What is wrong, in words.
    pub message: String,
}

/// What `verify` found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VerifyReport {
    /// The dataset's location.
    pub dataset: String,
    /// Whether no problem was found.
    pub ok: bool,
    /// Tiles read and decoded.
    pub tiles_checked: usize,
    /// Cells and nonzeros in the tiles checked.
    pub cells: u64,
    pub nnz: u64,
    /// Bytes read, in all.
    pub bytes_read: u64,
    /// Every problem found, in the order found.
    pub problems: Vec<Problem>,
}

struct Problems(Vec<Problem>);

impl Problems {
    fn add(&mut self, file: &str, rule: &str, message: impl Into<String>) {
        self.0.push(Problem { file: file.to_string(), tile: None, rule: rule.to_string(), message: message.into() });
    }
}

/// Progress of a verification, for a progress bar.
pub trait VerifyProgress: Sync {
    /// Called once the manifest is read: how many tiles and tile bytes follow.
    fn start(&self, _tiles: u64, _bytes: u64) {}
    /// Called as each tile has been read, with its size.
    fn advance(&self, _bytes: u64) {}
}

/// No progress reporting.
pub struct NoProgress;

impl VerifyProgress for NoProgress {}

/// Checks the dataset in `storage`. An `Err` means verify could not run: no
/// manifest (an incomplete dataset) or storage that cannot be read.
pub fn verify(storage: &dyn Storage, progress: &dyn VerifyProgress) -> Result<VerifyReport, DatasetError> {
    verify_with(storage, progress, &ReadOptions::default())
}

/// [`verify`], recording each local tile found whole and sound as
/// [`ReadOptions`] say (in the record of checked tiles of their cache
/// folder, so that later gathers read its chunks alone).
pub fn verify_with(
    storage: &dyn Storage,
    progress: &dyn VerifyProgress,
    options: &ReadOptions,
) -> Result<VerifyReport, DatasetError> {
    let record = CheckedRecord::new(storage, options);
    let mut report = VerifyReport { dataset: storage.location(""), ..Default::default() };
    let mut problems = Problems(Vec::new());
    let bytes = storage.get(format::MANIFEST_KEY)?.ok_or_else(|| crate::dataset::no_manifest(storage))?;
    report.bytes_read += bytes.len() as u64;
    let manifest = match Manifest::parse(&bytes) {
        Ok(m) => m,
        Err(e) => {
            problems.add(format::MANIFEST_KEY, e.rule(), e.to_string());
            return Ok(finish(report, problems));
        }
    };
    for e in manifest.check() {
        problems.add(format::MANIFEST_KEY, e.rule(), e.to_string());
    }
    let n = manifest.tile_cells.len();
    if manifest.tile_nnz.len() == n && manifest.tile_bytes.len() == n && manifest.n_genes <= format::MAX_GENES {
        progress.start(n as u64, manifest.tile_bytes.iter().sum());
        check_tiles(storage, &manifest, progress, &record, &mut report, &mut problems)?;
    }
    check_var(storage, &manifest, &mut problems)?;
    check_obs(storage, &manifest, &mut problems)?;
    Ok(finish(report, problems))
}

fn finish(mut report: VerifyReport, problems: Problems) -> VerifyReport {
    report.problems = problems.0;
    report.ok = report.problems.is_empty();
    report
}

fn check_tiles(
    storage: &dyn Storage,
    manifest: &Manifest,
    progress: &dyn VerifyProgress,
    record: &CheckedRecord,
    report: &mut VerifyReport,
    problems: &mut Problems,
) -> Result<(), StorageError> {
    let results: Vec<Result<(Vec<Problem>, u64), StorageError>> = (0..manifest.n_tiles())
        .into_par_iter()
        .map(|t| {
            let key = format::tile_key(t);
            let mut found = Vec::new();
            let mut add = |rule: &str, message: String| {
                found.push(Problem { file: key.clone(), tile: Some(t), rule: rule.into(), message })
            };
            let before = record.version(storage, t);
            let Some(blob) = storage.get(&key)? else {
                add("tile-missing", format!("tile {t} is missing"));
                return Ok((found, 0));
            };
            progress.advance(blob.len() as u64);
            if blob.len() as u64 != manifest.tile_bytes[t] {
                add(
                    "tile-bytes",
                    format!("tile is {} bytes, the manifest says {}", blob.len(), manifest.tile_bytes[t]),
                );
            }
            let expect = TileExpectation {
                n_cells: manifest.tile_cells[t],
                nnz: manifest.tile_nnz[t],
                n_genes: manifest.n_genes as u32,
            };
            // Each thread decodes into one output it keeps: a fresh one per
            // tile would fault in as much memory as the tile decodes to, which
            // costs about as much as decoding it.
            thread_local! {
                static OUT: std::cell::RefCell<format::CsrMatrix> = Default::default();
            }
            let decoded = OUT.with(|out| format::decode_tile_into(&blob, Some(&expect), &mut out.borrow_mut()));
            if let Err(e) = decoded {
                add(e.rule(), format!("tile {t}: {e}"));
            }
            if found.is_empty() {
                record.add_if_unchanged(storage, t, before);
            }
            Ok((found, blob.len() as u64))
        })
        .collect();
    for r in results {
        let (found, bytes) = r?;
        report.bytes_read += bytes;
        problems.0.extend(found);
    }
    report.tiles_checked = manifest.n_tiles();
    report.cells = manifest.tile_cells.iter().sum();
    report.nnz = manifest.tile_nnz.iter().sum();
    let expected: BTreeSet<String> = (0..manifest.n_tiles()).map(format::tile_key).collect();
    let listed = if storage.can_list() { storage.list("tiles")? } else { Vec::new() };
    for key in listed {
        if !expected.contains(&key) {
            problems.add(&key, "extra-file", "not a tile of this dataset (a leftover of an interrupted write?)");
        }
    }
    Ok(())
}

/// Checks a has_* flag against the file's presence; returns the file's bytes
/// when both say it exists.
fn flagged_file(
    storage: &dyn Storage,
    key: &str,
    flag: &str,
    flagged: bool,
    problems: &mut Problems,
) -> Result<Option<bytes::Bytes>, StorageError> {
    let data = storage.get(key)?;
    match (flagged, &data) {
        (true, None) => problems.add(key, "has-flags", format!("{flag} is true but the file is missing")),
        (false, Some(_)) => problems.add(key, "has-flags", format!("the file exists but {flag} is false")),
        _ => {}
    }
    Ok(data.filter(|_| flagged))
}

fn check_var(storage: &dyn Storage, manifest: &Manifest, problems: &mut Problems) -> Result<(), StorageError> {
    let n_genes = manifest.n_genes;
    if let Some(bytes) =
        flagged_file(storage, format::GENE_ORDER_KEY, "has_gene_order", manifest.has_gene_order, problems)?
    {
        match npy::read_i32(&bytes) {
            Err(e) => problems.add(format::GENE_ORDER_KEY, "gene-order", e.to_string()),
            Ok(order) => {
                if let Err(e) = npy::check_permutation(&order, n_genes) {
                    problems.add(
                        format::GENE_ORDER_KEY,
                        "gene-order",
                        format!("not a permutation of 0..{n_genes}: {e}"),
                    );
                }
            }
        }
    }
    if let Some(bytes) =
        flagged_file(storage, format::VAR_NAMES_KEY, "has_var_names", manifest.has_var_names, problems)?
    {
        if let Err(e) = parse_var_names(&bytes, n_genes) {
            problems.add(format::VAR_NAMES_KEY, "var-names", crate::error_chain(&e));
        }
    }
    if let Some(bytes) =
        flagged_file(storage, format::VAR_TABLE_KEY, "has_var_table", manifest.has_var_table, problems)?
    {
        match obs::parquet_rows(bytes) {
            Err(e) => problems.add(format::VAR_TABLE_KEY, "var-table", crate::error_chain(&e)),
            Ok(rows) if rows != n_genes => {
                problems.add(format::VAR_TABLE_KEY, "var-table", format!("has {rows} rows, expected n_genes {n_genes}"))
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

fn check_obs(storage: &dyn Storage, manifest: &Manifest, problems: &mut Problems) -> Result<(), StorageError> {
    let Some(obs_fields) = manifest.obs() else {
        let files = if storage.can_list() { storage.list("obs")? } else { Vec::new() };
        if let Some(first) = files.iter().find(|k| k.ends_with(".parquet") || k.ends_with("schema.json")) {
            problems.add(first, "has-flags", "obs files exist but has_obs is false");
        }
        return Ok(());
    };
    let schema_text = match storage.get(format::OBS_SCHEMA_KEY)? {
        None => {
            problems.add(format::OBS_SCHEMA_KEY, "obs-schema", "has_obs is true but the file is missing");
            None
        }
        Some(bytes) => match String::from_utf8(bytes.to_vec()) {
            Err(_) => {
                problems.add(format::OBS_SCHEMA_KEY, "obs-schema", "not UTF-8");
                None
            }
            Ok(text) => Some(text),
        },
    };
    let schema = schema_text.as_deref().and_then(|text| match ObsSchema::parse(text.as_bytes()) {
        Ok(s) => Some(s),
        Err(e) => {
            problems.add(format::OBS_SCHEMA_KEY, "obs-schema", crate::error_chain(&e));
            None
        }
    });
    let k = obs_fields.tiles_per_file as usize;
    if k == 0 {
        return Ok(()); // reported with the manifest
    }
    let n_shards = manifest.n_tiles().div_ceil(k);
    let shard_problems: Vec<Result<Vec<Problem>, StorageError>> = (0..n_shards)
        .into_par_iter()
        .map(|s| {
            let key = format::obs_shard_key(s);
            let mut found = Vec::new();
            let mut add = |rule: &str, message: String| {
                found.push(Problem { file: key.clone(), tile: None, rule: rule.into(), message })
            };
            let Some(bytes) = storage.get(&key)? else {
                add("obs-shard", format!("shard {s} is missing"));
                return Ok(found);
            };
            if let Some(&want) = obs_fields.shard_bytes.get(s) {
                if bytes.len() as u64 != want {
                    add("obs-shard-bytes", format!("shard is {} bytes, the manifest says {want}", bytes.len()));
                }
            }
            if let Some(want) = obs_fields.shard_sha256.get(s) {
                let have = fingerprint::sha256_hex(&bytes);
                if &have != want {
                    add("obs-shard-sha256", format!("sha256 is {have}, the manifest says {want}"));
                }
            }
            if let Some(schema) = &schema {
                let tiles = s * k..((s + 1) * k).min(manifest.n_tiles());
                for (rule, message) in obs::check_shard(bytes, schema, &manifest.tile_cells[tiles]) {
                    add(rule, message);
                }
            }
            Ok(found)
        })
        .collect();
    for r in shard_problems {
        problems.0.extend(r?);
    }
    if let Some(text) = &schema_text {
        let computed = fingerprint::obs_fingerprint(text, &manifest.tile_cells, obs_fields.shard_sha256);
        if computed != obs_fields.fingerprint {
            problems.add(
                format::MANIFEST_KEY,
                "obs-fingerprint",
                format!(
                    "obs_fingerprint is {}, but schema, tile_cells and shard hashes give {computed}",
                    obs_fields.fingerprint
                ),
            );
        }
    }
    Ok(())
}

/// Checks the columns of this dataset found in the local cache under `root`
/// against the shards: one record batch per tile with that tile's rows and the
/// same values. Returns the problems and how many cached columns were checked.
pub fn verify_cache(
    storage: &dyn Storage,
    root: &std::path::Path,
) -> Result<(Vec<Problem>, usize), crate::obs::localize::ObsError> {
    use crate::obs::localize::{column_path, ObsSource};
    let manifest = crate::dataset::read_manifest(storage)?;
    let Some(obs) = manifest.obs() else { return Ok((Vec::new(), 0)) };
    let source = ObsSource::open(storage, &manifest)?;
    let mut problems = Vec::new();
    let mut checked = 0;
    for (i, column) in source.schema.columns.iter().enumerate() {
        let path = column_path(root, obs.fingerprint, &column.name);
        if !path.exists() {
            continue;
        }
        checked += 1;
        let mut add = |message: String| {
            problems.push(Problem { file: path.display().to_string(), tile: None, rule: "obs-cache".into(), message })
        };
        let cached: Result<Vec<arrow_array::RecordBatch>, String> = std::fs::File::open(&path)
            .map_err(|e| e.to_string())
            .and_then(|f| arrow_ipc::reader::FileReader::try_new(f, None).map_err(|e| e.to_string()))
            .and_then(|r| r.collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string()));
        let cached = match cached {
            Ok(c) => c,
            Err(e) => {
                add(format!("not a readable Arrow IPC file: {e}"));
                continue;
            }
        };
        let (shards, _, _) = source.fetch_column(i)?;
        if cached.len() != shards.len() {
            add(format!("{} record batches, the dataset has {} tiles", cached.len(), shards.len()));
            continue;
        }
        for (t, (c, s)) in cached.iter().zip(&shards).enumerate() {
            if c.num_columns() != 1 || c.schema().field(0).name() != &column.name {
                add(format!("tile {t}: the batch is not the single column {:?}", column.name));
                break;
            }
            if c.column(0).to_data() != s.column(0).to_data() {
                add(format!("tile {t}: values differ from the shard"));
                break;
            }
        }
    }
    Ok((problems, checked))
}
