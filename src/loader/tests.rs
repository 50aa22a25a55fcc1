use std::collections::HashMap;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use super::*;
use crate::batch::OutputError;
use crate::dataset::Selection;
use crate::format::CsrMatrix;
use crate::storage::LocalStorage;
use crate::vocabulary::GeneMap;
use crate::writer::{write_matrix, WriteOptions};
use crate::{Dataset, DatasetError};

/// A dataset of `n` cells (each with a few counts that name it) in tiles of
/// `tile_size`, in a temporary folder.
fn dataset(n: usize, tile_size: u64) -> (tempfile::TempDir, Arc<Dataset>, CsrMatrix) {
    let mut rng = Pcg64Mcg::seed_from_u64(7);
    let mut m = CsrMatrix::empty(300);
    for cell in 0..n {
        let mut genes: Vec<u32> = (0..(rng.next_u32() % 12)).map(|_| rng.next_u32() % 300).collect();
        genes.sort_unstable();
        genes.dedup();
        for g in genes {
            m.indices.push(g);
            m.data.push(1 + (cell as u32 + g) % 50);
        }
        m.indptr.push(m.indices.len() as u64);
    }
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStorage::new(dir.path().to_path_buf());
    write_matrix(&store, &m, WriteOptions { tile_size, n_chunks: 4, zstd_level: 1 }).unwrap();
    let ds = Dataset::open(dir.path().to_str().unwrap()).unwrap();
    (dir, Arc::new(ds), m)
}

fn read(ds: &Arc<Dataset>, cells: Option<&[u64]>, options: &LoaderOptions) -> Vec<LoaderBatch> {
    let plan = EpochPlan::new(ds, cells, options).unwrap();
    let expected = plan.n_batches();
    let batches: Vec<LoaderBatch> =
        Batches::start(ds.clone(), plan, None, &LoaderBuffers::new(&LoaderOptions::default()))
            .unwrap()
            .map(Result::unwrap)
            .collect();
    assert_eq!(batches.len() as u64, expected);
    batches
}

fn cells_of(batches: &[LoaderBatch]) -> Vec<u64> {
    batches.iter().flat_map(|b| b.cells.iter().copied()).collect()
}

#[test]
fn every_cell_once_across_ranks_and_workers() {
    let (_dir, ds, _) = dataset(1003, 97);
    let subset: Vec<u64> = (0..1003).filter(|c| c % 3 != 1).rev().collect();
    for cells in [None, Some(&subset[..])] {
        for world_size in 1..=3 {
            for num_workers in 1..=2 {
                let mut seen = Vec::new();
                for rank in 0..world_size {
                    for worker in 0..num_workers {
                        let options = LoaderOptions {
                            batch_size: 64,
                            world_size,
                            rank,
                            num_workers,
                            worker,
                            epoch: 3,
                            ..LoaderOptions::default()
                        };
                        seen.extend(cells_of(&read(&ds, cells, &options)));
                    }
                }
                let mut want: Vec<u64> = cells.map_or_else(|| (0..1003).collect(), <[u64]>::to_vec);
                want.sort_unstable();
                seen.sort_unstable();
                assert_eq!(
                    seen,
                    want,
                    "world_size {world_size}, num_workers {num_workers}, subset {}",
                    cells.is_some()
                );
            }
        }
    }
}

#[test]
fn drop_last_gives_every_share_the_same_full_batches() {
    let (_dir, ds, _) = dataset(1003, 97);
    let mut counts = Vec::new();
    let mut seen = Vec::new();
    for rank in 0..3 {
        let options =
            LoaderOptions { batch_size: 50, world_size: 3, rank, drop_last: true, ..LoaderOptions::default() };
        let batches = read(&ds, None, &options);
        assert!(batches.iter().all(|b| b.cells.len() == 50));
        counts.push(batches.len());
        seen.extend(cells_of(&batches));
    }
    // 1003 cells: 334 per rank, 6 full batches of 50 each.
    assert_eq!(counts, [6, 6, 6]);
    let before = seen.len();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), before, "no cell twice");
}

#[test]
fn order_is_fixed_by_seed_and_epoch() {
    let (_dir, ds, _) = dataset(1003, 97);
    let options = LoaderOptions { batch_size: 100, seed: 5, epoch: 1, ..LoaderOptions::default() };
    let first = cells_of(&read(&ds, None, &options));
    assert_eq!(first, cells_of(&read(&ds, None, &options)));
    let other_epoch = cells_of(&read(&ds, None, &LoaderOptions { epoch: 2, ..options.clone() }));
    let other_seed = cells_of(&read(&ds, None, &LoaderOptions { seed: 6, ..options.clone() }));
    assert_ne!(first, other_epoch);
    assert_ne!(first, other_seed);
    assert_ne!(first, (0..1003).collect::<Vec<u64>>());
    // Cells are shuffled within a window of tiles: one batch mixes tiles.
    let tiles: std::collections::HashSet<u64> = first[..100].iter().map(|c| c / 97).collect();
    assert!(tiles.len() > 1, "the first batch comes from tiles {tiles:?}");
}

#[test]
fn without_shuffle_cells_come_in_dataset_order() {
    let (_dir, ds, _) = dataset(1003, 97);
    let options = LoaderOptions { batch_size: 128, shuffle: false, ..LoaderOptions::default() };
    assert_eq!(cells_of(&read(&ds, None, &options)), (0..1003).collect::<Vec<u64>>());
    let two = LoaderOptions { world_size: 2, rank: 1, ..options };
    assert_eq!(cells_of(&read(&ds, None, &two)), (501..1003).collect::<Vec<u64>>());
}

#[test]
fn batches_hold_the_rows_of_their_cells() {
    let (_dir, ds, m) = dataset(1003, 97);
    let subset: Vec<u64> = (0..1003).step_by(7).collect();
    // (Batches of more than ROWS_PER_TASK cells are written by several
    // tasks at once, each its rows' part of the buffers.)
    for (batch_size, threads) in [(33, 0), (300, 1), (300, 3), (1003, 2), (129, 2)] {
        let options = LoaderOptions { batch_size, window_tiles: 3, ..LoaderOptions::default() };
        for cells in [None, Some(&subset[..])] {
            let batches =
                if threads == 0 { read(&ds, cells, &options) } else { read_on(&ds, cells, &options, threads) };
            let mut seen = 0;
            for batch in batches {
                assert_eq!(batch.x.n_rows(), batch.cells.len());
                assert_eq!(batch.x.n_cols, 300);
                let mut want = CsrMatrix::empty(300);
                for &c in &batch.cells {
                    want.push_row_from(&m, c as usize);
                }
                assert_eq!(batch.x, want, "batches of {batch_size} on {threads} threads");
                seen += batch.cells.len();
            }
            assert_eq!(seen, cells.map_or(1003, <[u64]>::len));
        }
    }
}

#[test]
fn repeated_cells_are_read_as_often_as_listed() {
    let (_dir, ds, _) = dataset(300, 97);
    let cells = [5u64, 5, 200, 5, 299];
    let options = LoaderOptions { batch_size: 2, ..LoaderOptions::default() };
    let mut counts: HashMap<u64, usize> = HashMap::new();
    for c in cells_of(&read(&ds, Some(&cells), &options)) {
        *counts.entry(c).or_default() += 1;
    }
    assert_eq!(counts, HashMap::from([(5, 3), (200, 1), (299, 1)]));
}

#[test]
fn bad_options_and_cells_are_refused() {
    let (_dir, ds, _) = dataset(300, 97);
    let message = |cells: Option<&[u64]>, options: LoaderOptions| match EpochPlan::new(&ds, cells, &options) {
        Err(e) => crate::error_chain(&e),
        Ok(_) => panic!("accepted {options:?}"),
    };
    let d = LoaderOptions::default;
    assert_eq!(message(None, LoaderOptions { batch_size: 0, ..d() }), "batch_size must be at least 1");
    assert_eq!(message(None, LoaderOptions { rank: 2, world_size: 2, ..d() }), "rank 2 is not below world_size 2");
    assert_eq!(message(None, LoaderOptions { worker: 1, ..d() }), "worker 1 is not below num_workers 1");
    assert_eq!(message(Some(&[3, 300]), d()), "cell 300 is out of range: the dataset has 300 cells");
}

#[test]
fn a_bad_tile_ends_the_epoch_with_its_error() {
    let (dir, ds, _) = dataset(300, 97);
    let tile = dir.path().join(crate::format::tile_key(1));
    let mut bytes = std::fs::read(&tile).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&tile, bytes).unwrap();
    let options = LoaderOptions { batch_size: 10, shuffle: false, window_tiles: 1, ..LoaderOptions::default() };
    let plan = EpochPlan::new(&ds, None, &options).unwrap();
    let results: Vec<_> =
        Batches::start(ds.clone(), plan, None, &LoaderBuffers::new(&LoaderOptions::default())).unwrap().collect();
    // Tile 0's 97 cells give 9 full batches (the 10th waits for tile 1), then the error, then nothing.
    assert_eq!(results.len(), 10);
    assert!(results[..9].iter().all(Result::is_ok));
    let error = crate::error_chain(results[9].as_ref().unwrap_err());
    assert!(error.contains("tiles/tile_000001.dct: tile 1"), "{error}");
}

#[test]
fn dropping_the_batches_stops_the_threads() {
    let (_dir, ds, _) = dataset(1003, 97);
    let options = LoaderOptions { batch_size: 10, prefetch: 1, window_tiles: 1, ..LoaderOptions::default() };
    let buffers = LoaderBuffers::new(&options);
    for _ in 0..50 {
        let plan = EpochPlan::new(&ds, None, &options).unwrap();
        let mut batches = Batches::start(ds.clone(), plan, None, &buffers).unwrap();
        assert!(batches.next().unwrap().is_ok());
    }
    // The fetch and decompress stages hold the dataset, the batcher holds the
    // pools: once every loader's threads have exited, only this test holds
    // them. (Counting threads by name would race with the other tests.)
    let started = std::time::Instant::now();
    let held = || Arc::strong_count(&ds) + Arc::strong_count(&buffers.planes) + Arc::strong_count(&buffers.batches);
    while held() > 3 && started.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(held(), 3, "loader threads still running");
}

/// Waits (at most 10 s) until every value `pool` made is back in it: the
/// loader's threads give theirs back as they stop, after the last batch.
fn all_back<T: crate::buffers::Reusable>(pool: &crate::buffers::Pool<T>) -> (usize, usize) {
    let start = std::time::Instant::now();
    loop {
        let (held, made) = pool.counts();
        if held == made || start.elapsed() > std::time::Duration::from_secs(10) {
            return (held, made);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn every_chunk_decompressed_gives_its_planes_back_when_an_epoch_ends() {
    // 40 chunks, more than the 16 open at once: at the end some are open in
    // the batcher, some queued or being decompressed, and all come back.
    let (_dir, ds, _) = dataset(2000, 200);
    let options = LoaderOptions { batch_size: 64, ..LoaderOptions::default() };
    let buffers = LoaderBuffers::new(&options);
    for stop_after in [usize::MAX, 3] {
        let plan = EpochPlan::new(&ds, None, &options).unwrap();
        let batches = Batches::start(ds.clone(), plan, None, &buffers).unwrap();
        assert!(batches.take(stop_after).all(|b| b.is_ok()));
        let (held, made) = all_back(&buffers.planes);
        assert!(made > options.mix_chunks, "{made} planes made");
        assert_eq!(held, made, "planes lost (stopping after {stop_after} batches)");
    }
}

#[test]
fn the_planes_of_a_batch_of_one_cell_chunks_are_kept_not_freed() {
    // Tiles of 4 cells in 4 chunks: a batch holds 256 spent chunks until it
    // is written, more than the chunks open and decompressed ahead.
    let (_dir, ds, _) = dataset(2000, 4);
    let options = LoaderOptions { batch_size: 256, ..LoaderOptions::default() };
    let buffers = LoaderBuffers::new(&options);
    for epoch in 0..2 {
        let plan = EpochPlan::new(&ds, None, &LoaderOptions { epoch, ..options.clone() }).unwrap();
        assert!(Batches::start(ds.clone(), plan, None, &buffers).unwrap().all(|b| b.is_ok()));
        // Every plane made is kept, none freed: the next epoch makes new
        // ones only where it holds more at once than any epoch before.
        let (held, made) = all_back(&buffers.planes);
        assert!(made > options.batch_size, "{made} planes made");
        assert_eq!(held, made, "planes freed instead of kept (epoch {epoch})");
    }
}

#[test]
fn reused_buffers_of_any_length_give_the_same_batches() {
    let (_dir, ds, m) = dataset(1003, 97);
    for batch_size in [50, 400] {
        let options = LoaderOptions { batch_size, ..LoaderOptions::default() };
        let buffers = LoaderBuffers::new(&options);
        // Buffers given back by a consumer: stale values, and the two halves of a
        // batch of different lengths.
        for (i, d) in [(5000usize, 1usize), (1, 7000), (3, 3), (100_000, 10), (1, 20_000)] {
            buffers.batches.give_matrix(CsrMatrix {
                indices: vec![u32::MAX; i],
                data: vec![7; d],
                ..CsrMatrix::default()
            });
        }
        for epoch in 0..3 {
            let plan = EpochPlan::new(&ds, None, &LoaderOptions { epoch, ..options.clone() }).unwrap();
            for batch in Batches::start(ds.clone(), plan, None, &buffers).unwrap() {
                let batch = batch.unwrap();
                let mut want = CsrMatrix::empty(300);
                for &c in &batch.cells {
                    want.push_row_from(&m, c as usize);
                }
                assert_eq!(batch.x, want);
                // Given back as the binding does when NumPy frees the arrays.
                buffers.batches.give_matrix(batch.x);
            }
        }
    }
}

fn read_on(ds: &Arc<Dataset>, cells: Option<&[u64]>, options: &LoaderOptions, threads: usize) -> Vec<LoaderBatch> {
    let pool = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap());
    let plan = EpochPlan::new(ds, cells, options).unwrap();
    Batches::start(ds.clone(), plan, Some(pool), &LoaderBuffers::new(options)).unwrap().map(Result::unwrap).collect()
}

#[test]
fn the_order_does_not_depend_on_the_threads() {
    let (_dir, ds, _) = dataset(2000, 97);
    let subset: Vec<u64> = (0..2000).filter(|c| c % 5 != 2).collect();
    for cells in [None, Some(&subset[..])] {
        let options = LoaderOptions {
            batch_size: 37,
            seed: 11,
            epoch: 2,
            window_tiles: 3,
            mix_chunks: 5,
            ..LoaderOptions::default()
        };
        let one = cells_of(&read_on(&ds, cells, &options, 1));
        for threads in [2, 3, 8] {
            assert_eq!(cells_of(&read_on(&ds, cells, &options, threads)), one, "{threads} threads");
        }
    }
}

#[test]
fn a_batch_draws_on_the_chunks_of_the_whole_window() {
    // 21 tiles of 97 cells, 4 chunks each: a window of 8 tiles and 16 open
    // chunks give batches of 64 cells from many tiles; a window of one tile
    // and one open chunk gives batches from one or two tiles.
    let (_dir, ds, _) = dataset(2000, 97);
    let tiles_per_batch = |options: LoaderOptions| -> f64 {
        let batches = read(&ds, None, &LoaderOptions { batch_size: 64, ..options });
        let full: Vec<&LoaderBatch> = batches.iter().filter(|b| b.cells.len() == 64).collect();
        let tiles: usize =
            full.iter().map(|b| b.cells.iter().map(|c| c / 97).collect::<std::collections::HashSet<u64>>().len()).sum();
        tiles as f64 / full.len() as f64
    };
    let wide = tiles_per_batch(LoaderOptions::default());
    let narrow = tiles_per_batch(LoaderOptions { window_tiles: 1, mix_chunks: 1, ..LoaderOptions::default() });
    assert!(wide >= 5.0, "{wide} tiles per batch with a window of 8 and 16 open chunks");
    assert!(narrow <= 2.0, "{narrow} tiles per batch with a window of 1 and 1 open chunk");
}

#[test]
fn draws_by_weight_follow_the_weights() {
    let (_dir, ds, _) = dataset(300, 97);
    let options = LoaderOptions { batch_size: 100, seed: 3, ..LoaderOptions::default() };
    // Cells 0..100 weigh 1 each, 100..200 2, 200..250 nothing, 250..300 5:
    // the groups are drawn 100, 200, 0 and 250 times in 550.
    let weight = |c: usize| [1.0, 2.0, 0.0, 5.0][if c < 200 { c / 100 } else { 2 + (c - 200) / 50 }];
    let weights: Vec<f64> = (0..300).map(weight).collect();
    let draws = draw_by_weight(300, None, &weights, 20_000, &options).unwrap();
    assert_eq!(draws, draw_by_weight(300, None, &weights, 20_000, &options).unwrap(), "fixed by seed and epoch");
    let other = draw_by_weight(300, None, &weights, 20_000, &LoaderOptions { epoch: 1, ..options.clone() }).unwrap();
    assert_ne!(draws, other, "another epoch, other draws");
    let mut groups = [0usize; 4];
    for &d in &draws {
        let d = d as usize;
        groups[if d < 200 { d / 100 } else { 2 + (d - 200) / 50 }] += 1;
    }
    assert_eq!(groups[2], 0, "a cell of weight zero is never drawn");
    for (group, share) in [(0, 100.0 / 550.0), (1, 200.0 / 550.0), (3, 250.0 / 550.0)] {
        let got = groups[group] as f64 / 20_000.0;
        assert!((got - share).abs() < 0.015, "group {group}: {got} of the draws, {share} wanted");
    }
    // Over a subset, the weights are the subset's and so are the draws.
    let subset = [10u64, 250];
    let drawn = draw_by_weight(300, Some(&subset), &[1.0, 3.0], 200, &options).unwrap();
    assert!(drawn.iter().all(|c| subset.contains(c)));
    // The loader reads the draws: every share together yields each as often as drawn.
    let mut seen = Vec::new();
    for rank in 0..2 {
        seen.extend(cells_of(&read(&ds, Some(&draws), &LoaderOptions { rank, world_size: 2, ..options.clone() })));
    }
    let mut want = draws.clone();
    want.sort_unstable();
    seen.sort_unstable();
    assert_eq!(seen, want);
}

#[test]
fn bad_weights_are_refused_naming_them() {
    let o = LoaderOptions::default();
    let message = |cells: Option<&[u64]>, weights: &[f64], n: u64| match draw_by_weight(4, cells, weights, n, &o) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted {weights:?}"),
    };
    assert_eq!(message(None, &[1.0, 1.0], 4), "weights has 2 values, not one per cell of the dataset (4)");
    assert_eq!(message(Some(&[1]), &[1.0, 1.0], 4), "weights has 2 values, not one per cell of cells (1)");
    assert_eq!(message(None, &[1.0, -1.0, 0.0, 0.0], 4), "weights[1] is -1: weights must be finite and not negative");
    assert_eq!(
        message(None, &[1.0, f64::NAN, 0.0, 0.0], 4),
        "weights[1] is NaN: weights must be finite and not negative"
    );
    assert_eq!(message(None, &[0.0; 4], 4), "weights are all zero: no cell can be drawn");
    assert_eq!(
        message(None, &[1.0, 0.0, 0.0, 0.0], 101),
        "num_samples 101 is more than 100 draws for each of the 1 cells with a weight"
    );
}

#[test]
fn huge_batch_sizes_reserve_only_what_the_cells_need() {
    let (_dir, ds, _) = dataset(300, 97);
    let options = LoaderOptions { batch_size: 1 << 40, ..LoaderOptions::default() };
    let batches = read(&ds, None, &options);
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].cells.len(), 300);
    let refused = EpochPlan::new(&ds, None, &LoaderOptions { prefetch: 1 << 30, ..LoaderOptions::default() });
    assert_eq!(refused.err().unwrap().to_string(), "prefetch must be from 1 to 1024, not 1073741824");
}

#[test]
fn the_largest_windows_and_batches_hold_only_the_cells_there_are() {
    // Every size option at its type's largest: what is kept follows the
    // dataset (300 cells), and nothing overflows or aborts.
    let (_dir, ds, _) = dataset(300, 97);
    let options = LoaderOptions {
        batch_size: usize::MAX,
        window_tiles: usize::MAX,
        mix_chunks: usize::MAX,
        prefetch: MAX_PREFETCH,
        ..LoaderOptions::default()
    };
    let batches = read(&ds, None, &options);
    assert_eq!(batches.iter().map(|b| b.cells.len()).sum::<usize>(), 300);
    let mut cells: Vec<u64> = batches.iter().flat_map(|b| b.cells.iter().copied()).collect();
    cells.sort_unstable();
    assert_eq!(cells, (0..300).collect::<Vec<u64>>());
    // a dense batch that would take more than its budget is refused before anything is read
    let dense = BatchOutput { dense: true, ..BatchOutput::default() };
    let plan = EpochPlan::new(&ds, None, &options).unwrap();
    let refused = Batches::start_with(ds.clone(), plan, None, &LoaderBuffers::new(&options), dense.clone());
    assert!(refused.is_ok(), "300 cells x 97 genes fit");
    let message = OutputError::DenseTooLarge { rows: 1 << 30, n_cols: 97, bytes: (1u64 << 30) * 97 * 4 }.to_string();
    assert!(message.starts_with("dense: a batch of 1073741824 cells x 97 genes takes 416611827712 bytes dense"));
    assert!(dense.check_rows(1 << 30, 97).is_err() && dense.check_rows(1 << 20, 97).is_ok());
    // buffers for options never checked (a caller of the Rust API) keep at most the extremes, reserved lazily
    let unchecked = LoaderBuffers::new(&LoaderOptions { prefetch: usize::MAX, mix_chunks: usize::MAX, ..options });
    assert_eq!(unchecked.batches.keep(), usize::MAX);
}

#[test]
fn batches_in_a_gene_vocabulary_hold_the_mapped_rows_of_their_cells() {
    let (_dir, ds, m) = dataset(700, 97);
    let stored: Vec<String> = (0..300).map(|g| format!("g{g}")).collect();
    // Reordered, with absent genes, leaving most stored genes out.
    let wanted: Vec<String> = (0..150).rev().map(|g| format!("g{}", g * 3)).chain(["absent".to_string()]).collect();
    let map = Arc::new(GeneMap::by_name(&stored, &wanted).unwrap());
    let options = LoaderOptions { batch_size: 64, ..LoaderOptions::default() };
    let plan = EpochPlan::new(&ds, None, &options).unwrap();
    let output = BatchOutput { genes: Some(map.clone()), ..BatchOutput::default() };
    let batches = Batches::start_with(ds.clone(), plan, None, &LoaderBuffers::new(&options), output).unwrap();
    let mut seen = 0;
    for batch in batches {
        let batch = batch.unwrap();
        assert_eq!(batch.x.n_cols, 151);
        for (r, &cell) in batch.cells.iter().enumerate() {
            let (idx, val) = m.row(cell as usize);
            let mut want: Vec<(u32, u32)> =
                idx.iter().zip(val).filter(|(&g, _)| g % 3 == 0).map(|(&g, &v)| (149 - g / 3, v)).collect();
            want.sort_unstable();
            let (idx, val) = batch.x.row(r);
            let got: Vec<(u32, u32)> = idx.iter().copied().zip(val.iter().copied()).collect();
            assert_eq!(got, want, "cell {cell}");
            seen += 1;
        }
    }
    assert_eq!(seen, 700);
    // A map of another dataset's genes is refused.
    let other = Arc::new(GeneMap::by_name(&stored[..10], &wanted).unwrap());
    let plan = EpochPlan::new(&ds, None, &options).unwrap();
    let output = BatchOutput { genes: Some(other), ..BatchOutput::default() };
    let e = Batches::start_with(ds.clone(), plan, None, &LoaderBuffers::new(&options), output).err().unwrap();
    assert!(e.to_string().contains("10 stored genes"), "{e}");
}

#[test]
fn every_form_of_a_batch_is_the_form_of_its_cells_read_directly() {
    use crate::batch::{Normalize, SumOver};
    let (_dir, ds, _) = dataset(500, 97);
    let stored: Vec<String> = (0..300).map(|g| format!("g{g}")).collect();
    let wanted: Vec<String> = (0..120).map(|g| format!("g{}", (g * 7) % 300)).chain(["absent".into()]).collect();
    let map = Arc::new(GeneMap::by_name(&stored, &wanted).unwrap());
    let forms = [
        BatchOutput { dense: true, ..BatchOutput::default() },
        BatchOutput { genes: Some(map.clone()), log1p: true, ..BatchOutput::default() },
        BatchOutput {
            genes: Some(map.clone()),
            normalize: Some(Normalize { target_sum: 1e4, over: SumOver::Stored }),
            log1p: true,
            dense: true,
            top_k: Some(5),
            float32: false,
            unsorted: false,
        },
        BatchOutput { genes: Some(map.clone()), unsorted: true, ..BatchOutput::default() },
        BatchOutput { float32: true, dense: true, ..BatchOutput::default() },
        BatchOutput {
            normalize: Some(Normalize { target_sum: 10.0, over: SumOver::Output }),
            top_k: Some(300),
            ..BatchOutput::default()
        },
    ];
    let options = LoaderOptions { batch_size: 64, ..LoaderOptions::default() };
    for output in forms {
        let plan = EpochPlan::new(&ds, None, &options).unwrap();
        let batches = Batches::start_with(ds.clone(), plan, None, &LoaderBuffers::new(&options), output.clone());
        let mut seen = 0;
        for batch in batches.unwrap() {
            let batch = batch.unwrap();
            let direct = ds.read_formed(Selection::List(&batch.cells), &output).unwrap();
            assert_eq!(batch.x.indptr, direct.x.indptr, "{output:?}");
            assert_eq!(batch.x.indices, direct.x.indices);
            assert_eq!(batch.x.data, direct.x.data);
            assert_eq!(batch.values, direct.values);
            assert_eq!(batch.dense_counts, direct.dense_counts);
            assert_eq!(batch.top_k, direct.top_k);
            assert_eq!(batch.top_k_values, direct.top_k_values);
            seen += batch.cells.len();
        }
        assert_eq!(seen, 500);
    }
    let bad = BatchOutput { top_k: Some(0), ..BatchOutput::default() };
    assert!(matches!(ds.read_formed(Selection::List(&[0]), &bad), Err(DatasetError::Output(_))));
    let plan = EpochPlan::new(&ds, None, &options).unwrap();
    let e = Batches::start_with(ds.clone(), plan, None, &LoaderBuffers::new(&options), bad).err().unwrap();
    assert!(e.to_string().contains("top_k"), "{e}");
}
