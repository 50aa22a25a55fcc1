"""``deltacells.write_anndata``: an AnnData object already in memory (or
backed) converted without writing it to a file first. Its matrix is handed
to the binding by row blocks and its obs and var as tables, encoded here as
anndata writes them to a file; the conversion is the one :func:`convert`
runs, with the same options and refusals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np

from . import _deltacells
from ._args import keywords, location
from ._convert import ConvertSummary, convert_options, convert_summary
from ._jobs import run
from ._options import CONVERT_DEFAULTS
from ._reaching import reaching
from ._types import JobArgs, PathLike
from .exceptions import ArgumentTypeError, InvalidArgumentError

if TYPE_CHECKING:  # pragma: no cover
    import anndata
    import pandas as pd


def write_anndata(
    adata: anndata.AnnData,
    out: PathLike,
    *,
    matrix: str = "X",
    name: str = "AnnData",
    tile_size: int = CONVERT_DEFAULTS["tile_size"],
    chunks: int = CONVERT_DEFAULTS["chunks"],
    level: int = CONVERT_DEFAULTS["level"],
    gene_order_files: int = CONVERT_DEFAULTS["gene_order_files"],
    gene_order_from: PathLike | None = None,
    gene_order: PathLike | None = None,
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
    **job: Unpack[JobArgs],
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
    keywords("write_anndata", job, JobArgs.__annotations__)
    if not isinstance(name, str) or not name:
        raise ArgumentTypeError(f"name must be a non-empty string, not {name!r}")
    source = _AnnDataSource(adata, matrix, name)
    output = location("out", out)
    options = convert_options(
        matrix=matrix, tile_size=tile_size, chunks=chunks, level=level, gene_order_files=gene_order_files,
        gene_order_from=gene_order_from, gene_order=gene_order, genes="same", var=var, obs=obs, obs_names=obs_names,
        obs_exclude=obs_exclude, max_categories=max_categories, obs_tiles_per_file=obs_tiles_per_file,
        overwrite=overwrite, metadata=metadata, shuffle=shuffle, spill_dir=spill_dir,
    )
    reach = reaching(job)
    raw, notes = run(
        job.get("progress"),
        lambda bar: _deltacells.convert_anndata(
            source.describe(var=options["var"], obs=options["obs"], obs_exclude=options["obs_exclude"]),
            output, options, reach, bar,
        ),
    )
    return convert_summary(raw, notes)


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
