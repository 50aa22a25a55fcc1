"""Mixing, sampling and choosing cells, on a dataset converted from one input
per sample (8 samples of the bundled real PBMC cells, each filling one tile):
batches as mixed as random ones at the defaults, class-balanced and weighted
epochs, obs.where, split by group, and every bad argument refused by name
before anything starts."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deltacells
from samples import CLASS_PARTS, SAMPLES, make_samples_dataset, mixing


@pytest.fixture(scope="module")
def sds(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> deltacells.Dataset:
    folder = tmp_path_factory.mktemp("samples")
    root = make_samples_dataset(folder, binary)
    return deltacells.open_dataset(str(root), cache_dir=str(folder / "cache"), obs_columns=["sample", "donor", "cls"])


def codes(sds: deltacells.Dataset, column: str) -> np.ndarray:
    return np.asarray(sds.obs.take(range(sds.n_cells), [column])[column], dtype=np.int64)


def epoch_codes(loader: deltacells.Loader, column: str) -> list[np.ndarray]:
    return [np.asarray(b.obs[column], dtype=np.int64) for b in loader]


def test_the_dataset_holds_one_sample_per_tile(sds) -> None:
    assert sds.n_tiles == SAMPLES and sds.n_cells == 1000 * SAMPLES
    tiles = np.repeat(np.arange(SAMPLES), 1000)
    np.testing.assert_array_equal(codes(sds, "sample"), tiles)


def test_batches_of_sample_ordered_inputs_mix_like_random_ones(sds) -> None:
    everything = codes(sds, "sample")
    mixed = [
        mixing(epoch_codes(sds.batches(256, epoch=e, obs_columns=["sample"]), "sample"), everything) for e in range(2)
    ]
    assert min(mixed) >= 0.85, f"entropy of the samples per batch, against random batches: {mixed}"
    # What the defaults are measured against: one tile and one chunk at a time,
    # and dataset order, give batches of one sample or two.
    narrow = mixing(epoch_codes(sds.batches(256, window_tiles=1, mix_chunks=1, obs_columns=["sample"]), "sample"),
                    everything)
    ordered = mixing(epoch_codes(sds.batches(256, shuffle=False, obs_columns=["sample"]), "sample"), everything)
    assert narrow < 0.3 and ordered < 0.3, (narrow, ordered)


def test_balance_gives_every_class_the_same_share(sds) -> None:
    everything = codes(sds, "cls")
    sizes = np.bincount(everything)
    assert sizes.max() >= 60 * sizes.min(), sizes
    for epoch in range(2):
        drawn = np.concatenate(epoch_codes(sds.batches(500, balance="cls", epoch=epoch, obs_columns=["cls"]), "cls"))
        assert drawn.size == sds.n_cells  # num_samples defaults to the cells
        shares = np.bincount(drawn, minlength=len(CLASS_PARTS)) / drawn.size
        assert np.all(np.abs(shares - 0.25) <= 0.1 * 0.25), shares
    weighted = np.concatenate(epoch_codes(
        sds.batches(500, balance="cls", class_weights={"A": 1, "D": 3}, num_samples=4000, obs_columns=["cls"]), "cls"
    ))
    shares = np.bincount(weighted, minlength=4) / weighted.size
    assert weighted.size == 4000
    assert shares[1] == shares[2] == 0
    assert abs(shares[0] - 0.25) <= 0.025 and abs(shares[3] - 0.75) <= 0.075, shares


def test_a_drawn_epoch_is_split_across_ranks_and_workers_and_reads_the_right_rows(sds) -> None:
    options = dict(balance="cls", seed=4, epoch=1)
    whole = np.concatenate([b.cells for b in sds.batches(300, **options)])
    shares = [
        np.concatenate([b.cells for b in sds.batches(300, rank=r, world_size=2, worker=w, num_workers=2, **options)])
        for r in range(2) for w in range(2)
    ]
    np.testing.assert_array_equal(np.sort(np.concatenate(shares)), np.sort(whole))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert len(np.unique(whole)) < len(whole), "drawn with replacement: the rare class comes back"
    batch = next(iter(sds.batches(300, obs_columns=["cls"], **options)))
    assert (batch.X.to_scipy() != sds.get_batch(batch.cells).to_scipy()).nnz == 0
    np.testing.assert_array_equal(batch.obs["cls"], sds.obs.take(batch.cells, ["cls"])["cls"])


def test_weights_choose_the_cells_drawn(sds) -> None:
    sample = codes(sds, "sample")
    weights = (sample == 3).astype(float)
    loader = sds.batches(256, weights=weights, num_samples=3000, seed=1)
    assert loader.n_cells == 3000 and len(loader) == 12
    cells = np.concatenate([b.cells for b in loader])
    assert cells.size == 3000 and np.all(sample[cells] == 3)
    np.testing.assert_array_equal(cells, np.concatenate([b.cells for b in sds.batches(256, weights=weights,
                                                                                          num_samples=3000, seed=1)]))
    # Over a subset, one weight per cell of the subset.
    subset = np.arange(0, sds.n_cells, 2)
    drawn = np.concatenate([b.cells for b in sds.batches(100, cells=subset, weights=np.ones(subset.size),
                                                         num_samples=500)])
    assert np.all(drawn % 2 == 0) and drawn.size == 500


def test_where_gives_the_cells_of_the_values(sds) -> None:
    sample, donor = codes(sds, "sample"), codes(sds, "donor")
    np.testing.assert_array_equal(sds.obs.where("sample", ["s1", "s6"]), np.flatnonzero(np.isin(sample, [1, 6])))
    np.testing.assert_array_equal(sds.obs.where("sample", "s2"), np.flatnonzero(sample == 2))
    both = sds.obs.where(donor="d1", sample=["s2", "s5"])
    np.testing.assert_array_equal(both, np.flatnonzero((donor == 1) & (sample == 2)))
    assert both.dtype == np.int64
    counts = np.asarray(sds.obs.take(range(sds.n_cells), ["n_counts"])["n_counts"])
    value = int(counts[17])
    np.testing.assert_array_equal(sds.obs.where("n_counts", [value]), np.flatnonzero(counts == value))
    with pytest.raises(deltacells.UnknownNameError, match="no category 's9'"):
        sds.obs.where("sample", ["s1", "s9"])
    with pytest.raises(KeyError, match="no obs column 'nope'"):
        sds.obs.where(nope=1)
    with pytest.raises(ValueError, match="at least one column"):
        sds.obs.where()


def test_split_keeps_every_group_whole(sds) -> None:
    donor = codes(sds, "donor")
    parts = sds.split(by="donor", fractions=(0.5, 0.25, 0.25), seed=0)
    assert len(parts) == 3
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(sds.n_cells))
    groups = [set(donor[p].tolist()) for p in parts]
    assert all(not (a & b) for i, a in enumerate(groups) for b in groups[i + 1:]), groups
    # 4 donors of 2,000 cells: each part within one group's size of its target.
    for part, fraction in zip(parts, (0.5, 0.25, 0.25), strict=True):
        assert abs(len(part) - fraction * sds.n_cells) <= 2000
    again = sds.split(by="donor", fractions=(0.5, 0.25, 0.25), seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    by_seed = {tuple(sorted(set(donor[sds.split(by="donor", fractions=(0.5, 0.5), seed=s)[0]].tolist())))
               for s in range(8)}
    assert len(by_seed) > 1, "the seed chooses which groups go where"
    within = sds.split(by="sample", fractions=(0.5, 0.5), cells=np.arange(4000))
    np.testing.assert_array_equal(np.sort(np.concatenate(within)), np.arange(4000))


BAD = [
    (dict(weights=np.ones(5)), ValueError, "weights has 5 values, not one per cell of the dataset"),
    (dict(weights=np.r_[-1.0, np.ones(7999)]), ValueError, r"weights\[0\] is -1"),
    (dict(weights=np.r_[np.nan, np.ones(7999)]), ValueError, r"weights\[0\] is NaN"),
    (dict(weights=np.zeros(8000)), ValueError, "weights are all zero"),
    (dict(weights=["a"] * 8000), ValueError, "weights must be numbers"),
    (dict(weights=np.ones(8000), balance="cls"), ValueError, "weights= or balance=, not both"),
    (dict(balance="nope"), KeyError, "no obs column 'nope'"),
    (dict(balance="n_counts"), ValueError, "balance needs a category column"),
    (dict(balance="cls", class_weights={"Z": 1}), KeyError, "'Z', which is not a category"),
    (dict(balance="cls", class_weights={"A": -1}), ValueError, r"class_weights\['A'\] must be finite"),
    (dict(class_weights={"A": 1}), ValueError, "class_weights goes with balance="),
    (dict(num_samples=10), ValueError, "num_samples is the size of an epoch drawn"),
    (dict(balance="cls", num_samples=-1), ValueError, "num_samples must be at least 0"),
    (dict(seed=1.5), ValueError, "seed must be an integer, not 1.5"),
    (dict(seed="1"), ValueError, "seed must be an integer, not '1'"),
    (dict(seed=-1), ValueError, "seed must be at least 0, not -1"),
    (dict(worker=-1), ValueError, "worker must be at least 0, not -1"),
    (dict(worker=2, num_workers=2), ValueError, "worker must be at most 1, not 2"),
    (dict(batch_size=0), ValueError, "batch_size must be at least 1"),
    (dict(prefetch=10**9), ValueError, "prefetch must be at most 1024"),
    (dict(shuffle="yes"), ValueError, "shuffle must be True or False"),
    (dict(obs_columns="cls"), ValueError, "obs_columns must be a list"),
    (dict(obs_columns=["nope"]), KeyError, "no obs column 'nope'"),
    (dict(cells=[8000]), IndexError, "cell 8000 is out of range"),
]


@pytest.mark.parametrize("options,error,message", BAD, ids=[m[:30] for _, _, m in BAD])
def test_bad_arguments_are_refused_by_name_before_any_thread_starts(sds, options, error, message) -> None:
    threads = threading.active_count()
    with pytest.raises(error, match=message) as caught:
        sds.batches(**{"batch_size": 100, **options})
    assert isinstance(caught.value, deltacells.DeltacellsError)
    assert threading.active_count() == threads


@pytest.mark.parametrize("fractions,message", [
    ((0.5, 0.4), "fractions must sum to 1"),
    ((1.5, -0.5), "none negative"),
    ((), "one or more numbers"),
    (("a", "b"), "fractions must be numbers"),
])
def test_bad_fractions_are_refused(sds, fractions, message) -> None:
    with pytest.raises(deltacells.InvalidArgumentError, match=message):
        sds.split(by="donor", fractions=fractions)


VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True), st.none(), st.text(max_size=3),
    st.booleans(), st.lists(st.integers(-3, 3), max_size=3),
)
OPTIONS = ["batch_size", "seed", "epoch", "rank", "world_size", "worker", "num_workers", "window_tiles",
           "mix_chunks", "prefetch", "shuffle", "drop_last", "num_samples"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(OPTIONS), value=VALUES)
def test_any_option_value_gives_a_loader_or_one_of_our_errors(sds, name: str, value) -> None:
    options = {name: value}
    if name == "num_samples":
        options["balance"] = "cls"
    try:
        loader = sds.batches(**options)
    except deltacells.DeltacellsError as e:
        assert isinstance(e, (ValueError, KeyError, IndexError, TypeError))
        assert name in str(e) or "num_samples" in str(e), str(e)
        return
    # Accepted: it reads, and the process goes on working.
    first = next(iter(loader), None)
    assert first is None or len(first) >= 1


INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def same_rows(a: deltacells.Batch, b: deltacells.Batch) -> bool:
    return (np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
            and np.array_equal(a.data, b.data))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_accepted_selection_reads_the_rows_of_its_int64_array(sds, data) -> None:
    n = sds.n_cells
    kind = data.draw(st.sampled_from(["array", "list", "range", "slice"]))
    if kind in ("array", "list"):
        dtype = data.draw(st.sampled_from(INT_DTYPES))
        high = min(n - 1, int(np.iinfo(dtype).max))
        values = data.draw(st.lists(st.integers(0, high), max_size=40))
        cells = np.array(values, dtype=dtype) if kind == "array" else values
        want = np.array(values, dtype=np.int64)
    else:
        start, stop = data.draw(st.integers(-2 * n, 2 * n)), data.draw(st.integers(-2 * n, 2 * n))
        step = data.draw(st.integers(-3000, 3000).filter(lambda s: s != 0))
        if kind == "slice":
            cells = slice(start, stop, step)
            want = np.arange(n)[cells]
        else:
            start, stop = abs(start) % n, abs(stop) % n
            cells = range(start, stop, step)
            want = np.array(list(cells), dtype=np.int64)
    got = sds.get_batch(cells)
    assert same_rows(got, sds.get_batch(want))
    assert got.shape == (len(want), sds.n_genes)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cells=st.one_of(
    st.lists(st.integers(min_value=-(2**70), max_value=2**70), min_size=1, max_size=5),
    st.lists(st.floats(allow_nan=True), min_size=1, max_size=3),
    st.lists(st.text(max_size=2), min_size=1, max_size=3),
    st.lists(st.booleans(), min_size=1, max_size=3),
    st.lists(st.lists(st.integers(0, 5), max_size=2), min_size=1, max_size=3),
    st.integers(),
    st.builds(slice, st.integers(-3, 3), st.integers(-3, 3), st.just(0)),
))
def test_any_rejected_selection_raises_one_of_our_errors(sds, cells) -> None:
    try:
        batch = sds.get_batch(cells)
    except deltacells.DeltacellsError as e:
        assert isinstance(e, (ValueError, TypeError, IndexError)), type(e)
        assert str(e)
        return
    # Accepted: only integer lists inside the dataset get here.
    assert batch.shape[0] == len(cells)
    assert all(0 <= c < sds.n_cells for c in cells)


def test_unsigned_cells_past_int64_are_named(sds) -> None:
    with pytest.raises(deltacells.CellIndexError, match=f"cell {2**64 - 1} is out of range"):
        sds.get_batch(np.array([2**64 - 1], dtype=np.uint64))
    with pytest.raises(deltacells.ArgumentTypeError, match="cells must be integers, not float64"):
        sds.get_batch(np.array([1.0]))
    with pytest.raises(TypeError, match="one-dimensional"):
        sds.get_batch(np.zeros((2, 2), dtype=np.int64))
