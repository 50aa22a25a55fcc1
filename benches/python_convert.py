"""Converts the same cells through each way Python users have, and prints
the median wall time and peak memory of each against the command on the
.h5ad file, alternating the ways in each round of one run:

    python benches/python_convert.py [--bin target/release/deltacells] [--pbmc data/pbmc] [--rounds 3]

- `deltacells convert` (the binary cargo builds), as the baseline;
- the `deltacells` console script the wheel installs (the same command line);
- `deltacells.convert(path, out)` in Python;
- `deltacells.write_anndata(adata, out)` of the file read into memory by
  anndata (the read not timed), CSR;
- the same of a backed AnnData (X read in row blocks from the file);
- `adata.write_h5ad` to a temporary file then `deltacells.convert`: what a
  user would do without write_anndata.

Each runs in a process of its own (peak memory is that process's VmHWM,
minus the baseline's interpreter where one is started). The cells are the
PBMC ctrl file (6,548 cells); every output must have the tiles of the
baseline, which is checked. The page cache is warm.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from formats import tiles_digest

CHILD = r"""
import sys, time, resource
import anndata, deltacells
mode, source, out = sys.argv[1:4]
adata = None
if mode == "write_anndata":
    adata = anndata.read_h5ad(source)
elif mode == "write_anndata_backed":
    adata = anndata.read_h5ad(source, backed="r")
started = time.perf_counter()
if mode == "convert":
    deltacells.convert(source, out, progress=False)
elif mode.startswith("write_anndata"):
    deltacells.write_anndata(adata, out, progress=False)
elif mode == "write_h5ad_then_convert":
    a = anndata.read_h5ad(source)
    started = time.perf_counter()
    a.write_h5ad(out + ".h5ad")
    deltacells.convert(out + ".h5ad", out, progress=False)
print(time.perf_counter() - started)
"""


def peak_kib(pid_status: str) -> int:
    for line in pid_status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def run(argv: list[str]) -> tuple[float, float]:
    """Runs argv; returns (seconds, peak MiB). Python children print their
    own timed seconds (the interpreter's start and anndata's read excluded)."""
    started = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while child.poll() is None:
        try:
            with open(f"/proc/{child.pid}/status") as f:
                peak = max(peak, peak_kib(f.read()))
        except OSError:
            pass
        time.sleep(0.01)
    wall = time.perf_counter() - started
    out, err = child.communicate()
    if child.returncode != 0:
        sys.exit(f"{argv}: {err}")
    seconds = float(out.strip().splitlines()[-1]) if argv[0] == sys.executable else wall
    return seconds, peak / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default="target/release/deltacells")
    parser.add_argument("--pbmc", default="data/pbmc")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    source = os.path.join(args.pbmc, "pbmc_ctrl.h5ad")
    script = os.path.join(os.path.dirname(sys.executable), "deltacells")
    ways = {
        "deltacells convert (binary)": lambda out: [args.bin, "convert", "-q", source, out],
        "deltacells convert (console script)": lambda out: [script, "convert", "-q", source, out],
        "deltacells.convert(path)": lambda out: [sys.executable, "-c", CHILD, "convert", source, out],
        "write_anndata(adata in memory)": lambda out: [sys.executable, "-c", CHILD, "write_anndata", source, out],
        "write_anndata(adata backed)": lambda out: [sys.executable, "-c", CHILD, "write_anndata_backed", source,
                                                    out],
        "write_h5ad, then convert": lambda out: [sys.executable, "-c", CHILD, "write_h5ad_then_convert", source,
                                                 out],
    }
    times: dict[str, list[float]] = {w: [] for w in ways}
    peaks: dict[str, list[float]] = {w: [] for w in ways}
    digests: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (way, argv) in enumerate(ways.items()):
                out = os.path.join(tmp, f"r{r}_{i}")
                seconds, peak = run(argv(out))
                times[way].append(seconds)
                peaks[way].append(peak)
                digests[way] = tiles_digest(out)
    baseline = next(iter(ways))
    assert len(set(digests.values())) == 1, digests
    base = statistics.median(times[baseline])
    print(f"PBMC ctrl (6,548 cells), {args.rounds} rounds, warm page cache; medians; every way wrote the same tiles")
    print(f"| {'way':38} | {'seconds':>8} | {'vs binary':>9} | {'peak MiB':>8} |")
    print(f"|{'-' * 40}|{'-' * 10}|{'-' * 11}|{'-' * 10}|")
    for way in ways:
        t = statistics.median(times[way])
        print(f"| {way:38} | {t:8.2f} | {t / base:8.2f}x | {statistics.median(peaks[way]):8.0f} |")


if __name__ == "__main__":
    main()
