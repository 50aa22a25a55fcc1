//! The reader's own tests: ranges and lists against the matrix written.

use std::ops::Range;

use super::*;
use crate::format::{self, CsrMatrix};

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
    /// Ranges read one after another (as a pass over the cells reads
    /// them, and in any order) give the rows of the matrix, whichever
    /// tile and chunks the last range left behind.
    #[test]
    fn ranges_read_in_turn_give_the_matrix_rows(
        cuts in proptest::collection::vec((0u64..700, 1u64..300), 1..25),
        step in 1u64..400,
    ) {
        let (_dir, ds, m) = written(700, 97);
        let mut ranges: Vec<Range<u64>> = (0..700).step_by(step as usize).map(|a| a..(a + step).min(700)).collect();
        ranges.extend(cuts.iter().map(|&(a, n)| a..(a + n).min(700)));
        for r in ranges {
            let got = ds.read(Selection::Range(r.clone())).unwrap();
            let mut want = CsrMatrix::empty(m.n_cols);
            for row in r.clone() {
                want.push_row_from(&m, row as usize);
            }
            proptest::prop_assert_eq!(got, want, "cells {:?}", r);
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn listed_cells_give_the_matrix_rows_in_the_order_listed(
        cells in proptest::collection::vec(0u64..700, 0..300),
    ) {
        let (_dir, ds, m) = written(700, 97);
        let got = ds.read(Selection::List(&cells)).unwrap();
        let mut want = CsrMatrix::empty(m.n_cols);
        for &row in &cells {
            want.push_row_from(&m, row as usize);
        }
        proptest::prop_assert_eq!(got, want);
    }
}

/// A dataset of `n` cells (a few counts each) in tiles of `tile_size`
/// cells and 4 chunks, in a temporary folder.
fn written(n: usize, tile_size: u64) -> (tempfile::TempDir, Dataset, CsrMatrix) {
    let mut m = CsrMatrix::empty(300);
    for cell in 0..n as u32 {
        let genes: std::collections::BTreeSet<u32> = (0..cell % 13).map(|k| (cell * 31 + k * 97) % 300).collect();
        for g in genes {
            m.indices.push(g);
            m.data.push(1 + (cell + g) % 40);
        }
        m.indptr.push(m.indices.len() as u64);
    }
    let dir = tempfile::tempdir().unwrap();
    let store = crate::storage::LocalStorage::new(dir.path().to_path_buf());
    let options = crate::writer::WriteOptions { tile_size, n_chunks: 4, zstd_level: 1 };
    crate::writer::write_matrix(&store, &m, options).unwrap();
    let ds = Dataset::open(dir.path().to_str().unwrap()).unwrap();
    (dir, ds, m)
}

#[test]
fn a_corrupt_tile_is_caught_by_the_range_that_first_reads_it() {
    let (dir, ds, _) = written(300, 97);
    ds.read(Selection::Range(0..10)).unwrap();
    let path = dir.path().join(format::tile_key(1));
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&path, bytes).unwrap();
    // Tile 0 is recent and unchanged; tile 1 is fetched and checked.
    ds.read(Selection::Range(10..20)).unwrap();
    let e = ds.read(Selection::Range(100..110)).unwrap_err().to_string();
    assert!(e.contains("tile 1") || e.contains("00000001"), "{e}");
}

/// A local folder that says it is not local, so that gathers read it as
/// they read a bucket: tiles' indexes from their first bytes, chunks in
/// ranges, no tile read whole.
struct AsRemote(crate::storage::LocalStorage);

impl crate::storage::Storage for AsRemote {
    fn location(&self, key: &str) -> String {
        self.0.location(key)
    }
    fn size(&self, key: &str) -> Result<Option<u64>, crate::storage::StorageError> {
        self.0.size(key)
    }
    fn get(&self, key: &str) -> Result<Option<bytes::Bytes>, crate::storage::StorageError> {
        self.0.get(key)
    }
    fn get_ranges(
        &self,
        key: &str,
        ranges: &[Range<u64>],
    ) -> Result<Option<Vec<bytes::Bytes>>, crate::storage::StorageError> {
        self.0.get_ranges(key, ranges)
    }
    fn put(&self, key: &str, data: bytes::Bytes) -> Result<(), crate::storage::StorageError> {
        self.0.put(key, data)
    }
    fn delete(&self, key: &str) -> Result<(), crate::storage::StorageError> {
        self.0.delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, crate::storage::StorageError> {
        self.0.list(prefix)
    }
    fn stats(&self) -> &crate::storage::IoStats {
        self.0.stats()
    }
}

/// [`written`]'s dataset opened through [`AsRemote`], with `cache_bytes`.
fn as_remote(dir: &std::path::Path, cache_bytes: u64) -> Dataset {
    let store = Arc::new(AsRemote(crate::storage::LocalStorage::new(dir.to_path_buf())));
    Dataset::from_storage_with(store, &ReadOptions { cache_bytes, ..ReadOptions::default() }).unwrap()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
    /// Gathers read in ranges (no tile whole), with and without the cache,
    /// give the rows of the matrix in the order listed, repeats included.
    #[test]
    fn cells_gathered_in_ranges_give_the_matrix_rows(
        batches in proptest::collection::vec(proptest::collection::vec(0u64..700, 0..200), 1..4),
        cache_bytes in proptest::prop_oneof![proptest::strategy::Just(0u64), 1u64..20_000, proptest::strategy::Just(1u64 << 30)],
    ) {
        let (dir, _, m) = written(700, 97);
        let ds = as_remote(dir.path(), cache_bytes);
        for cells in &batches {
            let got = ds.read(Selection::List(cells)).unwrap();
            let mut want = CsrMatrix::empty(m.n_cols);
            for &row in cells {
                want.push_row_from(&m, row as usize);
            }
            proptest::prop_assert_eq!(got, want);
        }
    }
}

#[test]
fn cells_drawn_again_are_served_from_the_cache() {
    let (dir, _, m) = written(700, 97);
    let ds = as_remote(dir.path(), 1 << 30);
    let cells = [5, 650, 97, 5, 300];
    let first = ds.read(Selection::List(&cells)).unwrap();
    let before = ds.storage().stats().snapshot();
    let again = ds.read(Selection::List(&[300, 5, 650, 97])).unwrap();
    assert_eq!(ds.storage().stats().snapshot(), before, "nothing read the second time");
    assert_eq!(first.row(0), again.row(1));
    assert_eq!(again.row(0), m.row(300));
    assert!(ds.cached_chunk_bytes() > 0);
    // With no cache, every gather reads its chunks again.
    let uncached = as_remote(dir.path(), 0);
    uncached.read(Selection::List(&cells)).unwrap();
    let before = uncached.storage().stats().snapshot();
    uncached.read(Selection::List(&cells)).unwrap();
    assert!(uncached.storage().stats().snapshot().0 > before.0);
    assert_eq!(uncached.cached_chunk_bytes(), 0);
}

#[test]
fn a_damaged_chunk_read_in_ranges_is_refused_naming_the_tile_and_chunk() {
    let (dir, _, _) = written(300, 97);
    let path = dir.path().join(format::tile_key(1));
    let mut bytes = std::fs::read(&path).unwrap();
    let crate::format::tile::IndexParse::Ready(index) =
        crate::format::tile::TileIndex::parse_prefix(&bytes, bytes.len() as u64, None).unwrap()
    else {
        panic!("the writer's layout has its index first");
    };
    let span = index.chunk_span(2).unwrap();
    let rows = index.chunk_rows(2);
    bytes[span.start as usize..span.end as usize].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    // Read in ranges: the chunk's frames are refused, naming tile and chunk.
    let ds = as_remote(dir.path(), 1 << 20);
    // (cells of tile 1's other chunks still read)
    ds.read(Selection::List(&[97 + index.chunk_rows(0).start])).unwrap();
    let e = ds.read(Selection::List(&[3, 97 + rows.start])).unwrap_err();
    let text = crate::error_chain(&e);
    assert!(text.contains("tile_000001") && text.contains("tile 1") && text.contains("chunk 2"), "{text}");
    // A local dataset checks the tile's CRC the first time it reads it.
    let local = Dataset::open(dir.path().to_str().unwrap()).unwrap();
    let e = local.read(Selection::List(&[97 + index.chunk_rows(0).start])).unwrap_err();
    let text = crate::error_chain(&e);
    assert!(text.contains("tile 1") && text.contains("crc32"), "{text}");
}

/// Only a writer's record makes a manifest a later version: a lineage that
/// lists the opened manifest, or (an older writer's version) another append
/// or compaction. A new conversion with the same sizes is another dataset.
#[test]
fn only_a_writers_record_makes_a_later_version() {
    use follow::is_later_version;
    let (_dir, ds, _) = written(700, 97);
    let opened = ds.manifest().clone();
    let sha = ds.manifest_sha256().to_string();
    let same_again = (opened.clone(), "another conversion".to_string());
    assert!(is_later_version((&opened, &sha), (&opened, &sha)), "the version opened is its own");
    assert!(!is_later_version((&opened, &sha), (&same_again.0, &same_again.1)), "a new conversion is not later");

    let mut compacted = opened.clone();
    format::manifest::extend_lineage(&mut compacted.metadata, &sha);
    assert!(is_later_version((&opened, &sha), (&compacted, "c")), "a version that lists the opened one");
    let mut elsewhere = opened.clone();
    format::manifest::extend_lineage(&mut elsewhere.metadata, "some other manifest");
    assert!(!is_later_version((&opened, &sha), (&elsewhere, "e")), "a lineage without the opened one");

    // An older writer's version, without a lineage: a new append record.
    let mut appended = opened.clone();
    appended.metadata.insert("appends".into(), serde_json::json!([{ "cells": 0 }]));
    assert!(is_later_version((&opened, &sha), (&appended, "a")));
    let mut other_genes = appended.clone();
    other_genes.n_genes += 1;
    assert!(!is_later_version((&opened, &sha), (&other_genes, "g")), "another layout");
}

/// A wait for a writer longer than the clock counts is no wait limit, not
/// a panic; and a tile past the manifest's list is a mismatch, not a panic.
#[test]
fn an_endless_writer_wait_and_an_unlisted_tile_do_not_panic() {
    let (dir, _, m) = written(200, 97);
    let options = ReadOptions { writer_wait: std::time::Duration::MAX, ..ReadOptions::default() };
    let store = Arc::new(crate::storage::LocalStorage::new(dir.path().to_path_buf()));
    let ds = Dataset::from_storage_with(store, &options).unwrap();
    assert_eq!(ds.read(Selection::Range(0..50)).unwrap().indptr[..], m.indptr[..51]);
    assert_eq!(ds.current().expectation(99).n_cells, 0);
    // The dataset deleted: the error comes at once (no writer's record),
    // not after the endless wait.
    std::fs::remove_file(dir.path().join(format::MANIFEST_KEY)).unwrap();
    std::fs::remove_file(dir.path().join(format::tile_key(1))).unwrap();
    let fresh = Dataset::from_storage_with(
        Arc::new(crate::storage::LocalStorage::new(dir.path().to_path_buf())),
        &ReadOptions { cache_bytes: 0, ..options },
    );
    assert!(fresh.is_err(), "no manifest: nothing to open");
    let e = ds.read(Selection::Range(100..200)).unwrap_err().to_string();
    assert!(e.contains("no dataset") || e.contains("incomplete") || e.contains("manifest"), "{e}");
}

/// A tile whose CRC one open dataset checked (reading it whole) is not read
/// whole again by a later one (another process) while its file is the same
/// version; a file changed since is checked again, and its damage found.
#[test]
fn a_tiles_checked_crc_is_remembered_for_that_version_of_its_file() {
    let (dir, _, m) = written(300, 97);
    let cache = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let open =
        |options: &ReadOptions| Dataset::from_storage_with(crate::storage::open(root).unwrap(), options).unwrap();
    let remembered = ReadOptions { cache_dir: Some(cache.path().to_path_buf()), ..ReadOptions::default() };
    let bytes_read = |ds: &Dataset, cell: u64| {
        assert_eq!(ds.read(Selection::List(&[cell])).unwrap().row(0), m.row(cell as usize));
        ds.storage().stats().snapshot().1
    };
    let tile = dir.path().join(format::tile_key(1));
    let tile_bytes = std::fs::metadata(&tile).unwrap().len();
    let cell = 97 + 5;
    assert!(bytes_read(&open(&remembered), cell) >= tile_bytes, "the first read is of the whole tile");
    assert!(bytes_read(&open(&remembered), cell) < tile_bytes, "the next open reads the index and a chunk only");
    // Not remembered: every open dataset reads the tile whole once, and
    // nothing is written to its cache folder.
    let elsewhere = tempfile::tempdir().unwrap();
    let forget =
        ReadOptions { cache_dir: Some(elsewhere.path().to_path_buf()), remember_checks: false, ..remembered.clone() };
    assert!(bytes_read(&open(&forget), cell) >= tile_bytes);
    assert!(bytes_read(&open(&forget), cell) >= tile_bytes);
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    // Damage another chunk of the tile in place (the same file, later
    // times): the record no longer holds, the CRC is checked and fails.
    let bytes = std::fs::read(&tile).unwrap();
    let crate::format::tile::IndexParse::Ready(index) =
        crate::format::tile::TileIndex::parse_prefix(&bytes, bytes.len() as u64, None).unwrap()
    else {
        panic!("the writer's layout has its index first");
    };
    assert!(!index.chunk_rows(2).contains(&5));
    let span = index.chunk_span(2).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20)); // past the file system's clock tick
    {
        use std::io::{Seek, Write};
        let mut file = std::fs::OpenOptions::new().write(true).open(&tile).unwrap();
        file.seek(std::io::SeekFrom::Start(span.end - 1)).unwrap();
        file.write_all(&[bytes[span.end as usize - 1] ^ 0x40]).unwrap();
    }
    let e = open(&remembered).read(Selection::List(&[cell])).unwrap_err();
    let text = crate::error_chain(&e);
    assert!(text.contains("tile 1") && text.contains("crc32"), "{text}");
}

/// A tile read whole for the loader, every check made, is remembered as a
/// gather's first read of it is.
#[test]
fn a_tile_the_loader_checked_is_not_read_whole_by_a_later_gather() {
    let (dir, _, m) = written(300, 97);
    let cache = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let options = ReadOptions { cache_dir: Some(cache.path().to_path_buf()), ..ReadOptions::default() };
    let open = || Dataset::from_storage_with(crate::storage::open(root).unwrap(), &options).unwrap();
    let tile_bytes = std::fs::metadata(dir.path().join(format::tile_key(2))).unwrap().len();
    open().fetch_checked_tile(2).unwrap();
    let later = open();
    assert_eq!(later.read(Selection::List(&[200])).unwrap().row(0), m.row(200));
    assert!(later.storage().stats().snapshot().1 < tile_bytes);
}
