"""Conversion from Python: :func:`convert` and :func:`append` take the files
(and URLs) the ``deltacells convert`` and ``deltacells append`` commands
take, with every option of the commands as a keyword argument;
:func:`write_anndata` converts an AnnData object already in memory without
writing it to a file first. The conversion itself is the Rust library's, run
with the GIL released; the arguments are checked here first, each named in
the error that refuses it."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _deltacells
from ._args import flag, integer, location, thread_count
from ._errors import ArgumentTypeError, InvalidArgumentError
from ._types import _ConvertOptions, _Reaching

if TYPE_CHECKING:  # pragma: no cover
    import anndata
    import pandas as pd

PathLike = str | os.PathLike[str]


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


# the library's names of its input formats (InputFormat), in the order of its help
_INPUT_FORMATS: tuple[str, ...] = _deltacells.INPUT_FORMATS

FAST_LEVEL: int = _deltacells.FAST_LEVEL
"""The zstd level a conversion writes at unless told: the fastest."""
_GENE_SETS = ("same", "intersection", "union")
_MAX_U64 = (1 << 64) - 1


def _optional_name(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a string, not {value!r}")
    if not value.strip():
        raise InvalidArgumentError(f"{name}: an empty name; give the name as the file spells it")
    return value


def _choice(name: str, value: Any, choices: Sequence[str], optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(map(repr, choices))}, not {value!r}")
    return value


def _folder(name: str, value: Any) -> str | None:
    """An optional local folder that must exist."""
    if value is None:
        return None
    path = location(name, value)
    if not os.path.isdir(path):
        raise InvalidArgumentError(f"{name}={path!r}: not a folder (it must exist)")
    return path


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


def _reaching(
    *, anonymous: Any, endpoint: Any, input_format: Any, feature_type: Any, genome: Any, download_inputs: Any,
    download_dir: Any, threads: Any,
) -> _Reaching:
    downloading = flag("download_inputs", download_inputs)
    if download_dir is not None and not downloading:
        raise InvalidArgumentError("download_dir is where download_inputs=True puts the inputs; pass both")
    return _Reaching(
        anonymous=flag("anonymous", anonymous),
        endpoint=None if endpoint is None else location("endpoint", endpoint),
        input_format=_choice("input_format", input_format, _INPUT_FORMATS, optional=True),
        feature_type=_optional_name("feature_type", feature_type),
        genome=_optional_name("genome", genome),
        download_inputs=downloading,
        download_dir=_folder("download_dir", download_dir),
        threads=thread_count("threads", threads),
    )


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


def _convert_options(
    *, matrix: Any, tile_size: Any, chunks: Any, level: Any, gene_order_files: Any, gene_order_from: Any,
    gene_order: Any, genes: Any, var: Any, obs: Any, obs_names: Any, obs_exclude: Any, max_categories: Any,
    obs_tiles_per_file: Any, overwrite: Any, metadata: Any, shuffle: Any, spill_dir: Any,
) -> _ConvertOptions:
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
        tile_size=integer("tile_size", tile_size, 1, _MAX_U64),
        chunks=integer("chunks", chunks, 1, 1024),
        level=integer("level", level, 1, 22),
        gene_order_files=integer("gene_order_files", gene_order_files, 0, 1 << 32),
        gene_order_from=None if gene_order_from is None else location("gene_order_from", gene_order_from),
        gene_order=None if gene_order is None else location("gene_order", gene_order),
        genes=_choice("genes", genes, _GENE_SETS),
        var=flag("var", var),
        obs=flag("obs", obs),
        obs_names=flag("obs_names", obs_names),
        obs_exclude=exclude,
        max_categories=integer("max_categories", max_categories, 0, 1 << 32),
        obs_tiles_per_file=integer("obs_tiles_per_file", obs_tiles_per_file, 1, 1 << 32),
        overwrite=flag("overwrite", overwrite),
        metadata=_metadata(metadata),
        shuffle=None if shuffle is None else integer("shuffle", shuffle, 0, _MAX_U64),
        spill_dir=_folder("spill_dir", spill_dir),
    )


class _Progress:
    """What the Rust job reports while it runs (phases, the file being read,
    cells done, notes), shown as a tqdm bar (a widget in Jupyter, text in a
    terminal) when ``show``; the notes are kept for the summary either way."""

    def __init__(self, show: bool) -> None:
        self.show = show
        self.notes: list[str] = []
        self._bar: Any = None

    def phase(self, name: str, total_cells: int) -> None:
        if not self.show:
            return
        self.close()
        self._bar = _bar_class()(
            total=total_cells or None, desc=name, unit=" cells", unit_scale=bool(total_cells), dynamic_ncols=True,
            file=sys.stderr,
        )

    def file(self, name: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(name, refresh=False)

    def advance(self, cells: int) -> None:
        if self._bar is not None:
            self._bar.update(cells)

    def note(self, message: str) -> None:
        self.notes.append(message)
        if self.show:
            _bar_class().write(f"deltacells: note: {message}", file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _in_jupyter() -> bool:
    """Whether this runs in a Jupyter kernel."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # pragma: no cover - a broken IPython is not ours to fix
        return False
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def _bar_class() -> Any:
    """tqdm's widget in Jupyter when ipywidgets is there to draw it, else its
    text bar (which Jupyter shows too, without the warning tqdm.auto gives)."""
    if _in_jupyter():
        try:
            import ipywidgets  # noqa: F401
            from tqdm.notebook import tqdm as notebook_bar

            return notebook_bar
        except ImportError:
            pass
    from tqdm import tqdm as text_bar

    return text_bar


def _interactive() -> bool:
    """Whether a progress bar can be seen: a Jupyter kernel, or stderr a terminal."""
    if _in_jupyter():
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stderr
        return False


def _progress(value: Any) -> _Progress:
    show = _interactive() if value is None else flag("progress", value)
    return _Progress(show)


def _run(progress: _Progress, job: Callable[[_Progress], str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    try:
        summary = json.loads(job(progress))
    finally:
        progress.close()
    return summary, tuple(progress.notes)


def _convert_summary(raw: dict[str, Any], notes: tuple[str, ...]) -> ConvertSummary:
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
    tile_size: int = 10_000,
    chunks: int = 8,
    level: int = FAST_LEVEL,
    threads: int | None = None,
    gene_order_files: int = 10,
    gene_order_from: PathLike | None = None,
    gene_order: PathLike | None = None,
    genes: str = "same",
    var: bool = True,
    obs: bool = True,
    obs_names: bool = True,
    obs_exclude: Sequence[str] = (),
    max_categories: int = 20_000,
    obs_tiles_per_file: int = 1000,
    shuffle: int | None = None,
    spill_dir: PathLike | None = None,
    overwrite: bool = False,
    metadata: Mapping[str, str] | None = None,
    input_format: str | None = None,
    feature_type: str | None = None,
    genome: str | None = None,
    download_inputs: bool = False,
    download_dir: PathLike | None = None,
    anonymous: bool = False,
    endpoint: str | None = None,
    progress: bool | None = None,
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
    paths = _inputs(inputs)
    output = location("out", out)
    options = _convert_options(
        matrix=matrix, tile_size=tile_size, chunks=chunks, level=level, gene_order_files=gene_order_files,
        gene_order_from=gene_order_from, gene_order=gene_order, genes=genes, var=var, obs=obs, obs_names=obs_names,
        obs_exclude=obs_exclude, max_categories=max_categories, obs_tiles_per_file=obs_tiles_per_file,
        overwrite=overwrite, metadata=metadata, shuffle=shuffle, spill_dir=spill_dir,
    )
    reaching = _reaching(
        anonymous=anonymous, endpoint=endpoint, input_format=input_format, feature_type=feature_type, genome=genome,
        download_inputs=download_inputs, download_dir=download_dir, threads=threads,
    )
    raw, notes = _run(
        _progress(progress), lambda bar: _deltacells.convert_files(paths, output, options, reaching, bar)
    )
    return _convert_summary(raw, notes)


def append(
    dataset: PathLike,
    inputs: PathLike | Sequence[PathLike] = (),
    *,
    matrix: str | None = None,
    resume: bool = False,
    shuffle: int | None = None,
    spill_dir: PathLike | None = None,
    threads: int | None = None,
    input_format: str | None = None,
    feature_type: str | None = None,
    genome: str | None = None,
    download_inputs: bool = False,
    download_dir: PathLike | None = None,
    anonymous: bool = False,
    endpoint: str | None = None,
    progress: bool | None = None,
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
        "shuffle": None if shuffle is None else integer("shuffle", shuffle, 0, _MAX_U64),
        "spill_dir": _folder("spill_dir", spill_dir),
    }
    reaching = _reaching(
        anonymous=anonymous, endpoint=endpoint, input_format=input_format, feature_type=feature_type, genome=genome,
        download_inputs=download_inputs, download_dir=download_dir, threads=threads,
    )
    root = location("dataset", dataset)
    raw, notes = _run(_progress(progress), lambda bar: _deltacells.append_files(root, paths, options, reaching, bar))
    return AppendSummary(
        outcome=raw["outcome"], inputs=tuple(raw["inputs"]), cells_before=raw["cells_before"],
        cells_added=raw["cells_added"], cells=raw["n_cells"], tile_rewritten=raw["tile_rewritten"],
        tiles_added=raw["tiles_added"], bytes_written=raw["tile_bytes_written"],
        obs_shards_written=raw["obs_shards_written"], summed_duplicates=raw["summed_duplicates"],
        seconds=raw["seconds"], notes=notes,
    )


def write_anndata(
    adata: anndata.AnnData,
    out: PathLike,
    *,
    matrix: str = "X",
    name: str = "AnnData",
    tile_size: int = 10_000,
    chunks: int = 8,
    level: int = FAST_LEVEL,
    threads: int | None = None,
    gene_order_files: int = 10,
    gene_order_from: PathLike | None = None,
    gene_order: PathLike | None = None,
    var: bool = True,
    obs: bool = True,
    obs_names: bool = True,
    obs_exclude: Sequence[str] = (),
    max_categories: int = 20_000,
    obs_tiles_per_file: int = 1000,
    shuffle: int | None = None,
    spill_dir: PathLike | None = None,
    overwrite: bool = False,
    metadata: Mapping[str, str] | None = None,
    anonymous: bool = False,
    endpoint: str | None = None,
    progress: bool | None = None,
) -> ConvertSummary:
    """Convert an AnnData object into a dataset at ``out``, without writing it
    to an ``.h5ad`` file first: the dataset is the one :func:`convert` writes
    from the object saved with ``adata.write_h5ad`` (its tiles, genes, var and
    obs), and the same values are refused (a matrix that is not counts).

    The matrix may be CSR, CSC (converted to CSR once, in memory) or dense,
    of any integer type or of floats holding whole numbers, in memory or
    backed (read in row blocks from its file). obs and var columns are stored
    with the types they have: ``write_h5ad`` turns columns of strings into
    categoricals first, this does not.

    Args:
        adata: the AnnData object.
        out: the dataset: a local folder, or an ``s3://`` or ``gs://`` prefix.
        matrix: ``"X"``, ``"raw/X"`` or ``"layers/NAME"``.
        name: what the object is called in messages and in the manifest's
            record of the inputs.
        tile_size, chunks, level, threads, gene_order_files, gene_order_from,
            gene_order, var, obs, obs_names, obs_exclude, max_categories,
            obs_tiles_per_file, shuffle, spill_dir, overwrite, metadata,
            anonymous, endpoint, progress: as for :func:`convert`.

    Returns:
        What was written.

    Raises:
        InvalidInputError: a matrix that is not counts (the cell and gene
            named), or a table that does not fit it.
        ArgumentTypeError: an object that is not an AnnData, or a column of
            a type that cannot be stored.
        DatasetExistsError: ``out`` holds a dataset and ``overwrite`` is False.
    """
    if not isinstance(name, str) or not name:
        raise ArgumentTypeError(f"name must be a non-empty string, not {name!r}")
    source = _AnnDataSource(adata, matrix, name)
    output = location("out", out)
    options = _convert_options(
        matrix=matrix, tile_size=tile_size, chunks=chunks, level=level, gene_order_files=gene_order_files,
        gene_order_from=gene_order_from, gene_order=gene_order, genes="same", var=var, obs=obs, obs_names=obs_names,
        obs_exclude=obs_exclude, max_categories=max_categories, obs_tiles_per_file=obs_tiles_per_file,
        overwrite=overwrite, metadata=metadata, shuffle=shuffle, spill_dir=spill_dir,
    )
    reaching = _reaching(
        anonymous=anonymous, endpoint=endpoint, input_format=None, feature_type=None, genome=None,
        download_inputs=False, download_dir=None, threads=threads,
    )
    raw, notes = _run(
        _progress(progress),
        lambda bar: _deltacells.convert_anndata(
            source.describe(var=options["var"], obs=options["obs"], obs_exclude=options["obs_exclude"]),
            output, options, reaching, bar,
        ),
    )
    return _convert_summary(raw, notes)


class _AnnDataSource:
    """An AnnData object's matrix (by row blocks) and tables, as the binding
    takes them."""

    def __init__(self, adata: Any, matrix: Any, name: str) -> None:
        if not all(hasattr(adata, a) for a in ("X", "obs", "var", "layers", "shape")):
            raise ArgumentTypeError(f"adata must be an AnnData object, not {type(adata).__name__}")
        self.adata = adata
        self.name = name
        if matrix == "X":
            self.matrix, self.var = adata.X, adata.var
        elif matrix == "raw/X":
            if adata.raw is None:
                raise InvalidArgumentError("matrix='raw/X': the AnnData object has no raw")
            self.matrix, self.var = adata.raw.X, adata.raw.var
        elif isinstance(matrix, str) and matrix.startswith("layers/"):
            layer = matrix.removeprefix("layers/")
            if layer not in adata.layers:
                raise InvalidArgumentError(
                    f"matrix={matrix!r}: no such layer; the layers are: {', '.join(adata.layers.keys()) or 'none'}"
                )
            self.matrix, self.var = adata.layers[layer], adata.var
        else:
            raise InvalidArgumentError(f"matrix must be X, raw/X or layers/NAME, not {matrix!r}")
        if self.matrix is None:
            raise InvalidArgumentError(f"matrix={matrix!r}: the AnnData object has no {matrix}")
        dtype = getattr(self.matrix, "dtype", None)
        if dtype is not None and np.dtype(dtype).kind not in "iufb":
            raise ArgumentTypeError(f"matrix={matrix!r}: holds values of dtype {dtype}, not numbers")
        self.matrix_name = matrix
        self.shape = (int(self.matrix.shape[0]), int(self.matrix.shape[1]))
        self._csr: Any = None

    def describe(self, *, var: bool, obs: bool, obs_exclude: Sequence[str]) -> dict[str, Any]:
        """What the binding takes: the matrix's shape and row blocks, the
        tables (their columns only when they are stored)."""
        return {
            "name": self.name,
            "matrix": self.matrix_name,
            "n_rows": self.shape[0],
            "n_cols": self.shape[1],
            "rows": self.rows,
            "others": [(name, int(m.shape[0]), int(m.shape[1])) for name, m in self._others().items()],
            "var": _table(self.var, "var", with_columns=var),
            "obs": _table(self.adata.obs, "obs", with_columns=obs, left_out=obs_exclude),
        }

    def _others(self) -> dict[str, Any]:
        """The object's other matrices by name, in the order an .h5ad file
        lists them: the binding tells from their first rows whether one
        holds counts, for the message that refuses this one."""
        found: dict[str, Any] = {"X": self.adata.X}
        if self.adata.raw is not None:
            found["raw/X"] = self.adata.raw.X
        found.update((f"layers/{k}", v) for k, v in self.adata.layers.items())
        return {name: m for name, m in found.items() if name != self.matrix_name and m is not None}

    def rows(self, matrix: str, start: int, end: int) -> tuple[np.ndarray, ...]:
        """Rows ``start:end`` of the matrix ``matrix`` (the one converted, or
        one of :meth:`_others`) as CSR arrays (int64, int64, float64)."""
        if matrix == self.matrix_name:
            return _csr_rows(self.matrix, start, end, self)
        return _csr_rows(self._others()[matrix], start, end, None)


def _csr_rows(m: Any, start: int, end: int, cache: _AnnDataSource | None) -> tuple[np.ndarray, ...]:
    """Rows ``start:end`` of matrix ``m`` as CSR arrays (int64 indptr and
    indices, float64 values). A matrix that cannot be sliced by rows (CSC, in
    memory or backed) is made CSR whole once, kept in ``cache``."""
    import scipy.sparse as sp

    backed_sparse = not sp.issparse(m) and hasattr(m, "format") and hasattr(m, "to_memory")
    if (sp.issparse(m) or backed_sparse) and m.format != "csr":
        if cache is not None and cache._csr is not None:
            m = cache._csr
        else:
            m = sp.csr_matrix(m.to_memory() if backed_sparse else m)
            if cache is not None:
                cache._csr = m
        block = m[start:end]
    elif sp.issparse(m) or backed_sparse:
        block = sp.csr_matrix(m[start:end])
    else:
        # dense: a NumPy array, or a backed h5py dataset
        block = sp.csr_matrix(np.asarray(m[start:end]))
    if block.dtype.kind not in "iufb":
        raise ArgumentTypeError(f"the matrix holds values of dtype {block.dtype}, not numbers")
    return (
        np.asarray(block.indptr, dtype=np.int64),
        np.asarray(block.indices, dtype=np.int64),
        np.asarray(block.data, dtype=np.float64),
    )


def _table(
    df: pd.DataFrame, what: str, *, with_columns: bool, left_out: Sequence[str] = ()
) -> dict[str, Any]:
    """A pandas DataFrame (obs or var) as the binding takes a table: its
    index, and its columns (``with_columns``) encoded as anndata writes them
    to a file; those ``left_out`` are named with no values (the conversion
    checks the names and stores none of them)."""
    index_name = df.index.name
    columns = []
    for name in df.columns if with_columns else ():
        if str(name) in left_out:
            columns.append({"name": str(name), "kind": "string", "values": [None] * len(df), "mask": None,
                            "categories": None, "categories_kind": None, "ordered": False})
        else:
            columns.append(_column(what, str(name), df[name]))
    return {
        "index_name": index_name if isinstance(index_name, str) and index_name not in df.columns else "_index",
        "index": [str(v) for v in df.index],
        "columns": columns,
    }


def _column(what: str, name: str, s: pd.Series) -> dict[str, Any]:
    import pandas as pd

    column: dict[str, Any] = {"name": name, "mask": None, "categories": None, "categories_kind": None,
                              "ordered": False}
    dtype = s.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        categories = dtype.categories
        kind = categories.dtype.kind
        column.update(
            kind="category",
            values=np.asarray(s.cat.codes, dtype=np.int32).tolist(),
            categories=categories.to_numpy().tolist() if kind in "iufb" else [str(c) for c in categories],
            categories_kind={"i": "int", "u": "int", "f": "float", "b": "bool"}.get(kind, "str"),
            ordered=bool(dtype.ordered),
        )
    elif isinstance(dtype, pd.BooleanDtype):
        column.update(kind="bool", values=s.fillna(False).to_numpy(dtype=bool).tolist(),
                      mask=s.isna().to_numpy().tolist())
    elif isinstance(dtype, pd.api.extensions.ExtensionDtype) and dtype.kind in "iuf":
        # pandas' nullable integers and floats: values and a mask, as anndata writes them
        numpy_dtype = np.dtype(dtype.numpy_dtype)
        column.update(kind="numeric", values=s.fillna(0).to_numpy(dtype=numpy_dtype),
                      mask=s.isna().to_numpy().tolist())
    elif isinstance(dtype, pd.StringDtype) or dtype.kind == "O":
        values = s.tolist()
        for v in values:
            if v is not None and v is not pd.NA and not (isinstance(v, float) and np.isnan(v)) \
                    and not isinstance(v, str):
                raise ArgumentTypeError(
                    f"{what}[{name!r}]: holds {type(v).__name__} values; deltacells stores strings, numbers, "
                    "booleans and categoricals"
                )
        column.update(kind="string", values=[v if isinstance(v, str) else None for v in values])
    elif dtype.kind == "b":
        column.update(kind="bool", values=s.to_numpy().tolist())
    elif dtype.kind in "iuf":
        column.update(kind="numeric", values=np.ascontiguousarray(s.to_numpy()))
    else:
        raise ArgumentTypeError(
            f"{what}[{name!r}]: a column of dtype {dtype}, which deltacells cannot store; "
            "obs_exclude leaves an obs column out"
        )
    return column
