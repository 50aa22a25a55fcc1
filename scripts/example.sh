#!/usr/bin/env bash
# The main job on a small real example: builds deltacells, converts
# examples/pbmc_1k.h5ad (1,000 real PBMC cells) into out/pbmc_1k, then
# shows it with `info` and checks it with `verify`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
cargo build --release --quiet
bin=target/release/deltacells
$bin convert --overwrite examples/pbmc_1k.h5ad out/pbmc_1k
$bin info out/pbmc_1k
$bin verify out/pbmc_1k
