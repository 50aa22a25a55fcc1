"""PyTorch integration: an ``IterableDataset`` of shuffled batches
(:class:`CellDataset`) and a map-style dataset for samplers
(:class:`CellMapDataset`) over a deltacells dataset or collection.

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

:class:`CellMapDataset` is for training code that draws cell indices through
a sampler (``RandomSampler``, ``WeightedRandomSampler``,
``DistributedSampler``...): the DataLoader hands it each batch's indices at
once, and it reads them with one :meth:`deltacells.Dataset.get_batch`. Give
the DataLoader ``collate_fn=deltacells.torch.collate``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Unpack, cast

import numpy as np
import torch
import torch.utils.data

from ._args import column_names, integer, keywords, location, thread_count
from ._collection import Collection
from ._dataset import _INHERITED, Dataset
from ._deltacells import DEFAULT_CACHE_BYTES, redact
from ._loader import CellBatch
from ._open import OPEN_OPTIONS, open_dataset
from ._options import DEFAULTS, batch_options, store_options
from ._types import BatchArgs, CellDatasetArgs, OpenArgs
from ._vocabulary import Vocabulary
from .exceptions import ArgumentTypeError, InvalidArgumentError

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


def _source(
    root: str | os.PathLike[str] | Dataset | Collection, open_options: dict[str, Any]
) -> tuple[str | Collection, dict[str, Any], bytes | None]:
    """What each process opens: a root with the options of
    :func:`deltacells.open_dataset` (an open Dataset's own, with its cache
    folder, under those given; its threads left to each process), or a
    collection; and, for an open Dataset, the version it shows (its
    manifest), which every process opens too, whatever writers did since."""
    if isinstance(root, Collection):
        return root, open_options, None
    if isinstance(root, Dataset):
        given = {k: v for k, v in root._options.items() if k != "threads"}
        return root.root, {**given, "cache_dir": root._cache_dir, **open_options}, root.native.version()
    return location("root", root), open_options, None


def _new_source(
    root: str | Collection, open_options: dict[str, Any], threads: int | None, num_workers: int,
    version: bytes | None = None, cache_bytes: int = 0,
) -> Dataset | Collection:
    """The dataset or collection a process reads, with ``threads`` decoding
    threads (default: the cores divided among the workers), as ``version``
    when given; nothing is opened until it is read. Its chunk cache is
    ``cache_bytes`` unless ``open_options`` chooses one: none for the
    streaming loader, which reads each chunk once an epoch."""
    threads = threads or max(1, (os.cpu_count() or 1) // num_workers)
    if isinstance(root, Collection):
        return root._copy(threads)
    options: dict[str, Any] = dict(threads=threads, **store_options({}), cache_bytes=cache_bytes)
    options.update(open_options)
    cache_dir = options.pop("cache_dir", None)
    return Dataset(root, options, cache_dir, None, version)


def _gene_choice(
    root: object, genes: Sequence[str] | np.ndarray | str | Vocabulary | None, gene_column: str | None
) -> tuple[list[str] | str | None, str | None]:
    """``genes=`` and ``gene_column=`` as each process builds its vocabulary
    from them (a :class:`Vocabulary` belongs to one opened dataset: its names
    are taken); refused for a collection, which has its own genes."""
    if isinstance(root, Collection):
        if genes is not None or gene_column is not None:
            raise InvalidArgumentError(
                "genes: a collection's batches are in its own genes; choose them with open_collection(genes=...)"
            )
        return None, None
    if isinstance(genes, Vocabulary):
        return genes._given, genes.column
    if genes is not None and not isinstance(genes, str):
        return list(genes), gene_column
    return genes, gene_column


class CellDataset(torch.utils.data.IterableDataset):
    """Shuffled batches of a deltacells dataset for a ``torch.utils.data.DataLoader``.

    ``root`` and the keywords ``cache_dir``, ``cache_bytes``, ``anonymous``
    and ``endpoint`` are those of :func:`deltacells.open_dataset`, or
    ``root`` is a :class:`deltacells.Dataset` (opened again, with its
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
        threads: int | None = None,
        transform: Callable[[CellBatch], Any] | None = None,
        genes: Sequence[str] | np.ndarray | str | Vocabulary | None = None,
        gene_column: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        **options: Unpack[CellDatasetArgs],
    ) -> None:
        super().__init__()
        keywords("CellDataset", options, CellDatasetArgs.__annotations__)
        open_keys = OpenArgs.__annotations__
        epoch: dict[str, Any] = {k: v for k, v in options.items() if k not in open_keys}
        self.root, open_options, self._version = _source(root, {k: v for k, v in options.items() if k in open_keys})
        genes, gene_column = _gene_choice(root, genes, gene_column)
        obs_columns, cells = epoch.pop("obs_columns", None), epoch.pop("cells", None)
        if isinstance(root, Collection) and obs_columns:
            root.obs.ensure_local(list(obs_columns))  # merges the obs schemas once, here
        # Checked here, in the main process, rather than in every worker.
        shared = {**epoch, "epoch": 0, "rank": rank or 0, "world_size": 1 if world_size is None else world_size}
        batch_options("CellDataset", batch_size, cast(BatchArgs, shared))
        self.batch_options: dict[str, Any] = {"batch_size": batch_size, **epoch}
        if not isinstance(root, Collection):
            self.batch_options.update(genes=genes, gene_column=gene_column)
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
        return _new_source(self.root, self.open_options, self.threads, num_workers, self._version)

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


class _WholeBatch(dict[str, Any]):
    """A batch as :meth:`CellMapDataset.__getitems__` returns it: the dict
    of :func:`to_tensors`, which refuses by name to be taken for a list of
    cells (torch's default collate reads ``batch[0]``)."""

    def __missing__(self, key: object) -> Any:
        if isinstance(key, int):
            raise InvalidArgumentError(
                "collate_fn: CellMapDataset reads a whole batch in one call; give the DataLoader "
                "collate_fn=deltacells.torch.collate (torch's default collate takes a list of cells)"
            )
        raise KeyError(key)


def collate(batch: Any) -> Any:
    """The ``collate_fn`` of a ``DataLoader`` over a :class:`CellMapDataset`:
    the batch its ``__getitems__`` read, as it is (a ``dict`` as
    :func:`to_tensors` makes it, or what ``transform`` made).

    torch's default collate takes a list of samples, one per index, and
    stacks them; a :class:`CellMapDataset` reads every index of a batch at
    once, so there is nothing left to collate. It runs in the worker, like
    any ``collate_fn``.
    """
    return dict(batch) if isinstance(batch, _WholeBatch) else batch


def _tensor_dtype(dtype: Any) -> torch.dtype:
    """``dtype=`` of :class:`CellMapDataset` (a torch or NumPy dtype of
    numbers; None for float32) as a torch dtype."""
    if dtype is None:
        return torch.float32
    if not isinstance(dtype, torch.dtype):
        try:
            dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        except Exception:  # TypeError, and SyntaxError or ValueError for some strings
            raise InvalidArgumentError(
                f"dtype must be a torch dtype of numbers (torch.float32, torch.int64...), not {dtype!r}"
            ) from None
    if dtype.is_complex or dtype == torch.bool:
        raise InvalidArgumentError(f"dtype must be a torch dtype of real numbers, not {dtype}")
    return dtype


#: The options of open_dataset that CellMapDataset passes on (root, obs_columns and threads are its own).
_OPEN_OPTIONS = [name for name in OPEN_OPTIONS if name != "threads"]


class CellMapDataset(torch.utils.data.Dataset):
    """The cells of a deltacells dataset or collection as a map-style
    dataset, for a ``DataLoader`` that draws cell indices through a sampler.

    ``len(data)`` is the number of cells and ``data[i]`` cell ``i``, as a
    batch of one. A ``DataLoader`` with a ``batch_size`` hands a whole
    batch of sampled indices to :meth:`__getitems__` (torch >= 2.1), which
    reads them with one :meth:`deltacells.Dataset.get_batch` on the Rust
    threads: the rows are in the sampler's order, repeats kept. Give the
    ``DataLoader`` ``collate_fn=deltacells.torch.collate``: the batch is
    already made, and torch's default collate (which expects a list of
    cells) refuses it by name.

    >>> from torch.utils.data import DataLoader, RandomSampler
    >>> from deltacells.torch import CellMapDataset, collate
    >>> data = CellMapDataset("out/pbmc", obs_columns=["cell_type"])
    >>> loader = DataLoader(data, batch_size=1024, sampler=RandomSampler(data), num_workers=2, collate_fn=collate)
    >>> for batch in loader:
    ...     x = batch["X"]                  # sparse CSR tensor, float32, a row per sampled index
    ...     y = batch["obs"]["cell_type"]   # int tensor of category codes
    ...     cells = batch["cells"]          # the sampled indices, in the sampler's order

    Every sampler works, ``WeightedRandomSampler`` and ``DistributedSampler``
    (call its ``set_epoch``) among them, and so does
    ``torch.utils.data.Subset`` (a train split, say), which passes whole
    batches on.

    Parameters
    ----------
    root
        What :func:`deltacells.open_dataset` opens (with ``open_options``,
        checked here as it checks them), an open :class:`deltacells.Dataset`
        (opened again, with its options, by each process) or a
        :class:`deltacells.Collection` (its cells and genes; each process
        opens a dataset of it when it first reads from it).
    obs_columns
        Obs columns of every batch (``batch["obs"]``), localized here.
    genes, gene_column
        The batches' columns, as :meth:`deltacells.Dataset.get_batch` takes
        them (gene names in the model's order, ``"source"``, or a
        :class:`deltacells.Vocabulary`); not for a collection, whose genes
        are chosen by :func:`deltacells.open_collection`.
    normalize, normalize_over, log1p, dense, sorted_columns
        The values and form, as :meth:`deltacells.Dataset.get_batch` takes them.
    dtype
        The dtype of ``batch["X"]`` (a torch or NumPy dtype; default
        ``torch.float32``). Floating-point values are written as float32
        by the Rust reader (no cast after it for float32), counts as int32;
        an integer dtype with ``normalize`` or ``log1p`` is an error.
    threads
        Decoding threads of each process (default: the cores divided among
        the DataLoader's workers).
    transform
        Turns each :class:`deltacells.CellBatch` (``X``, ``cells``, ``obs``)
        into what :meth:`__getitems__` returns; default :func:`to_tensors`
        with ``dtype`` (``{"X", "cells", "obs"}``, X's column indices shared
        with the batch). :func:`collate` passes any result on as it is.
    open_options
        The keyword options of :func:`deltacells.open_dataset`
        (``cache_dir``, ``cache_bytes``...); a collection has its own. Each
        process keeps a cache of decompressed chunks, for cells drawn from
        chunks read before: ``cache_bytes`` each, by default
        :func:`deltacells.open_dataset`'s default divided among the
        DataLoader's workers.

    Each process opens the dataset itself on first use (the object pickles
    to its root and options), whether the DataLoader's workers are started
    with ``fork`` or ``spawn``. Raises :class:`deltacells.InvalidArgumentError`,
    :class:`deltacells.ArgumentTypeError` or
    :class:`deltacells.UnknownNameError` naming a bad argument, and
    :class:`deltacells.DatasetNotFoundError`, here rather than in a worker.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Dataset | Collection,
        *,
        obs_columns: Sequence[str] | None = None,
        genes: Sequence[str] | np.ndarray | str | Vocabulary | None = None,
        gene_column: str | None = None,
        normalize: float | None = None,
        normalize_over: str = "stored",
        log1p: bool = False,
        dense: bool = False,
        dtype: Any = None,
        sorted_columns: bool = True,
        threads: int | None = None,
        transform: Callable[[CellBatch], Any] | None = None,
        **open_options: Any,
    ) -> None:
        super().__init__()
        self.threads = thread_count("threads", threads)
        for name in open_options:
            if name not in _OPEN_OPTIONS:
                raise ArgumentTypeError(
                    f"{name}: not an argument of CellMapDataset, nor an option of open_dataset "
                    f"({', '.join(_OPEN_OPTIONS)})"
                )
        self.genes, self.gene_column = _gene_choice(root, genes, gene_column)
        self.root, self.open_options, self._version = _source(root, open_options)
        main: Dataset | Collection
        if isinstance(self.root, Collection):
            if self.open_options:
                raise InvalidArgumentError(
                    f"{', '.join(self.open_options)}: a collection is opened with the options of open_collection"
                )
            main = _new_source(self.root, {}, self.threads, 1)
        else:
            main = open_dataset(self.root, threads=self.threads, **self.open_options)  # checks the options
            if self._version is not None:
                main = _new_source(self.root, self.open_options, self.threads, 1, self._version)
        self.obs_columns = [] if obs_columns is None else column_names("obs_columns", obs_columns)
        self.dtype = _tensor_dtype(dtype)
        self.transform = transform
        self.form: dict[str, Any] = dict(
            normalize=normalize, normalize_over=normalize_over, log1p=log1p, dense=dense,
            dtype=np.float32 if self.dtype.is_floating_point else None, sorted_columns=sorted_columns,
        )
        self._opened: tuple[int, Dataset | Collection, Vocabulary | None] | None = None
        _, vocabulary = self._prepare(main)
        # The form is checked now, in this process, by reading no cells (as
        # get_batch reads them: a gene_column without genes is named too).
        if isinstance(main, Dataset):
            main.get_batch([], genes=self.genes, gene_column=self.gene_column, **self.form)
        else:
            main.get_batch([], **self.form)
        if not self.dtype.is_floating_point and (normalize is not None or log1p):
            raise InvalidArgumentError(f"dtype {self.dtype}: normalize and log1p give float values, not counts")
        #: Cells (the dataset's or the collection's).
        self.n_cells: int = main.n_cells
        #: Columns of every batch.
        self.n_genes: int = main.n_genes if vocabulary is None else vocabulary.n_genes

    def _prepare(self, dataset: Dataset | Collection) -> tuple[Dataset | Collection, Vocabulary | None]:
        """``dataset`` made this process's: its vocabulary built and its obs
        columns localized (an unknown one is named)."""
        vocabulary = None
        if isinstance(dataset, Dataset) and self.genes is not None:
            vocabulary = dataset.vocabulary(self.genes, column=self.gene_column)
        for name in self.obs_columns:
            dataset.obs.kind(name)
        dataset.obs.ensure_local(self.obs_columns)
        self._opened = (os.getpid(), dataset, vocabulary)
        return dataset, vocabulary

    def _dataset(self) -> tuple[Dataset | Collection, Vocabulary | None]:
        """This process's dataset and vocabulary, opened on its first use."""
        opened = self._opened
        if opened is not None and opened[0] == os.getpid():
            return opened[1], opened[2]
        if opened is not None:
            # Inherited through fork: kept, never used or freed here (freeing
            # would wait for the parent's threads, which this process lacks).
            _INHERITED.append(opened)
        info = torch.utils.data.get_worker_info()
        workers = 1 if info is None else info.num_workers
        # Cells drawn at random hit a chunk many times an epoch: each
        # process keeps its share of open_dataset's default cache.
        dataset = _new_source(self.root, self.open_options, self.threads, workers, self._version,
                              cache_bytes=DEFAULT_CACHE_BYTES // workers)
        return self._prepare(dataset)

    def __len__(self) -> int:
        """Cells of the dataset or collection."""
        return self.n_cells

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> Any:
        """Cells ``indices`` (any integers, in any order, repeats allowed) as
        one batch: one :meth:`deltacells.Dataset.get_batch`, rows in the
        order of ``indices``; by default the dict of :func:`to_tensors`.
        Raises :class:`deltacells.CellIndexError` (an ``IndexError``) for
        a cell out of range (negative ones too), naming it."""
        dataset, vocabulary = self._dataset()
        cells = dataset.cell_indices(indices)
        if isinstance(dataset, Collection):
            x = dataset.get_batch(cells, **self.form)
        else:
            x = dataset.get_batch(cells, genes=vocabulary, **self.form)
        obs = dataset.obs.take(cells, self.obs_columns) if self.obs_columns else {}
        batch = CellBatch(x, cells, obs)
        if self.transform is not None:
            return self.transform(batch)
        return _WholeBatch(to_tensors(batch, self.dtype))

    def __getitem__(self, index: int) -> Any:
        """Cell ``index`` as a batch of one (``X`` of one row)."""
        return collate(self.__getitems__([integer("index", index)]))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_opened"] = None  # opened again by each process
        return state

    def __repr__(self) -> str:
        root = self.root.root if isinstance(self.root, Collection) else self.root
        return f"<deltacells.torch.CellMapDataset {redact(root)!r}: {self.n_cells:,} cells x {self.n_genes:,} genes>"
