"""Random gathers and gathers planned ahead: every way of reading listed
cells gives exactly get_batch's rows, the cache of decompressed chunks
serves cells drawn again without reading, and bad arguments are refused by
name. The datasets are made with deltacells.convert from the 1,000 PBMC
cells the repository ships, so these run in a user's clone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deltacells

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "pbmc_1k.h5ad"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The 1,000 cells in tiles of 300 cells, 16 chunks each: lists cross tiles and chunks."""
    out = tmp_path_factory.mktemp("gathers") / "pbmc"
    deltacells.convert(EXAMPLE, out, tile_size=300, chunks=16, level=3)
    return str(out)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same cells in other tiles (a collection's second dataset)."""
    out = tmp_path_factory.mktemp("gathers") / "pbmc-other"
    deltacells.convert(EXAMPLE, out, tile_size=128, chunks=3, level=1)
    return str(out)


def same(a, b) -> None:
    a, b = a.to_scipy(), b.to_scipy()
    assert a.shape == b.shape
    assert (a != b).nnz == 0


lists_of_cells = st.lists(st.lists(st.integers(0, 999), max_size=40), min_size=1, max_size=6)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lists=lists_of_cells, dtype=st.sampled_from([None, np.int64, np.int32, np.uint16, np.uint64, np.int8]),
       ahead=st.integers(1, 5))
def test_gathers_give_get_batchs_rows_in_order(small: str, lists: list[list[int]], dtype, ahead: int) -> None:
    ds = deltacells.open_dataset(small)
    given_lists: list = lists
    if dtype is not None:
        lists = [[c for c in cells if c <= np.iinfo(dtype).max] for cells in lists]
        given_lists = [np.array(cells, dtype=dtype) for cells in lists]
    gathered = list(ds.gathers(given_lists, ahead=ahead, obs_columns=["obs_names"]))
    assert len(gathered) == len(lists)
    for cells, batch in zip(lists, gathered, strict=True):
        assert batch.cells.tolist() == cells
        same(batch.X, ds.get_batch(cells))
        assert batch.obs["obs_names"].tolist() == ds.obs.take(np.array(cells, dtype=np.int64),
                                                              ["obs_names"])["obs_names"].tolist()


def test_gathers_take_the_batch_forms_of_get_batch(small: str) -> None:
    ds = deltacells.open_dataset(small)
    cells = [999, 0, 450, 450, 301]
    names = ds.var_names
    assert names is not None
    genes = names[::-7][:50]
    [scaled] = ds.gathers([cells], genes=genes, normalize=1e4, log1p=True, dtype=np.float32)
    same(scaled.X, ds.get_batch(cells, genes=genes, normalize=1e4, log1p=True, dtype=np.float32))
    [dense] = ds.gathers([cells], dense=True)
    assert np.array_equal(dense.X, ds.get_batch(cells, dense=True))
    [ranked] = ds.gathers([cells], top_k=5)
    assert ranked.top_k is not None and ranked.top_k.shape == (5, 5)


def test_collection_gathers_mix_datasets(small: str, other: str) -> None:
    coll = deltacells.open_collection([small, other])
    lists = [[0, 1999, 1000, 5], range(990, 1010), [1500, 1500]]
    for cells, batch in zip(lists, coll.gathers(lists, ahead=2), strict=True):
        assert batch.cells.tolist() == list(cells)
        same(batch.X, coll.get_batch(cells))
        # the second dataset's cell c is the first's cell c - 1000
        first = deltacells.open_dataset(small)
        back = [c % 1000 for c in cells]
        same(batch.X, first.get_batch(back))


def test_batches_held_stay_whole_while_their_buffers_are_reused(small: str) -> None:
    # get_batch and the map-style form write into buffers that come back when
    # NumPy frees the arrays: one held must never be written over by the next.
    ds = deltacells.open_dataset(small, cache_bytes=0)
    rng = np.random.default_rng(5)
    lists = [rng.integers(0, 1000, size=int(rng.integers(1, 300))) for _ in range(12)]
    expected = [ds.get_batch(cells).to_scipy().toarray() for cells in lists]
    held = []
    for round_ in range(3):
        for i, cells in enumerate(lists):
            got = ds.get_batch(cells)
            if (i + round_) % 3 == 0:
                held.append((i, got, got.to_scipy()))
        for i, batch, matrix in held:
            assert np.array_equal(batch.to_scipy().toarray(), expected[i])
            assert np.array_equal(matrix.toarray(), expected[i])
        held = held[len(held) // 2:]


def test_an_abandoned_iteration_stops_and_can_start_again(small: str) -> None:
    ds = deltacells.open_dataset(small)
    gathers = ds.gathers([[i, 999 - i] for i in range(500)], ahead=3)
    for i, _batch in enumerate(gathers):
        if i == 2:
            break
    again = [b.cells.tolist() for b in gathers]
    assert len(again) == 500 and again[7] == [7, 992]


def test_cells_drawn_again_are_served_from_the_cache(small: str) -> None:
    ds = deltacells.open_dataset(small)  # the default cache
    cells = np.random.default_rng(0).choice(1000, 200)
    first = ds.get_batch(cells)
    before = ds.io_stats()["requests"]
    same(ds.get_batch(cells[::-1]), deltacells.open_dataset(small).get_batch(cells[::-1]))
    assert ds.io_stats()["requests"] == before
    same(first, ds.get_batch(cells))
    none = deltacells.open_dataset(small, cache_bytes=0)
    none.get_batch(cells)
    before = none.io_stats()["requests"]
    same(none.get_batch(cells), first)
    assert none.io_stats()["requests"] > before


def test_a_tiles_crc_check_is_remembered_in_the_cache_folder(small: str, tmp_path: Path) -> None:
    """The first gather from a tile reads it whole for its CRC; a dataset
    opened later with the same cache folder (another process, a DataLoader
    worker) reads only the chunks, and so after a loader's epoch."""
    tile_bytes = min(json.loads((Path(small) / "manifest.json").read_text())["tile_bytes"])
    cells = [5, 310, 620, 905]  # one in each tile

    def fetched(ds: deltacells.Dataset) -> int:
        before = ds.io_stats()["bytes"]
        same(ds.get_batch(cells), deltacells.open_dataset(small, cache_bytes=0).get_batch(cells))
        return ds.io_stats()["bytes"] - before

    first = tmp_path / "first"
    assert fetched(deltacells.open_dataset(small, cache_dir=first)) >= 4 * tile_bytes
    (record,) = (first / "checked-tiles").iterdir()
    assert sorted(int(line.split()[0]) for line in record.read_text().splitlines()) == [0, 1, 2, 3]
    assert fetched(deltacells.open_dataset(small, cache_dir=first)) < tile_bytes
    # an epoch of the loader checks every tile it reads
    after_epoch = tmp_path / "epoch"
    for _ in deltacells.open_dataset(small, cache_dir=after_epoch).batches(256):
        pass
    assert fetched(deltacells.open_dataset(small, cache_dir=after_epoch)) < tile_bytes


def test_a_collections_datasets_remember_their_checks_in_its_cache_folder(small: str, tmp_path: Path) -> None:
    """open_collection(cache_dir=) is where its datasets record the tiles they
    checked, in this process and in one that makes the collection again from
    its state (a DataLoader worker), not the default cache folder."""
    import shutil

    other = shutil.copytree(small, tmp_path / "other")
    n_tiles = len(json.loads((Path(small) / "manifest.json").read_text())["tile_bytes"])

    def recorded(folder: Path) -> list[list[int]]:
        records = sorted((folder / "checked-tiles").iterdir()) if folder.exists() else []
        return [sorted(int(line.split()[0]) for line in r.read_text().splitlines()) for r in records]

    here = tmp_path / "here"
    coll = deltacells.open_collection([small, str(other)], cache_dir=here)
    for _ in coll.batches(256):
        pass
    assert recorded(here) == [list(range(n_tiles))] * 2
    # made again from its state, as in a worker
    again = tmp_path / "again"
    raw = deltacells._deltacells.RawCollection.from_state(coll.native.state_json(), "union", None, 0, str(again))
    assert not recorded(again)
    raw.member(1).get_batch(np.array([0, 5], dtype=np.int64))
    assert len(recorded(again)) == 1
    with pytest.raises(deltacells.InvalidArgumentError, match="cache_dir"):
        deltacells.open_collection([small, str(other)], cache_dir="a\0b")


def test_bad_arguments_are_refused_by_name(small: str) -> None:
    ds = deltacells.open_dataset(small)
    with pytest.raises(deltacells.CellIndexError, match="cell 1000"):
        ds.gathers([[1], [1000]])
    with pytest.raises(deltacells.CellIndexError, match="cell -1"):
        ds.gathers([[-1]])
    with pytest.raises(deltacells.InvalidArgumentError, match="ahead"):
        ds.gathers([[1]], ahead=0)
    with pytest.raises(deltacells.InvalidArgumentError, match="ahead"):
        ds.gathers([[1]], ahead=10**6)
    with pytest.raises(deltacells.InvalidArgumentError, match="unknown keyword 'normalise'"):
        ds.gathers([[1]], normalise=1e4)  # type: ignore[call-arg]
    with pytest.raises(deltacells.InvalidArgumentError, match="lists"):
        ds.gathers("0,1")
    with pytest.raises(deltacells.InvalidArgumentError, match="dtype"):
        ds.gathers([[1]], dtype=np.int32, normalize=10.0)
    with pytest.raises(deltacells.UnknownNameError):
        ds.gathers([[1]], obs_columns=["no_such_column"])
