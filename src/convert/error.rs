//! The one error type of a conversion job: every step (plan, shards, finalize,
//! append, resume) returns it. The errors of the parts a job uses (inputs,
//! genes, obs, the store, the base dataset) are kept as they are, each in its
//! own variant, so that a caller can tell them apart by type; the job's own
//! failures name the place and what is wrong, never a flag to type (the
//! command line adds that, keyed by the variant).

use super::genes::GeneError;
use crate::dataset::DatasetError;
use crate::inputs::InputError;
use crate::storage::StorageError;

/// Why a conversion job cannot go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// The output holds something and may not be replaced.
    #[error("{location} is not empty")]
    NotEmpty { location: String },
    /// A shard or finalize ran where no plan was written.
    #[error("{location}: no plan")]
    NoPlan { location: String, root: String },
    /// A shard's result is missing or does not fit the plan.
    #[error("{location}: {problem}")]
    ShardResult { location: String, problem: String, root: String, shard: usize, shards: usize },
    /// The job was given nothing to convert.
    #[error("no input files")]
    NoInputs,
    /// A value given to the job is outside what it can take; the message names it.
    #[error("{0}")]
    Argument(String),
    /// The gene totals summed ahead of a plan (`plan_totals_shard`) cannot be
    /// used by it: they are of other inputs or options, or some are missing.
    #[error("{location}: {problem}")]
    Totals { location: String, problem: String, totals: String },
    /// A file or object the job reads is not what it must be (a plan, a shard
    /// result, a stored tile, a spill file, a given gene order): where, and
    /// what is wrong.
    #[error("{location}: {problem}")]
    Invalid { location: String, problem: String },
    /// A file or object the job reads (a stored obs shard, the stored gene
    /// names) that could not be read as the format says; the cause is left
    /// to `source()`.
    #[error("{location}")]
    Unreadable { location: String, source: crate::causes::Cause },
    /// The dataset is not in a state in which this step can run.
    #[error("{location}: {problem}")]
    State { location: String, problem: String },
    /// A local file of the job (a spill file, a given gene order) could not be
    /// read or written; the cause is left to `source()`.
    #[error("{what}")]
    Io { what: String, source: std::io::Error },
    /// A store could not be reached while doing `what`; the cause is left to `source()`.
    #[error("{what}")]
    Reaching { what: String, source: StorageError },
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Genes(#[from] GeneError),
    #[error(transparent)]
    GeneOrder(#[from] GeneOrderError),
    #[error(transparent)]
    Obs(#[from] ObsMergeError),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Writing or reading obs rows as Parquet failed.
    #[error(transparent)]
    Parquet(#[from] parquet::errors::ParquetError),
    /// A tile could not be encoded.
    #[error(transparent)]
    Encode(#[from] crate::format::EncodeError),
    /// A worker of the job stopped without giving its result (a defect).
    #[error("{0}")]
    Stopped(String),
    /// A job's record (a plan, a shard's result) could not be written as JSON.
    #[error("cannot write a job record as JSON: {0}")]
    Record(#[from] serde_json::Error),
    /// Building obs columns failed.
    #[error(transparent)]
    Arrow(#[from] arrow_schema::ArrowError),
}

impl ConvertError {
    /// A [`ConvertError::Invalid`] at `location`.
    pub(crate) fn invalid(location: impl Into<String>, problem: impl std::fmt::Display) -> ConvertError {
        ConvertError::Invalid { location: location.into(), problem: problem.to_string() }
    }

    /// A [`ConvertError::State`] at `location`.
    pub(crate) fn state(location: impl Into<String>, problem: impl std::fmt::Display) -> ConvertError {
        ConvertError::State { location: location.into(), problem: problem.to_string() }
    }

    /// A [`ConvertError::Io`] while doing `what`.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ConvertError {
        let what = what.into();
        move |source| ConvertError::Io { what, source }
    }

    /// The error of a part of the job that this one wraps, if any, for callers
    /// that look for a part's error by type.
    pub fn part(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConvertError::Input(e) => Some(e),
            ConvertError::Genes(e) => Some(e),
            ConvertError::GeneOrder(e) => Some(e),
            ConvertError::Obs(e) => Some(e),
            ConvertError::Append(e) => Some(e),
            ConvertError::Dataset(e) => Some(e),
            ConvertError::Storage(e) => Some(e),
            _ => None,
        }
    }
}

/// Why the inputs' obs tables cannot be merged into one schema. The messages
/// state the facts; the command line adds how to leave a column out.
#[derive(Debug, thiserror::Error)]
pub enum ObsMergeError {
    #[error("{path}: obs column {column:?} is missing (it is in {first})")]
    Missing { path: String, column: String, first: String },
    #[error("{path}: obs column {column:?} is not in {first} (the first input with obs)")]
    Extra { path: String, column: String, first: String },
    #[error(
        "obs column {column:?} to leave out: no input has an obs column of that name; the obs columns are: {columns}"
    )]
    UnknownExclude { column: String, columns: String },
    #[error("{path}: has no obs table, but {first} has one")]
    NoObs { path: String, first: String },
    #[error("{path}: an obs column is named \"obs_names\", which is where cell names go")]
    ObsNamesTaken { path: String },
    #[error("obs column {column:?} is {kind} in {path} but {other_kind} in {other}")]
    Kinds { column: String, kind: &'static str, path: String, other_kind: &'static str, other: String },
    #[error("the inputs' obs has a column {column:?}, which a shuffled dataset uses to say where each cell was read")]
    SourceTaken { column: String },
    #[error("obs column {column:?} has type {data_type}, which obs cannot store")]
    Unstorable { column: String, data_type: String },
}

/// Why a given gene order does not fit the inputs.
#[derive(Debug, thiserror::Error)]
pub enum GeneOrderError {
    #[error(
        "{input}: has no gene {name:?}, which {origin} stores as column {column}; \
         the inputs must have the genes of the order they are given ({missing} of its {n_given} are missing)"
    )]
    Missing { input: String, origin: String, name: String, column: usize, missing: usize, n_given: usize },
    #[error(
        "{input}: its gene {name:?} is not among the {n_given} genes of {origin} \
         ({extra} of the inputs' {n_inputs} genes are not)"
    )]
    Extra { input: String, origin: String, name: String, extra: usize, n_given: usize, n_inputs: usize },
    #[error("{origin}: the gene name {name:?} appears more than once, so genes cannot be matched by name")]
    Repeated { origin: String, name: String },
    #[error("{origin}: {problem} (a gene order lists every input column once: the inputs have {n_genes} genes)")]
    Columns { origin: String, problem: String, n_genes: usize },
}

/// Why an append cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// A shuffled append to a dataset whose obs does not say where its cells
    /// were read (it was converted in the inputs' order).
    #[error(
        "{location}: its obs has no source_file and source_row columns (it was converted in the inputs' order), \
         so the order of shuffled cells could not be undone"
    )]
    NoSourceColumns { location: String },
    #[error(
        "{location}: another append, compact or finalize is running on this dataset ({}); try again once it has ended",
        holder.as_deref().map_or_else(|| "it holds the folder's lock".to_string(), |h| format!("it holds the dataset's lease: {h}"))
    )]
    Busy { location: String, holder: Option<Box<str>> },
    #[error("{location}: a planned append of {inputs} is under way (its shards write into .append/)")]
    Planned { location: String, inputs: String },
    #[error(
        "{location}: incomplete dataset: an append of {inputs} into it was interrupted while it replaced files; \
         it must be completed first"
    )]
    Interrupted { location: String, inputs: String },
    /// Another change of the dataset was staged and not committed.
    #[error("{location}: an append of {inputs} into it is unfinished (its files are staged under .append/)")]
    Unfinished { location: String, inputs: String },
}

/// A conversion step's result.
pub type Result<T, E = ConvertError> = std::result::Result<T, E>;
