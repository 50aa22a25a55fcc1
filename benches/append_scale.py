"""Appends as a dataset grows, one or more builds of deltacells side by side:
a dataset of CELLS atlas cells made by `convert` of the first BLOCK cells and
`append` of each next BLOCK, once for each binary, from the same inputs
(benches/make_atlas.py, each block made once and deleted once every binary
has appended it). Prints each block's time per cell and peak memory for each
binary, and how the append's time per cell grew from the first append to the
last (issue 45's target: within 10% from 1 M to 10 M cells).

    .venv/bin/python benches/append_scale.py --cells 10000000 [--block 1000000]
                                             [--binary PATH ...] [--work DIR] [--keep]

Disk: a dataset per binary (about 0.9 GB a million cells) and one block of
inputs at a time (about 6.3 GB a million cells). The datasets are deleted at
the end unless --keep. Warm page cache (the dataset's files as the last
append left them), as benches/ten_million.py appends.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ten_million import BINARY, REPO, make_block, timed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=10_000_000)
    parser.add_argument("--block", type=int, default=1_000_000, help="cells made, converted or appended at a time")
    parser.add_argument("--binary", action="append", help="a deltacells binary (repeat to compare builds; "
                        "default target/release/deltacells)")
    parser.add_argument("--work", default=str(REPO / "target" / "append-scale"))
    parser.add_argument("--keep", action="store_true", help="keep the datasets")
    args = parser.parse_args()
    if args.cells < 2 * args.block or args.block <= 0:
        parser.error("--cells must be at least two --block")
    binaries = [Path(b).resolve() for b in (args.binary or [str(BINARY)])]
    for b in binaries:
        if not b.is_file():
            parser.error(f"--binary {b}: no such file")
    work = Path(args.work)
    stores = [work / f"dataset_{i}" for i in range(len(binaries))]
    for p in [*stores, work / "inputs"]:
        shutil.rmtree(p, ignore_errors=True)
    rows = []
    try:
        for start in range(0, args.cells, args.block):
            cells = min(args.block, args.cells - start)
            inputs, _ = make_block(start, cells, work / "inputs")
            row = {"start": start, "cells": cells, "runs": []}
            # (the builds take turns going first, so that neither always
            # finds the inputs in the page cache)
            order = list(range(len(binaries)))
            if (start // args.block) % 2:
                order.reverse()
            runs: dict[int, dict] = {}
            for i in order:
                verb = ["convert", "-q", *map(str, inputs), str(stores[i])] if start == 0 else \
                    ["append", "-q", str(stores[i]), *map(str, inputs)]
                runs[i] = timed([str(binaries[i]), *verb])
            row["runs"] = [runs[i] for i in range(len(binaries))]
            rows.append(row)
            shutil.rmtree(work / "inputs", ignore_errors=True)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work / "inputs", ignore_errors=True)
        if not args.keep:
            for s in stores:
                shutil.rmtree(s, ignore_errors=True)
    report(rows, binaries)


def report(rows: list[dict], binaries: list[Path]) -> None:
    names = [f"{b.parent.name}/{b.name}" for b in binaries]
    print("| block (cells before) | " + " | ".join(f"{n}: us a cell, peak MiB" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for r in rows:
        verb = "convert" if r["start"] == 0 else f"append ({r['start']:,})"
        cells = [f"{run['seconds'] / r['cells'] * 1e6:.1f}, {run['rss'] / 2**20:,.0f}" for run in r["runs"]]
        print(f"| {verb} | " + " | ".join(cells) + " |")
    appends = [r for r in rows if r["start"] > 0]
    for i, name in enumerate(names):
        per = [r["runs"][i]["seconds"] / r["cells"] * 1e6 for r in appends]
        print(f"# {name}: appends {min(per):.1f}-{max(per):.1f} us a cell, median {statistics.median(per):.1f}; "
              f"last / first {per[-1] / per[0]:.2f}x, mean of the last three / first three "
              f"{statistics.mean(per[-3:]) / statistics.mean(per[:3]):.2f}x")


if __name__ == "__main__":
    main()
