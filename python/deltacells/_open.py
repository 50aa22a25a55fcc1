"""Opening datasets and collections: the package's two entry points to
reading, each checking its arguments (naming any it refuses) before the Rust
library opens anything."""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import numpy as np

from . import _deltacells
from ._args import MAX_BYTES, column_names, integer, keywords, location, thread_count
from ._collection import Collection, GeneChoice
from ._dataset import Dataset
from ._options import store_options
from ._types import StoreArgs
from ._vocabulary import _names
from .exceptions import ArgumentTypeError, InvalidArgumentError


def open_dataset(
    root: str,
    obs_columns: Sequence[str] | None = None,
    cache_dir: str | None = None,
    *,
    threads: int | None = None,
    cache_bytes: int = _deltacells.DEFAULT_CACHE_BYTES,
    **store: Unpack[StoreArgs],
) -> Dataset:
    """Opens the dataset at ``root`` and checks its manifest.

    Parameters
    ----------
    root
        A local folder, a ``file://`` URL, or ``s3://bucket/prefix``,
        ``gs://bucket/prefix``, ``http(s)://host/prefix``, with the credentials
        the ``deltacells`` command uses (AWS and Google environment variables and
        configuration files).
    obs_columns
        Cell-metadata columns to copy into the local cache now (see :class:`Obs`),
        so that nothing is fetched during training.
    cache_dir
        The cache folder; default ``$DELTACELLS_CACHE``, else
        ``$XDG_CACHE_HOME/deltacells``, else ``~/.cache/deltacells``. It holds
        the localized obs columns and, for a local dataset, the record of
        the tiles whose CRC was checked: a gather reads a tile whole, for its
        CRC, only the first time any process on this machine touches that
        version of the tile's file (an epoch of the loader, which reads
        every tile whole, records them too).
    threads
        Threads that decode (and, for buckets, fetch); default all cores.
    anonymous
        Send no credentials (public buckets).
    endpoint
        The address of an S3-compatible store or emulator.
    cache_bytes
        Keep up to this many bytes of decompressed chunks (4 bytes per
        nonzero) for ``get_batch`` and the map-style dataset, least recently
        used out first, so that cells drawn again cost no read and no
        decompression. Default 512 MiB; 0 keeps none. (Tiles' indexes, which
        say where each cell's bytes are, are kept apart, up to 64 MiB.)

    Raises :class:`DatasetNotFoundError` (a ``FileNotFoundError``) when there is
    no dataset, or only an incomplete one, at ``root``; :class:`InvalidArgumentError`
    or :class:`ArgumentTypeError` naming an argument out of its range
    (``threads`` from 1 to 1024, ``cache_bytes`` from 0) or of the wrong type.

    >>> ds = open_dataset("gs://bucket/atlas", obs_columns=["cell_type"])
    """
    keywords("open_dataset", store, StoreArgs.__annotations__)
    root = location("root", root)
    columns = None if obs_columns is None else column_names("obs_columns", obs_columns)
    cache_dir = None if cache_dir is None else location("cache_dir", cache_dir)
    options: dict[str, Any] = dict(
        threads=thread_count("threads", threads),
        **store_options(store),
        cache_bytes=integer("cache_bytes", cache_bytes, 0, MAX_BYTES),
        cache_dir=cache_dir,
    )
    raw = _deltacells.RawDataset(root, **options)
    ds = Dataset(root, options, cache_dir, raw)
    if columns:
        ds.obs.localize(columns)
    return ds


def open_collection(
    roots: Sequence[str] | Mapping[str, str] | str | os.PathLike[str],
    *,
    genes: GeneChoice = "union",
    gene_column: str | None = None,
    weights: Mapping[str, float] | None = None,
    obs_columns: Sequence[str] | None = None,
    cache_dir: str | None = None,
    threads: int | None = None,
    cache_bytes: int = _deltacells.DEFAULT_CACHE_BYTES,
    **store: Unpack[StoreArgs],
) -> Collection:
    """Opens several datasets as one :class:`Collection`.

    Parameters
    ----------
    roots
        The datasets, in the order their cells are numbered: a list of roots
        (local folders or bucket URLs, as :func:`open_dataset` takes them;
        each is also its name), a mapping ``{name: root}``, or the path of a
        collection file written by :meth:`Collection.save` (its roots,
        genes, gene column and weights; each dataset is checked against the
        manifest digest recorded there).
    genes
        The batches' columns: ``"union"`` (every gene of any dataset: the
        first dataset's genes in its column order, then each next dataset's
        new ones in its column order), ``"intersection"`` (the genes all
        share, in the first dataset's column order) or a list of names (a
        model's vocabulary: genes no dataset has are zero columns). The cells
        of the first dataset, and of any stored in its gene order (converted
        with ``--gene-order-from`` it), are then read without a map.
    gene_column
        Match genes by this var column (``"gene_ids"`` for Ensembl IDs, say)
        instead of the gene names.
    weights
        ``{name: weight}`` (names as in ``roots``): each dataset's share of
        an epoch's cells; a dataset left out gets none. Overrides the file's.
    obs_columns
        Obs columns to localize now in every dataset that has them.
    cache_dir, threads, anonymous, endpoint
        As for :func:`open_dataset`; the datasets share the collection's one
        pool of ``threads``, however many there are.
    cache_bytes
        Decompressed chunks kept for cells drawn again, over all the datasets
        (each keeps an equal share): as for :func:`open_dataset`, 512 MiB by
        default, 0 for none.

    Every dataset is opened once here, in parallel (its manifest and gene
    names). Raises :class:`InvalidArgumentError` for an empty list, a root or
    name given twice, or a bad weight; :class:`DatasetNotFoundError` naming a
    dataset that is not there; :class:`DatasetChangedError` for one whose
    manifest is not the one a collection file recorded.

    >>> coll = deltacells.open_collection(["out/pbmc_a", "s3://bucket/pbmc_b"], genes="intersection")
    >>> coll.get_batch(range(coll.n_cells - 5, coll.n_cells))  # the last cells of pbmc_b
    """
    keywords("open_collection", store, StoreArgs.__annotations__)
    source = None
    digests: list[str | None] | None = None
    file_weights = None
    if isinstance(roots, (str, os.PathLike)):
        source = os.fspath(roots)
        if not os.path.isfile(source):
            raise InvalidArgumentError(
                f"roots: {source!r} is not a collection file; give a list of roots (or a mapping of names to "
                "roots), or the path of a file written by Collection.save"
            )
        described = json.loads(_deltacells.collection_file(source))
        pairs = [(d["name"], d["root"]) for d in described["datasets"]]
        digests = [d["manifest_sha256"] for d in described["datasets"]]
        if genes == "union":  # the default: the file's choice
            genes = described["genes"]
        gene_column = gene_column if gene_column is not None else described["gene_column"]
        if described["weights"] is not None:
            file_weights = {name: w for (name, _), w in zip(pairs, described["weights"], strict=True)}
    elif isinstance(roots, Mapping):
        pairs = [(_text("roots: a name", k), _text(f"roots[{k!r}]", v)) for k, v in roots.items()]
    elif isinstance(roots, (Sequence, np.ndarray)) and not isinstance(roots, bytes):
        pairs = [(_text("roots", r), _text("roots", r)) for r in roots]
    else:
        raise ArgumentTypeError(f"roots must be a list of roots, a mapping of names to roots or a collection file, "
                                f"not {type(roots).__name__}")
    if isinstance(genes, str):
        if genes not in ("union", "intersection"):
            raise InvalidArgumentError(
                f"genes must be 'union', 'intersection' or a list of gene names, not {genes!r}"
            )
        choice: str | list[str] = genes
    else:
        choice = _names(genes)
    if gene_column is not None and not isinstance(gene_column, str):
        raise ArgumentTypeError(f"gene_column must be the name of a var column, not {gene_column!r}")
    threads = thread_count("threads", threads)
    columns = None if obs_columns is None else column_names("obs_columns", obs_columns)
    cache_bytes = integer("cache_bytes", cache_bytes, 0, MAX_BYTES)
    cache_dir = None if cache_dir is None else location("cache_dir", cache_dir)
    reaching = store_options(store)
    options: dict[str, Any] = dict(threads=threads, **reaching, cache_bytes=cache_bytes)
    raw = _deltacells.RawCollection(
        [n for n, _ in pairs], [r for _, r in pairs], choice, gene_column, threads, digests=digests,
        cache_bytes=cache_bytes, cache_dir=cache_dir, **reaching,
    )
    collection = Collection(
        raw.state_json(), choice, options, cache_dir, weights if weights is not None else file_weights,
        source, None, raw,
    )
    if columns:
        collection.obs.localize(columns)
    return collection


#: The keyword options of :func:`open_dataset` (all but its root and
#: obs_columns, the store's among them), for the adapters that pass them on.
OPEN_OPTIONS: tuple[str, ...] = tuple(
    name
    for p in inspect.signature(open_dataset).parameters.values() if p.name not in ("root", "obs_columns")
    for name in (StoreArgs.__annotations__ if p.kind is p.VAR_KEYWORD else (p.name,))
)


def _text(what: str, value: Any) -> str:
    if isinstance(value, os.PathLike):
        return os.fspath(value)  # type: ignore[return-value]
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{what}: {value!r} is not a root (a folder or a bucket URL)")
    return value

