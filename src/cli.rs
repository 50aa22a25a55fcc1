//! What the user types: clap derive types only.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::convert::{ConvertOptions, GeneSet, ObsOptions};
use crate::inputs::InputFormat;
use crate::writer::WriteOptions;

/// `--genes`: which genes to store when the inputs' genes differ.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum GeneSetArg {
    Same,
    Intersection,
    Union,
}

impl From<GeneSetArg> for GeneSet {
    fn from(arg: GeneSetArg) -> GeneSet {
        match arg {
            GeneSetArg::Same => GeneSet::Same,
            GeneSetArg::Intersection => GeneSet::Intersection,
            GeneSetArg::Union => GeneSet::Union,
        }
    }
}

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
    /// Convert .h5ad files into a dataset.
    ///
    /// Reads the count matrix of each input (in the order given; cells keep
    /// that order, and tiles run across file boundaries), chooses the gene
    /// order from the total counts of up to --gene-order-files inputs, and
    /// writes tiles, gene_order.npy, var_names.txt, var.parquet (the first
    /// input's gene table), the obs table of every input as Parquet shards
    /// (one row group per tile; categorical columns share one vocabulary
    /// across files) and, last, manifest.json. Every input must have the same
    /// genes in the same order, and the same obs columns of the same kinds.
    ///
    /// The matrix must hold counts: whole numbers from 0 to 2^31-1 in any
    /// integer or float type. Explicit zeros are dropped, unsorted genes within
    /// a cell are sorted and duplicates summed. It may be stored as CSR (read
    /// in row blocks), dense (read in row blocks) or CSC; a CSC matrix cannot
    /// be read by rows, so it is read whole: memory grows with that file's X.
    ///
    /// Output: a local folder, or an s3:// or gs:// prefix, which must be
    /// empty or absent unless --overwrite. Every file is written under a
    /// temporary name and renamed (in a bucket, an object appears only when its
    /// upload is complete; large ones are uploaded in parts); manifest.json is
    /// written last, so an interrupted conversion leaves a dataset that verify
    /// reports as incomplete.
    Convert(ConvertArgs),
    /// Add the cells of .h5ad files to the end of a dataset.
    ///
    /// The inputs' cells come after the dataset's last cell, stored as the
    /// dataset stores its own: its gene order (matched by gene name, so the
    /// inputs' columns may be in another order, but they must have the same
    /// genes), tile size, chunks, zstd level and matrix (--matrix to read
    /// another), and its obs columns (the inputs must have them, of the same
    /// kinds; new categories go at the end of a column's vocabulary, so stored
    /// codes keep their meaning). The last tile, when not full, is rewritten
    /// with the first new cells; no other tile is touched. When a stored obs
    /// column's type must change (codes that must widen, a vocabulary past
    /// convert's --max-categories, a wider numeric type), every obs shard is
    /// rewritten and the command says so. The result is byte for byte what
    /// `convert` of the original inputs and these, with --gene-order-from
    /// the dataset, writes (except the manifest's metadata, which records each
    /// append: inputs, cells, time, version).
    ///
    /// A killed or failed append never damages the dataset: every new or
    /// rewritten file is staged under DATASET/.append/ with a record of the
    /// append, and only when all are written is manifest.json replaced (the
    /// staged files are moved into place between removing the old manifest and
    /// writing the new one). Running the same append again, or `append
    /// --resume DATASET`, completes an interrupted one to the same bytes.
    /// Set SOURCE_DATE_EPOCH to fix the time it records.
    Append(AppendArgs),
    /// Encode a dataset's tiles again at a higher zstd level (smaller, decodes
    /// as fast), after a fast conversion.
    ///
    /// Cells, obs and genes stay as they are; the tiles become byte for byte
    /// those `convert --level N` writes. As safe as append: the new tiles and
    /// manifest are staged under DATASET/.append/ and moved into place last, so
    /// that a kill leaves the old dataset or the new one. Running it again
    /// keeps the tiles already staged and completes an interrupted commit.
    Compact(CompactArgs),
    /// Sharded conversion, step 1 of 3: plan a conversion for many workers.
    ///
    /// Takes the same inputs and options as convert. Reads every input's shape,
    /// genes and obs (types and vocabularies), computes the gene order from the
    /// sampled files, fixes the tile layout, and writes the gene tables,
    /// obs/schema.json and OUT/.plan/plan.json. Then run `deltacells shard OUT
    /// --shard K/N` for K = 0..N-1 (in any order, on any machines that see OUT),
    /// and `deltacells finalize OUT`. The result is byte-identical to `convert`
    /// with the same inputs and options, whatever N.
    ///
    /// Each shard encodes whole obs shards (--obs-tiles-per-file tiles), so at
    /// most ceil(tiles / obs-tiles-per-file) shards have work; plan prints that
    /// number. Lower --obs-tiles-per-file for more shards.
    Plan(ConvertArgs),
    /// Sharded conversion, step 2 of 3: encode shard K of N.
    ///
    /// Encodes its contiguous range of tiles (reading only the rows of the
    /// inputs that hold them), writes them and their obs shards, and last a
    /// small result record in OUT/.plan/results/. Running a shard again writes
    /// the same bytes; it never touches another shard's files. When stderr is
    /// not a terminal, prints one line per tile written, with its rate.
    Shard(ShardArgs),
    /// Sharded conversion, step 3 of 3: check every shard's result and write
    /// the manifest.
    ///
    /// Refuses, naming them, shards whose result is missing, corrupt, from
    /// another plan, or whose tiles are missing or of the wrong size; re-run
    /// those shards and finalize again. Then writes manifest.json (last) and
    /// removes OUT/.plan.
    Finalize(FinalizeArgs),
    /// Write cells of a dataset back as an AnnData .h5ad file.
    ///
    /// X is written as an int32 CSR matrix; obs holds every stored obs column
    /// (categoricals with the whole vocabulary, anndata's nullable encodings
    /// where values are missing) with the cell names (obs_names; the cell
    /// indices when it has none) as its index; var holds the gene table of
    /// var.parquet (or the gene names). By default genes are in the dataset's
    /// column order (sorted by total counts); --source-gene-order restores the
    /// order of the original .h5ad files. The file is written
    /// under a temporary name and renamed when complete.
    Export(ExportArgs),
    /// Summarize a dataset: cells, genes, tiles, size, encoding, obs and var.
    ///
    /// Given a collection file (a .json written by the Python package's
    /// Collection.save), summarize the collection instead: its cells and
    /// genes, and for each dataset its cells, genes, how many of the
    /// collection's genes it holds, tiles, weight and root. Every dataset is
    /// opened and checked against the manifest digest the file records; one
    /// that changed is named (exit status 2).
    Info(InfoArgs),
    /// Cell metadata (obs): what a dataset holds, and copying columns into the
    /// local cache that training jobs memory-map.
    #[command(subcommand)]
    Obs(ObsCommand),
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

/// How to reach a dataset in an object store. The heading is set on each
/// option: a `next_help_heading` would also put every option declared after
/// the flattened group under it.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct StoreArgs {
    /// Send no credentials (public buckets).
    #[arg(long, help_heading = "Object stores")]
    pub anonymous: bool,
    /// The store's address, for S3-compatible stores and emulators (else
    /// $AWS_ENDPOINT_URL for s3://, $STORAGE_EMULATOR_HOST for gs://).
    #[arg(long, value_name = "URL", help_heading = "Object stores")]
    pub endpoint: Option<String>,
    /// Print requests made, bytes fetched and seconds to stderr when done.
    #[arg(long, help_heading = "Object stores")]
    pub stats: bool,
}

impl StoreArgs {
    /// The library's store options these arguments give.
    pub(crate) fn options(&self) -> crate::storage::StoreOptions {
        crate::storage::StoreOptions { anonymous: self.anonymous, endpoint: self.endpoint.clone() }
    }
}

/// How inputs at URLs are read: by ranges, or downloaded whole first.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct DownloadArgs {
    /// Download inputs at URLs whole before reading them, into --download-dir
    /// (default: a temporary folder removed when the command ends), instead
    /// of reading the byte ranges they need: a fallback for servers that do
    /// not answer ranged reads. Needs the inputs' size in free disk, which the
    /// command states first.
    #[arg(long, help_heading = "Inputs at URLs")]
    pub download_inputs: bool,
    /// Where --download-inputs puts the inputs (kept there afterwards).
    #[arg(long, value_name = "DIR", requires = "download_inputs", help_heading = "Inputs at URLs")]
    pub download_dir: Option<PathBuf>,
    /// MiB of inputs' blocks kept in memory, over every input read by byte
    /// ranges (at least 2): a small input read twice (for the gene order,
    /// then for the tiles) is fetched once while it fits.
    #[arg(
        long,
        value_name = "MIB",
        env = "DELTACELLS_INPUT_CACHE_MIB",
        default_value_t = 512,
        help_heading = "Inputs at URLs"
    )]
    pub input_cache_mib: u64,
    /// MiB fetched ahead of each sequential read of an input (0: one block of
    /// 256 KiB): enough to keep the link busy through a request's latency.
    #[arg(
        long,
        value_name = "MIB",
        env = "DELTACELLS_INPUT_READAHEAD_MIB",
        default_value_t = 32,
        help_heading = "Inputs at URLs"
    )]
    pub input_readahead_mib: u64,
}

impl DownloadArgs {
    /// The block cache's budgets these arguments give.
    pub(crate) fn block_cache(&self) -> crate::inputs::remote::BlockCacheOptions {
        crate::inputs::remote::BlockCacheOptions {
            budget: self.input_cache_mib.saturating_mul(1 << 20),
            read_ahead: self.input_readahead_mib.saturating_mul(1 << 20),
        }
    }
}

/// `--input-format`: the library's formats, by the names and help it gives
/// them (which the Python package takes too).
impl ValueEnum for InputFormat {
    fn value_variants<'a>() -> &'a [Self] {
        &InputFormat::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.as_str()).help(self.description()))
    }
}

/// How inputs are read: their format and which of their features.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct ReadingArgs {
    /// The inputs' format [default: told by each input: a .zarr folder, or
    /// one holding zarr.json or .zgroup, is AnnData zarr; another folder,
    /// .mtx or .mtx.gz is Matrix Market; an HDF5 file is 10x when laid out as
    /// Cell Ranger writes it, else AnnData].
    #[arg(long, value_name = "FORMAT", help_heading = "Input formats")]
    pub input_format: Option<InputFormat>,
    /// 10x and Matrix Market inputs: convert the features of this type (the
    /// feature_type of features.tsv or of the .h5 file) [default: Gene Expression].
    #[arg(long, value_name = "TYPE", help_heading = "Input formats")]
    pub feature_type: Option<String>,
    /// 10x .h5 inputs of several genomes: convert this genome's features
    /// (a file of several is refused, with their list, until one is named).
    #[arg(long, value_name = "NAME", help_heading = "Input formats")]
    pub genome: Option<String>,
}

impl ReadingArgs {
    /// The library's value for these arguments.
    pub(crate) fn reading(&self) -> anyhow::Result<crate::inputs::InputReading> {
        for (flag, value) in [("--feature-type", &self.feature_type), ("--genome", &self.genome)] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                anyhow::bail!("{flag}: an empty name; give the name as the file spells it");
            }
        }
        Ok(crate::inputs::InputReading {
            format: self.input_format,
            feature_type: self.feature_type.clone(),
            genome: self.genome.clone(),
        })
    }
}

#[derive(Debug, Args)]
pub(crate) struct InfoArgs {
    /// The dataset: a local folder, file://, s3://, gs://, http:// or https:// URL;
    /// or a collection file (COLLECTION.json).
    pub dataset: String,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct VerifyArgs {
    /// The dataset: a local folder, file://, s3://, gs://, http:// or https:// URL.
    pub dataset: String,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Print a machine-readable JSON report instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Also check the obs columns in the local cache against the shards.
    #[arg(long)]
    pub cache: bool,
    /// The cache root (see `obs localize --help`). verify also records
    /// there each local tile it found sound, so that later random reads
    /// of that version of the tile's file need not read it whole for its
    /// CRC.
    #[arg(long)]
    pub cache_dir: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ConvertArgs {
    /// Input .h5ad files, then the output folder (the last argument; with
    /// plan --append DATASET, every path is an input).
    #[arg(required = true, value_name = "INPUTS... OUT")]
    pub paths: Vec<String>,
    /// Read more input paths from FILE, one per line (after those given).
    #[arg(long, value_name = "FILE")]
    pub inputs_from: Option<String>,
    /// The matrix to convert: X, raw/X or layers/NAME [default: X; with
    /// plan --append, the dataset's].
    #[arg(long)]
    pub matrix: Option<String>,
    /// Cells per tile.
    #[arg(long, default_value_t = WriteOptions::default().tile_size, value_parser = clap::value_parser!(u64).range(1..))]
    pub tile_size: u64,
    /// Chunks per tile (units of parallel decoding). A cell read alone
    /// decompresses its whole chunk: for a dataset read in random batches
    /// rather than by the loader, 1024 reads them several times faster for
    /// about 10% more bytes (docs/benchmarks/gathers.md, "Random batches").
    #[arg(long, default_value_t = WriteOptions::default().n_chunks as u64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub chunks: u64,
    /// zstd compression level, 1-22. The default, 1, writes fastest; 19 is
    /// about 8% smaller, decodes as fast and writes some 50 times slower.
    /// `deltacells compact` encodes a dataset at 19 later, to the same bytes.
    #[arg(long, default_value_t = WriteOptions::default().zstd_level, value_parser = clap::value_parser!(i32).range(1..=22))]
    pub level: i32,
    /// Worker threads (default: all cores). The output is the same for any value.
    #[arg(long)]
    pub threads: Option<usize>,
    /// How many inputs (spread evenly, first and last included) are summed to
    /// choose the gene order; 0 keeps the source order.
    #[arg(long, default_value_t = ConvertOptions::default().gene_order_files)]
    pub gene_order_files: usize,
    /// Store the genes in the order of this dataset (local or bucket; by gene
    /// name, from its var_names.txt), so that both have the same columns. The
    /// inputs must have the same genes; the first difference is named.
    #[arg(long, value_name = "DATASET", conflicts_with_all = ["gene_order", "gene_order_files"])]
    pub gene_order_from: Option<String>,
    /// Store the genes in this order: a .npy file of int32 or int64 whose entry
    /// j is the input column stored as column j (as gene_order.npy; for
    /// example np.argsort of a ranking), listing every column once.
    #[arg(long, value_name = "FILE.npy", conflicts_with = "gene_order_files")]
    pub gene_order: Option<PathBuf>,
    /// plan only: sum the gene totals of share K of N of the inputs sampled
    /// for the gene order (K from 0 to N-1) and store them in OUT, so that N
    /// machines read those inputs' X at once; `plan` with the same inputs and
    /// options then adds them up instead of reading X itself.
    #[arg(long, value_name = "K/N", conflicts_with_all = ["gene_order_from", "gene_order"])]
    pub totals_shard: Option<String>,
    /// plan only: plan an append of INPUTS... (every path given is an input)
    /// to this dataset, for `deltacells shard DATASET --shard K/N` and
    /// `deltacells finalize DATASET`; the result is what `deltacells append`
    /// writes. The layout, gene and obs options are the dataset's: only
    /// --matrix, --inputs-from, --shuffle and the object-store options apply.
    #[arg(long, value_name = "DATASET", conflicts_with_all = ["gene_order_from", "gene_order", "totals_shard", "overwrite"])]
    pub append: Option<String>,
    /// Which genes to store when the inputs' genes differ. Inputs with the same
    /// genes in another order are always aligned by name. `same` refuses
    /// inputs whose gene sets differ; `intersection` keeps the genes every
    /// input has (the nonzeros of the others are counted and left out);
    /// `union` keeps every gene of any input (an input's missing genes are
    /// zeros for its cells). Recorded in the manifest's metadata.
    #[arg(long, value_enum, default_value = "same")]
    pub genes: GeneSetArg,
    /// Do not write var.parquet.
    #[arg(long)]
    pub no_var: bool,
    /// Do not store obs (cell metadata) at all.
    #[arg(long)]
    pub no_obs: bool,
    /// Do not store the cell names (the obs index) as the obs_names column.
    #[arg(long)]
    pub no_obs_names: bool,
    /// Leave these obs columns out (comma-separated), e.g. columns of a type
    /// obs cannot store, such as datetimes.
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    pub obs_exclude: Vec<String>,
    /// A categorical obs column with more categories than this is stored as
    /// strings (for example cell barcodes).
    #[arg(long, default_value_t = ObsOptions::default().max_categories)]
    pub max_categories: usize,
    /// Tiles (one Parquet row group each) per obs shard file.
    #[arg(long, default_value_t = ObsOptions::default().tiles_per_file, value_parser = clap::value_parser!(u64).range(1..))]
    pub obs_tiles_per_file: u64,
    /// Store the cells of all inputs in a random order fixed by SEED (any
    /// integer 0..2^64), so that every tile is a random sample of the dataset
    /// and the loader's batches mix samples stored one input after another.
    /// obs gains source_file (the input) and source_row (its row) for each
    /// cell; `export --source-order` writes the inputs' order back. Costs one
    /// more pass over the cells, spilled to --spill-dir. The bytes are the
    /// same for any --threads and any number of shards.
    #[arg(long, value_name = "SEED")]
    pub shuffle: Option<u64>,
    /// Where --shuffle keeps the cells between its two passes (default: the
    /// system's temporary folder, $TMPDIR): it needs about twice the output's
    /// tile bytes free (the cells compressed fast), removed when the
    /// conversion ends.
    #[arg(long, value_name = "DIR", requires = "shuffle")]
    pub spill_dir: Option<PathBuf>,
    /// Replace a dataset already in OUT (its manifest is removed first).
    #[arg(long)]
    pub overwrite: bool,
    /// Add KEY=VALUE to the manifest's metadata (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    #[command(flatten)]
    pub download: DownloadArgs,
    #[command(flatten)]
    pub reading: ReadingArgs,
    /// No progress bar and no summary line.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub(crate) struct AppendArgs {
    /// The dataset: a local folder, or an s3:// or gs:// prefix.
    pub dataset: String,
    /// Input .h5ad files, appended in the order given.
    #[arg(value_name = "INPUTS")]
    pub inputs: Vec<String>,
    /// Read more input paths from FILE, one per line (after those given).
    #[arg(long, value_name = "FILE")]
    pub inputs_from: Option<String>,
    /// The matrix of the inputs to append: X, raw/X or layers/NAME (default:
    /// the one the dataset was converted from).
    #[arg(long)]
    pub matrix: Option<String>,
    /// Complete the interrupted append whose record is in DATASET/.append/
    /// (with the inputs it recorded).
    #[arg(long, conflicts_with_all = ["inputs", "inputs_from", "matrix", "shuffle"])]
    pub resume: bool,
    /// Store the appended cells in a random order fixed by SEED, after the
    /// dataset's cells (which keep their places). The dataset must have been
    /// converted with --shuffle, whose obs says where each cell was read
    /// (source_file and source_row, which the append extends).
    #[arg(long, value_name = "SEED")]
    pub shuffle: Option<u64>,
    /// Where --shuffle keeps the cells between its two passes (default:
    /// $TMPDIR): about twice the appended cells' tile bytes.
    #[arg(long, value_name = "DIR", requires = "shuffle")]
    pub spill_dir: Option<PathBuf>,
    #[command(flatten)]
    pub download: DownloadArgs,
    #[command(flatten)]
    pub reading: ReadingArgs,
    /// Worker threads (default: all cores). The output is the same for any value.
    #[arg(long)]
    pub threads: Option<usize>,
    /// No progress bar and no summary line.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub(crate) struct CompactArgs {
    /// The dataset: a local folder, or an s3:// or gs:// prefix.
    pub dataset: String,
    /// The zstd level to encode the tiles at (1-22).
    #[arg(long, default_value_t = crate::writer::ARCHIVE_LEVEL, value_parser = clap::value_parser!(i32).range(1..=22))]
    pub level: i32,
    /// Worker threads (default: all cores). The output is the same for any value.
    #[arg(long)]
    pub threads: Option<usize>,
    /// No progress bar and no summary line.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("index").required(true).args(["shard", "shard_from_env"])))]
pub(crate) struct ShardArgs {
    /// The output of `deltacells plan`.
    pub out: String,
    /// This worker's shard: K/N, K from 0 to N-1.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
    /// Take K from the job array's environment: SLURM_ARRAY_TASK_ID (minus
    /// SLURM_ARRAY_TASK_MIN), JOB_COMPLETION_INDEX (Kubernetes Indexed Jobs) or
    /// AWS_BATCH_JOB_ARRAY_INDEX; N from --shards, else SLURM_ARRAY_TASK_COUNT
    /// or AWS_BATCH_JOB_ARRAY_SIZE.
    #[arg(long)]
    pub shard_from_env: bool,
    /// N, the number of shards, with --shard-from-env.
    #[arg(long, value_name = "N")]
    pub shards: Option<usize>,
    /// Where the shard of a shuffled plan (`plan --shuffle`) keeps its cells
    /// between its two passes (default: the system's temporary folder,
    /// $TMPDIR): about twice its share of the output's tile bytes.
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<PathBuf>,
    #[command(flatten)]
    pub download: DownloadArgs,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the shard's result as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub(crate) struct FinalizeArgs {
    /// The output of `deltacells plan`, with every shard run.
    pub out: String,
    /// No summary line.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// The dataset: a local folder, file://, s3://, gs://, http:// or https:// URL.
    pub dataset: String,
    #[command(flatten)]
    pub store: StoreArgs,
    /// The .h5ad file to write.
    pub out: String,
    /// Only cells START:END (global indices, END excluded; either may be left out).
    #[arg(long, value_name = "START:END")]
    pub cells: Option<String>,
    /// Put genes back in the order of the source files (needs gene_order.npy).
    #[arg(long)]
    pub source_gene_order: bool,
    /// Put cells back in the order of the source files: a dataset converted
    /// with --shuffle, whose obs says where each cell was read (the
    /// source_file and source_row columns, left out of the export). With
    /// --cells, those cells in their source order. Spills the cells once to
    /// $TMPDIR.
    #[arg(long)]
    pub source_order: bool,
    /// Replace OUT if it exists.
    #[arg(long)]
    pub overwrite: bool,
    /// No progress bar and no summary line.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ObsCommand {
    /// Every obs column: kind, Arrow type, number of categories, the bytes a
    /// localize would fetch for it (from the shard footers), and whether it is
    /// already in the local cache.
    Info(ObsInfoArgs),
    /// Copy obs columns into the local cache.
    ///
    /// For each column, only its chunk of each row group is read (after one
    /// read of each shard's footer), and written to
    /// <cache>/<fingerprint>/obs/<column>.arrow, an uncompressed Arrow IPC file
    /// with one record batch per tile. The cache is, in order: --cache-dir,
    /// $DELTACELLS_CACHE, $XDG_CACHE_HOME/deltacells, ~/.cache/deltacells.
    /// Columns are added one at a time under a lock, so processes started
    /// together fetch each column once; a cached file that does not match the
    /// dataset is fetched again.
    Localize(LocalizeArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ObsInfoArgs {
    /// The dataset: a local folder, file://, s3://, gs://, http:// or https:// URL.
    pub dataset: String,
    #[command(flatten)]
    pub store: StoreArgs,
    /// The cache root (see `obs localize --help`).
    #[arg(long)]
    pub cache_dir: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["columns", "all"])))]
pub(crate) struct LocalizeArgs {
    /// The dataset: a local folder, file://, s3://, gs://, http:// or https:// URL.
    pub dataset: String,
    #[command(flatten)]
    pub store: StoreArgs,
    /// The columns to copy (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    pub columns: Vec<String>,
    /// Copy every column.
    #[arg(long)]
    pub all: bool,
    /// Requests in flight (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The cache root.
    #[arg(long)]
    pub cache_dir: Option<String>,
    /// Fetch the columns again even when the cache holds valid copies.
    #[arg(long)]
    pub force: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}
