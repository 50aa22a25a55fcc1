//! The loader alone, without Python: shuffled epochs of DATASET in batches of
//! 1,024 at the loader's defaults, on a pool of THREADS threads (2 unless
//! told), each batch's buffers given back to the pool as soon as it comes
//! (what the Python package does when NumPy frees them). For telling what an
//! epoch costs in Rust from what the Python layer adds
//! (docs/benchmarks/loading.md); the page cache is as the caller left it.
//!
//! usage: cargo run --release --example loader_epoch -- DATASET [EPOCHS] [THREADS]
//! prints, per epoch: cells, seconds, cells/s, CPU seconds of the process
//! (user and system, Linux only) and the cores they make.

use std::sync::Arc;
use std::time::Instant;

use deltacells::loader::{Batches, EpochPlan, LoaderBuffers, LoaderOptions};
use deltacells::Dataset;

/// The process's user and system CPU seconds, from /proc (None elsewhere).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // (the fields after the command, which is in parentheses)
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let Some(root) = args.get(1) else {
        anyhow::bail!("usage: loader_epoch DATASET [EPOCHS] [THREADS]");
    };
    let epochs: u64 = args.get(2).map_or(Ok(3), |s| s.parse())?;
    let threads: usize = args.get(3).map_or(Ok(2), |s| s.parse())?;
    let dataset = Arc::new(Dataset::open(root)?);
    let pool = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(threads).build()?);
    for epoch in 0..epochs {
        let options = LoaderOptions { epoch, ..LoaderOptions::default() };
        let plan = EpochPlan::new(&dataset, None, &options)?;
        let buffers = LoaderBuffers::new(&options);
        let (started, cpu) = (Instant::now(), cpu_seconds());
        let mut cells = 0;
        for batch in Batches::start(dataset.clone(), plan, Some(pool.clone()), &buffers)? {
            let batch = batch?;
            cells += batch.cells.len();
            buffers.batches.give_matrix(batch.x);
        }
        let seconds = started.elapsed().as_secs_f64();
        let cpu = match (cpu, cpu_seconds()) {
            (Some(a), Some(b)) => format!(", CPU {:.2} s ({:.2} cores)", b - a, (b - a) / seconds),
            _ => String::new(),
        };
        println!("epoch {epoch}: {cells} cells in {seconds:.2} s, {:.0} cells/s{cpu}", cells as f64 / seconds);
    }
    Ok(())
}
