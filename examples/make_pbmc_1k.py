"""Makes examples/pbmc_1k.h5ad: the first 1,000 cells of the real 10x PBMC
control file (Kang et al. 2018, GSE96583) that ../shared/data/fetch-pbmc.sh
fetches, with X stored gzip-compressed inside the HDF5 file.

usage: python examples/make_pbmc_1k.py data/pbmc/pbmc_ctrl.h5ad examples/pbmc_1k.h5ad
(needs anndata: bash scripts/setup.sh, then .venv/bin/python)
"""
import sys

import anndata

source, out = sys.argv[1], sys.argv[2]
adata = anndata.read_h5ad(source)
adata[:1000].copy().write_h5ad(out, compression="gzip", compression_opts=9)
print(f"{out}: {adata[:1000].n_obs} cells x {adata.n_vars} genes")
