//! The files of a Matrix Market input, local or at a URL, gzip-compressed or
//! not, read as streams of text.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::sync::Arc;

use crate::inputs::error::{Cause, Whole};
use crate::inputs::remote::{self, RangedFile, ReadOf, RemoteOptions};
use crate::storage::StorageError;

/// A file of an input: a local path or an object at a URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Place {
    File(PathBuf),
    Url(String),
}

impl Place {
    /// Its name, for messages.
    pub(super) fn name(&self) -> String {
        match self {
            Place::File(p) => p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into()),
            Place::Url(u) => crate::redact::redact(u.rsplit('/').next().unwrap_or(u)).into_owned(),
        }
    }

    /// The file named `name` beside this one, if it exists.
    pub(super) fn sibling(&self, name: &str, remote: &RemoteOptions) -> Option<Place> {
        match self {
            Place::File(p) => {
                let other = p.with_file_name(name);
                other.is_file().then_some(Place::File(other))
            }
            Place::Url(u) => {
                let base = &u[..u.rfind('/').map_or(0, |i| i + 1)];
                let other = format!("{base}{name}");
                remote::object_version(&other, &remote.store).ok().map(|_| Place::Url(other))
            }
        }
    }

    /// What identifies this version of the file: its size and modification
    /// time, or its size and entity tag.
    pub(super) fn version(&self, remote: &RemoteOptions) -> Result<String, Cause> {
        match self {
            Place::File(p) => {
                let m = std::fs::metadata(p)?;
                let modified = m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
                Ok(format!("{} {:?}", m.len(), modified))
            }
            Place::Url(u) => {
                let v = remote::object_version(u, &remote.store)?;
                Ok(format!("{} {:?}", v.size, v.etag))
            }
        }
    }

    /// Its bytes, as a stream (decompressed when they are gzip).
    pub(super) fn open(&self, remote: &RemoteOptions) -> Result<Box<dyn BufRead + Send>, Cause> {
        let raw: Box<dyn Read + Send> = match self {
            Place::File(p) => Box::new(std::fs::File::open(p)?),
            Place::Url(u) => match remote::downloaded(u, remote)? {
                Some(local) => Box::new(std::fs::File::open(local)?),
                None => Box::new(UrlReader::open(u, remote)?),
            },
        };
        let mut buffered = BufReader::with_capacity(1 << 20, raw);
        let head = buffered.fill_buf()?;
        if head.starts_with(&[0x1f, 0x8b]) {
            Ok(Box::new(BufReader::with_capacity(1 << 20, flate2::bufread::MultiGzDecoder::new(buffered))))
        } else {
            Ok(Box::new(buffered))
        }
    }
}

/// An object at a URL read from start to end, fetched ahead.
struct UrlReader {
    file: Arc<RangedFile>,
    at: u64,
}

impl UrlReader {
    pub(super) fn open(url: &str, remote: &RemoteOptions) -> Result<UrlReader, StorageError> {
        let file = RangedFile::open(url, &remote.store, remote.block_cache)?;
        file.set_extents(std::slice::from_ref(&(0..file.size())));
        remote::prefetch_whole(&file, &[0]);
        Ok(UrlReader { file, at: 0 })
    }
}

impl Read for UrlReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (self.file.size().saturating_sub(self.at)).min(buf.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.file.read(self.at, &mut buf[..n], ReadOf::Data).map_err(std::io::Error::other)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// A failure at a line of a file (0: not at a line).
pub(super) type LineError = (u64, LineProblem);

/// What failed at a line: a rule of the format it breaks, or the reading of
/// it (or the writing of the entries sorted), with the error under it.
#[derive(Debug, thiserror::Error)]
pub(super) enum LineProblem {
    /// A rule broken (the message says which).
    #[error("{0}")]
    Rule(String),
    #[error("the gzip stream ends early (a truncated file)")]
    Truncated,
    /// A gzip stream that does not decode: the decoder's error reads inside
    /// the parentheses (where no `source()` prints), so it is no source.
    #[error("the gzip stream is corrupt ({0})")]
    Corrupt(std::io::Error),
    /// A read that failed: the system's error, or the store's as an
    /// `io::Error`'s text (kept whole, as it printed).
    #[error("cannot be read")]
    Unread(#[source] Whole<std::io::Error>),
    #[error("cannot write the temporary file of sorted entries ($TMPDIR)")]
    Temporary(#[source] std::io::Error),
}

impl From<String> for LineProblem {
    fn from(message: String) -> Self {
        LineProblem::Rule(message)
    }
}

impl From<&str> for LineProblem {
    fn from(message: &str) -> Self {
        LineProblem::Rule(message.to_string())
    }
}

/// Says what a failed read of text means: a gzip stream that ends early or
/// does not decode, or the read's own failure.
fn read_failure(e: std::io::Error) -> LineProblem {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => LineProblem::Truncated,
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => LineProblem::Corrupt(e),
        _ => LineProblem::Unread(Whole(e)),
    }
}

/// The longest line read: far above any line of a matrix, features or
/// barcodes file, so that a file without line ends (or a gzip stream that
/// decodes to gigabytes of one) is refused instead of held whole.
pub(super) const MAX_LINE: usize = 1 << 20;

/// Reads the next line of `stream`, its end included, into `line` (cleared
/// first): its length, 0 at the end of the file; a failure's reason.
pub(super) fn read_line(stream: &mut dyn BufRead, line: &mut Vec<u8>) -> Result<usize, LineProblem> {
    line.clear();
    let n = stream.take(MAX_LINE as u64 + 1).read_until(b'\n', line).map_err(read_failure)?;
    if n > MAX_LINE {
        return Err(format!("a line longer than {MAX_LINE} bytes: not a text file of this format").into());
    }
    Ok(n)
}

/// The lines of a tab-separated text file (`stream`, as [`Place::open`]
/// gives it), each split into its fields.
pub(super) fn read_tsv(mut stream: Box<dyn BufRead + Send>) -> Result<Vec<Vec<String>>, LineError> {
    let mut rows = Vec::new();
    let mut line = Vec::new();
    for n in 1u64.. {
        if read_line(stream.as_mut(), &mut line).map_err(|m| (n, m))? == 0 {
            break;
        }
        let line = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = std::str::from_utf8(line).map_err(|_| (n, LineProblem::from("is not UTF-8 text")))?;
        let text = text.strip_suffix('\r').unwrap_or(text);
        if text.is_empty() {
            continue;
        }
        rows.push(text.split('\t').map(str::to_string).collect());
    }
    Ok(rows)
}
