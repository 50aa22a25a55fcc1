"""Options and forms: the loader's and the conversion's defaults (the Rust
library's own, ``LoaderOptions::default()`` and ``ConvertOptions::default()``,
exported by the binding) and
the checks of the loader's options, of a batch's form and of how a store is
reached, each naming the argument it refuses. Their types are in ``_types``, beside the binding's
other argument types."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _deltacells
from ._args import flag, integer, keywords, location, positive_number
from ._types import (
    BatchArgs,
    ConvertDefaults,
    Form,
    FormArgs,
    LoaderOptions,
    OrderArgs,
    SamplingArgs,
    ShareArgs,
    StoreArgs,
)
from .exceptions import InvalidArgumentError

#: The loader's defaults, from the Rust loader: the signatures of
#: :meth:`Dataset.batches` and :class:`deltacells.torch.CellDataset` take
#: theirs from here.
DEFAULTS: LoaderOptions = _deltacells.loader_defaults()

#: The conversion's defaults, from the Rust library: the signatures of
#: :func:`deltacells.convert`, :func:`deltacells.write_anndata` and
#: :func:`deltacells.compact` take theirs from here.
CONVERT_DEFAULTS: ConvertDefaults = _deltacells.convert_defaults()

#: Largest batch_size and prefetch accepted (the loader's queue is
#: reserved at its size; a batch never holds more cells than its share).
MAX_BATCH_SIZE = 1 << 31
MAX_PREFETCH = 1024
MAX_U64 = (1 << 64) - 1


def loader_options(
    *, batch_size: Any, shuffle: Any, seed: Any, epoch: Any, rank: Any, world_size: Any, worker: Any,
    num_workers: Any, drop_last: Any, window_tiles: Any, mix_chunks: Any, prefetch: Any,
) -> LoaderOptions:
    """The loader's options checked (each named in the error that refuses
    it), as the Rust loader takes them."""
    world = integer("world_size", world_size, 1, 1 << 32)
    workers = integer("num_workers", num_workers, 1, 1 << 32)
    return LoaderOptions(
        batch_size=integer("batch_size", batch_size, 1, MAX_BATCH_SIZE),
        shuffle=flag("shuffle", shuffle),
        seed=integer("seed", seed, 0, MAX_U64),
        epoch=integer("epoch", epoch, 0, MAX_U64),
        rank=integer("rank", rank, 0, world - 1),
        world_size=world,
        worker=integer("worker", worker, 0, workers - 1),
        num_workers=workers,
        drop_last=flag("drop_last", drop_last),
        window_tiles=integer("window_tiles", window_tiles, 1, 1 << 32),
        mix_chunks=integer("mix_chunks", mix_chunks, 1, 1 << 32),
        prefetch=integer("prefetch", prefetch, 1, MAX_PREFETCH),
    )


def batch_options(function: str, batch_size: Any, args: BatchArgs) -> tuple[LoaderOptions, SamplingArgs, FormArgs]:
    """The keywords of an epoch of batches (``function``'s ``**options``),
    split into the loader's options (checked, every one not given the Rust
    loader's default), the cells and obs the epoch reads, and the batches'
    form (checked by :func:`form_from`, which needs the genes). A keyword
    :class:`BatchArgs` does not have is refused as Python refuses one."""
    keywords(function, args, BatchArgs.__annotations__)
    given = {k: v for k, v in args.items() if k in OrderArgs.__annotations__ or k in ShareArgs.__annotations__}
    loader = loader_options(**{**DEFAULTS, **given, "batch_size": batch_size})
    sampling = SamplingArgs(**{k: v for k, v in args.items() if k in SamplingArgs.__annotations__})  # type: ignore[typeddict-item]
    form = FormArgs(**{k: v for k, v in args.items() if k in FormArgs.__annotations__})  # type: ignore[typeddict-item]
    return loader, sampling, form


def store_options(args: StoreArgs) -> StoreArgs:
    """How a store is reached, checked (each named in the error that refuses
    it), every key given: its default where ``args`` has none."""
    endpoint = args.get("endpoint")
    return StoreArgs(
        anonymous=flag("anonymous", args.get("anonymous", False)),
        endpoint=None if endpoint is None else location("endpoint", endpoint),
    )


def form_from(args: FormArgs, n_genes: int) -> Form:
    """:class:`FormArgs` checked (an unknown keyword is an error naming it), as the Rust reader takes them."""
    unknown = set(args) - set(FormArgs.__annotations__)
    if unknown:
        raise InvalidArgumentError(f"unknown keyword {sorted(unknown)[0]!r}: a batch's form takes "
                                   f"{', '.join(FormArgs.__annotations__)}")
    return form_options(
        args.get("normalize"), args.get("normalize_over", "stored"), args.get("log1p", False),
        args.get("dense", False), args.get("top_k"), n_genes, args.get("dtype"), args.get("sorted_columns", True),
    )


def form_options(
    normalize: float | None,
    normalize_over: str,
    log1p: bool,
    dense: bool,
    top_k: int | None,
    n_genes: int,
    dtype: object = None,
    sorted_columns: bool = True,
) -> Form:
    """The form arguments of the read methods, checked, as the Rust reader takes them."""
    if normalize_over not in ("stored", "output"):
        raise InvalidArgumentError(
            f"normalize_over must be 'stored' (every gene the dataset stores for the cell) or 'output' "
            f"(the genes of the batch), not {normalize_over!r}"
        )
    form: Form = {
        "normalize": None if normalize is None else positive_number("normalize", normalize),
        "normalize_over": normalize_over,
        "log1p": flag("log1p", log1p),
        "dense": flag("dense", dense),
        "top_k": None if top_k is None else integer("top_k", top_k, 1, n_genes),
        "float32": False,
        "sorted_columns": flag("sorted_columns", sorted_columns),
    }
    if dtype is not None:
        try:
            kind = np.dtype(dtype)  # type: ignore[call-overload]
        except Exception:  # TypeError, and SyntaxError or ValueError for some strings ("01", "i4,,")
            raise InvalidArgumentError(f"dtype must be int32 or float32, not {dtype!r}") from None
        transformed = form["normalize"] is not None or form["log1p"]
        if kind == np.float32:
            form["float32"] = True
        elif kind == np.int32:
            if transformed:
                raise InvalidArgumentError("dtype int32: normalize and log1p give float32 values, not counts")
        else:
            raise InvalidArgumentError(f"dtype must be int32 (counts) or float32, not {kind}")
    return form
