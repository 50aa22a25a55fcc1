//! gene_order.npy: a 1-D little-endian int32 .npy array (decisions.md 10), read
//! and written without numpy. Only what the format uses is supported.

/// Why a .npy file was rejected.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum NpyError {
    #[error("not a .npy file (bad magic)")]
    Magic,
    #[error("unsupported .npy version {0}.{1}")]
    Version(u8, u8),
    #[error("truncated .npy header")]
    Truncated,
    #[error(".npy header: {0}")]
    Header(String),
    #[error("data is {actual} bytes, but shape ({len},) of {dtype} needs {expected}")]
    DataSize { len: u64, dtype: &'static str, expected: u64, actual: u64 },
}

const MAGIC: &[u8] = b"\x93NUMPY";

/// Reads a 1-D `<i4` array (the dtype gene_order.npy must have).
pub fn read_i32(bytes: &[u8]) -> Result<Vec<i32>, NpyError> {
    let (dtype, data) = parse(bytes, &[("<i4", "int32", 4)])?;
    debug_assert_eq!(dtype, "<i4");
    Ok(data.chunks_exact(4).map(|w| i32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect())
}

/// Reads a 1-D array of little-endian int32 or int64 (`<i4` or `<i8`: what
/// `np.save` writes for an index array such as `np.argsort`'s), as i64.
pub fn read_indices(bytes: &[u8]) -> Result<Vec<i64>, NpyError> {
    let (dtype, data) = parse(bytes, &[("<i4", "int32", 4), ("<i8", "int64", 8)])?;
    Ok(if dtype == "<i4" {
        data.chunks_exact(4).map(|w| i64::from(i32::from_le_bytes([w[0], w[1], w[2], w[3]]))).collect()
    } else {
        data.chunks_exact(8).map(|w| i64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]])).collect()
    })
}

/// Checks a 1-D .npy array of one of `dtypes` (descr, name, item size): its
/// descr and its data, of exactly the size its shape needs.
fn parse<'a>(
    bytes: &'a [u8],
    dtypes: &[(&'static str, &'static str, u64)],
) -> Result<(&'static str, &'a [u8]), NpyError> {
    if bytes.len() < 8 || &bytes[..6] != MAGIC {
        return Err(NpyError::Magic);
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (header_len, start): (usize, usize) = match major {
        1 => (u16::from_le_bytes(bytes.get(8..10).ok_or(NpyError::Truncated)?.try_into().expect("2")) as usize, 10),
        2 | 3 => (u32::from_le_bytes(bytes.get(8..12).ok_or(NpyError::Truncated)?.try_into().expect("4")) as usize, 12),
        _ => return Err(NpyError::Version(major, minor)),
    };
    let header = bytes.get(start..start.saturating_add(header_len)).ok_or(NpyError::Truncated)?;
    let header = std::str::from_utf8(header).map_err(|_| NpyError::Header("not text".into()))?;
    let descr = dict_value(header, "descr")?;
    let bare = descr.trim_matches(|c| c == '\'' || c == '"');
    let Some(&(dtype, name, size)) = dtypes.iter().find(|d| d.0 == bare && descr.len() == bare.len() + 2) else {
        let wanted: Vec<String> = dtypes.iter().map(|d| format!("'{}' (little-endian {})", d.0, d.1)).collect();
        return Err(NpyError::Header(format!("dtype {descr}, expected {}", wanted.join(" or "))));
    };
    if dict_value(header, "fortran_order")? != "False" {
        return Err(NpyError::Header("fortran_order must be False".into()));
    }
    let shape = dict_value(header, "shape")?;
    let inner = shape.trim_start_matches('(').trim_end_matches(')').trim().trim_end_matches(',').trim();
    let len: u64 = inner.parse().map_err(|_| NpyError::Header(format!("shape {shape} is not 1-D")))?;
    let data = &bytes[start + header_len..];
    let expected = len.checked_mul(size).ok_or_else(|| NpyError::Header(format!("shape {shape} too large")))?;
    if data.len() as u64 != expected {
        return Err(NpyError::DataSize { len, dtype: name, expected, actual: data.len() as u64 });
    }
    Ok((dtype, data))
}

/// The text after `'key':` in a .npy header dict, up to the next top-level comma.
fn dict_value<'a>(header: &'a str, key: &str) -> Result<&'a str, NpyError> {
    let missing = || NpyError::Header(format!("no {key:?} key"));
    let at = header.find(&format!("'{key}'")).or_else(|| header.find(&format!("\"{key}\""))).ok_or_else(missing)?;
    let rest = &header[at + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':').ok_or_else(missing)?.trim_start();
    let mut depth = 0i32;
    for (i, ch) in rest.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' | '}' if depth == 0 => return Ok(rest[..i].trim()),
            _ => {}
        }
    }
    Err(NpyError::Header(format!("unterminated value for {key:?}")))
}

/// Writes a 1-D `<i4` array as numpy's `np.save` does (format 1.0, header padded
/// with spaces to a multiple of 64 bytes and ended by a newline).
pub fn write_i32(values: &[i32]) -> Vec<u8> {
    let mut header = format!("{{'descr': '<i4', 'fortran_order': False, 'shape': ({},), }}", values.len());
    let unpadded = MAGIC.len() + 2 + 2 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + 4 * values.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Checks that `order` is a permutation of 0..n.
pub fn check_permutation<T: Copy + std::fmt::Display + TryInto<usize>>(order: &[T], n: u64) -> Result<(), String> {
    if order.len() as u64 != n {
        return Err(format!("has {} entries, expected n_genes {n}", order.len()));
    }
    let mut seen = vec![false; order.len()];
    for (j, &g) in order.iter().enumerate() {
        let Some(slot) = g.try_into().ok().and_then(|g: usize| seen.get_mut(g)) else {
            return Err(format!("entry {j} is {g}, outside 0..{n}"));
        };
        if std::mem::replace(slot, true) {
            return Err(format!("entry {j}: {g} appears twice"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_layout() {
        let bytes = write_i32(&[2, 0, 1]);
        assert_eq!((bytes.len() - 12) % 64, 0, "data starts on a 64-byte boundary");
        assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
        assert_eq!(read_i32(&bytes).unwrap(), vec![2, 0, 1]);
        assert_eq!(read_i32(&write_i32(&[])).unwrap(), Vec::<i32>::new());
    }

    #[test]
    fn rejects_other_dtypes_and_bad_sizes() {
        let mut b = write_i32(&[1, 2]);
        let at = b.windows(3).position(|w| w == b"<i4").unwrap();
        b[at + 2] = b'8';
        assert!(matches!(read_i32(&b), Err(NpyError::Header(_))));
        let mut b = write_i32(&[1, 2]);
        b.pop();
        assert!(matches!(read_i32(&b), Err(NpyError::DataSize { .. })));
        assert_eq!(read_i32(b"hello"), Err(NpyError::Magic));
        assert!(read_i32(&write_i32(&[1])[..20]).is_err());
    }

    #[test]
    fn index_arrays_of_int32_or_int64() {
        assert_eq!(read_indices(&write_i32(&[2, 0, 1])).unwrap(), vec![2, 0, 1]);
        // What np.save(np.array([2, 0, 1], dtype=np.int64)) writes.
        let mut b = write_i32(&[]);
        let at = b.windows(3).position(|w| w == b"<i4").unwrap();
        b[at + 2] = b'8';
        let shape = b.windows(4).position(|w| w == b"(0,)").unwrap();
        b[shape + 1] = b'3';
        for v in [2i64, 0, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(read_indices(&b).unwrap(), vec![2, 0, 1]);
        assert!(matches!(read_i32(&b), Err(NpyError::Header(m)) if m.contains("expected '<i4'")));
        b.pop();
        assert!(matches!(read_indices(&b), Err(NpyError::DataSize { dtype: "int64", .. })));
    }

    #[test]
    fn truncated_or_mutated_files_are_errors_not_panics() {
        let good = write_i32(&[3, 1, 2, 0]);
        for end in 0..good.len() {
            assert!(read_indices(&good[..end]).is_err(), "truncated at {end}");
            assert!(read_i32(&good[..end]).is_err(), "truncated at {end}");
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut bad = good.clone();
            let at = (state % bad.len() as u64) as usize;
            bad[at] = (state >> 32) as u8;
            // Whatever the byte, an answer: the array or an error.
            let _ = read_indices(&bad);
            let _ = read_i32(&bad);
        }
        // A header length past the end of the file.
        let mut long = good.clone();
        long[8] = 0xff;
        long[9] = 0xff;
        assert_eq!(read_indices(&long), Err(NpyError::Truncated));
    }

    #[test]
    fn permutation() {
        assert!(check_permutation(&[1, 0, 2], 3).is_ok());
        assert!(check_permutation(&[1, 1, 2], 3).is_err());
        assert!(check_permutation(&[1, 0, 3], 3).is_err());
        assert!(check_permutation(&[-1, 0, 1], 3).is_err());
        assert!(check_permutation(&[1, 0], 3).is_err());
    }
}
