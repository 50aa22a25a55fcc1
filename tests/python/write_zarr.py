"""Writes an .h5ad file's AnnData again as a zarr store, as anndata writes it.

    python tests/python/write_zarr.py IN.h5ad OUT.zarr {2,3,3-sharded}
"""

import sys
import warnings

import anndata as ad


def main() -> None:
    source, out, form = sys.argv[1:4]
    ad.settings.zarr_write_format = 2 if form == "2" else 3
    ad.settings.auto_shard_zarr_v3 = form == "3-sharded"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ad.read_h5ad(source).write_zarr(out)


if __name__ == "__main__":
    main()
