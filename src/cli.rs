//! What the user types: clap derive types only.

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "deltacells",
    version,
    about = "Compact tiled storage for single-cell count matrices",
    long_about = "deltacells stores the count matrix of single-cell RNA-seq data as a folder of \
        compressed tiles (about 0.7-0.8 bytes per nonzero) that training jobs read tile by tile.\n\n\
        Exit status: 0 on success, 1 when verify finds problems, 2 on any error."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Summarize a dataset: cells, genes, tiles, size, encoding, obs and var.
    Info(InfoArgs),
    /// Check every tile, file and checksum of a dataset, reporting every problem.
    ///
    /// Reads the manifest, every tile (header against the manifest, CRC, a full
    /// decode with every rule of the format), gene_order.npy, var_names.txt,
    /// var.parquet and the obs shards (sizes, SHA-256, row groups, column types,
    /// category codes, fingerprint). Exit status 0 when clean, 1 when it found
    /// problems, 2 when it could not run (for example, a folder without
    /// manifest.json is an incomplete dataset).
    Verify(VerifyArgs),
}

#[derive(Debug, Args)]
pub(crate) struct InfoArgs {
    /// The dataset: a local folder or file:// URL.
    pub dataset: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct VerifyArgs {
    /// The dataset: a local folder or file:// URL.
    pub dataset: String,
    /// Print a machine-readable JSON report instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}
