//! `deltacells compact`: a dataset's tiles encoded again at another level.

use anyhow::Context;
use indicatif::HumanBytes;

use super::progress::{plural, Bar};
use crate::cli::CompactArgs;
use crate::convert::compact;

pub(crate) fn run(args: &CompactArgs) -> anyhow::Result<u8> {
    let started = std::time::Instant::now();
    super::set_threads(args.threads)?;
    let (_, store) = crate::convert::open_output(&args.dataset, &args.store.options(), "compact")?;
    let progress = Bar::new(args.quiet);
    let summary = compact(store.clone(), args.level, &progress).context(super::advice::Step::Compact)?;
    progress.bar.finish_and_clear();
    if args.json {
        super::print_json(&summary)?;
    } else if !args.quiet {
        let ds = &args.dataset;
        let change = format!(
            "zstd level {} -> {}: {} -> {} of tiles ({:.1}%)",
            summary.level_before,
            summary.level,
            HumanBytes(summary.bytes_before),
            HumanBytes(summary.bytes_after),
            percent(summary.bytes_after, summary.bytes_before)
        );
        match summary.outcome.as_str() {
            "compacted" => println!(
                "{ds}: compacted {}, {change}, in {:.1} s",
                plural(summary.tiles_encoded as u64, "tile", "tiles"),
                summary.seconds
            ),
            "unchanged" => println!("{ds}: unchanged: its tiles are at zstd level {} already", summary.level),
            outcome => println!("{ds}: {outcome}: the interrupted compaction to zstd level {}", summary.level),
        }
    }
    super::report_stats(store.as_ref(), &args.store, started, args.json);
    Ok(0)
}

/// `after` as a percentage of `before` (100 for an empty dataset).
fn percent(after: u64, before: u64) -> f64 {
    if before == 0 {
        100.0
    } else {
        100.0 * after as f64 / before as f64
    }
}
