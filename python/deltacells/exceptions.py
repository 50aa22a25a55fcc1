"""Every exception deltacells raises, for ``except`` clauses and type checks.

Each is a :class:`DeltacellsError` and also the built-in exception Python
code expects for its case (``FileNotFoundError``, ``ValueError``,
``IndexError``, ``KeyError``, ``TypeError``, ``FileExistsError``), so that
code written for those works unchanged. Their messages are the library's:
the file or object and the place in it, with no credential.

>>> import deltacells.exceptions as dx
>>> issubclass(dx.CellIndexError, IndexError)
True

The same classes are names of the ``deltacells`` package too.
"""

from ._errors import (
    ArgumentTypeError,
    CellIndexError,
    CorruptDatasetError,
    DatasetChangedError,
    DatasetExistsError,
    DatasetNotFoundError,
    DeltacellsError,
    InputNotFoundError,
    InvalidArgumentError,
    InvalidInputError,
    UnknownNameError,
)

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
