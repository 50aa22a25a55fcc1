//! Library errors as the exceptions of `deltacells.exceptions`, and calls that
//! release the GIL and catch panics, so that none reaches Python.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

use deltacells::loader::LoaderError;
use deltacells::obs::localize::ObsError;
use deltacells::storage::StorageError;
use deltacells::{error_chain, DatasetError};

/// Which exception of `deltacells.exceptions` an error is.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// No dataset, or an incomplete one (also a FileNotFoundError).
    NotFound,
    /// Bytes that break a rule of the format (also a ValueError).
    Corrupt,
    /// A cell index out of range (also an IndexError).
    Index,
    /// An argument out of its range (an InvalidArgumentError, also a ValueError).
    Value,
    /// A name the dataset does not have: an obs column (an UnknownNameError,
    /// also a KeyError, as the Python layer raises for one).
    Name,
    /// A dataset of a collection that changed since the collection was made.
    Changed,
    /// An argument of the wrong type (an ArgumentTypeError, also a TypeError).
    ArgumentType,
    /// A conversion's input that does not exist (also a FileNotFoundError).
    InputNotFound,
    /// A conversion's input that is not what it must be: values that are not
    /// counts, genes or obs columns that do not fit (also a ValueError).
    Input,
    /// An output that already holds a dataset (also a FileExistsError).
    Exists,
    /// Anything else: storage unreachable, cache not writable...
    Other,
}

/// A library error, as the exception to raise.
pub(crate) struct Failure {
    pub(crate) kind: Kind,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(kind: Kind, error: &(dyn std::error::Error + 'static)) -> Failure {
        Failure { kind, message: error_chain(error) }
    }
}

impl From<DatasetError> for Failure {
    fn from(e: DatasetError) -> Failure {
        Failure::new(Failure::from_dataset_kind(&e), &e)
    }
}

impl Failure {
    /// The exception a dataset's error is.
    pub(crate) fn from_dataset_kind(e: &DatasetError) -> Kind {
        match e {
            DatasetError::Incomplete { .. }
            | DatasetError::Unfinished { .. }
            | DatasetError::AppendUnfinished { .. }
            | DatasetError::Nothing { .. } => Kind::NotFound,
            DatasetError::Manifest { .. }
            | DatasetError::Missing { .. }
            | DatasetError::Invalid { .. }
            | DatasetError::Unreadable { .. }
            | DatasetError::Tile { .. } => Kind::Corrupt,
            DatasetError::CellOutOfRange { .. } | DatasetError::NegativeCell { .. } | DatasetError::NoTile { .. } => {
                Kind::Index
            }
            DatasetError::Replaced { .. } => Kind::Changed,
            DatasetError::NoVarColumn { .. } => Kind::Name,
            DatasetError::Output(_) => Kind::Value,
            DatasetError::Storage(_) => Kind::Other,
        }
    }
}

impl From<StorageError> for Failure {
    fn from(e: StorageError) -> Failure {
        Failure::new(Kind::Other, &e)
    }
}

impl From<ObsError> for Failure {
    fn from(e: ObsError) -> Failure {
        match e {
            ObsError::Dataset(d) => d.into(),
            ObsError::Shard { .. } | ObsError::RowGroup { .. } | ObsError::Missing { .. } => {
                Failure::new(Kind::Corrupt, &e)
            }
            ObsError::NoObs { .. } | ObsError::NoColumn { .. } => Failure::new(Kind::Name, &e),
            _ => Failure::new(Kind::Other, &e),
        }
    }
}

impl From<LoaderError> for Failure {
    fn from(e: LoaderError) -> Failure {
        match e {
            LoaderError::Dataset(d) => d.into(),
            LoaderError::Options(_) => Failure::new(Kind::Value, &e),
            LoaderError::Internal(_) | LoaderError::Member(_) => Failure::new(Kind::Other, &e),
        }
    }
}

impl Kind {
    /// Every kind, in the order of [`Kind::class_name`]'s table.
    const ALL: [Kind; 11] = [
        Kind::NotFound,
        Kind::Corrupt,
        Kind::Index,
        Kind::Value,
        Kind::Name,
        Kind::Changed,
        Kind::ArgumentType,
        Kind::InputNotFound,
        Kind::Input,
        Kind::Exists,
        Kind::Other,
    ];

    /// The name of its class in `deltacells.exceptions`.
    fn class_name(self) -> &'static str {
        match self {
            Kind::NotFound => "DatasetNotFoundError",
            Kind::Corrupt => "CorruptDatasetError",
            Kind::Index => "CellIndexError",
            Kind::Value => "InvalidArgumentError",
            Kind::Name => "UnknownNameError",
            Kind::Changed => "DatasetChangedError",
            Kind::ArgumentType => "ArgumentTypeError",
            Kind::InputNotFound => "InputNotFoundError",
            Kind::Input => "InvalidInputError",
            Kind::Exists => "DatasetExistsError",
            Kind::Other => "DeltacellsError",
        }
    }
}

/// The exception classes, one per [`Kind`] in [`Kind::ALL`]'s order, given
/// by `deltacells.exceptions` when it is imported (as importing the package
/// does, before any call can fail).
static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

/// Takes the package's exception classes by name, once: each kind of
/// failure is then raised as its class, with no lookup when it is raised.
/// Refuses a set that lacks a class or holds one that is not an exception.
#[pyfunction]
pub(crate) fn register_exceptions(py: Python<'_>, classes: &Bound<'_, PyDict>) -> PyResult<()> {
    let base = py.get_type::<pyo3::exceptions::PyException>();
    let mut found = Vec::with_capacity(Kind::ALL.len());
    for kind in Kind::ALL {
        let name = kind.class_name();
        let class = classes
            .get_item(name)?
            .ok_or_else(|| pyo3::exceptions::PyTypeError::new_err(format!("register_exceptions: no {name}")))?;
        let class = class.cast_into::<PyType>().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!("register_exceptions: {name} is not a class"))
        })?;
        if !class.is_subclass(&base)? {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "register_exceptions: {name} is not an exception"
            )));
        }
        found.push(class.unbind());
    }
    // (the first registration stays: the classes are those of the one
    // deltacells.exceptions module)
    let _ = CLASSES.set(py, found);
    Ok(())
}

impl Failure {
    pub(crate) fn into_pyerr(self, py: Python<'_>) -> PyErr {
        // Every library error reaches Python here: none carries a credential.
        let message = deltacells::redact::redact(&self.message).into_owned();
        let classes = match CLASSES.get(py) {
            Some(classes) => classes,
            // Not registered yet: importing the module registers them.
            None => match py.import("deltacells.exceptions") {
                Ok(_) => match CLASSES.get(py) {
                    Some(classes) => classes,
                    None => return pyo3::exceptions::PyRuntimeError::new_err(message),
                },
                Err(e) => return e,
            },
        };
        let index = Kind::ALL.iter().position(|k| std::mem::discriminant(k) == std::mem::discriminant(&self.kind));
        let class = classes[index.unwrap_or(Kind::ALL.len() - 1)].bind(py);
        match class.call1((message,)) {
            Ok(instance) => PyErr::from_value(instance),
            Err(e) => e,
        }
    }
}

/// Runs `f` without the GIL, catching panics: a panic becomes a
/// DeltacellsError that says it is a bug, never a PanicException.
pub(crate) fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, Failure> + Send) -> PyResult<T> {
    let result = py.detach(|| catch_unwind(AssertUnwindSafe(f)));
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(failure)) => Err(failure.into_pyerr(py)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(Failure { kind: Kind::Other, message: format!("internal error (a bug in deltacells): {what}") }
                .into_pyerr(py))
        }
    }
}
