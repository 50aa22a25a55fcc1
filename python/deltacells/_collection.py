"""Many datasets read as one (:func:`open_collection`): one cell space, one
gene vocabulary, obs columns merged by value, one shuffled loader over all of
them."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np

from . import _deltacells
from ._args import integer
from ._dataset import _INHERITED, Dataset
from ._loader import Gathers, Loader
from ._obs import as_frame, where
from ._options import DEFAULTS, batch_options, form_from, form_options
from ._sampling import split
from ._types import Batch, BatchArgs, Cells, Form, FormArgs, LoaderOptions, StoreArgs
from ._vocabulary import Vocabulary
from .exceptions import (
    ArgumentTypeError,
    CellIndexError,
    InvalidArgumentError,
    UnknownNameError,
)

if TYPE_CHECKING:
    import anndata
    import pandas as pd

#: What ``genes=`` of :func:`open_collection` accepts.
GeneChoice = str | Sequence[str] | np.ndarray


@dataclass(frozen=True)
class Member:
    """One dataset of a collection (``coll.datasets[i]``).

    Attributes
    ----------
    name
        Its name: the key given in a mapping of roots, else the root.
    root
        Where it is, as given.
    start
        The collection's index of its first cell: its cells are
        ``start .. start + n_cells``.
    n_cells, n_genes, n_tiles
        Its cells, stored genes and tiles.
    manifest_sha256
        SHA-256 of its manifest.json: a dataset that changes (an append, a new
        conversion) is refused by name.
    """

    name: str
    root: str
    start: int
    n_cells: int
    n_genes: int
    n_tiles: int
    manifest_sha256: str


class Collection:
    """Several datasets read as one. Use :func:`open_collection` to get one.

    Cells are numbered across the datasets, one after another in the order
    given (``datasets[i].start`` is the first cell of dataset ``i``), and
    every batch's columns are the collection's genes (:attr:`var_names`),
    each dataset's cells written in them by the Rust reader. A collection
    pickles to a small state (the datasets' roots, tiles and manifest
    digests, the genes): another process opens each dataset only when it
    first reads from it.
    """

    def __init__(
        self,
        state: str,
        genes: GeneChoice,
        options: dict[str, Any],
        cache_dir: str | None,
        weights: Mapping[str, float] | None,
        source: str | None = None,
        obs_schema: dict[str, dict[str, Any]] | None = None,
        raw: _deltacells.RawCollection | None = None,
    ) -> None:
        self._state = state
        self._genes = genes
        self._options = dict(options)
        self._cache_dir = cache_dir
        self._source = source
        self._handle = raw
        self._pid = os.getpid() if raw is not None else None
        self._members: dict[int, Dataset] = {}
        #: (dataset, obs column) localized by this process.
        self._localized: set[tuple[int, str]] = set()
        self._obs_schema = obs_schema
        info = json.loads(state)
        starts = np.cumsum([0] + [m["n_cells"] for m in info["members"]])
        self.datasets: list[Member] = [
            Member(
                name=m["name"], root=m["root"], start=int(starts[i]), n_cells=m["n_cells"], n_genes=m["n_genes"],
                n_tiles=len(m["tile_cells"]), manifest_sha256=m["manifest_sha256"],
            )
            for i, m in enumerate(info["members"])
        ]
        self._starts = starts.astype(np.int64)
        self._index = {m.name: i for i, m in enumerate(self.datasets)}
        self.var_names: list[str] = list(info["vocabulary"])
        self.gene_column: str | None = info["gene_column"]
        self.weights = _checked_weights(weights, self.datasets)

    @property
    def native(self) -> _deltacells.RawCollection:
        """The Rust collection behind this one, in this process: made again
        (from the state, opening nothing) in a process forked from the one
        that made it."""
        if self._pid != os.getpid():
            if self._handle is not None:
                _INHERITED.append(self._handle)
            genes = self._genes if isinstance(self._genes, str) else list(self._genes)
            self._handle = _deltacells.RawCollection.from_state(
                self._state, genes, self._options.get("threads"),
                self._options.get("cache_bytes", _deltacells.DEFAULT_CACHE_BYTES), self._cache_dir,
            )
            self._pid = os.getpid()
            self._members = {}
            self._localized = set()
        assert self._handle is not None
        return self._handle

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            Collection,
            (self._state, self._genes, self._options, self._cache_dir, self.weights, self._source,
             self._obs_schema),
        )

    def _copy(self, threads: int | None) -> Collection:
        """This collection with ``threads`` decoding threads, made anew from its
        state (nothing opened until read)."""
        options = {**self._options, "threads": threads}
        return Collection(
            self._state, self._genes, options, self._cache_dir, self.weights, self._source, self._obs_schema
        )

    @property
    def root(self) -> str:
        """The collection file it was read from, or a short description."""
        return self._source or f"collection of {len(self.datasets)} datasets"

    @property
    def n_cells(self) -> int:
        """Cells of all the datasets."""
        return int(self._starts[-1])

    @property
    def n_genes(self) -> int:
        """Columns of every batch: the collection's genes."""
        return len(self.var_names)

    def __len__(self) -> int:
        return self.n_cells

    def dataset(self, which: int | str) -> Dataset:
        """Dataset ``which`` (its position or name), opened now if this
        process has not opened it (and refused, with
        :class:`DatasetChangedError`, if it changed)."""
        i = self._position(which)
        self.native  # noqa: B018 -- a forked process starts afresh
        if i not in self._members:
            m = self.datasets[i]
            raw = self.native.member(i)
            options = {k: v for k, v in self._options.items() if k == "threads" or k in StoreArgs.__annotations__}
            self._members[i] = Dataset(m.root, {**options, "cache_bytes": 0}, self._cache_dir, raw)
        return self._members[i]

    def _position(self, which: int | str) -> int:
        if isinstance(which, str):
            if which not in self._index:
                raise UnknownNameError(f"no dataset {which!r} in the collection; its datasets are {list(self._index)}")
            return self._index[which]
        i = integer("dataset", which, 0)
        if i >= len(self.datasets):
            raise CellIndexError(f"dataset {i} is out of range: the collection has {len(self.datasets)}")
        return i

    def cell_indices(self, cells: Cells) -> np.ndarray:
        """``cells`` (a list, an integer array, a range or a slice) as int64
        indices of the collection's cells, each checked: raises
        :class:`CellIndexError` naming the first that is not one."""
        if isinstance(cells, slice):
            try:
                cells = range(*cells.indices(self.n_cells))
            except (TypeError, ValueError) as e:
                raise InvalidArgumentError(f"cells: the slice {cells!r} is not valid: {e}") from None
        if isinstance(cells, range):
            array = np.arange(cells.start, cells.stop, cells.step, dtype=np.int64)
        else:
            try:
                array = np.asarray(cells)
            except (TypeError, ValueError) as e:
                raise ArgumentTypeError(
                    f"cells must be integers in a list, an array, a range or a slice: {e}"
                ) from None
            if array.ndim != 1:
                raise ArgumentTypeError(f"cells must be one-dimensional, not of shape {array.shape}")
            if array.size and not np.issubdtype(array.dtype, np.integer):
                raise ArgumentTypeError(f"cells must be integers, not {array.dtype}")
            if array.size and array.dtype.kind == "u" and int(array.max()) > np.iinfo(np.int64).max:
                raise CellIndexError(
                    f"cell {int(array.max())} is out of range: the collection has {self.n_cells} cells"
                )
            array = np.ascontiguousarray(array, dtype=np.int64)
        bad = (array < 0) | (array >= self.n_cells)
        if bad.any():
            cell = int(array[np.argmax(bad)])
            raise CellIndexError(f"cell {cell} is out of range: the collection has {self.n_cells} cells")
        return array

    def locate(self, cells: Cells) -> tuple[np.ndarray, np.ndarray]:
        """For each cell, its dataset (position in :attr:`datasets`) and its
        row there, as two int64 arrays."""
        index = self.cell_indices(cells)
        member = np.searchsorted(self._starts, index, side="right") - 1
        return member.astype(np.int64), index - self._starts[member]

    @property
    def var(self) -> pd.DataFrame:
        """The genes (the batches' columns, in order) as a DataFrame: the
        number of datasets that hold each (``n_datasets``), and a boolean
        column per dataset name. Opens every dataset."""
        import pandas as pd

        flags = self.native.holders().reshape(len(self.datasets), self.n_genes)
        frame = {"n_datasets": flags.sum(axis=0).astype(np.int64)}
        for i, m in enumerate(self.datasets):
            frame[m.name] = flags[i]
        return pd.DataFrame(frame, index=pd.Index(self.var_names, name=self.gene_column or "gene"))

    @property
    def obs(self) -> CollectionObs:
        """The cell metadata of every dataset, merged by column name
        (:class:`CollectionObs`)."""
        return CollectionObs(self)

    def get_batch(
        self,
        cells: Cells,
        *,
        normalize: float | None = None,
        normalize_over: str = "stored",
        log1p: bool = False,
        dense: bool = False,
        dtype: Any = None,
        sorted_columns: bool = True,
    ) -> Batch | np.ndarray:
        """The cells listed (indices of the collection, any order, repeats
        allowed) as a :class:`Batch` in the collection's genes, or a dense
        array with ``dense=True``; the value options are those of
        :meth:`Dataset.get_batch`. Each dataset's cells are read together."""
        form = form_options(normalize, normalize_over, log1p, dense, None, self.n_genes, dtype, sorted_columns)
        index = self.cell_indices(cells)
        indptr, indices, data, _, _ = self.native.get_formed(index, form)
        if indptr is None or indices is None:
            return data
        return Batch(indptr, indices, data, self.n_genes)

    #: With weights per dataset, every epoch is drawn by them.
    @property
    def _draws_by_default(self) -> bool:
        return self.weights is not None

    def _dataset_weights(self) -> list[float] | None:
        if self.weights is None:
            return None
        return [float(self.weights.get(m.name, 0.0)) for m in self.datasets]

    def _draws(
        self, cells: np.ndarray | None, weights: np.ndarray | None
    ) -> tuple[np.ndarray | None, list[float] | None]:
        """The draw the Rust loader makes, as (per-cell weights, per-dataset
        weights), at most one of them: per-cell weights are scaled so that
        each dataset's cells weigh its share when the collection has weights."""
        shares = self._dataset_weights()
        if weights is None or shares is None:
            return weights, None if weights is not None else shares
        base = np.arange(self.n_cells, dtype=np.int64) if cells is None else cells
        if len(weights) != len(base):
            return weights, None  # the Rust check names the mismatch
        member, _ = self.locate(base)
        totals = np.bincount(member, weights=weights, minlength=len(self.datasets))
        scale = np.divide(np.asarray(shares), totals, out=np.zeros(len(totals)), where=totals > 0)
        return np.ascontiguousarray(weights * scale[member], dtype=np.float64), None

    def _plan(
        self, cells: np.ndarray | None, options: LoaderOptions, weights: np.ndarray | None, num_samples: int | None
    ) -> _deltacells.RawPlan:
        weights, dataset_weights = self._draws(cells, weights)
        return self.native.plan_epoch(cells, options, weights, num_samples, dataset_weights)

    def gathers(
        self,
        lists: Iterable[Cells],
        *,
        ahead: int = 4,
        obs_columns: Sequence[str] | None = None,
        **form: Unpack[FormArgs],
    ) -> Gathers:
        """Gathers planned ahead over the collection's cells, in its gene
        vocabulary: as :meth:`deltacells.Dataset.gathers` (without ``genes``,
        which the collection fixes). Each list may mix cells of any of its
        datasets.

        >>> for batch in coll.gathers([[0, 5_000_000, 7], range(100)], ahead=2):
        ...     x = batch.X.to_scipy()
        """
        return Gathers(self, lists, ahead, obs_columns, None, form_from(form, self.n_genes))

    def _start_gathers(
        self, lists: list[np.ndarray], form: Form, genes: Vocabulary | None, ahead: int
    ) -> _deltacells.RawBatches:
        """Starts reading planned gathers (the gathers' protocol)."""
        return self.native.gathers(lists, form, ahead)

    def _start_batches(
        self, plan: _deltacells.RawPlan, genes: Vocabulary | None, form: Form
    ) -> _deltacells.RawBatches:
        return self.native.batches(plan, form)

    def batches(self, batch_size: int = DEFAULTS["batch_size"], **options: Unpack[BatchArgs]) -> Loader:
        """One epoch of training batches over every dataset, as
        :meth:`Dataset.batches` (every option means what it means there;
        ``cells`` are the collection's indices, and obs columns are merged as
        :class:`CollectionObs` says). The tiles of all the datasets are put
        in one shuffled order, so that each window, and so each batch, holds
        cells of several datasets. Each dataset is opened by a process when
        its share first reads from it.

        With weights per dataset (``weights=`` of :func:`open_collection`),
        an epoch is ``num_samples`` cells (default: the collection's cells, or
        ``cells``), each dataset's share of them in proportion to its weight:
        all of its cells as many whole times as fit, the rest drawn without
        replacement, fixed by ``(seed, epoch)``. Per-cell ``weights`` or
        ``balance`` here then draw within each dataset's share.

        >>> coll = deltacells.open_collection({"a": "out/a", "b": "s3://bucket/b"},
        ...                                   weights={"a": 0.7, "b": 0.3})
        >>> for batch in coll.batches(1024, obs_columns=["cell_type"]):
        ...     x, y = batch.X.to_scipy(), batch.obs["cell_type"]
        """
        loader, sampling, form = batch_options("batches", batch_size, options)
        return Loader(self, loader, form=form_from(form, self.n_genes), **sampling)

    def split(
        self,
        by: str,
        fractions: Sequence[float] = (0.8, 0.1, 0.1),
        seed: int = 0,
        cells: Cells | None = None,
    ) -> tuple[np.ndarray, ...]:
        """Splits the cells (or ``cells``) into parts by the groups of the
        merged obs column ``by``, as :meth:`Dataset.split` does: every group
        (a donor, say, across all datasets that have the column) goes whole
        into one part. Returns sorted int64 arrays of the collection's cell
        indices, to pass as ``cells=``."""
        seed = integer("seed", seed, 0)
        self.obs.kind(by)
        index = None if cells is None else self.cell_indices(cells)
        return split(self.obs, by, fractions, seed, index)

    def to_anndata(self, cells: Cells | None = None, obs_columns: Sequence[str] | None = None) -> anndata.AnnData:
        """Cells (default: all) as an ``anndata.AnnData``: X an int32 CSR
        matrix in the collection's genes, obs the merged columns (every one
        by default) plus ``dataset`` (a categorical of dataset names), var
        :attr:`var`."""
        import anndata
        import pandas as pd

        index = self.cell_indices(range(self.n_cells) if cells is None else cells)
        batch = self.get_batch(index)
        assert isinstance(batch, Batch)
        obs = self.obs
        wanted = [c for c in obs.columns if c != "obs_names"] if obs_columns is None else list(obs_columns)
        frame = obs.take_pandas(index, wanted)
        member, _ = self.locate(index)
        frame["dataset"] = pd.Categorical.from_codes(member, categories=[m.name for m in self.datasets])
        if "obs_names" in obs.columns:
            frame.index = pd.Index(obs.take(index, ["obs_names"])["obs_names"].astype(str))
        else:
            frame.index = pd.Index(index.astype(str))
        return anndata.AnnData(X=batch.to_scipy(), obs=frame, var=self.var)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the collection down as a small JSON file (the datasets'
        names, roots and manifest digests, the gene choice, the weights), for
        :func:`open_collection` to read back, on this machine or another with
        the same roots. Written to a temporary file and renamed, so that the
        file is never half-written."""
        weights = None if self.weights is None else list(self.weights.items())
        text = self.native.file_json(weights)
        target = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(target))
        fd, temporary = tempfile.mkstemp(prefix=".collection-", suffix=".json", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(temporary, target)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise

    def __repr__(self) -> str:
        return (
            f"<deltacells.Collection of {len(self.datasets)} datasets: {self.n_cells:,} cells x "
            f"{self.n_genes:,} genes>"
        )


def _checked_weights(weights: Any, datasets: list[Member]) -> dict[str, float] | None:
    """``weights`` as {dataset name: weight}, each name a dataset's, each
    weight finite and not negative, some positive."""
    if weights is None:
        return None
    if not isinstance(weights, Mapping):
        raise InvalidArgumentError(f"weights must map dataset names (or roots) to numbers, not {weights!r:.80}")
    names = {m.name for m in datasets}
    out: dict[str, float] = {}
    for key, value in weights.items():
        if key not in names:
            raise InvalidArgumentError(f"weights: {key!r} is not a dataset of the collection; its datasets are "
                                       f"{sorted(names)}")
        try:
            w = float(value)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"weights[{key!r}] must be a number, not {value!r}") from None
        if not math.isfinite(w) or w < 0:
            raise InvalidArgumentError(f"weights[{key!r}] must be finite and not negative, not {value!r}")
        out[key] = w
    if not any(w > 0 for w in out.values()):
        raise InvalidArgumentError("weights: every weight is zero; at least one dataset must be drawn from")
    return out


class CollectionObs:
    """The obs columns of a collection's datasets, merged by name
    (``coll.obs``).

    A column any dataset has is a column of the collection; in a dataset
    without it, its cells have missing values. Category columns are merged
    by value: one vocabulary (every dataset's categories, in the order they
    first appear, dataset by dataset), each dataset's codes mapped onto it,
    int32 codes with -1 for missing. Numeric columns come as float64, NaN
    where missing; bool and string columns as object arrays, None where
    missing: the same dtype in every batch, whichever datasets it draws on. A
    column that is a category in one dataset and of another kind in another cannot be merged, and says so when used.

    Values are read from each dataset's local cache (see :class:`Obs`); a
    process localizes a dataset's columns when it first takes from it.
    """

    def __init__(self, collection: Collection) -> None:
        self._collection = collection
        if collection._obs_schema is None:
            collection._obs_schema = _merged_schema(collection)
        self._schema: dict[str, dict[str, Any]] = collection._obs_schema
        self._ready = collection._localized

    @property
    def columns(self) -> list[str]:
        """Every column of any dataset, in the order they first appear."""
        return list(self._schema)

    @property
    def n_cells(self) -> int:
        return self._collection.n_cells

    def _column(self, name: str) -> dict[str, Any]:
        try:
            column = self._schema[name]
        except (KeyError, TypeError):
            raise UnknownNameError(f"no obs column {name!r} in any dataset of the collection; the columns are "
                                   f"{self.columns}") from None
        if column["conflict"]:
            raise InvalidArgumentError(f"obs column {name!r} cannot be merged: {column['conflict']}")
        return column

    def kind(self, column: str) -> str:
        """``category``, ``numeric``, ``bool`` or ``string``."""
        return str(self._column(column)["kind"])

    def categories(self, column: str) -> list[Any] | None:
        """A category column's merged vocabulary (code ``i`` means
        ``categories[i]``); None for other kinds."""
        return self._column(column)["categories"]

    def datasets_with(self, column: str) -> list[str]:
        """The names of the datasets that have ``column``."""
        self._column(column)
        return [self._collection.datasets[i].name for i in self._schema[column]["members"]]

    def localize(self, columns: Sequence[str] | None = None) -> None:
        """Copies ``columns`` (all when None) of every dataset that has them
        into the local cache (see :meth:`Obs.localize`)."""
        names = self.columns if columns is None else list(columns)
        for name in names:
            for i in self._column(name)["members"]:
                self._collection.dataset(i).obs.localize([name])
                self._collection._localized.add((i, name))

    def ensure_local(self, columns: Sequence[str]) -> None:
        """Checks ``columns``: each dataset's are localized when a batch
        first takes from it (a loader's process opens only the datasets its
        share reads)."""
        for name in columns:
            self._column(name)

    def _member_values(self, i: int, name: str, rows: np.ndarray) -> np.ndarray:
        obs = self._collection.dataset(i).obs
        self._ready = self._collection._localized  # (made anew in a forked process)
        if (i, name) not in self._ready:
            obs.ensure_local([name])
            self._ready.add((i, name))
        return obs.take(rows, [name])[name]

    def take(self, cells: Cells, columns: Sequence[str]) -> dict[str, np.ndarray]:
        """The values of ``columns`` for ``cells`` (indices of the
        collection), in the order of ``cells``, merged as the class says."""
        member, rows = self._collection.locate(cells)
        present = np.unique(member)
        out: dict[str, np.ndarray] = {}
        for name in columns:
            column = self._column(name)
            kind, dtype = column["kind"], np.dtype(column["dtype"])
            if kind == "category":
                values = np.full(len(rows), -1, dtype=np.int32)
            elif dtype.kind == "O":
                values = np.full(len(rows), None, dtype=object)
            elif dtype.kind == "f":
                values = np.full(len(rows), np.nan, dtype=dtype)
            else:
                values = np.zeros(len(rows), dtype=dtype)
            have = column["members"]
            for i in present:
                i = int(i)
                if i not in have:
                    continue
                at = np.flatnonzero(member == i)
                got = self._member_values(i, name, rows[at])
                if kind == "category":
                    lookup = np.asarray(column["codes"][str(i)], dtype=np.int32)
                    codes = np.asarray(got, dtype=np.int64)
                    values[at] = np.where(codes >= 0, lookup[np.clip(codes, 0, None)], -1)
                else:
                    values[at] = got
            out[name] = values
        return out

    def take_pandas(self, cells: Cells, columns: Sequence[str]) -> pd.DataFrame:
        """:meth:`take` as a DataFrame; category columns as pandas
        categoricals carrying the merged vocabulary."""
        return as_frame(self, self.take(cells, columns), columns)

    def column_array(self, column: str) -> Any:
        """Every value of ``column``, in the collection's cell order, as a
        pyarrow array (categories as merged codes). Reads the column of
        every dataset."""
        import pyarrow as pa

        values = self.take(np.arange(self.n_cells, dtype=np.int64), [column])[column]
        if values.dtype == object:
            return pa.chunked_array([pa.array(values.tolist())])
        if values.dtype.kind == "f":
            return pa.chunked_array([pa.array(values, from_pandas=True)])
        return pa.chunked_array([pa.array(values)])

    def where(self, column: str | None = None, values: Any = None, **conditions: Any) -> np.ndarray:
        """The cells whose values match, as :meth:`Obs.where` (the
        collection's sorted int64 indices)."""
        if column is not None:
            if column in conditions:
                raise InvalidArgumentError(f"obs column {column!r} is given twice")
            conditions = {column: values, **conditions}
        return where(self, conditions)

    def __repr__(self) -> str:
        return f"<deltacells.CollectionObs {len(self._schema)} columns: {', '.join(self.columns)}>"


def _merged_schema(collection: Collection) -> dict[str, dict[str, Any]]:
    """Per column: kind, dtype, the datasets that have it, and for a category
    column the merged categories and each dataset's codes onto them."""
    merged: dict[str, dict[str, Any]] = {}
    for i in range(len(collection.datasets)):
        obs = collection.dataset(i).obs
        for name in obs.columns:
            kind = obs.kind(name)
            column = merged.setdefault(
                name, {"kind": kind, "members": [], "categories": [], "codes": {}, "conflict": None}
            )
            column["members"].append(i)
            if column["kind"] != kind and not column["conflict"]:
                first = collection.datasets[column["members"][0]].name
                column["conflict"] = (
                    f"it is {column['kind']} in dataset {first!r} and {kind} in {collection.datasets[i].name!r}"
                )
            if column["conflict"]:
                continue
            if kind == "category":
                categories = obs.categories(name) or []
                position = {c: j for j, c in enumerate(column["categories"])}
                codes = []
                for c in categories:
                    if c not in position:
                        position[c] = len(column["categories"])
                        column["categories"].append(c)
                    codes.append(position[c])
                column["codes"][str(i)] = codes
    for column in merged.values():
        # One dtype for every batch, whatever datasets it draws on, without
        # reading any column to find its missing values.
        column["dtype"] = {"category": "int32", "numeric": "float64"}.get(column["kind"], "object")
        if column["kind"] != "category":
            column["categories"] = None
    return merged
