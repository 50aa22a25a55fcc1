"""PyTorch integration: an ``IterableDataset`` over a deltacells dataset.

Importing this module imports torch; the rest of the package never does.

>>> from deltacells.torch import CellDataset
>>> data = CellDataset("gs://bucket/atlas", batch_size=1024, obs_columns=["cell_type"])
>>> loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=4)
>>> for epoch in range(10):
...     data.set_epoch(epoch)
...     for batch in loader:
...         x = batch["X"]                 # torch.sparse_csr_tensor, float32
...         y = batch["obs"]["cell_type"]  # torch.Tensor of category codes

Each DataLoader worker reads its own share of every epoch (the worker index
and count from ``torch.utils.data.get_worker_info()``), and so does each rank
of a distributed job (from ``torch.distributed`` when it is initialized), so
that one epoch yields every cell exactly once across all of them. Give the
DataLoader ``batch_size=None``: the batches are already made.

The dataset object holds only its root and options; each worker opens the
dataset itself, on first use, whether it was started with ``fork`` or
``spawn``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from ._dataset import Cells, Dataset
from ._loader import CellBatch


def to_tensors(batch: CellBatch, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """A :class:`CellBatch` as torch types: ``{"X": sparse CSR tensor of
    dtype, "cells": int64 tensor, "obs": {column: tensor, or the NumPy array
    for string and object columns}}``. ``X``'s index arrays are shared with the
    batch (no copy); its values are converted to ``dtype``."""
    x = batch.X
    crow = torch.from_numpy(x.indptr)
    col = torch.from_numpy(x.indices.astype(np.int64, copy=False))
    values = torch.from_numpy(x.data).to(dtype)
    matrix = torch.sparse_csr_tensor(crow, col, values, size=x.shape)
    obs: dict[str, Any] = {}
    for name, v in batch.obs.items():
        obs[name] = torch.from_numpy(v) if v.dtype.kind in "biuf" else v
    return {"X": matrix, "cells": torch.from_numpy(batch.cells), "obs": obs}


class CellDataset(torch.utils.data.IterableDataset):
    """Shuffled batches of a deltacells dataset for a ``torch.utils.data.DataLoader``.

    ``root`` and ``open_options`` are those of :func:`deltacells.open_dataset`;
    the other arguments those of :meth:`deltacells.Dataset.batches` (rank,
    world size, worker and worker count are filled in). ``transform`` turns
    each :class:`CellBatch` into what is yielded (default :func:`to_tensors`;
    pass ``lambda b: b`` for the batch itself). ``threads`` are the decoding
    threads of each worker (default: the cores divided among the workers).

    Call :meth:`set_epoch` before each epoch, as with ``DistributedSampler``.
    With ``persistent_workers=True`` the workers keep the epoch they started
    with; leave it off, or advance ``epoch`` in your own ``transform``.
    """

    def __init__(
        self,
        root: str,
        batch_size: int = 1024,
        *,
        shuffle: bool = True,
        seed: int = 0,
        obs_columns: Sequence[str] | None = None,
        cells: Cells | None = None,
        drop_last: bool = False,
        window_tiles: int = 4,
        mix_chunks: int = 4,
        prefetch: int = 4,
        threads: int | None = None,
        transform: Callable[[CellBatch], Any] | None = None,
        **open_options: Any,
    ) -> None:
        super().__init__()
        self.root = str(root)
        self.batch_options = dict(
            batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, window_tiles=window_tiles,
            mix_chunks=mix_chunks, prefetch=prefetch,
        )
        self.obs_columns = list(obs_columns) if obs_columns else None
        self.cells = None if cells is None else np.asarray(cells, dtype=np.int64)
        self.threads = threads
        self.transform = to_tensors if transform is None else transform
        self.open_options = open_options
        self.epoch = 0
        self._dataset: Dataset | None = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads (its tile and cell order)."""
        self.epoch = int(epoch)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_dataset"] = None  # opened again by each process
        return state

    def _open(self, num_workers: int) -> Dataset:
        if self._dataset is None:
            threads = self.threads or max(1, (os.cpu_count() or 1) // num_workers)
            options = dict(threads=threads, anonymous=False, endpoint=None, cache_bytes=0)
            options.update(self.open_options)
            cache_dir = options.pop("cache_dir", None)
            self._dataset = Dataset(self.root, options, cache_dir)
        return self._dataset

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world_size = 0, 1
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        dataset = self._open(num_workers)
        loader = dataset.batches(
            **self.batch_options, epoch=self.epoch, rank=rank, world_size=world_size, worker=worker,
            num_workers=num_workers, obs_columns=self.obs_columns, cells=self.cells,
        )
        for batch in loader:
            yield self.transform(batch)
