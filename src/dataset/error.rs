//! Why a dataset could not be opened or read.

use crate::format::{ManifestError, TileError};
use crate::storage::StorageError;

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
    /// A file that is there but could not be read as the format says: the
    /// source says why (the parser's error, or the rule the file breaks).
    #[error("{location}")]
    Unreadable { location: String, source: crate::causes::Cause },
    /// A var column asked for (to match genes by) that the gene table does not have.
    #[error("{location}: var has no column {name:?}; it has {have:?}")]
    NoVarColumn { location: String, name: String, have: Vec<String> },
    /// A batch's form that this dataset cannot be read in (an argument).
    #[error(transparent)]
    Output(#[from] crate::batch::OutputError),
    /// A tile breaks a rule of the format (the source names the rule).
    #[error("{location}: tile {tile}")]
    Tile { location: String, tile: usize, source: TileError },
    /// A tile index at or past the number of tiles (an argument).
    #[error("{location}: the dataset has {n_tiles} tiles")]
    NoTile { location: String, n_tiles: usize },
    /// While it was open, the dataset was replaced by one that is not a
    /// later version of it (a new conversion in its place): its cells can
    /// no longer be read as the version opened.
    #[error(
        "{location}: the dataset was replaced by another since it was opened (not an append or compaction of it); open it again"
    )]
    Replaced { location: String },
    /// A cell index at or past the number of cells.
    #[error("cell {cell} is out of range: the dataset has {n_cells} cells")]
    CellOutOfRange { cell: u64, n_cells: u64 },
    /// A cell index below 0 (from a signed array: NumPy's, Python's).
    #[error("cell {cell} is out of range: the dataset has {n_cells} cells")]
    NegativeCell { cell: i64, n_cells: u64 },
}
