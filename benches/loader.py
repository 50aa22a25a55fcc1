"""The training loader against the Rust decode and the loaders users pick
instead, in one run.

    .venv/bin/python benches/loader.py [--copies 8] [--epochs 3] [--threads 2] [--work DIR]

On the two real PBMC files repeated COPIES times (8: 111,992 cells; the same
inputs as benches/reader.py), a full shuffled epoch in batches of 1,024 cells
with one obs column (cell_type), each batch turned into a SciPy CSR matrix:

- the Rust decode of every tile, in order, on THREADS threads (the ceiling);
- deltacells' Dataset.batches in one process (THREADS decoding threads);
- deltacells in 2 worker processes (forked, 1 thread each), each reading its
  share (worker=i, num_workers=2), timed from a common start to the last one;
- annbatch's Loader (PyPI `annbatch`, with zarrs) over the store its
  DatasetCollection builds from the same .h5ad, in a virtual environment of its
  own under the work folder, when a Python >= 3.12 is found (annbatch needs it);
- anndata's backed mode reading random batches of 1,024 (sorted) cells from
  the uncompressed .h5ad, timed on 30 batches and scaled to an epoch.

- deltacells.torch.CellDataset in torch's DataLoader (when torch is
  installed), as docs/python.md writes it: no workers, 2 workers started afresh
  each epoch (the DataLoader's default), and 2 persistent workers;
- with --baseline-python, the one-process row again with an earlier build.

Each runs in a process of its own, so that its peak RSS (VmHWM, resident
memory) is its own; each loader first reads one epoch untimed (its buffers
and the page cache warm up; that first epoch's time is printed apart), then
the median of EPOCHS more (each a different shuffle) is reported.
Not run by the tests (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BATCH = 1024


def peak_rss() -> int:
    """This process's own peak resident memory, in bytes: VmHWM, which starts
    afresh at exec (getrusage's ru_maxrss carries the parent's peak over fork
    and exec, so every child of a driver that made its inputs in memory would
    report the driver's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure_torch(dataset: str, epochs: int, cache: str, workers: int, persistent: bool) -> dict:
    """deltacells.torch.CellDataset in torch's DataLoader as docs/python.md writes
    it (batch_size=None), yielding the default dicts of tensors."""
    import torch

    from deltacells.torch import CellDataset

    data = CellDataset(dataset, batch_size=BATCH, obs_columns=["cell_type"], cache_dir=cache)
    options = dict(num_workers=workers, persistent_workers=persistent) if workers else {}
    loader = torch.utils.data.DataLoader(data, batch_size=None, **options)
    times, nnz, cells = [], 0, 0
    for epoch in range(epochs + 1):
        data.set_epoch(epoch)
        started = time.perf_counter()
        nnz = cells = 0
        for batch in loader:
            cells += batch["X"].shape[0]
            nnz += batch["X"].values().numel()
        times.append(time.perf_counter() - started)
    return {"seconds": statistics.median(times[1:]), "first": times[0], "cells": cells, "nnz": nnz, "rss": peak_rss()}


def model_vocabulary(names: list[str], size: int = 20_000) -> list[str]:
    """A model's gene list as the issue on model terms sets it: `size` genes,
    half of them the dataset's (chosen at random), half absent, shuffled."""
    rng = np.random.default_rng(0)
    present = list(rng.choice(names, size=min(size // 2, len(names)), replace=False))
    absent = [f"ENSG_ABSENT_{i}" for i in range(size - len(present))]
    mixed = present + absent
    return [mixed[i] for i in rng.permutation(len(mixed))]


def measure_deltacells(dataset: str, epochs: int, threads: int, cache: str, form: str = "{}") -> dict:
    """One process's epochs; `form` is JSON of the batches' model-terms
    options (genes "model" for model_vocabulary, or "source")."""
    import deltacells

    ds = deltacells.open_dataset(dataset, threads=threads, cache_dir=cache, obs_columns=["cell_type"])
    options = json.loads(form)
    genes = options.pop("genes", None)
    if genes is not None:
        options["genes"] = ds.vocabulary(model_vocabulary(ds.var_names or []) if genes == "model" else genes)
    total_nnz = sum(ds.manifest["tile_nnz"])
    times, nnz = [], 0
    for epoch in range(epochs + 1):
        started = time.perf_counter()
        nnz = 0
        for batch in ds.batches(BATCH, epoch=epoch, obs_columns=["cell_type"], **options):
            if isinstance(batch.X, np.ndarray):
                nnz = total_nnz  # (dense: the stored nonzeros read)
            else:
                batch.X.to_scipy()
                nnz += batch.X.nnz
        times.append(time.perf_counter() - started)
    return {"seconds": statistics.median(times[1:]), "first": times[0], "cells": ds.n_cells, "nnz": nnz,
            "rss": peak_rss()}


def _worker(dataset: str, epochs: int, cache: str, worker: int, start, results) -> None:
    import deltacells

    ds = deltacells.open_dataset(dataset, threads=1, cache_dir=cache, obs_columns=["cell_type"])
    for epoch in range(epochs + 1):
        start.wait()
        cells = nnz = 0
        for batch in ds.batches(BATCH, epoch=epoch, worker=worker, num_workers=2, obs_columns=["cell_type"]):
            batch.X.to_scipy()
            cells += len(batch)
            nnz += batch.X.nnz
        results.put((epoch, time.perf_counter(), cells, nnz))
    results.put(("rss", peak_rss(), 0, 0))


def measure_workers(dataset: str, epochs: int, cache: str) -> dict:
    import multiprocessing

    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(3), context.Queue()
    workers = [context.Process(target=_worker, args=(dataset, epochs, cache, w, start, results)) for w in range(2)]
    for p in workers:
        p.start()
    times, cells, nnz = [], 0, 0
    rss = []
    for _ in range(epochs + 1):
        start.wait()
        started = time.perf_counter()
        ends = []
        while len(ends) < len(workers):
            message = results.get()
            (rss if message[0] == "rss" else ends).append(message)
        times.append(max(e[1] for e in ends) - started)
        cells, nnz = sum(e[2] for e in ends), sum(e[3] for e in ends)
    while len(rss) < len(workers):
        rss.append(results.get())
    rss = [r[1] for r in rss]
    for p in workers:
        p.join()
    return {"seconds": statistics.median(times[1:]), "first": times[0], "cells": cells, "nnz": nnz, "rss": max(rss),
            "rss_total": sum(rss)}


def measure_ceiling(dataset: str, threads: int) -> dict:
    import deltacells

    ds = deltacells.open_dataset(dataset, threads=threads)
    runs = [ds.native.decode_all() for _ in range(5)]
    return {"seconds": statistics.median(r[0] for r in runs), "cells": runs[0][1], "nnz": runs[0][2], "rss": peak_rss()}


def measure_backed(source: str, n_batches: int = 30) -> dict:
    import anndata

    backed = anndata.read_h5ad(source, backed="r")
    n = backed.n_obs
    rng = np.random.default_rng(0)
    batches = [np.sort(rng.choice(n, size=BATCH, replace=False)) for _ in range(n_batches)]
    backed.X[batches[0]]  # the file's pages then come from the page cache, as the others' do
    started = time.perf_counter()
    nnz = 0
    for b in batches:
        nnz += backed.X[b].nnz
    per_batch = (time.perf_counter() - started) / n_batches
    return {"seconds": per_batch * n / BATCH, "cells": n, "nnz": nnz / n_batches * n / BATCH, "rss": peak_rss(),
            "note": f"{n_batches} batches, scaled to an epoch"}


def measure_annbatch(source: str, store: str, epochs: int) -> dict:
    import anndata as ad
    import zarr
    from annbatch import DatasetCollection, Loader

    zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
    built, marker = None, Path(store + ".built")
    if not marker.exists():
        shutil.rmtree(store, ignore_errors=True)
        started = time.perf_counter()
        DatasetCollection(store).add_adatas(adata_paths=[source], shuffle=True)
        built = time.perf_counter() - started
        marker.write_text(f"{built}\n")

    def load(group) -> ad.AnnData:
        return ad.AnnData(X=ad.io.sparse_dataset(group["X"]), obs=ad.io.read_elem(group["obs"])[["cell_type"]])

    times, nnz, cells = [], 0, 0
    for epoch in range(epochs + 1):
        with ad.settings.override(remove_unused_categories=False):
            loader = Loader(batch_size=BATCH, chunk_size=512, preload_nchunks=32, shuffle=True,
                            rng=np.random.default_rng(epoch))
            loader = loader.use_collection(DatasetCollection(store), load_adata=load)
        started = time.perf_counter()
        nnz = cells = 0
        for batch in loader:
            x = batch["X"]
            nnz += x.nnz
            cells += x.shape[0]
        times.append(time.perf_counter() - started)
    size = sum(f.stat().st_size for f in Path(store).rglob("*") if f.is_file())
    import annbatch

    return {"seconds": statistics.median(times[1:]), "first": times[0], "cells": cells, "nnz": nnz, "rss": peak_rss(),
            "store_bytes": size,
            "build_seconds": built, "version": annbatch.__version__}


def child(args: list[str], python: str = sys.executable) -> dict:
    """Runs one measurement in a process of its own; its result."""
    done = subprocess.run([python, str(Path(__file__)), "--measure", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def find_python312() -> str | None:
    """A Python >= 3.12 on this machine (PATH, then pyenv), or None."""
    for name in ("python3.13", "python3.12"):
        found = shutil.which(name)
        if found:
            try:
                real = subprocess.run([found, "-c", "import sys; print(sys.executable)"], capture_output=True,
                                      text=True, check=True).stdout.strip()
                return real
            except (subprocess.CalledProcessError, OSError):
                continue
    for root in sorted(Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"), "versions").glob("3.1[2-9]*")):
        if (root / "bin" / "python3").exists():
            return str(root / "bin" / "python3")
    return None


def annbatch_python(work: Path) -> tuple[str | None, str]:
    """The Python of a virtual environment with annbatch, made under `work` if
    needed; or None and why not."""
    venv = work / "venv-annbatch"
    python = venv / "bin" / "python"
    if not python.exists():
        base = find_python312()
        if base is None:
            return None, "needs Python >= 3.12; this machine has only " + sys.version.split()[0]
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", "annbatch[zarrs]", "h5py"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            return None, f"pip install annbatch[zarrs] failed: {done.stderr.strip().splitlines()[-1]}"
    version = subprocess.run([str(python), "--version"], capture_output=True, text=True).stdout.strip()
    return str(python), version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--work", default=str(HERE.parent / "target" / "bench-reader"))
    parser.add_argument("--baseline-python", help="an interpreter with an earlier build of deltacells (a row before)")
    parser.add_argument("--ours-only", action="store_true", help="the deltacells rows only (no torch, no peers)")
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.measure:
        what, *rest = args.measure
        result = {
            "deltacells": lambda: measure_deltacells(rest[0], int(rest[1]), int(rest[2]), rest[3], *rest[4:]),
            "workers": lambda: measure_workers(rest[0], int(rest[1]), rest[2]),
            "ceiling": lambda: measure_ceiling(rest[0], int(rest[1])),
            "backed": lambda: measure_backed(rest[0]),
            "annbatch": lambda: measure_annbatch(rest[0], rest[1], int(rest[2])),
            "torch": lambda: measure_torch(rest[0], int(rest[1]), rest[2], int(rest[3]), rest[4] == "persistent"),
        }[what]()
        print(json.dumps(result))
        return

    sys.path.insert(0, str(HERE))
    from pbmc_copies import make_inputs

    work = Path(args.work)
    source, dataset = make_inputs(work, args.copies)
    cache = str(work / "cache")
    e, t = str(args.epochs), str(args.threads)
    rows: list[tuple[str, dict | None, str]] = []
    ceiling = child(["ceiling", str(dataset), t])
    rows.append((f"Rust decode of every tile, in order ({t} threads)", ceiling, "the ceiling"))
    ours = child(["deltacells", str(dataset), e, t, cache])
    rows.append((f"deltacells batches, 1 process ({t} threads)", ours, ""))
    if args.baseline_python:
        before = child(["deltacells", str(dataset), e, t, cache], python=args.baseline_python)
        rows.append((f"deltacells batches, 1 process, before ({t} threads)", before, "the baseline build"))
    plain = ours["seconds"]
    for name, form in [
        ("genes=20,000-gene list, half absent", {"genes": "model"}),
        ("genes=20,000-gene list, sorted_columns=False", {"genes": "model", "sorted_columns": False}),
        ("genes='source'", {"genes": "source"}),
        ("normalize=1e4, log1p", {"normalize": 1e4, "log1p": True}),
        ("dense=True (int32 counts)", {"dense": True}),
        ("genes=20,000 list, normalize, log1p, dense", {"genes": "model", "normalize": 1e4, "log1p": True,
                                                         "dense": True}),
        ("top_k=2048", {"top_k": 2048}),
        ("genes=20,000 list, normalize, log1p, top_k=2048", {"genes": "model", "normalize": 1e4, "log1p": True,
                                                              "top_k": 2048}),
    ]:
        r = child(["deltacells", str(dataset), e, t, cache, json.dumps(form)])
        per_cell = (r["seconds"] - plain) / r["cells"] * 1e6
        rows.append((f"  {name}", r, f"{plain / r['seconds']:.2f}x the cells/s of the plain row "
                                     f"(+{per_cell:.2f} us per cell)"))
    if args.ours_only:
        print_table(args, dataset, rows, ceiling, ours)
        return
    two = child(["workers", str(dataset), e, cache])
    rows.append(("deltacells batches, 2 worker processes (1 thread each)", two,
                 f"peak RSS per worker; {two['rss_total'] / 2**20:.0f} MiB both"))
    try:
        import torch  # noqa: F401 - only whether it is there
    except ImportError:
        rows.append(("deltacells.torch DataLoader", None, "not run: torch is not installed"))
    else:
        for name, workers, persistent in [
            ("deltacells.torch DataLoader, num_workers=0", "0", ""),
            ("deltacells.torch DataLoader, 2 workers, new each epoch", "2", ""),
            ("deltacells.torch DataLoader, 2 persistent workers", "2", "persistent"),
        ]:
            r = child(["torch", str(dataset), e, cache, workers, persistent or "-"])
            rows.append((name, r, "peak RSS of the main process" if workers != "0" else ""))
    python, why = annbatch_python(work)
    if python is not None:
        theirs = child(["annbatch", str(source), str(work / "annbatch.zarr"), e], python=python)
        note = f"annbatch {theirs['version']} on {why}, chunk_size 512, preload_nchunks 32"
        if theirs.get("build_seconds"):
            note += f"; store built in {theirs['build_seconds']:.0f} s"
        rows.append(("annbatch Loader (its zarr store, zarrs)", theirs, note))
    else:
        rows.append(("annbatch Loader", None, f"not run: {why}"))
    backed = child(["backed", str(source)])
    rows.append(("anndata backed='r', random batches (sorted)", backed, backed["note"]))
    print_table(args, dataset, rows, ceiling, ours)


def print_table(args: argparse.Namespace, dataset: Path, rows: list, ceiling: dict, ours: dict) -> None:
    import deltacells

    ds = deltacells.open_dataset(str(dataset))
    print(f"{ds.n_cells:,} cells, {sum(ds.manifest['tile_nnz']):,} nonzeros ({args.copies} x PBMC ctrl + stim), "
          f"batches of {BATCH:,}, one obs column; {os.cpu_count()} cores; medians of {args.epochs} epochs after one")
    print()
    print(f"| {'loader':56} | {'epoch s':>8} | {'cells/s':>10} | {'M nnz/s':>8} | {'peak RSS':>9} | {'x ceiling':>9} |")
    print(f"|{'-' * 58}|{'-' * 10}|{'-' * 12}|{'-' * 10}|{'-' * 11}|{'-' * 11}|")
    for name, r, _ in rows:
        if r is None:
            print(f"| {name:56} | {'-':>8} | {'-':>10} | {'-':>8} | {'-':>9} | {'-':>9} |")
            continue
        s = r["seconds"]
        print(f"| {name:56} | {s:8.3f} | {r['cells'] / s:10,.0f} | {r['nnz'] / s / 1e6:8.1f} | "
              f"{r['rss'] / 2**20:6.0f} MiB | {ceiling['seconds'] / s:8.2f}x |")
    print()
    for name, r, note in rows:
        if r is not None and "first" in r:
            note = (note + "; " if note else "") + f"first epoch {r['first']:.3f} s"
        if note:
            print(f"- {name}: {note}")
    ratio = ceiling["seconds"] / ours["seconds"]
    print(f"- one process at {ratio:.2f}x the Rust decode ceiling (target >= 0.8x)")


if __name__ == "__main__":
    main()
