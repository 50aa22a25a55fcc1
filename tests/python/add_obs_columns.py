"""Copies an .h5ad file, adding obs columns derived from its data, for tests that
need a real matrix with several obs columns: cell_type (categorical), donor_id
(categorical), n_genes (int: nonzeros per cell), total_counts (float).

    python add_obs_columns.py SRC DST
"""

import os
import sys

import anndata as ad
import numpy as np
import pandas as pd

src, dst = sys.argv[1], sys.argv[2]
adata = ad.read_h5ad(src)
x = adata.X.tocsr()
nnz = np.diff(x.indptr)
types = np.array(["T", "B", "NK", "monocyte", "DC"])
adata.obs["cell_type"] = pd.Categorical(types[nnz % len(types)])
adata.obs["donor_id"] = pd.Categorical([f"donor_{i % 4}" for i in range(adata.n_obs)])
adata.obs["n_genes"] = nnz.astype(np.int32)
adata.obs["total_counts"] = np.asarray(x.sum(axis=1)).ravel().astype(np.float64)
adata.write_h5ad(dst)

# Done. Leave without the interpreter's teardown, where a C++ extension's
# threads have been seen to abort the process ("terminate called without an
# active exception") after every check had passed; files are closed above.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
