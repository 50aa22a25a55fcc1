"""Many inputs, many tiles, many obs rows: how the costs that grow with the
count of things (not of nonzeros) grow.

    .venv/bin/python benches/many.py [--cells 100000] [--obs-rows 1000000,10000000] [--work DIR]

1. Inputs: the same CELLS cells (benches/make_atlas.py's, on 62,710 genes) as
   100 files and as 1,000 files. `plan` and `convert` of each, local; and
   `convert` of each from an HTTP server on 127.0.0.1 (tests/servers/serve.py,
   10 ms per request), with the requests and bytes its --stats counts against
   the inputs' bytes (each byte should be fetched once).
2. Tiles: the CELLS cells converted with 10,000-, 1,000-, 100- and 10-cell
   tiles (10 to 10,000 tiles); the manifest's size, `info`'s time, and the
   time Python's open_dataset takes (median of 20 in one process).
3. obs rows: datasets of OBS_ROWS cells of one nonzero each, with a 12-way
   categorical, a float and a barcode string column (unique, 16 letters);
   `obs localize` of the three columns (into an empty cache: time, peak
   memory, cache size), then ds.obs.take of 1,024 random cells.

Every command runs in a process of its own under GNU time (wall seconds,
peak RSS). Prints a table per part; not run by the tests.
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
from make_atlas import csr_group

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BINARY = REPO / "target" / "release" / "deltacells"
ENV = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")


def timed(args: list[str]) -> dict:
    """Runs a command under GNU time: wall seconds, peak RSS (bytes), its stderr."""
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%e %M", *map(str, args)], capture_output=True, text=True, env=ENV)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args[:3]))} failed: {done.stderr[-2000:]}")
    lines = done.stderr.strip().splitlines()
    return {"seconds": wall, "rss": int(lines[-1].split()[1]) * 1024, "stderr": "\n".join(lines[:-1])}


def inputs(cells: int, per_file: int, work: Path) -> list[Path]:
    out = work / f"per{per_file}"
    subprocess.run([sys.executable, str(HERE / "make_atlas.py"), "--cells", str(cells), "--per-file", str(per_file),
                    "--out", str(out)], check=True, capture_output=True)
    return sorted((out / str(cells)).glob("atlas_*.h5ad"))


class Server:
    """tests/servers/serve.py's HTTP server over a folder, with a latency."""

    def __init__(self, root: Path, latency_ms: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "servers" / "serve.py"), "http", str(root), "--latency-ms",
             str(latency_ms)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline() if self.process.stdout else ""
        self.port = int(line.split()[1])

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait(timeout=30)


def part_inputs(cells: int, work: Path) -> list[tuple[str, dict]]:
    rows = []
    for per_file in (cells // 100, cells // 1000):
        files = inputs(cells, per_file, work)
        size = sum(p.stat().st_size for p in files)
        n = len(files)
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        rows.append((f"plan, {n:,} local inputs", timed([BINARY, "plan", "-q", *files, out])))
        shutil.rmtree(out, ignore_errors=True)
        rows.append((f"convert, {n:,} local inputs", timed([BINARY, "convert", "-q", *files, out])))
        local_tiles = (out / "tiles" / "tile_000000.dct").read_bytes()
        shutil.rmtree(out, ignore_errors=True)
        server = Server(files[0].parent, 10)
        try:
            urls = [f"http://127.0.0.1:{server.port}/{p.name}" for p in files]
            for command in ("plan", "convert"):
                shutil.rmtree(out, ignore_errors=True)
                r = timed([BINARY, command, "-q", "--stats", "--json", *urls, out])
                io = json.loads([line for line in r["stderr"].splitlines() if line.startswith('{"io"')][-1])["io"]
                r.update(requests=io["input_requests"], fetched=io["input_bytes"], input_bytes=size)
                if command == "convert":
                    r["same"] = (out / "tiles" / "tile_000000.dct").read_bytes() == local_tiles
                rows.append((f"{command}, {n:,} inputs over HTTP (10 ms a request)", r))
        finally:
            server.close()
        shutil.rmtree(out, ignore_errors=True)
    return rows


def open_times(root: Path) -> dict:
    """Python's open_dataset of `root`: median seconds of 20, in a fresh process."""
    code = ("import json, statistics, time, deltacells\n"
            f"root = {str(root)!r}\n"
            "times = []\n"
            "for _ in range(21):\n"
            "    t = time.perf_counter(); ds = deltacells.open_dataset(root); times.append(time.perf_counter() - t)\n"
            "print(json.dumps({'first': times[0], 'median': statistics.median(times[1:]), 'tiles': ds.n_tiles}))\n")
    return in_fresh_process(code)


def in_fresh_process(code: str) -> dict:
    """Runs Python `code` in a process of its own; the JSON it printed last."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def part_tiles(cells: int, work: Path) -> list[tuple[str, dict]]:
    files = inputs(cells, cells // 100, work)
    rows = []
    for tile_size in (10_000, 1_000, 100, 10):
        out = work / f"tiles{tile_size}"
        if not (out / "manifest.json").exists():
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run([BINARY, "convert", "-q", "--tile-size", str(tile_size), *files, out], check=True, env=ENV)
        r = timed([BINARY, "info", out])
        r.update(open_times(out), manifest=(out / "manifest.json").stat().st_size)
        rows.append((f"{cells // tile_size:,} tiles of {tile_size:,} cells", r))
    return rows


def obs_input(rows: int, path: Path) -> None:
    """An .h5ad of `rows` cells with one nonzero each and three obs columns,
    written block by block with h5py."""
    import h5py
    import pandas as pd
    from anndata.io import write_elem

    if path.exists():
        return
    rng = np.random.default_rng(0)
    tmp = path.with_suffix(".tmp.h5ad")
    with h5py.File(tmp, "w") as f:
        g = csr_group(f, (rows, 16))
        g.create_dataset("data", data=np.ones(rows, dtype=np.float32), chunks=(min(rows, 1 << 20),))
        g.create_dataset("indices", data=rng.integers(0, 16, rows, dtype=np.int32), chunks=(min(rows, 1 << 20),))
        g.create_dataset("indptr", data=np.arange(rows + 1, dtype=np.int64), chunks=(min(rows + 1, 1 << 20),))
        letters = np.frombuffer(b"ACGT", dtype="S1")
        barcodes = letters[rng.integers(0, 4, (rows, 16))].view("S16").ravel().astype(str)
        barcodes = np.char.add(barcodes, np.char.mod("-%d", np.arange(rows) % 97))  # unique
        frame = pd.DataFrame({
            "cell_type": pd.Categorical.from_codes(rng.integers(0, 12, rows), [f"type_{i}" for i in range(12)]),
            "score": rng.random(rows),
            "barcode": barcodes,
        }, index=pd.RangeIndex(rows).astype(str))
        write_elem(f, "obs", frame)
        write_elem(f, "var", pd.DataFrame(index=[f"g{i}" for i in range(16)]))
        for key in ("layers", "obsm", "varm", "obsp", "varp", "uns"):
            write_elem(f, key, {})
    tmp.rename(path)


def take_time(root: Path, cache: Path) -> dict:
    code = ("import json, time, numpy as np, deltacells\n"
            f"ds = deltacells.open_dataset({str(root)!r}, cache_dir={str(cache)!r})\n"
            "cells = np.sort(np.random.default_rng(0).choice(ds.n_cells, 1024, replace=False))\n"
            "columns = ['cell_type', 'score', 'barcode']\n"
            "t = time.perf_counter(); ds.obs.take(cells, columns); first = time.perf_counter() - t\n"
            "t = time.perf_counter()\n"
            "for _ in range(10): ds.obs.take(cells, columns)\n"
            "print(json.dumps({'take_first': first, 'take': (time.perf_counter() - t) / 10}))\n")
    return in_fresh_process(code)


def part_obs(sizes: list[int], work: Path) -> list[tuple[str, dict]]:
    rows = []
    for n in sizes:
        source = work / f"obs_{n}.h5ad"
        obs_input(n, source)
        out = work / f"obs_{n}"
        if not (out / "manifest.json").exists():
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run([BINARY, "convert", "-q", source, out], check=True, env=ENV)
        cache = work / f"obs_cache_{n}"
        shutil.rmtree(cache, ignore_errors=True)
        r = timed([BINARY, "obs", "localize", "--cache-dir", cache, "--columns", "cell_type,score,barcode", out])
        r.update(take_time(out, cache),
                 cache_bytes=sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()),
                 obs_bytes=sum(p.stat().st_size for p in (out / "obs").rglob("*") if p.is_file()))
        rows.append((f"{n:,} obs rows", r))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=100_000)
    parser.add_argument("--obs-rows", default="1000000,10000000")
    parser.add_argument("--parts", default="inputs,tiles,obs")
    parser.add_argument("--work", default=str(REPO / "target" / "bench-many"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; page cache warm")
    if "inputs" in parts:
        lines = []
        for name, r in part_inputs(args.cells, work):
            same = "-" if "same" not in r else "yes" if r["same"] else "NO"
            extra = "- | - | -"
            if "requests" in r:
                extra = f"{r['requests']:,} | {r['fetched'] / r['input_bytes']:.2f}x | {same}"
            lines.append(f"| {name} | {r['seconds']:.2f} | {r['rss'] / 2**20:,.0f} | {extra} |")
        table(f"{args.cells:,} cells as 100 and as 1,000 inputs",
              ["command", "s", "peak MiB", "requests", "fetched / input bytes", "same tiles"], lines)
    if "tiles" in parts:
        lines = [f"| {name} | {r['manifest'] / 1024:,.0f} | {r['seconds']:.3f} | {r['rss'] / 2**20:,.0f} | "
                 f"{r['first'] * 1e3:.2f} | {r['median'] * 1e3:.2f} |" for name, r in part_tiles(args.cells, work)]
        table(f"{args.cells:,} cells in 10 to 10,000 tiles",
              ["dataset", "manifest KiB", "info s", "info peak MiB", "open_dataset, first ms",
               "open_dataset, median ms"], lines)
    if "obs" in parts:
        lines = [f"| {name} | {r['obs_bytes'] / 2**20:,.1f} | {r['seconds']:.2f} | {r['rss'] / 2**20:,.0f} | "
                 f"{r['cache_bytes'] / 2**20:,.1f} | {r['take_first'] * 1e3:.2f} | {r['take'] * 1e3:.2f} |"
                 for name, r in part_obs([int(n) for n in args.obs_rows.split(",")], work)]
        table("obs: a category, a float and a unique string per cell",
              ["rows", "obs shards MiB", "localize s", "localize peak MiB", "cache MiB",
               "obs.take 1,024 cells, first ms", "then ms"], lines)


def table(heading: str, columns: list[str], lines: list[str]) -> None:
    """Prints a Markdown table under a heading, at once."""
    print(f"\n## {heading}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for line in lines:
        print(line)
    sys.stdout.flush()

if __name__ == "__main__":
    main()
