//! A sparse matrix's 1-D arrays read straight from the file's bytes, off
//! HDF5's global lock: each chunk's stored bytes come by a positioned read
//! and are inflated on the rayon pool, so that the chunks of a block of rows
//! decompress on every core instead of one after another inside HDF5.
//!
//! Only the simple and common case is read this way: a local file; a chunked
//! array whose every chunk is written, stored with no filter or with deflate
//! (gzip), shuffled or not; 4- or 8-byte numbers of exactly the types this
//! machine uses (its byte order, no padding), read as they lie. Anything
//! else, and any chunk whose bytes are not where the file says or do not
//! inflate to exactly a chunk, is left to HDF5 (the caller reads the same
//! elements through it), so that a damaged file gets HDF5's own error.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use hdf5::filters::Filter;
use hdf5::types::{FloatSize, IntSize, TypeDescriptor};
use rayon::prelude::*;

/// A number as an array stores it, little-endian.
pub(super) trait Element: bytemuck::Pod + Send + Sync {
    /// How HDF5 describes an array of them.
    const STORED: TypeDescriptor;
}
impl Element for i32 {
    const STORED: TypeDescriptor = TypeDescriptor::Integer(IntSize::U4);
}
impl Element for i64 {
    const STORED: TypeDescriptor = TypeDescriptor::Integer(IntSize::U8);
}
impl Element for u32 {
    const STORED: TypeDescriptor = TypeDescriptor::Unsigned(IntSize::U4);
}
impl Element for f32 {
    const STORED: TypeDescriptor = TypeDescriptor::Float(FloatSize::U4);
}
impl Element for f64 {
    const STORED: TypeDescriptor = TypeDescriptor::Float(FloatSize::U8);
}

/// Where one chunk's bytes are, and which of the filters it skipped.
#[derive(Clone, Copy)]
struct StoredChunk {
    addr: u64,
    size: u64,
    /// Bit i set: filter i of the pipeline was not applied to this chunk.
    filter_mask: u32,
}

/// One chunked array, read without HDF5.
pub(super) struct DirectArray {
    file: Arc<File>,
    /// Bytes per element.
    width: usize,
    descriptor: TypeDescriptor,
    chunk_elements: usize,
    len: usize,
    /// The pipeline's position of shuffle and of deflate, when present.
    shuffle: Option<u32>,
    deflate: Option<u32>,
    chunks: Vec<StoredChunk>,
    /// The chunk inflated last: a block of rows usually starts in the
    /// chunk where the block before ended.
    last: Mutex<Option<(usize, Arc<Vec<u8>>)>>,
}

/// The largest chunk read directly (writers use a few MiB at most; a file
/// that declares more is left to HDF5, which allocates as it sees fit).
const MOST_CHUNK_BYTES: u64 = 64 << 20;

impl DirectArray {
    /// `ds` read directly from `file` (`file_len` bytes), or None when it
    /// is not an array this reads (HDF5 then reads it).
    pub(super) fn new(ds: &hdf5::Dataset, file: &Arc<File>, file_len: u64) -> Option<DirectArray> {
        let len = ds.size();
        let [chunk_elements] = ds.chunk()?[..] else { return None };
        // The stored type must be exactly one of ours as this machine lays
        // it out (HDF5 would convert anything else: another byte order, a
        // smaller precision, padding).
        let dtype = ds.dtype().ok()?;
        let same = |native: hdf5::Result<hdf5::Datatype>| native.is_ok_and(|n| n == dtype);
        let (descriptor, width) = [
            (i32::STORED, same(hdf5::Datatype::from_type::<i32>()), 4),
            (i64::STORED, same(hdf5::Datatype::from_type::<i64>()), 8),
            (u32::STORED, same(hdf5::Datatype::from_type::<u32>()), 4),
            (f32::STORED, same(hdf5::Datatype::from_type::<f32>()), 4),
            (f64::STORED, same(hdf5::Datatype::from_type::<f64>()), 8),
        ]
        .into_iter()
        .find_map(|(d, is, w)| is.then_some((d, w)))?;
        if chunk_elements == 0 || len == 0 {
            return None;
        }
        let dcpl = ds.dcpl().ok()?;
        // A partial last chunk left unfiltered is not told apart by its mask.
        let partial_unfiltered = dcpl
            .chunk_opts()
            .is_some_and(|o| o.contains(hdf5::plist::dataset_create::ChunkOpts::DONT_FILTER_PARTIAL_CHUNKS));
        if partial_unfiltered && !len.is_multiple_of(chunk_elements) {
            return None;
        }
        let (mut shuffle, mut deflate) = (None, None);
        // (a pipeline HDF5 cannot list is not read here)
        for (at, filter) in dcpl.get_filters().ok()?.iter().enumerate() {
            match filter {
                Filter::Shuffle if shuffle.is_none() && deflate.is_none() => shuffle = Some(at as u32),
                Filter::Deflate(_) if deflate.is_none() => deflate = Some(at as u32),
                _ => return None,
            }
        }
        let chunk_bytes = (chunk_elements as u64).checked_mul(width as u64).filter(|&b| b <= MOST_CHUNK_BYTES)?;
        let most = if deflate.is_some() { chunk_bytes + chunk_bytes / 1024 + 64 } else { chunk_bytes };
        // Every chunk takes some bytes of the file: a declared length the
        // file cannot hold is HDF5's to refuse, not a list to build.
        let n_chunks = len.div_ceil(chunk_elements);
        if n_chunks as u64 > file_len / 8 {
            return None;
        }
        let mut found: Vec<(u64, StoredChunk)> = Vec::new();
        ds.chunks_visit(|c| {
            if found.len() >= n_chunks {
                return 1;
            }
            found.push((
                c.offset.first().copied().unwrap_or(u64::MAX),
                StoredChunk { addr: c.addr, size: c.size, filter_mask: c.filter_mask },
            ));
            0
        })
        .ok()?;
        found.sort_unstable_by_key(|f| f.0);
        // Every chunk written, in place, and inside the file.
        let in_place = found.len() == n_chunks
            && found.iter().enumerate().all(|(k, (offset, c))| {
                *offset == (k * chunk_elements) as u64
                    && c.size <= most
                    && c.addr.checked_add(c.size).is_some_and(|end| end <= file_len)
            });
        in_place.then(|| DirectArray {
            file: file.clone(),
            width,
            descriptor,
            chunk_elements,
            len,
            shuffle,
            deflate,
            chunks: found.into_iter().map(|f| f.1).collect(),
            last: Mutex::new(None),
        })
    }

    /// Whether elements of type `T` are what the array stores.
    fn holds<T: Element>(&self) -> bool {
        T::STORED == self.descriptor && std::mem::size_of::<T>() == self.width
    }

    /// Elements `range`, or None when they are to be read through HDF5 (the
    /// type asked is not the stored one, or a chunk did not come out whole).
    pub(super) fn read<T: Element>(&self, range: Range<usize>) -> Option<Vec<T>> {
        if !self.holds::<T>() || range.start > range.end || range.end > self.len {
            return None;
        }
        if range.is_empty() {
            return Some(Vec::new());
        }
        let first = range.start / self.chunk_elements;
        let last = (range.end - 1) / self.chunk_elements;
        let cached = self.last.lock().ok().and_then(|c| c.clone());
        let decoded: Vec<Option<Arc<Vec<u8>>>> = (first..=last)
            .into_par_iter()
            .map(|k| match &cached {
                Some((at, bytes)) if *at == k => Some(bytes.clone()),
                _ => self.chunk(k).map(Arc::new),
            })
            .collect();
        let mut out: Vec<T> = Vec::with_capacity(range.len());
        for (k, bytes) in (first..=last).zip(&decoded) {
            let bytes = bytes.as_ref()?;
            let start = k * self.chunk_elements;
            let (from, to) = (range.start.max(start) - start, range.end.min(start + self.chunk_elements) - start);
            let wanted = bytes.get(from * self.width..to * self.width)?;
            out.extend(wanted.chunks_exact(self.width).map(bytemuck::pod_read_unaligned::<T>));
        }
        if let (Ok(mut cache), Some(Some(bytes))) = (self.last.lock(), decoded.last()) {
            *cache = Some((last, bytes.clone()));
        }
        Some(out)
    }

    /// Chunk `k`'s elements' bytes, as HDF5 would give them.
    fn chunk(&self, k: usize) -> Option<Vec<u8>> {
        let stored = self.chunks.get(k)?;
        let mut raw = vec![0u8; usize::try_from(stored.size).ok()?];
        self.file.read_exact_at(&mut raw, stored.addr).ok()?;
        let expected = self.chunk_elements * self.width;
        let applied = |at: Option<u32>| at.is_some_and(|i| stored.filter_mask & (1 << i) == 0);
        let inflated = if applied(self.deflate) {
            // The whole stream, its checksum included, and exactly a chunk.
            let mut out = Vec::with_capacity(expected);
            let mut inflater = flate2::Decompress::new(true);
            let status = inflater.decompress_vec(&raw, &mut out, flate2::FlushDecompress::Finish).ok()?;
            if status != flate2::Status::StreamEnd {
                return None;
            }
            out
        } else {
            raw
        };
        if inflated.len() != expected {
            return None;
        }
        Some(if applied(self.shuffle) { unshuffle(&inflated, self.width) } else { inflated })
    }
}

/// Undoes HDF5's shuffle filter: byte j of every element stored together,
/// for j in 0..width, back to each element's bytes side by side.
fn unshuffle(shuffled: &[u8], width: usize) -> Vec<u8> {
    let n = shuffled.len() / width;
    // (bytes past the last whole element stay where they are)
    let mut out = shuffled.to_vec();
    for (j, plane) in shuffled.chunks_exact(n.max(1)).take(width).enumerate() {
        for (i, &b) in plane.iter().enumerate() {
            out[i * width + j] = b;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::h5ad::H5adFile;

    #[test]
    fn unshuffle_puts_each_elements_bytes_back_together() {
        // elements 0x0201, 0x0403, 0x0605 (little-endian), shuffled: low bytes then high bytes
        assert_eq!(unshuffle(&[1, 3, 5, 2, 4, 6], 2), vec![1, 2, 3, 4, 5, 6]);
    }

    /// A CSR matrix of `n_rows` rows written with each array chunked by
    /// `chunk` elements through `filters`: its path, beside the others.
    fn write(dir: &std::path::Path, name: &str, n_rows: usize, chunk: usize, filters: &[Filter]) -> std::path::PathBuf {
        write_with(dir, name, n_rows, chunk, filters, false)
    }

    /// As [`write`]; `edge_unfiltered`: partial edge chunks stored without
    /// the filters.
    fn write_with(
        dir: &std::path::Path,
        name: &str,
        n_rows: usize,
        chunk: usize,
        filters: &[Filter],
        edge_unfiltered: bool,
    ) -> std::path::PathBuf {
        let path = dir.join(format!("{name}.h5ad"));
        let file = hdf5::File::create(&path).unwrap();
        let x = file.create_group("X").unwrap();
        let (mut data, mut indices, mut indptr) = (Vec::<f32>::new(), Vec::<i32>::new(), vec![0i64]);
        for r in 0..n_rows {
            for g in (r % 7..300).step_by(3 + r % 5) {
                indices.push(g as i32);
                data.push(((r * 31 + g) % 11 + 1) as f32);
            }
            indptr.push(data.len() as i64);
        }
        let opts = if edge_unfiltered {
            hdf5::plist::dataset_create::ChunkOpts::DONT_FILTER_PARTIAL_CHUNKS
        } else {
            hdf5::plist::dataset_create::ChunkOpts::empty()
        };
        for (part, ds) in [
            (
                "data",
                x.new_dataset_builder()
                    .with_data(&data)
                    .chunk(chunk)
                    .set_filters(filters)
                    .chunk_opts(opts)
                    .create("data"),
            ),
            (
                "indices",
                x.new_dataset_builder()
                    .with_data(&indices)
                    .chunk(chunk)
                    .set_filters(filters)
                    .chunk_opts(opts)
                    .create("indices"),
            ),
            (
                "indptr",
                x.new_dataset_builder()
                    .with_data(&indptr)
                    .chunk(chunk / 4)
                    .set_filters(filters)
                    .chunk_opts(opts)
                    .create("indptr"),
            ),
        ] {
            ds.unwrap_or_else(|e| panic!("{part}: {e}"));
        }
        let attr = |name: &str, value: &str| {
            let v: hdf5::types::VarLenUnicode = value.parse().unwrap();
            x.new_attr::<hdf5::types::VarLenUnicode>().create(name).unwrap().write_scalar(&v).unwrap();
        };
        attr("encoding-type", "csr_matrix");
        attr("encoding-version", "0.1.0");
        x.new_attr::<i64>().shape(2).create("shape").unwrap().write_raw(&[n_rows as i64, 300]).unwrap();
        path
    }

    #[test]
    fn chunks_read_directly_give_what_hdf5_gives() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&str, &[Filter], bool); 5] = [
            ("plain", &[], true),
            ("gzip", &[Filter::Deflate(4)], true),
            ("shuffled", &[Filter::Shuffle, Filter::Deflate(6)], true),
            ("shuffle-only", &[Filter::Shuffle], true),
            ("checksummed", &[Filter::Deflate(4), Filter::Fletcher32], false),
        ];
        for (name, filters, direct) in cases {
            // 1,000 elements a chunk: blocks of rows start and end inside chunks
            let path = write(dir.path(), name, 700, 1_000, filters);
            let file = H5adFile::open(&path).unwrap();
            let read = file.matrix("X").unwrap();
            assert_eq!(read.direct.iter().all(Option::is_some), direct, "{name}");
            let mut through_hdf5 = file.matrix("X").unwrap();
            through_hdf5.direct = vec![None, None, None];
            for rows in [0..1, 0..700, 3..250, 250..251, 251..600, 600..700, 5..5] {
                assert_eq!(
                    read.read_rows(rows.clone()).unwrap(),
                    through_hdf5.read_rows(rows.clone()).unwrap(),
                    "{name} {rows:?}"
                );
            }
        }
    }

    #[test]
    fn unfiltered_edge_chunks_are_left_to_hdf5() {
        let dir = tempfile::tempdir().unwrap();
        for filters in [&[Filter::Shuffle][..], &[Filter::Deflate(4)]] {
            let path = write_with(dir.path(), "edges", 700, 1_000, filters, true);
            let file = H5adFile::open(&path).unwrap();
            let read = file.matrix("X").unwrap();
            // data and indices end in a partial chunk
            assert!(read.direct[0].is_none() && read.direct[1].is_none(), "{filters:?}");
            let mut through_hdf5 = file.matrix("X").unwrap();
            through_hdf5.direct = vec![None, None, None];
            assert_eq!(read.read_rows(0..700).unwrap(), through_hdf5.read_rows(0..700).unwrap());
        }
    }

    #[test]
    fn a_damaged_chunk_is_left_to_hdf5() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "gzip", 700, 1_000, &[Filter::Deflate(4)]);
        let file = H5adFile::open(&path).unwrap();
        let stored = file.matrix("X").unwrap().direct[0].as_ref().unwrap().chunks[1];
        drop(file);
        // a byte in the middle of data's second chunk flipped
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[(stored.addr + stored.size / 2) as usize] ^= 0x55;
        std::fs::write(&path, &bytes).unwrap();
        let file = H5adFile::open(&path).unwrap();
        let read = file.matrix("X").unwrap();
        let array = read.direct[0].as_ref().unwrap();
        assert!(array.chunk(1).is_none(), "a chunk that does not inflate is not given");
        assert!(array.read::<f32>(0..2_000).is_none());
        assert_eq!(array.read::<f32>(0..1_000).map(|v| v.len()), Some(1_000), "the chunk before is whole");
        // HDF5 then reads those rows, and refuses them
        assert!(read.read_rows(0..700).is_err());
    }
}
