use super::header::{u32_at, u64_at};
#[cfg(target_arch = "x86_64")]
use super::kernels::{cell_gaps_avx2, cell_gaps_sse2};
use super::kernels::{cell_gaps_scalar, recombine_counts, select_gaps_kernel, GapsKernel};
use super::*;
use crate::format::MAX_COUNT;
use crate::format::{CsrFill, CsrMatrix, EncodeError, Stream, TileError};
use proptest::prelude::*;

/// Builds a CSR block from rows of (gene, count).
fn block(n_genes: u32, rows: &[&[(u32, u32)]]) -> CsrMatrix {
    let mut m = CsrMatrix::empty(n_genes);
    for row in rows {
        for &(g, c) in *row {
            m.indices.push(g);
            m.data.push(c);
        }
        m.indptr.push(m.indices.len() as u64);
    }
    m
}

fn roundtrip(m: &CsrMatrix, n_chunks: usize) -> CsrMatrix {
    let blob = TileEncoder::new(n_chunks, 3).encode(m).expect("encodes");
    let expect = TileExpectation { n_cells: m.n_rows() as u64, nnz: m.nnz() as u64, n_genes: m.n_cols };
    decode_tile(&blob, Some(&expect)).expect("decodes")
}

fn set_u32(blob: &mut [u8], off: usize, v: u32) {
    blob[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn set_u64(blob: &mut [u8], off: usize, v: u64) {
    blob[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Recomputes the CRC after a deliberate change inside the covered bytes.
fn fix_crc(blob: &mut [u8]) {
    let crc = crc32fast::hash(&blob[HEADER_LEN..]);
    set_u32(blob, 56, crc);
}

fn sample() -> CsrMatrix {
    block(50, &[&[], &[(0, 1), (1, 300), (7, 2), (49, 1000)], &[(3, 1)], &[], &[(10, 5), (11, 65535), (20, 2)]])
}

#[test]
fn header_fields_are_where_the_spec_puts_them() {
    let m = sample();
    let blob = TileEncoder::new(2, 3).encode(&m).unwrap();
    assert_eq!(&blob[0..8], b"DELTACEL"); // magic
    assert_eq!(u32_at(&blob, 8), 2); // version
    assert_eq!(u32_at(&blob, 12), 0); // flags
    assert_eq!(u64_at(&blob, 16), 5); // n_cells
    assert_eq!(u64_at(&blob, 24), 8); // nnz
    assert_eq!(u32_at(&blob, 32), 50); // n_genes
    assert_eq!(u32_at(&blob, 36), 2); // n_chunks
    assert_eq!(u64_at(&blob, 40), 64 + 2 * 96); // indptr_off right after the chunk table
    assert_eq!(u64_at(&blob, 48), blob.len() as u64); // total_size
    assert_eq!(u32_at(&blob, 56), crc32fast::hash(&blob[64..])); // crc32
    assert_eq!(u32_at(&blob, 60), 0); // reserved
                                      // indptr, int64, uncompressed
    let indptr: Vec<u64> = (0..6).map(|i| u64_at(&blob, 256 + 8 * i)).collect();
    assert_eq!(indptr, m.indptr);
    // first chunk's gaps stream starts right after the indptr, 8-byte aligned
    assert_eq!(u64_at(&blob, 64 + 32), (256 + 48) as u64);
    // every stream offset is aligned; no trailing padding after the last stream
    let mut end = 0;
    for c in 0..2 {
        for s in 0..4 {
            let (off, len) = (u64_at(&blob, 64 + 96 * c + 32 + 16 * s), u64_at(&blob, 64 + 96 * c + 40 + 16 * s));
            if len > 0 {
                assert_eq!(off % 8, 0);
                end = end.max(off + len);
            } else {
                assert_eq!(off, 0, "writers store 0 for an absent stream");
            }
        }
    }
    assert_eq!(end, blob.len() as u64);
}

#[test]
fn roundtrip_small_blocks() {
    let m = sample();
    for chunks in [1, 2, 3, 5, 8, 100] {
        assert_eq!(roundtrip(&m, chunks), m, "{chunks} chunks");
    }
}

#[test]
fn zero_cell_tile_is_header_and_one_indptr_entry() {
    let m = CsrMatrix::empty(10);
    let blob = TileEncoder::new(8, 19).encode(&m).unwrap();
    assert_eq!(blob.len(), 72);
    assert_eq!(u32_at(&blob, 36), 0);
    assert_eq!(decode_tile(&blob, None).unwrap(), m);
}

#[test]
fn exceptions_roundtrip() {
    let n_genes = 200_003;
    let m = block(
        n_genes,
        &[
            &[(0, 70_000), (65_535, 65_535), (131_071, 2), (200_002, MAX_COUNT)],
            &[(70_000, 1)],
            &[(1, 1), (2, 65_536), (65_537, 3)],
        ],
    );
    let blob = TileEncoder::new(2, 3).encode(&m).unwrap();
    assert_eq!(decode_tile(&blob, None).unwrap(), m);
    assert_eq!(via_planes(&blob).unwrap(), m);
}

#[test]
fn a_cell_longer_than_the_unchecked_limit_roundtrips_and_is_checked() {
    // More than 65,537 entries: the u32 fast path could wrap, so these cells
    // take the checked path.
    let long: Vec<(u32, u32)> = (0..70_000u32).map(|g| (g * 2 + 1, 1 + g % 3)).collect();
    let m = block(140_002, &[&[(5, 1)], &long, &[]]);
    assert_eq!(roundtrip(&m, 2), m);
    assert_eq!(via_planes(&TileEncoder::new(2, 1).encode(&m).unwrap()).unwrap(), m);
    let m = block(140_001, &[&long]);
    let blob = TileEncoder::new(1, 1).encode(&m).unwrap();
    let mut small = blob.clone();
    set_u32(&mut small, 32, 139_999); // n_genes below the last index
    let err = decode_tile(&small, None).unwrap_err();
    assert_eq!(err.rule(), "tile:gene-index-range");
    assert_eq!(via_planes(&small).unwrap_err(), err);
}

#[test]
fn encoder_rejects_what_a_tile_cannot_hold() {
    let enc = TileEncoder::new(8, 1);
    assert!(matches!(
        enc.encode(&block(5, &[&[(2, 1), (2, 1)]])),
        Err(EncodeError::GeneOrder { cell: 0, gene: 2, .. })
    ));
    assert!(matches!(enc.encode(&block(5, &[&[], &[(5, 1)]])), Err(EncodeError::GeneRange { cell: 1, gene: 5, .. })));
    assert!(matches!(enc.encode(&block(5, &[&[(1, 0)]])), Err(EncodeError::Count { count: 0, .. })));
    assert!(matches!(enc.encode(&block(5, &[&[(1, 1 << 31)]])), Err(EncodeError::Count { .. })));
    assert!(matches!(enc.encode(&block(0, &[])), Err(EncodeError::NGenes(0))));
    let many: Vec<(u32, u32)> = (0..1025).map(|g| (g, 70_000)).collect();
    let err = enc.encode(&block(2000, &[&many])).unwrap_err();
    assert_eq!(err, EncodeError::TooManyExceptions { what: "counts", limit: 1024, cell: 0, gene: 1024 });
}

#[test]
fn chunk_boundaries_follow_decision_3() {
    // nnz per cell 10, 0, 0, 10, 10, 10: cumulative 0 10 10 10 20 30 40
    let indptr = [0, 10, 10, 10, 20, 30, 40];
    // C = 2: target 20 -> boundary 4
    assert_eq!(chunk_boundaries(&indptr, 2), vec![0, 4, 6]);
    // C = 4: targets 10, 20, 30 -> 1 (lowest boundary with 10), 4, 5
    assert_eq!(chunk_boundaries(&indptr, 4), vec![0, 1, 4, 5, 6]);
    // a tie between 10 (boundary 1) and 20 (boundary 4) for target 15: the lower
    assert_eq!(chunk_boundaries(&[0, 10, 20, 30], 2), vec![0, 1, 3]);
    // more chunks than cells: one chunk per cell
    assert_eq!(chunk_boundaries(&[0, 0, 0], 8), vec![0, 1, 2]);
    // all nonzeros in the first cell: forced strictly increasing
    assert_eq!(chunk_boundaries(&[0, 100, 100, 100], 3), vec![0, 1, 2, 3]);
    // all in the last cell: each chunk still gets a cell
    assert_eq!(chunk_boundaries(&[0, 0, 0, 100], 3), vec![0, 1, 2, 3]);
    assert_eq!(chunk_boundaries(&[0], 8), vec![0]);
}

#[test]
fn one_changed_header_byte_gives_its_own_error() {
    let blob = TileEncoder::new(2, 3).encode(&sample()).unwrap();
    let rule = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = blob.clone();
        f(&mut b);
        decode_tile(&b, None).unwrap_err().rule()
    };
    assert_eq!(rule(&|b| b[7] = b'X'), "tile:magic");
    assert_eq!(rule(&|b| set_u32(b, 8, 3)), "tile:version");
    assert_eq!(rule(&|b| set_u32(b, 12, 1)), "tile:flags");
    assert_eq!(rule(&|b| set_u32(b, 60, 1)), "tile:reserved");
    assert_eq!(rule(&|b| set_u32(b, 32, 0)), "tile:n-genes");
    assert_eq!(rule(&|b| b.truncate(b.len() - 5)), "tile:total-size");
    assert_eq!(rule(&|b| b.truncate(10)), "tile:total-size");
    assert_eq!(rule(&|b| b[300] ^= 1), "tile:crc32");
    assert_eq!(rule(&|b| set_u32(b, 56, 0)), "tile:crc32");
    assert_eq!(
        rule(&|b| {
            set_u64(b, 40, 68);
        }),
        "tile:layout"
    );
}

#[test]
fn header_must_agree_with_the_manifest() {
    let m = sample();
    let blob = TileEncoder::new(2, 3).encode(&m).unwrap();
    let good = TileExpectation { n_cells: 5, nnz: 8, n_genes: 50 };
    assert!(decode_tile(&blob, Some(&good)).is_ok());
    let err = decode_tile(&blob, Some(&TileExpectation { n_genes: 51, ..good })).unwrap_err();
    assert_eq!(err, TileError::HeaderMismatch { field: "n_genes", header: 50, expected: 51 });
    assert_eq!(err.rule(), "tile:n-genes");
    let err = decode_tile(&blob, Some(&TileExpectation { nnz: 9, ..good })).unwrap_err();
    assert_eq!(err.rule(), "tile-nnz");
}

#[test]
fn structural_corruption_behind_a_valid_crc_is_caught() {
    let m = sample();
    let blob = TileEncoder::new(2, 3).encode(&m).unwrap();
    let indptr_off = 64 + 2 * 96;
    let mutate = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = blob.clone();
        f(&mut b);
        fix_crc(&mut b);
        decode_tile(&b, None).unwrap_err()
    };
    // indptr decreases: [0, 0, 4, 1, ...]
    let err = mutate(&|b| set_u64(b, indptr_off + 24, 1));
    assert_eq!(err.rule(), "tile:indptr");
    // chunk 1 starts where chunk 0 did not end
    let err = mutate(&|b| set_u64(b, 64 + 96 + 16, 3));
    assert_eq!(err.rule(), "tile:chunk-table");
    // gaps stream misaligned
    let err = mutate(&|b| set_u64(b, 64 + 32, (indptr_off + 48 + 1) as u64));
    assert_eq!(err.rule(), "tile:frame");
    // gaps stream overlapping the indptr
    let err = mutate(&|b| set_u64(b, 64 + 32, indptr_off as u64));
    assert_eq!(err.rule(), "tile:frame");
    // gaps stream running past the end
    let err = mutate(&|b| set_u64(b, 64 + 40, 1 << 40));
    assert_eq!(err.rule(), "tile:frame");
}

/// Replaces chunk `c`'s `stream` frame (0 gaps, 1 vals) with the compression of
/// `raw`, appended at the end of the blob.
fn replace_stream(blob: &[u8], c: usize, stream: usize, raw: &[u8]) -> Vec<u8> {
    let mut b = blob.to_vec();
    while !b.len().is_multiple_of(8) {
        b.push(0);
    }
    let off = b.len() as u64;
    let frame = compress_frame(raw, 3).unwrap();
    b.extend_from_slice(&frame);
    let entry = 64 + 96 * c + 32 + 16 * stream;
    set_u64(&mut b, entry, off);
    set_u64(&mut b, entry + 8, frame.len() as u64);
    let total = b.len() as u64;
    set_u64(&mut b, 48, total);
    fix_crc(&mut b);
    b
}

#[test]
fn stream_content_rules() {
    // one cell, genes 3 and 5, counts 1 and 2, one chunk
    let m = block(10, &[&[(3, 1), (5, 2)]]);
    let blob = TileEncoder::new(1, 3).encode(&m).unwrap();
    // gaps 3,2 -> planes [3,2,0,0]
    assert_eq!(decode_tile(&replace_stream(&blob, 0, 0, &[3, 2, 0, 0]), None).unwrap(), m);
    let err = decode_tile(&replace_stream(&blob, 0, 0, &[3, 2, 0, 0, 0, 0]), None).unwrap_err();
    assert_eq!(err, TileError::FrameSize { chunk: 0, stream: Stream::Gaps, expected: 4, actual: 6 });
    let err = decode_tile(&replace_stream(&blob, 0, 0, &[3, 0, 0, 0]), None).unwrap_err();
    assert_eq!(err, TileError::GeneIndexOrder { chunk: 0, cell: 0, position: 1 });
    let err = decode_tile(&replace_stream(&blob, 0, 0, &[3, 7, 0, 0]), None).unwrap_err();
    assert_eq!(err, TileError::GeneIndexRange { chunk: 0, cell: 0, position: 1, gene: 10, n_genes: 10 });
    let err = decode_tile(&replace_stream(&blob, 0, 1, &[1, 0, 0, 0]), None).unwrap_err();
    assert_eq!(err, TileError::ZeroCount { chunk: 0, position: 1 });
    // The planes name the same rule, the same place.
    for (stream, raw) in [(0, &[3, 0, 0, 0]), (0, &[3, 7, 0, 0]), (1, &[1, 0, 0, 0])] {
        let bad = replace_stream(&blob, 0, stream, raw);
        assert_eq!(via_planes(&bad).unwrap_err(), decode_tile(&bad, None).unwrap_err());
    }
}

#[test]
fn frame_rules_of_decision_4() {
    let m = block(10, &[&[(3, 1), (5, 2)]]);
    let blob = TileEncoder::new(1, 3).encode(&m).unwrap();
    let gaps_off = u64_at(&blob, 64 + 32) as usize;
    let gaps_len = u64_at(&blob, 64 + 40) as usize;
    // trailing bytes inside the stream's length
    let mut b = blob.clone();
    b.extend_from_slice(&[0; 8]);
    let frame = blob[gaps_off..gaps_off + gaps_len].to_vec();
    let off = (b.len() - 8).next_multiple_of(8);
    b.resize(off, 0);
    b.extend_from_slice(&frame);
    b.extend_from_slice(&[1, 2, 3]);
    set_u64(&mut b, 64 + 32, off as u64);
    set_u64(&mut b, 64 + 40, (frame.len() + 3) as u64);
    let total = b.len() as u64;
    set_u64(&mut b, 48, total);
    fix_crc(&mut b);
    assert!(
        matches!(decode_tile(&b, None).unwrap_err(), TileError::Frame { reason, .. } if reason.contains("trailing"))
    );
    // a frame without its content size
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_contentsize(false).unwrap();
    std::io::Write::write_all(&mut enc, &[3, 2, 0, 0]).unwrap();
    let no_size = enc.finish().unwrap();
    let mut b = blob.clone();
    let off = b.len().next_multiple_of(8);
    b.resize(off, 0);
    b.extend_from_slice(&no_size);
    set_u64(&mut b, 64 + 32, off as u64);
    set_u64(&mut b, 64 + 40, no_size.len() as u64);
    let total = b.len() as u64;
    set_u64(&mut b, 48, total);
    fix_crc(&mut b);
    assert!(
        matches!(decode_tile(&b, None).unwrap_err(), TileError::Frame { reason, .. } if reason.contains("content size"))
    );
}

/// The tile decoded through its chunks' planes, every row written out one by
/// one, each row's planes prefetched first (a hint that must stay inside
/// them whatever the row: empty, last, past an exception), both ways planes
/// are read: checked whole when decompressed, then written (as gathers do,
/// which write a chunk's rows many times), and checked row by row as they
/// are written (as the loader does, which writes each once). The two must
/// give the same matrix, or the same error.
fn via_planes(blob: &[u8]) -> Result<CsrMatrix, TileError> {
    let checked_first = via_planes_checked(blob, false);
    let checked_as_written = via_planes_checked(blob, true);
    assert_eq!(checked_first, checked_as_written, "the planes checked whole, then those checked row by row");
    checked_first
}

fn via_planes_checked(blob: &[u8], as_written: bool) -> Result<CsrMatrix, TileError> {
    let tile = ParsedTile::parse(blob, None)?;
    let mut out = CsrMatrix::empty(u32_at(blob, 32));
    let mut planes = ChunkPlanes::default();
    for (c, _) in tile.chunk_cells().enumerate() {
        if as_written {
            tile.decompress_planes(c, &mut planes)?;
        } else {
            tile.decode_planes(c, &mut planes)?;
        }
        for row in planes.cells() {
            let n = planes.row_nnz(row);
            let at = out.indices.len();
            out.indices.resize(at + n, u32::MAX);
            out.data.resize(at + n, u32::MAX);
            planes.prefetch_row(row);
            if !as_written {
                planes.write_row(row, &mut out.indices[at..], &mut out.data[at..]);
            } else if !planes.write_row_checked(row, &mut out.indices[at..], &mut out.data[at..], row % 2 == 0) {
                // The chunk decoded whole names the rule.
                tile.decode_planes(c, &mut ChunkPlanes::default())?;
                panic!("row {row} of chunk {c} broke a rule that decoding the chunk does not find");
            }
            out.indptr.push(out.indices.len() as u64);
        }
    }
    finish_rows();
    Ok(out)
}

/// The tile read in ranges of rows cut at `cuts` (as a pass of range reads
/// does): each chunk decompressed once, each range's rows decoded from its
/// planes with their rules checked, and a chunk that breaks one decoded whole.
fn via_ranges(blob: &[u8], cuts: &[u64]) -> Result<CsrMatrix, TileError> {
    let tile = ParsedTile::parse(blob, None)?;
    let n_rows = tile.chunk_cells().last().map_or(0, |c| c.end);
    let mut bounds: Vec<u64> = cuts.iter().map(|&c| c % (n_rows + 1)).chain([0, n_rows]).collect();
    bounds.sort_unstable();
    bounds.dedup();
    let mut out = CsrMatrix::default();
    let mut fill = CsrFill::new(&mut out, u32_at(blob, 32));
    let spans: Vec<_> = tile.chunk_cells().collect();
    let mut planes = ChunkPlanes::default();
    let mut current = None;
    for w in bounds.windows(2) {
        for (c, cells) in spans.iter().enumerate() {
            let (lo, hi) = (w[0].max(cells.start), w[1].min(cells.end));
            if lo >= hi {
                continue;
            }
            if current != Some(c) {
                tile.decompress_planes(c, &mut planes)?;
                current = Some(c);
            }
            tile.append_chunk_rows(c, &planes, lo..hi, &mut fill)?;
        }
    }
    fill.finish();
    Ok(out)
}

fn arb_block() -> impl Strategy<Value = CsrMatrix> {
    (1u32..300_000, 0usize..40).prop_flat_map(|(n_genes, n_cells)| {
        let cell = proptest::collection::btree_map(0..n_genes, prop_oneof![8 => 1u32..5, 1 => 1u32..=MAX_COUNT], 0..30);
        proptest::collection::vec(cell, n_cells).prop_map(move |cells| {
            let mut m = CsrMatrix::empty(n_genes);
            for c in cells {
                for (g, v) in c {
                    m.indices.push(g);
                    m.data.push(v);
                }
                m.indptr.push(m.indices.len() as u64);
            }
            m
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn encode_then_decode_gives_the_block_back(m in arb_block(), chunks in 1usize..10) {
        prop_assert_eq!(roundtrip(&m, chunks), m);
    }

    #[test]
    fn a_mutated_tile_decodes_to_an_error_or_the_original(
        m in arb_block(), at in any::<proptest::sample::Index>(), byte in any::<u8>(), recrc in any::<bool>()
    ) {
        let blob = TileEncoder::new(3, 1).encode(&m).unwrap();
        let mut b = blob.clone();
        let i = at.index(b.len());
        b[i] = byte;
        if recrc {
            fix_crc(&mut b);
        }
        let decoded = decode_tile(&b, None);
        if let (Ok(decoded), false) = (decoded, recrc) {
            // Without a recomputed CRC, only a change the CRC does not cover can
            // pass, and none of those may change the data.
            prop_assert_eq!(decoded.indices, m.indices);
            prop_assert_eq!(decoded.data, m.data);
            prop_assert_eq!(decoded.indptr, m.indptr);
        }
    }

    #[test]
    fn planes_give_every_row_as_decoding_does(m in arb_block(), chunks in 1usize..10) {
        let blob = TileEncoder::new(chunks, 1).encode(&m).unwrap();
        prop_assert_eq!(via_planes(&blob).unwrap(), m);
    }

    #[test]
    fn planes_refuse_exactly_what_decoding_refuses(
        m in arb_block(), at in any::<proptest::sample::Index>(), byte in any::<u8>()
    ) {
        let mut b = TileEncoder::new(3, 1).encode(&m).unwrap();
        let i = at.index(b.len());
        b[i] = byte;
        fix_crc(&mut b);
        match (decode_tile(&b, None), via_planes(&b)) {
            (Ok(decoded), Ok(planes)) => prop_assert_eq!(planes, decoded),
            (Err(_), Err(_)) => {}
            (decoded, planes) => prop_assert!(false, "decode gave {decoded:?}, planes {planes:?}"),
        }
    }

    #[test]
    fn ranges_give_every_row_as_decoding_does(
        m in arb_block(), chunks in 1usize..10, cuts in proptest::collection::vec(any::<u64>(), 0..6)
    ) {
        let blob = TileEncoder::new(chunks, 1).encode(&m).unwrap();
        prop_assert_eq!(via_ranges(&blob, &cuts).unwrap(), m);
    }

    #[test]
    fn ranges_refuse_exactly_what_decoding_refuses(
        m in arb_block(), at in any::<proptest::sample::Index>(), byte in any::<u8>(),
        cuts in proptest::collection::vec(any::<u64>(), 0..6)
    ) {
        let mut b = TileEncoder::new(3, 1).encode(&m).unwrap();
        let i = at.index(b.len());
        b[i] = byte;
        fix_crc(&mut b);
        match (decode_tile(&b, None), via_ranges(&b, &cuts)) {
            (Ok(decoded), Ok(ranges)) => prop_assert_eq!(ranges, decoded),
            (Err(d), Err(r)) => prop_assert_eq!(d.to_string(), r.to_string()),
            (decoded, ranges) => prop_assert!(false, "decode gave {decoded:?}, ranges {ranges:?}"),
        }
    }

    #[test]
    fn a_truncated_tile_is_an_error(m in arb_block(), cut in any::<proptest::sample::Index>()) {
        let blob = TileEncoder::new(3, 1).encode(&m).unwrap();
        let len = cut.index(blob.len());
        prop_assert!(decode_tile(&blob[..len], None).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), header in any::<bool>()) {
        let mut b = bytes;
        if header && b.len() >= 64 {
            b[0..8].copy_from_slice(MAGIC);
            set_u32(&mut b, 8, 2);
            set_u32(&mut b, 12, 0);
            set_u32(&mut b, 60, 0);
            let len = b.len() as u64;
            set_u64(&mut b, 48, len);
            fix_crc(&mut b);
        }
        let _ = decode_tile(&b, None);
    }
}

#[test]
fn every_gaps_kernel_agrees_with_the_scalar_one() {
    let mut state = 12345u64;
    for len in [0usize, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 100, 1000] {
        let mut lo = Vec::with_capacity(len);
        let mut hi = Vec::with_capacity(len);
        for _ in 0..len {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            let v = (state >> 33) as u32;
            lo.push(if v.is_multiple_of(5) { 0 } else { v as u8 });
            hi.push(if v.is_multiple_of(3) { (v >> 8) as u8 } else { 0 });
        }
        let mut want = vec![0u32; len];
        let expected = cell_gaps_scalar(&lo, &hi, &mut want, 0);
        let mut kernels: Vec<(&str, GapsKernel)> = vec![("selected", select_gaps_kernel())];
        #[cfg(target_arch = "x86_64")]
        {
            kernels.push(("sse2", cell_gaps_sse2));
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the processor supports AVX2, checked above.
                kernels.push(("avx2", |lo, hi, out| unsafe { cell_gaps_avx2(lo, hi, out) }));
            }
        }
        for (name, kernel) in kernels {
            let mut got = vec![0u32; len];
            assert_eq!(kernel(&lo, &hi, &mut got), expected, "{name}, {len} gaps");
            assert_eq!(got, want, "{name}, {len} gaps");
        }
        // The output at every offset from a 32-byte boundary, so that the
        // AVX2 build's unaligned head, aligned streaming body and tail all run.
        let values: Vec<u32> = lo.iter().zip(&hi).map(|(&l, &h)| u32::from(l) | u32::from(h) << 8).collect();
        for offset in 0..8 {
            let mut buffer = vec![u32::MAX; len + 8];
            let counts = &mut buffer[offset..offset + len];
            let zero = recombine_counts(&lo, &hi, counts);
            assert_eq!(zero, values.contains(&0), "{len} counts at offset {offset}");
            assert_eq!(counts, values.as_slice(), "{len} counts at offset {offset}");
            // One zero anywhere is seen, and nothing past the output is written.
            if len > 0 {
                for at in [0, len / 2, len - 1] {
                    let (mut l, mut h) = (lo.clone(), hi.clone());
                    l.iter_mut().zip(h.iter_mut()).for_each(|(l, h)| (*l, *h) = (1, 0));
                    (l[at], h[at]) = (0, 0);
                    let mut buffer = vec![u32::MAX; len + 8];
                    assert!(recombine_counts(&l, &h, &mut buffer[offset..offset + len]), "zero at {at} of {len}");
                    assert!(buffer[offset + len..].iter().all(|&v| v == u32::MAX));
                }
            }
        }
    }
}

/// A zstd frame header that declares `size` bytes of content, followed by one
/// RLE block of 8 bytes: valid framing, but a lie about the size.
fn lying_frame(size: u64) -> Vec<u8> {
    let mut f = vec![0x28, 0xB5, 0x2F, 0xFD]; // magic
    f.push(0xE0); // frame header descriptor: 8-byte content size, single segment
    f.extend_from_slice(&size.to_le_bytes());
    let block: u32 = (8 << 3) | (1 << 1) | 1; // size 8, RLE, last block
    f.extend_from_slice(&block.to_le_bytes()[..3]);
    f.push(0);
    f
}

#[test]
fn a_tile_claiming_huge_sizes_is_rejected_before_allocation() {
    let m = block(10, &[&[(3, 1)]]);
    let blob = TileEncoder::new(1, 3).encode(&m).unwrap();
    let huge: u64 = 1 << 31; // below the 2^32 chunk limit, so the frame check is what stops it
                             // header nnz, indptr[1] and the chunk's nnz_hi all agree on 2^31 nonzeros
    let mut b = blob.clone();
    set_u64(&mut b, 24, huge);
    let indptr_off = u64_at(&b, 40) as usize;
    set_u64(&mut b, indptr_off + 8, huge);
    set_u64(&mut b, 64 + 24, huge);
    // and both frames declare 2 * 2^31 bytes (16 GiB of output if believed)
    let frame = lying_frame(2 * huge);
    for stream in 0..2 {
        while !b.len().is_multiple_of(8) {
            b.push(0);
        }
        let off = b.len() as u64;
        b.extend_from_slice(&frame);
        set_u64(&mut b, 64 + 32 + 16 * stream, off);
        set_u64(&mut b, 64 + 40 + 16 * stream, frame.len() as u64);
    }
    let total = b.len() as u64;
    set_u64(&mut b, 48, total);
    fix_crc(&mut b);
    let err = decode_tile(&b, None).unwrap_err();
    assert!(matches!(&err, TileError::Frame { reason, .. } if reason.contains("cannot hold")), "{err}");
    // the same claim in the header alone contradicts the indptr
    let mut b = blob.clone();
    set_u64(&mut b, 24, huge);
    fix_crc(&mut b);
    assert_eq!(decode_tile(&b, None).unwrap_err().rule(), "tile:indptr");
    // n_cells beyond what the blob can hold is a layout error
    let mut b = blob;
    set_u64(&mut b, 16, 1 << 60);
    fix_crc(&mut b);
    assert_eq!(decode_tile(&b, None).unwrap_err().rule(), "tile:layout");
}

#[test]
fn a_few_rows_decode_only_their_chunks() {
    let m = crate::format::CsrMatrix {
        n_cols: 40,
        indptr: (0..=64u64).map(|r| r * 3).collect(),
        indices: (0..64).flat_map(|r| [r % 10, 10 + r % 10, 30 + r % 10]).collect(),
        data: (0..192).map(|v| 1 + v % 7).collect(),
    };
    let blob = TileEncoder::new(8, 3).encode(&m).unwrap();
    let full = decode_tile(&blob, None).unwrap();
    assert_eq!(full, m);
    for rows in [vec![0u64], vec![63, 5], vec![9, 10, 11, 40], (0..64).collect()] {
        let mut out = CsrMatrix::default();
        decode_rows_into(&blob, None, &rows, &mut out).unwrap();
        assert_eq!(out.n_rows(), 64);
        for &r in &rows {
            assert_eq!(out.row(r as usize), m.row(r as usize), "row {r} of {rows:?}");
        }
        let decoded_rows = (0..64).filter(|&r| !out.row(r).0.is_empty()).count();
        assert!(decoded_rows >= rows.len() && (rows.len() > 8 || decoded_rows <= 8 * rows.len()), "{decoded_rows}");
    }
    // a damaged frame in a chunk not needed is not read; one in a chunk needed is
    let chunk_5 = 64 + 96 * 5;
    let gaps_off = u64_at(&blob, chunk_5 + 32) as usize;
    let gaps_len = u64_at(&blob, chunk_5 + 40) as usize;
    let mut bad = blob.clone();
    bad[gaps_off + gaps_len - 1] ^= 0xff;
    fix_crc(&mut bad);
    let cells_of_5 = u64_at(&blob, chunk_5)..u64_at(&blob, chunk_5 + 8);
    let mut out = CsrMatrix::default();
    decode_rows_into(&bad, None, &[0, 63], &mut out).unwrap();
    assert_eq!(out.row(0), m.row(0));
    let e = decode_rows_into(&bad, None, &[cells_of_5.start], &mut out).unwrap_err();
    assert_eq!(e.rule(), "tile:frame", "{e}");
    assert!(decode_tile(&bad, None).is_err());
}
