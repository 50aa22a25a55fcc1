"""Reading from Python, against the Rust decode and anndata, in one run.

    .venv/bin/python benches/reader.py [--copies 8] [--threads 2] [--work DIR]

Makes a dataset of the two real PBMC files repeated COPIES times (8: 111,992
cells), with the default settings of `deltacells convert`, and an uncompressed
.h5ad of the same cells for anndata; then prints a table:

- the Rust decode of every tile, in order, on THREADS threads (the ceiling);
- a sequential pass through Python (read_tile of every tile);
- random batches of 32 cells (only the chunks that hold them are decoded);
- random batches of 1,024 cells (get_batch, without and with a tile cache that
  holds every decoded tile), against anndata's backed mode on
  the .h5ad (indices sorted, as h5py needs) and anndata's in-memory CSR;
- obs.take of 5,000 random cells for 3 columns (median of 200).

Needs the deltacells package (pip install ./python), anndata, and the
binary (cargo build --release). Not run by the tests (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from pbmc_copies import make_inputs


def consume(results) -> None:
    """Runs a loop whose results are used and dropped one by one, as a training
    loop does (keeping them all would measure the allocator instead)."""
    for _ in results:
        pass


def timed(f, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        f()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--work", default=str(Path(__file__).resolve().parents[1] / "target" / "bench-reader"))
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args()

    import anndata

    import deltacells

    work = Path(args.work)
    source, dataset = make_inputs(work, args.copies)

    ds = deltacells.open_dataset(str(dataset), threads=args.threads, cache_dir=str(work / "cache"))
    ds.obs.localize(["obs_names", "cell_type", "n_genes"])
    n = ds.n_cells
    nnz_total = int(ds.manifest["tile_nnz"] and sum(ds.manifest["tile_nnz"]))
    rows = []

    def row(name: str, seconds: float, cells: float, nnz: float, note: str = "") -> None:
        rows.append((name, seconds, cells / seconds, nnz / seconds / 1e6, note))

    # the Rust ceiling and the Python pass, alternated, medians of 5
    rust, python = [], []
    for _ in range(5):
        seconds, cells, nnz = ds.native.decode_all()
        rust.append(seconds)
        python.extend(timed(lambda: consume(ds.read_tile(t) for t in range(ds.n_tiles)), 1))
    row(f"Rust decode of every tile ({args.threads} threads)", statistics.median(rust), n, nnz_total)
    row("Python: read_tile of every tile", statistics.median(python), n, nnz_total)

    rng = np.random.default_rng(0)
    batches = [rng.integers(0, n, size=1024) for _ in range(args.batches)]
    nnz_of = [int(ds.get_batch(b).nnz) for b in batches[:3]]
    mean_nnz = float(np.mean(nnz_of))
    ours = timed(lambda: consume(ds.get_batch(b).to_scipy() for b in batches), 1)[0] / len(batches)
    row("deltacells get_batch, random 1,024", ours, 1024, mean_nnz)

    # a small batch: only the chunks holding its cells are decoded, against
    # decoding every tile it touches whole
    small = [rng.integers(0, n, size=32) for _ in range(args.batches)]
    limits = np.cumsum(ds.tile_cells)
    small_nnz = float(np.mean([ds.get_batch(b).nnz for b in small[:3]]))
    partial = timed(lambda: consume(ds.get_batch(b) for b in small), 1)[0] / len(small)
    touched = [np.unique(np.searchsorted(limits, b, side="right")) for b in small]
    whole = timed(lambda: consume(ds.read_tile(int(t)) for ts in touched for t in ts), 1)[0] / len(small)
    row("deltacells get_batch, random 32", partial, 32, small_nnz, "only their chunks")
    row("  (the tiles those 32 touch, decoded whole)", whole, 32, small_nnz, "")

    def with_tile_cache() -> float:
        # (a function of its own: the cached tiles go when it returns)
        warm = deltacells.open_dataset(str(dataset), threads=args.threads, cache_bytes=2**30)
        warm.get_batch(range(n))  # fills the tile cache
        return timed(lambda: consume(warm.get_batch(b).to_scipy() for b in batches), 1)[0] / len(batches)

    cached = with_tile_cache()
    row("deltacells get_batch, random 1,024, cache_bytes=1 GiB", cached, 1024, mean_nnz, "after one pass")

    backed = anndata.read_h5ad(source, backed="r")
    few = batches[: max(3, len(batches) // 10)]
    backed.X[np.sort(few[0])]  # the file's pages are then in the page cache, as ours are
    theirs = statistics.median(timed(lambda: consume(backed.X[np.sort(b)] for b in few), 3)) / len(few)
    row("anndata backed='r', random 1,024 (sorted)", theirs, 1024, mean_nnz)
    backed.file.close()

    memory = anndata.read_h5ad(source).X.tocsr()
    in_memory = timed(lambda: consume(memory[b] for b in batches), 1)[0] / len(batches)
    row("anndata in memory, CSR row indexing", in_memory, 1024, mean_nnz)

    cells = rng.integers(0, n, size=5000)
    take = statistics.median(timed(lambda: ds.obs.take(cells, ["obs_names", "cell_type", "n_genes"]), 200))

    print(f"{n:,} cells, {nnz_total:,} nonzeros ({args.copies} x PBMC ctrl + stim); {args.threads} threads; "
          f"dataset {sum(ds.manifest['tile_bytes']) / 2**20:.1f} MiB, .h5ad {source.stat().st_size / 2**20:.1f} MiB")
    print()
    print(f"| {'what':54} | {'seconds':>9} | {'cells/s':>11} | {'M nonzeros/s':>12} |")
    print(f"|{'-' * 56}|{'-' * 11}|{'-' * 13}|{'-' * 14}|")
    for name, seconds, cps, mnz, _ in rows:
        print(f"| {name:54} | {seconds:9.4f} | {cps:11,.0f} | {mnz:12.1f} |")
    print()
    print(f"Python pass / Rust decode: {statistics.median(rust) / statistics.median(python):.2f}x (target >= 0.85x)")
    print(f"get_batch / anndata backed: {theirs / ours:.2f}x, "
          f"with the tile cache {theirs / cached:.1f}x (target >= 10x)")
    print(f"get_batch / anndata in memory: {in_memory / ours:.2f}x")
    print(f"obs.take of 5,000 cells, 3 columns: {take * 1e3:.3f} ms (median of 200; target <= 1 ms)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
