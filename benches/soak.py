"""Long runs: the training loaders over many epochs, for an hour or more, with
their resident memory, threads and open files sampled as they go.

    .venv/bin/python benches/soak.py [--minutes 60] [--interval 60] [--cells 30000]
                                     [--only loader,map] [--data DATASET | --out DIR [--keep]]
                                     [--json soak.json]
    .venv/bin/python benches/soak.py --report soak.json

Every configuration runs in a process of its own, all at once, each reading
epoch after epoch until MINUTES have passed:

- loader: ``ds.batches`` in one process (1 decoding thread), local;
- torch-persistent: ``deltacells.torch.CellDataset`` in a torch DataLoader
  with 2 workers, ``persistent_workers=True``, local;
- torch-respawn: the same with ``persistent_workers=False`` (the DataLoader's
  default: the workers are started afresh every epoch);
- loader-s3: ``ds.batches`` in one process, from moto's S3 server on
  127.0.0.1 (started by this script and stopped at the end);
- map: ``deltacells.torch.CellMapDataset`` drawn by a ``RandomSampler`` in
  batches of 256, DataLoader with 2 workers started afresh every epoch, local;
- map-s3: the same from the S3 server.

A monitor (this process) samples every INTERVAL seconds the resident memory
(VmRSS; RssAnon too), threads and open file descriptors (/proc/PID/fd) of
each configuration's process summed with its child processes (the
DataLoader's workers). Every sample is taken at the same point of an epoch,
so that what comes and goes within one (the loader's threads, workers
started afresh, batches in flight between processes) does not pass for
growth: asked for a sample, a configuration pauses at the middle batch of
its current or next epoch, is sampled, and goes on (the pause is not
counted in its epoch's time). The first sample is taken so in the second
epoch: the value at the end of the first.
Values are checked too: each batch's shape, each row's sum of counts
against that cell's sum in the first epoch, each cell read once an epoch,
the obs column of each cell the same every epoch, and every epoch's total
the first one's.

The growth of each measure is (its largest value after the first epoch -
its value at the end of the first epoch) / its value at the end of the first
epoch. Open fds are counted apart from shared-memory ones (/dev/shm, memfd):
those are the batches in flight between DataLoader workers and the main
process at the moment of the sample, bounded but never the same number
twice, so theirs is a trend: the median of the last third of the samples
against the first third's; so are the other fds of a process with workers
(the pipes torch passes each batch's descriptors through follow the batches
in flight too). A configuration passes when each growth (each trend, for
those) is within 5% and every value checks. ``--report JSON`` prints a
recorded run's report again. Prints a table of samples per configuration and a summary; writes the
raw samples and epochs as JSON. The dataset: CELLS atlas cells
(benches/make_atlas.py, from the PBMC files of ../shared/data/fetch-pbmc.sh)
converted by ``deltacells convert`` in tiles of 2,500; or DATASET as it is.
Not run by the tests (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
BATCH = 1024
MAP_BATCH = 256
OBS_COLUMN = "cell_type"
LIMIT = 5.0  # % growth allowed after the first epoch
MEASURES = ("rss", "threads", "fds")
SETTLE = 2.0  # seconds a paused configuration is left before it is sampled


@dataclass(frozen=True)
class Config:
    """One configuration: what reads (``batches``, ``torch`` or ``map``),
    from where, with how many DataLoader workers."""

    label: str
    kind: str
    s3: bool = False
    workers: int = 0
    persistent: bool = False


CONFIGS: dict[str, Config] = {
    "loader": Config("ds.batches, 1 process, local", "batches"),
    "torch-persistent": Config("CellDataset, 2 persistent workers, local", "torch", workers=2, persistent=True),
    "torch-respawn": Config("CellDataset, 2 workers new each epoch, local", "torch", workers=2),
    "loader-s3": Config("ds.batches, 1 process, S3 (moto)", "batches", s3=True),
    "map": Config(f"CellMapDataset, RandomSampler, {MAP_BATCH}, 2 workers, local", "map", workers=2),
    "map-s3": Config(f"CellMapDataset, RandomSampler, {MAP_BATCH}, 2 workers, S3", "map", s3=True, workers=2),
}


# ---------------------------------------------------------------- the readers


def epochs_of(config: Config, root: str, cache: str, endpoint: str) -> tuple[int, Callable[[int], Iterator]]:
    """(the dataset's cells, a function giving epoch e's batches as
    (cells, indptr, data, n_columns, obs codes)) for one configuration."""
    import deltacells

    store = {"endpoint": endpoint} if endpoint else {}
    if config.kind == "batches":
        ds = deltacells.open_dataset(root, obs_columns=[OBS_COLUMN], cache_dir=cache, threads=1, **store)

        def plain(epoch: int) -> Iterator:
            for b in ds.batches(BATCH, epoch=epoch, obs_columns=[OBS_COLUMN]):
                yield b.cells, b.X.indptr, b.X.data, b.X.shape[1], b.obs[OBS_COLUMN]

        return ds.n_cells, plain

    import torch

    from deltacells.torch import CellDataset, CellMapDataset, collate

    workers = dict(num_workers=config.workers, persistent_workers=config.persistent) if config.workers else {}
    if config.kind == "torch":
        data = CellDataset(root, batch_size=BATCH, obs_columns=[OBS_COLUMN], threads=1, cache_dir=cache, **store)
        loader = torch.utils.data.DataLoader(data, batch_size=None, **workers)
        n_cells = deltacells.open_dataset(root, cache_dir=cache, threads=1, **store).n_cells
    else:
        data = CellMapDataset(root, obs_columns=[OBS_COLUMN], threads=1, cache_dir=cache, **store)
        sampler = torch.utils.data.RandomSampler(data, generator=torch.Generator().manual_seed(0))
        loader = torch.utils.data.DataLoader(data, batch_size=MAP_BATCH, sampler=sampler, collate_fn=collate,
                                             **workers)
        n_cells = len(data)

    def tensors(epoch: int) -> Iterator:
        if config.kind == "torch":
            data.set_epoch(epoch)
        for b in loader:
            x = b["X"]
            yield (b["cells"].numpy(), x.crow_indices().numpy(), x.values().numpy(), x.shape[1],
                   b["obs"][OBS_COLUMN].numpy())

    return n_cells, tensors


class Requests:
    """What the monitor asks of a configuration's process, on its stdin:
    ``sample`` (pause at the middle of an epoch to be sampled) and ``go``
    (the sample is taken)."""

    def __init__(self) -> None:
        self.sample, self.go = threading.Event(), threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        # os.read, not sys.stdin: a DataLoader worker forked while this
        # thread waits in sys.stdin's buffered read would inherit its lock
        # held, and hang closing sys.stdin as multiprocessing starts it.
        pending = b""
        while chunk := os.read(0, 4096):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                (self.sample if line.strip() == b"sample" else self.go).set()

    def pause(self, epoch: int) -> float:
        """Says the process is at the middle of ``epoch``, waits for the
        sample to be taken; returns the seconds paused."""
        started = time.perf_counter()
        self.sample.clear()
        print(json.dumps({"sample": epoch}), flush=True)
        self.go.wait(timeout=120)
        self.go.clear()
        return time.perf_counter() - started


def run_config(name: str, root: str, cache: str, endpoint: str, deadline: float) -> None:
    """Reads epochs of configuration ``name`` until ``deadline`` (time.time()),
    checking every batch; prints one JSON line per epoch, and pauses at the
    middle of an epoch when the monitor asks for a sample (always in the
    second epoch: the sample at the end of the first)."""
    config = CONFIGS[name]
    requests = Requests()
    n_cells, epoch_batches = epochs_of(config, root, cache, endpoint)
    n_genes, middle = -1, -1
    sums = np.full(n_cells, np.nan)  # each cell's sum of counts, from the first epoch
    codes = np.full(n_cells, -1, dtype=np.int64)
    first_total = None
    for epoch in count():
        started = time.perf_counter()
        paused = 0.0
        seen = np.zeros(n_cells, dtype=np.int64)
        total, batches, wrong = 0.0, 0, []
        for cells, indptr, data, n_columns, obs in epoch_batches(epoch):
            if batches == middle and (epoch == 1 or requests.sample.is_set()):
                paused += requests.pause(epoch)
            batches += 1
            n_genes = n_columns if n_genes < 0 else n_genes
            if len(indptr) != len(cells) + 1 or n_columns != n_genes or len(obs) != len(cells):
                wrong.append(f"batch {batches}: {len(cells)} cells, indptr {len(indptr)}, {n_columns} genes, "
                             f"{len(obs)} obs values")
                continue
            running = np.concatenate(([0.0], np.cumsum(data, dtype=np.float64)))
            rows = running[indptr[1:]] - running[indptr[:-1]]
            total += running[-1]
            np.add.at(seen, cells, 1)
            if epoch == 0:
                sums[cells], codes[cells] = rows, obs
            elif not (np.array_equal(rows, sums[cells]) and np.array_equal(obs, codes[cells])):
                wrong.append(f"batch {batches}: row sums or obs differ from the first epoch's")
        seconds = time.perf_counter() - started - paused
        middle = batches // 2 if middle < 0 else middle
        if not np.all(seen == 1):
            wrong.append(f"{int(np.sum(seen == 0))} cells not read, {int(np.sum(seen > 1))} read more than once")
        first_total = total if first_total is None else first_total
        if total != first_total:
            wrong.append(f"total {total:.0f}, the first epoch's {first_total:.0f}")
        print(json.dumps({"epoch": epoch, "seconds": seconds, "cells": int(seen.sum()), "batches": batches,
                          "total": total, "wrong": wrong[:5]}), flush=True)
        if time.time() >= deadline:
            return


# ---------------------------------------------------------------- the monitor


def children() -> dict[int, list[int]]:
    """Every process's children, from /proc/*/stat."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2:].split()[1])
        tree.setdefault(parent, []).append(int(entry))
    return tree


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    tree, found, todo = children(), [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(tree.get(p, []))
    return found


def shared_memory(target: str) -> bool:
    """Whether an fd's link is a shared-memory segment (a batch in flight
    between a DataLoader worker and the main process)."""
    return target.startswith(("/dev/shm/", "memfd:"))


def usage(pid: int) -> dict[str, int] | None:
    """VmRSS, RssAnon (bytes), threads, open fds other than shared memory,
    and shared-memory fds of one process; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        fds, shm = 0, 0
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed since it was listed
                continue
            fds, shm = (fds, shm + 1) if shared_memory(target) else (fds + 1, shm)
    except (OSError, ValueError):
        return None
    if "VmRSS" not in status:  # a zombie
        return None
    kib = {k: int(status[k].split()[0]) * 1024 for k in ("VmRSS", "RssAnon")}
    return {"rss": kib["VmRSS"], "anon": kib["RssAnon"], "threads": int(status["Threads"]), "fds": fds,
            "shm": shm}


def sample(pid: int, expected: int, patience: float = 10.0) -> dict[str, int] | None:
    """The sums over ``pid``'s process tree, once it has ``expected``
    processes (waiting up to ``patience`` seconds for workers between two
    epochs); None when ``pid`` is gone."""
    waited_until = time.monotonic() + patience
    while True:
        parts = [u for u in map(usage, process_tree(pid)) if u is not None]
        if not parts or usage(pid) is None:
            return None
        if len(parts) >= expected or time.monotonic() >= waited_until:
            out = {k: sum(u[k] for u in parts) for k in ("rss", "anon", "threads", "fds", "shm")}
            out["processes"] = len(parts)
            return out
        time.sleep(0.05)


class Run:
    """One configuration's process, its epochs as it reports them, and its
    samples, taken when it says it has paused at the middle of an epoch."""

    def __init__(self, name: str, root: str, cache: str, endpoint: str, deadline: float, log: Path) -> None:
        self.name, self.config = name, CONFIGS[name]
        self.epochs: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.log = log
        self.started = time.time()
        env = {**os.environ, **S3_ENV, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", name, root, cache, endpoint or "-",
             repr(deadline)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if not line.startswith("{"):
                continue
            message = json.loads(line)
            if "sample" in message:
                self._take(message["sample"])
                self.tell("go")
            else:
                self.epochs.append(message)

    def _take(self, epoch: int) -> None:
        time.sleep(SETTLE)  # the batches in flight between processes reach their bound
        got = sample(self.process.pid, 1 + self.config.workers)
        if got is not None:
            self.samples.append({"t": time.time() - self.started, "epoch": epoch, "epochs": len(self.epochs),
                                 **got})

    def tell(self, what: str) -> None:
        """Writes a request to the process (ignored once it has ended)."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(what + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def running(self) -> bool:
        return self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.process.returncode


@dataclass
class Recorded:
    """A configuration's run as a JSON report recorded it (``--report``)."""

    name: str
    config: Config
    epochs: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    returncode: int | None
    log: Path | None = None


def monitor(runs: list[Run], interval: float) -> None:
    """Asks every run for a sample every ``interval`` seconds until every
    run's process has ended."""
    next_tick = time.time() + interval
    while any(r.running() for r in runs):
        if time.time() >= next_tick:
            for r in runs:
                if r.running():
                    r.tell("sample")
            next_tick += interval
        time.sleep(0.2)
    for r in runs:
        r.process.wait()
        r.reader.join()


# ---------------------------------------------------------------- the data


def find_binary() -> str:
    """The deltacells binary: $DELTACELLS_BIN, this clone's release build, or the one on PATH."""
    for candidate in (os.environ.get("DELTACELLS_BIN"), REPO / "target" / "release" / "deltacells",
                      Path(sys.executable).parent / "deltacells", shutil.which("deltacells")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    sys.exit("soak: no deltacells binary (cargo build --release, or set DELTACELLS_BIN)")


def make_dataset(work: Path, cells: int) -> Path:
    """CELLS atlas cells as one .h5ad, converted in tiles of 2,500; the .h5ad removed."""
    atlas = work / "atlas"
    subprocess.run([sys.executable, str(HERE / "make_atlas.py"), "--cells", str(cells), "--per-file",
                    str(min(cells, 10_000)), "--one-file", "--out", str(atlas)], check=True, stdout=subprocess.DEVNULL)
    dataset = work / "dataset"
    env = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")
    subprocess.run([find_binary(), "convert", "-q", "--overwrite", "--tile-size", "2500",
                    str(atlas / str(cells) / "atlas.h5ad"), str(dataset)], check=True, env=env)
    shutil.rmtree(atlas)
    return dataset


def upload(dataset: Path, endpoint: str, prefix: str) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                      region_name="us-east-1")
    for path in sorted(dataset.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), "test", f"{prefix}/{path.relative_to(dataset)}")


class S3Server:
    """moto's S3 server on 127.0.0.1 (tests/servers/serve.py s3), stopped by :meth:`stop`."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, str(REPO / "tests" / "servers" / "serve.py"), "s3"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline() if self.process.stdout else ""
        if not line.startswith("PORT "):
            self.stop()
            sys.exit(f"soak: the S3 server did not start: {line!r}")
        self.endpoint = f"http://127.0.0.1:{line.split()[1]}"

    def stop(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# ---------------------------------------------------------------- the report


def trend(values: list[int]) -> tuple[float, float, float]:
    """(median of the first third, median of the last third, their change in
    %) of a measure's samples."""
    third = max(1, len(values) // 3)
    first, last = float(np.median(values[:third])), float(np.median(values[-third:]))
    change = (last - first) / first * 100 if first else (0.0 if last == 0 else 100.0)
    return first, last, change


def summarize(run: Run | Recorded) -> dict[str, Any]:
    """Epochs, cells/s, values checked, and each measure after the first epoch.

    Memory and threads pass when their largest value after the first epoch
    is within 5% of their value at its end. The open fds of a process with
    DataLoader workers are judged by their trend instead (the median of the
    last third of the samples against the first third's): besides the
    shared-memory segments, the workers hold the pipes through which torch
    passes each batch's file descriptors, so the count at the moment of a
    sample follows the batches in flight (bounded, never the same twice);
    a leak would show as a trend. Shared-memory fds likewise."""
    epochs = run.epochs
    steady = epochs[1:] or epochs
    seconds = sum(e["seconds"] for e in steady)
    wrong = [w for e in epochs for w in e["wrong"]]
    out: dict[str, Any] = {
        "epochs": len(epochs), "cells_per_s": sum(e["cells"] for e in steady) / seconds if seconds else 0.0,
        "values_ok": not wrong and run.returncode == 0, "wrong": wrong[:10],
        "returncode": run.returncode,
    }
    after = run.samples  # (every one in the middle of an epoch after the first, the first in the second)
    ok = out["values_ok"] and len(after) >= 2
    for m in MEASURES:
        if not after:
            out[m] = None
            continue
        base, values = after[0][m], [s[m] for s in after]
        growth = (max(values) - base) / base * 100 if base else 0.0
        first, last, change = trend(values)
        by_trend = m == "fds" and run.config.workers > 0
        out[m] = {"end_of_epoch_1": base, "min": min(values), "max": max(values), "last": values[-1],
                  "growth_pct": growth, "trend_pct": change, "judged_by": "trend" if by_trend else "max"}
        ok = ok and (change if by_trend else growth) <= LIMIT
    shm = [s.get("shm", 0) for s in after]
    if len(shm) >= 3 and max(shm) > 0:
        first, last, change = trend(shm)
        out["shm"] = {"min": min(shm), "max": max(shm), "first_third": first, "last_third": last,
                      "trend_pct": change}
        ok = ok and change <= LIMIT
    else:
        out["shm"] = None
    out["pass"] = ok
    return out


def print_report(runs: list[Run] | list[Recorded], summaries: dict[str, dict[str, Any]], header: str) -> None:
    print(header)
    for r in runs:
        print()
        print(f"### {r.name}: {r.config.label}")
        print()
        print("| min | in epoch | processes | RSS MiB | anon MiB | threads | fds | shared-memory fds |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for s in r.samples:
            print(f"| {s['t'] / 60:.1f} | {s['epoch'] + 1} | {s['processes']} | {s['rss'] / 2**20:.1f} | "
                  f"{s['anon'] / 2**20:.1f} | {s['threads']} | {s['fds']} | {s.get('shm', 0)} |")
        if r.returncode and r.log is not None:
            print(f"\nexited with status {r.returncode}; the end of its log:\n")
            print(r.log.read_text()[-3000:])
    print()
    print("## Summary (after the first epoch: the value at its end; min, max, last; growth = (max - end of "
          "epoch 1) / end of epoch 1)")
    print()
    print("| config | epochs | cells/s | values | RSS MiB: epoch 1, min-max, last | growth | threads: epoch 1, "
          "min-max, last | growth | fds: epoch 1, min-max, last | growth | shared-memory fds: min-max, "
          "median of first and last third | trend | within 5% |")
    print("|---|---:|---:|---|---|---:|---|---:|---|---:|---|---:|---|")
    for r in runs:
        s = summaries[r.name]
        cells = [f"| {r.name} | {s['epochs']:,} | {s['cells_per_s']:,.0f} | {'same' if s['values_ok'] else 'WRONG'} |"]
        for m in MEASURES:
            v = s[m]
            if v is None:
                cells.append(" - | - |")
                continue
            scale = 2**20 if m == "rss" else 1
            f = ".1f" if m == "rss" else ".0f"
            judged = f" (trend {v['trend_pct']:+.1f}%)" if v.get("judged_by") == "trend" else ""
            cells.append(f" {v['end_of_epoch_1'] / scale:{f}}, {v['min'] / scale:{f}}-{v['max'] / scale:{f}}, "
                         f"{v['last'] / scale:{f}} | {v['growth_pct']:+.1f}%{judged} |")
        shm = s["shm"]
        cells.append(" - | - |" if shm is None else f" {shm['min']}-{shm['max']}, {shm['first_third']:.1f}, "
                     f"{shm['last_third']:.1f} | {shm['trend_pct']:+.1f}% |")
        cells.append(f" {'PASS' if s['pass'] else 'FAIL'} |")
        print("".join(cells))
    for r in runs:
        for w in summaries[r.name]["wrong"]:
            print(f"- {r.name}: {w}")


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0, help="how long every configuration reads (60)")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between two samples (60)")
    parser.add_argument("--cells", type=int, default=30_000, help="atlas cells of the generated dataset (30,000)")
    parser.add_argument("--only", help=f"configurations to run, comma-separated (default all: {', '.join(CONFIGS)})")
    parser.add_argument("--data", help="an existing dataset folder to read (neither generated nor removed)")
    parser.add_argument("--out", help="folder for the generated dataset, caches and logs (default: a new "
                                      "temporary folder); what the run makes there is removed unless --keep")
    parser.add_argument("--keep", action="store_true", help="keep the generated dataset, caches and logs")
    parser.add_argument("--json", default="soak.json", help="where to write the raw samples and epochs (soak.json)")
    parser.add_argument("--report", metavar="JSON", help="print the report of a run recorded in JSON again (with "
                                                         "this script's rules), instead of running")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.report:
        recorded = json.loads(Path(args.report).read_text())
        runs = [Recorded(name, CONFIGS[name], c["epochs"], c["samples"], c["summary"]["returncode"])
                for name, c in recorded["configs"].items()]
        summaries = {r.name: summarize(r) for r in runs}
        print_report(runs, summaries, recorded["header"])
        sys.exit(0 if all(s["pass"] for s in summaries.values()) else 1)
    if args.child:
        name, root, cache, endpoint, deadline = args.child
        run_config(name, root, cache, "" if endpoint == "-" else endpoint, float(deadline))
        return
    names = list(CONFIGS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        parser.error(f"--only: unknown configuration {', '.join(unknown) or '(none)'}; "
                     f"choose from {', '.join(CONFIGS)}")
    made_out = args.out is None or not Path(args.out).exists()
    work = Path(args.out or tempfile.mkdtemp(prefix="deltacells-soak-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    server = None
    try:
        if args.data:
            dataset = Path(args.data).resolve()
        else:
            started = time.time()
            dataset = make_dataset(work, args.cells)
            made.append(dataset)
            print(f"# made {dataset} in {time.time() - started:.0f} s", file=sys.stderr)
        endpoint = ""
        if any(CONFIGS[n].s3 for n in names):
            server = S3Server()
            endpoint = server.endpoint
            upload(dataset, endpoint, "soak")
        for n in names:
            made.append(work / f"cache-{n}")
            made.append(work / f"{n}.log")
        started = time.time()
        deadline = started + args.minutes * 60
        runs = [Run(n, "s3://test/soak" if CONFIGS[n].s3 else str(dataset), str(work / f"cache-{n}"),
                    endpoint if CONFIGS[n].s3 else "", deadline, work / f"{n}.log") for n in names]
        monitor(runs, args.interval)
        elapsed = time.time() - started
    finally:
        if server is not None:
            server.stop()
    summaries = {r.name: summarize(r) for r in runs}
    import deltacells

    ds = deltacells.open_dataset(str(dataset))
    header = (f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime(started))} UTC, {os.cpu_count()} cores, "
              f"{elapsed / 60:.1f} minutes, sampled every {args.interval:g} s; {ds.n_cells:,} cells x "
              f"{ds.n_genes:,} genes, {sum(ds.manifest['tile_nnz']):,} nonzeros in {len(ds.manifest['tile_nnz'])} "
              f"tiles; loaders with 1 decoding thread")
    print_report(runs, summaries, header)
    Path(args.json).write_text(json.dumps({
        "header": header, "args": {k: v for k, v in vars(args).items() if k != "child"},
        "configs": {r.name: {"label": r.config.label, "epochs": r.epochs, "samples": r.samples,
                             "summary": summaries[r.name]} for r in runs},
    }, indent=1) + "\n")
    if not args.keep:
        for path in made:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists():
                path.unlink()
        if made_out:
            shutil.rmtree(work, ignore_errors=True)
    if not all(s["pass"] for s in summaries.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
