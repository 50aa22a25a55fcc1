"""Every public function and method, fuzzed with the arguments a script can
get wrong: cell selections of every NumPy integer dtype, slices, ranges,
negative and huge integers, values that are not cells at all; loader and
open options at and beyond their bounds, of the wrong type, NaN; obs column
names that do not exist or are not strings. Each either works or raises one
of the package's errors that is also the builtin Python users catch, with a
message naming the argument, and the dataset keeps working afterwards;
whatever selection is accepted gives the rows of the same cells as an int64
array. Runs on the bundled PBMC cells (tests/samples.py), in any clone."""

from __future__ import annotations

import math
import operator
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import deltacells
from samples import make_samples_dataset

#: Examples per property: enough to reach every branch, few enough for CI.
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

BUILTINS = (ValueError, TypeError, IndexError, KeyError)

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("arguments")
    return make_samples_dataset(folder, binary), folder / "cache"


@pytest.fixture(scope="module", params=["dataset", "collection"])
def ds(request, samples) -> deltacells.Dataset | deltacells.Collection:
    """The samples dataset, and a collection of it and a copy: every property
    holds for both."""
    root, cache = samples
    columns = ["sample", "cls", "n_counts"]
    if request.param == "dataset":
        return deltacells.open_dataset(str(root), cache_dir=str(cache), obs_columns=columns)
    copy = root.parent / "samples_copy"
    if not copy.exists():
        shutil.copytree(root, copy)
    return deltacells.open_collection({"a": str(root), "b": str(copy)}, cache_dir=str(cache), obs_columns=columns)


def refused(call: Callable[[], Any], *names: str) -> str:
    """Runs ``call``, which must raise one of the package's errors that is
    also a builtin one, with one of ``names`` in its message."""
    with pytest.raises(deltacells.DeltacellsError) as raised:
        call()
    assert isinstance(raised.value, BUILTINS), type(raised.value).__mro__
    message = str(raised.value)
    assert any(name in message for name in names), (names, message)
    return message


def still_works(ds: deltacells.Dataset | deltacells.Collection) -> None:
    assert ds.get_batch([0, ds.n_cells - 1]).to_scipy().shape == (2, ds.n_genes)


@st.composite
def selections(draw: st.DrawFn, n: int) -> Any:
    """A cell selection of any form, valid or not."""
    kind = draw(st.sampled_from(["array", "list", "range", "slice", "edge"]))
    near = st.integers(-3, n + 3)
    if kind == "array":
        dtype = draw(st.sampled_from(INT_DTYPES))
        info = np.iinfo(dtype)
        values = st.one_of(st.integers(max(info.min, -3), min(info.max, n + 3)), st.integers(info.min, info.max))
        return np.array(draw(st.lists(values, max_size=30)), dtype=dtype)
    if kind == "list":
        return draw(st.lists(st.one_of(near, st.integers(0, n - 1)), max_size=30))
    if kind == "range":
        step = draw(st.integers(-40, 40).filter(bool))
        return range(draw(near), draw(near), step)
    if kind == "slice":
        bound = st.one_of(st.none(), st.integers(-n - 5, n + 5))
        return slice(draw(bound), draw(bound), draw(st.one_of(st.none(), st.integers(-40, 40).filter(bool))))
    return draw(st.sampled_from([[2**63 - 1], [-(2**63)], np.array([2**64 - 1], dtype=np.uint64), [2**70], []]))


def as_int64(selection: Any, n: int) -> np.ndarray | None:
    """The cells ``selection`` names, as int64; None when one is not a cell
    of the dataset (or not an int64 at all)."""
    if isinstance(selection, slice):
        return np.arange(n, dtype=np.int64)[selection]
    values = [int(v) for v in (selection if not isinstance(selection, np.ndarray) else selection.tolist())]
    if any(v < 0 or v >= n for v in values):
        return None
    return np.array(values, dtype=np.int64)


def same_rows(a: deltacells.Batch, b: deltacells.Batch) -> None:
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.data, b.data)


@FUZZ
@given(data=st.data())
def test_any_cell_selection_gives_the_rows_of_its_int64_array_or_is_refused(ds, data) -> None:
    selection = data.draw(selections(ds.n_cells))
    cells = as_int64(selection, ds.n_cells)
    if cells is None:
        refused(lambda: ds.get_batch(selection), "cell")
        refused(lambda: ds.cell_indices(selection), "cell")
        refused(lambda: ds.obs.take(selection, ["sample"]), "cell")
        refused(lambda: ds.batches(64, cells=selection), "cell")
    else:
        same_rows(ds.get_batch(selection), ds.get_batch(cells))
        np.testing.assert_array_equal(ds.cell_indices(selection), cells)
        taken = ds.obs.take(selection, ["sample"])["sample"]
        np.testing.assert_array_equal(taken, ds.obs.take(cells, ["sample"])["sample"])
        dense = ds.get_batch(selection, dense=True)
        assert dense.shape == (len(cells), ds.n_genes)
        np.testing.assert_array_equal(dense, ds.get_batch(cells).to_dense(np.int32))
    still_works(ds)


not_cells = st.one_of(
    st.lists(st.floats(allow_nan=True), min_size=1, max_size=5).map(np.array),
    st.lists(st.booleans(), min_size=1, max_size=5),
    st.text(max_size=5),
    st.lists(st.one_of(st.integers(0, 5), st.text(max_size=2)), min_size=2, max_size=5).filter(
        lambda v: any(isinstance(x, str) for x in v)
    ),
    st.integers(-5, 5).map(lambda k: np.zeros((2, 2), dtype=np.int64) + k),
    st.sampled_from([None, {"a": 1}, 3.5, object(), [[1, 2], [3]], np.array([1 + 2j])]),
)


@FUZZ
@given(bad=not_cells)
def test_what_is_not_a_cell_selection_is_refused_by_name(ds, bad) -> None:
    refused(lambda: ds.get_batch(bad), "cell")
    refused(lambda: ds.obs.take(bad, ["sample"]), "cell")
    still_works(ds)


#: The loader's integer options.
INT_OPTIONS = [
    "batch_size", "seed", "epoch", "rank", "world_size", "worker", "num_workers", "window_tiles", "mix_chunks",
    "prefetch", "top_k",
]

any_value = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
    st.sampled_from([np.int64(7), np.uint64(2**64 - 1), np.float32(2.0), [1], object()]),
)


def first_batch(loader: deltacells.Loader) -> None:
    for _ in loader:
        break


#: A valid value of every keyword of ``BatchArgs``, for the test below.
EVERY_BATCH_KEYWORD: dict[str, Any] = {
    "shuffle": False, "seed": 3, "drop_last": False, "window_tiles": 2, "mix_chunks": 2, "prefetch": 2,
    "epoch": 1, "rank": 0, "world_size": 1, "worker": 0, "num_workers": 1,
    "obs_columns": ["sample"], "cells": range(20), "weights": None, "num_samples": None, "balance": None,
    "class_weights": None,
    "normalize": None, "normalize_over": "stored", "log1p": False, "dense": False, "top_k": None, "dtype": None,
    "sorted_columns": True,
}


def test_the_batch_keywords_are_one_definition_with_the_loaders_defaults(ds) -> None:
    """``Dataset.batches`` and ``Collection.batches`` take the keywords of
    ``BatchArgs`` (defined once), each not given at the Rust loader's
    default (``deltacells.LOADER_DEFAULTS``), and refuse any other as Python
    refuses an unknown keyword, naming it."""
    from deltacells._types import BatchArgs

    assert set(EVERY_BATCH_KEYWORD) == set(BatchArgs.__annotations__)  # a new keyword joins this test
    assert ds.batches(8).options == {**deltacells.LOADER_DEFAULTS, "batch_size": 8}
    loader = ds.batches(8, **EVERY_BATCH_KEYWORD)
    assert loader.options == {**deltacells.LOADER_DEFAULTS, "batch_size": 8,
                              **{k: EVERY_BATCH_KEYWORD[k] for k in deltacells.LOADER_DEFAULTS if k != "batch_size"}}
    batches = list(loader)
    assert np.concatenate([b.cells for b in batches]).tolist() == list(range(20))  # shuffle=False, those cells
    assert all(set(b.obs) == {"sample"} for b in batches)
    with pytest.raises(deltacells.ArgumentTypeError, match="batches\\(\\) got an unexpected keyword argument 'shufle'"):
        ds.batches(8, shufle=True)
    with pytest.raises(TypeError):
        deltacells.LOADER_DEFAULTS["seed"] = 1  # type: ignore[index]
    still_works(ds)


@FUZZ
@given(option=st.sampled_from(INT_OPTIONS), value=any_value)
def test_loader_options_at_and_beyond_their_bounds_work_or_are_refused_by_name(ds, option, value) -> None:
    try:
        first_batch(ds.batches(**{option: value}))
    except deltacells.DeltacellsError as e:
        assert isinstance(e, BUILTINS), type(e).__mro__
        assert option in str(e), (option, value, str(e))
    else:
        # accepted: an integer (not a bool, a float or a string), or None
        # where None means the default
        assert value is None or (not isinstance(value, bool) and operator.index(value) is not None), value
    still_works(ds)


@FUZZ
@given(
    option=st.sampled_from(["normalize", "normalize_over", "log1p", "dense", "dtype", "sorted_columns", "genes"]),
    value=any_value,
)
def test_batch_forms_work_or_are_refused_by_name(ds, option, value) -> None:
    assume(option != "genes" or isinstance(ds, deltacells.Dataset))  # (a collection's genes are chosen when opened)
    try:
        ds.get_batch(range(8), **{option: value})
        first_batch(ds.batches(16, **{option: value}))
    except deltacells.DeltacellsError as e:
        assert isinstance(e, BUILTINS), type(e).__mro__
        assert option in str(e) or "gene" in str(e), (option, value, str(e))
    else:
        if option == "normalize" and value is not None:
            assert math.isfinite(float(value)) and float(value) > 0
    still_works(ds)


@FUZZ
@given(names=st.lists(st.one_of(st.sampled_from(["sample", "cls", "n_counts"]), st.text(max_size=4), st.integers()),
                      max_size=3))
def test_obs_column_names_that_are_not_columns_are_refused_by_name(ds, names) -> None:
    known = {"sample", "cls", "n_counts", "obs_names"}
    if all(isinstance(n, str) and n in known for n in names):
        ds.obs.take(range(4), names)
        first_batch(ds.batches(16, obs_columns=names))
    else:
        bad = [n for n in names if not (isinstance(n, str) and n in known)]
        named = [repr(n) for n in bad]
        refused(lambda: ds.obs.take(range(4), names), *named)
        refused(lambda: ds.batches(16, obs_columns=names), *named)
        refused(lambda: ds.obs.where(bad[0], "x"), named[0])
    still_works(ds)


@FUZZ
@given(option=st.sampled_from(["threads", "cache_bytes", "anonymous", "endpoint", "obs_columns", "root"]),
       value=any_value)
@example(option="root", value="\x00")  # (a NUL reached the file system's call once)
def test_open_options_work_or_are_refused_by_name(samples, option, value) -> None:
    root, cache = samples
    arguments: dict[str, Any] = {"root": str(root), "cache_dir": str(cache), option: value}
    try:
        opened = deltacells.open_dataset(**arguments)
    except deltacells.DeltacellsError as e:
        assert isinstance(e, BUILTINS + (FileNotFoundError,)), type(e).__mro__
        assert option in str(e) or (option == "root" and "dataset" in str(e)), (option, value, str(e))
    else:
        still_works(opened)


@FUZZ
@given(option=st.sampled_from(["threads", "obs_columns", "genes", "gene_column", "weights", "roots"]),
       value=st.one_of(any_value, st.dictionaries(st.sampled_from(["a", "b", "c"]), any_value, max_size=3)))
def test_collection_options_work_or_are_refused_by_name(samples, option, value) -> None:
    root, cache = samples
    copy = root.parent / "samples_copy"
    if not copy.exists():
        shutil.copytree(root, copy)
    arguments: dict[str, Any] = {"roots": {"a": str(root), "b": str(copy)}, "cache_dir": str(cache), option: value}
    try:
        opened = deltacells.open_collection(**arguments)
    except deltacells.DeltacellsError as e:
        assert isinstance(e, BUILTINS + (FileNotFoundError,)), type(e).__mro__
        also = {"roots": ("root", "dataset"), "gene_column": ("column",), "obs_columns": ("column",),
                "genes": ("gene",)}
        named = also.get(option, ())
        assert option in str(e) or any(n in str(e) for n in named), (option, value, str(e))
    else:
        still_works(opened)


def test_a_dense_batch_beyond_its_budget_is_refused_before_it_is_reserved(ds) -> None:
    """400,000 cells (the bundled ones, repeated) x their genes dense would
    take more than the 16 GiB a dense batch may take: refused, naming the
    size, instead of an allocation that fails and aborts the process."""
    cells = np.zeros(400_000, dtype=np.int64)
    with pytest.raises(deltacells.InvalidArgumentError, match=r"dense: a batch of 400000 cells x \d+ genes takes"):
        ds.get_batch(cells, dense=True)
    still_works(ds)
    assert ds.get_batch(cells[:1000], dense=True).data.shape[0] == 1000
