"""deltacells beside the stores a user would pick instead, on the same cells,
in one run on one machine.

    .venv/bin/python benches/peers.py [--copies 1,8] [--random-batches 40] [--scdl] [--work DIR]

The real PBMC cells (the two files of ../shared/data/fetch-pbmc.sh, as one
.h5ad: 13,999 cells; and repeated COPIES times: 8 gives 111,992) are stored by:

- deltacells (`deltacells convert`, its defaults: zstd level 19, all cores);
- plain .h5ad written by anndata, uncompressed and with gzip;
- anndata's zarr store (format 3, sharded: anndata's `auto_shard_zarr_v3`);
- TileDB-SOMA (`tiledbsoma.io.from_h5ad`);
- annbatch's store (`DatasetCollection.add_adatas`, shuffled, as its docs do);
- cellstream's per-cell archive (`write_sharded(layout="cell")`, read with
  `gather_rows`, two threads);
- BioNeMo SCDL (`SingleCellMemMapDataset`), only with --scdl: it requires
  torch (about 5.8 GB installed), so it is not installed unless asked for.

For each: bytes on disk and per nonzero, conversion time and peak memory (the
resident memory of the process that converted), and reading through the
tool's own Python API, each batch made a SciPy CSR matrix:

- full pass: every cell in order, in batches of 1,024 consecutive cells;
- random batches: RANDOM_BATCHES batches of 1,024 cells drawn at random (the
  same cells for every tool, sorted within a batch), once untimed (page cache),
  then timed; the nonzeros read are compared across tools, so a tool that
  returned other cells would show.

deltacells is read twice through get_batch: as it opens by default, and with
`cache_bytes=2**30` (decoded tiles kept in memory, 1 GiB: all of them here).
Two tools read through a training loader that chooses its cells: annbatch
(its Loader) and deltacells (`ds.batches`, a row of its own beside
`get_batch`). Their full pass is their unshuffled order and their random
batches their shuffled ones, compared with each other.

Every conversion and every read runs in a process of its own. The peers are
installed from PyPI in a virtual environment under the work folder (made once,
with a Python >= 3.12: annbatch and anndata 0.13 need it); deltacells is read
through the package installed in the running interpreter. Not run by the tests
(see docs/benchmarks/peers.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BATCH = 1024
PEERS = ["anndata>=0.13", "annbatch[zarrs]", "h5py", "cellstream"]
# tiledbsoma 2.3.0 does not cap anndata, but fails with anndata 0.13 (which
# lists X as layers[None]: "quote_from_bytes() expected bytes"): its own
# environment, with the anndata it was made for.
SOMA = ["tiledbsoma", "anndata<0.13"]
SCDL = ["bionemo-scdl"]


def peak_rss() -> int:
    """This process's own peak resident memory, in bytes: VmHWM, which starts
    afresh at exec (getrusage's ru_maxrss carries a parent's peak over fork
    and exec, so a child of a driver that had made its inputs in memory would
    report the driver's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def children_rss() -> int:
    """The peak resident memory of this process's largest waited-for child
    (at least this process's own size when it forked: small here, as the
    measuring process has only imported its tool when it runs a command)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def size_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# Conversions: each returns nothing; the caller times it and reads its memory.

def convert(tool: str, sources: list[str], out: str) -> None:
    """Stores `sources` (.h5ad files, in order) as `tool` does. Only
    deltacells and annbatch take several files; the others one."""
    if tool == "deltacells":
        binary = REPO / "target" / "release" / "deltacells"
        env = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")
        subprocess.run([str(binary), "convert", "-q", "--overwrite", *sources, out], check=True, env=env)
        return
    if tool == "annbatch":
        from annbatch import DatasetCollection

        size = os.environ.get("ANNBATCH_DATASET_SIZE")
        DatasetCollection(out).add_adatas(adata_paths=sources, shuffle=True,
                                          **({"dataset_size": size} if size else {}))
        return
    if len(sources) != 1:
        raise ValueError(f"{tool} stores one .h5ad here, not {len(sources)}")
    source = sources[0]
    if tool in ("h5ad", "h5ad-gzip"):
        import anndata as ad

        ad.read_h5ad(source).write_h5ad(out, compression="gzip" if tool == "h5ad-gzip" else None)
    elif tool == "zarr":
        import anndata as ad

        ad.settings.zarr_write_format = 3
        ad.settings.auto_shard_zarr_v3 = True
        ad.read_h5ad(source).write_zarr(out)
    elif tool == "soma":
        import tiledbsoma.io

        tiledbsoma.io.from_h5ad(out, source, measurement_name="RNA")
    elif tool == "cellstream":
        import cellstream

        # its per-cell layout, the one it publishes for scattered reads
        cellstream.write_sharded(source, out, layout="cell")
    elif tool == "scdl":
        from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

        SingleCellMemMapDataset(out, h5ad_path=source, use_X_not_raw=True)
    else:
        raise ValueError(tool)


# Readers: (number of cells, a function of (start, stop) for consecutive
# cells, a function of a sorted index array), each returning a SciPy CSR.

def reader(tool: str, store: str):
    import scipy.sparse

    if tool in ("deltacells", "deltacells-cached"):
        import deltacells

        # cached: decoded tiles are kept (1 GiB: every tile of 111,992 cells).
        ds = deltacells.open_dataset(store, cache_bytes=2**30 if tool == "deltacells-cached" else 0)
        return ds.n_cells, lambda a, b: ds.get_batch(slice(a, b)).to_scipy(), lambda i: ds.get_batch(i).to_scipy()
    if tool in ("h5ad", "h5ad-gzip"):
        import anndata as ad

        x = ad.read_h5ad(store, backed="r").X
        return x.shape[0], lambda a, b: x[a:b], lambda i: x[i]
    if tool == "zarr":
        import anndata as ad
        import zarr

        x = ad.io.sparse_dataset(zarr.open_group(store, mode="r")["X"])
        return x.shape[0], lambda a, b: x[a:b], lambda i: x[i]
    if tool == "soma":
        import tiledbsoma

        with tiledbsoma.Experiment.open(store) as exp:
            n = exp.obs.count
        x = tiledbsoma.SparseNDArray.open(f"{store}/ms/RNA/X/data")

        def block(coords) -> scipy.sparse.csr_matrix:
            matrix, _ = next(iter(x.read(coords=(coords,)).blockwise(axis=0, size=BATCH,
                                                                      reindex_disable_on_axis=[1]).scipy()))
            return matrix

        return n, lambda a, b: block(slice(a, b - 1)), block
    if tool == "cellstream":
        import cellstream

        archive = cellstream.open(store)
        # two decoding threads, as deltacells reads by default on this machine
        return (archive.shape[0], lambda a, b: archive.gather_rows(np.arange(a, b), n_threads=2),
                lambda i: archive.gather_rows(i, n_threads=2))
    if tool == "scdl":
        from bionemo.scdl.io.single_cell_memmap_dataset import SingleCellMemMapDataset

        ds = SingleCellMemMapDataset(store)
        n_genes = ds.number_of_variables()[0]

        def rows(cells) -> scipy.sparse.csr_matrix:
            parts = [ds.get_row(int(c))[0] for c in cells]
            indptr = np.zeros(len(parts) + 1, dtype=np.int64)
            np.cumsum([len(v) for v, _ in parts], out=indptr[1:])
            data = np.concatenate([v for v, _ in parts]) if parts else np.zeros(0)
            indices = np.concatenate([c for _, c in parts]) if parts else np.zeros(0, dtype=np.int64)
            return scipy.sparse.csr_matrix((data, indices, indptr), shape=(len(parts), n_genes))

        return ds.number_of_rows(), lambda a, b: rows(range(a, b)), rows
    raise ValueError(tool)


#: Tools that read their store through a memory map.
MAPS_ITS_STORE = {"cellstream", "scdl"}


def random_batches(n: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [np.sort(rng.choice(n, size=BATCH, replace=False)) for _ in range(count)]


class Cold:
    """Drops a store's files from the page cache before each timed pass when
    `cold` (and keeps the most bytes fincore still found cached then);
    otherwise does nothing."""

    def __init__(self, store: str, cold: bool) -> None:
        self.store = Path(store)
        self.cold = cold
        self.cached_before: int | None = None

    def __call__(self) -> None:
        if self.cold:
            from cold import evict

            left = evict(self.store)
            self.cached_before = max(left, self.cached_before or 0)

    def report(self) -> dict:
        return {"cold": self.cold, "cached_before": self.cached_before}


def loader_protocol(batches, count: int, passes: int, cold: Cold) -> dict:
    """The protocol for a loader that chooses its own cells: `batches(shuffle,
    seed)` iterates over an epoch of SciPy CSR batches. The full pass is the
    unshuffled epoch (median of `passes` after one untimed, or of `passes`
    each after the store left the page cache), the random batches the first
    `count` of a shuffled one (after `count` of another, untimed, when warm),
    and the shuffled epoch a whole shuffled one (after one untimed when warm)."""

    def run(shuffle: bool, seed: int, limit: int | None) -> tuple[float, int, int]:
        epoch = batches(shuffle, seed)  # made before the clock starts; read after
        cold()
        started = time.perf_counter()
        cells = nnz = 0
        for i, x in enumerate(epoch):
            if limit is not None and i == limit:
                break
            cells += x.shape[0]
            nnz += x.nnz
        return time.perf_counter() - started, cells, nnz

    full = [run(False, 0, None) for _ in range(passes + (0 if cold.cold else 1))]
    if not cold.cold:
        run(True, 1, count)
    random_seconds, random_cells, random_nnz = run(True, 2, count)
    if not cold.cold:
        run(True, 3, None)
    epoch_seconds, epoch_cells, _ = run(True, 4, None)
    timed = full if cold.cold else full[1:]
    return {"cells": full[0][1], "full_seconds": statistics.median(f[0] for f in timed), "full_first": full[0][0],
            "nnz": full[0][2], "random_seconds": random_seconds, "random_cells": random_cells,
            "random_nnz": random_nnz, "epoch_seconds": epoch_seconds, "epoch_cells": epoch_cells,
            "read_rss": peak_rss(), "own_cells": True, **cold.report()}


def annbatch_passes(store: str, count: int, passes: int, cold: Cold) -> dict:
    """annbatch reads through its Loader (random chunks of 512 cells, 32
    preloaded at a time, as its docs suggest)."""
    import anndata as ad
    import zarr
    from annbatch import DatasetCollection, Loader

    zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})

    def load(group) -> ad.AnnData:
        return ad.AnnData(X=ad.io.sparse_dataset(group["X"]))

    def batches(shuffle: bool, seed: int):
        loader = Loader(batch_size=BATCH, chunk_size=512, preload_nchunks=32, shuffle=shuffle,
                        rng=np.random.default_rng(seed))
        loader = loader.use_collection(DatasetCollection(store), load_adata=load)
        return (batch["X"] for batch in loader)

    return loader_protocol(batches, count, passes, cold)


def loader_passes(store: str, count: int, passes: int, cold: Cold) -> dict:
    """deltacells' loader, ds.batches (its shuffled epoch mixes the cells of a
    window of 4 tiles)."""
    import deltacells

    ds = deltacells.open_dataset(store)

    def batches(shuffle: bool, seed: int):
        return (batch.X.to_scipy() for batch in ds.batches(BATCH, shuffle=shuffle, seed=seed))

    return loader_protocol(batches, count, passes, cold)


def measure_read(tool: str, store: str, count: int, passes: int, cold_cache: bool, opened=reader) -> dict:
    """Reads `store` through `tool`: full passes in consecutive batches and
    `count` random batches. Warm: the median of `passes` full passes after one
    untimed, and the random batches timed after the same batches read once.
    Cold (`cold_cache`): the store's files are dropped from the page cache
    before each timed full pass and before the random batches, and nothing is
    read untimed first. `opened(tool, store)` opens the store as `reader` does
    (benches/random_peers.py gives its own)."""
    cold = Cold(store, cold_cache)
    if tool == "annbatch":
        return annbatch_passes(store, count, passes, cold)
    if tool == "deltacells-loader":
        return loader_passes(store, count, passes, cold)
    n, consecutive, listed = opened(tool, store)

    def cold_again() -> None:
        # A store the tool maps into memory keeps its pages while mapped:
        # closed before its files leave the page cache, opened again after
        # (untimed).
        nonlocal n, consecutive, listed
        if cold_cache and tool in MAPS_ITS_STORE:
            del consecutive, listed
            gc.collect()
            cold()
            n, consecutive, listed = opened(tool, store)
        else:
            cold()

    full = []
    nnz = 0
    for _ in range(passes + (0 if cold_cache else 1)):
        cold_again()
        started = time.perf_counter()
        nnz = 0
        for a in range(0, n, BATCH):
            nnz += consecutive(a, min(a + BATCH, n)).nnz
        full.append(time.perf_counter() - started)
    batches = random_batches(n, count)
    if not cold_cache:
        for b in batches:
            listed(b)
    cold_again()
    started = time.perf_counter()
    random_nnz = 0
    for b in batches:
        m = listed(b)
        assert m.shape[0] == BATCH, (tool, m.shape)
        random_nnz += m.nnz
    random_seconds = time.perf_counter() - started
    return {"cells": n, "full_seconds": statistics.median(full if cold_cache else full[1:]), "full_first": full[0],
            "nnz": nnz, "random_seconds": random_seconds, "random_cells": count * BATCH, "random_nnz": random_nnz,
            "read_rss": peak_rss(), **cold.report()}


def measure_convert(tool: str, sources: list[str], out: str) -> dict:
    path = Path(out)
    if path.exists():
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    started = time.perf_counter()
    convert(tool, sources, out)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "convert_rss": max(peak_rss(), children_rss()), "bytes": size_on_disk(path)}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": sys.version.split()[0]}
    for name in ("deltacells", "tiledbsoma", "anndata", "annbatch", "cellstream", "zarr", "zarrs", "h5py",
                 "bionemo-scdl", "torch", "numpy", "scipy"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def child(python: str, args: list[str]) -> dict:
    """Runs one measurement in a process of its own; its result."""
    done = subprocess.run([python, str(Path(__file__)), "--measure", *args], capture_output=True, text=True,
                          env=dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE"))
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def venv(work: Path, name: str, packages: list[str]) -> tuple[str | None, str]:
    """The Python of a virtual environment with `packages` (made once under
    `work`), or None and why not."""
    sys.path.insert(0, str(HERE))
    from loader import find_python312

    python = work / name / "bin" / "python"
    if not python.exists():
        base = find_python312()
        if base is None:
            return None, "needs Python >= 3.12; this machine has only " + sys.version.split()[0]
        subprocess.run([base, "-m", "venv", str(work / name)], check=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], capture_output=True, text=True)
        if done.returncode != 0:
            shutil.rmtree(work / name, ignore_errors=True)
            return None, f"pip install {' '.join(packages)} failed: {done.stderr.strip().splitlines()[-1]}"
    return str(python), ""


NAMES = {
    "deltacells": "deltacells get_batch",
    "deltacells-cached": "deltacells get_batch, cache_bytes=1 GiB",
    "deltacells-loader": "deltacells ds.batches loader",
    "h5ad": ".h5ad, uncompressed",
    "h5ad-gzip": ".h5ad, gzip",
    "zarr": "anndata zarr v3, sharded",
    "soma": "TileDB-SOMA",
    "annbatch": "annbatch Loader (zarrs)",
    "cellstream": "cellstream, per-cell layout",
    "scdl": "BioNeMo SCDL memmap",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", default="1,8", help="sizes, as copies of the PBMC files (comma-separated)")
    parser.add_argument("--random-batches", type=int, default=40)
    parser.add_argument("--passes", type=int, default=3, help="timed full passes (median), after one untimed")
    parser.add_argument("--source", help="an .h5ad (or a folder of them, for deltacells and annbatch only) to "
                        "store and read instead of the PBMC copies (for example benches/make_atlas.py's)")
    parser.add_argument("--reuse", action="store_true",
                        help="read a store already in the work folder instead of converting again")
    parser.add_argument("--annbatch-dataset-size",
                        help="annbatch's dataset_size (rows it holds in memory while it shuffles; its default 20GB)")
    parser.add_argument("--cold", action="store_true",
                        help="drop each store's files from the page cache before every timed pass")
    parser.add_argument("--scdl", action="store_true", help="also BioNeMo SCDL (installs torch)")
    parser.add_argument("--only", help="these tools only (comma-separated)")
    parser.add_argument("--work", default=str(REPO / "target" / "bench-peers"))
    parser.add_argument("--out", default=str(REPO / "docs" / "figures" / "peers"),
                        help="where results.json and the figures go")
    parser.add_argument("--plot-only", action="store_true", help="plot the results.json already in --out")
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.measure:
        what, tool, *rest = args.measure
        if what == "convert":
            result = measure_convert(tool, rest[0].split(os.pathsep), rest[1])
        elif what == "read":
            result = measure_read(tool, rest[0], int(rest[1]), int(rest[2]), rest[3] == "cold")
        else:
            result = versions()
        print(json.dumps(result))
        return

    out = Path(args.out)
    if args.plot_only:
        plot(json.loads((out / "results.json").read_text()), out)
        return
    sys.path.insert(0, str(HERE))
    from pbmc_copies import make_inputs

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ours = sys.executable
    peers, why_not = venv(work, "venv", PEERS)
    soma, soma_why_not = venv(work, "venv-soma", SOMA)
    tools = {"deltacells": ours, "deltacells-cached": ours, "deltacells-loader": ours}
    absent: dict[str, str] = {}
    for tool in ("h5ad", "h5ad-gzip", "zarr", "soma", "annbatch", "cellstream"):
        python, why = (soma, soma_why_not) if tool == "soma" else (peers, why_not)
        if python is None:
            absent[tool] = why
        else:
            tools[tool] = python
    if args.scdl:
        scdl, why = venv(work, "venv-scdl", SCDL)
        if scdl is None:
            absent["scdl"] = why
        else:
            tools["scdl"] = scdl
    else:
        absent["scdl"] = ("not run without --scdl: bionemo-scdl 0.1.3 requires torch (pip installs torch and "
                          "its CUDA libraries, 5.8 GB), and imports it at module level")
    if args.cold:
        # Decoded tiles kept in the process: the same with a cold page cache.
        tools.pop("deltacells-cached")
    if args.only:
        keep = args.only.split(",")
        tools = {t: p for t, p in tools.items() if t in keep}

    cache = "cold" if args.cold else "warm"
    passes = (f"each timed pass after the store's files left the page cache, full pass median of {args.passes}"
              if args.cold else f"full pass median of {args.passes} after one")
    print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; batches of {BATCH:,} cells, "
          f"{args.random_batches} random batches; {passes}")
    seen_versions = {}
    for tool, python in tools.items():
        if python not in seen_versions:
            seen_versions[python] = child(python, ["versions", tool])
    for python, found in seen_versions.items():
        print(f"# {Path(python).parent.parent.name}: " + ", ".join(f"{k} {v}" for k, v in found.items()))
    for tool, reason in absent.items():
        print(f"# {NAMES[tool]}: {reason}")
    results = {}
    if args.annbatch_dataset_size:
        os.environ["ANNBATCH_DATASET_SIZE"] = args.annbatch_dataset_size
    sources: list[tuple[str, list[Path]]]
    if args.source:
        given = Path(args.source)
        files = sorted(given.glob("*.h5ad")) if given.is_dir() else [given]
        label = (f"{len(files)}-files-{given.name}" if given.is_dir() else f"{given.stem}-{given.parent.name}")
        sources = [(label, files)]
    else:
        sources = [(f"x{c}", [make_inputs(REPO / "target" / "bench-reader", int(c))[0]])
                   for c in args.copies.split(",")]
    for label, files in sources:
        folder = work / label
        folder.mkdir(exist_ok=True)
        rows: dict[str, dict] = {}
        for tool, python in tools.items():
            kind = "deltacells" if tool.startswith("deltacells") else tool
            store = folder / (kind + (".h5ad" if tool.startswith("h5ad") else ""))
            if tool != kind and "deltacells" in rows:
                made = {k: rows["deltacells"][k] for k in ("seconds", "convert_rss", "bytes")}
            elif args.reuse and store.exists():
                made = {"seconds": float("nan"), "convert_rss": 0, "bytes": size_on_disk(store)}
            else:
                made = child(python, ["convert", kind, os.pathsep.join(map(str, files)), str(store)])
            read = child(python, ["read", tool, str(store), str(args.random_batches), str(args.passes), cache])
            rows[tool] = {**made, **read}
            print(f"#   {label} {tool}: converted in {made['seconds']:.1f} s, read", file=sys.stderr)
        results[label] = rows
        table(label, rows)
    everything = {"date": time.strftime("%Y-%m-%d"), "versions": list(seen_versions.values()), "absent": absent,
                  "page_cache": cache, "results": results}
    out.mkdir(parents=True, exist_ok=True)
    name = "results.json" if not args.source and not args.cold else f"results-{'-'.join(results)}-{cache}.json"
    if args.only:
        name = name.replace(".json", f"-{args.only.replace(',', '-')}.json")
    (out / name).write_text(json.dumps(everything, indent=1) + "\n")
    print(f"# wrote {out / name}")
    if name == "results.json":
        plot(everything, out)


def plot(everything: dict, out: Path) -> None:
    """One figure per size: bytes per nonzero and cells/s of both protocols
    (needs matplotlib: `.venv/bin/pip install matplotlib`)."""
    try:
        import matplotlib
    except ImportError:
        print("# no figures: matplotlib is not installed (.venv/bin/pip install matplotlib)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for key, rows in everything["results"].items():
        label = key if key.startswith("x") else f"x{key}"  # results.json of before: keys were the copies
        tools = list(rows)
        labels = [NAMES[t].replace(" (zarrs)", "").replace(", ", "\n").replace(" ds.", "\nds.") for t in tools]
        colors = ["#cc6677" if t.startswith("deltacells") else "#4477aa" for t in tools]
        panels = [
            ([rows[t]["bytes"] / rows[t]["nnz"] for t in tools], "bytes per nonzero (lower is better)"),
            ([rows[t]["cells"] / rows[t]["full_seconds"] / 1e3 for t in tools], "full pass, k cells/s"),
            ([speed(rows[t]) / 1e3 for t in tools], "random 1,024-cell batches, k cells/s"),
        ]
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for ax, (values, title) in zip(axes, panels, strict=True):
            ax.barh(range(len(values)), values, color=colors)
            ax.set_yticks(range(len(values)), labels, fontsize=7)
            ax.invert_yaxis()
            ax.set_title(title, fontsize=10)
            if "random" in title:
                ax.set_xscale("log")
            for i, v in enumerate(values):
                ax.annotate(f" {v:.3g}", (v, i), va="center", fontsize=7)
        first = next(iter(rows.values()))
        fig.suptitle(f"PBMC {label}: {first['cells']:,} cells, {first['nnz']:,} nonzeros; "
                     "the loaders (annbatch, ds.batches) choose their own random cells", fontsize=10)
        fig.tight_layout()
        name = out / f"peers-{label}.png"
        fig.savefig(name, dpi=110)
        plt.close(fig)
        print(f"# wrote {name}")


def speed(r: dict) -> float:
    """Random batches' cells per second."""
    return r["random_cells"] / r["random_seconds"]


def epoch_speed(r: dict) -> str:
    """A loader's cells per second over a whole shuffled epoch, or a dash."""
    return f"{r['epoch_cells'] / r['epoch_seconds']:,.0f}" if "epoch_seconds" in r else "-"


def table(label: str, rows: dict) -> None:
    base = rows.get("deltacells")
    first = next(iter(rows.values()))
    print()
    name = f"PBMC {label}" if label.startswith("x") else label
    print(f"## {name}: {first['cells']:,} cells, {first['nnz']:,} nonzeros"
          + ("" if first.get("cached_before") is None else
             f"; cold page cache (bytes left cached before a pass, at most: "
             f"{max(r.get('cached_before') or 0 for r in rows.values()):,})"))
    print()
    print("| store | size MiB | bytes/nnz | convert s | convert peak MiB | full pass cells/s | "
          "random cells/s | shuffled epoch cells/s | read peak MiB | same cells |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for tool, r in rows.items():
        same = "yes" if base is None or (r["nnz"] == base["nnz"] and r["random_nnz"] == base["random_nnz"]) else "NO"
        if r.get("own_cells"):
            same = ("full pass" if base is None or r["nnz"] == base["nnz"] else "NO") + "; its own random cells"
        print(f"| {NAMES[tool]} | {r['bytes'] / 2**20:,.1f} | {r['bytes'] / r['nnz']:.3f} | {r['seconds']:.1f} | "
              f"{r['convert_rss'] / 2**20:,.0f} | {r['cells'] / r['full_seconds']:,.0f} | "
              f"{r['random_cells'] / r['random_seconds']:,.0f} | {epoch_speed(r)} | "
              f"{r['read_rss'] / 2**20:,.0f} | {same} |")
    if base is not None:
        print()
        for tool, r in rows.items():
            if tool == "deltacells":
                continue
            if tool in ("deltacells-loader", "deltacells-cached"):
                continue
            # The loaders choose their own cells: compared with each other.
            ours = "deltacells-loader" if r.get("own_cells") and "deltacells-loader" in rows else "deltacells"
            mine = rows[ours]
            epoch = ""
            if "epoch_seconds" in r and "epoch_seconds" in mine:
                ratio = (mine["epoch_cells"] / mine["epoch_seconds"]) / (r["epoch_cells"] / r["epoch_seconds"])
                epoch = f", {ratio:.2f}x in a shuffled epoch"
            print(f"- {NAMES[tool]}: {r['bytes'] / base['bytes']:.1f}x deltacells' bytes; {NAMES[ours]} is "
                  f"{r['full_seconds'] / mine['full_seconds']:.2f}x as fast in a full pass and "
                  f"{speed(mine) / speed(r):.2f}x in random batches{epoch}")


if __name__ == "__main__":
    main()
