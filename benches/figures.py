"""The figures of how the encoding works, made from a real tile of our own
dataset (docs/figures/*.png).

    .venv/bin/pip install matplotlib      # once; not a test dependency
    .venv/bin/python benches/figures.py [--dataset DIR] [--out docs/figures]

The tile is tile 0 of the PBMC dataset that benches/reader.py and
benches/loader.py use (converted with convert's defaults: genes sorted by
decreasing total counts); the random order is a seeded permutation of its
genes. Figures:

- detected.png: the detected genes of 80 cells, in random and in sorted order;
- gaps-cdf.png: the cumulative distribution of the gaps between a cell's
  successive detected genes (what the tile stores), in both orders;
- histograms.png: the stored gaps (sorted order) and the counts;
- bytes-per-nonzero.png: bytes per nonzero of both orders, from the gene-order
  rows of benches/encoding.py's results (run it first), with the plain
  uncompressed CSR (8 bytes) for scale.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def gaps_of(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """The stored gaps: each cell's first gene index, then the differences."""
    gaps = np.diff(indices.astype(np.int64), prepend=0)
    starts = indptr[:-1][np.diff(indptr) > 0]
    gaps[starts] = indices[starts]
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--out", default=str(REPO / "docs" / "figures"))
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import deltacells

    if args.dataset is None:
        sys.path.insert(0, str(HERE))
        from pbmc_copies import make_inputs

        _, dataset = make_inputs(REPO / "target" / "bench-reader", 8)
    else:
        dataset = Path(args.dataset)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ds = deltacells.open_dataset(str(dataset))
    tile = ds.read_tile(0).to_scipy().tocsr()
    n_genes = tile.shape[1]
    shuffled = np.random.default_rng(0).permutation(n_genes)
    random = tile[:, shuffled].tocsr()
    random.sort_indices()
    orders = {"sorted by total counts": tile, "random order": random}

    # detected genes of 80 cells
    fig, axes = plt.subplots(2, 1, figsize=(11, 5), sharex=True)
    for ax, (name, m) in zip(axes, [("random order", random), ("sorted by total counts", tile)], strict=True):
        ax.imshow((m[:80] > 0).toarray(), aspect="auto", interpolation="nearest", cmap="Greys")
        ax.set_title(f"detected genes of 80 cells, {name}", fontsize=10)
        ax.set_ylabel("cell")
    axes[-1].set_xlabel(f"gene (column, of {n_genes:,})")
    fig.tight_layout()
    fig.savefig(out / "detected.png", dpi=110)
    plt.close(fig)

    # cumulative distribution of gaps
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, m in orders.items():
        g = np.sort(gaps_of(m.indptr, m.indices))
        ax.plot(g, np.arange(1, len(g) + 1) / len(g), label=f"{name} (median {int(np.median(g))})")
    ax.set_xscale("log")
    ax.set_xlabel("gap between successive detected genes of a cell")
    ax.set_ylabel("fraction of nonzeros")
    ax.axvline(255, color="grey", lw=0.8, ls=":")
    ax.annotate("fits one byte", (255, 0.05), fontsize=8, ha="right")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"gaps of tile 0 ({tile.nnz:,} nonzeros)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "gaps-cdf.png", dpi=110)
    plt.close(fig)

    # histograms of stored gaps and counts
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    g = gaps_of(tile.indptr, tile.indices)
    axes[0].hist(np.minimum(g, 64), bins=np.arange(0, 66) - 0.5, color="#4477aa")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("stored gap (sorted order; 64 = 64 or more)")
    axes[0].set_ylabel("nonzeros")
    counts = tile.data
    axes[1].hist(np.minimum(counts, 64), bins=np.arange(1, 66) - 0.5, color="#aa7744")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("count (64 = 64 or more)")
    share = float(np.mean(counts == 1))
    axes[1].set_title(f"{share:.0%} of counts are 1", fontsize=10)
    axes[0].set_title(f"{float(np.mean(g < 256)):.1%} of gaps fit one byte", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "histograms.png", dpi=110)
    plt.close(fig)

    # bytes per nonzero of both orders, from benches/encoding.py
    results = out / "encoding" / "results.json"
    if results.exists():
        rows = [r for r in json.loads(results.read_text()) if r["choice"] == "gene order"]
        fig, ax = plt.subplots(figsize=(7, 3.6))
        labels = [f"{r['input'].split(',')[0]}\n{r['value']}" for r in rows] + ["uncompressed CSR\n(int32 + int32)"]
        values = [r["bytes"] / r["nnz"] for r in rows] + [8.0]
        ax.bar(range(len(values)), values, color=["#4477aa"] * len(rows) + ["#999999"])
        ax.set_xticks(range(len(values)), labels, fontsize=7)
        ax.set_ylabel("bytes per nonzero")
        ax.set_yscale("log")
        for i, v in enumerate(values):
            ax.annotate(f"{v:.2f}", (i, v), ha="center", va="bottom", fontsize=7)
        ax.set_title("bytes per nonzero by gene order (level 19, 8 chunks)", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "bytes-per-nonzero.png", dpi=110)
        plt.close(fig)
    else:
        print(f"note: {results} not found (run benches/encoding.py first); bytes-per-nonzero.png not made")
    for p in sorted(out.glob("*.png")):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
