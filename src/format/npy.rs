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
    #[error("data is {actual} bytes, but shape ({len},) of int32 needs {expected}")]
    DataSize { len: u64, expected: u64, actual: u64 },
}

const MAGIC: &[u8] = b"\x93NUMPY";

/// Reads a 1-D `<i4` array.
pub fn read_i32(bytes: &[u8]) -> Result<Vec<i32>, NpyError> {
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
    if descr != "'<i4'" && descr != "\"<i4\"" {
        return Err(NpyError::Header(format!("dtype {descr}, expected '<i4' (little-endian int32)")));
    }
    if dict_value(header, "fortran_order")? != "False" {
        return Err(NpyError::Header("fortran_order must be False".into()));
    }
    let shape = dict_value(header, "shape")?;
    let inner = shape.trim_start_matches('(').trim_end_matches(')').trim().trim_end_matches(',').trim();
    let len: u64 = inner.parse().map_err(|_| NpyError::Header(format!("shape {shape} is not 1-D")))?;
    let data = &bytes[start + header_len..];
    let expected = len.checked_mul(4).ok_or_else(|| NpyError::Header(format!("shape {shape} too large")))?;
    if data.len() as u64 != expected {
        return Err(NpyError::DataSize { len, expected, actual: data.len() as u64 });
    }
    Ok(data.chunks_exact(4).map(|w| i32::from_le_bytes(w.try_into().expect("4"))).collect())
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
pub fn check_permutation(order: &[i32], n: u64) -> Result<(), String> {
    if order.len() as u64 != n {
        return Err(format!("has {} entries, expected n_genes {n}", order.len()));
    }
    let mut seen = vec![false; order.len()];
    for (j, &g) in order.iter().enumerate() {
        let Some(slot) = usize::try_from(g).ok().and_then(|g| seen.get_mut(g)) else {
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
    fn permutation() {
        assert!(check_permutation(&[1, 0, 2], 3).is_ok());
        assert!(check_permutation(&[1, 1, 2], 3).is_err());
        assert!(check_permutation(&[1, 0, 3], 3).is_err());
        assert!(check_permutation(&[-1, 0, 1], 3).is_err());
        assert!(check_permutation(&[1, 0], 3).is_err());
    }
}
