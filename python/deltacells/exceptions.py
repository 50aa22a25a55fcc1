"""Every exception deltacells raises, for ``except`` clauses and type checks.

Each is a :class:`DeltacellsError`, and also the built-in exception Python
code expects for its case (``FileNotFoundError``, ``ValueError``,
``IndexError``, ``KeyError``, ``TypeError``, ``FileExistsError``), so that
code written for those works unchanged. Their messages are the library's:
the file or object and the place in it, never a credential. The classes are
names of the ``deltacells`` package too.

>>> import deltacells.exceptions as dx
>>> issubclass(dx.CellIndexError, IndexError)
True
"""

from __future__ import annotations

from typing import Any

from ._deltacells import redact, register_exceptions


class DeltacellsError(Exception):
    """Base class of every error deltacells raises. Its message never holds
    a credential: the userinfo and signed query parameters of any URL in it
    are masked (by the library's one redaction, :func:`redact`)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class DatasetNotFoundError(DeltacellsError, FileNotFoundError):
    """No dataset at the location, or an incomplete one (no manifest.json:
    a conversion that did not finish)."""


class CorruptDatasetError(DeltacellsError, ValueError):
    """A file of the dataset breaks a rule of the format; the message names
    the file (a tile, for example) and the rule."""


class CellIndexError(DeltacellsError, IndexError):
    """A cell (or tile) that the dataset does not have."""


class InvalidArgumentError(DeltacellsError, ValueError):
    """An argument out of its range or of the wrong form (a negative weight,
    fractions that do not sum to 1...); the message names the argument and
    its value."""


class ArgumentTypeError(DeltacellsError, TypeError):
    """An argument of the wrong type (cells that are not integers, say); the
    message names the argument."""


class UnknownNameError(DeltacellsError, KeyError):
    """A name the dataset does not have: an obs column, or a class of a
    category column. The message names it and what there is."""

    def __str__(self) -> str:
        # KeyError's str() is the repr of its argument; ours reads as a sentence.
        return str(self.args[0]) if self.args else ""


class DatasetChangedError(DeltacellsError):
    """A dataset of a collection whose manifest is not the one the collection
    recorded: it was appended to or converted again since. The message names
    it; make the collection again to read it as it is now."""




class InputNotFoundError(DeltacellsError, FileNotFoundError):
    """An input of a conversion or an append that does not exist."""


class InvalidInputError(DeltacellsError, ValueError):
    """An input of a conversion that is not what it must be: a matrix that is
    not counts (the message names the cell and the gene), genes or obs columns
    that do not fit the other inputs' or the dataset's."""


class DatasetExistsError(DeltacellsError, FileExistsError):
    """The output of a conversion already holds a dataset (``overwrite=True``
    replaces it)."""


__all__ = [
    "DeltacellsError",
    "DatasetNotFoundError",
    "CorruptDatasetError",
    "CellIndexError",
    "InvalidArgumentError",
    "ArgumentTypeError",
    "UnknownNameError",
    "DatasetChangedError",
    "InputNotFoundError",
    "InvalidInputError",
    "DatasetExistsError",
]

# The Rust extension raises each kind of failure as its class here, taken
# once now rather than looked up when it is raised.
register_exceptions({name: globals()[name] for name in __all__})
