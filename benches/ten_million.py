"""Ten million cells, built as users build them and read every way, with the
same reads at 100,000 and 1,000,000 cells in the same run, to see what grows.

    .venv/bin/python benches/ten_million.py [--cells 10000000] [--block 1000000] [--member 100000]
                                            [--s3-cells 204800] [--work DIR] [--keep]

The cells are benches/make_atlas.py's (the PBMC cells repeated onto 62,710
genes; files of 10,000 cells, one sample each; obs sample, donor, cell_type,
condition, n_counts and the cell names). The inputs are made one BLOCK at a
time and deleted once used, so the disk never holds more than one block of
them. For each block, each step in a process of its own, timed with its
peak memory (GNU time's maximum RSS):

- the default dataset: `convert` of the first block, `append` of each next;
- the random-access dataset (`--chunks 1024`), the same way;
- the collection: each MEMBER cells of the block converted as a dataset.

Then, at 100,000 cells (the first member, and the first 100,000 cells with
--chunks 1024), at BLOCK cells (after the first block) and at CELLS, every
read below in a process of its own; "cold" means every file of the store
was dropped from the page cache first (posix_fadvise, checked with
fincore), "warm" that every file was read once just before:

- open_dataset, cold: seconds, and the resident memory it added;
- info, verify, obs localize of three columns (seconds, cache bytes),
  export of 10,000 cells: cold;
- a full shuffled epoch of `ds.batches` (batches of 1,024, one obs
  column), one process, cold: cells/s and peak memory;
- 20 random `get_batch` batches of 1,024 cells, cold and warm, from the
  default and the random-access dataset, each by the first process on the
  machine to gather from the store (every tile it touches read whole for
  its CRC) and by a later one (those tiles' checks remembered in the cache
  folder);
- open_collection over the members so far (cold; seconds, memory added)
  and a full shuffled epoch of it (cold);
- the loader reading S3_CELLS cells of a shuffled epoch from moto's S3
  server on 127.0.0.1 through a link that makes each request wait 50 ms
  and carries 100 MB/s (benches/bucket.py's proxy), after an upload of the
  dataset (at BLOCK and CELLS only).

Prints a table of every figure at each size with the growth per decade
(per cell for times, as is for memory), and the raw results as JSON on
stderr. Disk: one block's inputs (6.3 GB a million cells) plus the three
stores (about 1.3 GB a million cells each) plus, during the S3 rows, a copy
of the largest store in the server's temporary files. Every cache is kept
under WORK/cache. Deleted at the end unless --keep. Not run by the tests.
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BINARY = REPO / "target" / "release" / "deltacells"
ENV = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")
BATCH = 1024
sys.path.insert(0, str(HERE))


def rss_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def size_of(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def timed(args: list[str], cold: list[Path] | None = None) -> dict:
    """Runs a command under GNU time: wall seconds and peak RSS (bytes)."""
    from cold import evict

    left = sum(evict(p) for p in cold) if cold else None
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%e %M", *map(str, args)], capture_output=True, text=True,
                          env=ENV)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args[:3]))} failed: {done.stderr[-2000:]}")
    rss_kb = int(done.stderr.strip().splitlines()[-1].split()[1])
    return {"seconds": wall, "rss": rss_kb * 1024, "cached_before": left}


def warm(root: Path) -> None:
    """Reads every file of `root` once, so that it is in the page cache."""
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


# The Python rows: each runs in a child process (`--measure KIND ARGS`).

def measure(kind: str, args: list[str]) -> dict:
    import numpy as np
    from loader import peak_rss

    import deltacells

    before = rss_now()
    started = time.perf_counter()
    if kind == "collection":
        ds = deltacells.open_collection(json.loads(args[0]), obs_columns=["cell_type"], cache_dir=args[1])
    elif kind == "collection-open":
        ds = deltacells.open_collection(json.loads(args[0]))
    elif kind == "s3":
        ds = deltacells.open_dataset(args[0], endpoint=args[1])
    elif kind == "gathers":  # (args: store, seed, the cache folder with its record of checked tiles)
        ds = deltacells.open_dataset(args[0], cache_dir=args[2])
    else:
        ds = deltacells.open_dataset(args[0], obs_columns=["cell_type"] if kind == "epoch" else None,
                                     cache_dir=args[1] if kind == "epoch" else None)
    opened = time.perf_counter() - started
    result = {"open_seconds": opened, "open_rss": rss_now() - before}
    if kind in ("open", "collection-open"):
        return result
    started = time.perf_counter()
    cells = 0
    if kind in ("epoch", "collection"):
        for batch in ds.batches(BATCH, obs_columns=["cell_type"]):
            batch.X.to_scipy()
            cells += len(batch)
    elif kind == "s3":
        limit = int(args[2])
        for batch in ds.batches(BATCH):
            batch.X.to_scipy()
            cells += len(batch)
            if cells >= limit:
                break
    else:  # gathers
        rng = np.random.default_rng(int(args[1]))
        for _ in range(20):
            ds.get_batch(np.sort(rng.choice(ds.n_cells, BATCH, replace=False))).to_scipy()
            cells += BATCH
    seconds = time.perf_counter() - started
    return {**result, "seconds": seconds, "cells": cells, "rss": peak_rss()}


def python_row(kind: str, *args: str, env: dict | None = None, cold: list[Path] | None = None) -> dict:
    from cold import evict

    left = sum(evict(p) for p in cold) if cold else None
    done = subprocess.run([sys.executable, str(Path(__file__)), "--measure", kind, *args], capture_output=True,
                          text=True, env={**ENV, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"{kind} failed: {done.stderr[-2000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "cached_before": left}


def s3_row(dataset: Path, cells: int) -> dict:
    """Uploads `dataset` to a fresh moto server and reads `cells` cells of a
    shuffled epoch through a link of 50 ms a request and 100 MB/s."""
    from bucket import S3_ENV, SlowLink, upload

    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "servers" / "serve.py"), "s3"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int((server.stdout.readline() if server.stdout else "").split()[1])
        started = time.perf_counter()
        upload(dataset, f"http://127.0.0.1:{port}", "ds")
        uploaded = time.perf_counter() - started
        link = SlowLink(port, 0.050, 100e6)
        result = python_row("s3", "s3://test/ds", f"http://127.0.0.1:{link.port}", str(cells), env=S3_ENV)
        requests, fetched = link.counts()
        return {**result, "upload_seconds": uploaded, "requests": requests, "bytes": fetched}
    finally:
        if server.stdin:
            server.stdin.close()
        server.wait(timeout=120)


def reads(cells: int, ds: Path, random: Path, members: list[Path], work: Path, s3_cells: int) -> dict:
    """Every read at one size."""
    rows: dict[str, dict] = {}
    rows["open_dataset"] = python_row("open", str(ds), cold=[ds])
    rows["info"] = timed([BINARY, "info", ds], cold=[ds])
    rows["verify"] = timed([BINARY, "verify", "-q", ds], cold=[ds])
    cache = work / "obs-cache"
    shutil.rmtree(cache, ignore_errors=True)
    rows["obs localize, 3 columns"] = {
        **timed([BINARY, "obs", "localize", "--cache-dir", cache, "--columns", "cell_type,donor,n_counts", ds],
                cold=[ds]),
        "cache_bytes": size_of(cache)}
    exported = work / "export.h5ad"
    middle = cells // 2
    rows["export of 10,000 cells"] = timed([BINARY, "export", "--overwrite", "--cells",
                                            f"{middle}:{middle + 10_000}", ds, exported], cold=[ds])
    exported.unlink(missing_ok=True)
    shutil.rmtree(cache, ignore_errors=True)
    rows["loader epoch"] = python_row("epoch", str(ds), str(cache), cold=[ds])
    shutil.rmtree(cache, ignore_errors=True)
    for name, store in (("default", ds), ("random-access", random)):
        # The first process on the machine to gather from these tiles (an
        # empty record of checked tiles: each tile touched is read whole for
        # its CRC), then a later one (the tiles it touches were checked)
        checked = work / f"checked-{name}"
        shutil.rmtree(checked, ignore_errors=True)
        rows[f"gathers, {name}, cold"] = python_row("gathers", str(store), "1", str(checked), cold=[store])
        rows[f"gathers, {name}, cold, checked before"] = python_row("gathers", str(store), "3", str(checked),
                                                                    cold=[store])
        shutil.rmtree(checked, ignore_errors=True)
        warm(store)
        rows[f"gathers, {name}, warm"] = python_row("gathers", str(store), "2", str(checked))
        rows[f"gathers, {name}, warm, checked before"] = python_row("gathers", str(store), "4", str(checked))
        shutil.rmtree(checked, ignore_errors=True)
    listing = json.dumps([str(m) for m in members])
    rows["collection epoch"] = python_row("collection", listing, str(cache), cold=members)
    rows["open_collection"] = python_row("collection-open", listing, cold=members)
    shutil.rmtree(cache, ignore_errors=True)
    if s3_cells and cells >= s3_cells:
        rows["S3, 50 ms a request"] = s3_row(ds, s3_cells)
    rows["_store"] = {"bytes": size_of(ds), "random_bytes": size_of(random), "members": len(members),
                      "nnz": sum(json.loads((ds / "manifest.json").read_text())["tile_nnz"])}
    return rows


def make_block(start: int, cells: int, inputs: Path) -> tuple[list[Path], float]:
    started = time.perf_counter()
    made = subprocess.run([sys.executable, str(HERE / "make_atlas.py"), "--start", str(start), "--cells",
                           str(cells), "--out", str(inputs)], capture_output=True, text=True, check=True)
    folder = Path(json.loads(made.stdout.strip().splitlines()[-1])["folder"])
    return sorted(folder.glob("atlas_*.h5ad")), time.perf_counter() - started


def build(args: argparse.Namespace, work: Path) -> dict:
    """Makes the three stores block by block, running the reads at MEMBER
    and BLOCK cells on the way; returns every figure."""
    ds, random, members_dir = work / "default", work / "random-access", work / "members"
    for p in (ds, random, members_dir, work / "inputs"):
        shutil.rmtree(p, ignore_errors=True)
    members_dir.mkdir(parents=True)
    results: dict = {"blocks": [], "reads": {}}
    members: list[Path] = []
    per_file = 10_000
    for start in range(0, args.cells, args.block):
        cells = min(args.block, args.cells - start)
        inputs, made = make_block(start, cells, work / "inputs")
        block: dict = {"start": start, "cells": cells, "make_seconds": made}
        if start == 0:
            block["default"] = timed([BINARY, "convert", "-q", *inputs, ds])
            block["random-access"] = timed([BINARY, "convert", "-q", "--chunks", "1024", *inputs, random])
        else:
            block["default"] = timed([BINARY, "append", "-q", ds, *inputs])
            block["random-access"] = timed([BINARY, "append", "-q", random, *inputs])
        per_member = args.member // per_file
        converts = []
        for first in range(0, len(inputs), per_member):
            member = members_dir / f"m_{len(members):03d}"
            converts.append(timed([BINARY, "convert", "-q", *inputs[first:first + per_member], member]))
            members.append(member)
        block["members"] = {"seconds": sum(c["seconds"] for c in converts),
                            "rss": max(c["rss"] for c in converts), "count": len(converts),
                            "first": converts[0]}
        results["blocks"].append(block)
        print(json.dumps({k: v for k, v in block.items()}), file=sys.stderr, flush=True)
        if start == 0:
            small = work / "random-access-small"
            shutil.rmtree(small, ignore_errors=True)
            timed([BINARY, "convert", "-q", "--chunks", "1024", *inputs[:per_member], small])
            results["reads"][args.member] = reads(args.member, members[0], small, members[:1], work, 0)
            shutil.rmtree(small, ignore_errors=True)
            if cells == args.block and args.cells > args.block:
                results["reads"][args.block] = reads(args.block, ds, random, list(members), work, args.s3_cells)
        shutil.rmtree(inputs[0].parent)
        (work / "partial.json").write_text(json.dumps(results))
        print(f"{start + cells:,} cells built ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)
    results["reads"][args.cells] = reads(args.cells, ds, random, members, work, args.s3_cells)
    return results


def growth(a: float, b: float, cells_a: int, cells_b: int) -> str:
    """How much `b` is of `a`, per decade of cells (geometric)."""
    import math

    if a <= 0 or b <= 0:
        return "-"
    decades = math.log10(cells_b / cells_a)
    return f"{(b / a) ** (1 / decades):.2f}x"


def report(results: dict) -> None:
    sizes = sorted(int(n) for n in results["reads"])
    reads_at = {int(n): r for n, r in results["reads"].items()}
    print(f"\n# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores")
    print("\n## Building\n")
    print("| block | cells after | make inputs s | default s | us/cell | peak MiB | random-access s | us/cell | "
          "peak MiB | 10 members s | peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for b in results["blocks"]:
        d, r, m = b["default"], b["random-access"], b["members"]
        verb = "convert" if b["start"] == 0 else "append"
        print(f"| {verb} {b['start']:,}+ | {b['start'] + b['cells']:,} | {b['make_seconds']:.0f} | "
              f"{d['seconds']:.1f} | {d['seconds'] / b['cells'] * 1e6:.1f} | {d['rss'] / 2**20:,.0f} | "
              f"{r['seconds']:.1f} | {r['seconds'] / b['cells'] * 1e6:.1f} | {r['rss'] / 2**20:,.0f} | "
              f"{m['seconds']:.1f} | {m['rss'] / 2**20:,.0f} |")
    first = results["blocks"][0]["members"]["first"]
    print(f"\nconvert of {sizes[0]:,} cells (the first member): {first['seconds']:.2f} s, "
          f"{first['seconds'] / sizes[0] * 1e6:.1f} us/cell, {first['rss'] / 2**20:,.0f} MiB")
    print("\n## Reading\n")
    head = " | ".join(f"{n:,}" for n in sizes)
    print(f"| what | {head} | growth per decade |")
    print("|---|" + "---|" * len(sizes) + "---|")

    def line(name: str, value, per_cell: bool, fmt: str) -> None:
        values = [value(reads_at[n]) if name_ok(reads_at[n]) else None for n in sizes]
        cells_of = {n: n for n in sizes}
        shown = [fmt.format(v) if v is not None else "-" for v in values]
        known = [(n, v) for n, v in zip(sizes, values, strict=True) if v is not None]
        grow = "-"
        if len(known) >= 2:
            (n0, v0), (n1, v1) = known[-2], known[-1]
            if per_cell:
                v0, v1 = v0 / cells_of[n0], v1 / cells_of[n1]
            grow = growth(v0, v1, n0, n1) + (" per cell" if per_cell else "")
        print(f"| {name} | " + " | ".join(shown) + f" | {grow} |")

    def name_ok(_r: dict) -> bool:
        return True

    def get(row: str, key: str, scale: float = 1.0):
        return lambda r: r[row][key] * scale if row in r else None

    mib = 1 / 2**20
    line("open_dataset, cold: ms", get("open_dataset", "open_seconds", 1e3), False, "{:.1f}")
    line("open_dataset: memory added, MiB", get("open_dataset", "open_rss", mib), False, "{:.1f}")
    line("info, cold: s", get("info", "seconds"), False, "{:.2f}")
    line("verify, cold: s", get("verify", "seconds"), True, "{:.2f}")
    line("verify: peak MiB", get("verify", "rss", mib), False, "{:,.0f}")
    line("obs localize, 3 columns, cold: s", get("obs localize, 3 columns", "seconds"), True, "{:.2f}")
    line("obs localize: cache MiB", get("obs localize, 3 columns", "cache_bytes", mib), True, "{:,.1f}")
    line("obs localize: peak MiB", get("obs localize, 3 columns", "rss", mib), False, "{:,.0f}")
    line("export of 10,000 cells, cold: s", get("export of 10,000 cells", "seconds"), False, "{:.2f}")
    line("export: peak MiB", get("export of 10,000 cells", "rss", mib), False, "{:,.0f}")
    line("loader epoch, cold: s", get("loader epoch", "seconds"), True, "{:.1f}")
    line("loader epoch: cells/s", lambda r: r["loader epoch"]["cells"] / r["loader epoch"]["seconds"], False,
         "{:,.0f}")
    line("loader epoch: peak MiB", get("loader epoch", "rss", mib), False, "{:,.0f}")
    for store in ("default", "random-access"):
        for temp in ("cold", "warm", "cold, checked before", "warm, checked before"):
            row = f"gathers, {store}, {temp}"
            line(f"{row}: cells/s", lambda r, row=row: r[row]["cells"] / r[row]["seconds"] if row in r else None,
                 False, "{:,.0f}")
        line(f"gathers, {store}: peak MiB", get(f"gathers, {store}, cold", "rss", mib), False, "{:,.0f}")
    line("open_collection, cold: ms", get("open_collection", "open_seconds", 1e3), False, "{:.0f}")
    line("open_collection: memory added, MiB", get("open_collection", "open_rss", mib), False, "{:.1f}")
    line("collection epoch, cold: cells/s",
         lambda r: r["collection epoch"]["cells"] / r["collection epoch"]["seconds"], False, "{:,.0f}")
    line("collection epoch: peak MiB", get("collection epoch", "rss", mib), False, "{:,.0f}")
    line("S3 50 ms: loader cells/s",
         lambda r: (r["S3, 50 ms a request"]["cells"] / r["S3, 50 ms a request"]["seconds"]
                    if "S3, 50 ms a request" in r else None), False, "{:,.0f}")
    line("S3 50 ms: open s", get("S3, 50 ms a request", "open_seconds"), False, "{:.2f}")
    line("S3 50 ms: requests", get("S3, 50 ms a request", "requests"), False, "{:,.0f}")
    line("S3 50 ms: MB fetched", get("S3, 50 ms a request", "bytes", 1e-6), False, "{:,.0f}")
    line("store: bytes per nonzero", lambda r: r["_store"]["bytes"] / r["_store"]["nnz"], False, "{:.3f}")
    line("random-access store: bytes per nonzero", lambda r: r["_store"]["random_bytes"] / r["_store"]["nnz"],
         False, "{:.3f}")
    cached = [row.get("cached_before") for r in reads_at.values() for row in r.values()
              if isinstance(row, dict) and row.get("cached_before") is not None]
    if cached:
        print(f"\nbytes of a store still in the page cache before a cold read: max {max(cached):,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=10_000_000)
    parser.add_argument("--block", type=int, default=1_000_000, help="inputs made (and deleted) at a time")
    parser.add_argument("--member", type=int, default=100_000, help="cells of each dataset of the collection")
    parser.add_argument("--s3-cells", type=int, default=204_800, help="cells the loader reads from S3 (0: none)")
    parser.add_argument("--work", default=str(REPO / "target" / "ten-million"))
    parser.add_argument("--keep", action="store_true", help="keep the stores")
    parser.add_argument("--report", help="print the tables of a recorded run (its JSON) and stop")
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], args.measure[1:])))
        return
    if args.report:
        report(json.loads(Path(args.report).read_text()))
        return
    for name in ("block", "member"):
        value = getattr(args, name)
        if value <= 0 or value % 10_000:
            parser.error(f"--{name} {value} is not a positive multiple of 10,000 (the cells of an input file)")
    if args.block % args.member or args.cells % args.block:
        parser.error("--block must be a multiple of --member, and --cells of --block")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    # every cache (obs columns, records of checked tiles) under WORK
    ENV["DELTACELLS_CACHE"] = str(work / "cache")
    try:
        results = build(args, work)
    finally:
        shutil.rmtree(work / "inputs", ignore_errors=True)
        if not args.keep:
            for name in ("default", "random-access", "members", "obs-cache", "cache"):
                shutil.rmtree(work / name, ignore_errors=True)
    recorded = work / f"results-{args.cells}.json"
    recorded.write_text(json.dumps(results))
    print(json.dumps(results), file=sys.stderr)
    report(results)
    print(f"\n(recorded in {recorded}; `--report` prints it again)")


if __name__ == "__main__":
    main()
