"""How well the loader's batches mix cells of different samples, and what it
costs, on a dataset whose inputs each hold one sample.

    .venv/bin/python benches/shuffle_quality.py [--work DIR] [--copies 4] [--epochs 3]
        [--convert-rounds 1] [--baseline-python PATH] [--json OUT]

The input is the way atlases are converted: one input per sample, one after
another. The two real PBMC files are written COPIES times each (4: 8 inputs,
55,996 cells), alternating, each with its own `sample` label (s0, s1, ...), and
converted in that order by `deltacells convert` (target/release/deltacells, or
$DELTACELLS_BIN) with its default settings, so every sample fills about one
tile.

The same inputs are also converted with `--shuffle 0` (the cells of all
inputs stored in a random order): first a table of the two conversions'
time (median of --convert-rounds runs each, alternating, page cache warm)
and size, then the loader rows marked "shuffled dataset" read that one.

The rows "balance" and "weights" draw their epochs (with replacement, as many cells as the
dataset has): every sample equally likely, then samples weighted from 60 to
1; their entropy is against uniformly random batches all the same, so the
weighted row is below 1.0 by design.

For each loader setting, in a process of its own: one untimed epoch, then
EPOCHS epochs in batches of 1,024 with the `sample` column, each batch made a
SciPy CSR matrix. Per batch, the entropy of its sample labels; the table gives
their mean divided by the mean for uniformly random batches of the same size
(1.0: as mixed as random; computed here from random permutations of the same
labels), the 5th percentile over batches on the same scale, the mean number of
distinct samples per batch, cells/s (the median epoch) and the process's peak
resident memory (VmHWM, its own high-water mark).

With --baseline-python, the same measurement also runs with another
interpreter whose `deltacells` package is an earlier build (for example the
last release, installed into another virtual environment), for a before and
after in one run. Not run by the tests (see docs/benchmarks/mixing.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BATCH = 1024

#: (name, keyword arguments of Dataset.batches, which dataset)
SETTINGS: list[tuple[str, dict, str]] = [
    ("in order (shuffle=False)", dict(shuffle=False), "ordered"),
    ("window 4, mix 4 (the old defaults)", dict(window_tiles=4, mix_chunks=4), "ordered"),
    ("window 4, mix 16", dict(window_tiles=4, mix_chunks=16), "ordered"),
    ("window 8, mix 8", dict(window_tiles=8, mix_chunks=8), "ordered"),
    ("window 8, mix 16 (defaults)", dict(), "ordered"),
    ("window 8, mix 32", dict(window_tiles=8, mix_chunks=32), "ordered"),
    ("window 16, mix 32", dict(window_tiles=16, mix_chunks=32), "ordered"),
    ("defaults, balance='sample' (drawn)", dict(balance="sample"), "ordered"),
    ("defaults, weights (s0 weighs 60x s7)", dict(weights="ramp"), "ordered"),
    ("shuffled dataset, defaults", dict(), "shuffled"),
    ("shuffled dataset, in order (shuffle=False)", dict(shuffle=False), "shuffled"),
    ("shuffled dataset, window 1, mix 1", dict(window_tiles=1, mix_chunks=1), "shuffled"),
]


def dataset_bytes(root: Path) -> tuple[int, int]:
    """Bytes of a dataset's tiles, and of everything."""
    files = [p for p in root.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files if p.parent.name == "tiles"), sum(p.stat().st_size for p in files)


def child_hwm(pid: int) -> int:
    """A running process's peak resident memory so far (VmHWM), in bytes; 0
    once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def time_conversions(work: Path, inputs: list[str], rounds: int) -> list[dict]:
    """Converts the inputs in order and with --shuffle 0, alternating, ROUNDS
    times each; the median seconds and the sizes of each."""
    binary = os.environ.get("DELTACELLS_BIN", str(REPO / "target" / "release" / "deltacells"))
    env = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")
    times: dict[str, list[float]] = {"ordered": [], "shuffled": []}
    peaks: dict[str, int] = {}
    for _ in range(rounds):
        for which, extra in (("ordered", []), ("shuffled", ["--shuffle", "0", "--spill-dir", str(work)])):
            started = time.perf_counter()
            child = subprocess.Popen([binary, "convert", "-q", "--overwrite", *extra, *inputs, str(work / which)],
                                     env=env)
            peak = 0
            while child.poll() is None:
                peak = max(peak, child_hwm(child.pid))
                time.sleep(0.05)
            times[which].append(time.perf_counter() - started)
            if child.returncode != 0:
                raise SystemExit(f"convert failed ({child.returncode})")
            peaks[which] = max(peaks.get(which, 0), peak)
    rows = []
    for which, seconds in times.items():
        tiles, total = dataset_bytes(work / which)
        rows.append({"dataset": which, "seconds": statistics.median(seconds), "tile_bytes": tiles,
                     "bytes": total, "peak_rss": peaks[which]})
    return rows


def vm_hwm() -> int:
    """This process's own peak resident memory, in bytes (VmHWM: unlike
    ru_maxrss, not carried over from the parent across fork and exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def entropy(codes: np.ndarray, n_labels: int) -> float:
    counts = np.bincount(codes, minlength=n_labels)
    p = counts[counts > 0] / codes.size
    return float(-(p * np.log(p)).sum())


def make_inputs(work: Path, copies: int) -> list[str]:
    """The sample-ordered inputs, written once under `work`."""
    import anndata
    import pandas as pd
    import scipy.sparse

    inputs_dir = work / f"inputs_x{copies}"
    paths = [inputs_dir / f"sample_{i}.h5ad" for i in range(2 * copies)]
    if all(p.exists() for p in paths):
        return [str(p) for p in paths]
    inputs_dir.mkdir(parents=True, exist_ok=True)
    pbmc = [anndata.read_h5ad(REPO / "data" / "pbmc" / f"pbmc_{n}.h5ad") for n in ("ctrl", "stim")]
    inputs = []
    for i in range(2 * copies):
        part = pbmc[i % 2].copy()
        part.obs = pd.DataFrame(
            {"sample": pd.Categorical([f"s{i}"] * part.n_obs)},
            index=[f"{name}-{i}" for name in part.obs_names],
        )
        part.X = scipy.sparse.csr_matrix(part.X, dtype=np.float32)
        path = inputs_dir / f"sample_{i}.h5ad"
        part.write_h5ad(path)
        inputs.append(str(path))
    return inputs


def measure(dataset: str, cache: str, epochs: int, options: dict) -> dict:
    """One setting, in this process: the entropy of every batch of EPOCHS
    epochs after an untimed one, and their time."""
    import deltacells

    ds = deltacells.open_dataset(dataset, cache_dir=cache, obs_columns=["sample"])
    n_labels = len(ds.obs.categories("sample"))
    if options.get("weights") == "ramp":
        # Sample s_i's cells weigh 60 ** (1 - i / 7): s0's 60 times s7's.
        codes = np.asarray(ds.obs.take(range(ds.n_cells), ["sample"])["sample"], dtype=np.float64)
        options = dict(options, weights=60.0 ** (1 - codes / (n_labels - 1)))
    entropies, distinct, times = [], [], []
    for epoch in range(epochs + 1):
        started = time.perf_counter()
        epoch_entropies, epoch_distinct = [], []
        for batch in ds.batches(BATCH, epoch=epoch, obs_columns=["sample"], **options):
            batch.X.to_scipy()
            codes = np.asarray(batch.obs["sample"], dtype=np.int64)
            epoch_entropies.append((entropy(codes, n_labels), len(codes)))
            epoch_distinct.append(len(np.unique(codes)))
        times.append(time.perf_counter() - started)
        if epoch > 0:
            entropies += epoch_entropies
            distinct += epoch_distinct
    return {
        "entropies": entropies,
        "distinct": distinct,
        "seconds": statistics.median(times[1:]),
        "first": times[0],
        "cells": ds.n_cells,
        "rss": vm_hwm(),
    }


def random_entropy(labels: np.ndarray, n_labels: int, rounds: int = 5) -> dict[int, float]:
    """Mean entropy of the batches of uniformly random permutations, by batch size."""
    rng = np.random.default_rng(0)
    by_size: dict[int, list[float]] = {}
    for _ in range(rounds):
        order = rng.permutation(labels)
        for start in range(0, order.size, BATCH):
            part = order[start:start + BATCH]
            by_size.setdefault(part.size, []).append(entropy(part, n_labels))
    return {size: float(np.mean(v)) for size, v in by_size.items()}


def run_setting(python: str, dataset: Path, cache: Path, epochs: int, options: dict) -> dict:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import shuffle_quality as q; "
        "print(json.dumps(q.measure(sys.argv[2], sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[5]))))"
    )
    out = subprocess.run(
        [python, "-c", code, str(Path(__file__).parent), str(dataset), str(cache), str(epochs), json.dumps(options)],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(REPO / "target" / "bench-shuffle"))
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--convert-rounds", type=int, default=1)
    parser.add_argument("--baseline-python", help="an interpreter with an earlier build of deltacells")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()

    import deltacells

    work = Path(args.work) / f"x{args.copies}"
    inputs = make_inputs(Path(args.work), args.copies)
    conversions = time_conversions(work, inputs, args.convert_rounds)
    print(f"| conversion of {len(inputs)} inputs | seconds (median of {args.convert_rounds}) | x in order "
          f"| tile bytes | x in order | all bytes | peak RSS |")
    print("|---|---|---|---|---|---|---|")
    base = conversions[0]
    for c in conversions:
        print(f"| {c['dataset']:<8} | {c['seconds']:.1f} | {c['seconds'] / base['seconds']:.2f} | "
              f"{c['tile_bytes']:,} | {c['tile_bytes'] / base['tile_bytes']:.3f} | {c['bytes']:,} "
              f"| {c['peak_rss'] / 2**20:.0f} MiB |", flush=True)
    datasets = {"ordered": work / "ordered", "shuffled": work / "shuffled"}
    dataset = datasets["ordered"]
    cache = work / "cache"
    ds = deltacells.open_dataset(str(dataset), cache_dir=str(cache), obs_columns=["sample"])
    n_labels = len(ds.obs.categories("sample"))
    labels = np.asarray(ds.obs.take(range(ds.n_cells), ["sample"])["sample"], dtype=np.int64)
    random = random_entropy(labels, n_labels)
    print(f"{ds.n_cells:,} cells of {n_labels} samples in {ds.n_tiles} tiles; batches of {BATCH}; "
          f"random batches' mean entropy {random[BATCH]:.3f} (log {n_labels} = {math.log(n_labels):.3f})")

    runs = []
    if args.baseline_python:
        runs.append(("before: " + SETTINGS[1][0], args.baseline_python, {}, "ordered"))
    runs += [(name, sys.executable, options, which) for name, options, which in SETTINGS]
    rows = []
    header = f"| {'loader setting':<40} | entropy / random | 5th pct | samples per batch | cells/s | peak RSS |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for name, python, options, which in runs:
        r = run_setting(python, datasets[which], cache, args.epochs, options)
        ratios = np.array([e / random[n] for e, n in r["entropies"]])
        row = {
            "setting": name,
            "options": options,
            "entropy_ratio": float(ratios.mean()),
            "p5": float(np.percentile(ratios, 5)),
            "samples_per_batch": float(np.mean(r["distinct"])),
            "cells_per_s": r["cells"] / r["seconds"],
            "first_epoch_s": r["first"],
            "rss_mib": r["rss"] / 2**20,
        }
        rows.append(row)
        print(f"| {name:<40} | {row['entropy_ratio']:>16.3f} | {row['p5']:>7.3f} | {row['samples_per_batch']:>17.2f} "
              f"| {row['cells_per_s']:>7,.0f} | {row['rss_mib']:>4.0f} MiB |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"cells": ds.n_cells, "samples": n_labels, "conversions": conversions, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
