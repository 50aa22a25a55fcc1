"""Writes, with real anndata, an .h5ad whose obs has a column of every encoding
deltacells reads, and a JSON file of the values pandas sees (null where missing).

usage: make_obs_encodings.py OUT.h5ad OUT.json
"""
import json
import os
import sys

import anndata
import numpy as np
import pandas as pd
import scipy.sparse as sp

out, expected = sys.argv[1], sys.argv[2]
n = 9
rng = np.random.default_rng(1)
obs = pd.DataFrame(index=pd.Index([f"c{i}" for i in range(n)], name="barcodes"))
obs["cat_str"] = pd.Categorical(["a", "b", None, "a", "c", "b", "a", None, "c"])
obs["cat_ordered"] = pd.Categorical(["lo", "hi", "mid"] * 3, categories=["lo", "mid", "hi"], ordered=True)
obs["cat_int"] = pd.Categorical([3, 1, 3, 2, 1, 3, 2, 2, 1])
obs["text"] = [f"t{i}" for i in range(n)]
for dt in ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "float32", "float64"]:
    obs[dt] = np.arange(n).astype(dt)
obs["float_nan"] = [0.5, np.nan, 1.5, 2.5, np.nan, 3.5, 4.5, 5.5, 6.5]
obs["flag"] = [True, False] * 4 + [True]
obs["nullable_int"] = pd.array([1, None, 3, 4, None, 6, 7, 8, 9], dtype="Int32")
obs["nullable_bool"] = pd.array([True, None, False, True, False, None, True, True, False], dtype="boolean")
obs["nullable_str"] = pd.array(["x0", None, "y2", "z3", None, "x5", "y6", "z7", "x8"], dtype="string")
x = sp.csr_matrix(rng.integers(0, 4, size=(n, 6)).astype(np.float32))
adata = anndata.AnnData(X=x, obs=obs, var=pd.DataFrame(index=[f"g{i}" for i in range(6)]))
anndata.settings.allow_write_nullable_strings = True
adata.write_h5ad(out, convert_strings_to_categoricals=False)

# What anndata itself reads back (it turns repeated strings into categoricals
# when writing), as the reference.
obs = anndata.read_h5ad(out).obs
values = {"obs_names": list(obs.index)}
for c in obs.columns:
    s = obs[c]
    if isinstance(s.dtype, pd.CategoricalDtype):
        values[c] = {"categories": [v.item() if hasattr(v, "item") else v for v in s.cat.categories], "codes": [int(v) for v in s.cat.codes]}
    else:
        values[c] = [None if pd.isna(v) else (v.item() if hasattr(v, "item") else v) for v in s.astype(object)]
with open(expected, "w") as out:
    json.dump(values, out)

# Done. Leave without the interpreter's teardown, where a C++ extension's
# threads have been seen to abort the process ("terminate called without an
# active exception") after every check had passed; files are closed above.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
