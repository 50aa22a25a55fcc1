"""Checks with the Python stack that what deltacells writes reads back right.

usage: check_roundtrip.py DATASET EXPORTED.h5ad SOURCE.h5ad [SOURCE.h5ad ...]

- anndata reads EXPORTED (written by `deltacells export --source-gene-order`)
  and its X equals the sources' X stacked (as integer counts);
- pandas reads DATASET/var.parquet with its index restored, in the order of
  var_names.txt, and that order is the sources' var permuted by gene_order.npy.
Prints one line per check and exits non-zero on the first failure.
"""
import os
import sys

import anndata
import numpy as np
import pandas as pd
import scipy.sparse as sp

dataset, exported, sources = sys.argv[1], sys.argv[2], sys.argv[3:]

out = anndata.read_h5ad(exported)
src = [anndata.read_h5ad(s) for s in sources]
want = sp.vstack([sp.csr_matrix(a.X) for a in src]).tocsr()
got = sp.csr_matrix(out.X)
assert got.shape == want.shape, (got.shape, want.shape)
assert got.dtype == np.int32, got.dtype
diff = abs(got.astype(np.float64) - want.astype(np.float64))
assert diff.nnz == 0 or diff.max() == 0, "X differs"
assert list(out.var_names) == list(src[0].var_names), "var names differ"
print(f"anndata: {exported}: X {got.shape} equal to the sources ({got.nnz} nonzeros)")

order = np.load(f"{dataset}/gene_order.npy")
assert order.dtype == np.dtype("<i4"), order.dtype
names = open(f"{dataset}/var_names.txt", encoding="utf-8").read().split("\n")[:-1]
var = pd.read_parquet(f"{dataset}/var.parquet")
assert list(var.index) == names, "var.parquet index differs from var_names.txt"
assert list(var.index) == list(src[0].var_names[order]), "var order is not source[gene_order]"
assert var.index.name == src[0].var.index.name, (var.index.name, src[0].var.index.name)
for column in src[0].var.columns:
    a = var[column].reset_index(drop=True)
    b = src[0].var[column].iloc[order].reset_index(drop=True)
    assert a.astype(str).equals(b.astype(str)), f"var column {column} differs"
print(f"pandas: {dataset}/var.parquet: {len(var)} genes, index {var.index.name!r}, columns {list(var.columns)}")

# Done. Leave without the interpreter's teardown, where a C++ extension's
# threads have been seen to abort the process ("terminate called without an
# active exception") after every check had passed; files are closed above.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
