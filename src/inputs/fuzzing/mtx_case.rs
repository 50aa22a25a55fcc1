//! A Matrix Market input from arbitrary bytes: a flags byte, then the
//! matrix, features and barcodes files' text separated by NUL bytes.
//!
//! Flags: bit 0 gzips the matrix (bits 3-5 then cut the compressed stream
//! short, to an eighth of its length per step, 0 keeping it whole); bit 1
//! gzips the features file; bit 2 names the features file genes.tsv.

use std::io::Write;

use super::{read_as_convert_does, Choices};
use crate::inputs::error::InputError;

/// Writes the input the bytes describe and reads it as a conversion does.
///
/// # Panics
///
/// Where [`read_as_convert_does`] finds a fault.
pub fn mtx(data: &[u8]) -> Result<(), InputError> {
    let mut choices = Choices::new(data);
    let flags = choices.byte();
    let mut parts = choices.rest().splitn(3, |&b| b == 0);
    let (matrix, features, barcodes) =
        (parts.next().unwrap_or_default(), parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let dir = tempfile::tempdir().expect("a temporary folder");
    let input = dir.path().join("case_mtx");
    std::fs::create_dir(&input).expect("a folder");
    let write = |name: &str, bytes: &[u8], gzip: bool, eighths: u8| {
        let (name, bytes) = if gzip {
            let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            z.write_all(bytes).expect("in memory");
            let mut gz = z.finish().expect("in memory");
            if eighths > 0 {
                gz.truncate(gz.len() * usize::from(eighths) / 8);
            }
            (format!("{name}.gz"), gz)
        } else {
            (name.to_string(), bytes.to_vec())
        };
        std::fs::write(input.join(name), bytes).expect("a file");
    };
    write("matrix.mtx", matrix, flags & 1 != 0, (flags >> 3) & 7);
    let features_name = if flags & 4 != 0 { "genes.tsv" } else { "features.tsv" };
    write(features_name, features, flags & 2 != 0, 0);
    write("barcodes.tsv", barcodes, false, 0);
    read_as_convert_does(&input)
}
