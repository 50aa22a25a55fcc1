//! Readers during writers: datasets open in this process (gathers, ranges,
//! whole tiles, loader epochs, on reader threads) while `append`, `append
//! --shuffle` and `compact` processes change the dataset, some of them
//! killed at random moments or stopped in their commit. Every read must
//! give the rows of the version its dataset opened, never an error; a real
//! corruption is still refused, and a dataset replaced by another is named
//! as such.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deltacells::loader::{Batches, EpochPlan, LoaderBuffers, LoaderOptions};
use deltacells::{CsrMatrix, Dataset, DatasetError, ReadOptions};
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::remote::{example, s3_storage, S3_ENV};
use crate::servers::Server;
use crate::util::TestDir;
use deltacells::Selection;

/// 1,000 cells in tiles of 300: the last tile (100 cells) is filled by the
/// next append, as format.md requires. Shuffled, so that appends may be.
const LAYOUT: [&str; 8] = ["--tile-size", "300", "--obs-tiles-per-file", "2", "--level", "1", "--shuffle", "7"];

/// An open dataset and every row of the version it opened.
struct Opened {
    dataset: Arc<Dataset>,
    rows: CsrMatrix,
}

/// Rows `cells` of `m`, in order.
fn rows_of(m: &CsrMatrix, cells: &[u64]) -> CsrMatrix {
    let mut out = CsrMatrix { n_cols: m.n_cols, indptr: vec![0], indices: Vec::new(), data: Vec::new() };
    for &c in cells {
        let (a, b) = (m.indptr[c as usize] as usize, m.indptr[c as usize + 1] as usize);
        out.indices.extend_from_slice(&m.indices[a..b]);
        out.data.extend_from_slice(&m.data[a..b]);
        out.indptr.push(out.indices.len() as u64);
    }
    out
}

/// The datasets opened so far and what the readers checked.
#[derive(Default)]
struct Shared {
    opened: Mutex<Vec<Arc<Opened>>>,
    done: AtomicBool,
    reads: AtomicU64,
    failures: Mutex<Vec<String>>,
}

/// Opens the dataset at `root` (no writer runs now) and reads every row of
/// it once, for the readers to compare with; every other one without a
/// cache of chunks, so that its gathers read the store every time.
fn open(root: &str, endpoint: Option<&str>, cached: bool) -> Arc<Opened> {
    let store: Arc<dyn deltacells::storage::Storage> = match endpoint {
        Some(endpoint) => Arc::new(s3_storage(endpoint, root.trim_start_matches("s3://test/"))),
        None => deltacells::storage::open(root).unwrap(),
    };
    let cache_bytes = if cached { ReadOptions::default().cache_bytes } else { 0 };
    let read = ReadOptions { writer_wait: Duration::from_secs(90), cache_bytes, ..ReadOptions::default() };
    let dataset = Arc::new(Dataset::from_storage_with(store, &read).unwrap());
    let rows = dataset.read(Selection::Range(0..dataset.n_cells())).unwrap();
    Arc::new(Opened { dataset, rows })
}

/// One reader thread: random reads of random open datasets, each compared
/// with the rows of the version it opened, until the writers are done.
fn reader(shared: &Shared, seed: u64) {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let mut round = 0u64;
    while !shared.done.load(Ordering::Acquire) {
        round += 1;
        let o = {
            let all = shared.opened.lock().unwrap();
            all[rng.random_range(0..all.len())].clone()
        };
        let ds = &o.dataset;
        let n = ds.n_cells();
        let what = round % 8;
        let checked = match what {
            // a batch of random cells, the last ones among them
            0..=3 => {
                let mut cells: Vec<u64> = (0..48).map(|_| rng.random_range(0..n)).collect();
                cells.extend((n.saturating_sub(16)..n).rev());
                ds.read(Selection::List(&cells)).map(|got| (got, rows_of(&o.rows, &cells), format!("cells {cells:?}")))
            }
            // a range ending in the last tile
            4 | 5 => {
                let start = rng.random_range(0..n);
                let end = if what == 4 { n } else { rng.random_range(start..=n) };
                let cells: Vec<u64> = (start..end).collect();
                ds.read(Selection::Range(start..end))
                    .map(|got| (got, rows_of(&o.rows, &cells), format!("range {start}..{end}")))
            }
            // a whole tile, the last one half the time
            6 => {
                let tile = if rng.random_bool(0.5) { ds.n_tiles() - 1 } else { rng.random_range(0..ds.n_tiles()) };
                let cells: Vec<u64> = ds.tile_cells(tile).collect();
                ds.read(Selection::Tile(tile)).map(|got| (got, rows_of(&o.rows, &cells), format!("tile {tile}")))
            }
            // a shuffled loader epoch, every batch compared
            _ => {
                let options = LoaderOptions { batch_size: 128, shuffle: true, seed: round, ..Default::default() };
                let plan = EpochPlan::new(ds, None, &options).unwrap();
                let batches = Batches::start(ds.clone(), plan, None, &LoaderBuffers::new(&options)).unwrap();
                let mut result = Ok((CsrMatrix::default(), CsrMatrix::default(), String::new()));
                for batch in batches {
                    match batch {
                        Ok(b) if b.x != rows_of(&o.rows, &b.cells) => {
                            result =
                                Ok((b.x.clone(), rows_of(&o.rows, &b.cells), format!("loader batch {:?}", b.cells)));
                            break;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            shared.failures.lock().unwrap().push(format!("loader: {}", deltacells::error_chain(&e)));
                            break;
                        }
                    }
                }
                result
            }
        };
        match checked {
            Ok((got, want, what)) if got != want => {
                shared.failures.lock().unwrap().push(format!("{}: {what}: other rows", ds.storage().location("")))
            }
            Ok(_) => {
                shared.reads.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => shared.failures.lock().unwrap().push(deltacells::error_chain(&e)),
        }
        if shared.failures.lock().unwrap().len() > 20 {
            return;
        }
    }
}

/// A writer run, the way the loop below starts it: to its end, killed at a
/// random moment, or stopped by the fault-injection hook in its commit.
enum Run {
    Whole,
    KilledAfter(Duration),
    StoppedInCommit(i64),
}

fn write(t: &TestDir, args: &[&str], env: &[(&str, &str)], run: Run) {
    match run {
        Run::Whole => {
            let done = t.run_env(args, env);
            assert_eq!(done.code(), 0, "{}\n{}", args.join(" "), done.stderr());
        }
        Run::KilledAfter(after) => {
            let mut child = t.command(args).envs(env.iter().copied()).spawn().unwrap();
            std::thread::sleep(after);
            let _ = child.kill();
            let _ = child.wait();
        }
        Run::StoppedInCommit(after) => {
            let at = after.to_string();
            let env: Vec<(&str, &str)> =
                env.iter().copied().chain([("DELTACELLS_TEST_ABORT_COMMIT_AFTER", at.as_str())]).collect();
            // (A writer whose commit has fewer steps than `after`, or a
            // compaction with nothing to change, ends normally: the loop
            // then goes on as after any other writer.)
            let _ = t.run_env(args, &env);
        }
    }
}

/// Runs `rounds` writers on `root` (appends, shuffled appends, compactions;
/// some killed or stopped in their commit, then completed) while reader
/// threads read every dataset opened so far, one more opened after each
/// writer. Returns the reads checked.
fn readers_during_writers(t: &TestDir, root: &str, endpoint: Option<&str>, env: &[(&str, &str)], rounds: usize) -> u64 {
    let shared = Arc::new(Shared::default());
    shared.opened.lock().unwrap().push(open(root, endpoint, false));
    let readers: Vec<_> = (0..2)
        .map(|k| {
            let shared = shared.clone();
            std::thread::spawn(move || reader(&shared, k))
        })
        .collect();
    let input = example();
    // (a killed shuffled append cannot remove its spill: it is left here,
    // removed with the test's folder, not in the system's temporary folder)
    let spill = t.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let spill = spill.to_str().unwrap();
    let mut at: Vec<&str> = Vec::new();
    if let Some(e) = endpoint {
        at.extend(["--endpoint", e]);
    }
    let mut rng = Pcg64Mcg::seed_from_u64(44);
    let injected = cfg!(feature = "fault-injection");
    let started = Instant::now();
    for round in 0..rounds {
        let seed = round.to_string();
        let level = if round % 2 == 0 { "3" } else { "1" };
        let sharded = round % 4 == 3;
        let writer: Vec<&str> = match round % 4 {
            0 => [&["append", "-q"][..], &at, &[root, &input]].concat(),
            1 => [&["append", "-q", "--shuffle", &seed, "--spill-dir", spill][..], &at, &[root, &input]].concat(),
            2 => [&["compact", "-q", "--level", level][..], &at, &[root]].concat(),
            // a sharded append: planned and staged by two shards, then the
            // finalize (the writer run, killed or stopped as the others)
            _ => {
                let plan = [&["plan", "-q"][..], &at, &["--append", root, &input]].concat();
                let planned = t.run_env(&plan, env);
                assert_eq!(planned.code(), 0, "plan --append: {}", planned.stderr());
                for k in ["0/2", "1/2"] {
                    let shard = [&["shard", "-q"][..], &at, &[root, "--shard", k]].concat();
                    let staged = t.run_env(&shard, env);
                    assert_eq!(staged.code(), 0, "shard {k}: {}", staged.stderr());
                }
                [&["finalize", "-q"][..], &at, &[root]].concat()
            }
        };
        let run = match round % 4 {
            1 => Run::KilledAfter(Duration::from_millis(rng.random_range(50..1500))),
            3 if injected => Run::StoppedInCommit(rng.random_range(-2..4)),
            _ => Run::Whole,
        };
        let interrupted = !matches!(run, Run::Whole);
        write(t, &writer, env, run);
        if interrupted && endpoint.is_some() {
            // The stopped writer's lease, left in the bucket, expires first.
            std::thread::sleep(Duration::from_millis(2500));
        }
        if interrupted {
            // What the writer left: an append's commit completed by
            // `append --resume` (a compaction's by the next compact, a
            // staging discarded), so that the dataset is whole again.
            // (a finalize stopped before its commit is run again)
            let finalized = sharded && t.run_env(&[&["finalize", "-q"][..], &at, &[root]].concat(), env).code() == 0;
            let resume = [&["append", "-q", "--resume"][..], &at, &[root]].concat();
            let resumed = if finalized { t.run_env(&["--version"], env) } else { t.run_env(&resume, env) };
            if resumed.code() != 0 {
                let compact = [&["compact", "-q", "--level", level][..], &at, &[root]].concat();
                write(t, &compact, env, Run::Whole);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        shared.opened.lock().unwrap().push(open(root, endpoint, round % 2 == 1));
    }
    shared.done.store(true, Ordering::Release);
    for r in readers {
        r.join().unwrap();
    }
    let failures = shared.failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failed reads, the first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    // Every version opened holds the rows of the versions before it first.
    let opened = shared.opened.lock().unwrap();
    let last = opened.last().unwrap();
    for o in opened.iter() {
        let cells: Vec<u64> = (0..o.dataset.n_cells()).collect();
        assert_eq!(o.rows, rows_of(&last.rows, &cells));
    }
    // The readers moved to later versions, not only read the ones opened:
    // the first dataset opened, read all along, has moved on.
    let followed: Vec<u64> = opened.iter().map(|o| o.dataset.versions_followed()).collect();
    assert!(followed[0] > 0, "no reader moved to a later version: {followed:?}");
    let reads = shared.reads.load(Ordering::Relaxed);
    eprintln!(
        "{rounds} writers, {} versions opened, {reads} reads checked, versions followed {followed:?}, in {:.0?}",
        opened.len(),
        started.elapsed()
    );
    assert!(reads > 20 * rounds as u64, "only {reads} reads were checked");
    reads
}

fn convert(t: &TestDir, out: &str, extra: &[&str], env: &[(&str, &str)]) {
    let input = example();
    let args = [&["convert", "-q"][..], &LAYOUT, extra, &[&input, out]].concat();
    let run = t.run_env(&args, env);
    assert_eq!(run.code(), 0, "{}", run.stderr());
}

#[test]
fn readers_keep_their_version_while_a_local_dataset_is_appended_to_and_compacted() {
    let t = TestDir::new();
    convert(&t, "ds", &[], &[]);
    let root = t.join("ds").display().to_string();
    readers_during_writers(&t, &root, None, &[], 12);
    t.run(&["verify", "-q", &root]).expect_code(0);
}

#[test]
fn readers_keep_their_version_while_a_dataset_in_s3_is_appended_to_and_compacted() {
    let Some(s3) = Server::start("s3", &[]) else { return };
    let t = TestDir::new();
    let endpoint = s3.url();
    let env = [S3_ENV[0], S3_ENV[1], S3_ENV[2], ("DELTACELLS_TEST_LEASE_SECONDS", "2")];
    convert(&t, "s3://test/ds", &["--endpoint", &endpoint], &env);
    readers_during_writers(&t, "s3://test/ds", Some(&endpoint), &env, 6);
    t.run_env(&["verify", "-q", "--endpoint", &endpoint, "s3://test/ds"], &S3_ENV).expect_code(0);
}

/// Flips one byte of the middle of `path`, keeping its size.
fn flip(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_damaged_tile_is_still_refused_and_a_replaced_dataset_is_named() {
    let t = TestDir::new();
    convert(&t, "ds", &[], &[]);
    let root = t.join("ds").display().to_string();
    let read = ReadOptions { writer_wait: Duration::from_secs(5), ..ReadOptions::default() };
    let open = || Dataset::from_storage_with(deltacells::storage::open(&root).unwrap(), &read).unwrap();
    let (whole, gathered, loaded) = (open(), Arc::new(open()), open());
    flip(&t.join("ds/tiles/tile_000001.dct"));
    let named = |e: &DatasetError| {
        let text = deltacells::error_chain(e);
        assert!(text.contains("tile_000001.dct"), "{text}");
        assert!(!matches!(e, DatasetError::Replaced { .. }), "{text}");
    };
    named(&whole.read(Selection::Tile(1)).unwrap_err());
    named(&loaded.read(Selection::Range(300..600)).unwrap_err());
    named(&gathered.read(Selection::List(&[0, 350, 999])).unwrap_err());
    let options = LoaderOptions { batch_size: 64, ..Default::default() };
    let plan = EpochPlan::new(&gathered, None, &options).unwrap();
    let failed = Batches::start(gathered.clone(), plan, None, &LoaderBuffers::new(&options))
        .unwrap()
        .find_map(Result::err)
        .expect("the loader refuses the damaged tile");
    assert!(deltacells::error_chain(&failed).contains("tile_000001.dct"), "{}", deltacells::error_chain(&failed));
    // Another dataset converted in its place (other tiles) is not a later
    // version of the one open: reads refuse, saying so.
    let fresh = open();
    fresh.read(Selection::Range(0..10)).unwrap();
    let input = example();
    t.run(&["convert", "-q", "--overwrite", "--tile-size", "250", &input, "ds"]).expect_code(0);
    let e = fresh.read(Selection::List(&[5, 700])).unwrap_err();
    assert!(matches!(e, DatasetError::Replaced { .. }), "{}", deltacells::error_chain(&e));
}
