"""Datasets: one dataset's cells read as batches, training loaders, gathers
and AnnData (a batch itself, :class:`Batch`, is a type of ``_types``)."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np

from . import _deltacells
from ._args import flag, integer
from ._loader import Gathers, Loader
from ._obs import Obs
from ._options import DEFAULTS, batch_options, form_from, form_options
from ._sampling import split
from ._types import Batch, BatchArgs, Cells, Form, FormArgs, LoaderOptions
from ._vocabulary import Genes, Vocabulary, VocabularyReport, _names, _stored_keys, resolve
from .exceptions import ArgumentTypeError, CellIndexError, InvalidArgumentError

if TYPE_CHECKING:
    import anndata
    import pandas as pd

#: Handles a forked child inherited from its parent: kept, never used or freed
#: there (freeing would wait for the parent's threads, which the child lacks).
_INHERITED: list[Any] = []

class Dataset:
    """An open dataset. Use :func:`open_dataset` to get one.

    The genes (columns) are in the dataset's stored order, by decreasing total
    counts; :attr:`gene_order` maps them back to the source files' order.
    """

    def __init__(self, root: str, options: dict[str, Any], cache_dir: str | None,
                 raw: _deltacells.RawDataset | None = None, version: bytes | None = None) -> None:
        self.root = root
        self._options = dict(options)
        self._cache_dir = cache_dir
        self._handle = raw
        self._pid = os.getpid() if raw is not None else None
        # The version opened elsewhere (the manifest's bytes), which this
        # process opens too: writers may have changed the dataset since.
        self._version = version
        self._last_vocabulary: tuple[object, Vocabulary] | None = None

    @property
    def native(self) -> _deltacells.RawDataset:
        """The Rust dataset behind this one, in this process: opened on first
        use, and opened again in a process forked from the one that opened it
        (threads, runtimes and connections do not survive a fork). The
        package's modules (obs, the loader) read through it; users need not."""
        if self._pid != os.getpid():
            # Opened as the version the parent process shows (its cells,
            # read on from a later version that appended to or compacted it).
            inherited = self._handle
            version = inherited.version() if inherited is not None else self._version
            raw = _deltacells.RawDataset(self.root, **self._options, version=version)
            if inherited is not None:
                _INHERITED.append(inherited)
            self._handle, self._pid = raw, os.getpid()
        assert self._handle is not None  # opened above in this process
        return self._handle

    def __reduce__(self) -> tuple[Any, ...]:
        # To its root and options: the other process opens it on first use.
        # (with the version it shows, once opened, which the other opens too)
        version = self._handle.version() if self._handle is not None else self._version
        return (Dataset, (self.root, self._options, self._cache_dir, None, version))

    @cached_property
    def obs(self) -> Obs:
        """The cell metadata (:class:`Obs`)."""
        return Obs(self, self._cache_dir)

    @property
    def n_cells(self) -> int:
        """Cells (rows)."""
        return self.native.n_cells

    @property
    def n_genes(self) -> int:
        """Genes (columns)."""
        return self.native.n_genes

    @property
    def n_tiles(self) -> int:
        """Tiles: blocks of consecutive cells, each read and decoded as a unit."""
        return self.native.n_tiles

    @cached_property
    def tile_cells(self) -> np.ndarray:
        """Cells of each tile (int64)."""
        return self.native.tile_cells()

    @cached_property
    def manifest(self) -> dict[str, Any]:
        """manifest.json, as a dict."""
        return json.loads(self.native.manifest_json())

    @cached_property
    def var_names(self) -> list[str] | None:
        """Gene names in stored column order, or None without var_names.txt."""
        return self.native.var_names()

    @cached_property
    def var(self) -> pd.DataFrame | None:
        """The gene table (var.parquet) in stored column order, with its index; None without one."""
        data = self.native.var_parquet()
        if data is None:
            return None
        import pandas as pd

        return pd.read_parquet(io.BytesIO(data))

    @cached_property
    def gene_order(self) -> np.ndarray | None:
        """int32 array: stored column ``j`` was column ``gene_order[j]`` of the source
        files; None without gene_order.npy. ``np.argsort(gene_order)`` gives, for each
        source gene, its stored column."""
        return self.native.gene_order()

    def _slice_range(self, cells: slice) -> range:
        try:
            return range(*cells.indices(self.n_cells))
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"cells: the slice {cells!r} is not valid: {e}") from None

    def _cell_array(self, cells: Cells) -> np.ndarray:
        """``cells`` as a contiguous int64 array (not yet checked against the
        dataset's cells, but for unsigned values past int64's range)."""
        if isinstance(cells, slice):
            cells = self._slice_range(cells)
        if isinstance(cells, range):
            return np.arange(cells.start, cells.stop, cells.step, dtype=np.int64)
        try:
            array = np.asarray(cells)
        except (TypeError, ValueError) as e:
            raise ArgumentTypeError(f"cells must be integers in a list, an array, a range or a slice: {e}") from None
        if array.ndim != 1:
            raise ArgumentTypeError(f"cells must be one-dimensional, not of shape {array.shape}")
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise ArgumentTypeError(f"cells must be integers, not {array.dtype}")
        if array.size and array.dtype.kind == "u" and int(array.max()) > np.iinfo(np.int64).max:
            raise CellIndexError(f"cell {int(array.max())} is out of range: the dataset has {self.n_cells} cells")
        return np.ascontiguousarray(array, dtype=np.int64)

    def cell_indices(self, cells: Cells) -> np.ndarray:
        """``cells`` (a list, an integer array, a range or a slice) as int64
        cell indices, each checked to be a cell of the dataset: raises
        :class:`CellIndexError` naming the first that is not."""
        array = self._cell_array(cells)
        bad = (array < 0) | (array >= self.n_cells)
        if bad.any():
            cell = int(array[np.argmax(bad)])
            raise CellIndexError(f"cell {cell} is out of range: the dataset has {self.n_cells} cells")
        return array

    def vocabulary(self, genes: Sequence[str] | np.ndarray | str, *, column: str | None = None) -> Vocabulary:
        """A model's gene vocabulary mapped onto this dataset's columns, to
        pass as ``genes=`` to :meth:`get_batch`, :meth:`batches`,
        :meth:`to_anndata` or ``deltacells.torch.CellDataset``.

        ``genes`` is a list of gene names in the order the batches' columns
        should have (a model's vocabulary, 20,000-60,000 names, say), or
        ``"source"`` for the input files' order. Names are matched against
        the gene names (``var_names``), or against var column ``column``
        (``"gene_ids"`` for Ensembl IDs, say) when given. Batches then have
        exactly these columns in this order: a gene the dataset lacks is a
        column of zeros, a stored gene the list lacks is left out. Counts of
        stored genes sharing a name are added. Unknown names are not an
        error (they are the absent genes); a list with none of the dataset's
        genes warns (:class:`VocabularyWarning`).

        Raises :class:`InvalidArgumentError` for an empty list or a name
        given twice, :class:`UnknownNameError` for a ``column`` var does not
        have.

        >>> vocab = ds.vocabulary(model_genes, column="gene_ids")
        >>> batch = ds.get_batch(range(256), genes=vocab)  # 256 x len(model_genes)
        """
        key = (column, genes if isinstance(genes, str) else tuple(_names(genes)))
        last = self._last_vocabulary
        if last is not None and last[0] == key:
            return last[1]
        vocabulary = Vocabulary(self, genes, column)
        self._last_vocabulary = (key, vocabulary)
        return vocabulary

    def vocabulary_report(
        self, genes: Sequence[str] | np.ndarray | str | Vocabulary, *, column: str | None = None
    ) -> VocabularyReport:
        """How ``genes`` (as :meth:`vocabulary` takes them) fits this dataset:
        how many are present and absent, and how many of the dataset's
        nonzeros the genes it leaves out hold. Reads and decodes every tile
        once (the nonzeros of each stored gene)."""
        vocabulary = resolve(self, genes, column)
        assert vocabulary is not None  # genes is not None
        nonzeros = np.ascontiguousarray(self.native.column_nonzeros(), dtype=np.uint64)
        native = vocabulary.native
        return VocabularyReport(
            genes=native.n_output,
            present=native.present,
            absent=native.n_output - native.present,
            stored_genes=self.n_genes,
            left_out=native.left_out,
            nonzeros=int(nonzeros.sum()),
            nonzeros_left_out=native.left_out_of(nonzeros),
        )

    def get_batch(
        self,
        cells: Cells,
        *,
        genes: Genes | None = None,
        gene_column: str | None = None,
        normalize: float | None = None,
        normalize_over: str = "stored",
        log1p: bool = False,
        dense: bool = False,
        dtype: Any = None,
        sorted_columns: bool = True,
    ) -> Batch | np.ndarray:
        """The cells listed, in the order given (repeats allowed), as a :class:`Batch`.

        ``cells`` is a list, an integer array, a range or a slice. Every tile the
        batch needs is read and decoded once, on the Rust threads.

        With ``genes`` (gene names, ``"source"``, or a :meth:`vocabulary`),
        the batch's columns are those genes in that order, each cell written
        in them as it is read (``gene_column`` is the var column the names
        are matched against; see :meth:`vocabulary`). To read many batches in
        one vocabulary, build it once with :meth:`vocabulary` and pass that.

        Values stay int32 counts unless asked: ``normalize=1e4`` scales each
        cell so that its counts sum to 1e4 (over every gene the dataset
        stores for it with ``normalize_over="stored"``, the default, or over
        the batch's genes with ``"output"``; a cell without counts stays
        zero), ``log1p=True`` takes ``ln(1 + x)`` after that; either makes
        the values float32 (``dtype=np.float32`` gives the counts as float32
        without a transform; ``dtype=np.int32`` with one is an error).
        ``dense=True`` returns a C-contiguous
        ``(cells, genes)`` NumPy array (int32, or float32 when scaled),
        written directly by the Rust reader, instead of a Batch.
        ``sorted_columns=False`` (with ``genes``) leaves each cell's columns
        in the dataset's stored order rather than sorting them: a valid CSR
        matrix (``has_sorted_indices`` false) for a sort less per cell.

        Raises :class:`CellIndexError` (an ``IndexError``) for a cell outside
        ``0 .. n_cells``, naming it, and :class:`InvalidArgumentError` for a
        bad ``normalize`` or ``normalize_over``.

        >>> batch = ds.get_batch(np.array([10, 3, 10]))
        >>> x = batch.to_scipy()  # 3 x n_genes CSR, no copy
        >>> x = ds.get_batch(range(64), genes=model_genes, normalize=1e4, log1p=True, dense=True)
        """
        vocabulary = resolve(self, genes, gene_column)
        native = None if vocabulary is None else vocabulary.native
        n_genes = self.n_genes if vocabulary is None else vocabulary.n_genes
        form = form_options(normalize, normalize_over, log1p, dense, None, n_genes, dtype, sorted_columns)
        if (
            form["normalize"] is not None or form["log1p"] or form["dense"] or form["float32"]
            or not form["sorted_columns"]
        ):
            indptr, indices, data, _, _ = self.native.get_formed(self._cell_array(cells), form, native)
            if indptr is None or indices is None:
                return data
            return Batch(indptr, indices, data, n_genes)
        if isinstance(cells, (range, slice)):
            r = cells if isinstance(cells, range) else self._slice_range(cells)
            if r.step == 1 and 0 <= r.start <= r.stop <= self.n_cells:
                return Batch(*self.native.get_range(r.start, r.stop, native), n_genes)
        return Batch(*self.native.get_batch(self._cell_array(cells), native), n_genes)

    #: An epoch is drawn (by weight) only when batches() asks for it.
    _draws_by_default = False

    def _plan(
        self, cells: np.ndarray | None, options: LoaderOptions, weights: np.ndarray | None, num_samples: int | None
    ) -> _deltacells.RawPlan:
        """One epoch's share, planned (the loader's protocol)."""
        return self.native.plan_epoch(cells, options, weights, num_samples)

    def _start_batches(
        self, plan: _deltacells.RawPlan, genes: Vocabulary | None, form: Form
    ) -> _deltacells.RawBatches:
        """Starts reading a planned share (the loader's protocol)."""
        return self.native.batches(plan, None if genes is None else genes.native, form)

    def gathers(
        self,
        lists: Iterable[Cells],
        *,
        ahead: int = 4,
        obs_columns: Sequence[str] | None = None,
        genes: Genes | None = None,
        gene_column: str | None = None,
        **form: Unpack[FormArgs],
    ) -> Gathers:
        """Gathers planned ahead: ``lists`` of cells (each a list, an integer
        array, a range or a slice) read in order, one :class:`CellBatch` per
        list with the rows in the list's order, read on a Rust thread up to
        ``ahead`` lists (1 to 1024) before the consumer, so that the next
        lists are read while the model trains on this one. For the pairs of a
        perturbation model (a perturbed cell and its matched controls per
        step), the cell sets of a set-based model, or a sampler's batches
        drawn ahead. Every cell is checked when the gathers are made.

        ``obs_columns``, ``genes``, ``gene_column`` and the form keywords
        (``normalize``, ``normalize_over``, ``log1p``, ``dense``, ``top_k``,
        ``dtype``, ``sorted_columns``) are those of :meth:`batches`; counts
        stay counts unless asked. Memory: ``ahead`` batches, and the
        dataset's cache of decompressed chunks (see :func:`open_dataset`'s
        ``cache_bytes``), which makes cells drawn again cost nothing.

        >>> steps = [np.r_[perturbed[i], controls[i]] for i in range(1000)]
        >>> for batch in ds.gathers(steps, ahead=8, obs_columns=["condition"]):
        ...     x = batch.X.to_scipy()
        """
        vocabulary = resolve(self, genes, gene_column)
        shaped = form_from(form, self.n_genes if vocabulary is None else vocabulary.n_genes)
        return Gathers(self, lists, ahead, obs_columns, vocabulary, shaped)

    def _start_gathers(
        self, lists: list[np.ndarray], form: Form, genes: Vocabulary | None, ahead: int
    ) -> _deltacells.RawBatches:
        """Starts reading planned gathers (the gathers' protocol)."""
        return self.native.gathers(lists, form, None if genes is None else genes.native, ahead)

    def io_stats(self) -> dict[str, int]:
        """What reading this dataset has asked of its storage so far, in this
        process: ``requests`` (reads of objects or byte ranges), ``bytes``
        fetched, and ``retries``: attempts of those requests that failed in a
        way that is tried again (a 5xx or 429 answer from an object store, a
        connection that failed or was dropped), each retried with backoff (up
        to 8 times within 2 minutes) before a read fails. Zero for a local
        folder but for requests and bytes.

        >>> ds.io_stats()  # doctest: +SKIP
        {'requests': 12, 'bytes': 4825331, 'retries': 0}
        """
        requests, fetched, retries = self.native.io_stats()
        return {"requests": requests, "bytes": fetched, "retries": retries}

    @property
    def versions_followed(self) -> int:
        """How many later versions of the dataset this process's reads of
        it have moved to since it was opened: each is a writer's change
        (``append``, a sharded append's ``finalize``, ``compact``) noticed by
        a read, which then reads on from the new version. The cells, genes
        and obs stay those of the version opened. 0 while nothing changed.

        >>> ds.versions_followed  # doctest: +SKIP
        0
        """
        return self.native.versions_followed

    def read_tile(self, tile: int) -> Batch:
        """Tile ``tile``, whole, as a :class:`Batch`."""
        return Batch(*self.native.read_tile(tile), self.n_genes)

    def batches(
        self,
        batch_size: int = DEFAULTS["batch_size"],
        *,
        genes: Genes | None = None,
        gene_column: str | None = None,
        **options: Unpack[BatchArgs],
    ) -> Loader:
        """One epoch of training batches (a :class:`Loader`: iterate over it;
        each item is a :class:`CellBatch` with ``.X``, ``.cells`` and ``.obs``).

        Order. With ``shuffle`` the tiles are read in an order fixed by
        ``(seed, epoch)``; a window of ``window_tiles`` tiles is kept
        (compressed), its chunks are decompressed one at a time in a random
        order, ``mix_chunks`` of them are open at once, and each cell of a
        batch comes from one of them at random, so that a batch mixes cells of
        ``mix_chunks`` chunks from anywhere in the window. The same arguments
        give the same batches, another epoch another order. Without it, cells
        come in dataset order. A dataset converted from inputs that each hold
        one sample keeps each sample in a few tiles, so how well batches mix
        depends on the window: see the mixing table of docs/benchmarks/mixing.md.

        Sharing. The epoch's cells (``cells``, for example a train split as
        cell indices, or every cell) are split into ``world_size *
        num_workers`` consecutive, equal shares (differing by at most one
        cell), one per (``rank``, ``worker``): over one epoch every cell is
        yielded exactly once across all of them. With ``drop_last`` the few
        cells that would make shares unequal, and each share's last partial
        batch, are left out, so every rank yields the same number of batches.
        Inside a torch DataLoader use :class:`deltacells.torch.CellDataset`,
        which fills in rank and worker.

        Sampling. With ``weights`` (one non-negative weight per cell of
        ``cells``, or of the dataset), an epoch is ``num_samples`` cells
        (default: as many as there are) drawn with replacement, each with
        probability in proportion to its weight. ``balance="COLUMN"`` (a
        category column) makes the weights so that every class of it is
        equally likely, or as likely as ``class_weights={label: weight}``
        says (classes left out are not drawn); cells missing a value are not
        drawn. The draw is fixed by ``(seed, epoch)`` and the same for every
        rank and worker, which then split it as above; each tile is still
        read once per share and epoch.

        Reading runs on Rust threads, without the GIL, ahead of the consumer.
        Memory is bounded by the pipeline, not by the dataset or the number of
        epochs: the window and a few more tiles (compressed), the open
        chunks and a few decompressed ahead (4 bytes per nonzero) and
        ``prefetch + 4`` batches (8 bytes per nonzero; with ``dense=True``
        4 bytes per cell and gene: 82 MB for 1,024 cells of 20,000 genes),
        per process, kept for the next epoch.

        ``obs_columns`` are localized (copied into the local cache) when the
        iteration starts, then looked up for every batch.

        Genes. With ``genes`` (gene names, ``"source"``, or a
        :meth:`vocabulary`; ``gene_column`` as there), every batch's columns
        are those genes in that order, each cell written in them by the Rust
        batcher.

        Values and form, as :meth:`get_batch` takes them: ``normalize``,
        ``normalize_over``, ``log1p`` (off by default: counts stay int32
        counts), ``dtype``, ``sorted_columns``, and ``dense`` (``batch.X`` a ``(cells, genes)`` NumPy
        array). ``top_k=K`` adds ``batch.top_k``, for each cell the columns
        of its K highest values (int32 ``(cells, K)``, -1 past its nonzeros;
        ties go to the gene with more counts over the dataset, its stored
        column being lower) and ``batch.top_k_values`` (float32) beside
        them: the input of rank-based models.

        Keywords, by group (each group a TypedDict of ``deltacells._types``,
        which :meth:`Collection.batches` and
        :class:`deltacells.torch.CellDataset` take too):

        - order (:class:`OrderArgs`): ``shuffle``, ``seed``, ``drop_last``,
          ``window_tiles``, ``mix_chunks``, ``prefetch``; share
          (:class:`ShareArgs`): ``epoch``, ``rank``, ``world_size``,
          ``worker``, ``num_workers``. Their defaults are the Rust loader's:
          ``deltacells.LOADER_DEFAULTS``.
        - cells (:class:`SamplingArgs`): ``obs_columns``, ``cells`` (default:
          every cell), ``weights``, ``num_samples``, ``balance``,
          ``class_weights`` (default: none of them).
        - form (:class:`FormArgs`): ``normalize`` (None), ``normalize_over``
          (``"stored"``), ``log1p`` (False), ``dense`` (False), ``top_k``
          (None), ``dtype`` (None: int32), ``sorted_columns`` (True).
        - genes, here only: ``genes``, ``gene_column`` (None: the stored genes).

        An unknown keyword raises :class:`ArgumentTypeError` (a ``TypeError``).

        Raises :class:`InvalidArgumentError` (a ``ValueError``) for an
        argument out of its range, and :class:`UnknownNameError` (a
        ``KeyError``) for an obs column or class the dataset does not have,
        before anything is read.

        >>> for epoch in range(10):
        ...     for batch in ds.batches(1024, epoch=epoch, obs_columns=["cell_type"]):
        ...         x, y = batch.X.to_scipy(), batch.obs["cell_type"]
        >>> balanced = ds.batches(1024, balance="cell_type")
        """
        loader, sampling, form = batch_options("batches", batch_size, options)
        vocabulary = resolve(self, genes, gene_column)
        n_genes = self.n_genes if vocabulary is None else vocabulary.n_genes
        return Loader(self, loader, genes=vocabulary, form=form_from(form, n_genes), **sampling)

    def split(
        self,
        by: str,
        fractions: Sequence[float] = (0.8, 0.1, 0.1),
        seed: int = 0,
        cells: Cells | None = None,
    ) -> tuple[np.ndarray, ...]:
        """Splits the cells (or ``cells``) into parts by the groups of obs
        column ``by`` (a donor or sample column, say): every group goes whole
        into one part, so that no donor is in two. Returns one sorted int64
        array of cell indices per fraction, to pass as ``cells=``.

        The groups are placed largest first, each in the part furthest below
        its share, ties in an order fixed by ``seed``: each part's cells are
        within the size of the largest group of its target
        (``fraction * cells``). Missing values form a group of their own.
        Fractions must be non-negative and sum to 1.

        >>> train, val, test = ds.split(by="donor_id", fractions=(0.8, 0.1, 0.1), seed=0)
        >>> loader = ds.batches(1024, cells=train)
        """
        seed = integer("seed", seed, 0)
        self.obs.kind(by)
        index = None if cells is None else self.cell_indices(cells)
        return split(self.obs, by, fractions, seed, index)

    def to_anndata(
        self,
        cells: Cells | None = None,
        obs_columns: Sequence[str] | None = None,
        source_gene_order: bool = True,
        source_order: bool = False,
        genes: Genes | None = None,
        gene_column: str | None = None,
    ) -> anndata.AnnData:
        """Cells as an ``anndata.AnnData`` (anndata is imported only here).

        X is an int32 CSR matrix; obs holds ``obs_columns`` (every column by
        default; categoricals with the dataset's whole vocabulary) with the cell
        names (``obs_names``, or the cell indices) as its index; var is the gene
        table. With ``source_gene_order`` (the default) the genes are in the
        order of the source files, as they were converted from; otherwise in
        stored order. With ``genes`` (see :meth:`vocabulary`), X's columns are
        those genes in that order, and var has a row for each (empty for the
        genes the dataset lacks).

        With ``source_order``, the cells of a dataset converted with
        ``--shuffle`` come back in the order the input files held them (by
        its ``source_file`` and ``source_row`` obs columns, which are then
        left out of obs unless ``obs_columns`` names them); a dataset that was
        not shuffled raises :class:`InvalidArgumentError`.

        >>> adata = ds.to_anndata(range(1000))
        >>> original = ds.to_anndata(source_order=True)
        """
        import anndata
        import pandas as pd

        index = self._cell_array(range(self.n_cells) if cells is None else cells)
        names = self.obs.columns
        source = ["source_file", "source_row"]
        if flag("source_order", source_order):
            if not all(c in names for c in source):
                raise InvalidArgumentError(
                    f"source_order=True: {self.root}: obs has no source_file and source_row columns: the "
                    "dataset was not converted with --shuffle, its cells are in the inputs' order already"
                )
            self.obs.localize(source)
            where = self.obs.take(index, source)  # source_file as its codes
            files, rows = (np.asarray(where[c], np.int64) for c in source)
            index = index[np.lexsort((rows, files))]
        vocabulary = resolve(self, genes, gene_column)
        order = self.gene_order
        if vocabulary is None and flag("source_gene_order", source_gene_order) and order is not None:
            vocabulary = self.vocabulary("source")
        batch = self.get_batch(index, genes=vocabulary)
        assert isinstance(batch, Batch)  # not dense
        x = batch.to_scipy()
        hidden = source if source_order else []
        wanted = (
            [c for c in names if c != "obs_names" and c not in hidden] if obs_columns is None else list(obs_columns)
        )
        if names:
            self.obs.localize([c for c in (["obs_names"] if "obs_names" in names else []) + wanted])
            obs = self.obs.take_anndata(index, wanted)
        else:
            obs = pd.DataFrame(index=range(len(index)))
        obs.index = pd.Index(
            self.obs.take(index, ["obs_names"])["obs_names"] if "obs_names" in names else index.astype(str)
        )
        var = self.var
        if var is None:
            var = pd.DataFrame(index=pd.Index(self.var_names or [str(g) for g in range(self.n_genes)]))
        if vocabulary is not None:
            var = _var_of(var, vocabulary, self)
        return anndata.AnnData(X=x, obs=obs, var=var)

    def __len__(self) -> int:
        return self.n_cells

    def __repr__(self) -> str:
        return (
            f"<deltacells.Dataset {_deltacells.redact(self.root)!r}: {self.n_cells:,} cells x {self.n_genes:,} genes "
            f"in {self.n_tiles:,} {'tile' if self.n_tiles == 1 else 'tiles'}>"
        )


def _var_of(var: pd.DataFrame, vocabulary: Vocabulary, dataset: Dataset) -> pd.DataFrame:
    """``var`` (in stored order) with a row for each gene of ``vocabulary``, in
    its order: the first stored gene it matches, or an empty row."""
    import pandas as pd

    if vocabulary._given == "source":
        order = dataset.gene_order
        return var if order is None else var.iloc[np.argsort(order)]
    first: dict[str, int] = {}
    for j, key in enumerate(_stored_keys(dataset, vocabulary.column)):
        first.setdefault(key, j)
    rows = [first.get(name, -1) for name in vocabulary.names]
    table = var.reset_index().reindex(rows)
    table.index = pd.Index(vocabulary.names, name=var.index.name)
    return table.drop(columns=[c for c in table.columns if c == (var.index.name or "index")])
