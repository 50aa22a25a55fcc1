"""Batches in a model's gene vocabulary (``genes=`` of the read methods)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Union

import numpy as np

from . import _deltacells
from .exceptions import ArgumentTypeError, InvalidArgumentError, UnknownNameError

if TYPE_CHECKING:
    import pandas as pd

#: What ``genes=`` accepts: gene names (a list, a tuple, an array or a pandas
#: Index) in the order the batches' columns should have, ``"source"`` for the
#: input files' order, or a :class:`Vocabulary` built before.
Genes = Union[Sequence[str], np.ndarray, str, "Vocabulary"]


class GeneSource(Protocol):
    """What a vocabulary is built over and checked against: a dataset
    (:class:`deltacells.Dataset`), as this module reads it."""

    @property
    def root(self) -> str: ...

    @property
    def n_genes(self) -> int: ...

    @property
    def var_names(self) -> list[str] | None: ...

    @property
    def var(self) -> pd.DataFrame | None: ...

    @property
    def gene_order(self) -> np.ndarray | None: ...

    def vocabulary(self, genes: Sequence[str] | np.ndarray | str, *, column: str | None = None) -> Vocabulary: ...


class VocabularyWarning(UserWarning):
    """A vocabulary that shares no gene with the dataset (every batch would be empty)."""


@dataclass(frozen=True)
class VocabularyReport:
    """How a gene vocabulary fits a dataset (:meth:`Dataset.vocabulary_report`).

    Attributes
    ----------
    genes
        Genes in the vocabulary (columns of every batch).
    present
        Of those, genes the dataset stores.
    absent
        Genes the dataset lacks: columns that are zero in every batch.
    stored_genes
        Genes the dataset stores.
    left_out
        Stored genes the vocabulary does not have: their counts are not in any batch.
    nonzeros
        The dataset's nonzero counts, over every cell and gene.
    nonzeros_left_out
        Of those, the ones of the genes left out.
    """

    genes: int
    present: int
    absent: int
    stored_genes: int
    left_out: int
    nonzeros: int
    nonzeros_left_out: int

    @property
    def fraction_left_out(self) -> float:
        """The share of the dataset's nonzeros no batch holds."""
        return self.nonzeros_left_out / self.nonzeros if self.nonzeros else 0.0


class Vocabulary:
    """A gene vocabulary mapped onto one dataset's stored columns: built once
    (by :meth:`Dataset.vocabulary`) and passed as ``genes=`` to every read, so
    that the names are matched once. Each cell is written in its columns by
    the Rust reader.

    Attributes
    ----------
    names
        The genes, in column order (for ``"source"``, the dataset's genes in
        the input files' order).
    column
        The var column matched, or None for the gene names.
    """

    def __init__(self, dataset: GeneSource, genes: Sequence[str] | np.ndarray | str, column: str | None = None) -> None:
        self._dataset = dataset
        self._root = dataset.root
        self._n_stored = dataset.n_genes
        self.column = column
        self._given: list[str] | str = genes if isinstance(genes, str) else []
        if isinstance(genes, str):
            if genes != "source":
                raise InvalidArgumentError(
                    f"genes: {genes!r} is not a list of gene names; give a list, or 'source' for the input files' order"
                )
            if column is not None:
                raise InvalidArgumentError("gene_column goes with a list of gene names, not with genes='source'")
            self.names = _source_names(dataset)
            order = dataset.gene_order
            if order is None:  # stored in the input files' order already
                order = np.arange(dataset.n_genes, dtype=np.int32)
            self.native = _deltacells.RawGeneMap.source_order(np.ascontiguousarray(order, dtype=np.int32))
            return
        self.names = _names(genes)
        self._given = self.names
        stored = _stored_keys(dataset, column)
        self.native = _deltacells.RawGeneMap.by_name(stored, self.names)
        if self.native.present == 0:
            warnings.warn(
                f"genes: none of the {len(self.names):,} genes is among the {dataset.n_genes:,} genes of "
                f"{dataset.root} (matched against {column or 'var_names'}); every batch will be empty",
                VocabularyWarning,
                stacklevel=3,
            )

    @property
    def n_genes(self) -> int:
        """Columns of every batch read in this vocabulary."""
        return self.native.n_output

    @property
    def present(self) -> int:
        """Genes of the vocabulary the dataset stores."""
        return self.native.present

    def check(self, dataset: GeneSource) -> None:
        """Raises :class:`InvalidArgumentError` unless this vocabulary was built for ``dataset``."""
        if dataset.root != self._root or dataset.n_genes != self._n_stored:
            raise InvalidArgumentError(
                f"genes: the vocabulary was built for {self._root}, not {dataset.root}; build one per dataset "
                "with dataset.vocabulary(genes)"
            )

    def __len__(self) -> int:
        return self.n_genes

    def __reduce__(self) -> tuple[object, ...]:
        # Built again from its dataset (which pickles to its root) in the other process.
        return (Vocabulary, (self._dataset, self._given, self.column))

    def __repr__(self) -> str:
        return (
            f"<deltacells.Vocabulary {self.n_genes:,} genes, {self.present:,} of them in {self._root!r}"
            f"{f' (by {self.column})' if self.column else ''}>"
        )


def _names(genes: object) -> list[str]:
    if isinstance(genes, (bytes, dict)) or not hasattr(genes, "__iter__"):
        raise ArgumentTypeError(f"genes must be a list of gene names or 'source', not {type(genes).__name__}")
    names = list(genes)  # type: ignore[call-overload]
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise ArgumentTypeError(f"genes: entry {i} is {name!r} ({type(name).__name__}), not a gene name (str)")
    return names


def _stored_keys(dataset: GeneSource, column: str | None) -> list[str]:
    """The dataset's genes in stored column order, as the vocabulary is matched: var names, or ``column`` of var."""
    if column is None:
        names = dataset.var_names
        if names is None:
            var = dataset.var
            if var is None:
                raise InvalidArgumentError(
                    f"genes: {dataset.root} has no gene names (no var_names.txt or var.parquet) to match against"
                )
            return [str(v) for v in var.index]
        return names
    if not isinstance(column, str):
        raise ArgumentTypeError(f"gene_column must be the name of a var column, not {column!r}")
    var = dataset.var
    if var is None:
        raise UnknownNameError(f"gene_column {column!r}: {dataset.root} has no var table (var.parquet)")
    if column == var.index.name:
        return [str(v) for v in var.index]
    if column not in var.columns:
        have = ", ".join(repr(c) for c in [var.index.name, *var.columns] if c is not None)
        raise UnknownNameError(f"gene_column {column!r}: var has no such column; it has {have}")
    return [str(v) for v in var[column]]


def _source_names(dataset: GeneSource) -> list[str]:
    """The dataset's gene names in the input files' order (their indices as text without names)."""
    try:
        stored = _stored_keys(dataset, None)
    except InvalidArgumentError:
        stored = [str(g) for g in range(dataset.n_genes)]
    order = dataset.gene_order
    if order is None:
        return list(stored)
    names = [""] * len(stored)
    for j, g in enumerate(order):
        names[int(g)] = stored[j]
    return names


def resolve(dataset: GeneSource, genes: Genes | None, column: str | None) -> Vocabulary | None:
    """``genes=`` as a :class:`Vocabulary` of ``dataset`` (None for the stored columns)."""
    if genes is None:
        if column is not None:
            raise InvalidArgumentError("gene_column goes with genes= (the names it matches)")
        return None
    if isinstance(genes, Vocabulary):
        if column is not None and column != genes.column:
            raise InvalidArgumentError("gene_column: the vocabulary given was built with another column")
        genes.check(dataset)
        return genes
    return dataset.vocabulary(genes, column=column)
