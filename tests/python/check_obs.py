"""Checks a dataset's obs with the Python stack.

usage: check_obs.py DATASET [EXPECTED.obs.json] [--cache DIR]

- pyarrow reads every shard: one row group per tile with that tile's cells, the
  columns and Arrow types of obs/schema.json;
- the fingerprint recomputed exactly as decisions.md 20 says (json.dumps with
  sort_keys) equals the manifest's;
- with EXPECTED, every column's kind, type, categories and values (null where
  missing) equal it.
"""
import hashlib
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

dataset = sys.argv[1]
manifest = json.load(open(f"{dataset}/manifest.json"))
schema_text = open(f"{dataset}/obs/schema.json", encoding="utf-8").read()
schema = json.loads(schema_text)
k = manifest["obs_tiles_per_file"]
tables = []
for s, sha in enumerate(manifest["obs_shard_sha256"]):
    path = f"{dataset}/obs/obs_{s:04d}.parquet"
    data = open(path, "rb").read()
    assert hashlib.sha256(data).hexdigest() == sha, f"{path}: sha256"
    f = pq.ParquetFile(path)
    tiles = manifest["tile_cells"][s * k:(s + 1) * k]
    assert [f.metadata.row_group(i).num_rows for i in range(f.metadata.num_row_groups)] == tiles, f"{path}: row groups"
    names = [c["name"] for c in schema["columns"]]
    assert f.schema_arrow.names == names, (f.schema_arrow.names, names)
    for c, field in zip(schema["columns"], f.schema_arrow):
        assert str(field.type) == c["arrow_type"], (c["name"], str(field.type), c["arrow_type"])
    tables.append(f.read())
obj = {"schema": schema_text, "tile_cells": manifest["tile_cells"], "shards": manifest["obs_shard_sha256"]}
fingerprint = hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()[:24]
assert fingerprint == manifest["obs_fingerprint"], (fingerprint, manifest["obs_fingerprint"])
table = pa.concat_tables(tables) if tables else None
print(f"pyarrow: {dataset}: {len(tables)} shards, {table.num_rows if table else 0} rows, fingerprint {fingerprint} recomputed")

if len(sys.argv) > 2 and sys.argv[2] != "--cache":
    expected = json.load(open(sys.argv[2]))
    assert [c["name"] for c in schema["columns"]] == list(expected), "column order"
    for c in schema["columns"]:
        e = expected[c["name"]]
        assert (c["kind"], c["arrow_type"], c["categories"]) == (e["kind"], e["arrow_type"], e["categories"]), c["name"]
        got = table.column(c["name"]).to_pylist()
        want = e["values"]
        same = all((g is None and w is None) or (g is not None and w is not None and abs(g - w) < 1e-6 if isinstance(w, float) else g == w) for g, w in zip(got, want))
        assert same and len(got) == len(want), (c["name"], got, want)
    print(f"pyarrow: every column equals {sys.argv[2]}")

# With --cache DIR: every cached column memory-maps with pyarrow and equals the shards.
if "--cache" in sys.argv:
    cache = sys.argv[sys.argv.index("--cache") + 1]
    import os
    import urllib.parse
    checked = 0
    for c in schema["columns"]:
        path = os.path.join(cache, manifest["obs_fingerprint"], "obs", urllib.parse.quote(c["name"], safe="") + ".arrow")
        if not os.path.exists(path):
            continue
        with pa.memory_map(path) as source:
            reader = pa.ipc.open_file(source)
            assert reader.num_record_batches == len(manifest["tile_cells"]), path
            rows = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
            assert rows == manifest["tile_cells"], (path, rows)
            values = pa.concat_arrays([reader.get_batch(i).column(0) for i in range(reader.num_record_batches)])
            assert str(values.type) == c["arrow_type"], (path, values.type)
            assert values.to_pylist() == table.column(c["name"]).to_pylist(), path
        checked += 1
    print(f"pyarrow: {checked} cached columns memory-mapped and equal to the shards")

# Done. Leave without the interpreter's teardown, where a C++ extension's
# threads have been seen to abort the process ("terminate called without an
# active exception") after every check had passed; files are closed above.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
