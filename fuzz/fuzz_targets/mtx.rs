//! Any bytes, as a Matrix Market input (a flags byte, then the matrix,
//! features and barcodes files separated by NULs; the matrix gzipped, or
//! gzipped and cut short, as the flags say), read as a conversion reads it:
//! an error naming the file, or rows of the declared shape; never a panic,
//! never an allocation sized by a length field (libFuzzer's -malloc_limit_mb
//! catches one). deltacells::inputs::fuzzing holds the harness, which
//! tests/cli/fuzz_regressions.rs runs on fuzz/regressions/mtx/.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = deltacells::inputs::fuzzing::mtx(data);
});
