"""PyTorch integration: an ``IterableDataset`` over a deltacells dataset.

Importing this module imports torch; the rest of the package never does.

>>> from deltacells.torch import CellDataset
>>> data = CellDataset("gs://bucket/atlas", batch_size=1024, obs_columns=["cell_type"])
>>> loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=4)
>>> for epoch in range(10):
...     data.set_epoch(epoch)
...     for batch in loader:
...         x = batch["X"]                 # torch.sparse_csr_tensor, float32 values
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
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from ._args import integer, location
from ._collection import Collection
from ._dataset import Cells, Dataset
from ._errors import InvalidArgumentError
from ._loader import CellBatch
from ._options import DEFAULTS, loader_options
from ._vocabulary import Vocabulary

_NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
                 torch.int32: np.int32, torch.int64: np.int64}


def _tensor(values: np.ndarray) -> torch.Tensor:
    # Arrays over the memory-mapped obs cache are read-only; torch warns about
    # those, so they are copied (a batch's worth of values).
    return torch.from_numpy(values if values.flags.writeable else values.copy())


def to_tensors(batch: CellBatch, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """A :class:`CellBatch` as torch types: ``{"X": sparse CSR tensor of
    dtype, "cells": int64 tensor, "obs": {column: tensor, or the NumPy array
    for string and object columns}}``. ``X``'s column indices are shared
    with the batch (no copy; int32, with int32 row offsets); its values are
    converted to ``dtype``. A batch read with ``dense=True`` gives a dense
    ``(cells, genes)`` tensor of ``dtype`` (no copy when it is already of
    that type), and one read with ``top_k`` adds ``"top_k"`` (int32) and
    ``"top_k_values"`` (float32). Such a dict works with ``pin_memory=True``."""
    x = batch.X
    # The cast is made by NumPy, on this thread: torch's would wake its
    # OpenMP threads, whose spinning takes the cores the loader decodes on
    # (an epoch took 1.4x as long).
    numpy_dtype = _NUMPY_DTYPES.get(dtype)

    def cast(values: np.ndarray) -> torch.Tensor:
        if numpy_dtype is not None:
            return torch.from_numpy(values.astype(numpy_dtype, copy=values.dtype != numpy_dtype))
        return torch.from_numpy(values).to(dtype)

    matrix: torch.Tensor
    if isinstance(x, np.ndarray):  # dense=True: a (cells, genes) tensor
        matrix = cast(x)
    else:
        crow = torch.from_numpy(x.indptr.astype(np.int32))
        col = torch.from_numpy(x.indices)
        with warnings.catch_warnings():
            # torch warns once per process that sparse CSR support is in beta.
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)
            matrix = torch.sparse_csr_tensor(crow, col, cast(x.data), size=x.shape, check_invariants=False)
    obs: dict[str, Any] = {}
    for name, v in batch.obs.items():
        obs[name] = _tensor(v) if v.dtype.kind in "biuf" else v
    out = {"X": matrix, "cells": torch.from_numpy(batch.cells), "obs": obs}
    if batch.top_k is not None and batch.top_k_values is not None:
        out["top_k"] = torch.from_numpy(batch.top_k)
        out["top_k_values"] = torch.from_numpy(batch.top_k_values)
    return out


def _distributed() -> tuple[int, int]:
    """(rank, world size) of this process's torch.distributed group, or (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class CellDataset(torch.utils.data.IterableDataset):
    """Shuffled batches of a deltacells dataset for a ``torch.utils.data.DataLoader``.

    ``root`` and ``open_options`` are those of :func:`deltacells.open_dataset`,
    or ``root`` is a :class:`deltacells.Dataset` (opened again, with its
    options, by each worker) or a :class:`deltacells.Collection` (from
    :func:`deltacells.open_collection`, whose genes and weights then apply;
    each worker opens a dataset of it when its share first reads from it);
    the other arguments those of :meth:`deltacells.Dataset.batches` (rank,
    world size, worker and worker count are filled in), sampling included
    (``weights``, ``num_samples``, ``balance``, ``class_weights``) and the
    gene vocabulary (``genes``: names in the model's column order, or
    ``"source"``; ``gene_column``: the var column they match).
    ``transform`` turns each :class:`CellBatch` into what is yielded (default
    :func:`to_tensors`; pass ``lambda b: b`` for the batch itself).
    ``threads`` are the decoding threads of each worker (default: the cores
    divided among the workers). ``rank`` and ``world_size`` default to those
    of ``torch.distributed`` when its process group is initialized (read when
    the dataset is made and at each :meth:`set_epoch`, in the process that
    owns the DataLoader: its workers have no process group of their own).

    Call :meth:`set_epoch` before each epoch, as with ``DistributedSampler``.
    The epoch is kept in shared memory, so workers started with
    ``persistent_workers=True`` read the epoch set last when the next epoch
    begins, whether they were started with ``fork`` or ``spawn``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Dataset | Collection,
        batch_size: int = DEFAULTS["batch_size"],
        *,
        shuffle: bool = DEFAULTS["shuffle"],
        seed: int = DEFAULTS["seed"],
        obs_columns: Sequence[str] | None = None,
        cells: Cells | None = None,
        drop_last: bool = DEFAULTS["drop_last"],
        window_tiles: int = DEFAULTS["window_tiles"],
        mix_chunks: int = DEFAULTS["mix_chunks"],
        prefetch: int = DEFAULTS["prefetch"],
        weights: Sequence[float] | np.ndarray | None = None,
        num_samples: int | None = None,
        balance: str | None = None,
        class_weights: Mapping[Any, float] | None = None,
        threads: int | None = None,
        transform: Callable[[CellBatch], Any] | None = None,
        genes: Sequence[str] | np.ndarray | str | Vocabulary | None = None,
        gene_column: str | None = None,
        normalize: float | None = None,
        normalize_over: str = "stored",
        log1p: bool = False,
        dense: bool = False,
        top_k: int | None = None,
        dtype: Any = None,
        sorted_columns: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        **open_options: Any,
    ) -> None:
        super().__init__()
        if isinstance(root, Dataset):
            given = {k: v for k, v in root._options.items() if k != "threads"}
            open_options = {**given, "cache_dir": root._cache_dir, **open_options}
            root = root.root
        self.root: str | Collection = root if isinstance(root, Collection) else location("root", root)
        if isinstance(root, Collection):
            if genes is not None or gene_column is not None:
                raise InvalidArgumentError(
                    "genes: a collection's batches are in its own genes; choose them with open_collection(genes=...)"
                )
            if obs_columns:
                root.obs.ensure_local(list(obs_columns))  # merges the obs schemas once, here
        # Checked here, in the main process, rather than in every worker.
        loader_options(
            batch_size=batch_size, shuffle=shuffle, seed=seed, epoch=0, rank=rank or 0,
            world_size=1 if world_size is None else world_size, worker=0,
            num_workers=1, drop_last=drop_last, window_tiles=window_tiles, mix_chunks=mix_chunks, prefetch=prefetch,
        )
        if isinstance(genes, Vocabulary):  # each worker builds its own, for the dataset it opens
            gene_column = genes.column
            genes = genes._given
        elif genes is not None and not isinstance(genes, str):
            genes = list(genes)
        self.batch_options: dict[str, Any] = dict(
            batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, window_tiles=window_tiles,
            mix_chunks=mix_chunks, prefetch=prefetch, weights=weights, num_samples=num_samples, balance=balance,
            class_weights=class_weights, genes=genes, gene_column=gene_column, normalize=normalize,
            normalize_over=normalize_over, log1p=log1p, dense=dense, top_k=top_k, dtype=dtype,
            sorted_columns=sorted_columns,
        )
        if isinstance(root, Collection):
            del self.batch_options["genes"], self.batch_options["gene_column"]
        self.obs_columns = list(obs_columns) if obs_columns else None
        self.cells = None if cells is None else np.asarray(cells, dtype=np.int64)
        self.threads = threads
        self.transform = to_tensors if transform is None else transform
        self.open_options = open_options
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self._dataset: Dataset | Collection | None = None
        # DataLoader workers are processes of their own, where the process
        # group is not initialized: the rank is read here, in the process
        # that made the dataset, and again by set_epoch.
        self._explicit_rank = rank
        self.rank, self.world_size = _distributed() if rank is None else (rank, world_size or 1)
        # Every option, the weights and classes too, is checked now, in this
        # process, rather than in each worker as it starts (a dataset opened
        # for that alone: each worker opens its own).
        self._new_dataset(1).batches(
            **self.batch_options, rank=self.rank, world_size=self.world_size, obs_columns=self.obs_columns,
            cells=self.cells,
        )

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads (its tile and cell order), in this
        process and in its DataLoader's workers, persistent ones included."""
        self._epoch.fill_(integer("epoch", epoch, 0, (1 << 63) - 1))
        if self._explicit_rank is None:
            self.rank, self.world_size = _distributed()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_dataset"] = None  # opened again by each process
        return state

    def _new_dataset(self, num_workers: int) -> Dataset | Collection:
        threads = self.threads or max(1, (os.cpu_count() or 1) // num_workers)
        if isinstance(self.root, Collection):
            return self.root._copy(threads)
        options: dict[str, Any] = dict(threads=threads, anonymous=False, endpoint=None, cache_bytes=0)
        options.update(self.open_options)
        cache_dir = options.pop("cache_dir", None)
        return Dataset(self.root, options, cache_dir)

    def _open(self, num_workers: int) -> Dataset | Collection:
        if self._dataset is None:
            self._dataset = self._new_dataset(num_workers)
        return self._dataset

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world_size = self.rank, self.world_size
        if info is None and self._explicit_rank is None:
            rank, world_size = _distributed()
        dataset = self._open(num_workers)
        loader = dataset.batches(
            **self.batch_options, epoch=self.epoch, rank=rank, world_size=world_size, worker=worker,
            num_workers=num_workers, obs_columns=self.obs_columns, cells=self.cells,
        )
        for batch in loader:
            yield self.transform(batch)
