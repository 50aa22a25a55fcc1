//! Any bytes, as the structure of a 10x Genomics .h5 file (groups and
//! datasets there or not, shapes, types, lengths and values of indptr,
//! indices, data, barcodes and features), written as a valid HDF5 file and
//! read by our 10x reader as a conversion reads it: an error naming the
//! file, or rows of the declared shape; never a panic, never an allocation
//! sized by a length field. libhdf5 itself is C and not fuzzed here.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = deltacells::inputs::fuzzing::tenx_h5(data);
});
