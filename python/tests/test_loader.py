"""The training loader (Dataset.batches): every cell once per epoch across ranks
and workers, a fixed order per (seed, epoch), the right rows and obs, worker
processes started with fork and spawn, flat memory over epochs, a bucket."""

from __future__ import annotations

import multiprocessing
import pickle
from pathlib import Path

import numpy as np
import pytest
from loader_workers import read_share

import deltacells
from conftest import S3_ENV, run


@pytest.fixture(scope="module")
def ds(pbmc_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> deltacells.Dataset:
    return deltacells.open_dataset(str(pbmc_dataset), cache_dir=str(tmp_path_factory.mktemp("cache")))


def epoch_cells(ds: deltacells.Dataset, **options) -> np.ndarray:
    return np.concatenate([b.cells for b in ds.batches(**options)])


@pytest.mark.parametrize("subset", [False, True])
@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_one_epoch_yields_every_cell_once(ds, world_size: int, num_workers: int, subset: bool) -> None:
    cells = np.random.default_rng(1).permutation(ds.n_cells)[: ds.n_cells // 3] if subset else None
    seen = [
        epoch_cells(ds, batch_size=1024, epoch=2, rank=r, world_size=world_size, worker=w, num_workers=num_workers,
                    cells=cells)
        for r in range(world_size) for w in range(num_workers)
    ]
    everything = np.sort(np.concatenate(seen))
    np.testing.assert_array_equal(everything, np.sort(cells) if subset else np.arange(ds.n_cells))
    sizes = [len(s) for s in seen]
    assert max(sizes) - min(sizes) <= 1, sizes


def test_drop_last_gives_every_rank_the_same_batches(ds) -> None:
    counts = []
    for rank in range(3):
        loader = ds.batches(1000, rank=rank, world_size=3, num_workers=2, worker=1, drop_last=True)
        batches = list(loader)
        assert len(batches) == len(loader) and all(len(b) == 1000 for b in batches)
        counts.append(len(batches))
    # 13,999 cells in 6 shares: 2,333 each, 2 full batches each.
    assert counts == [2, 2, 2]


def test_the_order_is_fixed_by_seed_and_epoch(ds) -> None:
    first = epoch_cells(ds, seed=3, epoch=0)
    np.testing.assert_array_equal(first, epoch_cells(ds, seed=3, epoch=0))
    assert not np.array_equal(first, epoch_cells(ds, seed=3, epoch=1))
    assert not np.array_equal(first, epoch_cells(ds, seed=4, epoch=0))
    loader = ds.batches(seed=3)
    loader.set_epoch(1)
    np.testing.assert_array_equal(np.concatenate([b.cells for b in loader]), epoch_cells(ds, seed=3, epoch=1))
    # Shuffled: batches mix the tiles of a window; without shuffle, dataset order.
    tiles = np.searchsorted(np.cumsum(ds.tile_cells), first[:1024], side="right")
    assert len(set(tiles.tolist())) > 1
    np.testing.assert_array_equal(epoch_cells(ds, shuffle=False), np.arange(ds.n_cells))


def test_an_epoch_is_planned_once_for_its_size_and_every_reading(ds, monkeypatch) -> None:
    planned = []
    original = deltacells.Dataset._plan

    def counting(self, *args):  # noqa: ANN001, ANN202
        planned.append(args)
        return original(self, *args)

    monkeypatch.setattr(deltacells.Dataset, "_plan", counting)
    loader = ds.batches(2000, seed=5, weights=np.linspace(0.0, 1.0, ds.n_cells))
    first = [b.cells for b in loader]
    assert len(loader) == len(first) and sum(map(len, first)) == loader.n_cells == ds.n_cells
    again = [b.cells for b in loader]
    assert len(planned) == 1
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    loader.set_epoch(1)
    assert not np.array_equal(np.concatenate(list(b.cells for b in loader)), np.concatenate(first))
    assert len(planned) == 2
    # (a plan belongs to the dataset it was made over)
    other = deltacells.open_dataset(ds.root)
    with pytest.raises(deltacells.InvalidArgumentError, match="another dataset"):
        other.native.batches(ds._plan(None, loader.options, None, None))


def test_batches_hold_the_rows_and_obs_of_their_cells(ds) -> None:
    columns = [c for c in ds.obs.columns if c != "obs_names"][:3] + ["obs_names"]
    cells = np.arange(0, ds.n_cells, 5)
    loader = ds.batches(700, obs_columns=columns, cells=cells, window_tiles=3, epoch=1)
    assert loader.n_cells == len(cells) and len(loader) == -(-len(cells) // 700)
    batches = list(loader)
    for batch in batches:
        assert batch.cells.dtype == np.int64 and batch.X.shape == (len(batch.cells), ds.n_genes)
        want = ds.get_batch(batch.cells).to_scipy()
        assert (batch.X.to_scipy() != want).nnz == 0
        expected = ds.obs.take(batch.cells, columns)
        assert list(batch.obs) == columns
        for name in columns:
            assert batch.obs[name].dtype == expected[name].dtype
            np.testing.assert_array_equal(batch.obs[name], expected[name])
    np.testing.assert_array_equal(np.sort(np.concatenate([b.cells for b in batches])), cells)


def test_bad_arguments_raise(ds) -> None:
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        list(ds.batches(0))
    with pytest.raises(ValueError, match="rank must be at most 1, not 2"):
        list(ds.batches(rank=2, world_size=2))
    with pytest.raises(deltacells.CellIndexError, match=f"cell {ds.n_cells} is out of range"):
        list(ds.batches(cells=[0, ds.n_cells]))
    with pytest.raises(KeyError, match="no obs column 'nope'"):
        ds.batches(obs_columns=["nope"])


def run_workers(method: str, loader: deltacells.Loader) -> list[np.ndarray]:
    """Two worker processes started with `method`, each reading its share of
    the loader's epoch; their cells, by worker."""
    context = multiprocessing.get_context(method)
    results = context.Queue()
    workers = [context.Process(target=read_share, args=(loader, w, 2, results)) for w in range(2)]
    for p in workers:
        p.start()
    got = {}
    for _ in workers:
        worker, cells, total, _threads = results.get(timeout=120)
        got[worker] = (cells, total)
    for p in workers:
        p.join(timeout=30)
        assert p.exitcode == 0
    return [got[w] for w in range(2)]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_processes_read_their_own_shares(ds, method: str) -> None:
    loader = ds.batches(512, epoch=4, obs_columns=["obs_names"])
    # The parent reads first, so that its threads exist when it forks.
    assert len(next(iter(ds.batches(64)))) == 64
    assert pickle.loads(pickle.dumps(loader)).options == loader.options
    shares = run_workers(method, loader)
    for worker, (cells, total) in enumerate(shares):
        want = epoch_cells(ds, batch_size=512, epoch=4, worker=worker, num_workers=2)
        np.testing.assert_array_equal(cells, want)
        assert total == int(ds.get_batch(want).data.astype(np.int64).sum())
    np.testing.assert_array_equal(np.sort(np.concatenate([c for c, _ in shares])), np.arange(ds.n_cells))


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def test_memory_stays_flat_over_epochs(ds) -> None:
    rss = []
    for epoch in range(6):
        for batch in ds.batches(1024, epoch=epoch, obs_columns=["obs_names"]):
            batch.X.to_scipy()
        rss.append(rss_bytes())
    # After the first epoch has filled the pools: a leak of one epoch's
    # batches would be ~110 MB (13,999 cells x ~1,000 nonzeros x 8 bytes).
    growth = max(rss[1:]) - rss[1]
    assert growth < 24 << 20, [f"{r / 2**20:.0f} MiB" for r in rss]


def test_a_bucket_gives_the_local_batches_and_forks(
    binary: Path, pbmc: tuple[Path, Path], s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    layout = ["--tile-size", "2000", "--obs-tiles-per-file", "2", "--level", "3"]
    run(binary, "convert", "-q", *layout, pbmc[0], tmp_path / "local")
    run(binary, "convert", "-q", *layout, "--endpoint", s3_server, pbmc[0], "s3://test/ds")
    here = deltacells.open_dataset(str(tmp_path / "local"), cache_dir=str(tmp_path / "c1"))
    remote = deltacells.open_dataset("s3://test/ds", endpoint=s3_server, cache_dir=str(tmp_path / "c2"))
    options = dict(batch_size=300, epoch=7, world_size=2, rank=1, obs_columns=["obs_names"])
    a, b = list(here.batches(**options)), list(remote.batches(**options))
    assert len(a) == len(b) > 1
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.cells, y.cells)
        assert (x.X.to_scipy() != y.X.to_scipy()).nnz == 0
        np.testing.assert_array_equal(x.obs["obs_names"], y.obs["obs_names"])
    # The parent has used its I/O runtime and connections; forked workers make their own.
    for method in ["fork", "spawn"]:
        shares = run_workers(method, remote.batches(256, epoch=1))
        for worker, (cells, _) in enumerate(shares):
            np.testing.assert_array_equal(cells, epoch_cells(here, batch_size=256, epoch=1, worker=worker,
                                                             num_workers=2))


def test_the_loader_options_have_one_definition() -> None:
    """The Python type of the options, the Rust loader's defaults and the
    signatures of Dataset.batches and CellDataset all agree."""
    import inspect
    import typing

    from deltacells import _deltacells
    from deltacells._dataset import Dataset
    from deltacells._options import DEFAULTS, LoaderOptions
    from deltacells._types import BatchArgs

    rust = _deltacells.loader_defaults()
    hints = typing.get_type_hints(LoaderOptions)
    assert set(hints) == set(rust) == set(DEFAULTS)
    for name, value in rust.items():
        assert type(value) is hints[name], name
    signature = inspect.signature(Dataset.batches).parameters
    assert signature["batch_size"].default == rust["batch_size"]
    # every other option is a keyword of BatchArgs, its default filled in from DEFAULTS
    assert set(rust) - {"batch_size"} <= set(BatchArgs.__annotations__)
