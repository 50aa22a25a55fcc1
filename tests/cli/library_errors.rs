//! The conversion library's errors, by type: a Rust (or Python) caller tells
//! them apart without reading their messages, and no message names a flag.

use std::path::PathBuf;
use std::sync::Arc;

use deltacells::convert::{self, AppendError, AppendOptions, ConvertError, ConvertOptions, NoProgress, ShardOptions};
use deltacells::inputs::InputError;
use deltacells::storage::{LocalStorage, Storage};
use deltacells::DatasetError;

use crate::util::TestDir;

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/pbmc_1k.h5ad")
}

fn store(dir: &TestDir, name: &str) -> Arc<dyn Storage> {
    Arc::new(LocalStorage::new(dir.join(name)))
}

/// No message of the library tells its reader to type a flag.
fn no_flag(e: &ConvertError) {
    let text = e.to_string();
    assert!(!text.contains(" --"), "a library message names a flag: {text}");
}

#[test]
fn each_failure_of_a_conversion_has_its_own_variant() {
    let dir = TestDir::new();
    let out = store(&dir, "ds");
    let options = ConvertOptions::default();

    let e = convert::convert(&[], out.as_ref(), &options, &NoProgress).unwrap_err();
    assert!(matches!(e, ConvertError::NoInputs), "{e:?}");

    std::fs::write(dir.join("not.h5ad"), b"not HDF5").unwrap();
    let e = convert::convert(&[dir.join("not.h5ad")], out.as_ref(), &options, &NoProgress).unwrap_err();
    assert!(matches!(&e, ConvertError::Input(InputError::OpenFailed { .. })), "{e:?}");
    assert!(e.to_string().contains("not.h5ad"), "{e}");
    assert!(e.part().is_some_and(|p| p.is::<InputError>()));

    let summary = convert::convert(&[example()], out.as_ref(), &options, &NoProgress).unwrap();
    assert_eq!(summary.n_cells, 1000);
    let e = convert::convert(&[example()], out.as_ref(), &options, &NoProgress).unwrap_err();
    assert!(matches!(&e, ConvertError::NotEmpty { .. }), "{e:?}");
    no_flag(&e);

    // A shard of a complete dataset: nothing left to run.
    let e = convert::run_shard(out.as_ref(), 0, 1, &ShardOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(&e, ConvertError::State { .. }), "{e:?}");
    // ... of an empty folder: no plan.
    let empty = store(&dir, "empty");
    let e = convert::run_shard(empty.as_ref(), 0, 1, &ShardOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(&e, ConvertError::NoPlan { .. }), "{e:?}");
    let e = convert::run_shard(empty.as_ref(), 2, 2, &ShardOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(&e, ConvertError::Argument(_)), "{e:?}");
    assert!(e.to_string().contains("2/2"), "{e}");

    // Nothing to resume in a complete dataset.
    let e = convert::resume(out.clone(), &AppendOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(&e, ConvertError::State { .. }), "{e:?}");
    no_flag(&e);
}

#[test]
fn an_append_met_half_way_is_an_append_error() {
    let dir = TestDir::new();
    let out = store(&dir, "ds");
    convert::convert(&[example()], out.as_ref(), &ConvertOptions::default(), &NoProgress).unwrap();
    // A planned append whose shards have not run yet, and an append of
    // other inputs.
    convert::plan_append(out.clone(), &[example()], &AppendOptions::default(), &NoProgress).unwrap();
    std::fs::copy(example(), dir.join("copy.h5ad")).unwrap();
    let e = convert::append(out.clone(), &[dir.join("copy.h5ad")], &AppendOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(&e, ConvertError::Append(AppendError::Planned { .. })), "{e:?}");
    no_flag(&e);

    // A dataset whose manifest was removed mid-conversion: the reader's error, kept.
    let other = store(&dir, "other");
    convert::convert(&[example()], other.as_ref(), &ConvertOptions::default(), &NoProgress).unwrap();
    std::fs::remove_file(dir.join("other/manifest.json")).unwrap();
    let e = convert::append(other, &[example()], &AppendOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(&e, ConvertError::Dataset(DatasetError::Incomplete { .. })), "{e:?}");
}
