"""An open dataset while `deltacells append` and `compact` change it from other
processes: its batches, epochs and pickled copies keep the rows of the version
it opened, and never fail."""

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
    ds = deltacells.open_dataset(str(dataset))
    last = list(range(950, 1000))
    before = _rows(ds.get_batch(last))
    whole = _rows(ds.get_batch(range(1000)))
    run(binary, "append", "-q", dataset, EXAMPLE)
    # The version opened: 1,000 cells, the same rows, from the filled tile.
    assert ds.n_cells == 1000
    assert np.array_equal(_rows(ds.get_batch(last)), before)
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

    threads = [threading.Thread(target=read, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        for round in range(6):
            args = [["append", "-q", dataset, EXAMPLE],
                    ["append", "-q", "--shuffle", str(round), dataset, EXAMPLE],
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
