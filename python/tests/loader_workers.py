"""What the worker processes of test_loader.py run (a module of its own, so
that processes started with spawn can import it)."""

from __future__ import annotations

from typing import Any

import numpy as np


def read_share(loader: Any, worker: int, num_workers: int, results: Any) -> None:
    """Reads one worker's share of the loader's epoch; puts (worker, cells,
    checksum of X, thread names seen) on ``results``."""
    import threading

    loader.options.update(worker=worker, num_workers=num_workers)
    cells, total = [], 0
    for batch in loader:
        cells.append(batch.cells)
        total += int(batch.X.data.astype(np.int64).sum())
    results.put((worker, np.concatenate(cells) if cells else np.zeros(0, np.int64), total,
                 threading.active_count()))
