"""Shuffled batches for training: one epoch's share of a dataset, read ahead on
Rust threads (see :meth:`deltacells.Dataset.batches`), and lists of cells
read in order (:meth:`deltacells.Dataset.gathers`). Both read through a
:class:`CellSource`, a dataset or a collection, which make them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from . import _deltacells
from ._args import integer
from ._options import MAX_PREFETCH, MAX_U64
from ._sampling import balance_weights
from ._types import Batch, Cells, Form, LoaderOptions, ObsColumns
from ._vocabulary import Vocabulary
from .exceptions import InvalidArgumentError


class CellSource(Protocol):
    """What a :class:`Loader` and :class:`Gathers` read: a dataset
    (:class:`deltacells.Dataset`) or a collection
    (:class:`deltacells.Collection`)."""

    @property
    def root(self) -> str: ...

    @property
    def n_genes(self) -> int: ...

    @property
    def obs(self) -> ObsColumns: ...

    @property
    def _draws_by_default(self) -> bool:
        """Whether every epoch is drawn by weight, without weights= or balance=."""
        ...

    def cell_indices(self, cells: Cells) -> np.ndarray: ...

    def _plan(
        self, cells: np.ndarray | None, options: LoaderOptions, weights: np.ndarray | None, num_samples: int | None
    ) -> _deltacells.RawPlan: ...

    def _start_batches(
        self, plan: _deltacells.RawPlan, genes: Vocabulary | None, form: Form
    ) -> _deltacells.RawBatches: ...

    def _start_gathers(
        self, lists: list[np.ndarray], form: Form, genes: Vocabulary | None, ahead: int
    ) -> _deltacells.RawBatches: ...


class CellBatch:
    """One batch of :meth:`Dataset.batches`.

    Attributes
    ----------
    X
        The counts, a :class:`Batch` (``X.to_scipy()`` gives a CSR matrix over
        the same buffers, without copying); with ``dense=True`` a
        ``(cells, genes)`` NumPy array. float32 values when scaled.
    cells
        int64 global cell indices of the rows of ``X``, in the same order.
    obs
        ``{column: values}`` for the ``obs_columns`` asked for, for the same
        cells, as :meth:`Obs.take` gives them (from the local cache).
    top_k, top_k_values
        With ``top_k=K``: int32 ``(cells, K)`` columns of each cell's K
        highest values (-1 past its nonzeros), and their float32 values;
        otherwise None.
    """

    __slots__ = ("X", "cells", "obs", "top_k", "top_k_values")

    def __init__(
        self,
        X: Batch | np.ndarray,
        cells: np.ndarray,
        obs: dict[str, np.ndarray],
        top_k: np.ndarray | None = None,
        top_k_values: np.ndarray | None = None,
    ) -> None:
        self.X = X
        self.cells = cells
        self.obs = obs
        self.top_k = top_k
        self.top_k_values = top_k_values

    def __len__(self) -> int:
        return len(self.cells)

    def __repr__(self) -> str:
        columns = f", obs {', '.join(self.obs)}" if self.obs else ""
        x = self.X
        held = f"{x.nnz} nonzeros" if isinstance(x, Batch) else f"dense {x.shape[1]} genes"
        return f"<deltacells.CellBatch {len(self.cells)} cells, {held}{columns}>"


class Loader:
    """One epoch's share of a dataset in batches: iterate over it to read them.

    Made by :meth:`Dataset.batches` (see there for every option). Each
    iteration starts the Rust threads that read it and stops them when it ends
    or is abandoned; nothing runs before. A loader pickles to its dataset's
    root and its options, so it can be handed to worker processes started
    with ``spawn`` as well as ``fork``.
    """

    def __init__(
        self,
        dataset: CellSource,
        options: LoaderOptions,
        *,
        obs_columns: Sequence[str] | None = None,
        cells: Cells | None = None,
        weights: Sequence[float] | np.ndarray | None = None,
        num_samples: int | None = None,
        balance: str | None = None,
        class_weights: Mapping[Any, float] | None = None,
        genes: Vocabulary | None = None,
        form: Form | None = None,
    ) -> None:
        self.dataset = dataset
        self.genes = genes
        self.form: Form = form or Form(
            normalize=None, normalize_over="stored", log1p=False, dense=False, top_k=None, float32=False,
            sorted_columns=True,
        )
        self.options = LoaderOptions(**options)
        if obs_columns is not None and (isinstance(obs_columns, str) or not isinstance(obs_columns, Sequence)):
            raise InvalidArgumentError(f"obs_columns must be a list of column names, not {obs_columns!r}")
        self.obs_columns = list(obs_columns) if obs_columns else []
        for name in self.obs_columns:
            dataset.obs.kind(name)  # an unknown column fails here, not in a worker
        self.cells = None if cells is None else dataset.cell_indices(cells)
        self.num_samples = None if num_samples is None else integer("num_samples", num_samples, 0, MAX_U64)
        if num_samples is not None and weights is None and balance is None and not dataset._draws_by_default:
            raise InvalidArgumentError("num_samples is the size of an epoch drawn by weights= or balance=")
        if class_weights is not None and balance is None:
            raise InvalidArgumentError("class_weights goes with balance= (the category column they weigh)")
        self.weights: np.ndarray | None = None
        if weights is not None and balance is not None:
            raise InvalidArgumentError("give weights= or balance=, not both")
        if weights is not None:
            try:
                self.weights = np.ascontiguousarray(weights, dtype=np.float64)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"weights must be numbers, one per cell, not {weights!r:.80}") from None
            if self.weights.ndim != 1:
                raise InvalidArgumentError(f"weights must be one-dimensional, not of shape {self.weights.shape}")
        elif balance is not None:
            if not isinstance(balance, str):
                raise InvalidArgumentError(f"balance must be the name of a category column, not {balance!r}")
            self.weights = balance_weights(dataset.obs, balance, self.cells, class_weights)
        self._planned: tuple[tuple[Any, ...], _deltacells.RawPlan] | None = None
        self._plan()  # checks every option (and the weights) now, before any thread starts

    def set_epoch(self, epoch: int) -> None:
        """Reads epoch ``epoch`` next (another tile and cell order when shuffling)."""
        self.options["epoch"] = integer("epoch", epoch, 0, MAX_U64)
        self._planned = None

    @property
    def epoch(self) -> int:
        return self.options["epoch"]

    def _plan(self) -> _deltacells.RawPlan:
        """The epoch's share, planned once for its size and every reading of
        it, and again when what it was planned from has changed since."""
        key = (dict(self.options), self.num_samples, id(self.cells), id(self.weights))
        if self._planned is None or self._planned[0] != key:
            self._planned = (key, self.dataset._plan(self.cells, self.options, self.weights, self.num_samples))
        return self._planned[1]

    def __getstate__(self) -> dict[str, Any]:
        # (a plan stays in its process: another plans the share again)
        return {**self.__dict__, "_planned": None}

    @property
    def n_cells(self) -> int:
        """Cells this share yields in one epoch (before ``drop_last`` drops its last partial batch)."""
        return self._plan().n_cells()

    def __len__(self) -> int:
        """Batches this share yields in one epoch."""
        return self._plan().n_batches()

    def __iter__(self) -> Iterator[CellBatch]:
        dataset = self.dataset
        obs = dataset.obs
        if self.obs_columns:
            obs.ensure_local(self.obs_columns)
        genes = self.genes
        raw = dataset._start_batches(self._plan(), genes, self.form)
        n_genes = dataset.n_genes if genes is None else genes.n_genes
        columns = self.obs_columns
        for cells, indptr, indices, data, top_k, top_k_values in raw:
            values = obs.take(cells, columns) if columns else {}
            x = data if indptr is None or indices is None else Batch(indptr, indices, data, n_genes)
            yield CellBatch(x, cells, values, top_k, top_k_values)

    def __repr__(self) -> str:
        o = self.options
        share = f"rank {o['rank']}/{o['world_size']}, worker {o['worker']}/{o['num_workers']}"
        return (f"<deltacells.Loader {self.dataset.root!r}: batches of {o['batch_size']}, epoch {o['epoch']}, "
                f"{'shuffled' if o['shuffle'] else 'in order'}, {share}>")


class Gathers:
    """Lists of cells read in order, ahead of the consumer (see
    :meth:`deltacells.Dataset.gathers`): iterate over it for one
    :class:`CellBatch` per list. Each iteration starts the Rust thread that
    reads the lists and stops it when the iteration ends or is abandoned.
    """

    def __init__(
        self,
        dataset: CellSource,
        lists: Iterable[Cells],
        ahead: int,
        obs_columns: Sequence[str] | None,
        genes: Vocabulary | None,
        form: Form,
    ) -> None:
        if isinstance(lists, (str, bytes)) or not isinstance(lists, Iterable):
            raise InvalidArgumentError(f"lists must be an iterable of cell lists, not {lists!r:.80}")
        self.dataset = dataset
        self.lists = [dataset.cell_indices(cells) for cells in lists]  # each checked now
        self.ahead = integer("ahead", ahead, 1, MAX_PREFETCH)
        if obs_columns is not None and (isinstance(obs_columns, str) or not isinstance(obs_columns, Sequence)):
            raise InvalidArgumentError(f"obs_columns must be a list of column names, not {obs_columns!r}")
        self.obs_columns = list(obs_columns) if obs_columns else []
        for name in self.obs_columns:
            dataset.obs.kind(name)
        self.genes = genes
        self.form = form

    def __len__(self) -> int:
        """The lists (one batch each)."""
        return len(self.lists)

    def __iter__(self) -> Iterator[CellBatch]:
        dataset = self.dataset
        obs = dataset.obs
        columns = self.obs_columns
        if columns:
            obs.ensure_local(columns)
        raw = dataset._start_gathers(self.lists, self.form, self.genes, self.ahead)
        n_genes = dataset.n_genes if self.genes is None else self.genes.n_genes
        for cells, indptr, indices, data, top_k, top_k_values in raw:
            values = obs.take(cells, columns) if columns else {}
            x = data if indptr is None or indices is None else Batch(indptr, indices, data, n_genes)
            yield CellBatch(x, cells, values, top_k, top_k_values)

    def __repr__(self) -> str:
        return f"<deltacells.Gathers {self.dataset.root!r}: {len(self.lists)} lists, {self.ahead} ahead>"
