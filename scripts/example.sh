#!/usr/bin/env bash
# The main job on a small real example: builds deltacells, converts
# examples/pbmc_1k.h5ad (1,000 real PBMC cells) into out/pbmc_1k, then
# shows it with `info` and checks it with `verify`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --build
export PATH="$PWD/.venv/bin:$PATH"
if [ ! -x target/release/deltacells ]; then
  echo "example: first build (HDF5 from source among the dependencies): about 6 minutes on 2 cores" >&2
fi
cargo build --release
bin=target/release/deltacells
$bin convert --overwrite examples/pbmc_1k.h5ad out/pbmc_1k
$bin info out/pbmc_1k
$bin verify out/pbmc_1k
