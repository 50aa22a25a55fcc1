//! Ranged reads of objects: the pieces of many keys' ranges requested at
//! once, each checked for its length and for the version it came from.

use std::ops::Range;

use bytes::Bytes;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::{is_not_found, ObjectStorage, COALESCE_GAP};
use crate::storage::{Storage, StorageError};

impl ObjectStorage {
    /// Byte ranges of several keys (each of the version its request's
    /// entity tag names), each answer in its place with its entity tag. Ranges of one key closer
    /// than [`COALESCE_GAP`] are fetched as one piece, and the pieces of
    /// every key are requested at once (at most [`PIECES_IN_FLIGHT`] in
    /// flight): a gather's chunks in many tiles cost one round trip of
    /// latency, not one per tile or per ten ranges. Pieces of one key that
    /// came from two versions (it was replaced between them) are
    /// [`StorageError::Changed`], never joined.
    pub(super) async fn fetch_all(&self, requests: &[Request<'_>]) -> Vec<crate::storage::PinnedRanges> {
        use futures::StreamExt;
        let mut answers: Vec<Option<crate::storage::PinnedRanges>> = Vec::with_capacity(requests.len());
        let mut pieces: Vec<Vec<Range<u64>>> = Vec::with_capacity(requests.len());
        for &(key, ranges, etag) in requests {
            if let Some(r) = ranges.iter().find(|r| r.start > r.end) {
                let location = self.location(key);
                answers.push(Some(Err(StorageError::Range { location, start: r.start, end: r.end, size: 0 })));
                pieces.push(Vec::new());
            } else if ranges.iter().all(|r| r.start == r.end) {
                let answer = self.sizes_only(key, ranges).await;
                answers.push(Some(answer.map(|a| a.map(|parts| (parts, etag.map(str::to_string))))));
                pieces.push(Vec::new());
            } else {
                answers.push(None);
                pieces.push(crate::storage::merge_ranges(ranges.to_vec(), COALESCE_GAP));
            }
        }
        let paths: Vec<StorePath> = requests.iter().map(|(key, _, _)| self.path(key)).collect();
        let wanted = pieces.iter().enumerate().flat_map(|(i, p)| p.iter().map(move |r| (i, r.clone())));
        let fetched: Vec<(usize, Result<Tagged, Fetch>)> = futures::stream::iter(wanted)
            .map(|(i, range)| {
                let path = &paths[i];
                async move { (i, self.fetch_piece(path, range, requests[i].2).await) }
            })
            .buffered(PIECES_IN_FLIGHT)
            .collect()
            .await;
        let mut fetched = fetched.into_iter().peekable();
        for (i, answer) in answers.iter_mut().enumerate() {
            if answer.is_some() {
                continue;
            }
            let mut got = Vec::with_capacity(pieces[i].len());
            while let Some((_, piece)) = fetched.next_if(|(j, _)| *j == i) {
                got.push(piece);
            }
            let (key, ranges, etag) = requests[i];
            *answer = Some(match got.into_iter().collect::<Result<Vec<Tagged>, Fetch>>() {
                Ok(parts) => {
                    let tag = parts.first().and_then(|(_, t)| t.clone());
                    if parts.iter().any(|(_, t)| *t != tag) {
                        let was = tag.unwrap_or_default();
                        Err(StorageError::Changed { location: self.location(key), etag: was })
                    } else {
                        let bytes: Vec<Bytes> = parts.into_iter().map(|(b, _)| b).collect();
                        Ok(Some((cut(ranges, &pieces[i], &bytes), tag.or_else(|| etag.map(str::to_string)))))
                    }
                }
                Err(e) => self.settle(key, e, etag),
            });
        }
        answers.into_iter().flatten().collect()
    }

    /// The answer to ranges that are all empty: the object must still
    /// exist, and be long enough.
    async fn sizes_only(&self, key: &str, ranges: &[Range<u64>]) -> crate::storage::ManyRanges {
        let head = self.store.head(&self.path(key)).await;
        self.stats.record(0);
        let size = match head {
            Ok(meta) => meta.size,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(self.err(key, e)),
        };
        if let Some(r) = ranges.iter().find(|r| r.end > size) {
            return Err(StorageError::Range { location: self.location(key), start: r.start, end: r.end, size });
        }
        Ok(Some(vec![Bytes::new(); ranges.len()]))
    }

    /// One piece: a ranged request, its length checked; with the entity
    /// tag of the object it came from.
    async fn fetch_piece(&self, path: &StorePath, range: Range<u64>, etag: Option<&str>) -> Result<Tagged, Fetch> {
        // If-Match compares tags strongly (RFC 9110): a weak tag (`W/"..."`)
        // never matches, so it is not sent; the answer's tag is compared
        // with it below instead, as it is for a server that ignores If-Match.
        let options = object_store::GetOptions {
            range: Some(range.clone().into()),
            if_match: etag.filter(|t| !t.starts_with("W/")).map(str::to_string),
            ..Default::default()
        };
        let got = self.store.get_opts(path, options).await.map_err(Fetch::Store)?;
        let tag = got.meta.e_tag.clone();
        if let (Some(want), Some(have)) = (etag, tag.as_deref()) {
            if want != have {
                return Err(Fetch::Changed);
            }
        }
        let bytes = got.bytes().await.map_err(Fetch::Store)?;
        self.stats.record(bytes.len() as u64);
        if bytes.len() as u64 != range.end - range.start {
            return Err(Fetch::Short { range, got: bytes.len() as u64 });
        }
        Ok((bytes, tag))
    }

    /// A failed piece of `key` as the answer to its request.
    fn settle(&self, key: &str, e: Fetch, etag: Option<&str>) -> crate::storage::PinnedRanges {
        match e {
            Fetch::Store(e) if is_not_found(&e) => Ok(None),
            Fetch::Store(object_store::Error::Precondition { .. }) if etag.is_some() => {
                Err(StorageError::Changed { location: self.location(key), etag: etag.unwrap_or_default().to_string() })
            }
            Fetch::Changed => {
                Err(StorageError::Changed { location: self.location(key), etag: etag.unwrap_or_default().to_string() })
            }
            Fetch::Store(e) => Err(self.err(key, e)),
            Fetch::Short { range, got } => Err(StorageError::Range {
                location: self.location(key),
                start: range.start,
                end: range.end,
                size: range.start + got,
            }),
        }
    }
}

/// A key, its ranges and the entity tag of the version to read (if any).
pub(super) type Request<'a> = (&'a str, &'a [Range<u64>], Option<&'a str>);
/// A piece's bytes, with the entity tag of the object they came from.
type Tagged = (Bytes, Option<String>);

/// Each of `ranges` cut out of the fetched `pieces` (sorted, from
/// [`crate::storage::merge_ranges`]: each range lies whole in one).
fn cut(ranges: &[Range<u64>], pieces: &[Range<u64>], fetched: &[Bytes]) -> Vec<Bytes> {
    ranges
        .iter()
        .map(|r| {
            let k = pieces.partition_point(|p| p.start <= r.start).saturating_sub(1);
            match (pieces.get(k), fetched.get(k)) {
                (Some(p), Some(bytes)) if r.start >= p.start && r.end <= p.end => {
                    bytes.slice((r.start - p.start) as usize..(r.end - p.start) as usize)
                }
                // (an empty range outside every piece)
                _ => Bytes::new(),
            }
        })
        .collect()
}

/// Pieces of one call's ranges requested at once, at most.
const PIECES_IN_FLIGHT: usize = 256;

/// Why one request of a `get_ranges` failed.
enum Fetch {
    Store(object_store::Error),
    /// The store answered with another version than the one asked for.
    Changed,
    /// The store sent fewer bytes than the range asked for (past the end).
    Short {
        range: Range<u64>,
        got: u64,
    },
}
