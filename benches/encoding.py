"""Every encoding choice on real data: runs the `encoding` example (Rust, one
thread) and plots each choice, one PNG per choice and input.

    .venv/bin/pip install matplotlib      # once; not a test dependency
    .venv/bin/python benches/encoding.py [--quick] [--out docs/figures/encoding]

The example measures, for the real PBMC cells (14,053 genes) and a 35,000-gene
input made from them, bytes per nonzero and single-thread decode and encode
speed for each gene order (sorted by total counts, as convert does; the source
files' order; a random order), zstd level (1 to 22), chunk count (1 to 16) and
tile size (1,000 to 20,000 cells, as many as the input has), one choice at a
time with the others at convert's defaults. It prints the tables; this script
saves them as JSON beside the figures. About 10 minutes on 2 cores; --quick
uses 2,000 cells and low levels (seconds), to check that it runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(REPO / "docs" / "figures" / "encoding"))
    parser.add_argument("--pbmc", default=str(REPO / "data" / "pbmc"))
    parser.add_argument("--plot-only", action="store_true", help="plot the results.json already in --out")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.json"
    if not args.plot_only:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--example", "encoding"], cwd=REPO, check=True)
        command = [str(REPO / "target" / "release" / "examples" / "encoding"), args.pbmc, str(results)]
        subprocess.run(command + (["--quick"] if args.quick else []), check=True)
    rows = json.loads(results.read_text())

    for (inp, choice) in dict.fromkeys((r["input"], r["choice"]) for r in rows):
        picked = [r for r in rows if r["input"] == inp and r["choice"] == choice]
        labels = [r["value"] for r in picked]
        bpn = [r["bytes"] / r["nnz"] for r in picked]
        decode = [r["nnz"] / r["decode_seconds"] / 1e6 for r in picked]
        encode = [r["nnz"] / r["encode_seconds"] / 1e6 for r in picked]
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
        for ax, values, title in zip(axes, [bpn, decode, encode],
                                     ["bytes per nonzero", "decode, M nonzeros/s (1 thread)",
                                      "encode, M nonzeros/s (1 thread)"], strict=True):
            ax.bar(range(len(values)), values, color="#4477aa")
            ax.set_xticks(range(len(values)), labels, rotation=20 if choice == "gene order" else 0, fontsize=8)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel(choice)
            for i, v in enumerate(values):
                ax.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom", fontsize=7)
        fig.suptitle(f"{inp}: {choice}", fontsize=11)
        fig.tight_layout()
        name = f"{'wide' if '35,000' in inp else 'pbmc'}-{choice.replace(' ', '-')}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        print(f"wrote {out / name}")


if __name__ == "__main__":
    main()
