"""Writes one small AnnData object, with obs and var columns of every kind
the converter stores, as an .h5ad file and as zarr stores of each layout
anndata writes: v2, v3, and v3 sharded (anndata 0.13's default), with X as
CSR, and the v3 store again with X as CSC and as a dense array.

    python tests/python/make_zarr_inputs.py OUT_DIR

tests/data/zarr/ holds the output (anndata 0.12.19, zarr 3.1.6), so that the
tests that convert them run without Python; run this again to refresh it.
"""

import os
import shutil
import sys
import warnings

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp


def build() -> ad.AnnData:
    rng = np.random.default_rng(7)
    n_cells, n_genes = 60, 25
    x = sp.random(n_cells, n_genes, density=0.25, format="csr", random_state=rng)
    x.data = np.floor(x.data * 20) + 1
    obs = pd.DataFrame(
        {
            "cell_type": pd.Categorical(rng.choice(["T", "B", "NK"], n_cells)),
            "donor": pd.Categorical(rng.choice([3, 1, 2], n_cells), ordered=True),
            "n_counts": np.asarray(x.sum(axis=1)).ravel().astype(np.int32),
            "score": np.where(rng.random(n_cells) < 0.1, np.nan, rng.random(n_cells)),
            "doublet": rng.random(n_cells) < 0.2,
            "batch_size": pd.array(np.where(rng.random(n_cells) < 0.2, None, rng.integers(0, 9, n_cells)), dtype="Int64"),
            "passed": pd.array(np.where(rng.random(n_cells) < 0.2, None, rng.random(n_cells) < 0.5), dtype="boolean"),
            "barcode": [f"BC{i:04d}" for i in range(n_cells)],
        },
        index=[f"cell{i}" for i in range(n_cells)],
    )
    var = pd.DataFrame(
        {"symbol": [f"SYM{i}" for i in range(n_genes)], "highly_variable": rng.random(n_genes) < 0.3},
        index=[f"ENSG{i:05d}" for i in range(n_genes)],
    )
    return ad.AnnData(X=x.astype(np.float32), obs=obs, var=var)


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    adata = build()
    adata.write_h5ad(os.path.join(out, "cells.h5ad"))
    forms = [("v2.zarr", 2, False, "csr"), ("v3.zarr", 3, False, "csr"), ("v3_sharded.zarr", 3, True, "csr"),
             ("v3_csc.zarr", 3, True, "csc"), ("v3_dense.zarr", 3, True, "dense")]
    for name, fmt, shard, layout in forms:
        path = os.path.join(out, name)
        shutil.rmtree(path, ignore_errors=True)
        ad.settings.zarr_write_format = fmt
        ad.settings.auto_shard_zarr_v3 = shard
        copy = adata.copy()
        if layout == "csc":
            copy.X = sp.csc_matrix(copy.X)
        elif layout == "dense":
            copy.X = copy.X.toarray()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            copy.write_zarr(path)


if __name__ == "__main__":
    main()
