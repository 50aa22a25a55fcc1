#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 600), TARGETS at a time.
# cargo-fuzz needs nightly flags; on the stable toolchain this sets
# RUSTC_BOOTSTRAP=1 for the fuzz build only.
#   usage: fuzz/run.sh [SECONDS] [TARGETS_AT_ONCE]
# Install once: cargo install cargo-fuzz --locked
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
jobs=${2:-2}
export PATH="$PWD/.venv/bin:$PATH" RUSTC_BOOTSTRAP=1
bash fuzz/seed.sh
targets=(tile_decode manifest npy obs_schema fingerprint mtx tenx_h5 zarr)
cargo fuzz build --release
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} sh -c \
  "cargo fuzz run --release {} fuzz/corpus/{} -- -max_total_time=$secs -rss_limit_mb=2048 > fuzz/{}.log 2>&1; echo \"{}: exit \$?, \$(grep -E '^#[0-9]+.*DONE|Done [0-9]+ runs' fuzz/{}.log | tail -1)\""
