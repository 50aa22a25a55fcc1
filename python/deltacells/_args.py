"""Checks of the arguments users pass, each raising an error that names the
argument and its value before anything is read or started."""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .exceptions import ArgumentTypeError, InvalidArgumentError

#: The most threads a dataset, a collection or obs.localize starts: more
#: than any machine has cores, few enough that starting them cannot hang.
MAX_THREADS = 1024

#: The largest byte budget (``cache_bytes``): what a 64-bit count holds.
MAX_BYTES = 2**63 - 1


def integer(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int (a Python or NumPy integer, not a float or a
    string), within ``[minimum, maximum]`` where given."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an integer, not {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an integer, not {value!r}") from None
    if minimum is not None and number < minimum:
        raise InvalidArgumentError(f"{name} must be at least {minimum}, not {number}")
    if maximum is not None and number > maximum:
        raise InvalidArgumentError(f"{name} must be at most {maximum}, not {number}")
    return number


def thread_count(name: str, value: Any) -> int | None:
    """``value`` as a number of threads: None (all cores), or 1 to
    :data:`MAX_THREADS`."""
    return None if value is None else integer(name, value, 1, MAX_THREADS)


def location(name: str, value: Any) -> str:
    """``value`` as a path or URL string (a ``str`` or an ``os.PathLike``);
    no path or URL holds a NUL character."""
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if isinstance(text, str):
            if "\0" in text:
                raise InvalidArgumentError(f"{name}={text!r}: a path or URL cannot hold a NUL character")
            return text
    raise ArgumentTypeError(f"{name} must be a path or a URL (a string), not {value!r}")


def folder(name: str, value: Any) -> str | None:
    """``value`` as an optional local folder, which must exist."""
    if value is None:
        return None
    path = location(name, value)
    if not os.path.isdir(path):
        raise InvalidArgumentError(f"{name}={path!r}: not a folder (it must exist)")
    return path


def optional_name(name: str, value: Any) -> str | None:
    """``value`` as an optional name as a file spells it: None, or a string
    that is not blank."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a string, not {value!r}")
    if not value.strip():
        raise InvalidArgumentError(f"{name}: an empty name; give the name as the file spells it")
    return value


def choice(name: str, value: Any, choices: Sequence[str], optional: bool = False) -> Any:
    """``value`` as one of the strings ``choices`` (or None, when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(map(repr, choices))}, not {value!r}")
    return value


def column_names(name: str, value: Any) -> list[str]:
    """``value`` as a list of obs column names (strings)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ArgumentTypeError(f"{name} must be a list of column names, not {value!r}")
    names = list(value)
    for column in names:
        if not isinstance(column, str):
            raise ArgumentTypeError(f"{name}: column names are strings, not {column!r}")
    return names


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool: True, False (or a NumPy bool)."""
    if value is True or value is False:
        return value
    try:
        import numpy as np

        if isinstance(value, np.bool_):
            return bool(value)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    raise InvalidArgumentError(f"{name} must be True or False, not {value!r}")


def positive_number(name: str, value: Any) -> float:
    """``value`` as a finite float above zero (a number, not a string)."""
    if isinstance(value, (str, bytes)):
        raise InvalidArgumentError(f"{name} must be a number, not {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{name} must be a number, not {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(number) or number <= 0:
        raise InvalidArgumentError(f"{name} must be a finite number above zero, not {value!r}")
    return number


def keywords(function: str, given: Mapping[str, Any], accepted: Collection[str]) -> None:
    """Refuses a keyword that ``function`` does not take, where its
    ``**keywords`` are a TypedDict's (``accepted``: its keys), as Python
    refuses one a signature does not name: with a TypeError saying so."""
    for name in given:
        if name not in accepted:
            raise ArgumentTypeError(f"{function}() got an unexpected keyword argument {name!r}")
