"""An open dataset while `deltacells append`, `compact` and a sharded append's
`finalize` change it from other processes: its batches, epochs, obs, pickled
copies, DataLoader workers (iterable and map-style) and a collection's members
keep the rows of the version it opened, and never fail."""

import pickle
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

import deltacells
from conftest import REPO, run

EXAMPLE = REPO / "examples" / "pbmc_1k.h5ad"


def _rows(batch) -> np.ndarray:
    return np.asarray(batch.to_scipy().todense())


@pytest.fixture()
def dataset(tmp_path: Path, binary: Path) -> Path:
    out = tmp_path / "ds"
    run(binary, "convert", "-q", "--tile-size", "300", "--level", "1", "--shuffle", "7", EXAMPLE, out)
    return out


def test_the_last_cells_and_an_epoch_after_an_append(binary: Path, dataset: Path) -> None:
    # No cache of chunks: every read goes to the files.
    ds = deltacells.open_dataset(str(dataset), cache_bytes=0)
    last = list(range(950, 1000))
    before = _rows(ds.get_batch(last))
    whole = _rows(ds.get_batch(range(1000)))
    assert ds.versions_followed == 0
    run(binary, "append", "-q", dataset, EXAMPLE)
    # The version opened: 1,000 cells, the same rows, from the filled tile,
    # read from the version the append made.
    assert ds.n_cells == 1000
    assert np.array_equal(_rows(ds.get_batch(last)), before)
    assert ds.versions_followed == 1
    seen = np.zeros(1000, dtype=bool)
    for batch in ds.batches(batch_size=128, shuffle=True, seed=3):
        assert np.array_equal(_rows(batch.X), whole[batch.cells])
        seen[batch.cells] = True
    assert seen.all()
    # A copy for a worker process opens the same version.
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.n_cells == 1000
    assert np.array_equal(_rows(copy.get_batch(last)), before)
    assert deltacells.open_dataset(str(dataset)).n_cells == 2000


def test_readers_in_threads_while_writers_run(binary: Path, dataset: Path) -> None:
    ds = deltacells.open_dataset(str(dataset))
    whole = _rows(ds.get_batch(range(1000)))
    done = threading.Event()
    failures: list[str] = []
    reads = [0]

    def read(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not done.is_set():
            try:
                cells = np.concatenate([rng.integers(0, 1000, 40), np.arange(980, 1000)])
                if not np.array_equal(_rows(ds.get_batch(cells)), whole[cells]):
                    failures.append(f"other rows for {cells.tolist()}")
                for batch in ds.batches(batch_size=256, shuffle=True, seed=int(seed)):
                    if not np.array_equal(_rows(batch.X), whole[batch.cells]):
                        failures.append("other rows in a loader batch")
                reads[0] += 1
            except deltacells.DeltacellsError as e:
                failures.append(str(e))
                return

    spill = dataset.parent / "spill"
    spill.mkdir(exist_ok=True)
    threads = [threading.Thread(target=read, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        for round in range(6):
            args = [["append", "-q", dataset, EXAMPLE],
                    # (a killed shuffled append leaves its spill in tmp_path)
                    ["append", "-q", "--shuffle", str(round), "--spill-dir", spill, dataset, EXAMPLE],
                    ["compact", "-q", "--level", "3" if round % 2 else "1", dataset]][round % 3]
            if round == 4:
                # killed at a random moment, then completed (or discarded)
                child = subprocess.Popen([str(binary), *map(str, args)])
                threading.Event().wait(0.05 + 0.1 * round)
                child.kill()
                child.wait()
                subprocess.run([str(binary), "append", "-q", "--resume", str(dataset)], capture_output=True)
                subprocess.run([str(binary), "compact", "-q", str(dataset)], capture_output=True)
            else:
                run(binary, *args)
    finally:
        done.set()
        for t in threads:
            t.join()
    assert not failures, failures[:3]
    assert reads[0] > 6


def _writer(binary: Path, round: int, dataset: Path) -> subprocess.Popen:
    """A writer of `dataset` started in the background: an append, a shuffled
    append, a compaction, or a sharded append (plan, two shards, finalize)."""
    kind = round % 4
    if kind == 3:
        script = " && ".join([
            f"{binary} plan -q --append {dataset} {EXAMPLE}",
            f"{binary} shard -q {dataset} --shard 0/2",
            f"{binary} shard -q {dataset} --shard 1/2",
            f"{binary} finalize -q {dataset}",
        ])
        return subprocess.Popen(["sh", "-c", script], stderr=subprocess.PIPE, text=True)
    args = [["append", "-q", dataset, EXAMPLE], ["append", "-q", "--shuffle", str(round), dataset, EXAMPLE],
            ["compact", "-q", "--level", "3" if round % 2 else "1", dataset]][kind]
    return subprocess.Popen([str(binary), *map(str, args)], stderr=subprocess.PIPE, text=True)


def _finished(writer: subprocess.Popen) -> None:
    _, err = writer.communicate(timeout=300)
    assert writer.returncode == 0, err


def test_dataloader_workers_and_the_map_style_dataset_while_writers_run(
        torch, binary: Path, dataset: Path) -> None:
    from deltacells.torch import CellDataset, CellMapDataset, collate

    ds = deltacells.open_dataset(str(dataset), cache_bytes=0)
    whole = _rows(ds.get_batch(range(1000)))

    def check(x, cells: np.ndarray) -> None:
        assert np.array_equal(np.asarray(x.to_dense().numpy()), whole[cells].astype(np.float32))

    for round in range(4):
        writer = _writer(binary, round, dataset)
        try:
            # Iterable, workers started for this epoch (not persistent).
            seen = []
            loader = torch.utils.data.DataLoader(CellDataset(ds, batch_size=128, seed=round), batch_size=None,
                                                 num_workers=2)
            for batch in loader:
                cells = batch["cells"].numpy()
                check(batch["X"], cells)
                seen.append(cells)
            assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(1000))
            # Map-style through a random sampler, in two workers.
            data = CellMapDataset(ds)
            sampler = torch.utils.data.RandomSampler(data, generator=torch.Generator().manual_seed(round))
            mapped = torch.utils.data.DataLoader(data, batch_size=100, sampler=sampler, num_workers=2,
                                                 collate_fn=collate)
            for batch in mapped:
                check(batch["X"], batch["cells"].numpy())
        finally:
            _finished(writer)
    assert ds.n_cells == 1000
    # The last writer's version: every writer ran, and this process's reads moved on.
    assert deltacells.open_dataset(str(dataset)).n_cells == 4000
    ds.get_batch(range(900, 1000))
    assert ds.versions_followed >= 1


def test_obs_first_read_after_an_append_rewrote_its_shards(binary: Path, tmp_path: Path) -> None:
    from samples import make_sample_inputs

    inputs = make_sample_inputs(tmp_path, samples=3)
    out = tmp_path / "ds"
    # Tiles of 300 cells, two per obs shard: the last shard is rewritten by the append.
    run(binary, "convert", "-q", "--tile-size", "300", "--obs-tiles-per-file", "2", *inputs[:2], out)
    columns = ["sample", "cls", "n_counts"]
    reference = deltacells.open_dataset(str(out), cache_dir=str(tmp_path / "cache_a"))
    want = reference.obs.take(range(2000), columns)
    ds = deltacells.open_dataset(str(out), cache_dir=str(tmp_path / "cache_b"))
    run(binary, "append", "-q", out, inputs[2])
    got = ds.obs.take(range(2000), columns)
    for name in columns:
        assert np.array_equal(np.asarray(got[name]), np.asarray(want[name])), name
    assert ds.n_cells == 2000 and ds.versions_followed == 1
    assert deltacells.open_dataset(str(out), cache_dir=str(tmp_path / "cache_c")).n_cells == 3000


def test_a_collections_members_in_spawned_workers_keep_their_version(
        torch, binary: Path, dataset: Path, tmp_path: Path) -> None:
    from deltacells.torch import CellMapDataset, collate

    other = tmp_path / "other"
    run(binary, "convert", "-q", "--tile-size", "400", "--level", "1", EXAMPLE, other)
    coll = deltacells.open_collection({"a": str(dataset), "b": str(other)}, cache_bytes=0)
    whole = np.asarray(coll.get_batch(range(coll.n_cells)).to_scipy().todense())
    run(binary, "append", "-q", other, EXAMPLE)
    run(binary, "compact", "-q", "--level", "3", dataset)
    data = CellMapDataset(coll)
    loader = torch.utils.data.DataLoader(data, batch_size=250, num_workers=2, collate_fn=collate,
                                         multiprocessing_context="spawn")
    seen = []
    for batch in loader:
        cells = batch["cells"].numpy()
        assert np.array_equal(batch["X"].to_dense().numpy(), whole[cells].astype(np.float32))
        seen.append(cells)
    assert np.array_equal(np.concatenate(seen), np.arange(2000))
