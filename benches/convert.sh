#!/usr/bin/env bash
# Converts the two real PBMC files and reports cells/s, nonzeros/s, bytes per
# nonzero and peak memory; in the same run, the time plain zstd takes to
# compress the same byte planes at the same level on the same threads; and the
# peak memory of converting the inputs listed ten times.
#
# usage: benches/convert.sh [PBMC_DIR] [THREADS]
#   PBMC_DIR defaults to data/pbmc (fetch with ../shared/data/fetch-pbmc.sh data/pbmc)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-data/pbmc}
threads=${2:-$(nproc)}
export PATH="$PWD/.venv/bin:$PATH"
cargo build --release --quiet --bin deltacells --example zstd_baseline
bin=target/release/deltacells
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
inputs=("$dir/pbmc_ctrl.h5ad" "$dir/pbmc_stim.h5ad")

run() { # run OUT INPUTS... -> prints "seconds peak_kib"
  local out=$1; shift
  /usr/bin/time -f "%e %M" -o "$tmp/time" "$bin" convert --quiet --threads "$threads" "$@" "$out"
  cat "$tmp/time"
}

read -r secs peak < <(run "$tmp/pbmc" "${inputs[@]}")
cells=$(python3 -c "import json;print(json.load(open('$tmp/pbmc/manifest.json'))['n_cells'])")
nnz=$(python3 -c "import json;print(sum(json.load(open('$tmp/pbmc/manifest.json'))['tile_nnz']))")
bytes=$(python3 -c "import json;print(sum(json.load(open('$tmp/pbmc/manifest.json'))['tile_bytes']))")
read -r frames plane_bytes zbytes zsecs < <(target/release/examples/zstd_baseline "$tmp/pbmc" "$threads")

if [ -n "${QUICK:-}" ]; then
  python3 -c "print(f'convert {$secs:.2f} s, zstd-only {$zsecs:.2f} s: {$secs/$zsecs:.2f}x; peak {$peak/1024:.0f} MiB')"
  exit 0
fi
ten=()
for _ in 1 2 3 4 5 6 7 8 9 10; do ten+=("${inputs[@]}"); done
read -r secs10 peak10 < <(run "$tmp/pbmc10" "${ten[@]}")
rm -rf "$tmp/pbmc10"
twenty=("${ten[@]}" "${ten[@]}")
read -r secs20 peak20 < <(run "$tmp/pbmc20" "${twenty[@]}")

python3 - "$threads" "$cells" "$nnz" "$bytes" "$secs" "$peak" "$zsecs" "$secs10" "$peak10" "$secs20" "$peak20" <<'PY'
import sys
threads, cells, nnz, size = map(int, sys.argv[1:5])
secs, peak, zsecs, secs10, peak10, secs20, peak20 = map(float, sys.argv[5:12])
print(f"convert of {cells:,} cells, {nnz:,} nonzeros, {threads} threads, zstd level 19")
print(f"{'':28} {'seconds':>8} {'cells/s':>10} {'M nnz/s':>8} {'peak MiB':>9}")
print(f"{'deltacells convert':28} {secs:8.2f} {cells/secs:10,.0f} {nnz/secs/1e6:8.2f} {peak/1024:9.0f}")
print(f"{'plain zstd, same planes':28} {zsecs:8.2f} {'':>10} {nnz/zsecs/1e6:8.2f}")
print(f"{'convert, inputs x10':28} {secs10:8.2f} {10*cells/secs10:10,.0f} {10*nnz/secs10/1e6:8.2f} {peak10/1024:9.0f}")
print(f"{'convert, inputs x20':28} {secs20:8.2f} {20*cells/secs20:10,.0f} {20*nnz/secs20/1e6:8.2f} {peak20/1024:9.0f}")
print(f"bytes per nonzero: {size/nnz:.3f}")
print(f"convert / zstd-only time: {secs/zsecs:.2f}x (target <= 1.15x)")
print(f"peak memory x10 / x1: {peak10/peak:.2f}, x20 / x10: {peak20/peak10:.2f} (target: within 10%); x1 {peak/1024:.0f} MiB (target < 1024)")
PY
