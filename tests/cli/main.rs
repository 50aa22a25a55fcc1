//! Integration tests: run the `deltacells` binary and use the library, on
//! datasets the tests write themselves and on the conformance vectors in
//! ../shared/golden (skipped, with a note, where ../shared is absent).

mod append;
mod clusters;
mod collection;
mod compact;
mod convert;
mod dataset;
mod formats;
mod fuzz_regressions;
mod gene_order;
mod golden;
mod h5;
mod hardening;
mod hostile_inputs;
mod library_errors;
mod obs;
mod pbmc;
mod readers;
mod real_world;
mod remote;
mod remote_inputs;
mod secrets;
mod servers;
mod sharded;
mod shuffle;
mod slurm;
mod snakemake;
mod store_failures;
mod util;
