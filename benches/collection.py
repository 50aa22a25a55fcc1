"""A collection of datasets against one dataset holding the same cells, in one
run: the same loader settings, cells/s and peak memory.

    .venv/bin/python benches/collection.py [--copies 8] [--parts 8] [--epochs 3] [--threads 2] [--work DIR]

The input is the two real PBMC files repeated COPIES times (8: 111,992 cells,
the input of benches/loader.py), converted as one dataset, and cut into PARTS
consecutive slices of cells, each converted as a dataset of its own (the same
settings). Rows, each in a process of its own (peak RSS its own), a full
shuffled epoch in batches of 1,024 with one obs column (cell_type), each
batch made a SciPy CSR matrix, the median of EPOCHS epochs after one untimed:

- the one dataset (Dataset.batches);
- the PARTS datasets as one collection (open_collection(...).batches, genes
  the union), each part after the first with its genes in a random order of
  its own (its var permuted, converted with --gene-order-files 0 to keep
  it), so that the cells of all but the first are mapped onto the first's
  order (a lookup per entry, a sort per cell);
- the parts converted with `--gene-order-from` the first: one gene order,
  no map (the PBMC copies have the same totals, so parts converted with the
  defaults would also share one order);
- those with weights per dataset (each part's share of the epoch drawn by
  weight; equal weights here, so each cell about once, as a list).

Also measured: opening the collection (every dataset, in parallel), and a
process's first read of one cell of each dataset of a collection made from
its state (the lazy open that each DataLoader worker pays per dataset it
reads). The page cache is warm (every file was just written or read).
Not run by the tests (see docs/performance.md).
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from loader import BATCH, peak_rss  # noqa: E402


def make_parts(work: Path, source: Path, parts: int, aligned: bool) -> list[Path]:
    """`source` cut into `parts` slices of consecutive cells, each converted:
    with `aligned`, every part after the first with --gene-order-from it;
    otherwise with its genes in a random order of its own."""
    import anndata

    binary = HERE.parent / "target" / "release" / "deltacells"
    suffix = "aligned" if aligned else "permuted"
    roots = [work / f"{source.stem}_{suffix}{i}" for i in range(parts)]
    if all((r / "manifest.json").exists() for r in roots):
        return roots
    whole = anndata.read_h5ad(source)
    edges = np.linspace(0, whole.n_obs, parts + 1).astype(int)
    rng = np.random.default_rng(0)
    for i, root in enumerate(roots):
        part = whole[edges[i]:edges[i + 1]].copy()
        if not aligned and i > 0:
            part = part[:, rng.permutation(part.n_vars)].copy()
        path = work / f"{root.name}.h5ad"
        part.write_h5ad(path)
        env = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")
        order = [] if i == 0 else ["--gene-order-from", str(roots[0])] if aligned else ["--gene-order-files", "0"]
        subprocess.run([str(binary), "convert", "-q", "--overwrite", *order, str(path), str(root)], check=True,
                       env=env)
        path.unlink()
    return roots


def measure(kind: str, roots: list[str], epochs: int, threads: int, cache: str) -> dict:
    import deltacells

    if kind == "dataset":
        data = deltacells.open_dataset(roots[0], threads=threads, cache_dir=cache, obs_columns=["cell_type"])
    else:
        weights = {r: 1.0 for r in roots} if kind == "weighted" else None
        data = deltacells.open_collection(roots, threads=threads, cache_dir=cache, obs_columns=["cell_type"],
                                          weights=weights)
    times, nnz = [], 0
    for epoch in range(epochs + 1):
        started = time.perf_counter()
        nnz = 0
        for batch in data.batches(BATCH, epoch=epoch, obs_columns=["cell_type"]):
            batch.X.to_scipy()
            nnz += batch.X.nnz
        times.append(time.perf_counter() - started)
    return {"seconds": statistics.median(times[1:]), "first": times[0], "cells": data.n_cells, "nnz": nnz,
            "rss": peak_rss()}


def measure_open(roots: list[str], threads: int) -> dict:
    """Opening the collection (every dataset), then, in a copy made from its
    state (as a worker gets it), the first read of one cell of each dataset."""
    import deltacells

    started = time.perf_counter()
    coll = deltacells.open_collection(roots, threads=threads)
    opened = time.perf_counter() - started
    lazy = coll._copy(threads)
    firsts = []
    for m in lazy.datasets:
        started = time.perf_counter()
        lazy.get_batch([m.start])
        firsts.append(time.perf_counter() - started)
    again = []
    for m in lazy.datasets:
        started = time.perf_counter()
        lazy.get_batch([m.start])
        again.append(time.perf_counter() - started)
    return {"open": opened, "first_read": statistics.median(firsts), "read_again": statistics.median(again),
            "state_bytes": len(coll._state)}


def child(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, str(Path(__file__)), "--measure", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--parts", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--work", default=str(HERE.parent / "target" / "bench-reader"))
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        what, rest = args.measure[0], args.measure[1:]
        if what == "open":
            result = measure_open(json.loads(rest[0]), int(rest[1]))
        else:
            result = measure(what, json.loads(rest[0]), int(rest[1]), int(rest[2]), rest[3])
        print(json.dumps(result))
        return

    from pbmc_copies import make_inputs

    work = Path(args.work)
    source, dataset = make_inputs(work, args.copies)
    parts = [str(p) for p in make_parts(work, source, args.parts, aligned=False)]
    aligned = [str(p) for p in make_parts(work, source, args.parts, aligned=True)]
    cache, e, t = str(work / "cache"), str(args.epochs), str(args.threads)
    one = child(["dataset", json.dumps([str(dataset)]), e, t, cache])
    rows = [
        ("one dataset (Dataset.batches)", one),
        (f"{args.parts} datasets, genes in {args.parts} orders", child(["collection", json.dumps(parts), e, t, cache])),
        (f"{args.parts} datasets, one gene order", child(["collection", json.dumps(aligned), e, t, cache])),
        (f"{args.parts} datasets, one gene order, weights", child(["weighted", json.dumps(aligned), e, t, cache])),
    ]
    opening = child(["open", json.dumps(parts), t])
    print(f"{one['cells']:,} cells ({args.copies} x PBMC ctrl + stim), batches of {BATCH:,}, one obs column; "
          f"{os.cpu_count()} cores, {args.threads} threads; medians of {args.epochs} epochs after one; page cache warm")
    print()
    print(f"| {'loader':50} | {'epoch s':>8} | {'cells/s':>10} | {'x one dataset':>13} | {'peak RSS':>9} |")
    print(f"|{'-' * 52}|{'-' * 10}|{'-' * 12}|{'-' * 15}|{'-' * 11}|")
    for name, r in rows:
        s = r["seconds"]
        print(f"| {name:50} | {s:8.3f} | {r['cells'] / s:10,.0f} | {one['seconds'] / s:12.2f}x | "
              f"{r['rss'] / 2**20:6.0f} MiB |")
    print()
    print(f"- opening the collection of {args.parts} (every manifest and gene list, in parallel): "
          f"{opening['open'] * 1e3:.1f} ms; its state, pickled to each worker: {opening['state_bytes']:,} bytes")
    print(f"- a worker's first read from a dataset (opens it, checks its manifest digest, maps its genes): "
          f"{opening['first_read'] * 1e3:.2f} ms median; a read once it is open: {opening['read_again'] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
