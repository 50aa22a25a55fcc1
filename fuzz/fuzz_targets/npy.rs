//! The .npy reader never panics; what it accepts, the writer writes back
//! readable with the same values.
#![no_main]
use deltacells::format::npy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(values) = npy::read_i32(data) {
        assert_eq!(npy::read_i32(&npy::write_i32(&values)).unwrap(), values);
        let _ = npy::check_permutation(&values, values.len() as u64);
    }
});
