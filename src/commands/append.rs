use anyhow::{bail, Context};
use indicatif::{HumanBytes, HumanCount};

use crate::convert::{append, resume, AppendOptions};

use super::progress::{plural, Bar};
use crate::cli::AppendArgs;

pub(crate) fn run(args: &AppendArgs) -> anyhow::Result<u8> {
    let started = std::time::Instant::now();
    super::set_threads(args.threads)?;
    super::check_spill_dir(args.spill_dir.as_deref())?;
    let (_, store) = crate::convert::open_output(&args.dataset, &args.store.options(), "append to")?;
    let inputs = if args.resume { Vec::new() } else { super::input_paths(&args.inputs, args.inputs_from.as_deref())? };
    let (reach, _downloads) = super::input_options(&args.store, &args.download, &args.reading, &inputs, false)?;
    let options = AppendOptions {
        matrix: args.matrix.clone(),
        shuffle: args.shuffle,
        spill_dir: args.spill_dir.clone(),
        inputs: reach,
        ..AppendOptions::default()
    };
    let progress = Bar::new(args.quiet);
    let summary = if args.resume {
        resume(store.clone(), &options, &progress)
    } else {
        if inputs.is_empty() {
            bail!("no input files: give DATASET INPUTS..., DATASET --inputs-from FILE, or --resume DATASET");
        }
        append(store.clone(), &inputs, &options, &progress)
    }
    .context(super::advice::Step::Append)?;
    progress.bar.finish_and_clear();
    if args.json {
        super::print_json(&summary)?;
    } else if !args.quiet {
        let ds = crate::redact::Redacted(&args.dataset);
        match summary.outcome.as_str() {
            "appended" => {
                let rewritten = match summary.tile_rewritten {
                    Some(t) => format!("rewrote tile {t} and "),
                    None => String::new(),
                };
                println!(
                    "{ds}: appended {} cells from {} ({} -> {} cells): {rewritten}added {}, {} of tiles written, {} written, in {:.1} s",
                    HumanCount(summary.cells_added),
                    plural(summary.inputs.len() as u64, "file", "files"),
                    HumanCount(summary.cells_before),
                    HumanCount(summary.n_cells),
                    plural(summary.tiles_added as u64, "tile", "tiles"),
                    HumanBytes(summary.tile_bytes_written),
                    plural(summary.obs_shards_written as u64, "obs shard", "obs shards"),
                    summary.seconds
                );
                if summary.summed_duplicates > 0 {
                    println!(
                        "{ds}: {} entries repeated a cell and gene of an earlier entry; each was added to it",
                        HumanCount(summary.summed_duplicates)
                    );
                }
            }
            outcome => println!(
                "{ds}: {outcome}: {} cells from {} ({} cells now)",
                HumanCount(summary.cells_added),
                plural(summary.inputs.len() as u64, "file", "files"),
                HumanCount(summary.n_cells)
            ),
        }
    }
    super::report_stats(store.as_ref(), &args.store, started, args.json);
    Ok(0)
}
