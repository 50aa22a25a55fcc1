"""Lightning integration: :class:`DataModule`, a ``LightningDataModule`` over
a deltacells dataset or collection for users' own models. Train, validation
and test cells by obs group (or by fraction, or given); each rank of a
distributed job reads its share of every epoch; the trainer's epoch is passed
to the loader each time an epoch starts.

Importing this module imports lightning and torch; the rest of the package
never does, but :mod:`deltacells.scvi`, which builds on it.

>>> import lightning.pytorch as pl
>>> from deltacells.lightning import DataModule
>>> data = DataModule("out/atlas", batch_size=1024, split_by="donor_id", obs_columns=["cell_type"])
>>> pl.Trainer(max_epochs=10, strategy="ddp", devices=4).fit(MyModel(data.n_genes), datamodule=data)

The batches are those of :class:`deltacells.torch.CellDataset` (the dict of
:func:`deltacells.torch.to_tensors` by default: ``X``, ``cells``, ``obs``),
read by the Rust loader on its own threads; the DataLoaders have no worker
processes unless ``dataloader_options`` asks for them.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch.utils.data

from ._args import integer
from ._collection import Collection
from ._dataset import Dataset
from ._deltacells import redact
from ._loader import CellBatch
from ._open import OPEN_OPTIONS, open_dataset
from ._options import DEFAULTS
from ._types import Cells, EpochArgs
from .exceptions import ArgumentTypeError, InvalidArgumentError
from .torch import CellDataset, _distributed

#: Options of the training loader alone: how an epoch is drawn and ordered.
#: Validation, test and prediction read their cells once each, in order.
_TRAIN_ONLY = ("shuffle", "seed", "drop_last", "window_tiles", "mix_chunks", "weights", "num_samples", "balance",
               "class_weights")

#: The options a DataModule passes on to CellDataset (the others are its own).
_LOADER_OPTIONS = ["threads", "genes", "gene_column",
                   *(name for name in EpochArgs.__annotations__ if name not in ("obs_columns", "cells"))]
_OPEN_OPTIONS = list(OPEN_OPTIONS)

#: DataLoader arguments the DataModule sets itself.
_OWN_LOADER_ARGUMENTS = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn", "drop_last")


def _parts(fractions: Sequence[float]) -> list[float]:
    try:
        parts = [float(f) for f in fractions]
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"fractions must be numbers, not {fractions!r}") from None
    if not 1 <= len(parts) <= 3 or any(not math.isfinite(f) or f < 0 for f in parts):
        raise InvalidArgumentError(
            f"fractions must be 1 to 3 numbers (train, validation, test), none negative, not {fractions!r}"
        )
    if abs(sum(parts) - 1.0) > 1e-6:
        raise InvalidArgumentError(f"fractions must sum to 1, not {sum(parts)!r} ({fractions!r})")
    return parts


def random_split(cells: np.ndarray, fractions: Sequence[float], seed: int) -> tuple[np.ndarray, ...]:
    """``cells`` split at random into parts of ``fractions`` (1 to 3 of them,
    summing to 1), as scvi-tools' ``DataSplitter`` sizes them: the first
    part rounded up, the others down, the last taking what is left. Each part
    sorted. Used when no ``split_by`` column is given.

    >>> train, val = random_split(np.arange(1000), (0.9, 0.1), seed=0)
    """
    parts = _parts(fractions)
    n = len(cells)
    sizes = [math.ceil(parts[0] * n)] + [math.floor(f * n) for f in parts[1:]]
    sizes[-1] = n - sum(sizes[:-1])
    if sizes[-1] < 0:  # the first part rounded up took a cell of the last
        sizes[-2] += sizes[-1]
        sizes[-1] = 0
    order = np.random.default_rng(integer("split_seed", seed, 0)).permutation(cells)
    bounds = np.cumsum([0, *sizes])
    return tuple(np.sort(order[bounds[i]:bounds[i + 1]]) for i in range(len(sizes)))


class _EpochLoader(torch.utils.data.DataLoader):
    """A DataLoader over a :class:`CellDataset` that sets the dataset's epoch
    each time an epoch starts (when it is iterated): the trainer's epoch
    when ``epoch_of`` gives one, else how many times it was iterated.
    Lightning calls ``set_epoch`` on samplers only, and an iterable dataset
    has none. Its length is the batches of this rank's share."""

    def __init__(self, dataset: CellDataset, epoch_of: Callable[[], int | None], **options: Any) -> None:
        super().__init__(dataset, batch_size=None, **options)
        self._epoch_of = epoch_of
        self._iterations = 0
        self._lengths: dict[tuple[int, int], int] = {}

    def __iter__(self) -> Any:
        epoch = self._epoch_of()
        assert isinstance(self.dataset, CellDataset)
        self.dataset.set_epoch(self._iterations if epoch is None else epoch)
        self._iterations += 1
        return super().__iter__()

    def __len__(self) -> int:
        assert isinstance(self.dataset, CellDataset)
        rank, world_size = _distributed()
        key = (rank, world_size)
        if key not in self._lengths:
            self._lengths[key] = _share_batches(self.dataset, rank, world_size, max(1, self.num_workers))
        return self._lengths[key]


def _share_batches(data: CellDataset, rank: int, world_size: int, num_workers: int) -> int:
    """Batches one epoch of ``data`` gives rank ``rank`` of ``world_size``,
    over its ``num_workers`` DataLoader workers (the Rust loader's count)."""
    source = data._open(1)
    return sum(
        len(source.batches(**data.batch_options, rank=rank, world_size=world_size, worker=w, num_workers=num_workers,
                           obs_columns=None, cells=data.cells))
        for w in range(num_workers)
    )


class DataModule(pl.LightningDataModule):
    """A ``LightningDataModule`` over the cells of a deltacells dataset or
    collection: train, validation and test splits, each read by a
    :class:`deltacells.torch.CellDataset` through a ``DataLoader``.

    >>> data = DataModule("out/pbmc", batch_size=512, split_by="donor", fractions=(0.8, 0.1, 0.1),
    ...                   obs_columns=["cell_type"], balance="cell_type")
    >>> trainer = lightning.pytorch.Trainer(max_epochs=5, accelerator="cpu", devices=2, strategy="ddp")
    >>> trainer.fit(model, datamodule=data)        # batch["X"], batch["obs"]["cell_type"], batch["cells"]

    Parameters
    ----------
    source
        What :func:`deltacells.open_dataset` opens (a folder, or a
        ``s3://``, ``gs://`` or ``http(s)://`` prefix, with the options of
        ``open_dataset`` among ``options``), an open
        :class:`deltacells.Dataset`, or a :class:`deltacells.Collection`.
    batch_size
        Cells per training batch.
    split_by
        An obs column (a donor or sample column, say): the cells are split
        by :meth:`deltacells.Dataset.split`, every group of it whole in one
        part. Without it the cells are split at random (:func:`random_split`).
    fractions
        Shares of the train, validation and test parts (1 to 3 numbers
        summing to 1; a part left out is empty).
    split_seed
        Seed of the split.
    splits
        The parts given instead: train, validation and test cells (1 to 3
        arrays of cell indices); ``split_by`` and ``fractions`` then unused.
    cells
        The cells to split (default: every cell; repeats count once).
    obs_columns
        Obs columns of every batch (``batch["obs"]``), localized now.
    eval_batch_size
        Cells per batch of validation, test and prediction (default
        ``batch_size``).
    transform
        Turns each :class:`deltacells.CellBatch` into the batch the model
        gets; default :func:`deltacells.torch.to_tensors`. It runs in
        DataLoader workers when there are some, so it must pickle then.
    dataloader_options
        Keyword arguments of each ``torch.utils.data.DataLoader``
        (``num_workers``, ``persistent_workers``, ``pin_memory``,
        ``multiprocessing_context``...); not ``batch_size``, ``sampler`` or
        ``collate_fn``, which are the loader's.
    options
        The other options of :class:`deltacells.torch.CellDataset`: the
        epoch's order and draw (``shuffle``, ``seed``, ``drop_last``,
        ``window_tiles``, ``mix_chunks``, ``weights``, ``num_samples``,
        ``balance``, ``class_weights``: for training only; ``weights`` has one
        value per cell of ``cells``, or of the dataset, and the train cells'
        are used), the form (``genes``, ``gene_column``, ``normalize``,
        ``normalize_over``, ``log1p``, ``dense``, ``top_k``, ``dtype``,
        ``sorted_columns``), ``prefetch`` and ``threads``; and those of
        :func:`deltacells.open_dataset` (``cache_dir``, ``endpoint``,
        ``anonymous``, ``cache_bytes``) for a ``source`` given as a location.

    Ranks and epochs. Each rank of a distributed job (``strategy="ddp"``)
    reads its share of every split: the rank and world size are those of
    ``torch.distributed`` when it is initialized, read as each epoch starts.
    The trainer's ``current_epoch`` is given to the loader's ``set_epoch``
    as each epoch starts (another order each epoch, the same after a resume).
    Under DDP every rank must take as many training steps: where the ranks'
    shares would make unequal numbers of batches, :meth:`train_dataloader`
    raises :class:`deltacells.InvalidArgumentError` asking for
    ``drop_last=True`` or another ``batch_size``.

    Raises :class:`deltacells.InvalidArgumentError`,
    :class:`deltacells.ArgumentTypeError` or
    :class:`deltacells.UnknownNameError` naming a bad argument, and
    :class:`deltacells.DatasetNotFoundError`, when the module is made.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Dataset | Collection,
        batch_size: int = DEFAULTS["batch_size"],
        *,
        split_by: str | None = None,
        fractions: Sequence[float] = (0.8, 0.1, 0.1),
        split_seed: int = 0,
        splits: Sequence[Cells] | None = None,
        cells: Cells | None = None,
        obs_columns: Sequence[str] | None = None,
        eval_batch_size: int | None = None,
        transform: Callable[[CellBatch], Any] | None = None,
        dataloader_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        for name in options:
            if name not in _LOADER_OPTIONS and name not in _OPEN_OPTIONS:
                raise ArgumentTypeError(
                    f"{name}: not an argument of DataModule, nor an option of CellDataset or open_dataset "
                    f"({', '.join(_LOADER_OPTIONS + _OPEN_OPTIONS)})"
                )
        loader = {k: v for k, v in options.items() if k in _LOADER_OPTIONS}
        opening = {k: v for k, v in options.items() if k not in _LOADER_OPTIONS}
        #: The dataset or collection, open in this process.
        self.source: Dataset | Collection = self._open(source, opening, obs_columns)
        self.batch_size = integer("batch_size", batch_size, 1)
        self.eval_batch_size = self.batch_size if eval_batch_size is None else integer(
            "eval_batch_size", eval_batch_size, 1
        )
        self.dataloader_options = self._loader_arguments(dataloader_options)
        self.obs_columns = list(obs_columns) if obs_columns else None
        #: The cells of the module (sorted int64 indices): those of ``cells``, or every cell.
        self.cells: np.ndarray = (
            np.arange(self.source.n_cells, dtype=np.int64) if cells is None else np.unique(
                self.source.cell_indices(cells))
        )
        self.train_cells, self.val_cells, self.test_cells = self._split(splits, split_by, fractions, split_seed)
        weights = loader.pop("weights", None)
        if weights is not None:
            loader["weights"] = self._train_weights(weights)
        evaluation = {k: v for k, v in loader.items() if k not in _TRAIN_ONLY}
        self.transform = transform
        self._train = self._dataset(self.train_cells, self.batch_size, loader)
        self._val = self._dataset(self.val_cells, self.eval_batch_size, {**evaluation, "shuffle": False})
        self._test = self._dataset(self.test_cells, self.eval_batch_size, {**evaluation, "shuffle": False})
        self._all = self._dataset(self.cells, self.eval_batch_size, {**evaluation, "shuffle": False})

    @staticmethod
    def _open(
        source: str | os.PathLike[str] | Dataset | Collection,
        opening: dict[str, Any],
        obs_columns: Sequence[str] | None,
    ) -> Dataset | Collection:
        if isinstance(source, Collection):
            if opening:
                raise InvalidArgumentError(
                    f"{', '.join(opening)}: a collection is opened with the options of open_collection"
                )
            if obs_columns:
                source.obs.ensure_local(list(obs_columns))
            return source
        if isinstance(source, Dataset):
            if opening:
                return open_dataset(source.root, obs_columns, **{"cache_dir": source._cache_dir, **source._options,
                                                                 **opening})
            if obs_columns:
                source.obs.ensure_local(list(obs_columns))
            return source
        return open_dataset(source, obs_columns, **opening)  # type: ignore[arg-type]

    @staticmethod
    def _loader_arguments(given: Mapping[str, Any] | None) -> dict[str, Any]:
        if given is None:
            return {}
        if not isinstance(given, Mapping):
            raise ArgumentTypeError(f"dataloader_options must be a mapping of DataLoader arguments, not {given!r}")
        known = inspect.signature(torch.utils.data.DataLoader).parameters
        for name in given:
            if name in _OWN_LOADER_ARGUMENTS:
                raise InvalidArgumentError(f"dataloader_options: {name} is set by the DataModule (the loader's own)")
            if name not in known:
                raise ArgumentTypeError(f"dataloader_options: {name!r} is not an argument of DataLoader")
        return dict(given)

    def _split(
        self, splits: Sequence[Cells] | None, split_by: str | None, fractions: Sequence[float], seed: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        empty = np.zeros(0, dtype=np.int64)
        if splits is not None:
            if isinstance(splits, (str, bytes)) or not 1 <= len(splits) <= 3:
                raise InvalidArgumentError(f"splits must be 1 to 3 lists of cells (train, validation, test), not "
                                           f"{splits!r:.80}")
            parts = [np.sort(self.source.cell_indices(part)) for part in splits]
            joined = np.concatenate(parts)
            if len(np.unique(joined)) != len(joined):
                raise InvalidArgumentError("splits: a cell is in two parts (or twice in one)")
        elif split_by is not None:
            parts = list(self.source.split(split_by, _parts(fractions), seed, self.cells))
        else:
            parts = list(random_split(self.cells, fractions, seed))
        parts += [empty] * (3 - len(parts))
        if not len(parts[0]):
            raise InvalidArgumentError("the train split has no cells (fractions, splits or cells)")
        return parts[0], parts[1], parts[2]

    def _train_weights(self, weights: Any) -> np.ndarray:
        """``weights`` (one per cell of the module, or of the dataset) of the
        train cells, in the train cells' order."""
        try:
            values = np.asarray(weights, dtype=np.float64)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"weights must be numbers, one per cell, not {weights!r:.80}") from None
        if values.ndim != 1 or len(values) not in (len(self.cells), self.source.n_cells):
            raise InvalidArgumentError(
                f"weights has {values.size} values; give one per cell of cells= ({len(self.cells)}) "
                f"or of the dataset ({self.source.n_cells})"
            )
        if len(values) == self.source.n_cells:
            return values[self.train_cells]
        order = np.argsort(self.cells, kind="stable")
        return values[order[np.searchsorted(self.cells, self.train_cells, sorter=order)]]

    def _dataset(self, cells: np.ndarray, batch_size: int, options: dict[str, Any]) -> CellDataset | None:
        if not len(cells):
            return None
        return CellDataset(self.source, batch_size, obs_columns=self.obs_columns, cells=cells,
                           transform=self.transform, **options)

    @property
    def n_cells(self) -> int:
        """Cells of the module (of ``cells``, or of the dataset)."""
        return len(self.cells)

    @property
    def n_genes(self) -> int:
        """Columns of every batch (the vocabulary's with ``genes=``)."""
        assert self._all is not None
        genes = self._all.batch_options.get("genes")
        if genes is None:
            return self.source.n_genes
        assert isinstance(self.source, Dataset)
        return self.source.vocabulary(genes, column=self._all.batch_options.get("gene_column")).n_genes

    def _current_epoch(self) -> int | None:
        return None if self.trainer is None else int(self.trainer.current_epoch)

    def _loader(self, data: CellDataset | None) -> _EpochLoader | list[Any]:
        if data is None:
            return []  # Lightning skips a stage without loaders
        return _EpochLoader(data, self._current_epoch, **self.dataloader_options)

    def train_dataloader(self) -> _EpochLoader:
        """The train cells, shuffled (by default) with the trainer's epoch.
        Raises :class:`deltacells.InvalidArgumentError` under DDP when the
        ranks would take unequal numbers of steps."""
        assert self._train is not None
        loader = self._loader(self._train)
        assert isinstance(loader, _EpochLoader)
        rank, world_size = _distributed()
        if world_size > 1:
            workers = max(1, loader.num_workers)
            counts = {_share_batches(self._train, r, world_size, workers) for r in range(world_size)}
            if len(counts) > 1:
                raise InvalidArgumentError(
                    f"batch_size {self.batch_size}: the {world_size} ranks' shares of {len(self.train_cells)} train "
                    f"cells make {min(counts)} to {max(counts)} batches, and DDP needs as many steps on every rank; "
                    "pass drop_last=True, or a batch_size that divides the shares evenly"
                )
        return loader

    def val_dataloader(self) -> _EpochLoader | list[Any]:
        """The validation cells, in dataset order (each rank its share); an
        empty list without validation cells."""
        return self._loader(self._val)

    def test_dataloader(self) -> _EpochLoader | list[Any]:
        """The test cells, in dataset order (each rank its share)."""
        return self._loader(self._test)

    def predict_dataloader(self) -> torch.utils.data.DataLoader:
        """Every cell of the module, in dataset order (each rank its share;
        ``batch["cells"]`` says which)."""
        assert self._all is not None
        return torch.utils.data.DataLoader(self._all, batch_size=None, **self.dataloader_options)

    def __str__(self) -> str:
        # (Lightning's own lists the sizes of its loaders, which it makes)
        return repr(self)

    def __repr__(self) -> str:
        root = self.source.root
        return (f"<deltacells.lightning.DataModule {redact(root)!r}: {len(self.train_cells):,} train, "
                f"{len(self.val_cells):,} validation, {len(self.test_cells):,} test cells, batches of "
                f"{self.batch_size}>")
