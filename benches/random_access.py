"""Random batches through get_batch: what the chunking of a tile costs and
buys, against anndata's backed mode on the same cells, in one run.

    .venv/bin/python benches/random_access.py SOURCE.h5ad [--chunks 8,32,64,128,1024@1024] [--batches 40]
                                              [--work DIR] [--baseline OTHER.h5ad] [--reuse]
                                              [--cellstream] [--annbatch] [--scdl]

SOURCE is converted once per chunk count (`deltacells convert --chunks N`:
target/release/deltacells, or the installed package's command where that is
not built; the other settings at their defaults: 10,000-cell tiles, zstd
level 1; `N@T` also sets the tile size to T cells, `--tile-size T`, so that
1024@1024 stores one cell a chunk; with --reuse, stores already converted
are read again). Each is read as
`open_dataset` opens it (a cache of 512 MiB of decompressed chunks) and
with `cache_bytes=0` (every batch reads and decompresses what it needs).
Each store is then read, each reading in a process of its own:

- random batches: BATCHES batches of 1,024 cells drawn at random (the same
  cells for every store, sorted within a batch), each made a SciPy CSR;
  warm (the same batches read once, untimed, first) and cold (every file of
  the store dropped from the page cache first, fincore checking that none
  of it is left); warm means read once before, then the store opened again
  (the page cache holds it, deltacells' cache of decompressed chunks does
  not); "drawn again" reads the same batches once more in that open store;
- a full pass in consecutive 1,024-cell slices, warm (median of 3 after one);
- one shuffled epoch of the loader (`ds.batches(1024, seed=0)`, its
  defaults), warm, the store opened again first.

The same reads go to anndata's backed mode on SOURCE itself
(`read_h5ad(backed="r").X[rows]`, as stored: for a file anndata wrote, CSR
without compression), and to OTHER.h5ad, the same cells as anndata itself
writes them (contiguous datasets, no compression), which the "x anndata"
columns then compare with. The nonzeros read are compared, so a store that
gave other cells would show.

The peers are written and read by benches/peers.py (and benches/
random_peers.py), each reading in a process of its own in the virtual
environment peers.py makes under target/bench-peers (made there if missing;
a peer whose environment cannot be made is named with pip's last line, and
left out), with peers.py's protocol: warm, the full pass first (the median of
1 after one untimed), then the random batches read once untimed in the same
open store, then timed; cold, each timed reading after the store's files
left the page cache; no "drawn again" column:

- with --cellstream, cellstream's per-cell archive (`write_sharded(layout=
  "cell")`), read with `gather_rows` on two threads, the same batches;
- with --annbatch, annbatch's store (`DatasetCollection.add_adatas`,
  shuffled, as benches/peers.py writes it; its dataset_size, the cells it
  shuffles in memory, from ANNBATCH_DATASET_SIZE if set, as peers.py's
  --annbatch-dataset-size sets it), read through its Loader in two
  rows: the same batches, each handed to the Loader as one load request of
  its cells (a Sampler of ours; the cells found in annbatch's order by their
  obs_names); and annbatch's own `Loader(batch_size=1024, chunk_size=1,
  preload_nchunks=1024, shuffle=True)`, 1,024 random single cells a batch
  but its own cells (its "same cells" reads "no"). Both full passes read the
  store's own order, 1,024 consecutive cells a load request
  (benches/random_peers.py);
- with --scdl, BioNeMo SCDL's `SingleCellMemMapDataset` (from SOURCE's X),
  in an environment of its own (bionemo-scdl requires torch), each batch's
  cells read with `get_row` and made a CSR, the same batches.

Prints a table; not run by the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from cold import evict

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BUILT = REPO / "target" / "release" / "deltacells"
BINARY = BUILT if BUILT.exists() else Path(shutil.which("deltacells") or Path(sys.executable).parent / "deltacells")
BATCH = 1024
ENV = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")


def opened(store: str):
    """(cells, a reader of listed cells, a reader of a slice), each giving a SciPy CSR."""
    if store.endswith(".h5ad"):
        import anndata as ad

        x = ad.read_h5ad(store, backed="r").X
        return x.shape[0], lambda cells: x[cells], lambda a, b: x[a:b]
    import deltacells

    # "PATH#nocache": opened with no cache of decompressed chunks.
    path, _, how = store.partition("#")
    ds = deltacells.open_dataset(path, **({"cache_bytes": 0} if how == "nocache" else {}))
    return (ds.n_cells, lambda cells: ds.get_batch(cells).to_scipy(),
            lambda a, b: ds.get_batch(slice(a, b)).to_scipy())


def measure(store: str, batches: int, cold: bool) -> dict:
    """One store's reading, in this process (see the module's docstring)."""
    n, listed, sliced = opened(store)
    rng = np.random.default_rng(0)
    drawn = [np.sort(rng.choice(n, size=BATCH, replace=False)) for _ in range(batches)]
    result: dict = {"cells": n}
    if cold:
        result["cached_before"] = evict(Path(store.partition("#")[0]))
    else:
        for cells in drawn:
            listed(cells)
        # Opened again: the page cache holds the store, but what a reader
        # keeps of earlier reads (deltacells' cache of decompressed chunks)
        # is gone, so the batches are read as new draws would be.
        n, listed, sliced = opened(store)

    def timed() -> tuple[float, int]:
        started = time.perf_counter()
        nnz = 0
        for cells in drawn:
            m = listed(cells)
            assert m.shape[0] == BATCH
            nnz += m.nnz
        return time.perf_counter() - started, nnz

    seconds, nnz = timed()
    result.update(random_seconds=seconds, random_nnz=nnz)
    if not cold:
        # The same batches again, in the same open store: cells drawn again.
        result["again_seconds"] = timed()[0]
        passes = []
        for _ in range(4):
            started = time.perf_counter()
            full = 0
            for a in range(0, n, BATCH):
                full += sliced(a, min(a + BATCH, n)).nnz
            passes.append(time.perf_counter() - started)
        result.update(full_seconds=statistics.median(passes[1:]), nnz=full)
        if not store.endswith(".h5ad"):
            import deltacells

            ds = deltacells.open_dataset(store.partition("#")[0])
            started = time.perf_counter()
            for batch in ds.batches(BATCH, seed=0):
                batch.X.to_scipy()
            result["epoch_seconds"] = time.perf_counter() - started
    return result


def child(store: str, batches: int, cold: bool) -> dict:
    done = subprocess.run([sys.executable, str(Path(__file__)), "--measure", store, str(batches), str(cold)],
                          capture_output=True, text=True, env=ENV)
    if done.returncode != 0:
        raise RuntimeError(f"reading {store} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


#: The peers: what writes their store (benches/peers.py's convert), the
#: virtual environment they are read in, the store's name after SOURCE's,
#: and their rows: (name, the script that reads, the tool it reads with).
PEERS = {
    "cellstream": ("venv", "cellstream", [("cellstream per-cell archive", "peers.py", "cellstream")]),
    "annbatch": ("venv", "annbatch.zarr", [
        ("annbatch Loader, the same cells (a Sampler naming them)", "random_peers.py", "annbatch-cells"),
        ("annbatch Loader(chunk_size=1, preload_nchunks=1024), its own random cells", "random_peers.py",
         "annbatch-chunk1")]),
    "scdl": ("venv-scdl", "scdl", [("BioNeMo SCDL memmap (get_row per cell)", "peers.py", "scdl")]),
}


def peer(kind: str, source: Path, work: Path, batches: int, reuse: bool) -> tuple[dict, str]:
    """SOURCE written by a peer and read in benches/peers.py's virtual
    environment for it (made there if missing): its rows, and a line to print
    (its environment's versions, or why it is left out)."""
    sys.path.insert(0, str(HERE))
    import peers

    name, suffix, reads = PEERS[kind]
    python, why = peers.venv(REPO / "target" / "bench-peers", name, peers.SCDL if kind == "scdl" else peers.PEERS)
    if python is None:
        return {}, f"{kind}: left out, {why}"
    store = work / f"{source.stem}-{suffix}"

    def run(script: str, *args: str) -> dict:
        done = subprocess.run([python, str(HERE / script), "--measure", *args], capture_output=True, text=True,
                              env=ENV)
        if done.returncode != 0:
            raise RuntimeError(f"{kind} {' '.join(args[:2])} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    seconds = None
    if not (reuse and store.exists()):
        seconds = run("peers.py", "convert", kind, str(source), str(store))["seconds"]
    rows = {}
    for label, script, tool in reads:
        row: dict = {"convert_seconds": seconds, "bytes": size_of(store)}
        for how in ("warm", "cold"):
            r = run(script, "read", tool, str(store), str(batches), "1", how,
                    *([str(source)] if tool == "annbatch-cells" else []))
            r["again_seconds"] = float("nan")
            r["cached_before"] = r.get("cached_before") or 0
            row[how] = r
        rows[label] = row
    found = run("peers.py", "versions", kind)
    return rows, f"target/bench-peers/{name}: " + ", ".join(f"{k} {v}" for k, v in found.items())


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", nargs="?")
    parser.add_argument("--chunks", default="8,32,64,128",
                        help="chunks per tile, one store each; N@T: N chunks in tiles of T cells")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--work", default=str(REPO / "target" / "bench-random"))
    parser.add_argument("--baseline", help="the same cells as an .h5ad anndata wrote: the x-anndata columns' base")
    parser.add_argument("--reuse", action="store_true", help="read the stores already in --work, if complete")
    parser.add_argument("--cellstream", action="store_true", help="also cellstream's per-cell archive")
    parser.add_argument("--annbatch", action="store_true", help="also annbatch's store, through its Loader")
    parser.add_argument("--scdl", action="store_true",
                        help="also BioNeMo SCDL's memory maps (its environment installs torch: 5.8 GB)")
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        store, batches, cold = args.measure
        print(json.dumps(measure(store, int(batches), cold == "True")))
        return
    if not args.source:
        parser.error("SOURCE (an .h5ad) is required")
    source = Path(args.source)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = {}
    for setting in args.chunks.split(","):
        chunks, _, tile = setting.partition("@")
        store = work / (f"{source.stem}-chunks{chunks}" + (f"-tile{tile}" if tile else ""))
        flags = ["--chunks", chunks, *(["--tile-size", tile] if tile else [])]
        seconds = None
        if not (args.reuse and (store / "manifest.json").is_file()):
            shutil.rmtree(store, ignore_errors=True)
            started = time.perf_counter()
            subprocess.run([str(BINARY), "convert", "-q", *flags, str(source), str(store)], check=True, env=ENV)
            seconds = time.perf_counter() - started
        for label, how in (("", ""), (", no cache", "#nocache")):
            rows[f"deltacells {' '.join(flags)}{label}"] = {
                "convert_seconds": seconds, "bytes": size_of(store),
                "warm": child(str(store) + how, args.batches, False),
                "cold": child(str(store) + how, args.batches, True)}
        print(f"# {' '.join(flags)}: converted in {seconds or 0:.1f} s (0: reused), read", file=sys.stderr)
    rows["anndata backed (.h5ad as given)"] = {"bytes": size_of(source),
                                               "warm": child(str(source), args.batches, False),
                                               "cold": child(str(source), args.batches, True)}
    base = rows["anndata backed (.h5ad as given)"]
    if args.baseline:
        rows["anndata backed (.h5ad anndata wrote)"] = base = {
            "bytes": size_of(Path(args.baseline)), "warm": child(args.baseline, args.batches, False),
            "cold": child(args.baseline, args.batches, True)}
    notes = []
    for kind in ("cellstream", "annbatch", "scdl"):
        if getattr(args, kind):
            found, note = peer(kind, source, work, args.batches, args.reuse)
            rows.update(found)
            notes.append(note)
            print(f"# {kind}: read", file=sys.stderr)
    first = next(iter(rows.values()))
    print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; {source} ({first['warm']['cells']:,} cells, "
          f"{first['warm']['nnz']:,} nonzeros); {args.batches} random batches of {BATCH:,} cells, the same for every "
          "store; cold: the store's files dropped from the page cache before the batches (bytes left cached, at "
          f"most: {max(r['cold']['cached_before'] for r in rows.values()):,})")
    for note in dict.fromkeys(notes):  # an environment's versions once
        print(f"# {note}")
    print()
    print("| store | bytes/nnz | random cells/s, warm | x anndata | random cells/s, cold | x anndata | "
          "drawn again cells/s | full pass cells/s, warm | shuffled epoch cells/s, warm | same cells |")
    print("|---|---|---|---|---|---|---|---|---|---|")

    def speed(r: dict) -> float:
        return args.batches * BATCH / r["random_seconds"]

    def again(r: dict) -> str:
        seconds = r["again_seconds"]
        return "-" if seconds != seconds else f"{args.batches * BATCH / seconds:,.0f}"

    def epoch(r: dict) -> str:
        return f"{r['cells'] / r['epoch_seconds']:,.0f}" if "epoch_seconds" in r else "-"

    for name, r in rows.items():
        same = "yes" if (r["warm"]["nnz"] == base["warm"]["nnz"]
                         and r["warm"]["random_nnz"] == r["cold"]["random_nnz"] == base["warm"]["random_nnz"]) else "NO"
        if r["warm"].get("own_cells"):
            # A loader that draws its cells: only its full pass can match.
            same = "no (its own random cells)" if r["warm"]["nnz"] == base["warm"]["nnz"] else "NO"
        print(f"| {name} | {r['bytes'] / r['warm']['nnz']:.3f} | {speed(r['warm']):,.0f} | "
              f"{speed(r['warm']) / speed(base['warm']):.2f}x | {speed(r['cold']):,.0f} | "
              f"{speed(r['cold']) / speed(base['cold']):.2f}x | "
              f"{again(r['warm'])} | "
              f"{r['warm']['cells'] / r['warm']['full_seconds']:,.0f} | {epoch(r['warm'])} | {same} |")
    print(json.dumps(rows), file=sys.stderr)


if __name__ == "__main__":
    main()
