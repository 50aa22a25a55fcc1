"""Writes seed inputs of the input-format fuzz targets (mtx, tenx_h5, zarr)
into fuzz/corpus/<target>/, in the forms deltacells::inputs::fuzzing reads:

- mtx: a flags byte, then matrix, features and barcodes text joined by NULs;
- tenx_h5: the choices that describe a small valid Cell Ranger 3 file;
- zarr: the objects of the small stores in tests/data/zarr (X, obs, var),
  each a flags byte, a key of one length byte, a value of two (little-endian).

    python3 fuzz/seed_inputs.py CORPUS_FOLDER
"""

import json
import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STORES = os.path.join(HERE, "..", "tests", "data", "zarr")

MATRIX = "%%MatrixMarket matrix coordinate integer general\n%metadata_json: {}\n3 2 4\n1 1 5\n2 1 1\n3 2 2\n1 2 7\n"
FEATURES = "".join(f"g{i}\tG{i}\tGene Expression\n" for i in range(1, 4))
BARCODES = "AAAC-1\nAAAG-1\n"

# A Cell Ranger 3 file of 3 features and 2 barcodes, 4 entries (the order
# of choices in src/inputs/fuzzing/tenx_case.rs).
TENX_VALID = bytes(
    [1, 0, 3, 2, 4, 3]
    + [1, 0, 0, 20, 21, 22, 23, 1]  # data
    + [1, 0, 0, 15, 16, 17, 18, 1]  # indices
    + [1, 0, 0, 20, 22, 22, 0, 1]  # indptr 0 2 4
    + [1, 0, 1, 0]  # barcodes
    + [0, 0, 0, 0, 0, 0]  # feature types, genomes
    + [1, 0, 1, 0, 1, 0, 1, 1, 1, 0, 1, 0, 1, 0, 1, 1]  # id, name, feature_type, genome
)


def mtx_seeds():
    text = MATRIX.encode() + b"\0" + FEATURES.encode() + b"\0" + BARCODES.encode()
    yield "valid", b"\0" + text
    yield "gzip", b"\x01" + text
    yield "gzip-cut", bytes([1 | (4 << 3)]) + text  # half the gzip stream
    swapped = MATRIX.replace("3 2 4", "2 3 4").replace("1 1 5\n2 1 1\n3 2 2\n1 2 7", "1 1 5\n1 2 1\n2 3 2\n2 1 7")
    yield "cells-by-genes", b"\x06" + swapped.encode() + b"\0" + FEATURES.encode() + b"\0" + BARCODES.encode()


def tenx_seeds():
    yield "valid", TENX_VALID
    rng = random.Random(44)
    for k in range(12):
        yield f"random{k}", bytes(rng.randrange(256) for _ in range(rng.randrange(40, 300)))


def pack(store, keep):
    out = bytearray()
    for root, _, files in sorted(os.walk(store)):
        for name in sorted(files):
            path = os.path.join(root, name)
            key = os.path.relpath(path, store)
            if not keep(key):
                continue
            with open(path, "rb") as f:
                value = f.read()
            if key in ("zarr.json", ".zmetadata"):
                if key == ".zmetadata":
                    continue
                meta = json.loads(value)
                meta.pop("consolidated_metadata", None)
                value = json.dumps(meta).encode()
            if len(value) > 0xFFFF:
                continue
            out += bytes([0, len(key)]) + key.encode() + struct.pack("<H", len(value)) + value
    return bytes(out)


def zarr_seeds():
    top = ("X/", "obs/", "var/")
    for store in ["v2", "v3", "v3_sharded", "v3_csc", "v3_dense"]:
        yield store, pack(os.path.join(STORES, f"{store}.zarr"), lambda k: "/" not in k or k.startswith(top))
    # the smallest: no obs
    yield "v3-no-obs", pack(os.path.join(STORES, "v3.zarr"), lambda k: "/" not in k or k.startswith(("X/", "var/")))


def main():
    corpus = sys.argv[1]
    for target, seeds in [("mtx", mtx_seeds()), ("tenx_h5", tenx_seeds()), ("zarr", zarr_seeds())]:
        os.makedirs(os.path.join(corpus, target), exist_ok=True)
        for name, data in seeds:
            with open(os.path.join(corpus, target, f"seed-{name}"), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
