"""The sharded conversion at scale: `plan`, every `shard` and `finalize` of
the same cells at SMALL cells and at CELLS, to see whether its time per cell
and its memory stay flat over the decade.

    .venv/bin/python benches/make_atlas.py --cells 10000000 --compression gzip --out target/atlas-gz
    .venv/bin/python benches/sharded_scale.py --inputs target/atlas-gz [--cells 10000000]
                                              [--small 1000000] [--shard-cells 1000000] [--reads] [--convert-large]
                                              [--work DIR] [--keep]

A plan needs every input at once, so the inputs are benches/make_atlas.py's
files written with `--compression gzip`, as anndata writes them when asked:
10 million cells take about 21.5 GB that way instead of 63 GB. The files are
taken in name order (atlas_0000.h5ad, ...; any folders under INPUTS), the
first SMALL (or CELLS) cells' worth (10,000 cells a file).

For each size, in processes of their own under GNU time (wall seconds, peak
RSS), with the inputs dropped from the page cache before each step (cold,
posix_fadvise, so that 2 GB and 21 GB of inputs are read alike):

- `plan` of the inputs (the default options but --obs-tiles-per-file,
  100 here: a shard encodes whole obs shards, and with convert's 1,000
  tiles per obs shard all 10 M cells would fall to one shard);
- `shard OUT --shard K/N` for every K, one after another, N = cells /
  SHARD_CELLS (each shard a machine's share; here they take turns on both
  cores);
- `finalize`;
- then `verify` of the result (cold), and its bytes.

At SMALL cells also a one-process `convert` of the same inputs, to show what
sharding costs (with --convert-large at CELLS too: its time per cell and
memory over the decade, all CELLS in one obs shard). With --reads, also at both sizes, on the store the shards
made (cold, as benches/ten_million.py measures them): open_dataset,
`obs localize` of three columns, `export` of 10,000 cells, and a collection
of the same cells as datasets of MEMBER_CELLS each (converted from the same
inputs, not timed): open_collection and a full shuffled epoch of it.
Prints a table with the growth per decade (per cell for times) and the raw
results as JSON on stderr. The stores are deleted at the
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

from ten_million import python_row, size_of, timed  # noqa: E402


def inputs_of(root: Path, cells: int) -> list[Path]:
    """The first `cells` cells' files of make_atlas.py's output under `root`."""
    files = sorted(root.rglob("atlas_*.h5ad"), key=lambda p: p.name)
    files = [p for p in files if not p.name.endswith(".tmp.h5ad")]
    wanted = -(-cells // PER_FILE)
    if len(files) < wanted:
        sys.exit(f"{root}: {len(files)} atlas files, {wanted} needed for {cells:,} cells")
    return files[:wanted]


def sharded(files: list[Path], out: Path, shards: int, obs_tiles: int) -> dict:
    """Plan, every shard and finalize into `out`, each step timed cold."""
    listing = out.with_suffix(".txt")
    listing.write_text("".join(f"{p}\n" for p in files))
    plan = timed([BINARY, "plan", "-q", "--obs-tiles-per-file", str(obs_tiles), "--inputs-from", listing, out],
                 cold=files)
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


def members_of(files: list[Path], root: Path, member_cells: int) -> list[Path]:
    """The cells of `files` as datasets of `member_cells` each under `root`
    (those already there kept)."""
    per = member_cells // PER_FILE
    members = []
    for m in range(0, len(files), per):
        out = root / f"member_{m // per:04d}"
        if not (out / "manifest.json").exists():
            shutil.rmtree(out, ignore_errors=True)
            timed([BINARY, "convert", "-q", *files[m:m + per], out])
        members.append(out)
    return members


def reads(cells: int, ds: Path, members: list[Path], work: Path) -> dict:
    """The reads that hold what grows with the dataset, on `ds` (cold)."""
    rows: dict[str, dict] = {"open_dataset": python_row("open", str(ds), cold=[ds])}
    cache = work / "obs-cache"
    shutil.rmtree(cache, ignore_errors=True)
    rows["obs localize, 3 columns"] = {
        **timed([BINARY, "obs", "localize", "--cache-dir", cache, "--columns", "cell_type,donor,n_counts", ds],
                cold=[ds]),
        "cache_bytes": size_of(cache)}
    shutil.rmtree(cache, ignore_errors=True)
    exported = work / "export.h5ad"
    middle = cells // 2
    rows["export of 10,000 cells"] = timed([BINARY, "export", "--overwrite", "--cells",
                                            f"{middle}:{middle + 10_000}", ds, exported], cold=[ds])
    exported.unlink(missing_ok=True)
    listing = json.dumps([str(m) for m in members])
    rows["collection epoch"] = python_row("collection", listing, str(cache), cold=members)
    rows["open_collection"] = python_row("collection-open", listing, cold=members)
    shutil.rmtree(cache, ignore_errors=True)
    rows["_members"] = {"count": len(members)}
    return rows


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
    if "reads" in a and "reads" in b:
        ra, rb = a["reads"], b["reads"]
        print(f"| collection datasets | {ra['_members']['count']} | {rb['_members']['count']} | |")
        row("open_dataset, cold: ms", ra["open_dataset"]["open_seconds"] * 1e3,
            rb["open_dataset"]["open_seconds"] * 1e3, False, "{:.1f}")
        row("open_dataset: memory added, MiB", ra["open_dataset"]["open_rss"] / 2**20,
            rb["open_dataset"]["open_rss"] / 2**20, False, "{:.1f}")
        for name in ("obs localize, 3 columns", "export of 10,000 cells"):
            per_cell = name.startswith("obs")
            row(f"{name}, cold: s", ra[name]["seconds"], rb[name]["seconds"], per_cell, "{:.2f}")
            row(f"{name}: peak MiB", ra[name]["rss"] / 2**20, rb[name]["rss"] / 2**20, False, "{:.0f}")
        row("open_collection, cold: ms", ra["open_collection"]["open_seconds"] * 1e3,
            rb["open_collection"]["open_seconds"] * 1e3, False, "{:.0f}")
        row("open_collection: memory added, MiB", ra["open_collection"]["open_rss"] / 2**20,
            rb["open_collection"]["open_rss"] / 2**20, False, "{:.1f}")
        ca, cb = ra["collection epoch"], rb["collection epoch"]
        row("collection epoch, cold: cells/s", ca["cells"] / ca["seconds"], cb["cells"] / cb["seconds"], False,
            "{:,.0f}")
        row("collection epoch: peak MiB", ca["rss"] / 2**20, cb["rss"] / 2**20, False, "{:.0f}")
    if "convert" in a:
        c = a["convert"]
        print(f"\none-process convert of the {small:,} cells, the same inputs: {c['seconds']:.1f} s "
              f"({c['seconds'] / small * 1e6:.1f} us/cell), {c['rss'] / 2**20:.0f} MiB peak; "
              f"sharded took {a['seconds'] / c['seconds']:.2f}x its time")
    if "convert" in a and "convert" in b:
        ca, cb = a["convert"], b["convert"]
        print(f"\n| one-process convert | {small:,} | {large:,} | growth |\n|---|---|---|---|")
        row("time: us per cell", ca["seconds"] / small * 1e6, cb["seconds"] / large * 1e6, False, "{:.1f}")
        row("peak MiB", ca["rss"] / 2**20, cb["rss"] / 2**20, False, "{:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", required=True, help="make_atlas.py's output folder (with --compression gzip)")
    parser.add_argument("--cells", type=int, default=10_000_000)
    parser.add_argument("--small", type=int, default=1_000_000)
    parser.add_argument("--shard-cells", type=int, default=1_000_000, help="cells of each shard's share")
    parser.add_argument("--work", default=str(REPO / "target" / "sharded-scale"))
    parser.add_argument("--keep", action="store_true", help="keep the stores")
    parser.add_argument("--obs-tiles-per-file", type=int, default=100,
                        help="plan's option: a shard takes whole obs shards, so with the default of convert "
                             "(1,000 tiles, 10 M cells) only one shard of 10 M cells has work")
    parser.add_argument("--reads", action="store_true", help="also the reads that hold what grows (see above)")
    parser.add_argument("--member-cells", type=int, default=100_000, help="cells of each dataset of --reads' "
                        "collection (a multiple of 10,000)")
    parser.add_argument("--convert-large", action="store_true",
                        help="also a one-process convert of all CELLS (at SMALL it always runs)")
    parser.add_argument("--report", help="print the table of a recorded run (its JSON) and stop")
    args = parser.parse_args()
    if args.report:
        report(json.loads(Path(args.report).read_text()))
        return
    if not 0 < args.small < args.cells or args.shard_cells <= 0:
        parser.error("--small must be above 0 and below --cells, --shard-cells above 0")
    if args.member_cells <= 0 or args.member_cells % PER_FILE:
        parser.error(f"--member-cells {args.member_cells} is not a positive multiple of {PER_FILE:,}")
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
            row = sharded(files, out, shards, args.obs_tiles_per_file)
            print(f"{cells:,} cells: {json.dumps({k: v for k, v in row.items() if k != 'shard_runs'})}",
                  file=sys.stderr, flush=True)
            if args.reads:
                members = members_of(files, work / "members", args.member_cells)
                row["reads"] = reads(cells, out, members, work)
            if not args.keep:
                shutil.rmtree(out)
            if cells == args.small or args.convert_large:
                with tempfile.TemporaryDirectory(dir=work) as tmp:
                    listing = Path(tmp) / "files.txt"
                    listing.write_text("".join(f"{p}\n" for p in files))
                    row["convert"] = timed([BINARY, "convert", "-q", "--inputs-from", listing, Path(tmp) / "out"],
                                           cold=files)
            results[str(cells)] = row
            (work / "results.json").write_text(json.dumps(results, indent=1))
    finally:
        if not args.keep:
            for p in [*work.glob("sharded-*"), work / "members"]:
                shutil.rmtree(p, ignore_errors=True)
    report(results)
    print(json.dumps(results), file=sys.stderr)


if __name__ == "__main__":
    main()
