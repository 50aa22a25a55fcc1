//! Any bytes given to the tile decoder give an error or a matrix, never a panic
//! or an allocation beyond what the checked header implies; a decoded matrix
//! satisfies the format's invariants.
#![no_main]
use deltacells::format::decode_tile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode_tile(data, None) {
        assert_eq!(m.indptr.first(), Some(&0));
        assert_eq!(*m.indptr.last().unwrap() as usize, m.indices.len());
        for r in 0..m.n_rows() {
            let (genes, counts) = m.row(r);
            assert!(genes.windows(2).all(|w| w[0] < w[1]));
            assert!(genes.iter().all(|&g| g < m.n_cols));
            assert!(counts.iter().all(|&c| c >= 1 && c <= i32::MAX as u32));
        }
    }
});
