"""deltacells.exceptions: every exception class of the package, in its
``__all__``; failures of the Rust library raised as those classes (taken
once, when the package is imported), each also the built-in its case
expects; a bad registration refused."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import deltacells
import deltacells.exceptions as dx
from deltacells import _deltacells


def test_the_public_module_lists_every_exception_of_the_package() -> None:
    defined = {name for name, value in inspect.getmembers(dx, inspect.isclass)
               if issubclass(value, deltacells.DeltacellsError)}
    assert set(dx.__all__) == defined and len(defined) == 11
    for name in dx.__all__:
        assert getattr(dx, name) is getattr(deltacells, name)


def test_library_failures_are_raised_as_the_registered_classes(tmp_path: Path) -> None:
    with pytest.raises(dx.DatasetNotFoundError, match="no-such") as missing:
        deltacells.open_dataset(str(tmp_path / "no-such"))
    assert isinstance(missing.value, FileNotFoundError)
    with pytest.raises(dx.InputNotFoundError) as no_input:
        deltacells.convert([str(tmp_path / "absent.h5ad")], str(tmp_path / "out"))
    assert isinstance(no_input.value, FileNotFoundError)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "manifest.json").write_text("{not json")
    with pytest.raises(dx.CorruptDatasetError, match="manifest.json") as corrupt:
        deltacells.open_dataset(str(tmp_path / "ds")).get_batch([0])
    assert isinstance(corrupt.value, ValueError)


def test_a_registration_without_every_class_is_refused() -> None:
    classes = {name: getattr(dx, name) for name in dx.__all__}
    del classes["CellIndexError"]
    with pytest.raises(TypeError, match="no CellIndexError"):
        _deltacells.register_exceptions(classes)
    with pytest.raises(TypeError, match="DeltacellsError is not an exception"):
        _deltacells.register_exceptions({**classes, "CellIndexError": dx.CellIndexError, "DeltacellsError": int})
