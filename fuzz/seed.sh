#!/usr/bin/env bash
# Fills fuzz/corpus/<target>/ with seeds from ../shared/golden (tiles,
# manifests, gene_order.npy files, obs schemas) when it is there, and the
# input formats' targets (mtx, tenx_h5, zarr) with the small inputs
# seed_inputs.py writes (from tests/data/zarr for zarr).
set -euo pipefail
cd "$(dirname "$0")"
golden=${1:-../../shared/golden}
mkdir -p corpus/{tile_decode,manifest,npy,obs_schema,fingerprint}
python3 seed_inputs.py corpus
[ -d "$golden" ] || { echo "seed: $golden not found; corpora start empty" >&2; exit 0; }
i=0
for f in $(find "$golden" -name '*.dct'); do cp "$f" "corpus/tile_decode/seed$((i++))"; done
for f in $(find "$golden" -name manifest.json); do cp "$f" "corpus/manifest/seed$((i++))"; done
for f in $(find "$golden" -name '*.npy'); do cp "$f" "corpus/npy/seed$((i++))"; done
for f in $(find "$golden" -name schema.json); do cp "$f" "corpus/obs_schema/seed$((i++))"; cp "$f" "corpus/fingerprint/seed$((i++))"; done
echo "seed: $(ls corpus/*/ | wc -l) files" >&2
