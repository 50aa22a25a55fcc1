"""The loader's options: one typed definition (:class:`LoaderOptions`), whose
defaults are the Rust loader's own (``LoaderOptions::default()`` in
src/loader.rs, exported by the binding), and their checks."""

from __future__ import annotations

from typing import Any, TypedDict

from . import _deltacells
from ._args import flag, integer


class LoaderOptions(TypedDict):
    """Every option of the Rust loader, as ``RawDataset.batches`` takes them
    (see :meth:`deltacells.Dataset.batches` for what each does)."""

    batch_size: int
    shuffle: bool
    seed: int
    epoch: int
    rank: int
    world_size: int
    worker: int
    num_workers: int
    drop_last: bool
    window_tiles: int
    mix_chunks: int
    prefetch: int


#: The loader's defaults, from the Rust loader: the signatures of
#: :meth:`Dataset.batches` and :class:`deltacells.torch.CellDataset` take
#: theirs from here.
DEFAULTS: LoaderOptions = _deltacells.loader_defaults()

#: Largest batch_size and prefetch accepted (the loader's queue is
#: reserved at its size; a batch never holds more cells than its share).
MAX_BATCH_SIZE = 1 << 31
MAX_PREFETCH = 1024
MAX_U64 = (1 << 64) - 1


def loader_options(
    *, batch_size: Any, shuffle: Any, seed: Any, epoch: Any, rank: Any, world_size: Any, worker: Any,
    num_workers: Any, drop_last: Any, window_tiles: Any, mix_chunks: Any, prefetch: Any,
) -> LoaderOptions:
    """The loader's options checked (each named in the error that refuses
    it), as the Rust loader takes them."""
    world = integer("world_size", world_size, 1, 1 << 32)
    workers = integer("num_workers", num_workers, 1, 1 << 32)
    return LoaderOptions(
        batch_size=integer("batch_size", batch_size, 1, MAX_BATCH_SIZE),
        shuffle=flag("shuffle", shuffle),
        seed=integer("seed", seed, 0, MAX_U64),
        epoch=integer("epoch", epoch, 0, MAX_U64),
        rank=integer("rank", rank, 0, world - 1),
        world_size=world,
        worker=integer("worker", worker, 0, workers - 1),
        num_workers=workers,
        drop_last=flag("drop_last", drop_last),
        window_tiles=integer("window_tiles", window_tiles, 1, 1 << 32),
        mix_chunks=integer("mix_chunks", mix_chunks, 1, 1 << 32),
        prefetch=integer("prefetch", prefetch, 1, MAX_PREFETCH),
    )
