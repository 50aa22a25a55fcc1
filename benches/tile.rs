//! Encoding and decoding one realistic tile of 10,000 cells, against plain zstd
//! on exactly the same frames at the same level, in the same run.
//!
//! The tile is made from the real PBMC files (fetch them with
//! `../shared/data/fetch-pbmc.sh data/pbmc`, or point DELTACELLS_PBMC at a
//! folder holding pbmc_ctrl.h5ad and pbmc_stim.h5ad); genes are sorted by
//! decreasing total counts as convert does. Without the files a synthetic tile
//! with a similar distribution is used, and the run says so.
//!
//! Run: `cargo bench --bench tile`. After criterion's own output, a table of
//! medians and the ratios the targets are stated in is printed.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use deltacells::convert::gene_order_from_totals;
use deltacells::format::tile::stream_frames;
use deltacells::format::{decode_tile, decode_tile_into, CsrMatrix, TileEncoder};
use deltacells::inputs::h5ad::H5adFile;
use deltacells::inputs::to_counts;

const TILE_CELLS: u64 = 10_000;
const LEVEL: i32 = 19;
const CHUNKS: usize = 8;

fn pbmc_dir() -> PathBuf {
    std::env::var_os("DELTACELLS_PBMC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/pbmc"))
}

/// The first 10,000 cells of the two PBMC files, genes sorted by decreasing
/// total counts over those cells.
fn pbmc_tile() -> Option<CsrMatrix> {
    let dir = pbmc_dir();
    let mut rows: Vec<CsrMatrix> = Vec::new();
    let mut left = TILE_CELLS;
    for name in ["pbmc_ctrl.h5ad", "pbmc_stim.h5ad"] {
        let file = H5adFile::open(&dir.join(name)).ok()?;
        let x = file.matrix("X").ok()?;
        let take = left.min(x.n_rows());
        let raw = x.read_rows(0..take).ok()?;
        rows.push(to_counts(&raw, x.n_cols() as u32, None).ok()?.0);
        left -= take;
        if left == 0 {
            break;
        }
    }
    let n_genes = rows[0].n_cols;
    let mut all = CsrMatrix::empty(n_genes);
    for r in &rows {
        all.append(r);
    }
    Some(sort_genes(&all))
}

fn sort_genes(m: &CsrMatrix) -> CsrMatrix {
    let order = gene_order_from_totals(&m.column_totals());
    let mut position = vec![0u32; order.len()];
    for (j, &g) in order.iter().enumerate() {
        position[g as usize] = j as u32;
    }
    m.with_columns(&position)
}

/// A synthetic tile: ~700 genes per cell of 14,000, skewed to low indices,
/// counts mostly 1-3.
fn synthetic_tile() -> CsrMatrix {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let n_genes = 14_000u32;
    let mut m = CsrMatrix::empty(n_genes);
    for _ in 0..TILE_CELLS {
        let mut gene = 0u64;
        loop {
            let step = 1 + (next() % 4) + gene / 400 * (next() % 3);
            gene += step;
            if gene >= u64::from(n_genes) {
                break;
            }
            let r = next() % 100;
            m.indices.push(gene as u32);
            m.data.push(if r < 55 {
                1
            } else if r < 75 {
                2
            } else if r < 95 {
                3 + (r % 5) as u32
            } else {
                10 + (next() % 200) as u32
            });
        }
        m.indptr.push(m.indices.len() as u64);
    }
    m
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool")
}

fn main() {
    let (tile, source) = match pbmc_tile() {
        Some(t) => (t, "PBMC (real data)"),
        None => {
            eprintln!("note: PBMC files not found in {}; using a synthetic tile", pbmc_dir().display());
            (synthetic_tile(), "synthetic")
        }
    };
    let nnz = tile.nnz() as u64;
    let encoder = TileEncoder::new(CHUNKS, LEVEL);
    let one = pool(1);
    let two = pool(2);
    let blob = one.install(|| encoder.encode(&tile)).expect("encodes");
    let frames: Vec<Vec<u8>> = stream_frames(&blob).expect("valid tile").into_iter().map(<[u8]>::to_vec).collect();
    let planes: Vec<Vec<u8>> = frames.iter().map(|f| zstd::bulk::decompress(f, 1 << 30).expect("frame")).collect();
    eprintln!(
        "tile: {source}, {} cells, {} genes, {nnz} nonzeros, {} bytes ({:.3} bytes per nonzero)",
        tile.n_rows(),
        tile.n_cols,
        blob.len(),
        blob.len() as f64 / nnz as f64
    );

    let mut c = Criterion::default().configure_from_args();
    {
        let mut g = c.benchmark_group("decode");
        g.throughput(Throughput::Elements(nnz)).measurement_time(Duration::from_secs(8));
        // The way a training loop reads: one output reused across tiles.
        let mut out = CsrMatrix::default();
        g.bench_function(BenchmarkId::new("deltacells", "1 thread"), |b| {
            b.iter(|| one.install(|| decode_tile_into(&blob, None, &mut out).expect("decodes")))
        });
        g.bench_function(BenchmarkId::new("deltacells", "2 threads"), |b| {
            b.iter(|| two.install(|| decode_tile_into(&blob, None, &mut out).expect("decodes")))
        });
        // A fresh output every time (the allocation and page faults included).
        g.bench_function(BenchmarkId::new("deltacells fresh output", "1 thread"), |b| {
            b.iter(|| one.install(|| decode_tile(&blob, None).expect("decodes")))
        });
        g.bench_function(BenchmarkId::new("plain zstd", "1 thread"), |b| {
            let mut d = zstd::bulk::Decompressor::new().expect("dctx");
            let mut out: Vec<Vec<u8>> = planes.iter().map(|p| vec![0u8; p.len()]).collect();
            b.iter(|| {
                for (f, o) in frames.iter().zip(out.iter_mut()) {
                    d.decompress_to_buffer(f, o.as_mut_slice()).expect("frame");
                }
            })
        });
        g.finish();
    }
    {
        let mut g = c.benchmark_group("encode");
        g.throughput(Throughput::Elements(nnz)).sample_size(10).measurement_time(Duration::from_secs(60));
        g.bench_function(BenchmarkId::new("deltacells", "1 thread"), |b| {
            b.iter(|| one.install(|| encoder.encode(&tile).expect("encodes")))
        });
        g.bench_function(BenchmarkId::new("plain zstd", "1 thread"), |b| {
            let mut cctx = zstd::bulk::Compressor::new(LEVEL).expect("cctx");
            b.iter(|| planes.iter().map(|p| cctx.compress(p).expect("compress").len()).sum::<usize>())
        });
        g.finish();
    }
    c.final_summary();
    report(nnz);
}

/// Reads criterion's medians back and prints them with the target ratios.
fn report(nnz: u64) {
    let root = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("criterion");
    let median = |group: &str, id: &str| -> Option<f64> {
        let text = std::fs::read_to_string(root.join(group).join(id).join("new/estimates.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["median"]["point_estimate"].as_f64()
    };
    let rows = [
        ("decode", "deltacells/1 thread"),
        ("decode", "deltacells/2 threads"),
        ("decode", "deltacells fresh output/1 thread"),
        ("decode", "plain zstd/1 thread"),
        ("encode", "deltacells/1 thread"),
        ("encode", "plain zstd/1 thread"),
    ];
    println!("\n{:<8} {:<34} {:>12} {:>16}", "group", "benchmark", "median", "M nonzeros/s");
    for (g, id) in rows {
        if let Some(ns) = median(g, id) {
            println!("{g:<8} {id:<34} {:>9.2} ms {:>16.1}", ns / 1e6, nnz as f64 / ns * 1e3);
        }
    }
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    if let Some(r) = ratio(median("decode", "deltacells/1 thread"), median("decode", "plain zstd/1 thread")) {
        println!("decode, 1 thread / plain zstd decompression: {r:.2}x (target <= 1.3x)");
    }
    if let Some(r) = ratio(median("encode", "deltacells/1 thread"), median("encode", "plain zstd/1 thread")) {
        println!("encode, 1 thread / plain zstd compression:   {r:.2}x (target <= 1.1x)");
    }
    if let Some(r) = ratio(median("decode", "deltacells/1 thread"), median("decode", "deltacells/2 threads")) {
        println!("decode speed-up, 2 threads over 1:          {r:.2}x (target >= 1.7x)");
    }
}
