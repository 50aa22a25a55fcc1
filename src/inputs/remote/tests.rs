//! The ranged reads of inputs at URLs, against an in-memory store.

use std::sync::Arc;

use bytes::Bytes;

use super::ranged::ReadOf;
use super::{prefetch_whole, RangedFile, BLOCK};
use crate::storage::{ObjectStorage, Storage};

/// An object of `len` bytes (byte i is i * 7 mod 251) in an in-memory store.
fn object(len: usize) -> (Arc<ObjectStorage>, Vec<u8>) {
    let memory: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let store = Arc::new(ObjectStorage::new(memory, "inputs", "mem://inputs"));
    let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    store.put("in.h5ad", Bytes::from(bytes.clone())).unwrap();
    (store, bytes)
}

fn open(store: &Arc<ObjectStorage>) -> Arc<RangedFile> {
    let version = store.version("in.h5ad").unwrap().unwrap();
    RangedFile::over(store.clone(), "in.h5ad".into(), version, Default::default()).unwrap()
}

#[test]
fn reads_at_any_offset_give_the_object_bytes() {
    let len = 20 * BLOCK as usize + 12_345;
    let (store, bytes) = object(len);
    let file = open(&store);
    assert_eq!(file.size(), len as u64);
    for (addr, n) in
        [(0usize, 10usize), (BLOCK as usize - 3, 7), (5 * BLOCK as usize, 3 * BLOCK as usize + 1), (len - 5, 5)]
    {
        let mut buf = vec![0u8; n];
        file.read(addr as u64, &mut buf, ReadOf::Structure).unwrap();
        assert_eq!(buf, bytes[addr..addr + n], "{n} bytes at {addr}");
    }
    // past the end reads as zeros, as HDF5's own drivers give it
    let mut buf = vec![9u8; 10];
    file.read(len as u64 - 5, &mut buf, ReadOf::Structure).unwrap();
    assert_eq!(buf[..5], bytes[len - 5..]);
    assert_eq!(buf[5..], [0u8; 5]);
    file.read(u64::MAX - 3, &mut buf, ReadOf::Structure).unwrap();
    assert_eq!(buf, [0u8; 10]);
}

#[test]
fn a_block_once_fetched_is_not_fetched_again() {
    let (store, bytes) = object(16 * BLOCK as usize);
    let file = open(&store);
    let mut buf = vec![0u8; 1000];
    file.read(8 * BLOCK, &mut buf, ReadOf::Structure).unwrap();
    let (requests, _) = store.stats().snapshot();
    for _ in 0..5 {
        file.read(8 * BLOCK + 10, &mut buf, ReadOf::Structure).unwrap();
    }
    assert_eq!(store.stats().snapshot().0, requests, "cached blocks served the reads");
    assert_eq!(buf, bytes[8 * BLOCK as usize + 10..8 * BLOCK as usize + 1010]);
}

#[test]
fn a_read_of_structure_is_kept_when_its_blocks_are_let_go() {
    let (store, bytes) = object(16 * BLOCK as usize);
    let file = open(&store);
    let mut header = [0u8; 300];
    file.read(5 * BLOCK + 17, &mut header, ReadOf::Structure).unwrap();
    {
        let mut cache = file.cache.lock().unwrap();
        let blocks: Vec<u64> = cache.blocks.keys().copied().collect();
        for b in blocks {
            cache.remove_block(b);
        }
    }
    let before = store.stats().snapshot();
    let mut again = [0u8; 300];
    file.read(5 * BLOCK + 17, &mut again, ReadOf::Structure).unwrap();
    assert_eq!(again, header);
    assert_eq!(&again[..], &bytes[(5 * BLOCK + 17) as usize..(5 * BLOCK + 317) as usize]);
    assert_eq!(store.stats().snapshot(), before, "the same read of structure fetched nothing");
    // Another read of the same bytes (not structure) needs the block.
    file.read(5 * BLOCK + 17, &mut again, ReadOf::Data).unwrap();
    assert!(store.stats().snapshot().0 > before.0);
}

#[test]
fn read_ahead_follows_data_streams_within_the_arrays_declared() {
    let (store, _) = object(64 * BLOCK as usize);
    let file = open(&store);
    let fetched = || {
        // (Read-ahead runs on threads of its own.)
        std::thread::sleep(std::time::Duration::from_millis(150));
        store.stats().snapshot().1
    };
    let read = |blocks: std::ops::Range<u64>, of: ReadOf| {
        for b in blocks {
            file.read(b * BLOCK + 10, &mut [0u8; 100], of).unwrap();
        }
    };
    // Opening fetched the first and last blocks.
    let opened = fetched();
    // One read fetches its block alone; metadata read on fetches no more.
    read(20..21, ReadOf::Data);
    assert_eq!(fetched(), opened + BLOCK);
    read(21..27, ReadOf::Structure);
    assert_eq!(fetched(), opened + 7 * BLOCK);
    // A data stream within an array declared (blocks 30..=40) reads
    // ahead up to its end, not past it.
    file.set_extents(std::slice::from_ref(&(30 * BLOCK..41 * BLOCK - 1)));
    read(30..33, ReadOf::Data);
    let within = fetched();
    assert!(within > opened + 10 * BLOCK, "the stream read ahead");
    read(33..41, ReadOf::Data);
    assert_eq!(fetched(), opened + 18 * BLOCK, "nothing past the array");
    // Outside the arrays declared, data read on fetches what it reads.
    read(44..48, ReadOf::Data);
    assert_eq!(fetched(), opened + 22 * BLOCK);
}

#[test]
fn a_sequential_stream_reads_ahead_and_a_whole_read_is_prefetched() {
    let len = 64 * BLOCK as usize;
    let (store, bytes) = object(len);
    let file = open(&store);
    // Reading on from where the last read ended fetches ahead: the bytes
    // fetched grow past what was read.
    let mut buf = vec![0u8; BLOCK as usize];
    for b in 4..12 {
        file.read(b * BLOCK, &mut buf, ReadOf::Data).unwrap();
        assert_eq!(buf, bytes[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize]);
    }
    let read_ahead = (0..30).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        store.stats().snapshot().1 > 16 * BLOCK
    });
    assert!(read_ahead, "{} bytes fetched for 16 blocks read", store.stats().snapshot().1);
    // The prefetcher fetches the rest of a file that is read whole.
    prefetch_whole(&file, &[0]);
    let whole = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        store.stats().snapshot().1 >= len as u64
    });
    assert!(whole, "{} of {len} bytes prefetched", store.stats().snapshot().1);
    let before = store.stats().snapshot().0;
    let mut all = vec![0u8; len];
    file.read(0, &mut all, ReadOf::Data).unwrap();
    assert_eq!(all, bytes);
    assert_eq!(store.stats().snapshot().0, before, "the whole file came from the cache");
}
