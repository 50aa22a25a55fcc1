"""The ways of reading scattered cells, on the same random batches, in one
run: `get_batch`, the map-style `CellMapDataset` through a torch DataLoader
(its sampler giving the same indices), and gathers planned ahead
(`ds.gathers`), against the streaming loader's rate on the same dataset.

    .venv/bin/python benches/gathers.py DATASET [--batches 40] [--repeats 3] [--cache-bytes N]

Each reading runs in a process of its own, the page cache warm (every file
of DATASET read once first), the dataset opened afresh (its cache of
decompressed chunks empty; `--cache-bytes 0` keeps none at all). BATCHES
batches of 1,024 cells drawn at random (the same for every path) are read
REPEATS times, each time in a new process; the table gives medians. The
loader's row is one shuffled epoch of `ds.batches` (its decode rate: what
a planned gather of the same cells should come near). Needs torch for the
map-style row. Prints a table; not run by the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BATCH = 1024
PATHS = ["get_batch", "map-style DataLoader", "planned gathers", "loader epoch"]


def drawn(n: int, batches: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.choice(n, size=BATCH, replace=False) for _ in range(batches)]


def measure(root: str, path: str, batches: int, cache_bytes: int | None) -> dict:
    """One path's reading, in this process: (seconds, cells, nonzeros)."""
    import deltacells

    options = {} if cache_bytes is None else {"cache_bytes": cache_bytes}
    ds = deltacells.open_dataset(root, **options)
    lists = drawn(ds.n_cells, batches)
    nnz = 0
    if path == "map-style DataLoader":  # (torch imported and the DataLoader made before the clock starts)
        import torch.utils.data

        from deltacells.torch import CellMapDataset, collate

        data = CellMapDataset(ds, dtype=torch.int32, **options)
        order = np.concatenate(lists).tolist()
        loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=order, collate_fn=collate)
    started = time.perf_counter()
    if path == "get_batch":
        for cells in lists:
            nnz += ds.get_batch(cells).nnz
        cells = batches * BATCH
    elif path == "planned gathers":
        for batch in ds.gathers(lists, ahead=4):
            nnz += batch.X.nnz
        cells = batches * BATCH
    elif path == "map-style DataLoader":
        for batch in loader:
            nnz += int(batch["X"].values().numel())
        cells = batches * BATCH
    else:
        cells = 0
        for batch in ds.batches(BATCH, seed=0):
            nnz += batch.X.nnz
            cells += len(batch)
    return {"seconds": time.perf_counter() - started, "cells": cells, "nnz": nnz}


def child(root: str, path: str, batches: int, cache_bytes: int | None) -> dict:
    done = subprocess.run([sys.executable, __file__, "--measure", root, path, str(batches), str(cache_bytes)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{path} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", nargs="?")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-bytes", type=int, help="open_dataset's cache_bytes (default: its default)")
    parser.add_argument("--measure", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        root, path, batches, cache = args.measure
        print(json.dumps(measure(root, path, int(batches), None if cache == "None" else int(cache))))
        return
    if not args.dataset:
        parser.error("DATASET is required")
    for p in Path(args.dataset).rglob("*"):  # the page cache warm
        if p.is_file():
            p.read_bytes()
    runs: dict[str, list[dict]] = {p: [] for p in PATHS}
    for _ in range(args.repeats):  # alternating, so that drift touches every path alike
        for p in PATHS:
            runs[p].append(child(args.dataset, p, args.batches, args.cache_bytes))
    rate = {p: statistics.median(r["cells"] / r["seconds"] for r in runs[p]) for p in PATHS}
    same = len({runs[p][0]["nnz"] for p in PATHS[:3]}) == 1
    print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; {args.dataset}; {args.batches} random batches "
          f"of {BATCH:,} cells, medians of {args.repeats} runs, warm page cache, cache_bytes "
          f"{'default' if args.cache_bytes is None else args.cache_bytes}; same nonzeros on every gather path: "
          f"{'yes' if same else 'NO'}")
    print()
    print("| path | cells/s | x get_batch | x loader epoch |")
    print("|---|---|---|---|")
    for p in PATHS:
        print(f"| {p} | {rate[p]:,.0f} | {rate[p] / rate['get_batch']:.2f}x | {rate[p] / rate['loader epoch']:.2f}x |")


if __name__ == "__main__":
    main()
