"""A dataset converted the way atlases are: one input per sample, one after
another. Made from the bundled 1,000 real PBMC cells (examples/pbmc_1k.h5ad),
so that the tests that use it run in any clone of the repository."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from conftest import REPO, run

SAMPLES = 8
#: Sizes of the classes of column "cls": the largest 60 times the smallest.
CLASS_PARTS = {"A": 60, "B": 20, "C": 5, "D": 1}


def class_labels(n: int) -> np.ndarray:
    """Labels of column "cls" for n cells: classes in the proportions of
    CLASS_PARTS, spread over the cells in a fixed random order."""
    parts = np.array(list(CLASS_PARTS.values()), dtype=float)
    sizes = np.floor(parts / parts.sum() * n).astype(int)
    sizes[0] += n - sizes.sum()
    labels = np.repeat(np.array(list(CLASS_PARTS)), sizes)
    return np.random.default_rng(5).permutation(labels)


def make_sample_inputs(folder: Path, samples: int = SAMPLES) -> list[Path]:
    """`samples` .h5ad files, each the 1,000 PBMC cells with its own sample
    label ("s0", "s1", ...), a donor (two samples each) and a class column."""
    import anndata
    import pandas as pd

    source = anndata.read_h5ad(REPO / "examples" / "pbmc_1k.h5ad")
    labels = class_labels(samples * source.n_obs)
    paths = []
    for i in range(samples):
        part = source.copy()
        part.obs = pd.DataFrame(
            {
                "sample": pd.Categorical([f"s{i}"] * part.n_obs),
                "donor": pd.Categorical([f"d{i // 2}"] * part.n_obs),
                "cls": pd.Categorical(labels[i * part.n_obs:(i + 1) * part.n_obs], categories=list(CLASS_PARTS)),
                "n_counts": np.asarray(part.X.sum(axis=1)).ravel().astype(np.int32),
            },
            index=[f"{name}-{i}" for name in part.obs_names],
        )
        path = folder / f"sample_{i}.h5ad"
        part.write_h5ad(path)
        paths.append(path)
    return paths


def make_samples_dataset(folder: Path, binary: Path) -> Path:
    """The inputs converted in order into tiles of 1,000 cells: each tile one sample."""
    inputs = make_sample_inputs(folder)
    out = folder / "samples"
    run(binary, "convert", "-q", "--tile-size", "1000", "--level", "3", *inputs, out)
    return out


def entropy(codes: np.ndarray) -> float:
    counts = np.bincount(codes)
    p = counts[counts > 0] / codes.size
    return float(-(p * np.log(p)).sum())


def mixing(batches_codes: list[np.ndarray], all_codes: np.ndarray, seed: int = 0) -> float:
    """Mean entropy of the batches' labels over that of random batches of the
    same sizes (1.0: as mixed as random)."""
    rng = np.random.default_rng(seed)
    random = [entropy(rng.choice(all_codes, size=len(c), replace=False)) for c in batches_codes]
    return float(np.mean([entropy(c) for c in batches_codes]) / np.mean(random))
