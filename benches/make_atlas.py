"""Large inputs from real cells, for the scale benchmarks: the PBMC cells
repeated, each copy's genes placed at random columns of a wide gene axis.

    .venv/bin/python benches/make_atlas.py --cells 1000000 [--per-file 10000] [--genes 62710]
                                           [--one-file] [--compression gzip] [--out DIR]

Copy k of the 13,999 PBMC cells (the two files of ../shared/data/fetch-pbmc.sh,
ctrl then stim) has its 14,053 genes placed at 14,053 columns of GENES (62,710
by default, Tahoe-100M's count) chosen at random for that copy, so that cells
of different copies use different genes and a cell's columns have the wide
gaps real atlases have. The cells are written, in order, as files of PER_FILE
cells (atlas_0000.h5ad, ...), each file one sample; with --one-file also as
one .h5ad of all of them (atlas.h5ad). obs columns: sample (one per file),
donor (one per 4 files), cell_type (12 categories, at random with unequal
frequencies), condition (ctrl or stim, from the source file) and n_counts
(float64). var: the gene IDs as the index, and a gene_symbol column.

It streams: at most one file's cells are in memory (the one big file is
written block by block with h5py), so memory stays at a few hundred MB for
any number of cells. X is a float32 CSR matrix, as anndata writes it.
Files already there (same name, same size asked) are kept.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CELL_TYPES = ["T", "B", "NK", "Mono", "DC", "pDC", "Platelet", "CD8 T", "CD4 T", "NK bright", "Plasma", "HSPC"]


def pbmc() -> tuple[sp.csr_matrix, np.ndarray]:
    """The PBMC cells (float32 CSR) and each one's condition (0 ctrl, 1 stim)."""
    import anndata

    parts = [anndata.read_h5ad(REPO / "data" / "pbmc" / f"pbmc_{n}.h5ad") for n in ("ctrl", "stim")]
    x = sp.vstack([sp.csr_matrix(p.X, dtype=np.float32) for p in parts], format="csr")
    x.sort_indices()
    condition = np.concatenate([np.full(p.n_obs, i, dtype=np.int8) for i, p in enumerate(parts)])
    return x, condition


class Atlas:
    """The generated cells, by global index: cell i is PBMC cell i % n of copy i // n."""

    def __init__(self, genes: int, seed: int = 0) -> None:
        self.x, self.condition = pbmc()
        self.n_source = self.x.shape[0]
        self.genes = genes
        self.seed = seed
        self._columns: dict[int, np.ndarray] = {}
        rng = np.random.default_rng(seed + 1)
        weights = rng.random(len(CELL_TYPES)) ** 2 + 0.01
        self.type_p = weights / weights.sum()

    def columns(self, copy: int) -> np.ndarray:
        """Where copy `copy` puts the source genes: sorted target columns
        drawn at random (a new draw per copy)."""
        if copy not in self._columns:
            rng = np.random.default_rng([self.seed, copy])
            self._columns = {copy: np.sort(rng.choice(self.genes, self.x.shape[1], replace=False)).astype(np.int32)}
        return self._columns[copy]

    def block(self, start: int, end: int) -> tuple[sp.csr_matrix, dict[str, np.ndarray]]:
        """Cells start..end: their counts and the per-cell obs values."""
        pieces, conditions = [], []
        i = start
        while i < end:
            copy, row = divmod(i, self.n_source)
            take = min(end - i, self.n_source - row)
            part = self.x[row:row + take]
            # Source gene g goes to column columns[g]: sorted, so each row stays sorted.
            mapped = sp.csr_matrix((part.data, self.columns(copy)[part.indices], part.indptr),
                                   shape=(take, self.genes))
            pieces.append(mapped)
            conditions.append(self.condition[row:row + take])
            i += take
        x = sp.vstack(pieces, format="csr") if len(pieces) > 1 else pieces[0]
        rng = np.random.default_rng([self.seed, 7, start])
        obs = {
            "cell_type": rng.choice(len(CELL_TYPES), end - start, p=self.type_p).astype(np.int8),
            "condition": np.concatenate(conditions),
            "n_counts": np.asarray(x.sum(axis=1)).ravel().astype(np.float64),
        }
        return x, obs

    def var(self):
        import pandas as pd

        ids = [f"ENSG{j:011d}" for j in range(self.genes)]
        return pd.DataFrame({"gene_symbol": [f"GENE{j}" for j in range(self.genes)]},
                            index=pd.Index(ids, name="gene_ids"))


def obs_frame(obs: dict[str, np.ndarray], start: int, file: int):
    import pandas as pd

    n = len(obs["n_counts"])
    return pd.DataFrame(
        {
            "sample": pd.Categorical([f"sample_{file:04d}"] * n),
            "donor": pd.Categorical([f"donor_{file // 4:03d}"] * n),
            "cell_type": pd.Categorical.from_codes(obs["cell_type"], categories=CELL_TYPES),
            "condition": pd.Categorical.from_codes(obs["condition"], categories=["ctrl", "stim"]),
            "n_counts": obs["n_counts"],
        },
        index=pd.Index([f"cell_{start + i:09d}" for i in range(n)]),
    )


def write_files(
    atlas: Atlas, cells: int, per_file: int, out: Path, first: int = 0, compression: str | None = None
) -> list[Path]:
    """Cells first..first+cells as files of per_file cells, numbered on from
    first // per_file (first a multiple of per_file), so that blocks made one
    after another are the files one call for all of them would make; their
    arrays compressed by HDF5's filter `compression` ("gzip", "lzf") or not."""
    import anndata

    paths = []
    var = atlas.var()
    for start in range(first, first + cells, per_file):
        file = start // per_file
        end = min(first + cells, start + per_file)
        path = out / f"atlas_{file:04d}.h5ad"
        paths.append(path)
        if path.exists():
            continue
        x, obs = atlas.block(start, end)
        adata = anndata.AnnData(X=x, obs=obs_frame(obs, start, file), var=var)
        tmp = path.with_suffix(".tmp.h5ad")
        adata.write_h5ad(tmp, compression=compression)
        tmp.rename(path)
    return paths


def csr_group(f, shape: tuple[int, int]):
    """Marks the open h5py file `f` as an AnnData file and makes its X group,
    a CSR matrix of `shape` whose arrays the caller writes."""
    f.attrs["encoding-type"] = "anndata"
    f.attrs["encoding-version"] = "0.1.0"
    g = f.create_group("X")
    g.attrs["encoding-type"] = "csr_matrix"
    g.attrs["encoding-version"] = "0.1.0"
    g.attrs["shape"] = shape
    return g


def write_one(atlas: Atlas, cells: int, per_file: int, path: Path, block: int = 50_000) -> None:
    """All the cells as one .h5ad, written block by block: X with h5py
    (resizable datasets), obs and var with anndata's writer."""
    import anndata
    import h5py
    import pandas as pd
    from anndata.io import write_elem

    if path.exists():
        return
    tmp = path.with_suffix(".tmp.h5ad")
    frames = []
    with h5py.File(tmp, "w") as f:
        g = csr_group(f, (cells, atlas.genes))
        data = g.create_dataset("data", (0,), maxshape=(None,), dtype=np.float32, chunks=(1 << 20,))
        indices = g.create_dataset("indices", (0,), maxshape=(None,), dtype=np.int32, chunks=(1 << 20,))
        indptr = [np.zeros(1, dtype=np.int64)]
        nnz = 0
        for start in range(0, cells, block):
            end = min(cells, start + block)
            x, obs = atlas.block(start, end)
            data.resize((nnz + x.nnz,))
            indices.resize((nnz + x.nnz,))
            data[nnz:] = x.data
            indices[nnz:] = x.indices
            indptr.append(x.indptr[1:].astype(np.int64) + nnz)
            nnz += x.nnz
            # obs per file of per_file cells, as the many-file set has it
            for file_start in range(start - start % per_file, end, per_file):
                lo, hi = max(start, file_start), min(end, file_start + per_file)
                piece = {k: v[lo - start:hi - start] for k, v in obs.items()}
                frames.append(obs_frame(piece, lo, file_start // per_file))
        g.create_dataset("indptr", data=np.concatenate(indptr))
        frame = pd.concat(frames)
        for c in ("sample", "donor", "cell_type", "condition"):
            frame[c] = frame[c].astype("category")
        write_elem(f, "obs", frame)
        write_elem(f, "var", atlas.var())
        for key in ("layers", "obsm", "varm", "obsp", "varp", "uns"):
            write_elem(f, key, {})
    tmp.rename(path)
    anndata.read_h5ad(path, backed="r").file.close()  # readable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=1_000_000)
    parser.add_argument("--per-file", type=int, default=10_000)
    parser.add_argument("--genes", type=int, default=62_710)
    parser.add_argument("--start", type=int, default=0,
                        help="the first cell (a multiple of --per-file): make the block START..START+CELLS of "
                             "a larger atlas, its files numbered on, in the folder START+CELLS")
    parser.add_argument("--one-file", action="store_true", help="also write all the cells as one .h5ad")
    parser.add_argument("--compression", choices=["gzip", "lzf"],
                        help="compress the files' arrays with this HDF5 filter, as anndata's write_h5ad does "
                             "(about a third of the disk for gzip; the one file of --one-file stays plain)")
    parser.add_argument("--out", default=str(REPO / "target" / "bench-atlas"))
    args = parser.parse_args()
    if args.start % args.per_file or args.start < 0:
        parser.error(f"--start {args.start} is not a multiple of --per-file {args.per_file}")
    if args.start and args.one_file:
        parser.error("--one-file makes the cells from the first: it does not take --start")
    out = Path(args.out) / (f"{args.start}+{args.cells}" if args.start else f"{args.cells}")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    atlas = Atlas(args.genes)
    paths = write_files(atlas, args.cells, args.per_file, out, args.start, args.compression)
    if args.one_file:
        write_one(atlas, args.cells, args.per_file, out / "atlas.h5ad")
    size = sum(p.stat().st_size for p in paths)
    print(json.dumps({"folder": str(out), "files": len(paths), "cells": args.cells, "genes": args.genes,
                      "bytes": size, "seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
