"""Where a conversion's time goes: each phase's seconds, how busy each core
is in it, and (with --perf) the share of CPU samples in each part of the work.

    .venv/bin/python benches/profile_convert.py INPUT... [--perf] [--runs 1]

Runs `deltacells convert --stats --json` on the inputs into a temporary
folder (removed after), reading /proc/stat every 0.1 s; the phases' seconds
come from the command's own report, and each core's busy share in a phase
is its non-idle time over the samples that fall in it. With --perf the
command runs under `perf record` (call stacks by DWARF, at --hz) and each
part's share counts the samples with a frame of that part anywhere in
their stack (a part includes what it calls, so shares overlap). perf is
Debian's linux-perf; the machine must allow it (perf_event_paranoid).
The page cache is left as it is: warm after a first run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A part of the work, and the frames (regular expressions over symbol names)
# that mark a sample as spent in it.
PARTS = [
    ("reading rows from the inputs (both passes)", r"read_rows|MatrixReader|DirectArray|H5Dread|read_entries"),
    ("of which: inflating gzip chunks", r"zlib_rs|inflate|miniz"),
    ("of which: checking gene indices", r"checked_indices"),
    ("the gene-order pass (its reading included)", r"gene_totals|block_totals|totals_of"),
    ("checking values and counting them into the gene order", r"to_counts|counts_of|ColumnBitmap|sort_row"),
    ("joining a tile's parts", r"CsrMatrix::append"),
    ("encoding a tile", r"TileEncoder.*encode"),
    ("of which: zstd", r"ZSTD_"),
    ("writing tiles", r"put_tile|DatasetWriter"),
    ("obs", r"obs_merge|ObsPlan|ShardWriter|parquet"),
    ("scanning the inputs (their gene names)", r"scan_inputs"),
    ("page faults (anywhere)", r"asm_exc_page_fault|do_user_addr_fault|clear_page"),
    ("freeing memory to the system (anywhere)", r"munmap|__madvise|zap_pte"),
]


def cpu_times() -> list[tuple[int, int]]:
    """(busy, total) jiffies of each core, from /proc/stat."""
    cores = []
    for line in Path("/proc/stat").read_text().splitlines():
        if re.match(r"cpu\d+ ", line):
            fields = [int(x) for x in line.split()[1:]]
            idle = fields[3] + fields[4]
            cores.append((sum(fields) - idle, sum(fields)))
    return cores


class Sampler(threading.Thread):
    """Each core's (busy, total) every 0.1 s, with the time it was read."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, list[tuple[int, int]]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), cpu_times()))
            time.sleep(0.1)
        self.samples.append((time.monotonic(), cpu_times()))

    def busy(self, start: float, end: float) -> list[float]:
        """Each core's busy share between two moments (the samples within)."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return []
        first, last = inside[0][1], inside[-1][1]
        return [(b1 - b0) / max(t1 - t0, 1) for (b0, t0), (b1, t1) in zip(first, last, strict=True)]


def convert(binary: str, inputs: list[str], perf: Path | None, hz: int, extra: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix="profile-convert-", dir=REPO / "target"))
    try:
        command = [binary, "convert", "--quiet", "--stats", "--json", *extra, *inputs, str(out / "ds")]
        if perf is not None:
            command = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(hz), "--call-graph", "dwarf,16384",
                       "-o", str(perf), "--", *command]
        sampler = Sampler()
        sampler.start()
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True)
        ended = time.monotonic()
        sampler.stop.set()
        sampler.join()
        if done.returncode != 0:
            sys.exit(f"convert failed ({done.returncode}): {done.stderr[-2000:]}")
        report = next(json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"io"'))["io"]
        # The phases end when the command reports; the process's start-up
        # before the first phase is counted in the first.
        phases, at = [], ended - report["seconds"]
        for name, seconds in report["phases"]:
            phases.append((name, seconds, sampler.busy(at, at + seconds)))
            at += seconds
        manifest = json.loads((out / "ds" / "manifest.json").read_text())
        return {"seconds": ended - started, "phases": phases, "whole": sampler.busy(started, ended),
                "cells": manifest["n_cells"], "nnz": sum(manifest["tile_nnz"])}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def parts_of(perf: Path) -> tuple[int, list[tuple[str, float]]]:
    """The share of samples with a frame of each part in their stack."""
    script = subprocess.run(["perf", "script", "-i", str(perf), "-F", "ip,sym"],
                            capture_output=True, text=True, check=True).stdout
    patterns = [(name, re.compile(pattern)) for name, pattern in PARTS]
    counts = dict.fromkeys([name for name, _ in PARTS], 0)
    total = 0
    for stack in script.split("\n\n"):
        frames = stack.strip()
        if not frames:
            continue
        total += 1
        for name, pattern in patterns:
            if pattern.search(frames):
                counts[name] += 1
    return total, [(name, counts[name] / max(total, 1)) for name, _ in PARTS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", help="input files (or a folder of .h5ad files)")
    parser.add_argument("--bin", default=str(REPO / "target" / "release" / "deltacells"))
    parser.add_argument("--runs", type=int, default=1, help="timed runs (the table shows the median run)")
    parser.add_argument("--perf", action="store_true", help="also profile one more run with perf")
    parser.add_argument("--hz", type=int, default=499, help="perf's samples per second per core")
    parser.add_argument("--convert-args", default="", help="more arguments for convert, e.g. '--level 1'")
    args = parser.parse_args()
    inputs: list[str] = []
    for given in args.inputs:
        path = Path(given)
        inputs += sorted(str(p) for p in path.rglob("*.h5ad")) if path.is_dir() else [given]
    extra = args.convert_args.split()
    runs = [convert(args.bin, inputs, None, args.hz, extra) for _ in range(args.runs)]
    run = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    times = ", ".join(f"{r['seconds']:.2f}" for r in runs)
    print(f"convert of {run['cells']:,} cells, {run['nnz']:,} nonzeros from {len(inputs)} inputs, "
          f"{os.cpu_count()} cores; runs: {times} s "
          f"(median {statistics.median(r['seconds'] for r in runs):.2f})")
    print(f"{'phase':32} {'seconds':>8}  busy per core")
    for name, seconds, busy in run["phases"] + [("(whole run)", run["seconds"], run["whole"])]:
        print(f"{name:32} {seconds:8.2f}  {' / '.join(f'{b:.0%}' for b in busy) or '-'}")
    if args.perf:
        with tempfile.TemporaryDirectory(dir=REPO / "target") as tmp:
            data = Path(tmp) / "perf.data"
            convert(args.bin, inputs, data, args.hz, extra)
            total, shares = parts_of(data)
        print(f"\nshares of {total:,} CPU samples (perf at {args.hz} Hz, call stacks; overlapping):")
        for name, share in shares:
            print(f"  {name:58} {share:6.1%}")


if __name__ == "__main__":
    main()
