//! End to end on real data: the two 10x PBMC files (14k cells) convert with the
//! default settings, verify, and export back to the same counts. The files come
//! from ../shared/data/fetch-pbmc.sh (scripts/test.sh fetches them into
//! data/pbmc); without them the test says so and is skipped.

use crate::convert::read_h5ad_rows;
use crate::util::{pbmc, TestDir};

#[test]
fn pbmc_converts_verifies_and_exports_back_to_the_same_counts() {
    let Some((ctrl, stim)) = pbmc() else { return };
    let t = TestDir::new();
    let (ctrl, stim) = (ctrl.to_str().unwrap(), stim.to_str().unwrap());
    let summary = t.run(&["convert", "--json", ctrl, stim, "pbmc"]).expect_code(0).json();
    assert_eq!(summary["n_cells"], 6548 + 7451);
    assert_eq!(summary["n_genes"], 14053);
    assert_eq!(summary["n_tiles"], 2);
    let bpn = summary["bytes_per_nonzero"].as_f64().unwrap();
    assert!(bpn > 0.5 && bpn < 1.0, "bytes per nonzero {bpn}");
    t.run(&["verify", "pbmc"]).expect_code(0);
    t.run(&["export", "-q", "--source-gene-order", "pbmc", "back.h5ad"]).expect_code(0);
    let mut want = read_h5ad_rows(std::path::Path::new(ctrl));
    want.extend(read_h5ad_rows(std::path::Path::new(stim)));
    assert_eq!(read_h5ad_rows(&t.join("back.h5ad")), want);
    crate::util::python_check(&[t.join("pbmc").to_str().unwrap(), t.join("back.h5ad").to_str().unwrap(), ctrl, stim]);
}
