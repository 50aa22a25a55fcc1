"""Times two builds of the deltacells binary on the same work, alternating
them in one run, and prints each step's median wall time and the ratio: a
before/after check for a change that must not slow anything down.

    python benches/compare_binaries.py BEFORE_BIN AFTER_BIN [--rounds 5] [--pbmc data/pbmc]

Steps: convert of the two PBMC files (14k cells), verify of the result (reads
and decodes every tile), export of all its cells back to .h5ad (decodes every
tile again and writes HDF5). The inputs and datasets are read once before
timing, so the page cache is warm for both binaries.
"""

import argparse
import os
import statistics
import subprocess
import tempfile
import time


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pbmc", default="data/pbmc")
    args = parser.parse_args()
    inputs = [os.path.join(args.pbmc, f) for f in ("pbmc_ctrl.h5ad", "pbmc_stim.h5ad")]
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        builds = {"before": args.before, "after": args.after}
        for name, binary in builds.items():  # warm-up: page cache, and outputs to read
            subprocess.run([binary, "convert", "-q", "--overwrite", *inputs, f"{tmp}/{name}"], check=True)
        for _ in range(args.rounds):
            for name, binary in builds.items():
                out = f"{tmp}/{name}"
                steps = {
                    "convert": [binary, "convert", "-q", "--overwrite", *inputs, out],
                    "verify": [binary, "verify", "-q", out],
                    "export": [binary, "export", "-q", "--overwrite", out, f"{tmp}/{name}.h5ad"],
                }
                for step, cmd in steps.items():
                    times.setdefault((step, name), []).append(timed(cmd))
        with open(f"{tmp}/before/manifest.json") as before, open(f"{tmp}/after/manifest.json") as after:
            same = before.read() == after.read()
    print(f"{'step':<8} {'before s':>9} {'after s':>9} {'after/before':>13}   (median of {args.rounds}, warm cache)")
    for step in ("convert", "verify", "export"):
        b = statistics.median(times[(step, "before")])
        a = statistics.median(times[(step, "after")])
        print(f"{step:<8} {b:>9.3f} {a:>9.3f} {a / b:>13.3f}")
    print(f"manifests identical: {same}")


if __name__ == "__main__":
    main()
