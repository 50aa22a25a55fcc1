"""Choosing the cells of an epoch: splits by group (:meth:`Dataset.split`)
and weights that balance the classes of a category column
(``Dataset.batches(balance=...)``); cells by their obs values are chosen in
``_obs`` (:meth:`Obs.where`). The draws themselves are made by the Rust
loader, from the seed and epoch."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._obs import index_array
from ._types import ObsColumns
from .exceptions import InvalidArgumentError, UnknownNameError


def group_labels(obs: ObsColumns, column: str, cells: np.ndarray | None) -> tuple[np.ndarray, int]:
    """For ``cells`` (or every cell), the group of each in ``column`` as an
    int64 code (missing values are a group of their own), and the number of
    groups."""
    data = obs.column_array(column)
    if cells is not None:
        data = data.take(index_array(cells))
    if obs.kind(column) == "category":
        codes = np.asarray(data.to_numpy(), dtype=np.int64)
    else:
        encoded = data.combine_chunks().dictionary_encode() if data.num_chunks else None
        if encoded is None:
            return np.zeros(0, dtype=np.int64), 0
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        codes = np.where(np.isnan(codes), -1, codes) if codes.dtype.kind == "f" else codes
        codes = np.asarray(codes, dtype=np.int64)
    # Missing (-1) becomes a group too; groups are renumbered densely.
    _, dense = np.unique(codes, return_inverse=True)
    return dense.astype(np.int64), int(dense.max()) + 1 if dense.size else 0


def split(
    obs: ObsColumns, by: str, fractions: Sequence[float], seed: int, cells: np.ndarray | None
) -> tuple[np.ndarray, ...]:
    """See :meth:`Dataset.split`."""
    try:
        parts = [float(f) for f in fractions]
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"fractions must be numbers, not {fractions!r}") from None
    if not parts or any(not math.isfinite(f) or f < 0 for f in parts):
        raise InvalidArgumentError(f"fractions must be one or more numbers, none negative, not {fractions!r}")
    if abs(sum(parts) - 1.0) > 1e-6:
        raise InvalidArgumentError(f"fractions must sum to 1, not {sum(parts)!r} ({fractions!r})")
    groups, n_groups = group_labels(obs, by, cells)
    sizes = np.bincount(groups, minlength=n_groups)
    # Largest groups first (ties in an order fixed by the seed), each to the
    # part furthest below its share: every part ends within one group's size
    # of its target.
    rng = np.random.default_rng(seed)
    order = rng.permutation(n_groups)
    order = order[np.argsort(-sizes[order], kind="stable")]
    targets = np.array(parts) * groups.size
    filled = np.zeros(len(parts))
    part_of = np.empty(n_groups, dtype=np.int64)
    for g in order:
        room = np.where(targets > 0, (targets - filled) / np.where(targets > 0, targets, 1), -np.inf)
        p = int(np.argmax(room))
        part_of[g] = p
        filled[p] += sizes[g]
    base = np.arange(obs.n_cells, dtype=np.int64) if cells is None else cells
    assigned = part_of[groups]
    return tuple(np.sort(base[assigned == p]) for p in range(len(parts)))


def balance_weights(
    obs: ObsColumns, column: str, cells: np.ndarray | None, class_weights: Mapping[Any, float] | None
) -> np.ndarray:
    """One weight per cell (of ``cells``, or of the dataset) that makes every
    class of category column ``column`` equally likely, or as likely as
    ``class_weights`` says; cells with a missing value get zero."""
    if obs.kind(column) != "category":
        raise InvalidArgumentError(
            f"balance needs a category column; obs column {column!r} is {obs.kind(column)}"
        )
    categories = obs.categories(column) or []
    codes = np.asarray(obs.take(np.arange(obs.n_cells) if cells is None else cells, [column])[column], dtype=np.int64)
    counts = np.bincount(codes[codes >= 0], minlength=len(categories)).astype(np.float64)
    if class_weights is None:
        per_class = (counts > 0).astype(np.float64)
    else:
        if not isinstance(class_weights, Mapping):
            raise InvalidArgumentError(f"class_weights must be a mapping of class to weight, not {class_weights!r}")
        index = {c: i for i, c in enumerate(categories)}
        per_class = np.zeros(len(categories))
        for label, weight in class_weights.items():
            if label not in index:
                raise UnknownNameError(
                    f"class_weights names {label!r}, which is not a category of obs column {column!r} "
                    f"(its categories are {categories})"
                )
            try:
                w = float(weight)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"class_weights[{label!r}] must be a number, not {weight!r}") from None
            if not math.isfinite(w) or w < 0:
                raise InvalidArgumentError(f"class_weights[{label!r}] must be finite and not negative, not {weight!r}")
            per_class[index[label]] = w
    with np.errstate(divide="ignore", invalid="ignore"):
        each = np.where(counts > 0, per_class / np.where(counts > 0, counts, 1), 0.0)
    out = np.zeros(codes.size)
    present = codes >= 0
    out[present] = each[codes[present]]
    return out
