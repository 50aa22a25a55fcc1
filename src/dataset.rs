//! Reading a dataset: the manifest, then cells by tile, by range or by list.

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use crate::buffers::BufferPool;
use crate::format::{self, npy, CsrFill, CsrMatrix, Manifest, ManifestError, TileError, TileExpectation};
use crate::storage::{self, Storage, StorageError};

/// Why a dataset could not be opened or read. Variants that wrap a cause name
/// the place and leave the cause to `source()`: print the whole chain (anyhow's
/// `{:#}`, or [`crate::error_chain`]) to see both.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// Files but no manifest: an interrupted writer's leftovers.
    #[error("{location}: incomplete dataset: no manifest.json")]
    Incomplete { location: String },
    /// No manifest, and the plan of a conversion that did not finish.
    #[error(
        "{location}: incomplete dataset: a conversion into it was interrupted before its manifest.json was written"
    )]
    Unfinished { location: String },
    /// No manifest, and the record of an append whose commit did not finish.
    #[error("{location}: incomplete dataset: an append into it was interrupted while it replaced files")]
    AppendUnfinished { location: String },
    /// Nothing at all at the location.
    #[error("{location}: no dataset here (nothing at this location)")]
    Nothing { location: String },
    /// manifest.json breaks a rule of the format.
    #[error("{location}")]
    Manifest { location: String, source: ManifestError },
    /// The bytes could not be reached.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A file the manifest says is there is not.
    #[error("{location}: missing ({what})")]
    Missing { location: String, what: String },
    /// A file that is there but not what the format allows.
    #[error("{location}: {message}")]
    Invalid { location: String, message: String },
    /// A var column asked for (to match genes by) that the gene table does not have.
    #[error("{location}: var has no column {name:?}; it has {have:?}")]
    NoVarColumn { location: String, name: String, have: Vec<String> },
    /// A batch's form that this dataset cannot be read in (an argument).
    #[error(transparent)]
    Output(#[from] crate::batch::OutputError),
    /// A tile breaks a rule of the format (the source names the rule).
    #[error("{location}: tile {tile}")]
    Tile { location: String, tile: usize, source: TileError },
    /// A cell index at or past the number of cells.
    #[error("cell {cell} is out of range: the dataset has {n_cells} cells")]
    CellOutOfRange { cell: u64, n_cells: u64 },
    /// A cell index below 0 (from a signed array: NumPy's, Python's).
    #[error("cell {cell} is out of range: the dataset has {n_cells} cells")]
    NegativeCell { cell: i64, n_cells: u64 },
}

/// An open dataset.
///
/// ```no_run
/// use deltacells::Dataset;
///
/// let ds = Dataset::open("out/pbmc")?;
/// println!("{} cells x {} genes in {} tiles", ds.n_cells(), ds.n_genes(), ds.n_tiles());
/// let first = ds.read_tile(0)?;            // one tile as CSR
/// let some = ds.read_cells(100..200)?;     // a range of cells
/// let picked = ds.read_cell_list(&[7, 3, 7])?; // any cells, in the order given
/// assert_eq!(picked.n_rows(), 3);
/// # Ok::<(), deltacells::DatasetError>(())
/// ```
pub struct Dataset {
    storage: Arc<dyn Storage>,
    manifest: Manifest,
    /// SHA-256 of manifest.json's bytes, in hex: what a collection records
    /// to notice a dataset that changed.
    manifest_sha256: String,
    /// limits[i] = first cell after tile i (cumulative tile_cells).
    limits: Vec<u64>,
    /// The buffers of tiles decoded for a range or list of cells, kept for
    /// the next read (up to [`KEPT_TILES`] tiles' worth).
    buffers: BufferPool,
    /// Chunks' planes of the last lists of cells read, kept for the next
    /// (their buffers written over, not zeroed and faulted in again).
    planes: crate::buffers::Pool<format::tile::ChunkPlanes>,
    /// The tile the last range read ended in, for the next range.
    recent: std::sync::Mutex<Recent>,
}

/// The tile a range read ended in: its bytes, checked (CRC included) once,
/// and its chunks decompressed last, as planes. A pass over the cells in
/// consecutive ranges (an inference or export loop of `read_cells`) then
/// fetches and checks each tile once and decompresses each chunk once,
/// instead of once per range, and each range decodes its rows from the
/// planes straight into the output. Holds one compressed tile and at most
/// [`RECENT_CHUNKS`] chunks' planes (4 bytes per nonzero).
#[derive(Default)]
struct Recent {
    tile: Option<usize>,
    blob: bytes::Bytes,
    chunks: Vec<(usize, format::tile::ChunkPlanes)>,
}

/// Decoded chunks a [`Recent`] keeps.
const RECENT_CHUNKS: usize = 2;

/// Chunks' planes a [`Dataset`] keeps for reuse (those of one tile at the
/// default chunking: 4 bytes per nonzero of each).
const KEPT_PLANES: usize = 8;

/// Decoded tiles whose buffers a [`Dataset`] keeps for reuse.
pub const KEPT_TILES: usize = 4;

/// A tile decoded into buffers of a pool, which get them back when it is dropped.
struct PooledTile<'a> {
    matrix: CsrMatrix,
    pool: &'a BufferPool,
}

impl std::borrow::Borrow<CsrMatrix> for PooledTile<'_> {
    fn borrow(&self) -> &CsrMatrix {
        &self.matrix
    }
}

impl Drop for PooledTile<'_> {
    fn drop(&mut self) {
        self.pool.give_matrix(std::mem::take(&mut self.matrix));
    }
}

impl Dataset {
    /// Opens the dataset at `root`, a local folder (or `file://` URL), and checks
    /// its manifest.
    pub fn open(root: &str) -> Result<Dataset, DatasetError> {
        Dataset::from_storage(storage::open(root)?)
    }

    /// Opens a dataset in any storage backend.
    pub fn from_storage(storage: Arc<dyn Storage>) -> Result<Dataset, DatasetError> {
        let (manifest, bytes) = read_manifest_bytes(storage.as_ref())?;
        let limits = cumulative(&manifest.tile_cells);
        let manifest_sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        Ok(Dataset {
            storage,
            manifest,
            manifest_sha256,
            limits,
            buffers: BufferPool::new(2 * KEPT_TILES),
            planes: crate::buffers::Pool::new(KEPT_PLANES),
            recent: std::sync::Mutex::new(Recent::default()),
        })
    }

    /// SHA-256 of manifest.json as read, in hex: it changes whenever the
    /// dataset does (an append, a new conversion), since the manifest lists
    /// every tile's size and checksum.
    pub fn manifest_sha256(&self) -> &str {
        &self.manifest_sha256
    }

    /// The checked manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Where the dataset's bytes are.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The first cell after each tile (cumulative cells per tile).
    pub fn tile_limits(&self) -> &[u64] {
        &self.limits
    }

    /// Cells (rows) of the matrix.
    pub fn n_cells(&self) -> u64 {
        self.manifest.n_cells
    }

    /// Genes (columns) of the matrix.
    pub fn n_genes(&self) -> u32 {
        self.manifest.n_genes as u32
    }

    /// Tiles, of `manifest().tile_size` cells each but the last.
    pub fn n_tiles(&self) -> usize {
        self.manifest.n_tiles()
    }

    /// The cells of tile `tile`.
    pub fn tile_cells(&self, tile: usize) -> Range<u64> {
        let start = if tile == 0 { 0 } else { self.limits[tile - 1] };
        start..self.limits[tile]
    }

    /// Signed cell indices (NumPy's int64) as cells of this dataset, each
    /// checked to be from 0 to `n_cells() - 1`; the first that is not is the
    /// error.
    pub fn checked_cells(&self, cells: &[i64]) -> Result<Vec<u64>, DatasetError> {
        let n_cells = self.n_cells();
        cells
            .iter()
            .map(|&cell| match u64::try_from(cell) {
                Ok(c) if c < n_cells => Ok(c),
                Ok(c) => Err(DatasetError::CellOutOfRange { cell: c, n_cells }),
                Err(_) => Err(DatasetError::NegativeCell { cell, n_cells }),
            })
            .collect()
    }

    /// The listed cells, in order, from whole decoded tiles kept in `cache`
    /// (decoded now, in parallel and each once, when not there, and put
    /// there): for callers that come back to the same tiles.
    pub fn read_cell_list_cached(
        &self,
        cells: &[u64],
        cache: &std::sync::Mutex<TileCache>,
    ) -> Result<CsrMatrix, DatasetError> {
        self.read_cell_list_with(cells, |tile, _rows| {
            let hit = cache.lock().unwrap_or_else(|p| p.into_inner()).get(tile);
            match hit {
                Some(m) => Ok(m),
                None => {
                    let m = Arc::new(self.read_tile(tile)?);
                    cache.lock().unwrap_or_else(|p| p.into_inner()).put(tile, m.clone());
                    Ok::<_, DatasetError>(m)
                }
            }
        })
    }

    /// The tile holding global cell `cell`, and its row in that tile.
    pub fn locate(&self, cell: u64) -> Result<(usize, u64), DatasetError> {
        if cell >= self.n_cells() {
            return Err(DatasetError::CellOutOfRange { cell, n_cells: self.n_cells() });
        }
        let tile = self.limits.partition_point(|&l| l <= cell);
        Ok((tile, cell - self.tile_cells(tile).start))
    }

    /// What the manifest says tile `tile` holds.
    pub fn tile_expectation(&self, tile: usize) -> TileExpectation {
        TileExpectation {
            n_cells: self.manifest.tile_cells[tile],
            nnz: self.manifest.tile_nnz[tile],
            n_genes: self.n_genes(),
        }
    }

    /// Reads and decodes tile `tile`, checking it against the manifest.
    pub fn read_tile(&self, tile: usize) -> Result<CsrMatrix, DatasetError> {
        let (location, blob) = self.tile_blob(tile)?;
        format::decode_tile(&blob, Some(&self.tile_expectation(tile))).map_err(|source| DatasetError::Tile {
            location,
            tile,
            source,
        })
    }

    /// Like [`Dataset::read_tile`], decoding into `out`'s buffers (reused as
    /// far as they are large enough), for loops over many tiles.
    pub fn read_tile_into(&self, tile: usize, out: &mut CsrMatrix) -> Result<(), DatasetError> {
        let (location, blob) = self.tile_blob(tile)?;
        format::decode_tile_into(&blob, Some(&self.tile_expectation(tile)), out).map_err(|source| DatasetError::Tile {
            location,
            tile,
            source,
        })
    }

    /// Reads tile `tile` and decodes only the chunks that hold `rows` (rows of
    /// the tile); the other rows of the result are empty
    /// ([`format::decode_rows_into`]).
    pub fn read_tile_rows(&self, tile: usize, rows: &[u64]) -> Result<CsrMatrix, DatasetError> {
        let mut out = CsrMatrix::default();
        self.read_tile_rows_into(tile, rows, &mut out)?;
        Ok(out)
    }

    /// Like [`Dataset::read_tile_rows`], decoding into `out`'s buffers.
    pub fn read_tile_rows_into(&self, tile: usize, rows: &[u64], out: &mut CsrMatrix) -> Result<(), DatasetError> {
        let (location, blob) = self.tile_blob(tile)?;
        format::decode_rows_into(&blob, Some(&self.tile_expectation(tile)), rows, out)
            .map_err(|source| DatasetError::Tile { location, tile, source })
    }

    /// The bytes of tile `tile`, checked to be the size the manifest says, not
    /// yet decoded: with [`Dataset::parse_tile`], for readers that fetch ahead
    /// and decode later.
    pub fn fetch_tile(&self, tile: usize) -> Result<bytes::Bytes, DatasetError> {
        Ok(self.tile_blob(tile)?.1)
    }

    /// Checks tile `tile`'s bytes (header, CRC, chunk table, against the
    /// manifest) once, for decoding its chunks one by one.
    pub fn parse_tile<'a>(&self, tile: usize, blob: &'a [u8]) -> Result<format::ParsedTile<'a>, DatasetError> {
        format::ParsedTile::parse(blob, Some(&self.tile_expectation(tile)))
            .map_err(|source| self.tile_error(tile, source))
    }

    /// [`Dataset::parse_tile`] again, for bytes that passed it before and
    /// were kept unchanged since (every check but the CRC; see
    /// [`format::ParsedTile::parse_again`]).
    pub fn parse_tile_again<'a>(&self, tile: usize, blob: &'a [u8]) -> Result<format::ParsedTile<'a>, DatasetError> {
        format::ParsedTile::parse_again(blob, Some(&self.tile_expectation(tile)))
            .map_err(|source| self.tile_error(tile, source))
    }

    /// A tile's decoding error, naming the tile's file.
    pub fn tile_error(&self, tile: usize, source: TileError) -> DatasetError {
        DatasetError::Tile { location: self.storage.location(&format::tile_key(tile)), tile, source }
    }

    /// The bytes of tile `tile`, checked to be the size the manifest says.
    fn tile_blob(&self, tile: usize) -> Result<(String, bytes::Bytes), DatasetError> {
        let key = format::tile_key(tile);
        let location = self.storage.location(&key);
        if tile >= self.n_tiles() {
            return Err(DatasetError::Invalid {
                location,
                message: format!("the dataset has {} tiles", self.n_tiles()),
            });
        }
        let blob = self
            .storage
            .get(&key)?
            .ok_or_else(|| DatasetError::Missing { location: location.clone(), what: format!("tile {tile}") })?;
        let want = self.manifest.tile_bytes[tile];
        if blob.len() as u64 != want {
            return Err(DatasetError::Invalid {
                location,
                message: format!("tile is {} bytes, the manifest says {want}", blob.len()),
            });
        }
        Ok((location, blob))
    }

    /// The listed cells (in the order given) in the form `output` asks for:
    /// a gene vocabulary, scaled values, dense, top-k tokens (see
    /// [`crate::batch`]); the same values the loader gives with that output.
    pub fn read_cells_formed(
        &self,
        cells: &[u64],
        output: &crate::batch::BatchOutput,
    ) -> Result<crate::batch::FormedBatch, DatasetError> {
        output.check(self.n_genes())?;
        output.check_rows(cells.len() as u64, output.n_cols(self.n_genes()))?;
        let m = self.read_cell_list(cells)?;
        Ok(crate::batch::CellWriter::new(output, self.n_genes()).form(m))
    }

    /// The nonzeros of each stored column over every cell: every tile is
    /// read and decoded (in parallel, a few at a time), none kept.
    pub fn column_nonzeros(&self) -> Result<Vec<u64>, DatasetError> {
        let n = self.n_genes() as usize;
        let tiles: Vec<usize> = (0..self.n_tiles()).collect();
        let mut total = vec![0u64; n];
        for group in tiles.chunks(rayon::current_num_threads().max(1) * 2) {
            let counts = group
                .par_iter()
                .map(|&t| {
                    let m = self.read_tile(t)?;
                    let mut counts = vec![0u64; n];
                    for &g in &m.indices {
                        if let Some(c) = counts.get_mut(g as usize) {
                            *c += 1;
                        }
                    }
                    Ok(counts)
                })
                .collect::<Result<Vec<_>, DatasetError>>()?;
            for c in counts {
                total.iter_mut().zip(c).for_each(|(t, c)| *t += c);
            }
        }
        Ok(total)
    }

    /// Reads cells `range` (global indices) as one CSR matrix, decoding the tiles
    /// it touches in parallel; of a tile it covers in part, only the chunks
    /// holding its cells are decoded.
    pub fn read_cells(&self, range: Range<u64>) -> Result<CsrMatrix, DatasetError> {
        let mut out = CsrMatrix::default();
        self.read_cells_into(range, &mut out)?;
        Ok(out)
    }

    /// [`Dataset::read_cells`] into `out`'s buffers (reused as far as they
    /// are large enough, and written over rather than cleared first): a loop
    /// over consecutive ranges faults in no fresh memory for each. On error,
    /// `out` holds unspecified rows.
    pub fn read_cells_into(&self, range: Range<u64>, out: &mut CsrMatrix) -> Result<(), DatasetError> {
        if range.end > self.n_cells() || range.start > range.end {
            let cell = range.end.max(range.start);
            return Err(DatasetError::CellOutOfRange { cell, n_cells: self.n_cells() });
        }
        let mut fill = CsrFill::new(out, self.n_genes());
        if range.is_empty() {
            fill.finish();
            return Ok(());
        }
        let first = self.locate(range.start)?.0;
        let last = self.locate(range.end - 1)?.0;
        // The rows of tile t the range holds, and whether that is all of them.
        let span = |t: usize| {
            let cells = self.tile_cells(t);
            let rows = range.start.max(cells.start) - cells.start..range.end.min(cells.end) - cells.start;
            let whole = rows.start == 0 && rows.end == cells.end - cells.start;
            (rows, whole)
        };
        // A range's partial tiles (its first and last; the one tile of a
        // range within a tile) are read through the tile the last range ended
        // in, so that a pass in consecutive ranges decodes each chunk once;
        // the tiles between, whole, are decoded in parallel.
        let (first_rows, first_whole) = span(first);
        if !first_whole {
            self.read_rows_of_recent(first, first_rows, &mut fill)?;
            if first == last {
                fill.finish();
                return Ok(());
            }
        }
        let (last_rows, last_whole) = span(last);
        let whole = if first_whole { first } else { first + 1 }..if last_whole { last + 1 } else { last };
        let tiles: Vec<PooledTile<'_>> = whole
            .into_par_iter()
            .map(|t| {
                let mut tile = PooledTile { matrix: self.buffers.take_matrix(), pool: &self.buffers };
                self.read_tile_into(t, &mut tile.matrix)?;
                Ok::<_, DatasetError>(tile)
            })
            .collect::<Result<_, _>>()?;
        for tile in &tiles {
            fill.append(&tile.matrix);
        }
        if !last_whole {
            self.read_rows_of_recent(last, last_rows, &mut fill)?;
        }
        fill.finish();
        Ok(())
    }

    /// Appends rows `rows` of tile `tile` to `out`, through [`Recent`]: the
    /// tile's bytes are fetched and checked unless they are the recent
    /// tile's, and each chunk is decompressed unless it is one of the recent
    /// chunks.
    fn read_rows_of_recent(&self, tile: usize, rows: Range<u64>, out: &mut CsrFill<'_>) -> Result<(), DatasetError> {
        let taken = {
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            (recent.tile == Some(tile)).then(|| (recent.blob.clone(), std::mem::take(&mut recent.chunks)))
        };
        let (blob, mut chunks, checked) = match taken {
            Some((blob, chunks)) => (blob, chunks, true),
            None => (self.tile_blob(tile)?.1, Vec::new(), false),
        };
        let parsed = if checked { self.parse_tile_again(tile, &blob)? } else { self.parse_tile(tile, &blob)? };
        let spans: Vec<Range<u64>> = parsed.chunk_cells().collect();
        let mut used = Vec::new();
        for (c, cells) in spans.iter().enumerate() {
            let (lo, hi) = (rows.start.max(cells.start), rows.end.min(cells.end));
            if lo >= hi {
                continue;
            }
            let planes = match chunks.iter().position(|(k, _)| *k == c) {
                Some(at) => chunks.swap_remove(at).1,
                None => {
                    // (The buffers of a kept chunk this range does not need.)
                    let needless = |k: usize| spans[k].end <= rows.start || spans[k].start >= rows.end;
                    let spare = chunks.iter().position(|(k, _)| needless(*k));
                    let mut planes = spare.map(|at| chunks.swap_remove(at).1).unwrap_or_default();
                    parsed.decompress_planes(c, &mut planes).map_err(|e| self.tile_error(tile, e))?;
                    planes
                }
            };
            parsed.append_chunk_rows(c, &planes, lo..hi, out).map_err(|e| self.tile_error(tile, e))?;
            used.push((c, planes));
        }
        // The chunks used last are kept (the last one first to be found).
        let keep = used.len().saturating_sub(RECENT_CHUNKS);
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        *recent = Recent { tile: Some(tile), blob, chunks: used.split_off(keep) };
        Ok(())
    }

    /// Reads the listed cells, in the order given (repeats allowed), as one CSR
    /// matrix. Each tile needed is read once (in parallel), each of its
    /// chunks that holds a listed cell is decompressed once, and only the
    /// listed cells are decoded.
    pub fn read_cell_list(&self, cells: &[u64]) -> Result<CsrMatrix, DatasetError> {
        let (located, needed, rows) = self.by_tile(cells)?;
        // Per tile, its listed rows in the order listed, decoded from the
        // planes of their chunks: a chunk is decompressed for any cell in
        // it, but only the cells listed are decoded.
        let picked: Vec<CsrMatrix> = needed
            .par_iter()
            .zip(&rows)
            .map(|(&t, rows)| self.tile_rows_listed(t, rows))
            .collect::<Result<_, DatasetError>>()?;
        Ok(interleave(&located, &needed, &picked, self.n_genes()))
    }

    /// Rows `rows` of tile `tile` (in the order given, repeats allowed), each
    /// decoded from its chunk's planes, every rule checked for it (see
    /// [`format::ParsedTile::append_chunk_rows`]).
    fn tile_rows_listed(&self, tile: usize, rows: &[u64]) -> Result<CsrMatrix, DatasetError> {
        let (_, blob) = self.tile_blob(tile)?;
        let parsed = self.parse_tile(tile, &blob)?;
        let spans: Vec<Range<u64>> = parsed.chunk_cells().collect();
        let mut planes: Vec<Option<format::tile::ChunkPlanes>> = spans.iter().map(|_| None).collect();
        let given_back = |planes: Vec<Option<format::tile::ChunkPlanes>>| {
            planes.into_iter().flatten().for_each(|p| self.planes.give(p));
        };
        let mut out = CsrMatrix::default();
        let mut fill = CsrFill::new(&mut out, self.n_genes());
        for &row in rows {
            // The chunk holding the row (empty chunks hold none).
            let c = spans.partition_point(|cells| cells.end <= row);
            let Some(slot) = planes.get_mut(c) else {
                let n_cells = self.tile_cells(tile).end;
                return Err(DatasetError::CellOutOfRange { cell: self.tile_cells(tile).start + row, n_cells });
            };
            let chunk = match slot {
                Some(chunk) => chunk,
                None => {
                    let mut chunk = self.planes.take();
                    parsed.decompress_planes(c, &mut chunk).map_err(|e| self.tile_error(tile, e))?;
                    slot.insert(chunk)
                }
            };
            parsed.append_chunk_rows(c, chunk, row..row + 1, &mut fill).map_err(|e| self.tile_error(tile, e))?;
        }
        fill.finish();
        given_back(planes);
        Ok(out)
    }

    /// Where each of `cells` is (tile, row), the tiles they are in (sorted),
    /// and the rows of each of those tiles in the order listed.
    #[allow(clippy::type_complexity)]
    fn by_tile(&self, cells: &[u64]) -> Result<(Vec<(usize, u64)>, Vec<usize>, Vec<Vec<u64>>), DatasetError> {
        let located: Vec<(usize, u64)> = cells.iter().map(|&c| self.locate(c)).collect::<Result<_, DatasetError>>()?;
        let mut needed: Vec<usize> = located.iter().map(|&(t, _)| t).collect();
        needed.sort_unstable();
        needed.dedup();
        let mut rows: Vec<Vec<u64>> = vec![Vec::new(); needed.len()];
        for &(tile, row) in &located {
            // (every located tile is in `needed`, which was made from them)
            let slot = needed.binary_search(&tile).unwrap_or_else(|at| at);
            rows[slot].push(row);
        }
        Ok((located, needed, rows))
    }

    /// The listed cells, in the order given, gathered from the tiles `tile_of`
    /// gives: it is called once per tile needed (in parallel), with the rows
    /// of that tile the list holds, and returns the decoded tile (or any
    /// matrix whose rows `rows` are that tile's; the rows not asked for may be
    /// empty). A cache of decoded tiles is a `tile_of` that looks there first.
    /// Each tile's rows are copied out as soon as it is decoded, and the tile
    /// dropped (given back to its pool): a batch spread over every tile holds
    /// about one decoded tile per thread, not every tile at once.
    pub fn read_cell_list_with<T, E>(
        &self,
        cells: &[u64],
        tile_of: impl Fn(usize, &[u64]) -> Result<T, E> + Sync,
    ) -> Result<CsrMatrix, E>
    where
        T: std::borrow::Borrow<CsrMatrix> + Send,
        E: From<DatasetError> + Send,
    {
        let (located, needed, rows) = self.by_tile(cells)?;
        if let ([tile], [rows]) = (needed.as_slice(), rows.as_slice()) {
            // One tile (a range, or cells close together): straight into the output.
            let decoded = tile_of(*tile, rows)?;
            return Ok(gather_rows(decoded.borrow(), rows, self.n_genes()));
        }
        // Per tile, its listed rows in the order listed.
        let picked: Vec<CsrMatrix> = needed
            .par_iter()
            .zip(&rows)
            .map(|(&t, rows)| Ok(gather_rows(tile_of(t, rows)?.borrow(), rows, self.n_genes())))
            .collect::<Result<_, E>>()?;
        Ok(interleave(&located, &needed, &picked, self.n_genes()))
    }

    /// An optional file whose has_* flag is true: its location and bytes.
    fn flagged_file(&self, key: &str, flag: &str) -> Result<(String, bytes::Bytes), DatasetError> {
        let location = self.storage.location(key);
        match self.storage.get(key)? {
            Some(bytes) => Ok((location, bytes)),
            None => Err(DatasetError::Missing { location, what: format!("{flag} is true") }),
        }
    }

    /// gene_order.npy, when the dataset has it: `gene_order[j]` is the source
    /// column stored as column j.
    pub fn gene_order(&self) -> Result<Option<Vec<i32>>, DatasetError> {
        if !self.manifest.has_gene_order {
            return Ok(None);
        }
        let (location, bytes) = self.flagged_file(format::GENE_ORDER_KEY, "has_gene_order")?;
        let order = npy::read_i32(&bytes)
            .map_err(|e| DatasetError::Invalid { location: location.clone(), message: e.to_string() })?;
        npy::check_permutation(&order, self.manifest.n_genes)
            .map_err(|message| DatasetError::Invalid { location, message })?;
        Ok(Some(order))
    }

    /// The genes in stored column order as a vocabulary matches them: the
    /// gene names (var_names.txt, else var.parquet's index), or var.parquet's
    /// column `column` as text. Errors name the dataset and what it lacks.
    pub fn gene_keys(&self, column: Option<&str>) -> Result<Vec<String>, DatasetError> {
        let location = self.storage.location("");
        if column.is_none() {
            if let Some(names) = self.var_names()? {
                return Ok(names);
            }
        }
        if !self.manifest.has_var_table {
            let what = match column {
                None => "no gene names (no var_names.txt or var.parquet) to match genes against".to_string(),
                Some(c) => format!("no var table (var.parquet) with a column {c:?} to match genes against"),
            };
            return Err(DatasetError::Invalid { location, message: what });
        }
        let (location, bytes) = self.flagged_file(format::VAR_TABLE_KEY, "has_var_table")?;
        crate::format::var_table::text_column(bytes, column, self.manifest.n_genes).map_err(|e| match e {
            crate::format::var_table::TextColumnError::NoColumn { name, have } => {
                DatasetError::NoVarColumn { location, name, have }
            }
            crate::format::var_table::TextColumnError::Invalid(message) => DatasetError::Invalid { location, message },
        })
    }

    /// var_names.txt, when the dataset has it: gene names in column order.
    pub fn var_names(&self) -> Result<Option<Vec<String>>, DatasetError> {
        if !self.manifest.has_var_names {
            return Ok(None);
        }
        let (location, bytes) = self.flagged_file(format::VAR_NAMES_KEY, "has_var_names")?;
        parse_var_names(&bytes, self.manifest.n_genes)
            .map(Some)
            .map_err(|message| DatasetError::Invalid { location, message })
    }
}

/// Reads and checks manifest.json.
pub fn read_manifest(storage: &dyn Storage) -> Result<Manifest, DatasetError> {
    read_manifest_bytes(storage).map(|(manifest, _)| manifest)
}

/// Reads and checks manifest.json; with the bytes read.
fn read_manifest_bytes(storage: &dyn Storage) -> Result<(Manifest, bytes::Bytes), DatasetError> {
    let key = format::MANIFEST_KEY;
    let bytes = storage.get(key)?.ok_or_else(|| no_manifest(storage))?;
    let manifest = Manifest::parse_checked(&bytes)
        .map_err(|source| DatasetError::Manifest { location: storage.location(key), source })?;
    Ok((manifest, bytes))
}

/// Why there is no manifest: nothing at all there (or, in a store, no such
/// bucket: the listing's error says so), or an incomplete dataset.
pub(crate) fn no_manifest(storage: &dyn Storage) -> DatasetError {
    let location = storage.location("");
    if !storage.can_list() {
        // A plain HTTP server cannot list: look for the files a dataset (or an
        // unfinished conversion) holds besides its manifest.
        let probes = [PLAN_KEY, APPEND_KEY, format::GENE_ORDER_KEY, format::VAR_NAMES_KEY, &format::tile_key(0)];
        return match probes.iter().map(|k| storage.size(k).map(|s| (k, s))).find(|r| !matches!(r, Ok((_, None)))) {
            Some(Err(e)) => DatasetError::Storage(e),
            Some(Ok((&k, _))) if k == PLAN_KEY => DatasetError::Unfinished { location },
            Some(Ok((&k, _))) if k == APPEND_KEY => DatasetError::AppendUnfinished { location },
            Some(Ok(_)) => DatasetError::Incomplete { location },
            None => DatasetError::Nothing { location },
        };
    }
    match storage.list("") {
        Err(e) => DatasetError::Storage(e),
        Ok(keys) if keys.is_empty() => DatasetError::Nothing { location },
        Ok(keys) if keys.iter().any(|k| k == PLAN_KEY) => DatasetError::Unfinished { location },
        Ok(keys) if keys.iter().any(|k| k == APPEND_KEY) => DatasetError::AppendUnfinished { location },
        Ok(_) => DatasetError::Incomplete { location },
    }
}

/// Where a conversion keeps its plan until the manifest is written
/// (`convert::plan`).
pub(crate) const PLAN_KEY: &str = ".plan/plan.json";

/// The record of an append, until it is complete (`convert::append`).
pub(crate) const APPEND_KEY: &str = ".append/append.json";

/// Cumulative sums: `limits[i]` is the first cell after tile i.
pub(crate) fn cumulative(tile_cells: &[u64]) -> Vec<u64> {
    tile_cells
        .iter()
        .scan(0u64, |acc, &c| {
            *acc += c;
            Some(*acc)
        })
        .collect()
}

/// var_names.txt: UTF-8, one name per line, every line ending in "\n"
/// (decisions.md 13).
pub(crate) fn parse_var_names(bytes: &[u8], n_genes: u64) -> Result<Vec<String>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the last line does not end in a newline".into());
    }
    let names: Vec<String> = text.split_terminator('\n').map(str::to_string).collect();
    if names.len() as u64 != n_genes {
        return Err(format!("has {} lines, expected n_genes {n_genes}", names.len()));
    }
    Ok(names)
}

/// The rows of the cells `located` (tile, row), in their order, from
/// `picked`: per tile of `needed`, the rows listed for it, in the order listed.
fn interleave(located: &[(usize, u64)], needed: &[usize], picked: &[CsrMatrix], n_genes: u32) -> CsrMatrix {
    let mut out = CsrMatrix::empty(n_genes);
    let nnz: usize = picked.iter().map(CsrMatrix::nnz).sum();
    out.indptr.reserve_exact(located.len());
    out.indices.reserve_exact(nnz);
    out.data.reserve_exact(nnz);
    let mut next = vec![0usize; needed.len()];
    for &(tile, _) in located {
        let slot = needed.binary_search(&tile).unwrap_or_else(|at| at);
        out.push_row_from(&picked[slot], next[slot]);
        next[slot] += 1;
    }
    out
}

/// Rows `rows` of `tile`, in that order, as a new matrix (its buffers sized
/// once: no growing copies).
fn gather_rows(tile: &CsrMatrix, rows: &[u64], n_genes: u32) -> CsrMatrix {
    let nnz: usize = rows.iter().map(|&r| tile.row(r as usize).0.len()).sum();
    let mut out = CsrMatrix::empty(n_genes);
    out.indptr.reserve_exact(rows.len());
    out.indices.reserve_exact(nnz);
    out.data.reserve_exact(nnz);
    for &r in rows {
        out.push_row_from(tile, r as usize);
    }
    out
}

/// Decoded tiles kept for repeated reads, least recently used out first,
/// within a byte budget (8 bytes per nonzero and per cell): see
/// [`Dataset::read_cell_list_cached`].
#[derive(Default)]
pub struct TileCache {
    budget: u64,
    used: u64,
    /// (tile, decoded), most recently used last.
    tiles: Vec<(usize, Arc<CsrMatrix>)>,
}

fn decoded_bytes(m: &CsrMatrix) -> u64 {
    8 * (m.nnz() as u64 + m.n_rows() as u64 + 1)
}

impl TileCache {
    /// A cache of at most `budget` bytes of decoded tiles (0 keeps none).
    pub fn new(budget: u64) -> TileCache {
        TileCache { budget, ..TileCache::default() }
    }

    /// Its budget in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Tile `tile`, when kept (it becomes the most recently used).
    pub fn get(&mut self, tile: usize) -> Option<Arc<CsrMatrix>> {
        let at = self.tiles.iter().position(|(t, _)| *t == tile)?;
        let entry = self.tiles.remove(at);
        let found = entry.1.clone();
        self.tiles.push(entry);
        Some(found)
    }

    /// Keeps tile `tile`, dropping the least recently used ones to make room;
    /// a tile larger than the whole budget is not kept.
    pub fn put(&mut self, tile: usize, decoded: Arc<CsrMatrix>) {
        let size = decoded_bytes(&decoded);
        if size > self.budget || self.tiles.iter().any(|(t, _)| *t == tile) {
            return;
        }
        while self.used + size > self.budget {
            let (_, old) = self.tiles.remove(0);
            self.used -= decoded_bytes(&old);
        }
        self.used += size;
        self.tiles.push((tile, decoded));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile(cells: usize, nnz_per_cell: u32) -> Arc<CsrMatrix> {
        let mut m = CsrMatrix::empty(100);
        for _ in 0..cells {
            m.indices.extend(0..nnz_per_cell);
            m.data.extend(std::iter::repeat_n(1, nnz_per_cell as usize));
            m.indptr.push(m.indices.len() as u64);
        }
        Arc::new(m)
    }

    #[test]
    fn the_tile_cache_keeps_the_most_recently_used_within_its_budget() {
        // each tile: 8 * (10 * 3 + 10 + 1) = 328 bytes; room for three
        let mut cache = TileCache::new(1000);
        for t in 0..3 {
            cache.put(t, tile(10, 3));
        }
        assert!(cache.get(0).is_some()); // 0 is now the most recent: 1 is the oldest
        cache.put(3, tile(10, 3));
        assert!(cache.get(1).is_none());
        assert!([0, 2, 3].iter().all(|&t| cache.get(t).is_some()));
        // a tile larger than the budget is not kept, and drops nothing
        cache.put(9, tile(100, 3));
        assert!(cache.get(9).is_none());
        assert!([0, 2, 3].iter().all(|&t| cache.get(t).is_some()));
        // a budget of 0 keeps nothing
        let mut none = TileCache::new(0);
        none.put(0, tile(1, 1));
        assert!(none.get(0).is_none());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
        /// Ranges read one after another (as a pass over the cells reads
        /// them, and in any order) give the rows of the matrix, whichever
        /// tile and chunks the last range left behind.
        #[test]
        fn ranges_read_in_turn_give_the_matrix_rows(
            cuts in proptest::collection::vec((0u64..700, 1u64..300), 1..25),
            step in 1u64..400,
        ) {
            let (_dir, ds, m) = written(700, 97);
            let mut ranges: Vec<Range<u64>> = (0..700).step_by(step as usize).map(|a| a..(a + step).min(700)).collect();
            ranges.extend(cuts.iter().map(|&(a, n)| a..(a + n).min(700)));
            for r in ranges {
                let got = ds.read_cells(r.clone()).unwrap();
                let mut want = CsrMatrix::empty(m.n_cols);
                for row in r.clone() {
                    want.push_row_from(&m, row as usize);
                }
                proptest::prop_assert_eq!(got, want, "cells {:?}", r);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn listed_cells_give_the_matrix_rows_in_the_order_listed(
            cells in proptest::collection::vec(0u64..700, 0..300),
        ) {
            let (_dir, ds, m) = written(700, 97);
            let got = ds.read_cell_list(&cells).unwrap();
            let mut want = CsrMatrix::empty(m.n_cols);
            for &row in &cells {
                want.push_row_from(&m, row as usize);
            }
            proptest::prop_assert_eq!(got, want);
        }
    }

    /// A dataset of `n` cells (a few counts each) in tiles of `tile_size`
    /// cells and 4 chunks, in a temporary folder.
    fn written(n: usize, tile_size: u64) -> (tempfile::TempDir, Dataset, CsrMatrix) {
        let mut m = CsrMatrix::empty(300);
        for cell in 0..n as u32 {
            let genes: std::collections::BTreeSet<u32> = (0..cell % 13).map(|k| (cell * 31 + k * 97) % 300).collect();
            for g in genes {
                m.indices.push(g);
                m.data.push(1 + (cell + g) % 40);
            }
            m.indptr.push(m.indices.len() as u64);
        }
        let dir = tempfile::tempdir().unwrap();
        let store = crate::storage::LocalStorage::new(dir.path().to_path_buf());
        let options = crate::writer::WriteOptions { tile_size, n_chunks: 4, zstd_level: 1 };
        crate::writer::write_matrix(&store, &m, options).unwrap();
        let ds = Dataset::open(dir.path().to_str().unwrap()).unwrap();
        (dir, ds, m)
    }

    #[test]
    fn a_corrupt_tile_is_caught_by_the_range_that_first_reads_it() {
        let (dir, ds, _) = written(300, 97);
        ds.read_cells(0..10).unwrap();
        let path = dir.path().join(format::tile_key(1));
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x55;
        std::fs::write(&path, bytes).unwrap();
        // Tile 0 is recent and unchanged; tile 1 is fetched and checked.
        ds.read_cells(10..20).unwrap();
        let e = ds.read_cells(100..110).unwrap_err().to_string();
        assert!(e.contains("tile 1") || e.contains("00000001"), "{e}");
    }
}
