//! The zstd-only baseline of benches/convert.sh: takes every byte plane that a
//! converted dataset's tiles hold (by decompressing their frames), then times
//! compressing exactly those planes with plain zstd at the dataset's level on
//! THREADS threads.
//!
//! usage: cargo run --release --example zstd_baseline -- DATASET THREADS
//! prints: frames, bytes, seconds

use std::time::Instant;

use deltacells::format::tile::stream_frames;
use deltacells::Dataset;
use rayon::prelude::*;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (path, threads) = match &args[..] {
        [_, p, t] => (p.as_str(), t.parse::<usize>()?),
        _ => anyhow::bail!("usage: zstd_baseline DATASET THREADS"),
    };
    let ds = Dataset::open(path)?;
    let level = ds.manifest().zstd_level as i32;
    let mut planes: Vec<Vec<u8>> = Vec::new();
    for t in 0..ds.n_tiles() {
        let blob = ds.storage().get(&deltacells::format::tile_key(t))?.expect("tile exists");
        for frame in stream_frames(&blob)? {
            planes.push(zstd::bulk::decompress(frame, 1 << 31)?);
        }
    }
    let bytes: usize = planes.iter().map(Vec::len).sum();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
    let started = Instant::now();
    let compressed: usize =
        pool.install(|| planes.par_iter().map(|p| zstd::bulk::compress(p, level).expect("compresses").len()).sum());
    let seconds = started.elapsed().as_secs_f64();
    println!("{} {bytes} {compressed} {seconds:.3}", planes.len());
    Ok(())
}
