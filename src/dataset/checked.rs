//! The tiles of a local dataset whose CRC some process on this machine has
//! checked, each with the version of its file that was checked (its
//! identity: device, inode, size, modification and change times), kept in
//! the cache folder so that the check is paid once per version of a tile
//! on a machine rather than once per process.
//!
//! A gather reads only the chunks its cells are in, which cannot show
//! whether the rest of the tile, and so its CRC, is intact; a local tile is
//! therefore read whole, CRC checked, the first time a gather touches it.
//! A random batch of a large dataset touches nearly every tile, so each
//! new process paid a read of the whole store before its gathers ran at
//! their speed. A file changed on disk by any write has a new change time
//! (which no program can set), so its version is not the one recorded and
//! it is checked again.
//!
//! The record is a cache: one line per checked version, `tile etag`,
//! appended by every process that checks a tile; a line it cannot read is
//! skipped, a record it cannot read or write is as good as none, and no
//! read ever fails because of it.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use super::ReadOptions;
use crate::obs::localize::cache_root;
use crate::storage::Storage;

/// A record larger than this is not read (it is a cache: the tiles are
/// checked again) and not added to.
const MAX_RECORD_BYTES: u64 = 64 << 20;

/// The checked tiles of one open dataset: in memory always, and in the
/// record file too for a dataset in a local folder, remembering on.
pub(crate) struct CheckedRecord {
    file: Option<PathBuf>,
    /// The lines checked, those of the record file read the first time
    /// they are asked for.
    known: Mutex<Option<HashSet<String>>>,
}

impl CheckedRecord {
    /// The record of the dataset in `storage`, in the cache folder
    /// `options` name (in memory only when they do not remember checks).
    pub(crate) fn new(storage: &dyn Storage, options: &ReadOptions) -> Self {
        let cache_root = options.remember_checks.then(|| cache_root(options.cache_dir.as_deref()));
        let file = cache_root.filter(|_| storage.is_local()).and_then(|root| {
            let manifest = PathBuf::from(storage.location(crate::format::MANIFEST_KEY));
            let folder = manifest.parent()?.canonicalize().ok()?;
            let digest = <sha2::Sha256 as sha2::Digest>::digest(folder.as_os_str().as_encoded_bytes());
            Some(root.join("checked-tiles").join(format!("{}.txt", &hex::encode(digest)[..24])))
        });
        CheckedRecord { file, known: Mutex::new(None) }
    }

    /// The version of tile `tile`'s file in `storage` now, where checks
    /// are written to the record file (a local dataset, remembering on),
    /// taken before a tile is read whole for [`CheckedRecord::add_if_unchanged`].
    pub(crate) fn version(&self, storage: &dyn Storage, tile: usize) -> Option<String> {
        self.file.as_ref()?;
        storage.version(&crate::format::tile_key(tile)).ok().flatten().and_then(|v| v.etag)
    }

    /// Records tile `tile`, read whole and found sound, as checked when its
    /// file is still the version `before` ([`CheckedRecord::version`] before
    /// the read): the same version before and after is the one checked.
    pub(crate) fn add_if_unchanged(&self, storage: &dyn Storage, tile: usize, before: Option<String>) {
        if let Some(version) = before.filter(|v| self.version(storage, tile).as_ref() == Some(v)) {
            self.add(tile, &version);
        }
    }

    /// Whether tile `tile`'s file, in the version `identity` names, was
    /// checked.
    pub(super) fn contains(&self, tile: usize, identity: &str) -> bool {
        self.with_known(|known| known.contains(&line(tile, identity)))
    }

    /// Records that tile `tile`'s file, in the version `identity` names, was
    /// checked: in memory, and in the record file when `identity` is a
    /// version the storage told (not a stand-in such as the file's size).
    pub(super) fn add_checked(&self, tile: usize, identity: &str, told: bool) {
        let entry = line(tile, identity);
        let new = self.with_known(|known| known.insert(entry.clone()));
        let Some(file) = self.file.as_ref().filter(|_| new && told) else { return };
        if file.metadata().is_ok_and(|m| m.len() > MAX_RECORD_BYTES) {
            return;
        }
        let append = || -> std::io::Result<()> {
            if let Some(folder) = file.parent() {
                std::fs::create_dir_all(folder)?;
            }
            // one write of a whole line: processes that append at once do
            // not mix their lines
            let mut out = std::fs::OpenOptions::new().create(true).append(true).open(file)?;
            out.write_all(format!("{entry}\n").as_bytes())
        };
        let _ = append();
    }

    fn add(&self, tile: usize, version: &str) {
        self.add_checked(tile, version, true);
    }

    fn with_known<T>(&self, f: impl FnOnce(&mut HashSet<String>) -> T) -> T {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        f(known.get_or_insert_with(|| self.read()))
    }

    fn read(&self) -> HashSet<String> {
        let Some(file) = &self.file else { return HashSet::new() };
        let small = file.metadata().is_ok_and(|m| m.len() <= MAX_RECORD_BYTES);
        let text = if small { std::fs::read(file).unwrap_or_default() } else { Vec::new() };
        let well_formed = |l: &&str| {
            l.split_once(' ').is_some_and(|(tile, etag)| tile.parse::<usize>().is_ok() && !etag.contains(' '))
        };
        String::from_utf8_lossy(&text).lines().filter(well_formed).map(str::to_string).collect()
    }
}

fn line(tile: usize, etag: &str) -> String {
    // an identity has no spaces or line ends; one that had could not be
    // told from another line
    format!("{tile} {}", etag.replace([' ', '\n', '\r'], "_"))
}
