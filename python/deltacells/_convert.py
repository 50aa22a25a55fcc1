"""Conversion from Python: :func:`convert` and :func:`append` take the files
(and URLs) the ``deltacells convert`` and ``deltacells append`` commands
take, with every option of the commands as a keyword argument. The
conversion itself is the Rust library's, run with the GIL released; the
arguments are checked here first, each named in the error that refuses it.
The options of a conversion are checked here for ``write_anndata`` too
(``_anndata``); how a job reaches its inputs and dataset is ``_reaching``'s,
how it runs and reports ``_jobs``'."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from . import _deltacells
from ._args import choice, flag, folder, integer, keywords, location
from ._jobs import run
from ._options import CONVERT_DEFAULTS, MAX_U64
from ._reaching import reaching
from ._types import InputJobArgs, PathLike, _ConvertOptions
from .exceptions import ArgumentTypeError, InvalidArgumentError


@dataclass(frozen=True)
class ConvertSummary:
    """What a conversion wrote.

    Attributes:
        cells: cells in the dataset.
        genes: genes (columns) it stores.
        tiles: tiles written.
        nonzeros: nonzero counts stored.
        bytes: bytes of the tiles.
        bytes_per_nonzero: ``bytes / nonzeros``.
        dropped_nonzeros: nonzeros of genes left out (``genes="intersection"``).
        summed_duplicates: entries that repeated a cell and gene of an earlier
            entry, each added to it.
        seconds: wall time of the conversion.
        notes: what the conversion noted that is not an error (inputs whose
            genes were aligned by name, for example).
    """

    cells: int
    genes: int
    tiles: int
    nonzeros: int
    bytes: int
    bytes_per_nonzero: float
    dropped_nonzeros: int
    summed_duplicates: int
    seconds: float
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class AppendSummary:
    """What an append did.

    Attributes:
        outcome: ``"appended"``; ``"completed"`` (an interrupted append of the
            same inputs, finished); or ``"already appended"`` (these inputs
            were the last append, which had finished: nothing was written).
        inputs: the inputs appended.
        cells_before: cells the dataset had before.
        cells_added: cells appended.
        cells: cells the dataset has now.
        tile_rewritten: the dataset's last tile, when it was not full and was
            rewritten with the first new cells; else None.
        tiles_added: tiles added.
        bytes_written: bytes of the tiles written (the rewritten one included).
        obs_shards_written: obs shards written (rewritten or new).
        summed_duplicates: entries that repeated a cell and gene of an earlier
            entry, each added to it.
        seconds: wall time of the append.
        notes: what the append noted that is not an error.
    """

    outcome: str
    inputs: tuple[str, ...]
    cells_before: int
    cells_added: int
    cells: int
    tile_rewritten: int | None
    tiles_added: int
    bytes_written: int
    obs_shards_written: int
    summed_duplicates: int
    seconds: float
    notes: tuple[str, ...] = ()


FAST_LEVEL: int = _deltacells.FAST_LEVEL
"""The zstd level a conversion writes at unless told: the fastest."""
_GENE_SETS = ("same", "intersection", "union")


def _inputs(value: Any, *, allow_empty: bool = False) -> list[str]:
    """``inputs``: one path or URL, or a sequence of them."""
    if isinstance(value, (str, os.PathLike)):
        return [location("inputs", value)]
    if isinstance(value, bytes) or not isinstance(value, Iterable):
        raise ArgumentTypeError(f"inputs must be a path or URL, or a list of them, not {value!r}")
    paths = [location(f"inputs[{i}]", v) for i, v in enumerate(value)]
    if not paths and not allow_empty:
        raise InvalidArgumentError("inputs: no input files")
    return paths


def _metadata(value: Any) -> list[tuple[str, str]]:
    if value is None:
        return []
    if not isinstance(value, Mapping):
        raise ArgumentTypeError(f"metadata must be a dict of strings, not {value!r}")
    pairs = []
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ArgumentTypeError(f"metadata: keys and values are strings, not {k!r}: {v!r}")
        pairs.append((k, v))
    return pairs


def convert_options(
    *, matrix: Any, tile_size: Any, chunks: Any, level: Any, gene_order_files: Any, gene_order_from: Any,
    gene_order: Any, genes: Any, var: Any, obs: Any, obs_names: Any, obs_exclude: Any, max_categories: Any,
    obs_tiles_per_file: Any, overwrite: Any, metadata: Any, shuffle: Any, spill_dir: Any,
) -> _ConvertOptions:
    """The options of a conversion (:func:`convert`'s, and ``write_anndata``'s),
    checked, as the binding takes them."""
    if not isinstance(matrix, str) or not matrix:
        raise InvalidArgumentError(f"matrix must be X, raw/X or layers/NAME, not {matrix!r}")
    if gene_order_from is not None and gene_order is not None:
        raise InvalidArgumentError("gene_order_from and gene_order both give a gene order; pass one")
    if isinstance(obs_exclude, str):
        obs_exclude = [c for c in obs_exclude.split(",") if c]
    if isinstance(obs_exclude, (bytes, Mapping)) or not isinstance(obs_exclude, Iterable):
        raise ArgumentTypeError(f"obs_exclude must be a list of column names, not {obs_exclude!r}")
    exclude = list(obs_exclude)
    for column in exclude:
        if not isinstance(column, str):
            raise ArgumentTypeError(f"obs_exclude: column names are strings, not {column!r}")
    return _ConvertOptions(
        matrix=matrix,
        tile_size=integer("tile_size", tile_size, 1, MAX_U64),
        chunks=integer("chunks", chunks, 1, 1024),
        level=integer("level", level, 1, 22),
        gene_order_files=integer("gene_order_files", gene_order_files, 0, 1 << 32),
        gene_order_from=None if gene_order_from is None else location("gene_order_from", gene_order_from),
        gene_order=None if gene_order is None else location("gene_order", gene_order),
        genes=choice("genes", genes, _GENE_SETS),
        var=flag("var", var),
        obs=flag("obs", obs),
        obs_names=flag("obs_names", obs_names),
        obs_exclude=exclude,
        max_categories=integer("max_categories", max_categories, 0, 1 << 32),
        obs_tiles_per_file=integer("obs_tiles_per_file", obs_tiles_per_file, 1, 1 << 32),
        overwrite=flag("overwrite", overwrite),
        metadata=_metadata(metadata),
        shuffle=None if shuffle is None else integer("shuffle", shuffle, 0, MAX_U64),
        spill_dir=folder("spill_dir", spill_dir),
    )


def convert_summary(raw: dict[str, Any], notes: tuple[str, ...]) -> ConvertSummary:
    """The summary a conversion's job returned, with its notes."""
    return ConvertSummary(
        cells=raw["n_cells"], genes=raw["n_genes"], tiles=raw["n_tiles"], nonzeros=raw["nnz"],
        bytes=raw["tile_bytes"], bytes_per_nonzero=raw["bytes_per_nonzero"],
        dropped_nonzeros=raw["dropped_nonzeros"], summed_duplicates=raw["summed_duplicates"],
        seconds=raw["seconds"], notes=notes,
    )


def convert(
    inputs: PathLike | Sequence[PathLike],
    out: PathLike,
    *,
    matrix: str = "X",
    tile_size: int = CONVERT_DEFAULTS["tile_size"],
    chunks: int = CONVERT_DEFAULTS["chunks"],
    level: int = CONVERT_DEFAULTS["level"],
    gene_order_files: int = CONVERT_DEFAULTS["gene_order_files"],
    gene_order_from: PathLike | None = None,
    gene_order: PathLike | None = None,
    genes: str = "same",
    var: bool = True,
    obs: bool = True,
    obs_names: bool = True,
    obs_exclude: Sequence[str] = (),
    max_categories: int = CONVERT_DEFAULTS["max_categories"],
    obs_tiles_per_file: int = CONVERT_DEFAULTS["obs_tiles_per_file"],
    shuffle: int | None = None,
    spill_dir: PathLike | None = None,
    overwrite: bool = False,
    metadata: Mapping[str, str] | None = None,
    **job: Unpack[InputJobArgs],
) -> ConvertSummary:
    """Convert count matrices into a dataset at ``out``, as ``deltacells
    convert INPUTS... OUT`` does (the same bytes, the same refusals).

    Args:
        inputs: an input or a list of them, converted in that order: AnnData
            ``.h5ad`` or zarr, 10x Genomics ``.h5``, Matrix Market files or
            folders; local paths or ``s3://``, ``gs://``, ``http(s)://`` URLs.
        out: the dataset: a local folder, or an ``s3://`` or ``gs://`` prefix.
        matrix: ``"X"``, ``"raw/X"`` or ``"layers/NAME"`` (AnnData inputs).
        tile_size: cells per tile.
        chunks: chunks per tile (units of parallel decoding), 1 to 1024. A
            cell read alone decompresses its whole chunk: for a dataset read
            in random ``get_batch`` batches rather than by the loader, 1024
            reads them several times faster for about 10% more bytes.
        level: zstd level, 1 to 22. The default, 1, writes fastest; 19 is
            about 8% smaller and some 50 times slower to write, and decodes as
            fast: :func:`compact` gets there later.
        threads: worker threads (None: all cores); the bytes do not depend on it.
        gene_order_files: inputs summed to choose the gene order (0 keeps the
            inputs' order).
        gene_order_from: store the genes in the order of this dataset (by name).
        gene_order: a ``.npy`` of the input columns in the order to store them.
        genes: ``"same"`` (refuse inputs whose genes differ), ``"intersection"``
            or ``"union"``.
        var: write ``var.parquet`` (the first input's gene table).
        obs: store obs (cell metadata).
        obs_names: store the cell names as the ``obs_names`` column.
        obs_exclude: obs columns to leave out.
        max_categories: a categorical column with more categories is stored
            as strings.
        obs_tiles_per_file: tiles per obs shard file.
        shuffle: store the cells in a random order fixed by this seed (0 to
            2**64-1), so that each tile is a random sample of the dataset.
        spill_dir: where ``shuffle`` keeps cells between its passes (a folder
            that exists; default: the system's temporary folder).
        overwrite: replace a dataset already in ``out``.
        metadata: added to the manifest's metadata.
        input_format: ``"h5ad"``, ``"10x-h5"``, ``"mtx"`` or ``"zarr"``
            (default: told by each input's name and content).
        feature_type: 10x and Matrix Market inputs: the features converted
            (default: ``"Gene Expression"``).
        genome: 10x inputs of several genomes: the one converted.
        download_inputs: download inputs at URLs whole before reading them
            (into ``download_dir``, else a temporary folder).
        download_dir: where ``download_inputs`` puts them.
        anonymous: send no credentials (public buckets).
        endpoint: the object store's address (S3-compatible stores, emulators).
        progress: show a progress bar (None: when stderr is a terminal or in
            a Jupyter notebook).

    Returns:
        What was written: cells, genes, tiles, bytes, seconds.

    Raises:
        InputNotFoundError: an input that does not exist.
        InvalidInputError: an input whose matrix is not counts, or whose genes
            or obs columns do not fit the other inputs'.
        DatasetExistsError: ``out`` holds a dataset and ``overwrite`` is False.
        InvalidArgumentError: an argument out of its range.

    Nothing is left under ``out`` by a conversion that fails.

    >>> import deltacells
    >>> summary = deltacells.convert("examples/pbmc_1k.h5ad", "out/pbmc_1k", overwrite=True)  # doctest: +SKIP
    >>> summary.cells  # doctest: +SKIP
    1000
    """
    keywords("convert", job, InputJobArgs.__annotations__)
    paths = _inputs(inputs)
    output = location("out", out)
    options = convert_options(
        matrix=matrix, tile_size=tile_size, chunks=chunks, level=level, gene_order_files=gene_order_files,
        gene_order_from=gene_order_from, gene_order=gene_order, genes=genes, var=var, obs=obs, obs_names=obs_names,
        obs_exclude=obs_exclude, max_categories=max_categories, obs_tiles_per_file=obs_tiles_per_file,
        overwrite=overwrite, metadata=metadata, shuffle=shuffle, spill_dir=spill_dir,
    )
    reach = reaching(job, inputs=job)
    raw, notes = run(job.get("progress"), lambda bar: _deltacells.convert_files(paths, output, options, reach, bar))
    return convert_summary(raw, notes)


def append(
    dataset: PathLike,
    inputs: PathLike | Sequence[PathLike] = (),
    *,
    matrix: str | None = None,
    resume: bool = False,
    shuffle: int | None = None,
    spill_dir: PathLike | None = None,
    **job: Unpack[InputJobArgs],
) -> AppendSummary:
    """Append the cells of ``inputs`` to ``dataset``, as ``deltacells append
    DATASET INPUTS...`` does: the result is the dataset a conversion of all
    its inputs would have written, and a reader never sees a half-appended
    dataset (an append that is interrupted is completed by the next one, or
    by ``resume=True``).

    Args:
        dataset: a local folder, or an ``s3://`` or ``gs://`` prefix.
        inputs: the inputs to append, in order (as for :func:`convert`).
        matrix: the inputs' matrix (default: the one the dataset was converted from).
        resume: complete the interrupted append recorded in the dataset, with
            the inputs it recorded (give no inputs).
        shuffle: store the appended cells in a random order fixed by this seed
            (the dataset must have been converted with ``shuffle``).
        spill_dir: where ``shuffle`` keeps cells between its passes.
        threads, input_format, feature_type, genome, download_inputs,
            download_dir, anonymous, endpoint, progress: as for :func:`convert`.

    Returns:
        What the append did.

    Raises:
        InputNotFoundError, InvalidInputError: as for :func:`convert` (an
            input whose genes or obs columns differ from the dataset's too).
        DatasetNotFoundError: no complete dataset at ``dataset``.
    """
    keywords("append", job, InputJobArgs.__annotations__)
    resuming = flag("resume", resume)
    paths = _inputs(inputs, allow_empty=True)
    if resuming and (paths or matrix is not None or shuffle is not None):
        raise InvalidArgumentError("resume=True completes the recorded append: give no inputs, matrix or shuffle")
    if not resuming and not paths:
        raise InvalidArgumentError("inputs: no input files (or resume=True to complete an interrupted append)")
    if matrix is not None and (not isinstance(matrix, str) or not matrix):
        raise InvalidArgumentError(f"matrix must be X, raw/X or layers/NAME, not {matrix!r}")
    options = {
        "matrix": matrix,
        "resume": resuming,
        "shuffle": None if shuffle is None else integer("shuffle", shuffle, 0, MAX_U64),
        "spill_dir": folder("spill_dir", spill_dir),
    }
    reach = reaching(job, inputs=job)
    root = location("dataset", dataset)
    raw, notes = run(job.get("progress"), lambda bar: _deltacells.append_files(root, paths, options, reach, bar))
    return AppendSummary(
        outcome=raw["outcome"], inputs=tuple(raw["inputs"]), cells_before=raw["cells_before"],
        cells_added=raw["cells_added"], cells=raw["n_cells"], tile_rewritten=raw["tile_rewritten"],
        tiles_added=raw["tiles_added"], bytes_written=raw["tile_bytes_written"],
        obs_shards_written=raw["obs_shards_written"], summed_duplicates=raw["summed_duplicates"],
        seconds=raw["seconds"], notes=notes,
    )
