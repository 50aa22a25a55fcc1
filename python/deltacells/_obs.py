"""Cell metadata (obs): the columns of a dataset, copied once per machine into
a local cache of memory-mapped Arrow files, looked up for batches of cells,
and the cells chosen by their values (:meth:`Obs.where`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from . import _deltacells
from ._args import column_names, thread_count
from ._types import Cells, ObsColumns
from .exceptions import ArgumentTypeError, DeltacellsError, InvalidArgumentError, UnknownNameError

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa


class ObsSource(Protocol):
    """What :class:`Obs` reads through: a dataset (:class:`deltacells.Dataset`)."""

    @property
    def root(self) -> str: ...

    @property
    def native(self) -> _deltacells.RawDataset: ...

    @property
    def manifest(self) -> dict[str, Any]: ...

    @property
    def n_cells(self) -> int: ...

    def cell_indices(self, cells: Cells) -> np.ndarray: ...


def index_array(cells: np.ndarray) -> pa.Array:
    """Cell indices (int64, contiguous) as an Arrow array over the same
    memory, without the checks and copy of ``pa.array``."""
    import pyarrow as pa

    cells = np.ascontiguousarray(cells, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(cells), [None, pa.py_buffer(cells)])


class FlatColumn:
    """A fixed-width column without missing values whose chunks all lie in
    one memory map (the cache file): one NumPy view over the map, and where
    each chunk's values start in it, so that any cells are taken with one
    gather, whatever the number of chunks. None of :meth:`over` when the
    column is not so (strings, booleans, missing values, chunks not in the
    map)."""

    def __init__(self, view: np.ndarray, first: np.ndarray) -> None:
        self.view = view
        self.first = first

    @classmethod
    def over(cls, column: pa.ChunkedArray, whole: pa.Buffer) -> FlatColumn | None:
        import pyarrow as pa

        kind = column.type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)) or column.null_count:
            return None
        dtype = np.dtype(kind.to_pandas_dtype())
        first = np.empty(column.num_chunks, dtype=np.int64)
        for k, chunk in enumerate(column.chunks):
            data = chunk.buffers()[1]
            if data is None:
                return None
            at = data.address - whole.address + chunk.offset * dtype.itemsize
            if at < 0 or at % dtype.itemsize or at + len(chunk) * dtype.itemsize > whole.size:
                return None
            first[k] = at // dtype.itemsize
        view = np.frombuffer(whole, dtype=dtype, count=whole.size // dtype.itemsize)
        return cls(view, first)

    def take(self, starts: np.ndarray, cells: np.ndarray) -> np.ndarray:
        chunk_of = np.searchsorted(starts, cells, side="right") - 1
        return self.view[self.first[chunk_of] + (cells - starts[chunk_of])]


class LoadedColumn:
    """A column opened from its memory-mapped cache file ``whole``: its
    values (a chunk per tile), each chunk's first row then the row count,
    and the column as one view over the file when it can be (:class:`FlatColumn`)."""

    def __init__(self, column: pa.ChunkedArray, whole: pa.Buffer) -> None:
        self.column = column
        self.starts = np.concatenate([[0], np.cumsum([len(c) for c in column.chunks], dtype=np.int64)])
        self.flat = FlatColumn.over(column, whole)

    def take(self, cells: np.ndarray) -> pa.Array | pa.ChunkedArray:
        """The values at ``cells`` (see :func:`take_rows`)."""
        return take_rows(self.column, self.starts, cells)


def take_rows(column: pa.ChunkedArray, starts: np.ndarray, cells: np.ndarray) -> pa.Array | pa.ChunkedArray:
    """``column``'s values at ``cells`` (valid int64 row numbers, any order,
    repeats allowed), taken from the chunks (tiles) they are in, one take per
    chunk; ``starts`` is each chunk's first row, then the row count.
    (``ChunkedArray.take`` joins every chunk into one array first: at ten
    million rows that copy cost 10-35 ms for 1,024 cells.)"""
    import pyarrow as pa

    if column.num_chunks <= 1 or len(cells) == 0:
        return column.take(index_array(cells))
    chunk_of = np.searchsorted(starts, cells, side="right") - 1
    order = np.argsort(chunk_of, kind="stable")
    grouped = chunk_of[order]
    cuts = np.flatnonzero(grouped[1:] != grouped[:-1]) + 1
    pieces = []
    for group in np.split(order, cuts):
        k = int(chunk_of[group[0]])
        pieces.append(column.chunk(k).take(index_array(cells[group] - starts[k])))
    taken = pa.concat_arrays(pieces)
    if np.all(order[1:] > order[:-1]):
        return taken  # the cells were in chunk order already
    back = np.empty(len(order), dtype=np.int64)
    back[order] = np.arange(len(order), dtype=np.int64)
    return taken.take(index_array(back))


def as_frame(obs: ObsColumns, values: dict[str, np.ndarray], columns: Sequence[str]) -> pd.DataFrame:
    """Taken ``values`` as a DataFrame, category columns as pandas
    categoricals over ``obs``'s whole vocabulary of each."""
    import pandas as pd

    frame: dict[str, Any] = {}
    for name in columns:
        if obs.kind(name) == "category":
            frame[name] = pd.Categorical.from_codes(values[name], categories=obs.categories(name))
        else:
            frame[name] = values[name]
    return pd.DataFrame(frame)


def _as_list(values: Any) -> list[Any]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray, set, frozenset)):
        return [values]
    return list(values)


def where(obs: ObsColumns, conditions: Mapping[str, Any]) -> np.ndarray:
    """The cells (sorted int64 indices) whose value in every column of
    ``conditions`` is one of the values given for it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not conditions:
        raise InvalidArgumentError("where needs at least one column and its values")
    n = obs.n_cells
    mask = np.ones(n, dtype=bool)
    for column, values in conditions.items():
        if not isinstance(column, str):
            raise InvalidArgumentError(f"column names are strings, not {column!r}")
        kind = obs.kind(column)
        wanted = _as_list(values)
        data = obs.column_array(column)
        if kind == "category":
            categories = obs.categories(column) or []
            index = {c: i for i, c in enumerate(categories)}
            unknown = [v for v in wanted if v not in index]
            if unknown:
                raise UnknownNameError(
                    f"obs column {column!r} has no category {unknown[0]!r}; its categories are {categories}"
                )
            codes = np.asarray(data.to_numpy())
            mask &= np.isin(codes, np.array([index[v] for v in wanted], dtype=np.int64))
        else:
            try:
                value_set = pa.array(wanted, type=data.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
                raise InvalidArgumentError(
                    f"values {wanted!r} for obs column {column!r} are not of its type {data.type}: {e}"
                ) from None
            found = pc.is_in(data, value_set=value_set).fill_null(False)
            mask &= np.asarray(found.to_numpy(zero_copy_only=False), dtype=bool)
    return np.flatnonzero(mask).astype(np.int64)


class Obs:
    """The obs columns of a dataset (``ds.obs``).

    Training never reads the obs shards: the columns it needs are *localized*,
    copied into the local cache (``cache_root``, shared by every process on
    the machine, the same files ``deltacells obs localize`` writes) and then
    memory-mapped, so that DataLoader workers share the pages. A column used
    before it was localized is fetched then, with a warning.

    Values come back in the order of the cells asked for:

    - ``category`` columns as integer codes into :meth:`categories`, -1 for missing;
    - ``numeric`` columns in their type, or, for a column with missing values,
      float64 with NaN where they are missing;
    - ``bool`` and ``string`` columns as arrays, or, for a column with missing
      values, object arrays holding None where they are missing.

    The dtype of a column is the same in every batch.
    """

    def __init__(self, dataset: ObsSource, cache_dir: str | None) -> None:
        self._dataset = dataset
        self._cache_dir = cache_dir
        self._loaded: dict[str, LoadedColumn] = {}
        text = dataset.native.obs_schema_json()
        self._schema: list[dict[str, Any]] = json.loads(text)["columns"] if text else []
        self._by_name = {c["name"]: c for c in self._schema}

    @property
    def columns(self) -> list[str]:
        """Every obs column, in stored order (``obs_names`` first, when stored)."""
        return [c["name"] for c in self._schema]

    @property
    def n_cells(self) -> int:
        """Rows: the dataset's cells."""
        return self._dataset.n_cells

    def _column(self, name: str) -> dict[str, Any]:
        if not isinstance(name, str):
            raise ArgumentTypeError(f"obs column names are strings, not {name!r}")
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise UnknownNameError(
                f"{self._dataset.root}: no obs column {name!r}; the columns are {self.columns}"
            ) from None

    def kind(self, column: str) -> str:
        """``category``, ``numeric``, ``bool`` or ``string``."""
        return self._column(column)["kind"]

    def arrow_type(self, column: str) -> str:
        """The stored Arrow type, by pyarrow's name (``int8``, ``double``, ``string``...)."""
        return self._column(column)["arrow_type"]

    def categories(self, column: str) -> list[Any] | None:
        """A category column's vocabulary (code ``i`` means ``categories[i]``),
        the same in every tile and batch; None for other kinds."""
        return self._column(column)["categories"]

    @property
    def cache_root(self) -> str:
        """The cache folder in use (``cache_dir``, else ``$DELTACELLS_CACHE``,
        ``$XDG_CACHE_HOME/deltacells``, ``~/.cache/deltacells``)."""
        return _deltacells.cache_root(self._cache_dir)

    def _fingerprint(self) -> str:
        fingerprint = self._dataset.manifest.get("obs_fingerprint")
        if fingerprint is None:
            raise DeltacellsError(f"{self._dataset.root}: the dataset has no obs")
        return fingerprint

    def localize(self, columns: Sequence[str] | None = None, threads: int | None = None) -> dict[str, Any]:
        """Copies ``columns`` (all when None) into the local cache, fetching only
        those not already there and valid, and returns what was done
        (``fetched``, ``already_local``, ``replaced``, ``requests``, ``bytes``).

        Concurrent processes on one machine fetch each column once.
        ``threads`` is the requests in flight (default: the dataset's
        ``threads``); raise it for stores with high latency.
        """
        names = self.columns if columns is None else column_names("columns", columns)
        for name in names:
            self._column(name)
        threads = thread_count("threads", threads)
        self._fingerprint()
        report = json.loads(self._dataset.native.localize(names, self.cache_root, threads=threads))
        for name in names:
            self._loaded.pop(name, None)
            self._open(name)
        return report

    def _open(self, name: str) -> None:
        # pyarrow's take() and to_numpy() import pandas the first time, about
        # 0.5 s: paid here, when a column is opened, not by the first batch
        # of a training loop.
        import pandas  # noqa: F401
        import pyarrow as pa

        path = _deltacells.column_path(self.cache_root, self._fingerprint(), name)
        mapped = pa.memory_map(path, "r")
        table = pa.ipc.open_file(mapped).read_all()
        if table.num_rows != self._dataset.n_cells:
            raise DeltacellsError(f"{path}: {table.num_rows} rows, the dataset has {self._dataset.n_cells} cells")
        mapped.seek(0)
        self._loaded[name] = LoadedColumn(table.column(0), mapped.read_buffer())

    def _get(self, name: str) -> LoadedColumn:
        self._column(name)
        if name not in self._loaded:
            # Opened from the cache when a process localized it before; a
            # fetch in the middle of reading is worth a warning.
            report = self.localize([name])
            if name not in report.get("already_local", []):
                warnings.warn(
                    f"obs column {name!r} was not localized; it was fetched now (localize the columns you need "
                    "when opening the dataset: open_dataset(..., obs_columns=[...]))",
                    stacklevel=3,
                )
        return self._loaded[name]

    def ensure_local(self, columns: Sequence[str]) -> None:
        """Localizes those of ``columns`` that this process has not opened yet
        (a loader calls it before its first batch, so that no batch waits on
        a fetch or warns about one)."""
        missing = [name for name in columns if name not in self._loaded]
        if missing:
            self.localize(missing)

    def column_array(self, column: str) -> pa.ChunkedArray:
        """Every value of ``column``, in cell order, as a pyarrow ChunkedArray
        over the memory-mapped cache file (categories as their codes)."""
        return self._get(column).column

    def where(self, column: str | None = None, values: Any = None, **conditions: Any) -> np.ndarray:
        """The cells whose ``column`` holds one of ``values``, as sorted int64
        indices, to pass as ``cells=`` to :meth:`Dataset.batches` or
        :meth:`Dataset.get_batch`.

        ``values`` is one value or a list of them: category labels for a
        category column (a label the column does not have raises
        :class:`UnknownNameError`), values of the column's type otherwise.
        Several columns are given as keywords, and all must match:

        >>> train_b = ds.obs.where("cell_type", ["B cells", "NK cells"])
        >>> ctrl_d1 = ds.obs.where(condition="ctrl", donor="d1")
        """
        if column is not None:
            if column in conditions:
                raise InvalidArgumentError(f"obs column {column!r} is given twice")
            conditions = {column: values, **conditions}
        return where(self, conditions)

    def _values(self, name: str, cells: np.ndarray) -> Any:
        import pyarrow as pa

        loaded = self._get(name)
        column = loaded.column
        if loaded.flat is not None:
            # (no missing values: the codes, or the numbers, as stored)
            return loaded.flat.take(loaded.starts, cells)
        taken = loaded.take(cells)
        kind = self.kind(name)
        if kind == "category":
            return taken.to_numpy()
        # A column with missing values anywhere gives the same dtype in every
        # batch, whether or not this batch has one.
        if kind == "numeric":
            if column.null_count:
                return taken.cast(pa.float64()).to_numpy(zero_copy_only=False)
            return taken.to_numpy()
        if column.null_count:
            return np.array(taken.to_pylist(), dtype=object)
        return taken.to_numpy(zero_copy_only=False)

    def _nullable(self, name: str, cells: np.ndarray) -> Any:
        """Column ``name`` for ``cells`` in pandas' nullable type (Int64, boolean, string);
        floats stay float64 with NaN."""
        import pandas as pd
        import pyarrow as pa

        nullable = {
            pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
            pa.int64(): pd.Int64Dtype(), pa.uint8(): pd.UInt8Dtype(), pa.uint16(): pd.UInt16Dtype(),
            pa.uint32(): pd.UInt32Dtype(), pa.uint64(): pd.UInt64Dtype(), pa.bool_(): pd.BooleanDtype(),
            pa.string(): pd.StringDtype(),
        }
        taken = self._get(name).take(cells)
        return taken.to_pandas(types_mapper=nullable.get).array

    def take(self, cells: Cells, columns: Sequence[str]) -> dict[str, np.ndarray]:
        """The values of ``columns`` for ``cells``, as NumPy arrays (see the class
        documentation for each kind), in the order of ``cells``."""
        index = self._dataset.cell_indices(cells)
        return {name: self._values(name, index) for name in column_names("columns", columns)}

    def take_anndata(self, cells: Cells, columns: Sequence[str]) -> pd.DataFrame:
        """:meth:`take_pandas` with the dtypes anndata gives a column it
        wrote: integer, boolean and string columns with missing values in
        pandas' nullable types (``Int64``, ``boolean``, ``string``...),
        floats as float64 with NaN, categoricals with the whole vocabulary."""
        index = self._dataset.cell_indices(cells)
        frame = self.take_pandas(index, columns)
        for name in columns:
            is_float = self.arrow_type(name) in ("float", "double")
            if self.kind(name) in ("numeric", "bool", "string") and not is_float and self._get(name).column.null_count:
                frame[name] = self._nullable(name, index)
        return frame

    def take_pandas(self, cells: Cells, columns: Sequence[str]) -> pd.DataFrame:
        """:meth:`take` as a pandas DataFrame; category columns are pandas
        categoricals that carry the dataset's whole vocabulary, so
        ``.cat.categories`` is the same in every batch."""
        return as_frame(self, self.take(cells, columns), columns)

    def __repr__(self) -> str:
        return f"<deltacells.Obs {len(self._schema)} columns: {', '.join(self.columns)}>"
