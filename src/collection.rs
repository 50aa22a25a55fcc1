//! Many datasets read as one: a [`Collection`] puts the cells of its
//! datasets one after another in one cell space (the first dataset's cells
//! first, in the order the datasets were given), and writes every cell in one
//! gene vocabulary: the union of the datasets' genes, their intersection, or
//! a list of names. Each dataset's stored columns are mapped onto the
//! vocabulary by its own [`GeneMap`], as each cell is written.
//!
//! The vocabulary's order: for `union`, the first dataset's genes in its
//! column (stored) order, then each next dataset's genes that were not seen
//! yet, in its column order; for `intersection`, the genes every dataset
//! has, in the first dataset's column order; a list keeps its order. So the
//! first dataset's cells, and those of every dataset stored in its gene order
//! (`convert --gene-order-from` it), are written as they are stored, with no
//! map: a map costs a lookup per entry and a sort per cell.
//! Genes are matched by name (var_names), or by a var column when one is
//! given; a name a dataset stores twice is one gene (its counts added).
//!
//! Opening a collection opens every dataset once, to read its manifest and
//! gene names; what it learns (cells per tile, the manifest's SHA-256, the
//! vocabulary) is its [`CollectionState`], from which another process makes
//! the same collection without opening anything: each dataset is opened when
//! it is first read, and refused, naming it, if its manifest changed. An open
//! dataset costs its manifest (a few hundred bytes per tile) and its map (4
//! bytes per stored gene, and 4 per vocabulary gene once top-k batches or
//! [`Collection::holders`] ask for it). While a collection is opened, each
//! distinct gene name is kept once, as are 4 bytes per stored gene of every
//! dataset.
//!
//! A collection can be written down as a small JSON file
//! ([`CollectionFile`]): the roots, the gene choice, weights per dataset and
//! each manifest's SHA-256.

use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rand::seq::SliceRandom;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::batch::BatchOutput;
use crate::dataset::{ReadOptions, DEFAULT_CACHE_BYTES};
use crate::loader::{rng_for, LoaderError, LoaderOptions, OpenMember, TileSource, MAX_DRAWS_PER_CELL};
use crate::storage::{self, StoreOptions};
use crate::vocabulary::{GeneMap, VocabularyError};
use crate::{Dataset, DatasetError};

/// Why a collection cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum CollectionError {
    /// An argument out of its range (the message names it).
    #[error("{0}")]
    Argument(String),
    /// A dataset could not be opened or read (its error, the source, names
    /// its location).
    #[error("dataset {name:?}")]
    Member { name: String, source: DatasetError },
    /// A dataset's manifest is not the one the collection recorded.
    #[error(
        "dataset {name:?} ({root}) changed since the collection was made: its manifest.json has SHA-256 {now}, \
         the collection recorded {was}; make the collection again to read it as it is now"
    )]
    Changed { name: String, root: String, was: String, now: String },
    /// The gene vocabulary cannot be built.
    #[error(transparent)]
    Genes(#[from] VocabularyError),
    /// A cell index at or past the collection's cells.
    #[error("cell {cell} is out of range: the collection has {n_cells} cells")]
    CellOutOfRange { cell: u64, n_cells: u64 },
    /// A collection file that is not one (the source says why).
    #[error("{path}")]
    File { path: String, source: CollectionFileError },
    /// A collection file that could not be read (the source says why).
    #[error("{path}: cannot read it")]
    Read { path: String, source: std::io::Error },
}

impl From<CollectionError> for LoaderError {
    fn from(e: CollectionError) -> Self {
        match e {
            CollectionError::Argument(m) => LoaderError::Options(m),
            other => LoaderError::Member(Box::new(other)),
        }
    }
}

/// The genes of a collection's batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GeneChoice {
    /// Every gene of any dataset.
    Union,
    /// The genes of every dataset.
    Intersection,
    /// These names, in this order.
    List(Vec<String>),
}

impl GeneChoice {
    /// `"union"`, `"intersection"`, or the list, as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            GeneChoice::Union => "union".into(),
            GeneChoice::Intersection => "intersection".into(),
            GeneChoice::List(names) => names.clone().into(),
        }
    }

    fn from_json(value: &serde_json::Value) -> Result<GeneChoice, String> {
        match value {
            serde_json::Value::String(s) if s == "union" => Ok(GeneChoice::Union),
            serde_json::Value::String(s) if s == "intersection" => Ok(GeneChoice::Intersection),
            serde_json::Value::Array(items) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string).ok_or("genes: a list of names holds a value that is not text"))
                .collect::<Result<_, _>>()
                .map(GeneChoice::List)
                .map_err(str::to_string),
            other => Err(format!("genes must be \"union\", \"intersection\" or a list of names, not {other}")),
        }
    }
}

/// What a collection knows of one dataset without opening it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberSummary {
    pub name: String,
    /// The root as given (a folder or a bucket URL).
    pub root: String,
    pub n_cells: u64,
    pub n_genes: u32,
    /// Cells per tile.
    pub tile_cells: Vec<u64>,
    /// SHA-256 of its manifest.json, in hex.
    pub manifest_sha256: String,
    /// Its manifest.json as opened, when it was (not from a collection
    /// file): another process opens the member as this version, reading on
    /// from a later one when a writer changed it since, as an open dataset
    /// does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// Its stored columns are the vocabulary's, in its order: its cells are
    /// written as they are stored, with no map.
    pub in_vocabulary: bool,
}

/// Everything another process needs to read a collection as this one does,
/// without opening any dataset first (`Collection::from_state`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectionState {
    pub members: Vec<MemberSummary>,
    /// The batches' genes, in column order.
    pub vocabulary: Vec<String>,
    /// The var column the names were matched against (None: the gene names).
    pub gene_column: Option<String>,
    pub anonymous: bool,
    pub endpoint: Option<String>,
}

/// One dataset of a collection: its summary, its tiles, and (once read) the
/// open dataset with its map onto the vocabulary.
struct Member {
    summary: MemberSummary,
    /// Cumulative cells per tile.
    limits: Vec<u64>,
    open: Mutex<Option<OpenMember>>,
}

/// How each of `n` datasets of a collection reads, the collection's cache
/// budget `total` shared among them: a collection of hundreds keeps no more
/// than one dataset would.
fn member_read_options(total: u64, n: usize, cache_dir: Option<&Path>) -> ReadOptions {
    ReadOptions {
        cache_bytes: total / n.max(1) as u64,
        cache_dir: cache_dir.map(Path::to_path_buf),
        ..ReadOptions::default()
    }
}

/// Several datasets read as one. See the [module](self).
pub struct Collection {
    members: Vec<Member>,
    /// `starts[m]`: the first cell of dataset m in the cell space; the last
    /// entry is the number of cells.
    starts: Vec<u64>,
    vocabulary: Arc<Vec<String>>,
    gene_column: Option<String>,
    store: StoreOptions,
    /// Decompressed chunks kept, over all its datasets (each keeps its share).
    cache_bytes: AtomicU64,
    /// Where its datasets remember the tiles whose CRC they checked (None:
    /// the default cache folder).
    cache_dir: Option<PathBuf>,
}

/// Checks the datasets' names and roots: some, each name and root once,
/// names not empty.
fn check_members(members: &[(String, String)]) -> Result<(), CollectionError> {
    let bad = |m: String| Err(CollectionError::Argument(m));
    if members.is_empty() {
        return bad("roots: the list is empty; a collection needs at least one dataset".into());
    }
    let mut names = HashSet::new();
    let mut roots = HashSet::new();
    for (name, root) in members {
        if name.is_empty() {
            return bad(format!("roots: the dataset at {root} has an empty name"));
        }
        if !names.insert(name.as_str()) {
            return bad(format!("roots: the name {name:?} is given twice; each dataset needs its own name"));
        }
        if !roots.insert(root.trim_end_matches('/')) {
            return bad(format!("roots: {root} is given twice; each dataset may be in a collection once"));
        }
    }
    Ok(())
}

/// A dataset opened, with the ids of its genes as the vocabulary matches
/// them (in stored order).
struct Opened {
    dataset: Arc<Dataset>,
    ids: Vec<u32>,
}

impl Collection {
    /// Opens the datasets `members` ((name, root) pairs, in cell-space
    /// order), each once (in parallel on `pool`, or rayon's global pool),
    /// and builds the vocabulary `genes` (matched against `gene_column` of
    /// var, or the gene names).
    pub fn open(
        members: &[(String, String)],
        genes: &GeneChoice,
        gene_column: Option<&str>,
        store: &StoreOptions,
    ) -> Result<Collection, CollectionError> {
        Collection::open_in(members, genes, gene_column, store, None)
    }

    /// [`Collection::open`], its datasets remembering the tiles whose CRC
    /// they checked in the cache folder `cache_dir` (None: the default one,
    /// as [`ReadOptions::cache_dir`]).
    pub fn open_in(
        members: &[(String, String)],
        genes: &GeneChoice,
        gene_column: Option<&str>,
        store: &StoreOptions,
        cache_dir: Option<PathBuf>,
    ) -> Result<Collection, CollectionError> {
        check_members(members)?;
        if let GeneChoice::List(names) = genes {
            // Checked before anything is opened.
            GeneMap::by_name(&[] as &[&str], names)?;
        }
        let read = member_read_options(DEFAULT_CACHE_BYTES, members.len(), cache_dir.as_deref());
        let names = Mutex::new(GeneIds::default());
        let opened: Vec<Opened> = members
            .par_iter()
            .map(|(name, root)| {
                let member = |source| CollectionError::Member { name: name.clone(), source };
                let dataset = storage::open_with(root, store)
                    .map_err(DatasetError::from)
                    .and_then(|store| Dataset::from_storage_with(store, &read))
                    .map_err(member)?;
                let keys = dataset.gene_keys(gene_column).map_err(member)?;
                let ids = names.lock().unwrap_or_else(|p| p.into_inner()).intern(keys)?;
                Ok(Opened { dataset: Arc::new(dataset), ids })
            })
            .collect::<Result<_, CollectionError>>()?;
        let names = names.into_inner().unwrap_or_else(|p| p.into_inner());
        let vocabulary = match genes {
            GeneChoice::List(names) => names.clone(),
            choice => {
                let ids: Vec<&[u32]> = opened.iter().map(|o| o.ids.as_slice()).collect();
                names.combined(&ids, *choice == GeneChoice::Union)
            }
        };
        if vocabulary.is_empty() {
            let names: Vec<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
            return Err(CollectionError::Argument(format!(
                "genes=\"intersection\": the datasets {names:?} share no gene (matched by {})",
                gene_column.unwrap_or("var_names")
            )));
        }
        let columns = names.columns_in(&vocabulary);
        drop(names);
        let mut built = Vec::with_capacity(opened.len());
        for ((name, root), o) in members.iter().zip(opened) {
            let map = genes::map_of(&o.ids, &columns, vocabulary.len())?;
            let in_vocabulary = map.is_identity();
            let m = o.dataset.manifest();
            let summary = MemberSummary {
                name: name.clone(),
                root: root.clone(),
                n_cells: o.dataset.n_cells(),
                n_genes: o.dataset.n_genes(),
                tile_cells: m.tile_cells.clone(),
                manifest_sha256: o.dataset.manifest_sha256().to_string(),
                manifest: std::str::from_utf8(o.dataset.manifest_bytes()).ok().map(str::to_string),
                in_vocabulary,
            };
            let limits = o.dataset.tile_limits().to_vec();
            let open = OpenMember { dataset: o.dataset, genes: (!in_vocabulary).then(|| Arc::new(map)) };
            built.push(Member { summary, limits, open: Mutex::new(Some(open)) });
        }
        Ok(Collection::assemble(built, vocabulary, gene_column.map(str::to_string), store.clone(), cache_dir))
    }

    /// The collection `state` describes, with no dataset opened yet: each is
    /// opened when first read, and refused if its manifest changed.
    pub fn from_state(state: CollectionState) -> Result<Collection, CollectionError> {
        Collection::from_state_in(state, None)
    }

    /// [`Collection::from_state`], its datasets remembering their checked
    /// tiles in `cache_dir` (as [`Collection::open_in`]).
    pub fn from_state_in(state: CollectionState, cache_dir: Option<PathBuf>) -> Result<Collection, CollectionError> {
        let pairs: Vec<(String, String)> = state.members.iter().map(|m| (m.name.clone(), m.root.clone())).collect();
        check_members(&pairs)?;
        if state.vocabulary.is_empty() {
            return Err(CollectionError::Argument("the collection's vocabulary is empty".into()));
        }
        let mut members = Vec::with_capacity(state.members.len());
        for summary in state.members {
            let limits = crate::dataset::cumulative(&summary.tile_cells);
            if limits.last().copied().unwrap_or(0) != summary.n_cells {
                return Err(CollectionError::Argument(format!(
                    "dataset {:?}: its tiles' cells do not add up to its {} cells",
                    summary.name, summary.n_cells
                )));
            }
            members.push(Member { summary, limits, open: Mutex::new(None) });
        }
        let store = StoreOptions { anonymous: state.anonymous, endpoint: state.endpoint };
        Ok(Collection::assemble(members, state.vocabulary, state.gene_column, store, cache_dir))
    }

    fn assemble(
        members: Vec<Member>,
        vocabulary: Vec<String>,
        gene_column: Option<String>,
        store: StoreOptions,
        cache_dir: Option<PathBuf>,
    ) -> Collection {
        let mut starts = Vec::with_capacity(members.len() + 1);
        let mut total = 0u64;
        for m in &members {
            starts.push(total);
            total += m.summary.n_cells;
        }
        starts.push(total);
        let cache_bytes = AtomicU64::new(DEFAULT_CACHE_BYTES);
        Collection { members, starts, vocabulary: Arc::new(vocabulary), gene_column, store, cache_bytes, cache_dir }
    }

    /// What another process needs to make this collection again.
    pub fn state(&self) -> CollectionState {
        CollectionState {
            members: self.members.iter().map(|m| m.summary.clone()).collect(),
            vocabulary: self.vocabulary.as_ref().clone(),
            gene_column: self.gene_column.clone(),
            anonymous: self.store.anonymous,
            endpoint: self.store.endpoint.clone(),
        }
    }

    /// The datasets, in cell-space order.
    pub fn members(&self) -> impl Iterator<Item = &MemberSummary> {
        self.members.iter().map(|m| &m.summary)
    }

    /// Sets the bytes of decompressed chunks its datasets' gathers keep in
    /// all (each its share; default [`DEFAULT_CACHE_BYTES`]), for those open
    /// now and those opened later.
    pub fn set_cache_bytes(&self, total: u64) {
        self.cache_bytes.store(total, Ordering::Relaxed);
        let share = member_read_options(total, self.members.len(), None).cache_bytes;
        for m in &self.members {
            if let Some(open) = &*m.open.lock().unwrap_or_else(|p| p.into_inner()) {
                open.dataset.set_cache_bytes(share);
            }
        }
    }

    /// Datasets.
    pub fn n_members(&self) -> usize {
        self.members.len()
    }

    /// Cells of all the datasets.
    pub fn n_cells(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The vocabulary: the batches' genes, in column order.
    pub fn vocabulary(&self) -> &[String] {
        &self.vocabulary
    }

    /// The var column names were matched against (None: the gene names).
    pub fn gene_column(&self) -> Option<&str> {
        self.gene_column.as_deref()
    }

    /// The cells of dataset `member` in the cell space.
    pub fn member_cells(&self, member: usize) -> Range<u64> {
        self.starts[member]..self.starts[member + 1]
    }

    /// The dataset of cell `cell` and its row there.
    pub fn locate(&self, cell: u64) -> Result<(usize, u64), CollectionError> {
        if cell >= self.n_cells() {
            return Err(CollectionError::CellOutOfRange { cell, n_cells: self.n_cells() });
        }
        let m = self.starts.partition_point(|&s| s <= cell) - 1;
        Ok((m, cell - self.starts[m]))
    }

    /// Dataset `member`, opened now if it is not yet (and checked against
    /// the manifest the collection recorded), with its map onto the
    /// vocabulary (None when its stored columns are the vocabulary's).
    pub fn open_member(&self, member: usize) -> Result<OpenMember, CollectionError> {
        let m = self.members.get(member).ok_or_else(|| {
            CollectionError::Argument(format!(
                "dataset {member} is out of range: the collection has {}",
                self.members.len()
            ))
        })?;
        let mut open = m.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = &*open {
            return Ok(o.clone());
        }
        let s = &m.summary;
        let failed = |source| CollectionError::Member { name: s.name.clone(), source };
        let read = member_read_options(
            self.cache_bytes.load(Ordering::Relaxed),
            self.members.len(),
            self.cache_dir.as_deref(),
        );
        let dataset = storage::open_with(&s.root, &self.store)
            .map_err(DatasetError::from)
            .and_then(|store| match &s.manifest {
                // (another dataset in its place: opened as it is, to name
                // its manifest below)
                Some(version) => match Dataset::from_storage_as(store.clone(), &read, version.as_bytes()) {
                    Err(DatasetError::Replaced { .. }) => Dataset::from_storage_with(store, &read),
                    opened => opened,
                },
                None => Dataset::from_storage_with(store, &read),
            })
            .map_err(failed)?;
        if dataset.manifest_sha256() != s.manifest_sha256 {
            return Err(CollectionError::Changed {
                name: s.name.clone(),
                root: s.root.clone(),
                was: s.manifest_sha256.clone(),
                now: dataset.manifest_sha256().to_string(),
            });
        }
        let keys = dataset.gene_keys(self.gene_column.as_deref()).map_err(failed)?;
        let map = GeneMap::by_name(&keys, &self.vocabulary)?;
        let genes = (!map.is_identity()).then(|| Arc::new(map));
        let opened = OpenMember { dataset: Arc::new(dataset), genes };
        *open = Some(opened.clone());
        Ok(opened)
    }

    /// Whether dataset `member` is open in this process.
    pub fn is_open(&self, member: usize) -> bool {
        self.members.get(member).is_some_and(|m| m.open.lock().map(|o| o.is_some()).unwrap_or(false))
    }

    /// Which datasets hold each gene of the vocabulary: per dataset, a flag
    /// per vocabulary gene. Opens every dataset.
    pub fn holders(&self) -> Result<Vec<Vec<bool>>, CollectionError> {
        (0..self.members.len())
            .into_par_iter()
            .map(|m| {
                let open = self.open_member(m)?;
                let map = open.genes.as_deref();
                Ok((0..self.vocabulary.len() as u32)
                    .map(|j| map.is_none_or(|m| m.first_stored(j) != u32::MAX))
                    .collect())
            })
            .collect()
    }

    /// An epoch's cells drawn by dataset: dataset m gets the share
    /// `weights[m] / sum(weights)` of `n` cells (largest remainders), taken
    /// from its cells among `cells` (or all of them): every one of them as
    /// many whole times as fit, then the rest drawn without replacement, in
    /// a draw fixed by the seed and epoch of `options` (the same for every
    /// rank and worker). A dataset with weight 0, or no cells, gets none.
    ///
    /// Refused, naming the argument: weights of the wrong length, a weight
    /// that is negative or not finite, weights all zero (or only on datasets
    /// with no cells), and more than [`MAX_DRAWS_PER_CELL`] draws per cell
    /// that can be drawn.
    pub fn draw_by_dataset(
        &self,
        cells: Option<&[u64]>,
        weights: &[f64],
        n: u64,
        options: &LoaderOptions,
    ) -> Result<Vec<u64>, CollectionError> {
        let bad = |m: String| Err(CollectionError::Argument(m));
        if weights.len() != self.members.len() {
            return bad(format!(
                "weights: {} values for {} datasets; give one per dataset",
                weights.len(),
                self.members.len()
            ));
        }
        for (m, &w) in weights.iter().enumerate() {
            if !(w.is_finite() && w >= 0.0) {
                return bad(format!(
                    "weights: dataset {:?} has weight {w}; weights must be finite and not negative",
                    self.members[m].summary.name
                ));
            }
        }
        // Each dataset's pool: its cells among `cells`, or all of them.
        let pools: Vec<Pool> = match cells {
            None => (0..self.members.len()).map(|m| Pool::Range(self.member_cells(m))).collect(),
            Some(cells) => {
                let mut lists: Vec<Vec<u64>> = vec![Vec::new(); self.members.len()];
                for &c in cells {
                    let (m, _) = self.locate(c)?;
                    lists[m].push(c);
                }
                lists.into_iter().map(Pool::List).collect()
            }
        };
        let drawable: u64 = pools.iter().zip(weights).filter(|(_, &w)| w > 0.0).map(|(p, _)| p.len()).sum();
        let total: f64 = pools.iter().zip(weights).filter(|(p, _)| p.len() > 0).map(|(_, &w)| w).sum();
        if drawable == 0 || total <= 0.0 {
            return bad("weights: no dataset with a positive weight has cells to draw".into());
        }
        if n > drawable.saturating_mul(MAX_DRAWS_PER_CELL) {
            return bad(format!(
                "num_samples {n} is more than {MAX_DRAWS_PER_CELL} draws for each of the {drawable} cells that can be drawn"
            ));
        }
        // Largest remainders: each dataset's whole share, then one more for
        // the largest fractions until n are given.
        let mut counts = vec![0u64; pools.len()];
        let mut fractions = Vec::new();
        let mut given = 0u64;
        for (m, (p, &w)) in pools.iter().zip(weights).enumerate() {
            if p.len() == 0 || w == 0.0 {
                continue;
            }
            let exact = n as f64 * w / total;
            counts[m] = exact.floor() as u64;
            given += counts[m];
            fractions.push((exact - exact.floor(), m));
        }
        fractions.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, m) in fractions.iter().cycle().take(n.saturating_sub(given) as usize) {
            counts[m] += 1;
        }
        let mut drawn = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        for (m, (pool, &k)) in pools.iter().zip(&counts).enumerate() {
            let size = pool.len();
            if k == 0 || size == 0 {
                continue;
            }
            for _ in 0..k / size {
                pool.extend_into(&mut drawn);
            }
            let rest = (k % size) as usize;
            if rest > 0 {
                let mut rng = rng_for(options, "datasets", &[m as u64]);
                let picked = rand::seq::index::sample(&mut rng, size as usize, rest);
                drawn.extend(picked.into_iter().map(|i| pool.get(i as u64)));
            }
        }
        drawn.shuffle(&mut rng_for(options, "dataset draws", &[]));
        Ok(drawn)
    }
}

/// The cells a dataset's draws come from.
enum Pool {
    Range(Range<u64>),
    List(Vec<u64>),
}

impl Pool {
    fn len(&self) -> u64 {
        match self {
            Pool::Range(r) => r.end - r.start,
            Pool::List(l) => l.len() as u64,
        }
    }

    fn get(&self, i: u64) -> u64 {
        match self {
            Pool::Range(r) => r.start + i,
            Pool::List(l) => l[i as usize],
        }
    }

    fn extend_into(&self, out: &mut Vec<u64>) {
        match self {
            Pool::Range(r) => out.extend(r.clone()),
            Pool::List(l) => out.extend_from_slice(l),
        }
    }
}

/// A batch's form as a collection takes it: no map of its own.
fn check_output(output: &BatchOutput, n_cols: u32) -> Result<(), CollectionError> {
    if output.genes.is_some() {
        return Err(CollectionError::Argument(
            "genes: a collection's batches are in its own vocabulary (chosen when it is opened)".into(),
        ));
    }
    output.check_columns(n_cols).map_err(|e| CollectionError::Argument(e.to_string()))
}

impl TileSource for Collection {
    fn n_members(&self) -> usize {
        self.members.len()
    }

    fn member_start(&self, member: usize) -> u64 {
        self.starts[member]
    }

    fn tile_limits(&self, member: usize) -> &[u64] {
        &self.members[member].limits
    }

    fn open_member(&self, member: usize) -> Result<OpenMember, LoaderError> {
        Ok(Collection::open_member(self, member)?)
    }

    fn check_output(&self, output: &BatchOutput) -> Result<u32, LoaderError> {
        let n_cols = self.vocabulary.len() as u32;
        check_output(output, n_cols)?;
        Ok(n_cols)
    }
}

mod file;
mod genes;
mod read;
pub use file::{CollectionFile, CollectionFileError, COLLECTION_FILE_VERSION};
use genes::GeneIds;

#[cfg(test)]
mod tests;
