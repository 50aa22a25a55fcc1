"""The package's bottom layer: the types every other module shares, and the
protocols that stand in for the modules above.

It holds the typed definitions of the option sets the Rust binding takes
(:class:`Form`, :class:`LoaderOptions` and conversion's) and the keywords
several entry points take (:class:`FormArgs`, :class:`StoreArgs` and the
conversion jobs'), so that the binding's stub (``_deltacells.pyi``) and
every entry point use one definition of each; what cells a read takes (:data:`Cells`); a batch (:class:`Batch`);
and the obs of a dataset or a collection as the modules below them use it
(:class:`ObsColumns`). It imports nothing of the package: the checks of these
options live in ``_options``, the classes that satisfy the protocols above.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa
    import scipy.sparse

#: A local path or a URL, as the entry points take them.
PathLike = str | os.PathLike[str]

#: What ``get_batch`` accepts as cells: a list, an integer array, a range or a slice.
Cells = Sequence[int] | np.ndarray | range | slice


class Batch:
    """Some cells of a dataset as a CSR matrix: ``indptr`` (int64), ``indices``
    (int32, the stored gene columns, or the columns of the vocabulary asked
    for with ``genes=``, sorted within each cell) and ``data`` (int32
    counts), in the order the cells were asked for.

    The arrays are the buffers the Rust decoder wrote; :meth:`to_scipy` wraps
    ``data`` and ``indices`` without copying (scipy keeps its own int32 copy of
    ``indptr``, one entry per cell, since it wants both index arrays of one type).
    """

    __slots__ = ("indptr", "indices", "data", "shape")

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, n_genes: int) -> None:
        self.indptr = indptr
        self.indices = indices
        self.data = data
        self.shape = (len(indptr) - 1, n_genes)

    def to_scipy(self) -> scipy.sparse.csr_matrix:
        """The batch as a ``scipy.sparse.csr_matrix`` over the same buffers (no copy)."""
        import scipy.sparse

        return scipy.sparse.csr_matrix((self.data, self.indices, self.indptr), shape=self.shape, copy=False)

    def to_dense(self, dtype: Any = np.float32) -> np.ndarray:
        """The batch as a dense ``(cells, genes)`` array of ``dtype``."""
        out = np.zeros(self.shape, dtype=dtype)
        rows = np.repeat(np.arange(self.shape[0]), np.diff(self.indptr))
        out[rows, self.indices] = self.data
        return out

    @property
    def nnz(self) -> int:
        """Stored nonzeros."""
        return int(self.indptr[-1])

    def __repr__(self) -> str:
        return f"<deltacells.Batch {self.shape[0]} cells x {self.shape[1]} genes, {self.nnz} nonzeros>"


class ObsColumns(Protocol):
    """The obs of a dataset (:class:`deltacells.Obs`) or of a collection
    (:class:`deltacells.CollectionObs`), as sampling, the loader and
    :func:`deltacells._obs.as_frame` read it."""

    @property
    def n_cells(self) -> int: ...

    def kind(self, column: str) -> str: ...

    def categories(self, column: str) -> list[Any] | None: ...

    def column_array(self, column: str) -> pa.ChunkedArray: ...

    def ensure_local(self, columns: Sequence[str]) -> None: ...

    def take(self, cells: Cells, columns: Sequence[str]) -> dict[str, np.ndarray]: ...


class Form(TypedDict):
    """The form of a batch as the Rust reader takes it."""

    normalize: float | None
    normalize_over: str
    log1p: bool
    dense: bool
    top_k: int | None
    float32: bool
    sorted_columns: bool


class FormArgs(TypedDict, total=False):
    """A batch's form as the read methods take it, by keyword (see
    :meth:`deltacells.Dataset.get_batch` and :meth:`deltacells.Dataset.batches`
    for what each does): one definition that :meth:`Dataset.gathers` and
    :meth:`Collection.gathers` take as ``**form``."""

    normalize: float | None
    normalize_over: str
    log1p: bool
    dense: bool
    top_k: int | None
    dtype: object
    sorted_columns: bool


class ConvertDefaults(TypedDict):
    """The library's conversion defaults (``ConvertOptions::default()`` and
    what it holds, exported by the binding): the one definition that the
    signatures of :func:`deltacells.convert`, :func:`deltacells.write_anndata`
    and :func:`deltacells.compact` take theirs from, as the command line's
    ``--help`` does."""

    tile_size: int
    chunks: int
    level: int
    gene_order_files: int
    max_categories: int
    obs_tiles_per_file: int
    compact_level: int


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


class OrderArgs(TypedDict, total=False):
    """How an epoch's cells are ordered and read ahead (see
    :meth:`deltacells.Dataset.batches` for what each does)."""

    shuffle: bool
    seed: int
    drop_last: bool
    window_tiles: int
    mix_chunks: int
    prefetch: int


class ShareArgs(TypedDict, total=False):
    """Which epoch, and which share of it, a loader reads: what
    :class:`deltacells.torch.CellDataset` fills in for each worker."""

    epoch: int
    rank: int
    world_size: int
    worker: int
    num_workers: int


class SamplingArgs(TypedDict, total=False):
    """Which cells an epoch holds and the obs columns each batch carries:
    the keywords of the loader's own constructor."""

    obs_columns: Sequence[str] | None
    cells: Cells | None
    weights: Sequence[float] | np.ndarray | None
    num_samples: int | None
    balance: str | None
    class_weights: Mapping[Any, float] | None


class EpochArgs(OrderArgs, SamplingArgs, FormArgs, total=False):
    """An epoch of batches as a training job describes it, once for every
    worker: :class:`deltacells.torch.CellDataset` takes these."""


class BatchArgs(EpochArgs, ShareArgs, total=False):
    """Every keyword of :meth:`deltacells.Dataset.batches` and
    :meth:`deltacells.Collection.batches` but the gene vocabulary, defined
    here only (each documented at :meth:`deltacells.Dataset.batches`, the
    defaults of the first two groups from the Rust loader's)."""


class StoreArgs(TypedDict, total=False):
    """How a store is reached (a dataset's, or an input's at a URL): the
    keywords of every entry point that reads or writes one, defined here
    only, with their defaults and checks in ``_options.store_options`` (see
    :func:`deltacells.convert` for what each does)."""

    anonymous: bool
    endpoint: str | None


class OpenArgs(StoreArgs, total=False):
    """What :class:`deltacells.torch.CellDataset` passes on to each worker's
    :func:`deltacells.open_dataset`: the store's keywords, the cache folder
    of obs and the budget of decompressed chunks."""

    cache_dir: str | None
    cache_bytes: int


class CellDatasetArgs(EpochArgs, OpenArgs, total=False):
    """The keywords of :class:`deltacells.torch.CellDataset` besides its own:
    an epoch's (as :meth:`deltacells.Dataset.batches` takes them) and how
    each worker opens the dataset."""


class JobArgs(StoreArgs, total=False):
    """The keywords a conversion job takes (``convert``, ``append``,
    ``write_anndata``, ``compact``): how its store is reached, the threads
    it runs on and its progress bar."""

    threads: int | None
    progress: bool | None


class InputArgs(TypedDict, total=False):
    """How a job reads its inputs: the keywords ``convert`` and ``append``
    take besides a job's."""

    input_format: str | None
    feature_type: str | None
    genome: str | None
    download_inputs: bool
    download_dir: PathLike | None


class InputJobArgs(JobArgs, InputArgs, total=False):
    """The keywords of a job that reads inputs (``convert``, ``append``)."""


class _Reaching(StoreArgs):
    """How inputs are reached and read and where the output is, checked, as
    the binding takes them from convert, append, write_anndata and compact:
    the store's keys (every one given, by ``_options.store_options``), and
    these."""

    input_format: str | None
    feature_type: str | None
    genome: str | None
    download_inputs: bool
    download_dir: str | None
    threads: int | None


class _ConvertOptions(TypedDict):
    """Every option of ``deltacells convert``, as the binding takes them."""

    matrix: str
    tile_size: int
    chunks: int
    level: int
    gene_order_files: int
    gene_order_from: str | None
    gene_order: str | None
    genes: str
    var: bool
    obs: bool
    obs_names: bool
    obs_exclude: list[str]
    max_categories: int
    obs_tiles_per_file: int
    overwrite: bool
    metadata: list[tuple[str, str]]
    shuffle: int | None
    spill_dir: str | None
