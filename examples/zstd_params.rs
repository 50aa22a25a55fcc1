//! The candidates for convert's default compression, measured on the byte
//! planes of a converted dataset: takes every plane its tiles hold (by
//! decompressing their frames), then compresses exactly those planes on one
//! thread with each candidate (a zstd level, or a level with parameters
//! suited to byte planes) and prints, per candidate, the bytes of the gaps,
//! the values and the exceptions, the total, and the seconds to compress and
//! to decompress everything (medians of REPEATS passes, warm, one thread).
//!
//! usage: cargo run --release --example zstd_params -- DATASET NNZ [REPEATS] [quick]
//!   NNZ is the dataset's nonzero count (`deltacells info`), for bytes per nonzero.
//! prints one tab-separated row per candidate: name, bytes/nnz, gaps bytes,
//! values bytes, exception bytes, compress s, decompress s, compress M nnz/s.

use std::time::Instant;

use deltacells::format::tile::stream_frames;
use deltacells::Dataset;
use zstd::zstd_safe::{CParameter, Strategy};

/// A candidate: a level and the parameters set on top of it.
struct Candidate {
    name: String,
    level: i32,
    params: Vec<CParameter>,
}

fn plain(level: i32) -> Candidate {
    Candidate { name: format!("level {level}"), level, params: Vec::new() }
}

fn with(name: &str, level: i32, params: Vec<CParameter>) -> Candidate {
    Candidate { name: name.to_string(), level, params }
}

fn candidates(quick: bool) -> Vec<Candidate> {
    if quick {
        return vec![plain(1), plain(3)];
    }
    let mut all: Vec<Candidate> = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 17, 19].into_iter().map(plain).collect();
    // Byte planes: short matches of single repeated bytes, so the strategy
    // and the search matter more than the window.
    all.push(with("btopt, search 1", 19, vec![CParameter::Strategy(Strategy::ZSTD_btopt), CParameter::SearchLog(1)]));
    all.push(with("btultra2, search 1", 19, vec![CParameter::SearchLog(1)]));
    all.push(with("btultra2, search 2, chain 16", 19, vec![CParameter::SearchLog(2), CParameter::ChainLog(16)]));
    all.push(with("btultra2, target 16", 19, vec![CParameter::TargetLength(16)]));
    all.push(with(
        "btultra, search 1",
        17,
        vec![CParameter::Strategy(Strategy::ZSTD_btultra), CParameter::SearchLog(1)],
    ));
    all.push(with("btopt, min match 4", 15, vec![CParameter::MinMatch(4)]));
    all.push(with("btlazy2, min match 3", 12, vec![CParameter::MinMatch(3)]));
    all.push(with("lazy2, min match 3", 7, vec![CParameter::MinMatch(3)]));
    all.push(with("level 19, long matching", 19, vec![CParameter::EnableLongDistanceMatching(true)]));
    all.push(with("level 3, long matching", 3, vec![CParameter::EnableLongDistanceMatching(true)]));
    all
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        anyhow::bail!("usage: zstd_params DATASET NNZ [REPEATS] [quick]");
    }
    let ds = Dataset::open(&args[1])?;
    let nnz: f64 = args[2].parse()?;
    let repeats: usize = args.get(3).map(|r| r.parse()).transpose()?.unwrap_or(3);
    let quick = args.get(4).is_some_and(|q| q == "quick");
    // Planes and their kind: a chunk's gaps and values come first, as a pair of
    // frames of equal decompressed size; its exception frames follow.
    let mut planes: Vec<(usize, Vec<u8>)> = Vec::new();
    for t in 0..ds.n_tiles() {
        let blob = ds.storage().get(&deltacells::format::tile_key(t))?.expect("tile exists");
        let frames = stream_frames(&blob)?;
        let decoded: Vec<Vec<u8>> =
            frames.iter().map(|f| zstd::bulk::decompress(f, 1 << 31)).collect::<Result<_, _>>()?;
        let mut i = 0;
        while i < decoded.len() {
            if i + 1 < decoded.len() && decoded[i].len() == decoded[i + 1].len() {
                planes.push((0, decoded[i].clone()));
                planes.push((1, decoded[i + 1].clone()));
                i += 2;
            } else {
                planes.push((2, decoded[i].clone()));
                i += 1;
            }
        }
    }
    let raw: usize = planes.iter().map(|p| p.1.len()).sum();
    eprintln!("{} planes, {raw} bytes, {} nonzeros", planes.len(), nnz);
    println!("candidate\tbytes/nnz\tgaps\tvalues\texceptions\tcompress_s\tdecompress_s\tcompress_Mnnz_s");
    let mut out = vec![0u8; planes.iter().map(|p| p.1.len()).max().unwrap_or(0)];
    for c in candidates(quick) {
        let mut compressor = zstd::bulk::Compressor::new(c.level)?;
        for p in &c.params {
            compressor.context_mut().set_parameter(*p).map_err(|e| anyhow::anyhow!("{}: {e}", c.name))?;
        }
        let mut times = Vec::new();
        let mut frames = Vec::new();
        for _ in 0..repeats {
            let started = Instant::now();
            frames = planes.iter().map(|(_, p)| compressor.compress(p)).collect::<Result<Vec<_>, _>>()?;
            times.push(started.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let mut by_kind = [0usize; 3];
        for ((kind, _), f) in planes.iter().zip(&frames) {
            by_kind[*kind] += f.len();
        }
        let mut decompressor = zstd::bulk::Decompressor::new()?;
        let mut dtimes = Vec::new();
        for _ in 0..repeats.max(3) {
            let started = Instant::now();
            for ((_, plane), frame) in planes.iter().zip(&frames) {
                decompressor.decompress_to_buffer(frame, &mut out[..plane.len()])?;
            }
            dtimes.push(started.elapsed().as_secs_f64());
        }
        dtimes.sort_by(f64::total_cmp);
        let total: usize = by_kind.iter().sum();
        let (ct, dt) = (times[times.len() / 2], dtimes[dtimes.len() / 2]);
        println!(
            "{}\t{:.4}\t{}\t{}\t{}\t{ct:.3}\t{dt:.3}\t{:.2}",
            c.name,
            total as f64 / nnz,
            by_kind[0],
            by_kind[1],
            by_kind[2],
            nnz / ct / 1e6
        );
    }
    Ok(())
}
