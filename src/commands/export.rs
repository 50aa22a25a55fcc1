use std::ops::Range;
use std::path::Path;

use anyhow::{bail, Context};
use indicatif::{HumanCount, ProgressBar, ProgressStyle};

use crate::convert::shuffle::{Origin, Scatter, MAX_BUCKETS};
use crate::export;
use crate::export::h5ad::{H5adWriter, Table};
use crate::format::CsrMatrix;
use crate::Dataset;

use crate::cli::ExportArgs;
use crate::dataset::Selection;

fn parse_range(text: Option<&str>, n_cells: u64) -> anyhow::Result<Range<u64>> {
    let Some(text) = text else { return Ok(0..n_cells) };
    let Some((a, b)) = text.split_once(':') else { bail!("--cells {text:?}: expected START:END") };
    let parse = |s: &str, default: u64| -> anyhow::Result<u64> {
        if s.is_empty() {
            Ok(default)
        } else {
            s.parse().with_context(|| format!("--cells {text:?}: {s:?} is not a cell index"))
        }
    };
    let (start, end) = (parse(a, 0)?, parse(b, n_cells)?);
    if start > end || end > n_cells {
        bail!("--cells {text:?}: outside 0:{n_cells}");
    }
    Ok(start..end)
}

/// Maps a block's columns through `order` (stored column -> source column) and
/// sorts each row.
fn to_source_order(block: &CsrMatrix, order: &[i32]) -> CsrMatrix {
    let mut out = CsrMatrix::empty(block.n_cols);
    let mut row: Vec<(u32, u32)> = Vec::new();
    for r in 0..block.n_rows() {
        let (genes, counts) = block.row(r);
        row.clear();
        row.extend(genes.iter().zip(counts).map(|(&g, &c)| (order[g as usize] as u32, c)));
        row.sort_unstable();
        out.indices.extend(row.iter().map(|p| p.0));
        out.data.extend(row.iter().map(|p| p.1));
        out.indptr.push(out.indices.len() as u64);
    }
    out
}

pub(crate) fn run(args: &ExportArgs) -> anyhow::Result<u8> {
    let started = std::time::Instant::now();
    let ds = Dataset::from_storage(super::open_store(&args.dataset, &args.store)?).context("export")?;
    let range = parse_range(args.cells.as_deref(), ds.n_cells())?;
    let out = Path::new(&args.out);
    if out.exists() && !args.overwrite {
        bail!("export: {} exists; use --overwrite to replace it", out.display());
    }
    let mut var_names =
        ds.var_names().context("export")?.unwrap_or_else(|| (0..ds.n_genes()).map(|g| g.to_string()).collect());
    let order = if args.source_gene_order {
        let Some(order) = ds.gene_order().context("export")? else {
            bail!(
                "export: {}: --source-gene-order needs gene_order.npy, which this dataset does not have",
                args.dataset
            );
        };
        let mut source_names = vec![String::new(); var_names.len()];
        for (j, &g) in order.iter().enumerate() {
            source_names[g as usize] = std::mem::take(&mut var_names[j]);
        }
        var_names = source_names;
        Some(order)
    } else {
        None
    };
    let obs = export::obs_table(&ds, range.clone())
        .context("export")?
        .unwrap_or_else(|| Table::names(&range.clone().map(|c| c.to_string()).collect::<Vec<_>>()));
    // With --source-order: each cell's row in the output, and obs in that order.
    let (ranks, obs) = if args.source_order {
        let (ranks, obs) =
            export::source_ranks(&obs).map_err(|e| anyhow::anyhow!("export: {}: --source-order: {e}", args.dataset))?;
        (Some(ranks), obs)
    } else {
        (None, obs)
    };
    let var = match export::var_table(&ds, order.as_deref()).context("export")? {
        Some(table) => table,
        None => Table::names(&var_names),
    };

    let bar = if super::show_progress(args.quiet) {
        let style = ProgressStyle::with_template("export {bar:30} {human_pos}/{human_len} cells {per_sec} ETA {eta}")
            .expect("valid");
        ProgressBar::new(range.end - range.start).with_style(style)
    } else {
        ProgressBar::hidden()
    };
    let mut writer = H5adWriter::create(out, ds.n_genes()).with_context(|| format!("export: {}", out.display()))?;
    let result = (|| -> anyhow::Result<()> {
        let mut write = |block: CsrMatrix| -> anyhow::Result<()> {
            let block = match &order {
                Some(order) => to_source_order(&block, order),
                None => block,
            };
            writer.append_rows(&block).with_context(|| format!("writing {}", out.display()))
        };
        // In source order, the cells are read tile by tile and spilled by
        // their row in the output, then written a bucket at a time.
        let mut scatter = match &ranks {
            Some(_) => {
                let n = range.end - range.start;
                let bucket = n.div_ceil(MAX_BUCKETS).max(ds.manifest().tile_size.max(1));
                Some(Scatter::new(&std::env::temp_dir(), 0..n, bucket, None)?)
            }
            None => None,
        };
        let mut start = range.start;
        while start < range.end {
            let (tile, _) = ds.locate(start)?;
            let end = ds.tile_cells(tile).end.min(range.end);
            let block = ds.read(Selection::Range(start..end))?;
            match (&mut scatter, &ranks) {
                (Some(scatter), Some(ranks)) => {
                    let at = (start - range.start) as usize..(end - range.start) as usize;
                    let origins: Vec<Origin> = (start..end).map(|row| Origin { input: 0, row }).collect();
                    scatter.add(&ranks[at], &origins, &block, None)?;
                }
                _ => write(block)?,
            }
            bar.inc(end - start);
            start = end;
        }
        if let Some(mut scatter) = scatter {
            scatter.finish()?;
            for b in 0..scatter.n_buckets() {
                write(scatter.gather(b, ds.n_genes())?.counts)?;
            }
        }
        Ok(())
    })();
    bar.finish_and_clear();
    if let Err(e) = result {
        writer.abandon();
        return Err(e.context("export"));
    }
    writer.finish(&obs, &var).with_context(|| format!("export: {}", out.display()))?;
    if !args.quiet {
        println!(
            "{}: {} cells x {} genes",
            out.display(),
            HumanCount(range.end - range.start),
            HumanCount(ds.n_genes().into())
        );
    }
    super::report_stats(ds.storage().as_ref(), &args.store, started, false);
    Ok(0)
}
