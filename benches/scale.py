"""Every command and the loader at two sizes, to see how each grows: wall
time, peak memory, time per cell.

    .venv/bin/python benches/scale.py [--sizes 100000,1000000] [--cold] [--work DIR]

For each size, benches/make_atlas.py's inputs (the PBMC cells repeated onto
62,710 genes, files of 10,000 cells, one sample each) are made if missing,
then, each in a process of its own, timed with its peak resident memory
(GNU time's maximum RSS, or VmHWM for the Python rows):

- convert (one process), and the same as plan + 2 shards + finalize;
- append of 10,000 cells (a copy of the dataset); verify; info;
- obs localize of three columns (into an empty cache); export of 10,000 cells;
- Python: ds.batches over a full shuffled epoch (batches of 1,024, one obs
  column); get_batch of 20 random batches of 1,024 cells.

With --cold, before each timed read (the Python rows, verify, export, info)
every file of the dataset is dropped from the page cache
(posix_fadvise(POSIX_FADV_DONTNEED)), and fincore is asked that none of its
pages is left; without, the cache is as the previous step left it (warm).
Prints a table per size and the growth from the smallest size to each
other: time per cell and peak memory. Not run by the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from cold import evict

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BINARY = REPO / "target" / "release" / "deltacells"
ENV = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")


def timed(args: list[str], cold_root: Path | None = None) -> dict:
    """Runs a command under GNU time: wall seconds and peak RSS (bytes)."""
    cached = evict(cold_root) if cold_root is not None else None
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%e %M", *args], capture_output=True, text=True, env=ENV)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args[:3]))} failed: {done.stderr[-2000:]}")
    rss_kb = int(done.stderr.strip().splitlines()[-1].split()[1])
    return {"seconds": wall, "rss": rss_kb * 1024, "cached_before": cached}


def measure_loader(dataset: str, cache: str, cold: bool) -> dict:
    from loader import peak_rss

    import deltacells

    cached = evict(Path(dataset)) if cold else None
    started = time.perf_counter()
    ds = deltacells.open_dataset(dataset, cache_dir=cache, obs_columns=["cell_type"])
    cells = 0
    for batch in ds.batches(1024, obs_columns=["cell_type"]):
        batch.X.to_scipy()
        cells += len(batch)
    return {"seconds": time.perf_counter() - started, "cells": cells, "rss": peak_rss(), "cached_before": cached}


def measure_get_batch(dataset: str, cold: bool, n: int = 20) -> dict:
    from loader import peak_rss

    import deltacells

    cached = evict(Path(dataset)) if cold else None
    ds = deltacells.open_dataset(dataset)
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    for _ in range(n):
        ds.get_batch(np.sort(rng.choice(ds.n_cells, 1024, replace=False)))
    return {"seconds": time.perf_counter() - started, "cells": n * 1024, "rss": peak_rss(), "cached_before": cached}


def python_row(what: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(Path(__file__)), "--measure", what, *args], capture_output=True,
                          text=True, env=ENV)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_size(cells: int, work: Path, cold: bool) -> list[tuple[str, dict, int]]:
    """Every measurement at `cells`: (name, result, cells it concerns)."""
    made = subprocess.run([sys.executable, str(HERE / "make_atlas.py"), "--cells", str(cells), "--out",
                           str(work / "inputs")], capture_output=True, text=True, check=True)
    folder = Path(json.loads(made.stdout.strip().splitlines()[-1])["folder"])
    inputs = sorted(folder.glob("atlas_*.h5ad"))
    out = work / f"ds_{cells}"
    rows: list[tuple[str, dict, int]] = []
    shutil.rmtree(out, ignore_errors=True)
    rows.append(("convert, one process", timed([str(BINARY), "convert", "-q", *map(str, inputs), str(out)]), cells))
    sharded = work / f"sharded_{cells}"
    shutil.rmtree(sharded, ignore_errors=True)
    plan = timed([str(BINARY), "plan", "-q", *map(str, inputs), str(sharded)])
    shards = [timed([str(BINARY), "shard", "-q", "--shard", f"{k}/2", str(sharded)]) for k in range(2)]
    final = timed([str(BINARY), "finalize", "-q", str(sharded)])
    steps = [plan, *shards, final]
    rows.append(("plan + 2 shards + finalize (sum of steps)",
                 {"seconds": sum(s["seconds"] for s in steps), "rss": max(s["rss"] for s in steps)}, cells))
    shutil.rmtree(sharded, ignore_errors=True)
    copy = work / f"append_{cells}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(out, copy)
    rows.append(("append of 10,000 cells", timed([str(BINARY), "append", "-q", str(copy), str(inputs[0])]), 10_000))
    shutil.rmtree(copy, ignore_errors=True)
    cold_root = out if cold else None
    rows.append(("verify", timed([str(BINARY), "verify", "-q", str(out)], cold_root), cells))
    rows.append(("info", timed([str(BINARY), "info", str(out)], cold_root), cells))
    cache = work / f"cache_{cells}"
    shutil.rmtree(cache, ignore_errors=True)
    rows.append(("obs localize, 3 columns",
                 timed([str(BINARY), "obs", "localize", "--cache-dir", str(cache), "--columns",
                        "cell_type,donor,n_counts", str(out)], cold_root), cells))
    exported = work / f"export_{cells}.h5ad"
    rows.append(("export of 10,000 cells",
                 timed([str(BINARY), "export", "--overwrite", "--cells", f"{cells // 2}:{cells // 2 + 10_000}",
                        str(out), str(exported)], cold_root), 10_000))
    exported.unlink(missing_ok=True)
    rows.append(("ds.batches, a full epoch", python_row("loader", str(out), str(cache), str(cold)), cells))
    rows.append(("get_batch, 20 random batches of 1,024", python_row("get_batch", str(out), str(cold)), 20_480))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    manifest = json.loads((out / "manifest.json").read_text())
    nnz = sum(manifest["tile_nnz"])
    print(f"\n{cells:,} cells, {nnz:,} nonzeros, {len(inputs)} inputs; dataset {size / 2**20:,.0f} MiB "
          f"({size / nnz:.3f} bytes per nonzero), {len(manifest['tile_cells'])} tiles")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--work", default=str(REPO / "target" / "bench-atlas"))
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        sys.path.insert(0, str(HERE))
        what, rest = args.measure[0], args.measure[1:]
        if what == "loader":
            result = measure_loader(rest[0], rest[1], rest[2] == "True")
        else:
            result = measure_get_batch(rest[0], rest[1] == "True")
        print(json.dumps(result))
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {n: run_size(n, work, args.cold) for n in sizes}
    base = sizes[0]
    print(f"\npage cache: {'cold (dataset files dropped before each read)' if args.cold else 'warm'}; "
          f"{os.cpu_count()} cores")
    columns = " | ".join(f"{n:,}: s | peak MiB | us/cell" for n in sizes)
    print(f"| what | {columns} | growth per cell | memory growth |")
    print("|" + "---|" * (2 + 3 * len(sizes) + 1))
    for i, (name, _, _) in enumerate(results[base]):
        cells_cols = []
        for n in sizes:
            _, r, c = results[n][i]
            cells_cols.append(f"{r['seconds']:.2f} | {r['rss'] / 2**20:,.0f} | {r['seconds'] / c * 1e6:.2f}")
        first, last = results[base][i], results[sizes[-1]][i]
        per_cell = (last[1]["seconds"] / last[2]) / (first[1]["seconds"] / first[2])
        memory = last[1]["rss"] / first[1]["rss"]
        print(f"| {name} | " + " | ".join(cells_cols) + f" | {per_cell:.2f}x | {memory:.2f}x |")
    cached = [r.get("cached_before") for n in sizes for _, r, _ in results[n] if r.get("cached_before") is not None]
    if cached:
        print(f"\n- bytes of the dataset still in the page cache before each cold read: max {max(cached):,}")
    print(json.dumps({str(n): [(name, r) for name, r, _ in results[n]] for n in sizes}), file=sys.stderr)


if __name__ == "__main__":
    main()
