//! The fetching stage: the share's tiles in plan order, still compressed
//! ([`Fetched`]), a few at a time in parallel, each dataset opened when a
//! tile of it first comes up. Each tile is checked whole (CRC included)
//! here, against the manifest of the version it is of (a writer may have
//! replaced it since the dataset was opened: the dataset then reads it
//! from the later version, see `dataset/follow.rs`); it is decompressed by
//! the decoding stage.

use std::sync::mpsc::SyncSender;

use super::options::{panic_text, LoaderError};
use super::plan::{EpochPlan, Unit};
use super::source::{OpenMember, TileSource};

/// A tile fetched, still compressed, with its dataset.
#[derive(Clone)]
pub(super) struct Fetched {
    pub(super) blob: bytes::Bytes,
    /// What the manifest of the version the tile is of says it holds.
    pub(super) expect: crate::format::TileExpectation,
    pub(super) member: OpenMember,
}

/// Tiles fetched together, in parallel, each on a thread of its own
/// (requests in flight to a bucket: through a link of 50 ms a request and
/// 100 MB/s, 4 so read 88,500 cells/s where 2 on the decoding pool read
/// 64,500; benches/bucket.py).
const FETCH_GROUP: usize = 4;

/// The fetching thread: the share's tiles in plan order, still compressed,
/// [`FETCH_GROUP`] at a time in parallel, each dataset opened when a tile of
/// it first comes up.
pub(super) fn fetch_tiles(source: &dyn TileSource, plan: &EpochPlan, out: &SyncSender<Result<Fetched, LoaderError>>) {
    let mut opened: Vec<Option<OpenMember>> = vec![None; source.n_members()];
    for units in plan.units.chunks(FETCH_GROUP) {
        let members: Result<Vec<OpenMember>, LoaderError> = units
            .iter()
            .map(|u| match &opened[u.member] {
                Some(m) => Ok(m.clone()),
                None => {
                    let m = source.open_member(u.member)?;
                    opened[u.member] = Some(m.clone());
                    Ok(m)
                }
            })
            .collect();
        // Each tile of the group on a thread of its own: a fetch waits on
        // the store, not on a core, and must not queue behind the chunks
        // being decompressed on the pool.
        let fetched = |members: Vec<OpenMember>| {
            let fetch = |u: &Unit, member: OpenMember| {
                let (blob, expect) = member.dataset.fetch_checked_tile(u.tile)?;
                Ok(Fetched { blob, expect, member })
            };
            std::thread::scope(|scope| {
                // (A thread that cannot be started leaves its tile to be
                // fetched here, after the others.)
                let started: Vec<_> = units
                    .iter()
                    .zip(members)
                    .map(|(u, member)| {
                        let m = member.clone();
                        std::thread::Builder::new().spawn_scoped(scope, move || fetch(u, m)).map_err(|_| (u, member))
                    })
                    .collect();
                started
                    .into_iter()
                    .map(|s| match s {
                        Ok(thread) => {
                            thread.join().unwrap_or_else(|panic| Err(LoaderError::Internal(panic_text(panic))))
                        }
                        Err((u, member)) => fetch(u, member),
                    })
                    .collect::<Vec<Result<Fetched, LoaderError>>>()
            })
        };
        // The group's tiles in order, up to the first that failed (checked
        // here, a damaged tile ends the epoch after the tiles before it).
        let fetched = match members.map(fetched) {
            Ok(fetched) => fetched,
            Err(e) => vec![Err(e)],
        };
        for f in fetched {
            let failed = f.is_err();
            if out.send(f).is_err() || failed {
                return;
            }
        }
    }
}
