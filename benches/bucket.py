"""The loader and get_batch reading a dataset from a bucket, slow or not,
against the same dataset on local disk with a cold page cache, in one run.

    .venv/bin/python benches/bucket.py DATASET [--latency-ms 50] [--mbps 100] [--epochs 2] [--batches 5]

DATASET (a local dataset folder) is uploaded to moto's S3 server on
127.0.0.1 (tests/servers/serve.py s3), and read three ways, each in a
process of its own:

- local: from DATASET, every file of it dropped from the page cache first;
- S3: from the bucket, straight;
- S3, slow: from the bucket through a proxy that makes every request wait
  LATENCY_MS and shares one link of MBPS megabytes (10^6 bytes) per second
  among the bodies coming back (the model of benches/remote.sh's HTTP store).

Each reads EPOCHS shuffled epochs with `ds.batches` (batches of 1,024, the
loader's defaults) and BATCHES random `get_batch` batches of 1,024 cells.
The proxy counts the requests and bytes of each reading (opening the
dataset included). With --epochs 0 only the random batches are read, and
the table gives each batch's time (the first, which reads the tiles'
indexes, and the median of the rest), that median in round trips of the
slow link, and the requests and bytes a batch. Prints a table; not run by
the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BATCH = 1024
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


class SlowLink:
    """A TCP proxy on 127.0.0.1 to `upstream`: what a client sends waits
    `latency` seconds before it is passed on (a request, here, comes in one
    piece: it waits once), and what comes back shares one link of
    `bytes_per_second`. Counts the pieces sent up and the bytes sent down."""

    def __init__(self, upstream: int, latency: float, bytes_per_second: float) -> None:
        self.upstream, self.latency, self.rate = upstream, latency, bytes_per_second
        self.requests = 0
        self.bytes = 0
        self.link_free_at = 0.0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            client_w.close()
            return

        async def up() -> None:
            while data := await client_r.read(1 << 16):
                self.requests += 1
                await asyncio.sleep(self.latency)
                up_w.write(data)
                await up_w.drain()
            up_w.close()

        async def down() -> None:
            while data := await up_r.read(1 << 16):
                self.bytes += len(data)
                if self.rate:
                    now = self.loop.time()
                    start = max(now, self.link_free_at)
                    self.link_free_at = start + len(data) / self.rate
                    await asyncio.sleep(self.link_free_at - now)
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        await asyncio.gather(up(), down(), return_exceptions=True)

    def counts(self) -> tuple[int, int]:
        return self.requests, self.bytes


def upload(dataset: Path, endpoint: str, prefix: str) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                      region_name="us-east-1")
    for path in sorted(dataset.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), "test", f"{prefix}/{path.relative_to(dataset)}")


def measure(root: str, endpoint: str, epochs: int, batches: int) -> dict:
    """In this process: `epochs` shuffled epochs, then `batches` random batches."""
    import numpy as np

    import deltacells

    started = time.perf_counter()
    ds = deltacells.open_dataset(root, **({"endpoint": endpoint} if endpoint else {}))
    opened = time.perf_counter() - started
    times = []
    cells = 0
    for epoch in range(epochs):
        started = time.perf_counter()
        cells = 0
        for batch in ds.batches(BATCH, seed=epoch):
            batch.X.to_scipy()
            cells += len(batch)
        times.append(time.perf_counter() - started)
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    each = []
    for _ in range(batches):
        drawn = np.sort(rng.choice(ds.n_cells, BATCH, replace=False))
        began = time.perf_counter()
        ds.get_batch(drawn).to_scipy()
        each.append(time.perf_counter() - began)
    random_seconds = time.perf_counter() - started
    return {"open": opened, "epochs": times, "cells": cells, "random_seconds": random_seconds,
            "batch_seconds": each}


def child(root: str, endpoint: str, epochs: int, batches: int) -> dict:
    done = subprocess.run([sys.executable, str(Path(__file__)), "--measure", root, endpoint, str(epochs),
                           str(batches)], capture_output=True, text=True, env={**os.environ, **S3_ENV})
    if done.returncode != 0:
        raise RuntimeError(f"reading {root} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", nargs="?")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--mbps", type=float, default=100.0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--measure", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        root, endpoint, epochs, batches = args.measure
        print(json.dumps(measure(root, endpoint, int(epochs), int(batches))))
        return
    if not args.dataset:
        parser.error("DATASET (a local dataset folder) is required")
    sys.path.insert(0, str(HERE))
    from cold import evict

    dataset = Path(args.dataset).resolve()
    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "servers" / "serve.py"), "s3"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline() if server.stdout else ""
        port = int(line.split()[1])
        direct = f"http://127.0.0.1:{port}"
        upload(dataset, direct, "ds")
        slow = SlowLink(port, args.latency_ms / 1000, args.mbps * 1e6)
        fast = SlowLink(port, 0.0, 0.0)  # (counts the requests and bytes only)
        rows = {}
        left = evict(dataset)
        rows["local disk, cold page cache"] = (child(str(dataset), "", args.epochs, args.batches), None)
        before = fast.counts()
        result = child("s3://test/ds", f"http://127.0.0.1:{fast.port}", args.epochs, args.batches)
        rows["moto S3 on 127.0.0.1"] = (result, tuple(b - a for a, b in zip(before, fast.counts(), strict=True)))
        before = slow.counts()
        result = child("s3://test/ds", f"http://127.0.0.1:{slow.port}", args.epochs, args.batches)
        rows[f"the same, {args.latency_ms:g} ms a request, {args.mbps:g} MB/s"] = (
            result, tuple(b - a for a, b in zip(before, slow.counts(), strict=True)))
    finally:
        if server.stdin:
            server.stdin.close()
        server.wait(timeout=30)
    size = sum(p.stat().st_size for p in dataset.rglob("*") if p.is_file())
    first = next(iter(rows.values()))[0]
    print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; {dataset.name}: {first['cells']:,} cells, "
          f"{size / 1e6:,.1f} MB; {args.epochs} shuffled epochs (ds.batches, batches of {BATCH:,}) and "
          f"{args.batches} random get_batch batches of {BATCH:,}; local bytes left cached before: {left:,}")
    print()
    if args.epochs == 0:
        # Random batches alone: what each costs in time, requests and round trips.
        latency = args.latency_ms / 1000
        print("| store | random get_batch cells/s | first batch s | median batch s (2nd on) | "
              "median / latency | requests a batch | MB a batch |")
        print("|---|---|---|---|---|---|---|")
        for name, (r, counts) in rows.items():
            times = r["batch_seconds"]
            median = statistics.median(times[1:] or times)
            slow = name.startswith("the same")
            per = "- | -" if counts is None else (f"{counts[0] / args.batches:,.1f} | "
                                                  f"{counts[1] / 1e6 / args.batches:,.2f}")
            print(f"| {name} | {args.batches * BATCH / r['random_seconds']:,.0f} | {times[0]:.3f} | {median:.3f} | "
                  f"{f'{median / latency:.1f}' if slow else '-'} | {per} |")
        return
    print("| store | open s | first epoch cells/s | last epoch cells/s | x local | random get_batch cells/s | "
          "requests | MB fetched |")
    print("|---|---|---|---|---|---|---|---|")
    local = first["cells"] / first["epochs"][0]
    for name, (r, counts) in rows.items():
        speeds = [r["cells"] / t for t in r["epochs"]]
        fetched = "-" if counts is None else f"{counts[0]:,} | {counts[1] / 1e6:,.1f}"
        print(f"| {name} | {r['open']:.2f} | {speeds[0]:,.0f} | {speeds[-1]:,.0f} | {speeds[0] / local:.2f}x | "
              f"{args.batches * BATCH / r['random_seconds']:,.0f} | {'- | -' if counts is None else fetched} |")


if __name__ == "__main__":
    main()
