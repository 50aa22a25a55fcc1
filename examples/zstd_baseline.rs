//! The zstd-only baseline of benches/convert.sh: takes every byte plane that a
//! converted dataset's tiles hold (by decompressing their frames), then times
//! compressing exactly those planes with plain zstd at the dataset's level on
//! THREADS threads.
//!
//! With `decompress`, times decompressing every frame instead, on one thread
//! into reused buffers: the baseline of a pass that decodes every tile
//! (`deltacells verify --threads 1`).
//!
//! usage: cargo run --release --example zstd_baseline -- DATASET THREADS [decompress]
//! prints: frames, bytes, compressed bytes, seconds

use std::time::Instant;

use deltacells::format::tile::stream_frames;
use deltacells::Dataset;
use rayon::prelude::*;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (path, threads, decompress) = match &args[..] {
        [_, p, t] => (p.as_str(), t.parse::<usize>()?, false),
        [_, p, t, mode] if mode == "decompress" => (p.as_str(), t.parse::<usize>()?, true),
        _ => anyhow::bail!("usage: zstd_baseline DATASET THREADS [decompress]"),
    };
    let ds = Dataset::open(path)?;
    let level = ds.manifest().zstd_level as i32;
    let mut planes: Vec<Vec<u8>> = Vec::new();
    let mut frames: Vec<Vec<u8>> = Vec::new();
    for t in 0..ds.n_tiles() {
        let blob = ds.storage().get(&deltacells::format::tile_key(t))?.expect("tile exists");
        for frame in stream_frames(&blob)? {
            planes.push(zstd::bulk::decompress(frame, 1 << 31)?);
            frames.push(frame.to_vec());
        }
    }
    let bytes: usize = planes.iter().map(Vec::len).sum();
    if decompress {
        let mut d = zstd::bulk::Decompressor::new()?;
        let mut out = vec![0u8; planes.iter().map(Vec::len).max().unwrap_or(0)];
        let mut times = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            for (frame, plane) in frames.iter().zip(&planes) {
                d.decompress_to_buffer(frame, &mut out[..plane.len()])?;
            }
            times.push(started.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let compressed: usize = frames.iter().map(Vec::len).sum();
        println!("{} {bytes} {compressed} {:.3}", frames.len(), times[2]);
        return Ok(());
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
    let started = Instant::now();
    let compressed: usize =
        pool.install(|| planes.par_iter().map(|p| zstd::bulk::compress(p, level).expect("compresses").len()).sum());
    let seconds = started.elapsed().as_secs_f64();
    println!("{} {bytes} {compressed} {seconds:.3}", planes.len());
    Ok(())
}
