"""The benchmarks' input: the two real PBMC files repeated, as one .h5ad and as
a dataset made by `deltacells convert` with its default settings. Made once
under the work folder and reused."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def make_inputs(work: Path, copies: int) -> tuple[Path, Path]:
    """(the .h5ad, the dataset) of the PBMC files repeated `copies` times
    (8: 111,992 cells), with obs columns cell_type (5 categories) and n_genes;
    X is an uncompressed float32 CSR, as anndata writes it by default."""
    import anndata
    import pandas as pd
    import scipy.sparse

    work.mkdir(parents=True, exist_ok=True)
    pbmc = [REPO / "data" / "pbmc" / f"pbmc_{n}.h5ad" for n in ("ctrl", "stim")]
    binary = REPO / "target" / "release" / "deltacells"
    source = work / f"pbmc_x{copies}.h5ad"
    dataset = work / f"pbmc_x{copies}"
    if not source.exists():
        parts = [anndata.read_h5ad(p) for p in pbmc]
        for p in parts:
            p.obs["cell_type"] = pd.Categorical(np.array(["T", "B", "NK", "Mono", "DC"])[np.arange(p.n_obs) % 5])
            p.obs["n_genes"] = np.diff(p.X.tocsr().indptr).astype(np.int32)
            p.obs = p.obs[["cell_type", "n_genes"]]
        joined = anndata.concat(parts * copies, index_unique="-")
        joined.X = scipy.sparse.csr_matrix(joined.X, dtype=np.float32)
        joined.write_h5ad(source)
    if not (dataset / "manifest.json").exists():
        env = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")
        subprocess.run([str(binary), "convert", "-q", "--overwrite", str(source), str(dataset)], check=True, env=env)
    return source, dataset
