//! Any bytes given to the tile decoder give an error or a matrix, never a panic
//! or an allocation beyond what the checked header implies; a decoded matrix
//! satisfies the format's invariants. Decoding through the chunks' planes (as
//! the loader does) accepts exactly the same tiles and gives the same rows.
#![no_main]
use deltacells::format::tile::ChunkPlanes;
use deltacells::format::{decode_tile, CsrMatrix, ParsedTile};
use libfuzzer_sys::fuzz_target;

/// Every row of the tile, written one by one from its chunks' planes.
fn via_planes(data: &[u8]) -> Option<CsrMatrix> {
    let tile = ParsedTile::parse(data, None).ok()?;
    let mut out = CsrMatrix { indptr: vec![0], ..CsrMatrix::default() };
    let mut planes = ChunkPlanes::default();
    for c in 0..tile.chunk_cells().count() {
        tile.decode_planes(c, &mut planes).ok()?;
        for row in planes.cells() {
            let n = planes.row_nnz(row);
            let at = out.indices.len();
            out.indices.resize(at + n, 0);
            out.data.resize(at + n, 0);
            planes.write_row(row, &mut out.indices[at..], &mut out.data[at..]);
            out.indptr.push(out.indices.len() as u64);
        }
    }
    deltacells::format::tile::finish_rows();
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let decoded = decode_tile(data, None);
    let planes = via_planes(data);
    assert_eq!(decoded.is_ok(), planes.is_some(), "decoding and planes disagree: {decoded:?}");
    if let Ok(m) = decoded {
        assert_eq!(m.indptr.first(), Some(&0));
        assert_eq!(*m.indptr.last().unwrap() as usize, m.indices.len());
        for r in 0..m.n_rows() {
            let (genes, counts) = m.row(r);
            assert!(genes.windows(2).all(|w| w[0] < w[1]));
            assert!(genes.iter().all(|&g| g < m.n_cols));
            assert!(counts.iter().all(|&c| c >= 1 && c <= i32::MAX as u32));
        }
        let p = planes.expect("accepted by both");
        assert_eq!((&p.indptr, &p.indices, &p.data), (&m.indptr, &m.indices, &m.data));
    }
});
