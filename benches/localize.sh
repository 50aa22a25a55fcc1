#!/usr/bin/env bash
# Localizing 3 obs columns of a converted dataset: requests, bytes fetched, and
# their share of the obs bytes, against reading the whole shards.
#
# The input is made here (anndata in .venv): 100,000 cells with 40 obs columns
# (categorical, numeric, bool, string barcodes) and a small count matrix, so
# that the obs shards have a realistic shape. usage: benches/localize.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
cargo build --release --quiet --bin deltacells
bin=$PWD/target/release/deltacells
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
.venv/bin/python - "$tmp/cells.h5ad" <<'PY'
import sys
import anndata, numpy as np, pandas as pd, scipy.sparse as sp
rng = np.random.default_rng(0)
n = 100_000
obs = pd.DataFrame(index=[f"cell{i:07d}" for i in range(n)])
obs["cell_type"] = pd.Categorical(rng.choice([f"type{i}" for i in range(40)], n))
obs["donor_id"] = pd.Categorical(rng.choice([f"donor{i}" for i in range(200)], n))
obs["age"] = rng.integers(18, 90, n).astype("int16")
obs["barcode"] = [f"ACGT{i:012d}" for i in range(n)]
for j in range(12):
    obs[f"qc{j}"] = rng.normal(size=n)
for j in range(12):
    obs[f"cat{j}"] = pd.Categorical(rng.choice([f"v{k}" for k in range(10)], n))
for j in range(12):
    obs[f"flag{j}"] = rng.random(n) < 0.5
x = sp.random(n, 200, density=0.05, format="csr", random_state=0, dtype=np.float32)
x.data = np.ceil(x.data * 5)
anndata.AnnData(X=x, obs=obs, var=pd.DataFrame(index=[f"g{i}" for i in range(200)])).write_h5ad(sys.argv[1])
PY
$bin convert --quiet --level 3 "$tmp/cells.h5ad" "$tmp/ds"
shard_bytes=$(python3 -c "import json;print(sum(json.load(open('$tmp/ds/manifest.json'))['obs_shard_bytes']))")
report=$($bin obs localize --json --cache-dir "$tmp/cache" --columns cell_type,donor_id,age "$tmp/ds")
python3 - "$shard_bytes" "$report" <<'PY'
import json, sys
shard_bytes = int(sys.argv[1]); r = json.loads(sys.argv[2])
print(f"localize cell_type, donor_id, age of 100,000 cells (10 tiles, 40 obs columns)")
print(f"{'':24} {'requests':>9} {'bytes':>12} {'share':>7} {'seconds':>8}")
print(f"{'localize 3 columns':24} {r['requests']:9d} {r['bytes']:12,d} {r['bytes']/shard_bytes:7.1%} {r['seconds']:8.3f}")
print(f"{'whole shards':24} {'1':>9} {shard_bytes:12,d} {1:7.0%}")
PY
