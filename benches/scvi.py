"""scvi-tools' epoch from a deltacells dataset against its own AnnData paths.

    .venv/bin/python benches/scvi.py [--epochs 3] [--train-epochs 3] [--torch-threads 1] [--work DIR]

On the same cells (the two real PBMC files in data/pbmc, 13,999 cells x
14,053 genes, a "condition" column ctrl/stim as scvi-tools' batch key; or,
without them, the 1,000 bundled cells of examples/pbmc_1k.h5ad), three
ways scvi-tools gets its training batches (train_size=0.9, batches of 128,
dense float32 counts and batch codes):

- deltacells: deltacells.scvi.DataModule over the dataset deltacells.convert
  made of the files;
- AnnData in memory: scvi-tools' own path, setup_anndata and its
  DataSplitter (AnnDataLoader) over the files read whole and concatenated;
- AnnData backed: the same over the concatenated .h5ad opened with
  backed="r" (X read from the file for each batch).

For each, in a process of its own (its peak RSS its own):

- a loader epoch: every training batch of one epoch, as the model gets it
  (the median of EPOCHS epochs after one untimed);
- a training epoch: scvi.model.SCVI (n_latent 10, the defaults) trained
  TRAIN_EPOCHS epochs from that path, timed per epoch by a Lightning
  callback (the median of the epochs after the first); torch on
  TORCH_THREADS threads (on 2 cores a second OpenMP thread spins against the
  reader's threads).

annbatch's data module is not measured: annbatch needs Python >= 3.12 (the
package index offers no version for 3.11, this environment's Python), and
scvi-tools 1.4.2 has no AnnbatchDataModule (its docs show one from 1.5).
Not run by the tests (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# This file is named scvi.py: Python puts its folder first on the path, where
# `import scvi` would find the file itself rather than scvi-tools.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
BATCH = 128
PATHS = ("deltacells", "anndata-memory", "anndata-backed")


def peak_rss() -> int:
    """This process's own peak resident memory, in bytes (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def make_inputs(work: Path) -> tuple[Path, Path, str]:
    """The concatenated .h5ad (uncompressed, for backed reading) and the
    deltacells dataset of the same cells; which cells they are."""
    import anndata
    import numpy as np
    import pandas as pd

    import deltacells

    work.mkdir(parents=True, exist_ok=True)
    combined, dataset = work / "cells.h5ad", work / "cells"
    pbmc = [REPO / "data" / "pbmc" / f"pbmc_{c}.h5ad" for c in ("ctrl", "stim")]
    if all(p.is_file() for p in pbmc):
        sources, label = list(zip(pbmc, ("ctrl", "stim"), strict=True)), "the PBMC files (data/pbmc)"
    else:
        sources, label = [(REPO / "examples" / "pbmc_1k.h5ad", "ctrl")], "the bundled 1,000 cells"
    if not (combined.is_file() and (dataset / "manifest.json").is_file()):
        inputs = []
        for path, condition in sources:
            adata = anndata.read_h5ad(path)
            adata.obs = pd.DataFrame({"condition": pd.Categorical([condition] * adata.n_obs,
                                                                  categories=["ctrl", "stim"])},
                                     index=adata.obs_names)
            inputs.append(work / f"{condition}.h5ad")
            adata.write_h5ad(inputs[-1])
        joined = anndata.concat([anndata.read_h5ad(p) for p in inputs], index_unique="-")
        joined.X = joined.X.astype(np.float32)
        joined.write_h5ad(combined)
        deltacells.convert(inputs, dataset, overwrite=True, progress=False)
    return combined, dataset, label


class EpochTimer:
    """Wall time of each training epoch (a Lightning callback, made once
    lightning is imported)."""

    @staticmethod
    def make():  # noqa: ANN205
        import lightning.pytorch as pl

        class Timer(pl.Callback):
            def __init__(self) -> None:
                self.times: list[float] = []
                self.started = 0.0

            def on_train_epoch_start(self, trainer, module) -> None:  # noqa: ANN001
                self.started = time.perf_counter()

            def on_train_epoch_end(self, trainer, module) -> None:  # noqa: ANN001
                self.times.append(time.perf_counter() - self.started)

        return Timer()


def measure(path: str, combined: str, dataset: str, epochs: int, train_epochs: int, torch_threads: int) -> dict:
    import anndata
    import scvi
    import torch

    torch.set_num_threads(torch_threads)
    scvi.settings.seed = 0
    opened = time.perf_counter()
    if path == "deltacells":
        from deltacells.scvi import DataModule

        cache = str(Path(dataset).parent / "cache")
        data = DataModule(dataset, BATCH, batch_key="condition", train_size=0.9, cache_dir=cache)
        loader, make_model = data.train_dataloader, lambda: scvi.model.SCVI(registry=data.registry)
        train_options: dict = {"datamodule": data}
    else:
        adata = anndata.read_h5ad(combined, backed="r" if path == "anndata-backed" else None)
        scvi.model.SCVI.setup_anndata(adata, batch_key="condition")
        manager = scvi.model.SCVI(adata).adata_manager
        splitter = scvi.dataloaders.DataSplitter(manager, train_size=0.9, batch_size=BATCH)
        splitter.setup()
        loader, make_model = splitter.train_dataloader, lambda: scvi.model.SCVI(adata)
        train_options = {"train_size": 0.9, "batch_size": BATCH}
    opened = time.perf_counter() - opened
    times, cells = [], 0
    train_loader = loader()
    for _ in range(epochs + 1):
        started = time.perf_counter()
        cells = 0
        for batch in train_loader:
            assert batch["X"].dtype == torch.float32
            cells += batch["X"].shape[0]
        times.append(time.perf_counter() - started)
    result = {"path": path, "open": opened, "loader": statistics.median(times[1:]), "loader_first": times[0],
              "cells": cells}
    if train_epochs:
        timer = EpochTimer.make()
        model = make_model()
        model.train(max_epochs=train_epochs, accelerator="cpu", enable_progress_bar=False, callbacks=[timer],
                    **train_options)
        result["train"] = statistics.median(timer.times[1:] or timer.times)
        result["train_first"] = timer.times[0]
        result["elbo"] = float(model.history["elbo_train"].to_numpy(dtype=float).ravel()[-1])
    result["rss"] = peak_rss()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3, help="timed loader epochs (after one untimed)")
    parser.add_argument("--train-epochs", type=int, default=3, help="training epochs (0: none)")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--work", default=str(REPO / "target" / "bench-scvi"))
    parser.add_argument("--measure", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        path, combined, dataset, epochs, train_epochs, threads = args.measure
        print(json.dumps(measure(path, combined, dataset, int(epochs), int(train_epochs), int(threads))))
        return
    combined, dataset, label = make_inputs(Path(args.work))
    print(f"scvi-tools' training batches of {BATCH} from {label}; torch on {args.torch_threads} thread(s)",
          file=sys.stderr)
    rows = []
    for path in PATHS:
        done = subprocess.run(
            [sys.executable, str(Path(__file__)), "--measure", path, str(combined), str(dataset), str(args.epochs),
             str(args.train_epochs), str(args.torch_threads)],
            capture_output=True, text=True,
        )
        if done.returncode != 0:
            sys.exit(f"{path}: {done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"  {path}: done", file=sys.stderr)
    base = rows[1]
    print("| path | open (s) | loader epoch (s) | vs in memory | first loader epoch (s) | training epoch (s) "
          "| vs in memory | last ELBO | peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        train = "- | - | -"
        if "train" in r:
            train = f"{r['train']:.1f} | {r['train'] / base['train']:.2f}x | {r['elbo']:.0f}"
        print(f"| {r['path']} | {r['open']:.2f} | {r['loader']:.3f} | {r['loader'] / base['loader']:.2f}x | "
              f"{r['loader_first']:.3f} | {train} | {r['rss'] / 2**20:.0f} MiB |")
    print(f"\n({rows[0]['cells']:,} training cells an epoch; medians of {args.epochs} loader epochs after one, and "
          f"of {max(1, args.train_epochs - 1)} training epochs after the first)")


if __name__ == "__main__":
    main()
