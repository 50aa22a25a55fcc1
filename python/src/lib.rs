//! The Rust side of the `deltacells` Python package: a thin binding over the
//! library (its reading core, conversion and command line). It owns bytes, threads and decoding; the Python
//! layer (`python/deltacells/`) owns the API's shape, pandas and scipy.
//!
//! Every call releases the GIL while it reads and decodes, hands its buffers to
//! NumPy without copying them, turns every library error into an exception of
//! the package's own hierarchy (with the library's message, each cause once),
//! and catches panics, so that none reaches Python. Nothing is started at
//! import: the thread pool of a dataset is made on its first read.

use std::path::Path;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use deltacells::inputs::InputFormat;
use deltacells::obs::localize;

mod allocator;
mod arrays;
mod batches;
mod collection;
mod convert;
mod dataset;
mod errors;
mod threads;
mod vocabulary;

use batches::{loader_defaults, RawBatches};
use dataset::RawDataset;

/// Every allocation of the extension's Rust code (Python's and other
/// libraries' are not touched) goes to jemalloc on Linux. With glibc's
/// malloc, the loader's multi-megabyte buffers (tiles read, chunks
/// decompressed, batches), freed and allocated again epoch after epoch on
/// threads started for them, stayed in its heaps: a process reading epoch
/// after epoch grew from 240 to about 300 MiB before it levelled off.
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts (`$_RJEM_MALLOC_CONF` is read
/// after them, and wins): pages freed go back to the system at once instead
/// of over the next ten seconds, so that a reader's memory is what it holds,
/// not what it held a moment ago (the loader's resident memory then stays
/// within 1-2% epoch after epoch). It cost speed while the loader still
/// let buffers go between epochs: with 200 ms of decay instead, warm epochs
/// of 100,000 atlas cells ran 15-30% faster for a fifth more peak memory.
/// Since every decompressed chunk and tile buffer is kept for the next
/// epoch, the two run at the same speed (medians of 12 epochs: 295,500 and
/// 294,000 cells/s; peak 282-289 MiB against 324-334; 2026-12-06).
#[cfg(target_os = "linux")]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: Option<&'static std::ffi::c_char> = {
    let options = c"dirty_decay_ms:0,muzzy_decay_ms:0";
    // SAFETY: the pointer is to the first byte of a string in static
    // memory, valid (and never written) for the life of the program.
    Some(unsafe { &*options.as_ptr() })
};

/// The cache root: `explicit`, else $DELTACELLS_CACHE, $XDG_CACHE_HOME/deltacells,
/// ~/.cache/deltacells.
#[pyfunction]
#[pyo3(signature = (explicit=None))]
fn cache_root(explicit: Option<String>) -> String {
    localize::cache_root(explicit.as_deref().map(Path::new)).display().to_string()
}

/// The cache file of `column` for the obs of fingerprint `fingerprint`.
#[pyfunction]
fn column_path(root: String, fingerprint: String, column: String) -> String {
    localize::column_path(Path::new(&root), &fingerprint, &column).display().to_string()
}

/// `text` with the credentials of the URLs in it (userinfo, signed query
/// parameters) masked: the library's one redaction, for the messages and
/// reprs the Python layer makes.
#[pyfunction]
fn redact(text: &str) -> String {
    deltacells::redact::redact(text).into_owned()
}

#[pymodule]
fn _deltacells(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(errors::register_exceptions, m)?)?;
    m.add_class::<RawDataset>()?;
    m.add_class::<RawBatches>()?;
    m.add_class::<batches::RawPlan>()?;
    m.add_class::<collection::RawCollection>()?;
    m.add_function(wrap_pyfunction!(collection::collection_file, m)?)?;
    m.add_class::<vocabulary::RawGeneMap>()?;
    m.add_function(wrap_pyfunction!(cache_root, m)?)?;
    m.add_function(wrap_pyfunction!(column_path, m)?)?;
    m.add_function(wrap_pyfunction!(redact, m)?)?;
    m.add_function(wrap_pyfunction!(loader_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(convert::convert_defaults, m)?)?;
    m.add("FAST_LEVEL", deltacells::writer::FAST_LEVEL)?;
    m.add("ARCHIVE_LEVEL", deltacells::writer::ARCHIVE_LEVEL)?;
    m.add("DEFAULT_CACHE_BYTES", deltacells::dataset::DEFAULT_CACHE_BYTES)?;
    m.add("INPUT_FORMATS", PyTuple::new(m.py(), InputFormat::ALL.map(InputFormat::as_str))?)?;
    m.add_function(wrap_pyfunction!(convert::run_command_line, m)?)?;
    m.add_function(wrap_pyfunction!(convert::convert_files, m)?)?;
    m.add_function(wrap_pyfunction!(convert::convert_anndata, m)?)?;
    m.add_function(wrap_pyfunction!(convert::append_files, m)?)?;
    m.add_function(wrap_pyfunction!(convert::compact_dataset, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
