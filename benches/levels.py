"""The conversion's zstd level, measured: time, bytes and decoding at each
candidate, beside reading the inputs alone and beside annbatch, and what
`compact` costs to get the archive's bytes later. One run, one machine.

    .venv/bin/python benches/levels.py [--sets pbmc,atlas] [--levels 1,3,9,19] [--runs 3]
                                       [--atlas-cells 100000] [--no-annbatch] [--work DIR]

Input sets: `pbmc` is the two real PBMC files (../shared/data/fetch-pbmc.sh
into data/pbmc) given 8 times each, 16 inputs, 111,992 cells; `atlas` is
benches/make_atlas.py's cells (ATLAS_CELLS in files of 10,000, 62,710 genes).
For each set, warm page cache (every input read once before):

- the floor: reading and decompressing every input's X (data, indices,
  indptr) with h5py, nothing else, in a process of its own;
- `deltacells convert --level L` for each level: seconds (median of RUNS;
  one run above level 9), peak memory, bytes per nonzero of the tiles;
- `deltacells verify` (decodes every tile) of the level-1 and level-19
  datasets: the decoding cost of each (median of RUNS);
- `deltacells compact` of the level-1 dataset to level 19, against plain
  zstd compressing the same byte planes at 19 on the same threads
  (examples/zstd_baseline);
- annbatch's `DatasetCollection.add_adatas` of the same inputs (its default,
  shuffled), in the Python >= 3.12 environment benches/peers.py makes.

Prints one markdown table per set. Not run by the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BIN = REPO / "target" / "release" / "deltacells"
BASELINE = REPO / "target" / "release" / "examples" / "zstd_baseline"

FLOOR = """
import sys, time, h5py
started = time.perf_counter()
nnz = 0
for path in sys.argv[1:]:
    with h5py.File(path, "r") as f:
        x = f["X"]
        data, indices, indptr = x["data"][:], x["indices"][:], x["indptr"][:]
        nnz += len(data)
print(time.perf_counter() - started, nnz)
"""


def timed(args: list[str]) -> tuple[float, int, str]:
    """Runs `args`; (seconds, peak resident KiB, stdout)."""
    report = Path(os.environ.get("TMPDIR", "/tmp")) / f"levels-time-{os.getpid()}"
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(report), *args], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])}... failed: {done.stderr.strip()[-400:]}")
    peak = int(report.read_text().split()[-1])
    report.unlink()
    return seconds, peak, done.stdout


def manifest(dataset: Path) -> dict:
    return json.loads((dataset / "manifest.json").read_text())


def per_nonzero(dataset: Path) -> float:
    m = manifest(dataset)
    return sum(m["tile_bytes"]) / sum(m["tile_nnz"])


def inputs_of(name: str, work: Path, atlas_cells: int) -> list[str]:
    if name == "pbmc":
        import anndata

        originals = [REPO / "data" / "pbmc" / f"pbmc_{n}.h5ad" for n in ("ctrl", "stim")]
        missing = [str(f) for f in originals if not f.exists()]
        if missing:
            raise SystemExit(f"missing {missing}: run ../shared/data/fetch-pbmc.sh data/pbmc")
        # Written again by anndata: annbatch's anndata cannot read the
        # originals' obs; the cells are the same.
        files = [work / f.name for f in originals]
        for original, copy in zip(originals, files, strict=True):
            if not copy.exists():
                anndata.read_h5ad(original).write_h5ad(copy)
        return [str(f) for _ in range(8) for f in files]
    folder = work / f"atlas{atlas_cells}"
    subprocess.run([sys.executable, str(HERE / "make_atlas.py"), "--cells", str(atlas_cells), "--out", str(folder)],
                   check=True, stdout=subprocess.DEVNULL)
    return sorted(str(p) for p in folder.rglob("atlas_*.h5ad"))


def annbatch_python(work: Path) -> tuple[str | None, str]:
    sys.path.insert(0, str(HERE))
    from peers import PEERS, venv

    return venv(work, "venv", PEERS)


def measure(name: str, inputs: list[str], levels: list[int], runs: int, work: Path, peers: str | None) -> list[str]:
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    threads = str(os.cpu_count())
    for path in sorted(set(inputs)):  # warm the page cache
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    rows = []
    floor = [float(timed([sys.executable, "-c", FLOOR, *inputs])[2].split()[0]) for _ in range(runs)]
    floor_s = statistics.median(floor)
    rows.append(("reading the inputs' X with h5py (the floor)", floor_s, None, None))
    converted: dict[int, tuple[float, Path]] = {}
    for level in levels:
        dataset = out / f"level{level}"
        seconds, peaks = [], []
        for _ in range(runs if level <= 9 else 1):
            s, peak, _ = timed([str(BIN), "convert", "-q", "--overwrite", "--level", str(level), *inputs,
                                str(dataset)])
            seconds.append(s)
            peaks.append(peak)
        converted[level] = (statistics.median(seconds), dataset)
        rows.append((f"convert --level {level}", statistics.median(seconds), max(peaks), per_nonzero(dataset)))
    annbatch_s = None
    if peers is not None:
        store = out / "annbatch"
        done = subprocess.run([peers, str(HERE / "peers.py"), "--measure", "convert", "annbatch",
                               os.pathsep.join(inputs), str(store)], capture_output=True, text=True)
        if done.returncode == 0:
            result = json.loads(done.stdout.strip().splitlines()[-1])
            annbatch_s = result["seconds"]
            nnz = sum(manifest(converted[levels[0]][1])["tile_nnz"])
            rows.append(("annbatch add_adatas (shuffled, its default)", annbatch_s, result["convert_rss"] // 1024,
                         result["bytes"] / nnz))
        else:
            rows.append((f"annbatch failed: {done.stderr.strip().splitlines()[-1][:120]}", float("nan"), None, None))
        shutil.rmtree(store, ignore_errors=True)
    notes = []
    for level in (min(levels), max(levels)):
        v = [timed([str(BIN), "verify", "-q", str(converted[level][1])])[0] for _ in range(runs)]
        notes.append(f"verify of the level-{level} dataset: {statistics.median(v):.2f} s (median of {runs})")
    low, high = min(levels), max(levels)
    copy = out / "compacted"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(converted[low][1], copy)
    compact_s, compact_peak, _ = timed([str(BIN), "compact", "-q", "--level", str(high), str(copy)])
    same = all((copy / "tiles" / t.name).read_bytes() == t.read_bytes()
               for t in (converted[high][1] / "tiles").iterdir())
    zstd = timed([str(BASELINE), str(converted[high][1]), threads])[2].split()
    rows.append((f"compact {low} -> {high}", compact_s, compact_peak, per_nonzero(copy)))
    notes.append(f"compact {low} -> {high}: {compact_s:.2f} s, plain zstd at {high} on the same planes and "
                 f"{threads} threads {float(zstd[3]):.2f} s: {compact_s / float(zstd[3]):.2f}x; tiles identical to "
                 f"convert --level {high}: {same}")
    lines = [f"### {name}: {len(inputs)} inputs, {manifest(converted[low][1])['n_cells']:,} cells", "",
             "| what | seconds | x the floor | x annbatch | peak MiB | bytes/nnz |", "|---|---|---|---|---|---|"]
    for what, s, peak, bpn in rows:
        vs_annbatch = f"{s / annbatch_s:.2f}" if annbatch_s else "-"
        lines.append(f"| {what} | {s:.2f} | {s / floor_s:.2f} | {vs_annbatch} | "
                     f"{'-' if peak is None else f'{peak / 1024:.0f}'} | {'-' if bpn is None else f'{bpn:.4f}'} |")
    lines += ["", *[f"- {n}" for n in notes], ""]
    for _, dataset in converted.values():
        shutil.rmtree(dataset, ignore_errors=True)
    shutil.rmtree(copy, ignore_errors=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="pbmc,atlas")
    parser.add_argument("--levels", default="1,3,9,19")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--atlas-cells", type=int, default=100_000)
    parser.add_argument("--no-annbatch", action="store_true")
    parser.add_argument("--work", default=str(REPO / "target" / "bench-levels"))
    args = parser.parse_args()
    levels = sorted(int(v) for v in args.levels.split(","))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "deltacells", "--example", "zstd_baseline"],
                   cwd=REPO, check=True)
    peers, why = (None, "not asked") if args.no_annbatch else annbatch_python(work.parent / "bench-peers")
    if peers is None:
        print(f"annbatch: left out ({why})", file=sys.stderr)
    for name in args.sets.split(","):
        inputs = inputs_of(name, work, args.atlas_cells)
        print("\n".join(measure(name, inputs, levels, args.runs, work, peers)), flush=True)


if __name__ == "__main__":
    main()
