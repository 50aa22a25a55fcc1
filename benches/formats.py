"""Converts the same cells from each input format deltacells reads and
prints, per format, the median wall time and peak memory of `deltacells
convert` against the conversion of the .h5ad files, alternating the formats
in each round of one run.

    python benches/formats.py [--bin target/release/deltacells] [--pbmc data/pbmc] [--rounds 3]

The cells are the two PBMC files (14k cells, 9.6M nonzeros), written as:
10x Genomics .h5 (Cell Ranger 3's layout, gzip-compressed as Cell Ranger
writes it), Matrix Market folders as Cell Ranger writes them (gzip, entries
by cell), the same uncompressed, and the same gzip with the entries in a
random order (sorted in runs and merged before conversion), and AnnData
zarr stores as anndata writes them (v2 with Blosc, v3 sharded with
Zstandard, anndata 0.13's default). Every dataset
must come out with the tiles of the .h5ad conversion, which is checked.
Inputs are read once before timing: the page cache is warm.
"""

import argparse
import gzip
import hashlib
import os
import statistics
import subprocess
import tempfile
import time
import warnings

import anndata as ad
import h5py
import numpy as np
import scipy.sparse as sp


def write_tenx(path: str, adata: ad.AnnData) -> None:
    """Cell Ranger 3's feature-barcode matrix: features x barcodes, by barcode."""
    x = sp.csr_matrix(adata.X).astype(np.int32)
    with h5py.File(path, "w") as f:
        g = f.create_group("matrix")
        opts = {"compression": "gzip", "compression_opts": 4, "chunks": (80000,)}
        g.create_dataset("data", data=x.data, **opts)
        g.create_dataset("indices", data=x.indices.astype(np.int64), **opts)
        g.create_dataset("indptr", data=x.indptr.astype(np.int64), compression="gzip")
        g.create_dataset("shape", data=np.array([x.shape[1], x.shape[0]], dtype=np.int32))
        g.create_dataset("barcodes", data=np.array(adata.obs_names, dtype="S"))
        features = g.create_group("features")
        names = np.array(adata.var_names, dtype="S")
        features.create_dataset("id", data=names)
        features.create_dataset("name", data=names)
        features.create_dataset("feature_type", data=np.array([b"Gene Expression"] * x.shape[1]))
        features.create_dataset("genome", data=np.array([b"GRCh38"] * x.shape[1]))


def write_mtx(folder: str, adata: ad.AnnData, compress: bool, scramble: bool) -> None:
    """A Matrix Market folder: genes x cells, entries by cell unless scrambled."""
    os.makedirs(folder, exist_ok=True)
    x = sp.csr_matrix(adata.X).astype(np.int64)
    cells = np.repeat(np.arange(x.shape[0]), np.diff(x.indptr))
    lines = np.stack([x.indices + 1, cells + 1, x.data], axis=1)
    if scramble:
        lines = lines[np.random.default_rng(0).permutation(len(lines))]
    header = f"%%MatrixMarket matrix coordinate integer general\n%\n{x.shape[1]} {x.shape[0]} {x.nnz}\n"
    opener = (lambda p: gzip.open(p + ".gz", "wt", compresslevel=6)) if compress else (lambda p: open(p, "w"))
    with opener(os.path.join(folder, "matrix.mtx")) as f:
        f.write(header)
        np.savetxt(f, lines, fmt="%d")
    with opener(os.path.join(folder, "features.tsv")) as f:
        f.writelines(f"{g}\t{g}\tGene Expression\n" for g in adata.var_names)
    with opener(os.path.join(folder, "barcodes.tsv")) as f:
        f.writelines(f"{b}\n" for b in adata.obs_names)


def run(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak resident MiB of a command (through GNU time: a
    child forked from this process would report this process's peak)."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.decode()}")
    return seconds, int(proc.stderr.decode().split()[-1]) / 1024


def tiles_digest(dataset: str) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(os.path.join(dataset, "tiles"))):
        with open(os.path.join(dataset, "tiles", name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default="target/release/deltacells")
    parser.add_argument("--pbmc", default="data/pbmc")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sources = [os.path.join(args.pbmc, f"pbmc_{s}.h5ad") for s in ("ctrl", "stim")]
    with tempfile.TemporaryDirectory() as tmp:
        forms: dict[str, list[str]] = {"h5ad": sources}
        for k, source in enumerate(sources):
            adata = ad.read_h5ad(source)
            forms.setdefault("10x .h5", []).append(f"{tmp}/in{k}.h5")
            write_tenx(forms["10x .h5"][-1], adata)
            for form, compress, scramble in [
                ("mtx.gz (by cell)", True, False),
                ("mtx (by cell)", False, False),
                ("mtx.gz (any order)", True, True),
            ]:
                folder = f"{tmp}/{form.split()[0]}{'-scrambled' if scramble else ''}-{k}"
                write_mtx(folder, adata, compress, scramble)
                forms.setdefault(form, []).append(folder)
            for form, version, shard in [("zarr v2", 2, False), ("zarr v3 sharded", 3, True)]:
                ad.settings.zarr_write_format = version
                ad.settings.auto_shard_zarr_v3 = shard
                forms.setdefault(form, []).append(f"{tmp}/{form.replace(' ', '_')}-{k}.zarr")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    adata.write_zarr(forms[form][-1])
        sizes = {f: sum(_size(p) for p in paths) for f, paths in forms.items()}
        results: dict[str, list[tuple[float, float]]] = {f: [] for f in forms}
        digests = {}
        for round_ in range(args.rounds + 1):  # the first round warms the cache and is not counted
            for form, paths in forms.items():
                out = f"{tmp}/out-{len(digests)}" if round_ == 0 else f"{tmp}/out"
                measured = run([args.bin, "convert", "-q", "--overwrite", "--no-var", *paths, out])
                if round_ == 0:
                    digests[form] = tiles_digest(out)
                else:
                    results[form].append(measured)
    base_s = statistics.median(s for s, _ in results["h5ad"])
    base_m = statistics.median(m for _, m in results["h5ad"])
    print(f"PBMC, 2 files, 13,999 cells; median of {args.rounds} rounds, warm cache; deltacells convert --no-var")
    print(f"{'input':<20} {'input MB':>9} {'seconds':>8} {'x h5ad':>7} {'peak MiB':>9} {'x h5ad':>7}  same tiles")
    for form, measured in results.items():
        s = statistics.median(x for x, _ in measured)
        m = statistics.median(y for _, y in measured)
        same = digests[form] == digests["h5ad"]
        print(
            f"{form:<20} {sizes[form] / 1e6:>9.1f} {s:>8.2f} {s / base_s:>7.2f} {m:>9.0f} {m / base_m:>7.2f}  {same}"
        )


def _size(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)


if __name__ == "__main__":
    main()
