use std::collections::HashMap;
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use super::*;
use crate::loader::{Batches, EpochPlan, LoaderBatch, LoaderBuffers};
use crate::storage::LocalStorage;
use crate::writer::{write_named_matrix, WriteOptions};
use crate::CsrMatrix;

/// A dataset of `n` cells over the genes `names` (a few counts per cell,
/// seeded by `seed`) in tiles of `tile_size`, in a temporary folder; with its
/// matrix.
fn dataset(n: usize, names: &[String], tile_size: u64, seed: u64) -> (tempfile::TempDir, CsrMatrix) {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let g = names.len() as u32;
    let mut m = CsrMatrix::empty(g);
    for cell in 0..n {
        let mut genes: Vec<u32> = (0..(rng.next_u32() % 12)).map(|_| rng.next_u32() % g).collect();
        genes.sort_unstable();
        genes.dedup();
        for j in genes {
            m.indices.push(j);
            m.data.push(1 + (cell as u32 * 7 + j) % 50);
        }
        m.indptr.push(m.indices.len() as u64);
    }
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStorage::new(dir.path().to_path_buf());
    write_named_matrix(&store, &m, WriteOptions { tile_size, n_chunks: 4, zstd_level: 1 }, Some(names)).unwrap();
    (dir, m)
}

fn names(range: std::ops::Range<u32>) -> Vec<String> {
    range.map(|g| format!("g{g}")).collect()
}

/// Three datasets with overlapping gene sets, the second in another order.
struct Three {
    dirs: Vec<tempfile::TempDir>,
    matrices: Vec<CsrMatrix>,
    genes: Vec<Vec<String>>,
}

fn three() -> Three {
    let mut second = names(20..70);
    second.reverse();
    let genes = vec![names(0..50), second, names(10..40)];
    let sizes = [301usize, 157, 420];
    let (mut dirs, mut matrices) = (Vec::new(), Vec::new());
    for (i, (g, &n)) in genes.iter().zip(&sizes).enumerate() {
        let (dir, m) = dataset(n, g, 37 + 10 * i as u64, i as u64);
        dirs.push(dir);
        matrices.push(m);
    }
    Three { dirs, matrices, genes }
}

fn pairs(t: &Three) -> Vec<(String, String)> {
    t.dirs.iter().enumerate().map(|(i, d)| (format!("d{i}"), d.path().display().to_string())).collect()
}

/// Cell `row` of `m`, as (gene name, count) pairs sorted by name.
fn named_row(m: &CsrMatrix, genes: &[String], row: usize, keep: &[String]) -> Vec<(String, u32)> {
    let (indices, data) = m.row(row);
    let mut out: Vec<(String, u32)> = indices
        .iter()
        .zip(data)
        .map(|(&j, &c)| (genes[j as usize].clone(), c))
        .filter(|(name, _)| keep.contains(name))
        .collect();
    out.sort();
    out
}

fn batch_row(x: &CsrMatrix, vocabulary: &[String], row: usize) -> Vec<(String, u32)> {
    let (indices, data) = x.row(row);
    let mut out: Vec<(String, u32)> =
        indices.iter().zip(data).map(|(&j, &c)| (vocabulary[j as usize].clone(), c)).collect();
    out.sort();
    out
}

#[test]
fn union_and_intersection_are_in_the_documented_order() {
    let t = three();
    let c = Collection::open(&pairs(&t), &GeneChoice::Union, None, &StoreOptions::default()).unwrap();
    let mut expected = names(0..50);
    let mut second = names(50..70);
    second.reverse();
    expected.extend(second);
    assert_eq!(c.vocabulary(), &expected[..]);
    let c = Collection::open(&pairs(&t), &GeneChoice::Intersection, None, &StoreOptions::default()).unwrap();
    assert_eq!(c.vocabulary(), &names(20..40)[..]);
    assert_eq!(c.n_cells(), 301 + 157 + 420);
    assert_eq!(c.locate(301).unwrap(), (1, 0));
    assert_eq!(c.locate(300).unwrap(), (0, 300));
    assert!(c.locate(878).unwrap_err().to_string().contains("the collection has 878 cells"));
}

#[test]
fn every_cell_once_per_epoch_across_shares_each_row_its_own_datasets() {
    let t = three();
    let c = Collection::open(&pairs(&t), &GeneChoice::Union, None, &StoreOptions::default()).unwrap();
    let c = Arc::new(c);
    let vocabulary = c.vocabulary().to_vec();
    let mut seen = Vec::new();
    let mut datasets_per_batch = Vec::new();
    for worker in 0..3 {
        let options = LoaderOptions { batch_size: 50, num_workers: 3, worker, window_tiles: 6, ..Default::default() };
        let plan = EpochPlan::over(c.as_ref(), None, &options).unwrap();
        let source: Arc<dyn TileSource> = c.clone();
        let batches: Vec<LoaderBatch> =
            Batches::start_over(source, plan, None, &LoaderBuffers::new(&options), BatchOutput::default())
                .unwrap()
                .map(Result::unwrap)
                .collect();
        for b in &batches {
            let mut members = HashSet::new();
            for (r, &cell) in b.cells.iter().enumerate() {
                let (m, row) = c.locate(cell).unwrap();
                members.insert(m);
                let want = named_row(&t.matrices[m], &t.genes[m], row as usize, &vocabulary);
                assert_eq!(batch_row(&b.x, &vocabulary, r), want, "cell {cell}");
                seen.push(cell);
            }
            datasets_per_batch.push(members.len());
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..c.n_cells()).collect::<Vec<_>>());
    // Batches mix the datasets.
    assert!(datasets_per_batch.iter().filter(|&&n| n >= 2).count() * 2 > datasets_per_batch.len());
}

#[test]
fn an_epoch_over_a_list_of_genes_gives_each_row_mapped_in_column_order() {
    // Batches larger than a task's rows: rows are mapped in parallel, and
    // moved up over the genes the list leaves out.
    let t = three();
    let wanted: Vec<String> = ["g45", "g5", "nope", "g60", "g30", "g21", "g0"].iter().map(|s| s.to_string()).collect();
    let c = Collection::open(&pairs(&t), &GeneChoice::List(wanted.clone()), None, &StoreOptions::default()).unwrap();
    let c = Arc::new(c);
    let options = LoaderOptions { batch_size: 300, ..Default::default() };
    let plan = EpochPlan::over(c.as_ref(), None, &options).unwrap();
    let source: Arc<dyn TileSource> = c.clone();
    let mut seen = 0;
    for b in Batches::start_over(source, plan, None, &LoaderBuffers::new(&options), BatchOutput::default()).unwrap() {
        let b = b.unwrap();
        assert_eq!(b.x.indptr.len(), b.cells.len() + 1);
        for (r, &cell) in b.cells.iter().enumerate() {
            let (m, row) = c.locate(cell).unwrap();
            assert!(b.x.row(r).0.windows(2).all(|w| w[0] < w[1]), "cell {cell}: columns out of order");
            assert_eq!(batch_row(&b.x, &wanted, r), named_row(&t.matrices[m], &t.genes[m], row as usize, &wanted));
            seen += 1;
        }
    }
    assert_eq!(seen, c.n_cells());
}

#[test]
fn read_cells_formed_maps_each_dataset_onto_the_list() {
    let t = three();
    let wanted: Vec<String> = ["g45", "nope", "g5", "g60", "g30"].iter().map(|s| s.to_string()).collect();
    let c = Collection::open(&pairs(&t), &GeneChoice::List(wanted.clone()), None, &StoreOptions::default()).unwrap();
    let cells = [877u64, 0, 301, 5, 301, 460];
    let formed = c.read_cells_formed(&cells, &BatchOutput::default()).unwrap();
    assert_eq!(formed.x.n_cols, 5);
    for (r, &cell) in cells.iter().enumerate() {
        let (m, row) = c.locate(cell).unwrap();
        assert_eq!(batch_row(&formed.x, &wanted, r), named_row(&t.matrices[m], &t.genes[m], row as usize, &wanted));
    }
    let holders = c.holders().unwrap();
    assert_eq!(holders[0], vec![true, false, true, false, true]);
    assert_eq!(holders[1], vec![true, false, false, true, true]);
    assert_eq!(holders[2], vec![false, false, false, false, true]);
    let e = c.read_cells_formed(&[878], &BatchOutput::default()).unwrap_err();
    assert!(e.to_string().contains("cell 878 is out of range"), "{e}");
}

#[test]
fn reads_into_buffers_given_back_are_the_reads_into_fresh_ones() {
    // As NumPy gives a batch's buffers back: each read then writes over the
    // last one's values, which must never show.
    let t = three();
    let wanted: Vec<String> = ["g45", "nope", "g5", "g60", "g30"].iter().map(|s| s.to_string()).collect();
    let c = Collection::open(&pairs(&t), &GeneChoice::List(wanted), None, &StoreOptions::default()).unwrap();
    let pool = crate::buffers::BufferPool::new(64);
    let lists: [&[u64]; 4] = [&[877, 0, 301, 5, 301, 460], &[3], &[460, 459, 2, 100, 700, 701, 1], &[]];
    // (a buffer left empty is not kept, so the first two rounds may make some)
    let mut made_in_second_round = 0;
    for round in 0..4 {
        for cells in lists {
            let fresh = c.read_cells_formed(cells, &BatchOutput::default()).unwrap();
            let pooled = c.read_cells_formed_in(cells, &BatchOutput::default(), &pool).unwrap();
            assert_eq!(pooled.x, fresh.x, "{cells:?}, round {round}");
            pool.give_matrix(pooled.x);
        }
        if round == 1 {
            made_in_second_round = pool.counts().1;
        }
    }
    let (held, made) = pool.counts();
    assert!(held > 0, "buffers are given back");
    assert_eq!(made, made_in_second_round, "the last round read into buffers given back");
}

#[test]
fn a_state_opens_datasets_lazily_and_names_one_that_changed() {
    let t = three();
    let c = Collection::open(&pairs(&t), &GeneChoice::Union, None, &StoreOptions::default()).unwrap();
    let state = c.state();
    let again = Collection::from_state(state.clone()).unwrap();
    assert!((0..3).all(|m| !again.is_open(m)));
    let formed = again.read_cells_formed(&[310], &BatchOutput::default()).unwrap();
    assert_eq!(formed.rows, 1);
    assert!(again.is_open(1) && !again.is_open(0) && !again.is_open(2));
    // Dataset d2 rewritten with other cells: its manifest changes.
    let dir = &t.dirs[2];
    std::fs::remove_dir_all(dir.path()).unwrap();
    std::fs::create_dir(dir.path()).unwrap();
    let (_, m) = dataset(10, &t.genes[2], 5, 99);
    let store = LocalStorage::new(dir.path().to_path_buf());
    write_named_matrix(&store, &m, WriteOptions { tile_size: 5, n_chunks: 2, zstd_level: 1 }, Some(&t.genes[2]))
        .unwrap();
    let lazy = Collection::from_state(state).unwrap();
    let e = lazy.read_cells_formed(&[500], &BatchOutput::default()).unwrap_err().to_string();
    assert!(e.contains("dataset \"d2\"") && e.contains("changed since the collection was made"), "{e}");
    assert!(lazy.read_cells_formed(&[0], &BatchOutput::default()).is_ok());
}

#[test]
fn bad_members_are_refused_by_name() {
    let t = three();
    let s = StoreOptions::default();
    let err = |members: &[(String, String)]| {
        crate::error_chain(&Collection::open(members, &GeneChoice::Union, None, &s).err().unwrap())
    };
    assert!(err(&[]).contains("the list is empty"));
    let p = pairs(&t);
    assert!(err(&[p[0].clone(), ("other".into(), p[0].1.clone())]).contains("is given twice"));
    assert!(err(&[p[0].clone(), (p[0].0.clone(), p[1].1.clone())]).contains("\"d0\" is given twice"));
    let missing = ("gone".to_string(), t.dirs[0].path().join("nothing").display().to_string());
    let e = err(&[p[0].clone(), missing]);
    assert!(e.contains("dataset \"gone\"") && e.contains("nothing"), "{e}");
    let e = Collection::open(&p, &GeneChoice::List(vec!["a".into(), "a".into()]), None, &s).err().unwrap();
    assert!(e.to_string().contains("given twice"));
}

#[test]
fn draws_by_dataset_honour_the_weights() {
    let t = three();
    let c = Collection::open(&pairs(&t), &GeneChoice::Union, None, &StoreOptions::default()).unwrap();
    let options = LoaderOptions::default();
    let drawn = c.draw_by_dataset(None, &[0.5, 0.5, 0.0], 1000, &options).unwrap();
    assert_eq!(drawn.len(), 1000);
    let count = |m: usize| drawn.iter().filter(|&&cell| c.locate(cell).unwrap().0 == m).count();
    assert_eq!((count(0), count(1), count(2)), (500, 500, 0));
    // 500 of d1's 157 cells: each of them 3 or 4 times.
    let mut per_cell = HashMap::new();
    for &cell in drawn.iter().filter(|&&cell| c.locate(cell).unwrap().0 == 1) {
        *per_cell.entry(cell).or_insert(0) += 1;
    }
    assert_eq!(per_cell.len(), 157);
    assert!(per_cell.values().all(|&k| k == 3 || k == 4));
    // Within a subset.
    let subset: Vec<u64> = (0..878).filter(|c| c % 2 == 0).collect();
    let drawn = c.draw_by_dataset(Some(&subset), &[1.0, 1.0, 2.0], 400, &options).unwrap();
    assert!(drawn.iter().all(|c| c % 2 == 0));
    let bad = |w: &[f64], n: u64| c.draw_by_dataset(None, w, n, &options).unwrap_err().to_string();
    assert!(bad(&[1.0, -1.0, 0.0], 10).contains("\"d1\" has weight -1"));
    assert!(bad(&[0.0, 0.0, 0.0], 10).contains("no dataset with a positive weight"));
    assert!(bad(&[1.0], 10).contains("1 values for 3 datasets"));
    assert!(bad(&[1.0, 0.0, 0.0], 301 * 100 + 1).contains("more than 100 draws"));
}

#[test]
fn a_collection_file_reads_back_with_relative_roots() {
    let t = three();
    let c = Collection::open(&pairs(&t), &GeneChoice::Intersection, None, &StoreOptions::default()).unwrap();
    let parent = t.dirs[0].path().parent().unwrap();
    let datasets = c
        .members()
        .map(|m| {
            let relative = Path::new(&m.root).strip_prefix(parent).unwrap().display().to_string();
            (m.name.clone(), relative, Some(m.manifest_sha256.clone()))
        })
        .collect();
    let file = CollectionFile {
        datasets,
        genes: GeneChoice::Intersection,
        gene_column: None,
        weights: Some(vec![("d2".into(), 2.0), ("d0".into(), 1.0)]),
    };
    let text = file.to_json();
    assert_eq!(CollectionFile::parse(&text).unwrap(), file);
    let dir = tempfile::tempdir_in(parent).unwrap();
    let path = dir.path().join("c.json");
    std::fs::write(&path, text.replace("\"root\": \"", "\"root\": \"../")).unwrap();
    let read = CollectionFile::read(&path).unwrap();
    assert_eq!(read.weights_in_order().unwrap(), Some(vec![1.0, 0.0, 2.0]));
    let again = read.open(&StoreOptions::default()).unwrap();
    assert_eq!(again.vocabulary(), c.vocabulary());
    assert_eq!(again.n_cells(), c.n_cells());
    let mut wrong = read.clone();
    wrong.datasets[1].2 = Some("00".into());
    assert!(wrong.open(&StoreOptions::default()).err().unwrap().to_string().contains("dataset \"d1\""));
    wrong.weights = Some(vec![("d9".into(), 1.0)]);
    assert!(wrong.weights_in_order().unwrap_err().to_string().contains("\"d9\" is not a dataset"));
    for bad in ["{}", "[]", "{\"deltacells_collection\": 2, \"datasets\": []}", "{\"deltacells_collection\": 1}"] {
        assert!(CollectionFile::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn datasets_already_in_the_vocabulary_are_read_without_a_map() {
    let genes = names(0..40);
    let (a, ma) = dataset(200, &genes, 64, 1);
    let (b, mb) = dataset(150, &genes, 50, 2);
    let pairs =
        vec![("a".to_string(), a.path().display().to_string()), ("b".to_string(), b.path().display().to_string())];
    let c = Collection::open(&pairs, &GeneChoice::Union, None, &StoreOptions::default()).unwrap();
    assert!(c.members().all(|m| m.in_vocabulary));
    assert!(c.open_member(1).unwrap().genes.is_none());
    let formed = c.read_cells_formed(&[5, 260, 199], &BatchOutput::default()).unwrap();
    for (r, (m, row)) in [(&ma, 5), (&mb, 60), (&ma, 199)].into_iter().enumerate() {
        assert_eq!(formed.x.row(r), m.row(row));
    }
    // With a third dataset in another order, the first two still need no map.
    let mut other = genes.clone();
    other.reverse();
    let (d, _) = dataset(30, &other, 16, 3);
    let mut more = pairs.clone();
    more.push(("d".into(), d.path().display().to_string()));
    let c = Collection::open(&more, &GeneChoice::Union, None, &StoreOptions::default()).unwrap();
    let flags: Vec<bool> = c.members().map(|m| m.in_vocabulary).collect();
    assert_eq!(flags, vec![true, true, false]);
}

#[test]
fn the_cache_budget_is_shared_among_the_datasets() {
    let t = three();
    let c = Collection::open(&pairs(&t), &GeneChoice::Union, None, &StoreOptions::default()).unwrap();
    let cells: Vec<u64> = (0..878).step_by(7).collect();
    let kept = |c: &Collection| -> Vec<u64> {
        (0..c.n_members()).map(|m| c.open_member(m).unwrap().dataset.cached_chunk_bytes()).collect()
    };
    c.read_cells_formed(&cells, &BatchOutput::default()).unwrap();
    assert!(kept(&c).iter().all(|&b| b > 0), "{:?}", kept(&c));
    // A budget of 0 drops what the open datasets keep, and keeps nothing more.
    c.set_cache_bytes(0);
    assert_eq!(kept(&c), vec![0, 0, 0]);
    c.read_cells_formed(&cells, &BatchOutput::default()).unwrap();
    assert_eq!(kept(&c), vec![0, 0, 0]);
    // A dataset opened later (from the state) takes its share too.
    let lazy = Collection::from_state(c.state()).unwrap();
    lazy.set_cache_bytes(3_000);
    lazy.read_cells_formed(&cells, &BatchOutput::default()).unwrap();
    assert!(kept(&lazy).iter().all(|&b| b <= 1_000), "{:?}", kept(&lazy));
}

#[test]
fn its_datasets_remember_their_checked_tiles_in_its_cache_folder() {
    let t = three();
    let records = |dir: &std::path::Path| std::fs::read_dir(dir.join("checked-tiles")).map_or(0, |d| d.count());
    let cache = tempfile::tempdir().unwrap();
    let store = StoreOptions::default();
    let c = Collection::open_in(&pairs(&t), &GeneChoice::Union, None, &store, Some(cache.path().into())).unwrap();
    c.read_cells_formed(&[5, 400], &BatchOutput::default()).unwrap();
    assert_eq!(records(cache.path()), 2, "one record for each dataset read");
    // made again from its state (a worker), nothing opened until it is read
    let again = tempfile::tempdir().unwrap();
    let c = Collection::from_state_in(c.state(), Some(again.path().into())).unwrap();
    assert_eq!(records(again.path()), 0);
    c.read_cells_formed(&[700], &BatchOutput::default()).unwrap();
    assert_eq!(records(again.path()), 1);
}
