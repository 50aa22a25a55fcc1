use std::fs::File;
use std::io::{ErrorKind, Read};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::{IoStats, Spool, Storage, StorageError};

/// A dataset in a local folder. Reads are positional; writes go to a temporary
/// name in the same folder and are renamed into place.
#[derive(Debug)]
pub struct LocalStorage {
    root: PathBuf,
    stats: IoStats,
    buffers: Arc<FileBuffers>,
}

/// Buffers of files read (whole, by [`Storage::get`], or in ranges), each
/// given back when the last [`Bytes`] of it is dropped and used for the
/// next read: a loader reads one tile after another, and reading each into
/// fresh memory cost page faults for it and the pages given back after
/// (under perf, 6% of a warm epoch's time on 100,000 atlas cells). On 1,000,000 cells, 7 runs
/// alternated: the epoch 1.10x as fast (median of 14 epochs), its peak
/// memory 7% higher (303-316 MiB against 282-295).
///
/// It keeps as many buffers, and as many bytes of them, as its readers have
/// held at once (within [`KEPT_FILE_BUFFERS`] and [`KEPT_FILE_BYTES`]), so
/// that what it keeps is never more than its readers held at their peak:
/// a loader's window holds 8 tiles and its fetcher reads ahead, and a
/// gather holds the ranges of every tile it touches (a hundred at a
/// million cells); keeping 4 buffers of at least 256 KiB, as before, left
/// a dataset of a few tiles faulting in most of them again every epoch,
/// and every gather's ranges fresh.
#[derive(Debug, Default)]
struct FileBuffers {
    state: Mutex<Kept>,
}

/// The buffers a [`FileBuffers`] keeps, and what it has lent.
#[derive(Debug, Default)]
struct Kept {
    /// Oldest given back first.
    free: Vec<Vec<u8>>,
    free_bytes: usize,
    /// Buffers lent and not yet given back, and their bytes; the most of
    /// each at once.
    lent: usize,
    lent_bytes: usize,
    most_lent: usize,
    most_lent_bytes: usize,
}

/// Buffers kept at least (when readers have held fewer at once) and at most.
const KEPT_FILE_BUFFERS: std::ops::RangeInclusive<usize> = 4..=256;

/// Bytes of buffers kept at most, however many readers have held at once.
const KEPT_FILE_BYTES: usize = 256 << 20;

/// Buffers kept are of at least this many bytes (jemalloc serves smaller
/// ones from pages it keeps anyway) and at most that many (a larger one goes
/// back to the system).
const KEPT_FILE_SIZES: std::ops::RangeInclusive<usize> = (16 << 10)..=(64 << 20);

/// A buffer of [`FileBuffers`], lent to a [`Bytes`].
struct Lent {
    buf: Vec<u8>,
    home: std::sync::Weak<FileBuffers>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let Some(home) = self.home.upgrade() else { return };
        let Ok(mut kept) = home.state.lock() else { return };
        let bytes = self.buf.capacity();
        kept.lent = kept.lent.saturating_sub(1);
        kept.lent_bytes = kept.lent_bytes.saturating_sub(bytes);
        if !KEPT_FILE_SIZES.contains(&bytes) {
            return;
        }
        kept.free.push(std::mem::take(&mut self.buf));
        kept.free_bytes += bytes;
        // (the longest kept make room: the sizes read lately are kept)
        let most = kept.most_lent.clamp(*KEPT_FILE_BUFFERS.start(), *KEPT_FILE_BUFFERS.end());
        let most_bytes = kept.most_lent_bytes.min(KEPT_FILE_BYTES);
        let mut evicted = 0;
        while kept.free.len() - evicted > most || kept.free_bytes > most_bytes {
            kept.free_bytes -= kept.free[evicted].capacity();
            evicted += 1;
        }
        kept.free.drain(..evicted);
    }
}

impl FileBuffers {
    /// An empty buffer for `want` bytes: the last kept one that holds them
    /// and is at most twice as large (so that a small read, which its reader
    /// may keep, does not hold a large buffer), or a new one, made an eighth
    /// larger when it may be kept: the next file, a little larger, then fits
    /// it (made exactly, a kept buffer too small for the next tile sat idle
    /// beside a new one, and a loader's peak memory grew by a fifth).
    fn take(&self, want: usize) -> Vec<u8> {
        let kept = self.state.lock().ok().and_then(|mut kept| {
            let at = kept.free.iter().rposition(|b| (want..=want.saturating_mul(2)).contains(&b.capacity()))?;
            let buf = kept.free.remove(at);
            kept.free_bytes -= buf.capacity();
            Some(buf)
        });
        let mut buf = kept.unwrap_or_else(|| {
            let room = want.saturating_add(want / 8);
            if KEPT_FILE_SIZES.contains(&room) {
                Vec::with_capacity(room)
            } else {
                Vec::new()
            }
        });
        buf.clear();
        buf
    }

    /// `buf`, filled, lent to the [`Bytes`] returned; it comes back here
    /// when they are dropped.
    fn lend(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        if let Ok(mut kept) = self.state.lock() {
            kept.lent += 1;
            kept.lent_bytes += buf.capacity();
            kept.most_lent = kept.most_lent.max(kept.lent);
            kept.most_lent_bytes = kept.most_lent_bytes.max(kept.lent_bytes);
        }
        Bytes::from_owner(Lent { buf, home: Arc::downgrade(self) })
    }
}

/// The buffers every [`LocalStorage`] of the process reads into. One set,
/// not one per dataset: a collection's loader reads its members' tiles one
/// after another, and with a set per member each kept a tile or more of its
/// own: what was kept grew with the members, not with what the readers held
/// at once. A shuffled epoch of 100 members of 10,000 atlas cells peaked at
/// 882 MiB, 2.6x one of 10 members (334 MiB); with one set, 377 MiB.
static SHARED_BUFFERS: std::sync::LazyLock<Arc<FileBuffers>> = std::sync::LazyLock::new(Arc::default);

impl LocalStorage {
    /// The dataset in folder `root` (which need not exist yet, for writing).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalStorage { root: root.into(), stats: IoStats::default(), buffers: SHARED_BUFFERS.clone() }
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> PathBuf {
        if key.is_empty() {
            self.root.clone()
        } else {
            self.root.join(key)
        }
    }

    fn io_err(&self, key: &str, source: std::io::Error) -> StorageError {
        StorageError::Io { location: self.location(key), source }
    }
}

/// A temporary file in `dir` (named `.deltacells-*.tmp`, so that an interrupted
/// writer's leftovers can be recognised) that will be renamed into place.
///
/// tempfile creates private (0600) files, and the mode survives the rename; a
/// dataset or cache file must instead get the mode of any file this process
/// creates (0666 less the umask, 0644 under the usual 022), so that the other
/// accounts of a team can read what one of them wrote.
pub(crate) fn temp_file_in(dir: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .prefix(".deltacells-")
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)
}

fn missing_is_none<T>(r: std::io::Result<T>) -> std::io::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl LocalStorage {
    /// Ranges of `key`, from one open file, with the file's identity (see
    /// [`identity`]); a file whose identity is not `etag` (when given) is
    /// [`StorageError::Changed`].
    fn read_ranges(
        &self,
        key: &str,
        ranges: &[Range<u64>],
        etag: Option<&str>,
    ) -> Result<Option<(Vec<Bytes>, String)>, StorageError> {
        let Some(file) = missing_is_none(File::open(self.path(key))).map_err(|e| self.io_err(key, e))? else {
            return Ok(None);
        };
        let meta = file.metadata().map_err(|e| self.io_err(key, e))?;
        let tag = identity(&meta);
        if let Some(want) = etag.filter(|want| *want != tag) {
            return Err(StorageError::Changed { location: self.location(key), etag: want.to_string() });
        }
        let size = meta.len();
        if let Some(r) = ranges.iter().find(|r| r.start > r.end || r.end > size) {
            return Err(StorageError::Range { location: self.location(key), start: r.start, end: r.end, size });
        }
        // One buffer for all the ranges (each answer a slice of it), a kept
        // one where it is large: a gather reads hundreds of small ranges of
        // a tile, or a whole tile for its CRC, and fresh memory for each
        // cost more in allocations and page faults than the reads.
        let total: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        let mut buf = self.buffers.take(total as usize);
        buf.resize(total as usize, 0);
        let mut at = 0usize;
        for r in ranges {
            let n = (r.end - r.start) as usize;
            file.read_exact_at(&mut buf[at..at + n], r.start).map_err(|e| self.io_err(key, e))?;
            self.stats.record(n as u64);
            at += n;
        }
        let buf = self.buffers.lend(buf);
        let mut at = 0usize;
        let out = ranges
            .iter()
            .map(|r| {
                let n = (r.end - r.start) as usize;
                at += n;
                buf.slice(at - n..at)
            })
            .collect();
        Ok(Some((out, tag)))
    }
}

/// A local file's version, as an entity tag: its inode, size and times of
/// change. A writer that replaces a file renames a new one over it (another
/// inode, and a new change time even where the inode number comes back);
/// one that writes it in place changes its times.
fn identity(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    format!(
        "{:x}-{:x}-{:x}-{}.{}-{}.{}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    )
}

impl Storage for LocalStorage {
    fn location(&self, key: &str) -> String {
        self.path(key).display().to_string()
    }

    fn try_lock_root(&self) -> Result<super::RootLock, StorageError> {
        let Ok(folder) = std::fs::File::open(&self.root) else {
            return Ok(super::RootLock::Unsupported); // not there (yet), or not a folder one can open
        };
        match folder.try_lock() {
            Ok(()) => Ok(super::RootLock::Held(folder)),
            Err(std::fs::TryLockError::WouldBlock) => Ok(super::RootLock::Busy { holder: None }),
            Err(std::fs::TryLockError::Error(_)) => Ok(super::RootLock::Unsupported),
        }
    }

    fn size(&self, key: &str) -> Result<Option<u64>, StorageError> {
        let meta = missing_is_none(std::fs::metadata(self.path(key))).map_err(|e| self.io_err(key, e))?;
        Ok(meta.filter(|m| m.is_file()).map(|m| m.len()))
    }

    fn get(&self, key: &str) -> Result<Option<Bytes>, StorageError> {
        let Some(mut file) = missing_is_none(File::open(self.path(key))).map_err(|e| self.io_err(key, e))? else {
            return Ok(None);
        };
        let size = file.metadata().map_err(|e| self.io_err(key, e))?.len();
        let mut buf = self.buffers.take(usize::try_from(size).unwrap_or(usize::MAX));
        file.read_to_end(&mut buf).map_err(|e| self.io_err(key, e))?;
        self.stats.record(buf.len() as u64);
        Ok(Some(self.buffers.lend(buf)))
    }

    fn version(&self, key: &str) -> Result<Option<super::Version>, StorageError> {
        let meta = missing_is_none(std::fs::metadata(self.path(key))).map_err(|e| self.io_err(key, e))?;
        Ok(meta.filter(|m| m.is_file()).map(|m| super::Version { size: m.len(), etag: Some(identity(&m)) }))
    }

    fn get_ranges(&self, key: &str, ranges: &[Range<u64>]) -> Result<Option<Vec<Bytes>>, StorageError> {
        Ok(self.read_ranges(key, ranges, None)?.map(|(parts, _)| parts))
    }

    fn get_ranges_of(
        &self,
        key: &str,
        ranges: &[Range<u64>],
        etag: Option<&str>,
    ) -> Result<Option<Vec<Bytes>>, StorageError> {
        Ok(self.read_ranges(key, ranges, etag)?.map(|(parts, _)| parts))
    }

    fn get_ranges_pinned(&self, requests: &[super::PinnedRequest]) -> Vec<super::PinnedRanges> {
        requests
            .iter()
            .map(|r| Ok(self.read_ranges(&r.key, &r.ranges, r.etag.as_deref())?.map(|(p, tag)| (p, Some(tag)))))
            .collect()
    }

    fn is_local(&self) -> bool {
        true
    }

    fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
        let path = self.path(key);
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| self.io_err(key, e))?;
        let mut tmp = temp_file_in(dir).map_err(|e| self.io_err(key, e))?;
        std::io::Write::write_all(&mut tmp, &data).map_err(|e| self.io_err(key, e))?;
        tmp.as_file().sync_data().map_err(|e| self.io_err(key, e))?;
        tmp.persist(&path).map_err(|e| self.io_err(key, e.error))?;
        self.stats.record_upload(data.len() as u64);
        Ok(())
    }

    fn spool(&self, key: &str) -> Result<Spool, StorageError> {
        let path = self.path(key);
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| self.io_err(key, e))?;
        Ok(Spool { file: temp_file_in(dir).map_err(|e| self.io_err(key, e))? })
    }

    fn put_spooled(&self, key: &str, spool: Spool) -> Result<(), StorageError> {
        let path = self.path(key);
        // A spool made elsewhere (another storage's) is copied, not renamed.
        if spool.file.path().parent() != path.parent() {
            return self.put(key, spool.into_bytes().map_err(|e| self.io_err(key, e))?);
        }
        let file = spool.file;
        file.as_file().sync_data().map_err(|e| self.io_err(key, e))?;
        let len = file.as_file().metadata().map_err(|e| self.io_err(key, e))?.len();
        file.persist(&path).map_err(|e| self.io_err(key, e.error))?;
        self.stats.record_upload(len);
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<(), StorageError> {
        let path = self.path(key);
        missing_is_none(std::fs::remove_file(&path)).map_err(|e| self.io_err(key, e))?;
        // Folders left empty go too, as they would in an object store; a
        // folder that is not empty stops the walk.
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| d.starts_with(&self.root) && *d != self.root) {
            if std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), StorageError> {
        let target = self.path(to);
        std::fs::create_dir_all(target.parent().unwrap_or(Path::new("."))).map_err(|e| self.io_err(to, e))?;
        std::fs::rename(self.path(from), &target).map_err(|e| self.io_err(from, e))?;
        // The rename is durable once its folder is.
        if let Some(dir) = target.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(|e| self.io_err(to, e))?;
        }
        // Folders the move left empty go, as delete's do.
        let mut dir = self.path(from).parent().map(Path::to_path_buf);
        while let Some(d) = dir.filter(|d| d.starts_with(&self.root) && *d != self.root) {
            if std::fs::remove_dir(&d).is_err() {
                break;
            }
            dir = d.parent().map(Path::to_path_buf);
        }
        Ok(())
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let mut out = Vec::new();
        let mut stack = vec![prefix.trim_end_matches('/').to_string()];
        while let Some(dir) = stack.pop() {
            let Some(entries) =
                missing_is_none(std::fs::read_dir(self.path(&dir))).map_err(|e| self.io_err(&dir, e))?
            else {
                continue;
            };
            for entry in entries {
                let entry = entry.map_err(|e| self.io_err(&dir, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let key = if dir.is_empty() { name } else { format!("{dir}/{name}") };
                if entry.file_type().map_err(|e| self.io_err(&key, e))?.is_dir() {
                    stack.push(key);
                } else {
                    out.push(key);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    fn stats(&self) -> &IoStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many buffers, and bytes of them, `buffers` keeps after its
    /// readers held `n` of `size` bytes at once.
    fn kept_after_holding(buffers: &Arc<FileBuffers>, n: usize, size: usize) -> (usize, usize) {
        let held: Vec<Bytes> = (0..n).map(|_| buffers.lend(vec![7u8; size])).collect();
        drop(held);
        let state = buffers.state.lock().unwrap();
        assert_eq!(state.free.iter().map(Vec::capacity).sum::<usize>(), state.free_bytes);
        (state.free.len(), state.free_bytes)
    }

    #[test]
    fn as_many_buffers_are_kept_as_readers_held_at_once_within_bounds() {
        let buffers = Arc::new(FileBuffers::default());
        let kb = 100 << 10;
        assert_eq!(kept_after_holding(&buffers, 2, kb), (2, 2 * kb));
        assert_eq!(kept_after_holding(&buffers, 10, kb).0, 10, "a loader's window and read-ahead");
        assert_eq!(kept_after_holding(&buffers, 3, kb).0, 10, "kept from the peak, not the last");
        assert_eq!(kept_after_holding(&buffers, 400, kb).0, *KEPT_FILE_BUFFERS.end());
        let state = buffers.state.lock().unwrap();
        assert_eq!((state.lent, state.lent_bytes, state.most_lent), (0, 0, 400));
        drop(state);
        // bytes: never more than were lent at once, nor KEPT_FILE_BYTES
        let big = Arc::new(FileBuffers::default());
        assert_eq!(kept_after_holding(&big, 1, 8 << 20), (1, 8 << 20));
        assert_eq!(kept_after_holding(&big, 1, 20 << 20), (1, 20 << 20), "20 MiB held at most, not 28");
        assert_eq!(kept_after_holding(&big, 2, 20 << 20), (2, 40 << 20));
        assert_eq!(kept_after_holding(&big, 20, 60 << 20).1, 4 * (60 << 20), "{KEPT_FILE_BYTES}");
        // a small file's buffer is not kept, nor one larger than 64 MiB
        let other = Arc::new(FileBuffers::default());
        assert_eq!(kept_after_holding(&other, 3, 1000), (0, 0));
        assert_eq!(kept_after_holding(&other, 1, 65 << 20), (0, 0));
    }

    #[test]
    fn every_local_dataset_of_a_process_reads_into_one_set_of_kept_buffers() {
        // (a set per dataset kept a tile or more per member of a collection)
        let (a, b) = (LocalStorage::new("/one"), LocalStorage::new("/other"));
        assert!(Arc::ptr_eq(&a.buffers, &b.buffers));
        assert!(Arc::ptr_eq(&a.buffers, &SHARED_BUFFERS));
    }
}
