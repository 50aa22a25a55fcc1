"""The data of the scvi-tools and Lightning tests: the bundled 1,000 PBMC
cells (examples/pbmc_1k.h5ad) with obs columns of the kinds users train
with, written as .h5ad and converted by deltacells.convert (no ../shared,
no binary)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import deltacells
from conftest import REPO

#: Genes kept: those with the most counts, as a user keeps highly variable genes.
GENES = 2000


def pbmc_with_columns(genes: int = GENES):  # noqa: ANN201 - anndata is imported here only
    """The bundled cells, their ``genes`` genes with the most counts (in the
    file's order), and obs columns: batch (the first and second half: "a",
    "b"), donor (8 groups, at random), kind (a string column), cls (4
    classes, one rare), n_counts (a number) and partial (a category missing
    in every tenth cell)."""
    import anndata
    import pandas as pd

    source = anndata.read_h5ad(REPO / "examples" / "pbmc_1k.h5ad")
    totals = np.asarray(source.X.sum(axis=0)).ravel()
    keep = np.sort(np.argsort(-totals, kind="stable")[:genes])
    adata = source[:, keep].copy()
    n = adata.n_obs
    rng = np.random.default_rng(7)
    adata.obs = pd.DataFrame(
        {
            "batch": pd.Categorical(np.where(np.arange(n) < n // 2, "a", "b")),
            "donor": pd.Categorical([f"d{i}" for i in rng.integers(0, 8, n)]),
            "kind": np.array(["x", "y", "z"])[rng.integers(0, 3, n)].astype(object),
            "cls": pd.Categorical(rng.choice(["A", "B", "C", "D"], size=n, p=[0.6, 0.25, 0.1, 0.05])),
            "n_counts": np.asarray(adata.X.sum(axis=1)).ravel().astype(np.float64),
            "partial": pd.Categorical(np.where(np.arange(n) % 10 == 0, None, "p")),
        },
        index=adata.obs_names,
    )
    return adata


def convert_with_columns(folder: Path, tile_size: int = 300) -> tuple[Path, Path]:
    """:func:`pbmc_with_columns` written to FOLDER/pbmc.h5ad and converted into
    FOLDER/ds in tiles of ``tile_size`` cells; returns both paths."""
    folder.mkdir(parents=True, exist_ok=True)
    pbmc_with_columns().write_h5ad(folder / "pbmc.h5ad")
    deltacells.convert(folder / "pbmc.h5ad", folder / "ds", tile_size=tile_size, level=3, progress=False)
    return folder / "pbmc.h5ad", folder / "ds"
