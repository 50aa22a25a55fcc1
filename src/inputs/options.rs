//! How a conversion's inputs are reached and read: part of each
//! conversion's options, and of a sharded conversion's plan.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::InputError;
use super::format::InputFormat;
use super::remote::RemoteOptions;
use super::rows::RawRows;
use super::source::InputSource;
use super::table::Table;

/// How a conversion's inputs are reached (at URLs: credentials, endpoint, or
/// downloaded whole first) and read (which format, which features): part of
/// each conversion's options.
#[derive(Clone, Debug, Default)]
pub struct InputOptions {
    pub remote: RemoteOptions,
    pub reading: InputReading,
    /// Inputs that are not files: sources the caller has opened itself (an
    /// AnnData object of a Python session), each under the name that stands
    /// for it among the inputs. [`open`](super::open) returns them before
    /// looking for a file of that name.
    pub provided: Vec<ProvidedInput>,
}

/// An input the caller has opened, and the name it goes by among a job's
/// inputs (in messages and in the manifest's record of the inputs).
#[derive(Clone)]
pub struct ProvidedInput {
    pub name: PathBuf,
    pub source: Arc<dyn InputSource>,
}

impl std::fmt::Debug for ProvidedInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProvidedInput").field("name", &self.name).finish_non_exhaustive()
    }
}

impl InputOptions {
    pub(super) fn provided(&self, path: &Path) -> Option<&Arc<dyn InputSource>> {
        self.provided.iter().find(|p| p.name == path).map(|p| &p.source)
    }
}

/// A provided input, opened again: the source is shared, not reopened.
pub(super) struct Shared(pub(super) Arc<dyn InputSource>);

impl InputSource for Shared {
    fn path(&self) -> &Path {
        self.0.path()
    }
    fn matrix_name(&self) -> &str {
        self.0.matrix_name()
    }
    fn n_rows(&self) -> u64 {
        self.0.n_rows()
    }
    fn n_cols(&self) -> u64 {
        self.0.n_cols()
    }
    fn read_rows(&self, rows: std::ops::Range<u64>) -> Result<RawRows, InputError> {
        self.0.read_rows(rows)
    }
    fn var(&self) -> Result<Box<dyn Table + '_>, InputError> {
        self.0.var()
    }
    fn obs(&self) -> Result<Option<Box<dyn Table + '_>>, InputError> {
        self.0.obs()
    }
    fn counts_elsewhere(&self) -> Option<String> {
        self.0.counts_elsewhere()
    }
    fn will_read_whole(&self) {
        self.0.will_read_whole()
    }
}

/// How the inputs are read, whatever reaches them: recorded in a sharded
/// conversion's plan, so that every shard reads as the plan did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputReading {
    /// The inputs' format; None: told by each input's name and content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<InputFormat>,
    /// 10x Genomics inputs: the features converted (their `feature_type`);
    /// None: `Gene Expression`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_type: Option<String>,
    /// 10x Genomics inputs of several genomes: the one converted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub genome: Option<String>,
}

impl InputReading {
    /// Whether this is how inputs are read when nothing is said.
    pub fn is_default(&self) -> bool {
        *self == InputReading::default()
    }
}
