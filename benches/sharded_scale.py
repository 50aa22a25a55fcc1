"""The sharded conversion at scale: `plan`, every `shard` and `finalize` of
the same cells at SMALL cells and at CELLS, to see whether its time per cell
and its memory stay flat over the decade.

    .venv/bin/python benches/make_atlas.py --cells 10000000 --compression gzip --out target/atlas-gz
    .venv/bin/python benches/sharded_scale.py --inputs target/atlas-gz [--cells 10000000]
                                              [--small 1000000] [--shard-cells 1000000] [--work DIR] [--keep]

A plan needs every input at once, so the inputs are benches/make_atlas.py's
files written with `--compression gzip`, as anndata writes them when asked:
10 million cells take about 21.5 GB that way instead of 63 GB. The files are
taken in name order (atlas_0000.h5ad, ...; any folders under INPUTS), the
first SMALL (or CELLS) cells' worth (10,000 cells a file).

For each size, in processes of their own under GNU time (wall seconds, peak
RSS), with the inputs dropped from the page cache before each step (cold,
posix_fadvise, so that 2 GB and 21 GB of inputs are read alike):

- `plan` of the inputs (the default options);
- `shard OUT --shard K/N` for every K, one after another, N = cells /
  SHARD_CELLS (each shard a machine's share; here they take turns on both
  cores);
- `finalize`;
- then `verify` of the result (cold), and its bytes.

At SMALL cells also a one-process `convert` of the same inputs, to show what
sharding costs. Prints a table with the growth per decade (per cell for
times) and the raw results as JSON on stderr. The stores are deleted at the
end unless --keep; the inputs are left (make_atlas.py made them). Not run by
the tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BINARY = REPO / "target" / "release" / "deltacells"
PER_FILE = 10_000
sys.path.insert(0, str(HERE))

from ten_million import size_of, timed  # noqa: E402


def inputs_of(root: Path, cells: int) -> list[Path]:
    """The first `cells` cells' files of make_atlas.py's output under `root`."""
    files = sorted(root.rglob("atlas_*.h5ad"), key=lambda p: p.name)
    files = [p for p in files if not p.name.endswith(".tmp.h5ad")]
    wanted = -(-cells // PER_FILE)
    if len(files) < wanted:
        sys.exit(f"{root}: {len(files)} atlas files, {wanted} needed for {cells:,} cells")
    return files[:wanted]


def sharded(files: list[Path], out: Path, shards: int) -> dict:
    """Plan, every shard and finalize into `out`, each step timed cold."""
    listing = out.with_suffix(".txt")
    listing.write_text("".join(f"{p}\n" for p in files))
    plan = timed([BINARY, "plan", "-q", "--inputs-from", listing, out], cold=files)
    runs = [timed([BINARY, "shard", "-q", out, "--shard", f"{k}/{shards}"], cold=files) for k in range(shards)]
    final = timed([BINARY, "finalize", "-q", out], cold=files)
    verify = timed([BINARY, "verify", "-q", out], cold=[out])
    listing.unlink()
    return {
        "shards": shards,
        "plan": plan,
        "shard_runs": runs,
        "finalize": final,
        "verify": verify,
        "seconds": plan["seconds"] + sum(r["seconds"] for r in runs) + final["seconds"],
        "rss": max([plan["rss"], final["rss"], *(r["rss"] for r in runs)]),
        "store_bytes": size_of(out),
    }


def report(results: dict) -> None:
    small, large = results["sizes"]
    a, b = results[str(small)], results[str(large)]
    decade = large / small

    def row(name: str, x: float, y: float, per_cell: bool, fmt: str) -> None:
        if per_cell:
            g = (y / large) / (x / small)
            growth = f"{g:.2f}x per cell"
        else:
            growth = f"{y / x:.2f}x"
        print(f"| {name} | {fmt.format(x)} | {fmt.format(y)} | {growth} |")

    print(f"\n# sharded conversion, {small:,} and {large:,} cells ({decade:g}x), 2 cores, cold inputs\n")
    print(f"| what | {small:,} | {large:,} | growth |")
    print("|---|---|---|---|")
    row("shards", a["shards"], b["shards"], False, "{:.0f}")
    row("plan: s", a["plan"]["seconds"], b["plan"]["seconds"], True, "{:.1f}")
    row("plan: peak MiB", a["plan"]["rss"] / 2**20, b["plan"]["rss"] / 2**20, False, "{:.0f}")
    sa = sum(r["seconds"] for r in a["shard_runs"])
    sb = sum(r["seconds"] for r in b["shard_runs"])
    row("shards: s, all", sa, sb, True, "{:.1f}")
    row("shards: peak MiB, largest", max(r["rss"] for r in a["shard_runs"]) / 2**20,
        max(r["rss"] for r in b["shard_runs"]) / 2**20, False, "{:.0f}")
    row("finalize: s", a["finalize"]["seconds"], b["finalize"]["seconds"], True, "{:.1f}")
    row("finalize: peak MiB", a["finalize"]["rss"] / 2**20, b["finalize"]["rss"] / 2**20, False, "{:.0f}")
    row("plan + shards + finalize: s", a["seconds"], b["seconds"], True, "{:.1f}")
    row("the same: us per cell", a["seconds"] / small * 1e6, b["seconds"] / large * 1e6, False, "{:.1f}")
    row("verify, cold: s", a["verify"]["seconds"], b["verify"]["seconds"], True, "{:.1f}")
    row("store: GB", a["store_bytes"] / 1e9, b["store_bytes"] / 1e9, True, "{:.2f}")
    if "convert" in a:
        c = a["convert"]
        print(f"\none-process convert of the {small:,} cells, the same inputs: {c['seconds']:.1f} s "
              f"({c['seconds'] / small * 1e6:.1f} us/cell), {c['rss'] / 2**20:.0f} MiB peak; "
              f"sharded took {a['seconds'] / c['seconds']:.2f}x its time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", required=True, help="make_atlas.py's output folder (with --compression gzip)")
    parser.add_argument("--cells", type=int, default=10_000_000)
    parser.add_argument("--small", type=int, default=1_000_000)
    parser.add_argument("--shard-cells", type=int, default=1_000_000, help="cells of each shard's share")
    parser.add_argument("--work", default=str(REPO / "target" / "sharded-scale"))
    parser.add_argument("--keep", action="store_true", help="keep the stores")
    parser.add_argument("--report", help="print the table of a recorded run (its JSON) and stop")
    args = parser.parse_args()
    if args.report:
        report(json.loads(Path(args.report).read_text()))
        return
    if not 0 < args.small < args.cells or args.shard_cells <= 0:
        parser.error("--small must be above 0 and below --cells, --shard-cells above 0")
    if not BINARY.exists():
        sys.exit(f"{BINARY} is missing: cargo build --release first")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"sizes": [args.small, args.cells]}
    try:
        for cells in (args.small, args.cells):
            files = inputs_of(Path(args.inputs), cells)
            shards = -(-cells // args.shard_cells)
            out = work / f"sharded-{cells}"
            shutil.rmtree(out, ignore_errors=True)
            row = sharded(files, out, shards)
            print(f"{cells:,} cells: {json.dumps({k: v for k, v in row.items() if k != 'shard_runs'})}",
                  file=sys.stderr, flush=True)
            if not args.keep:
                shutil.rmtree(out)
            if cells == args.small:
                with tempfile.TemporaryDirectory(dir=work) as tmp:
                    listing = Path(tmp) / "files.txt"
                    listing.write_text("".join(f"{p}\n" for p in files))
                    row["convert"] = timed([BINARY, "convert", "-q", "--inputs-from", listing, Path(tmp) / "out"],
                                           cold=files)
            results[str(cells)] = row
            (work / "results.json").write_text(json.dumps(results, indent=1))
    finally:
        if not args.keep:
            for p in work.glob("sharded-*"):
                shutil.rmtree(p, ignore_errors=True)
    report(results)
    print(json.dumps(results), file=sys.stderr)


if __name__ == "__main__":
    main()
