"""Faults of the store while training: a store that fails transiently (503,
500, connections dropped) is retried and the epoch completes with the right
batches, the retries counted in the dataset's I/O stats; a store that goes
down ends the epoch with an error naming the tile, after the batches before
it, in bounded time."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import deltacells
from conftest import REPO

EXAMPLE = REPO / "examples" / "pbmc_1k.h5ad"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example in 8 tiles, in a folder an HTTP server serves."""
    root = tmp_path_factory.mktemp("served")
    deltacells.convert(EXAMPLE, root / "ds", tile_size=128, level=3, progress=False)
    return root


def epoch(ds: deltacells.Dataset) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    return [
        (b.X.indptr.copy(), b.X.indices.copy(), b.X.data.copy())
        for b in ds.batches(100, shuffle=True, seed=3, epoch=1)
    ]


def test_transient_faults_are_retried_and_counted(served: Path, http_server) -> None:
    local = epoch(deltacells.open_dataset(served / "ds"))
    url = http_server(served, "--fail-every", "3")
    ds = deltacells.open_dataset(f"{url}/ds", threads=2)
    remote = epoch(ds)
    assert len(remote) == len(local) == 10
    for a, b in zip(remote, local, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    stats = ds.io_stats()
    # every third request failed (a 503, a 500 or a dropped connection) and was tried again
    assert stats["retries"] >= stats["requests"] // 3 > 0, stats
    served_count = int(urllib.request.urlopen(f"{url}/__requests").read())
    assert served_count == stats["requests"] + stats["retries"], (served_count, stats)


def test_a_store_that_goes_down_ends_the_epoch_naming_the_tile(tmp_path: Path, http_server) -> None:
    # 32 tiles, each request held 100 ms: the loader has read a few tiles
    # ahead, not all of them, when the store goes down
    deltacells.convert(EXAMPLE, tmp_path / "ds", tile_size=32, level=3, progress=False)
    url = http_server(tmp_path, "--latency-ms", "100")
    ds = deltacells.open_dataset(f"{url}/ds", threads=1)
    batches = iter(ds.batches(32, shuffle=False, prefetch=1))
    first = next(batches)
    urllib.request.urlopen(f"{url}/__down").read()
    assert first.X.shape[0] == 32
    started = time.monotonic()
    done = 1
    with pytest.raises(deltacells.DeltacellsError, match=r"tile_\d{6}\.dct") as raised:
        for _ in batches:
            done += 1
    assert time.monotonic() - started < 150  # the retries' time limit (120 s), not a hang
    assert 1 <= done < 32 and "503" in str(raised.value), (done, str(raised.value))
    assert ds.io_stats()["retries"] >= 8
    # the process keeps working: the store is back, the dataset reads again
    urllib.request.urlopen(f"{url}/__up").read()
    assert ds.get_batch([1000 - 1]).shape == (1, ds.n_genes)


@pytest.fixture()
def tiled(tmp_path: Path) -> Path:
    """The example in 32 tiles of 32 cells (the last of 8), local."""
    deltacells.convert(EXAMPLE, tmp_path / "ds", tile_size=32, level=3, progress=False)
    return tmp_path / "ds"


def test_a_tile_truncated_mid_epoch_ends_it_after_the_batches_before_it(tiled: Path) -> None:
    expected = [b.X.to_scipy() for b in deltacells.open_dataset(tiled).batches(32, shuffle=False)]
    ds = deltacells.open_dataset(tiled, threads=1)
    batches = iter(ds.batches(32, shuffle=False, prefetch=1))
    got = [next(batches).X.to_scipy()]
    tile = tiled / "tiles" / "tile_000020.dct"
    tile.write_bytes(tile.read_bytes()[:100])
    with pytest.raises(deltacells.CorruptDatasetError, match="tile_000020.dct") as raised:
        for batch in batches:
            got.append(batch.X.to_scipy())
    assert isinstance(raised.value, ValueError)
    # every batch before the tile's came, and came right
    assert len(got) == 20
    for a, b in zip(got, expected, strict=False):
        assert (a != b).nnz == 0


def test_a_dataset_deleted_under_a_running_loader_is_an_error_not_a_hang(tiled: Path) -> None:
    import shutil

    ds = deltacells.open_dataset(tiled, threads=1)
    batches = iter(ds.batches(32, shuffle=False, prefetch=1))
    next(batches)
    shutil.rmtree(tiled)
    started = time.monotonic()
    # (a tile found gone sends the reader to the manifest, gone too: the
    # error names the dataset's folder, or the tile when it is the first;
    # while rmtree is still removing the tiles, the folder is one without
    # a manifest, an incomplete dataset)
    folder = rf"{tiled}: (no dataset here|incomplete dataset: no manifest\.json)"
    with pytest.raises(deltacells.DeltacellsError, match=rf"tile_\d{{6}}\.dct|{folder}") as raised:
        for _ in batches:
            pass
    # (a missing manifest may be a writer's commit: a reader waits for it up
    # to 2 minutes, then fails; never longer)
    assert time.monotonic() - started < 200
    assert isinstance(raised.value, FileNotFoundError | deltacells.CorruptDatasetError), type(raised.value)


def test_a_tile_truncated_under_a_dataloader_worker_is_raised_in_the_main_process(tiled: Path, torch) -> None:
    from deltacells.torch import CellDataset

    loader = torch.utils.data.DataLoader(
        CellDataset(deltacells.open_dataset(tiled), batch_size=32, shuffle=False), batch_size=None, num_workers=1
    )
    it = iter(loader)
    next(it)
    tile = tiled / "tiles" / "tile_000025.dct"
    tile.write_bytes(tile.read_bytes()[:100])
    with pytest.raises(deltacells.CorruptDatasetError, match="tile_000025.dct"):
        for _ in it:
            pass
