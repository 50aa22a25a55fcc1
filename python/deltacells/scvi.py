"""scvi-tools integration: :class:`DataModule`, a ``LightningDataModule``
that trains scvi-tools models from a deltacells dataset or collection, in the
shape of scvi-tools' own custom data modules (``scvi.dataloaders.TileDBDataModule``
and ``MappedCollectionDataModule``): the model is made from the module's
``registry``, trained with ``model.train(datamodule=...)``, and read back
through its ``inference_dataloader()``.

>>> import scvi
>>> from deltacells.scvi import DataModule
>>> data = DataModule("s3://lab/atlas", batch_key="sample", labels_key="cell_type", split_by="donor")
>>> model = scvi.model.SCVI(registry=data.registry, n_latent=10)
>>> model.train(datamodule=data, max_epochs=20)
>>> latent = model.get_latent_representation(dataloader=data.inference_dataloader())

Importing this module imports scvi-tools (and with it lightning and torch);
nothing else in the package does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import scvi
import torch

from ._args import column_names, integer
from ._collection import Collection
from ._dataset import Dataset
from ._deltacells import redact
from ._loader import CellBatch
from ._types import Cells
from .exceptions import InvalidArgumentError
from .lightning import DataModule as _LightningDataModule

#: The keys of scvi-tools' tensors (``scvi.REGISTRY_KEYS``).
_KEYS = scvi.REGISTRY_KEYS

#: Options of :class:`deltacells.lightning.DataModule` this module sets
#: itself: scvi-tools models take counts, dense, as float32.
_FIXED = ("normalize", "normalize_over", "log1p", "dense", "dtype", "top_k", "sorted_columns", "transform",
          "obs_columns")


class ScviTensors:
    """Turns a :class:`deltacells.CellBatch` (read with ``dense=True,
    dtype=np.float32``) into the dict of tensors scvi-tools' modules take:
    ``X`` (float32 counts, cells x genes: the reader's own array, no copy),
    ``batch``, ``labels`` (and ``sample``) as int64 ``(cells, 1)`` codes,
    ``extra_categorical_covs`` (int64) and ``extra_continuous_covs``
    (float32) as ``(cells, k)``, and ``ind_x``, the cells' indices. Every
    column is encoded with NumPy, one call per column and batch, never per
    cell. A DataModule makes it; it pickles (for DataLoader workers).

    Parameters
    ----------
    keys
        scvi-tools' key (``"batch"``, ``"labels"``, ``"sample"``) to the obs
        column it is read from, or None for a column of zeros.
    categorical, continuous
        The covariates' obs columns, in order.
    encodings
        For an obs column that is not a category column, its sorted distinct
        values (a value's code is its position); None for a category column,
        whose codes are used as they are.
    """

    def __init__(
        self,
        keys: Mapping[str, str | None],
        categorical: Sequence[str],
        continuous: Sequence[str],
        encodings: Mapping[str, np.ndarray | None],
    ) -> None:
        self.keys = dict(keys)
        self.categorical = list(categorical)
        self.continuous = list(continuous)
        self.encodings = dict(encodings)

    def codes(self, column: str, values: np.ndarray) -> np.ndarray:
        """``values`` of obs column ``column`` (as :meth:`Obs.take` gives
        them) as int64 codes."""
        uniques = self.encodings.get(column)
        if uniques is None:
            return values.astype(np.int64)
        if values.dtype.kind == "O":
            values = values.astype(str)
        return np.searchsorted(uniques, values).astype(np.int64)

    def __call__(self, batch: CellBatch) -> dict[str, torch.Tensor]:
        x = batch.X
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            raise InvalidArgumentError("ScviTensors takes batches read with dense=True, dtype=np.float32")
        n = len(batch.cells)
        out = {_KEYS.X_KEY: torch.from_numpy(x), _KEYS.INDICES_KEY: torch.from_numpy(batch.cells.reshape(n, 1))}
        for key, column in self.keys.items():
            if column is None:
                if key != _KEYS.SAMPLE_KEY:
                    out[key] = torch.zeros((n, 1), dtype=torch.int64)
            else:
                out[key] = torch.from_numpy(self.codes(column, batch.obs[column]).reshape(n, 1))
        if self.categorical:
            codes = np.stack([self.codes(c, batch.obs[c]) for c in self.categorical], axis=1)
            out[_KEYS.CAT_COVS_KEY] = torch.from_numpy(codes)
        if self.continuous:
            values = np.stack([np.asarray(batch.obs[c], dtype=np.float32) for c in self.continuous], axis=1)
            out[_KEYS.CONT_COVS_KEY] = torch.from_numpy(values)
        return out


class _InferenceLoader:
    """Cells in a given order, in batches of scvi-tools tensors, read ahead
    by :meth:`deltacells.Dataset.gathers` (what ``get_latent_representation``
    and the other ``get_*`` methods take as ``dataloader=``)."""

    def __init__(self, module: DataModule, cells: np.ndarray, batch_size: int) -> None:
        self._module = module
        self._lists = [cells[i:i + batch_size] for i in range(0, len(cells), batch_size)]

    def __len__(self) -> int:
        return len(self._lists)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        module = self._module
        form: dict[str, Any] = dict(ahead=4, obs_columns=module.obs_keys, dense=True, dtype=np.float32)
        if isinstance(module.source, Dataset):
            form.update(genes=module.genes, gene_column=module.gene_column)
        for batch in module.source.gathers(self._lists, **form):
            yield module.tensors(batch)


class DataModule(_LightningDataModule):
    """A ``LightningDataModule`` for scvi-tools models over the cells of a
    deltacells dataset or collection, local or in a bucket.

    >>> data = DataModule("out/pbmc", batch_key="sample", train_size=0.9)
    >>> model = scvi.model.SCVI(registry=data.registry)
    >>> model.train(datamodule=data, max_epochs=10)
    >>> z = model.get_latent_representation(dataloader=data.inference_dataloader())   # cells x n_latent

    Batches are the dicts scvi-tools' modules take (see
    :class:`ScviTensors`): counts as a dense float32 ``X`` written by the
    Rust reader, obs columns as codes. The registry follows
    ``MappedCollectionDataModule``'s (``setup_method_name`` is
    ``"setup_datamodule"``), with the mappings ``setup_anndata`` would make
    from the same columns: a category column's categories as the dataset
    stores them (unused ones too, as pandas keeps them), another column's
    sorted distinct values; no ``batch_key`` (or ``labels_key``) gives one
    batch (label) of code 0, as ``setup_anndata`` does.

    Parameters
    ----------
    source
        A dataset's location (with :func:`deltacells.open_dataset`'s options
        among ``options``), an open :class:`deltacells.Dataset`, or a
        :class:`deltacells.Collection`.
    batch_size
        Cells per training batch (scvi-tools' default, 128).
    batch_key, labels_key, sample_key
        Obs columns of the batch, the labels and the sample (of any kind;
        no cell of the module may miss a value).
    categorical_covariate_keys, continuous_covariate_keys
        Obs columns of the covariates (continuous ones numeric or bool).
    train_size, validation_size
        Shares of the training and validation cells (``validation_size``
        default: the rest), as ``model.train`` takes them; the cells left
        are the test part.
    split_by
        An obs column whose groups (donors, say) are kept whole in one part
        (:meth:`deltacells.Dataset.split`); otherwise the cells are split at
        random, sized as scvi-tools' ``DataSplitter`` sizes them.
    split_seed, splits, cells, eval_batch_size, dataloader_options
        As :class:`deltacells.lightning.DataModule` takes them.
    model_name
        The model class the registry is for (``"SCVI"``).
    options
        The loader's other options (``shuffle``, ``seed``, ``drop_last``,
        ``window_tiles``, ``mix_chunks``, ``prefetch``, ``threads``; class
        sampling: ``balance``, ``class_weights``, ``weights``,
        ``num_samples``; genes: ``genes``, ``gene_column``) and
        :func:`deltacells.open_dataset`'s. Not the values' form, which
        scvi-tools fixes (counts): ``normalize``, ``log1p``, ``dense``,
        ``dtype``... are refused by name.

    Raises :class:`deltacells.InvalidArgumentError`,
    :class:`deltacells.ArgumentTypeError` or
    :class:`deltacells.UnknownNameError` naming a bad argument or column,
    when the module is made.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Dataset | Collection,
        batch_size: int = 128,
        *,
        batch_key: str | None = None,
        labels_key: str | None = None,
        sample_key: str | None = None,
        categorical_covariate_keys: Sequence[str] | None = None,
        continuous_covariate_keys: Sequence[str] | None = None,
        train_size: float = 0.9,
        validation_size: float | None = None,
        split_by: str | None = None,
        split_seed: int = 0,
        splits: Sequence[Cells] | None = None,
        cells: Cells | None = None,
        eval_batch_size: int | None = None,
        model_name: str = "SCVI",
        dataloader_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        for name in options:
            if name in _FIXED:
                raise InvalidArgumentError(
                    f"{name}: scvi-tools models take the counts as they are, dense and float32; the scvi "
                    "DataModule sets the form itself"
                )
        self.model_name = model_name
        self.batch_key, self.labels_key, self.sample_key = (
            _key(n, v) for n, v in (("batch_key", batch_key), ("labels_key", labels_key), ("sample_key", sample_key))
        )
        self.categorical_covariate_keys = _keys("categorical_covariate_keys", categorical_covariate_keys)
        self.continuous_covariate_keys = _keys("continuous_covariate_keys", continuous_covariate_keys)
        categorical = [k for k in (self.batch_key, self.labels_key, self.sample_key) if k is not None]
        categorical += self.categorical_covariate_keys
        #: The obs columns every batch reads.
        self.obs_keys = list(dict.fromkeys(categorical + self.continuous_covariate_keys))
        self.genes = options.get("genes")
        self.gene_column = options.get("gene_column")
        self.train_size = _share("train_size", train_size)
        self.validation_size = 1.0 - self.train_size if validation_size is None else _share(
            "validation_size", validation_size
        )
        if self.train_size + self.validation_size > 1.0 + 1e-9:
            raise InvalidArgumentError(
                f"train_size {train_size} and validation_size {validation_size} add up to more than 1"
            )
        # Without validation_size the validation part is the rest, as
        # scvi-tools' DataSplitter makes it (no cell lost to rounding).
        fractions: tuple[float, ...] = (self.train_size, 1.0 - self.train_size) if validation_size is None else (
            self.train_size, self.validation_size, max(0.0, 1.0 - self.train_size - self.validation_size)
        )
        # The loaders made by super().__init__ carry this transform; it learns
        # the columns' encodings below, once the source is open.
        self._encodings: dict[str, np.ndarray | None] = {}
        self._mappings: dict[str, np.ndarray] = {}
        #: The DataModule's transform (picklable).
        self.tensors = ScviTensors({}, [], [], {})
        super().__init__(
            source, batch_size, split_by=split_by, fractions=fractions, split_seed=split_seed, splits=splits,
            cells=cells, obs_columns=self.obs_keys, eval_batch_size=eval_batch_size, transform=self.tensors,
            dataloader_options=dataloader_options, dense=True, dtype=np.float32, **options,
        )
        for column in categorical:
            self._encode(column)
        for column in self.continuous_covariate_keys:
            self._check_continuous(column)
        self.tensors.keys.update({_KEYS.BATCH_KEY: self.batch_key, _KEYS.LABELS_KEY: self.labels_key,
                                  _KEYS.SAMPLE_KEY: self.sample_key})
        self.tensors.categorical += self.categorical_covariate_keys
        self.tensors.continuous += self.continuous_covariate_keys
        self.tensors.encodings.update(self._encodings)
        self._var_names = self._column_names()

    # The columns and their codes.

    def _encode(self, column: str) -> None:
        """The mapping of ``column`` (code to value) and how to encode it; every
        cell of the module must have a value."""
        if column in self._mappings:
            return
        obs = self.source.obs
        kind = obs.kind(column)
        values = obs.take(self.cells, [column])[column]
        if kind == "category":
            if len(values) and values.min() < 0:
                raise InvalidArgumentError(
                    f"obs column {column!r} misses a value for {int((values < 0).sum())} of the module's cells; "
                    "choose the cells that have one with cells= (obs.where)"
                )
            self._mappings[column] = np.asarray(obs.categories(column), dtype=object)
            self._encodings[column] = None
            return
        if values.dtype.kind == "f":
            if np.isnan(values).any():
                raise InvalidArgumentError(
                    f"obs column {column!r} misses a value for {int(np.isnan(values).sum())} of the module's cells"
                )
        elif values.dtype.kind == "O":
            if any(v is None for v in values):
                raise InvalidArgumentError(f"obs column {column!r} misses a value for some of the module's cells")
            values = values.astype(str)
        uniques = np.unique(values)
        self._mappings[column] = uniques.astype(object)
        self._encodings[column] = uniques

    def _check_continuous(self, column: str) -> None:
        obs = self.source.obs
        if obs.kind(column) not in ("numeric", "bool"):
            raise InvalidArgumentError(
                f"continuous_covariate_keys: obs column {column!r} is {obs.kind(column)}, not numeric"
            )
        values = np.asarray(obs.take(self.cells, [column])[column], dtype=np.float64)
        if np.isnan(values).any():
            raise InvalidArgumentError(f"obs column {column!r} misses a value for some of the module's cells")

    def _column_names(self) -> np.ndarray:
        if self.genes is None:
            names = self.source.var_names
            return np.asarray(names if names is not None else [str(j) for j in range(self.n_genes)], dtype=object)
        assert isinstance(self.source, Dataset)
        return np.asarray(self.source.vocabulary(self.genes, column=self.gene_column).names, dtype=object)

    # What scvi-tools reads of a data module.

    @property
    def n_obs(self) -> int:
        """Cells of the module (``cells``, or the dataset's)."""
        return self.n_cells

    @property
    def n_vars(self) -> int:
        """Genes of every batch."""
        return len(self._var_names)

    @property
    def var_names(self) -> np.ndarray:
        """The genes of ``X``'s columns, in order."""
        return self._var_names

    @property
    def n_train(self) -> int:
        return len(self.train_cells)

    @property
    def n_val(self) -> int:
        return len(self.val_cells)

    @property
    def train_idx(self) -> np.ndarray:
        return self.train_cells

    @property
    def val_idx(self) -> np.ndarray:
        return self.val_cells

    @property
    def test_idx(self) -> np.ndarray:
        return self.test_cells

    def _mapping(self, column: str | None) -> np.ndarray:
        return np.array([0]) if column is None else self._mappings[column]

    @property
    def batch_labels(self) -> np.ndarray:
        """The batches, code ``i`` for ``batch_labels[i]``."""
        return self._mapping(self.batch_key)

    @property
    def labels(self) -> np.ndarray:
        """The labels, code ``i`` for ``labels[i]``."""
        return self._mapping(self.labels_key)

    @property
    def label_keys(self) -> list[str] | None:
        return None if self.labels_key is None else [self.labels_key]

    @property
    def samples(self) -> np.ndarray | None:
        return None if self.sample_key is None else self._mappings[self.sample_key]

    @property
    def n_batch(self) -> int:
        return len(self.batch_labels)

    @property
    def n_labels(self) -> int:
        return len(self.labels)

    @property
    def n_samples(self) -> int:
        return 0 if self.sample_key is None else len(self._mappings[self.sample_key])

    @property
    def n_obs_per_sample(self) -> torch.Tensor:
        if self.sample_key is None:
            return torch.tensor([])
        values = self.source.obs.take(self.cells, [self.sample_key])[self.sample_key]
        codes = self.tensors.codes(self.sample_key, values)
        return torch.tensor(np.bincount(codes, minlength=self.n_samples), dtype=torch.float32)

    def _categorical_covariates(self) -> dict[str, Any]:
        keys = self.categorical_covariate_keys
        if not keys:
            return {"data_registry": {}, "state_registry": {}, "summary_stats": {"n_extra_categorical_covs": 0}}
        mapping = {k: self._mappings[k] for k in keys}
        return {
            "data_registry": {"attr_key": "_scvi_extra_categorical_covs", "attr_name": "obsm"},
            "state_registry": {"field_keys": keys, "mapping": mapping,
                               "n_cats_per_key": [len(mapping[k]) for k in keys]},
            "summary_stats": {"n_extra_categorical_covs": len(keys)},
        }

    def _continuous_covariates(self) -> dict[str, Any]:
        keys = self.continuous_covariate_keys
        if not keys:
            return {"data_registry": {}, "state_registry": {}, "summary_stats": {"n_extra_continuous_covs": 0}}
        return {
            "data_registry": {"attr_key": "_scvi_extra_continuous_covs", "attr_name": "obsm"},
            "state_registry": {"columns": np.array(keys, dtype=object)},
            "summary_stats": {"n_extra_continuous_covs": len(keys)},
        }

    @property
    def registry(self) -> dict[str, Any]:
        """What a scvi-tools model is made from:
        ``scvi.model.SCVI(registry=data.registry)``."""
        return {
            "scvi_version": scvi.__version__,
            "model_name": self.model_name,
            "setup_args": {
                "layer": None,
                "batch_key": self.batch_key,
                "labels_key": self.labels_key,
                "samples_key": self.sample_key,
                "size_factor_key": None,
                "categorical_covariate_keys": self.categorical_covariate_keys or None,
                "continuous_covariate_keys": self.continuous_covariate_keys or None,
            },
            "field_registries": {
                _KEYS.X_KEY: {
                    "data_registry": {"attr_name": "X", "attr_key": None},
                    "state_registry": {"n_obs": self.n_obs, "n_vars": self.n_vars, "column_names": self.var_names},
                    "summary_stats": {"n_vars": self.n_vars, "n_cells": self.n_obs},
                },
                _KEYS.BATCH_KEY: {
                    "data_registry": {"attr_name": "obs", "attr_key": "_scvi_batch"},
                    "state_registry": {"categorical_mapping": self.batch_labels, "original_key": self.batch_key},
                    "summary_stats": {"n_batch": self.n_batch},
                },
                _KEYS.LABELS_KEY: {
                    "data_registry": {"attr_name": "obs", "attr_key": "_scvi_labels"},
                    "state_registry": {"categorical_mapping": self.labels, "original_key": self.labels_key},
                    "summary_stats": {"n_labels": self.n_labels},
                },
                _KEYS.INDICES_KEY: {
                    "data_registry": {"attr_name": "obs", "attr_key": "_indices"},
                    "state_registry": {},
                    "summary_stats": {},
                },
                _KEYS.SAMPLE_KEY: {
                    "data_registry": {"attr_name": "obs", "attr_key": "_scvi_sample"},
                    "state_registry": {"categorical_mapping": self.samples, "original_key": self.sample_key},
                    "n_obs_per_sample": {"n_obs_per_sample": self.n_obs_per_sample},
                    "summary_stats": {"n_sample": self.n_samples},
                },
                _KEYS.SIZE_FACTOR_KEY: {"data_registry": {}, "state_registry": {}, "summary_stats": {}},
                _KEYS.CAT_COVS_KEY: self._categorical_covariates(),
                _KEYS.CONT_COVS_KEY: self._continuous_covariates(),
            },
            "setup_method_name": "setup_datamodule",
        }

    def inference_dataloader(self, indices: Cells | None = None, batch_size: int | None = None) -> _InferenceLoader:
        """The module's cells (or ``indices``, in their order), unshuffled,
        as scvi-tools tensors: the ``dataloader=`` of
        ``get_latent_representation`` and the other ``get_*`` methods, whose
        rows are then those cells in that order.

        >>> z = model.get_latent_representation(dataloader=data.inference_dataloader())
        """
        cells = self.cells if indices is None else self.source.cell_indices(indices)
        size = self.eval_batch_size if batch_size is None else integer("batch_size", batch_size, 1)
        return _InferenceLoader(self, cells, size)

    def __repr__(self) -> str:
        keys = ", ".join(f"{k}={getattr(self, k)!r}" for k in ("batch_key", "labels_key", "sample_key")
                         if getattr(self, k) is not None)
        return (f"<deltacells.scvi.DataModule {redact(self.source.root)!r}: {self.n_train:,} train, {self.n_val:,} "
                f"validation cells x {self.n_vars:,} genes{', ' + keys if keys else ''}>")


def _key(name: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidArgumentError(f"{name} must be the name of an obs column, not {value!r}")


def _keys(name: str, value: Any) -> list[str]:
    return [] if value is None else column_names(name, value)


def _share(name: str, value: Any) -> float:
    try:
        share = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{name} must be a number from 0 to 1, not {value!r}") from None
    if isinstance(value, bool) or not 0.0 <= share <= 1.0:
        raise InvalidArgumentError(f"{name} must be a number from 0 to 1, not {value!r}")
    return share
