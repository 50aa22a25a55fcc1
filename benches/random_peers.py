"""annbatch's Loader reading random single cells, for benches/random_access.py:
run by it in the virtual environment of benches/peers.py (annbatch needs
Python >= 3.12), one reading a process.

    PYTHON benches/random_peers.py --measure read TOOL STORE BATCHES PASSES warm|cold [SOURCE]

STORE is annbatch's store of SOURCE, as benches/peers.py writes it
(`DatasetCollection(STORE).add_adatas([SOURCE], shuffle=True)`: the cells in
another order). TOOL is one of:

- annbatch-cells: the same random batches as every other store's (benches/
  peers.py's `random_batches`, cells of SOURCE), handed to annbatch's Loader
  through a Sampler of ours: each batch one load request of its 1,024 cells
  as integer indices into the store (the positions of those cells in annbatch's
  order, found by their obs_names, sorted), split into one batch. This is what
  annbatch's own `Loader(chunk_size=1, preload_nchunks=1024, batch_size=1024,
  shuffle=True)` asks its store for in each batch (1,024 single-cell
  requests), with the cells named;
- annbatch-chunk1: annbatch's own `Loader(batch_size=1024, chunk_size=1,
  preload_nchunks=1024, shuffle=True, drop_last=True)`, each batch the next of
  its shuffled epoch: as many random single cells, but its own (the nonzeros
  read differ from the other stores').

For both, the full pass reads the store in its own order through the Loader,
one load request of 1,024 consecutive cells a batch (the cells of SOURCE,
differently ordered: the same nonzeros in all). The protocol (warm and cold,
full pass, random batches) is benches/peers.py's `measure_read`; it prints its
result as one line of JSON.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from peers import BATCH, measure_read

TOOLS = ("annbatch-cells", "annbatch-chunk1")


def obs_names(group) -> np.ndarray:
    """The obs_names of an AnnData group (h5py or zarr), read alone."""
    import anndata as ad

    obs = group["obs"]
    return np.asarray(ad.io.read_elem(obs[obs.attrs.get("_index", "_index")]))


def annbatch_reader(source: str | None):
    """A `reader` for benches/peers.py's `measure_read`: (cells, a reader of
    consecutive cells of the store, a reader of listed cells), each giving a
    SciPy CSR; the listed cells are cells of `source` (annbatch-cells) or
    ignored (annbatch-chunk1: the next batch of its own shuffled epoch)."""

    def opened(tool: str, store: str):
        import anndata as ad
        import h5py
        import pandas as pd
        import scipy.sparse
        import zarr
        from annbatch import DatasetCollection, Loader
        from annbatch.abc import Sampler

        zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})

        class Requested(Sampler):
            """Yields one load request, the cells (or slices) it was last given,
            as one batch."""

            def __init__(self) -> None:
                self.requests: list[slice] | np.ndarray = []
                self.count = 0

            @property
            def batch_size(self) -> int:
                return self.count

            @property
            def shuffle(self) -> bool:
                return False

            def n_batches(self, n_obs: int) -> int:
                return 1

            def validate(self, n_obs: int) -> None:
                pass

            def _sample(self, n_obs: int):
                yield {"requests": self.requests, "splits": [np.arange(self.count)]}

        def load(group) -> ad.AnnData:
            return ad.AnnData(X=ad.io.sparse_dataset(group["X"]))

        collection = DatasetCollection(store, mode="r")
        requested = Requested()
        loader = Loader(batch_sampler=requested).use_collection(collection, load_adata=load)

        def read(requests, count: int) -> scipy.sparse.csr_matrix:
            requested.requests, requested.count = requests, count
            (batch,) = list(loader)
            return batch["X"]

        def consecutive(a: int, b: int) -> scipy.sparse.csr_matrix:
            return read([slice(a, b)], b - a)

        n = loader.n_obs
        if tool == "annbatch-chunk1":
            own = Loader(batch_size=BATCH, chunk_size=1, preload_nchunks=BATCH, shuffle=True, drop_last=True,
                         rng=np.random.default_rng(0)).use_collection(collection, load_adata=load)
            epoch = iter(own)

            def listed(_cells: np.ndarray) -> scipy.sparse.csr_matrix:
                nonlocal epoch
                for _ in range(2):
                    try:
                        return next(epoch)["X"]
                    except StopIteration:  # an epoch done: the next one
                        epoch = iter(own)
                raise RuntimeError("annbatch's Loader gave no batch")

            return n, consecutive, listed
        if tool != "annbatch-cells":
            raise ValueError(tool)
        if source is None:
            raise ValueError("annbatch-cells needs SOURCE, the .h5ad the store was written from")
        with h5py.File(source, "r") as f:
            names = obs_names(f)
        mine = np.concatenate([obs_names(group) for group in collection])
        where = pd.Index(mine).get_indexer(names)  # source cell -> its position in annbatch's store
        if len(names) != n or (where < 0).any():
            raise ValueError(f"{store} does not hold the cells of {source} under their obs_names")

        def cells(cells: np.ndarray) -> scipy.sparse.csr_matrix:
            return read(np.sort(where[cells]), len(cells))

        return n, consecutive, cells

    return opened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", nargs="+", required=True, metavar="read TOOL STORE BATCHES PASSES HOW [SOURCE]")
    args = parser.parse_args()
    what, tool, store, batches, passes, how, *source = args.measure + [""] * (6 - len(args.measure))
    if what != "read" or tool not in TOOLS or how not in ("warm", "cold") or len(source) > 1:
        parser.error(f"--measure read TOOL STORE BATCHES PASSES HOW [SOURCE]: TOOL one of {', '.join(TOOLS)}, "
                     "HOW warm or cold")
    result = measure_read(tool, store, int(batches), int(passes), how == "cold",
                          opened=annbatch_reader(source[0] if source else None))
    result["own_cells"] = tool == "annbatch-chunk1"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
