//! The fetching stage: the share's tiles in plan order, still compressed
//! ([`Fetched`]), a few at a time in parallel, each dataset opened when a
//! tile of it first comes up. It neither checks nor decompresses a tile:
//! the decoding stage does.

use std::sync::mpsc::SyncSender;

use super::options::{panic_text, LoaderError};
use super::plan::{EpochPlan, Unit};
use super::source::{OpenMember, TileSource};

/// A tile fetched, still compressed, with its dataset.
#[derive(Clone)]
pub(super) struct Fetched {
    pub(super) blob: bytes::Bytes,
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
        let fetched = members.and_then(|members| {
            let fetch = |u: &Unit, member: OpenMember| Ok(Fetched { blob: member.dataset.fetch_tile(u.tile)?, member });
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
                    .collect::<Result<Vec<_>, LoaderError>>()
            })
        });
        match fetched {
            Ok(fetched) => {
                for f in fetched {
                    if out.send(Ok(f)).is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = out.send(Err(e));
                return;
            }
        }
    }
}
