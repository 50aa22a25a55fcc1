//! The read paths users call outside the loader, against the floor of plain
//! zstd on the same frames, on one thread, in one run.
//!
//! A pass over the first 56,000 cells of a dataset of real PBMC cells (the
//! PBMC files repeated 8 times, made by `benches/loader.py` or
//! `benches/pbmc_copies.py` under target/bench-reader; or the dataset at
//! $DELTACELLS_BENCH_DATASET):
//!
//! - plain zstd: every frame of the tiles those cells are in, decompressed
//!   (the floor: no format can read the cells with less work);
//! - whole tiles: `Dataset::read_into` a `Selection::Tile` of each of those tiles;
//! - consecutive ranges: `Dataset::read` of a `Selection::Range` of 1,024 cells at a time,
//!   as an inference or export loop reads;
//! - random batches: `read` of a `Selection::List` of 1,024 cells drawn at random (sorted),
//!   as many batches as the pass has ranges.
//!
//! Run: `cargo bench --bench read_paths`. Medians of 7 passes after one,
//! page cache warm.

use std::path::PathBuf;
use std::time::Instant;

use deltacells::format::tile::stream_frames;
use deltacells::format::CsrMatrix;
use deltacells::Dataset;
use deltacells::Selection;
use rand::{RngExt, SeedableRng};

const CELLS: u64 = 56_000;
const RANGE: u64 = 1_024;

fn median(mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..7)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The first `n` cells in ranges of [`RANGE`], in order.
fn consecutive(n: u64) -> impl Iterator<Item = std::ops::Range<u64>> {
    (0..n).step_by(RANGE as usize).map(move |a| a..(a + RANGE).min(n))
}

fn main() {
    let root = std::env::var_os("DELTACELLS_BENCH_DATASET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-reader/pbmc_x8"));
    let Ok(ds) = Dataset::open(&root.display().to_string()) else {
        eprintln!("no dataset at {}: run benches/loader.py (or benches/pbmc_copies.py) first", root.display());
        return;
    };
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a thread pool");
    let n = CELLS.min(ds.n_cells());
    let last_tile = ds.locate(n - 1).expect("a cell").0;
    let blobs: Vec<bytes::Bytes> = (0..=last_tile).map(|t| ds.fetch_tile(t).expect("a tile")).collect();
    let frames: Vec<Vec<u8>> = blobs
        .iter()
        .flat_map(|b| stream_frames(b).expect("a valid tile").into_iter().map(<[u8]>::to_vec).collect::<Vec<_>>())
        .collect();
    let mut planes: Vec<Vec<u8>> =
        frames.iter().map(|f| zstd::bulk::decompress(f, 1 << 30).expect("a frame")).collect();
    let nnz: u64 = (0..=last_tile).map(|t| ds.manifest().tile_nnz[t]).sum();
    let cells_in_tiles = ds.tile_cells(last_tile).end;

    let mut rows: Vec<(&str, f64, u64, &str)> = Vec::new();
    let mut d = zstd::bulk::Decompressor::new().expect("a context");
    let floor = median(|| {
        for (f, p) in frames.iter().zip(planes.iter_mut()) {
            d.decompress_to_buffer(f, p.as_mut_slice()).expect("a frame");
        }
    });
    rows.push(("plain zstd, every frame of those tiles", floor, cells_in_tiles, "the floor"));
    let mut out = CsrMatrix::default();
    let whole = median(|| {
        one.install(|| {
            for t in 0..=last_tile {
                ds.read_into(Selection::Tile(t), &mut out).expect("a tile");
            }
        })
    });
    rows.push(("read_into(Tile), each of those tiles", whole, cells_in_tiles, ""));
    let ranges = median(|| {
        one.install(|| {
            for range in consecutive(n) {
                std::hint::black_box(ds.read(Selection::Range(range)).expect("cells"));
            }
        })
    });
    rows.push(("read(Range), consecutive 1,024-cell ranges", ranges, n, "target <= 1.6x the floor"));
    let into = median(|| {
        one.install(|| {
            for range in consecutive(n) {
                ds.read_into(Selection::Range(range), &mut out).expect("cells");
            }
        })
    });
    rows.push(("  the same into one reused output (read_into)", into, n, ""));
    // What a read of a range did before it kept the recent tile: the
    // tile fetched and checked, its chunks holding the range decoded, for
    // every range.
    let before = median(|| {
        one.install(|| {
            let mut start = 0;
            while start < n {
                let end = (start + RANGE).min(n);
                let (t, row) = ds.locate(start).expect("a cell");
                let tile_end = ds.tile_cells(t).end.min(end);
                let rows: Vec<u64> = (row..row + (tile_end - start)).collect();
                let blob = ds.fetch_tile(t).expect("a tile");
                let mut decoded = deltacells::CsrMatrix::default();
                deltacells::format::decode_rows_into(&blob, None, &rows, &mut decoded).expect("cells");
                std::hint::black_box(decoded);
                start = tile_end;
            }
        })
    });
    rows.push(("  the same, each range decoded afresh (before)", before, n, ""));
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(3);
    let batches: Vec<Vec<u64>> = (0..n.div_ceil(RANGE))
        .map(|_| {
            let mut cells: Vec<u64> = (0..RANGE).map(|_| rng.random_range(0..ds.n_cells())).collect();
            cells.sort_unstable();
            cells
        })
        .collect();
    let random = median(|| {
        one.install(|| {
            for b in &batches {
                std::hint::black_box(ds.read(Selection::List(b)).expect("cells"));
            }
        })
    });
    rows.push(("read(List), random 1,024-cell batches", random, RANGE * batches.len() as u64, ""));

    println!(
        "{} cells of {} ({} tiles, {nnz} nonzeros), 1 thread, medians of 7 passes after one, page cache warm",
        n,
        root.display(),
        last_tile + 1
    );
    println!();
    println!("| read | seconds | cells/s | x the floor | |");
    println!("|---|---|---|---|---|");
    for (name, s, cells, note) in rows {
        println!("| {name} | {s:.4} | {:.0} | {:.2}x | {note} |", cells as f64 / s, s / floor);
    }
}
