#!/usr/bin/env bash
# Appending real cells to a large dataset against converting them, in one run:
# the two PBMC files repeated 7 times (97,993 cells, convert's defaults: tiles
# of 10,000 cells, level 19) are the dataset; pbmc_stim.h5ad (7,451 cells) is
# appended to a fresh copy of it. In the same run: converting pbmc_stim.h5ad
# alone, and converting every cell (the dataset's inputs and the new file) in
# one go, which is what an append spares. Each timing is the median of RUNS
# runs (the conversion of everything: one run); peak memory is the largest
# resident size of the process.
#
# usage: benches/append.sh [PBMC_DIR] [RUNS]
#   PBMC_DIR defaults to data/pbmc (fetch with ../shared/data/fetch-pbmc.sh data/pbmc)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-data/pbmc}
runs=${2:-3}
export PATH="$PWD/.venv/bin:$PATH"
cargo build --release --quiet --bin deltacells
bin=$PWD/target/release/deltacells
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ctrl="$dir/pbmc_ctrl.h5ad"
stim="$dir/pbmc_stim.h5ad"
base_inputs=()
for _ in 1 2 3 4 5 6 7; do base_inputs+=("$ctrl" "$stim"); done

timed() { # timed CMD... -> prints "seconds peak_kib"
  /usr/bin/time -f "%e %M" -o "$tmp/time" "$@" >/dev/null
  cat "$tmp/time"
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

read -r base_secs base_peak < <(timed "$bin" convert -q "${base_inputs[@]}" "$tmp/base")
base_cells=$(python3 -c "import json;print(json.load(open('$tmp/base/manifest.json'))['n_cells'])")
last_tile=$(python3 -c "import json;print(json.load(open('$tmp/base/manifest.json'))['tile_cells'][-1])")

: >"$tmp/append"
: >"$tmp/new"
for _ in $(seq "$runs"); do
  rm -rf "$tmp/ds" "$tmp/new_ds"
  cp -r "$tmp/base" "$tmp/ds"
  timed "$bin" append -q "$tmp/ds" "$stim" >>"$tmp/append"
  timed "$bin" convert -q "$stim" "$tmp/new_ds" >>"$tmp/new"
done
"$bin" verify -q "$tmp/ds" >/dev/null
append_secs=$(cut -d' ' -f1 "$tmp/append" | median)
append_peak=$(cut -d' ' -f2 "$tmp/append" | sort -n | tail -1)
new_secs=$(cut -d' ' -f1 "$tmp/new" | median)
new_peak=$(cut -d' ' -f2 "$tmp/new" | sort -n | tail -1)
new_cells=$(python3 -c "import json;print(json.load(open('$tmp/new_ds/manifest.json'))['n_cells'])")

read -r all_secs all_peak < <(timed "$bin" convert -q "${base_inputs[@]}" "$stim" "$tmp/all")
# The append writes the same tiles as converting everything (it is checked
# here on the real cells): the last tile's old cells and the new ones.
python3 - "$tmp/ds" "$tmp/all" <<'EOF'
import json, sys
a, b = (json.load(open(f"{d}/manifest.json")) for d in sys.argv[1:3])
for key in ("tile_cells", "tile_nnz", "tile_bytes", "obs_shard_sha256"):
    assert a[key] == b[key], f"{key} differs between the append and the conversion of everything"
EOF

python3 - "$base_cells" "$last_tile" "$new_cells" "$base_secs" "$append_secs" "$append_peak" "$new_secs" "$new_peak" "$all_secs" "$all_peak" "$runs" <<'EOF'
import sys
base_cells, last_tile, new_cells = (int(x) for x in sys.argv[1:4])
base_secs, append_secs, append_peak, new_secs, new_peak, all_secs, all_peak = (float(x) for x in sys.argv[4:11])
runs = sys.argv[11]
encoded = last_tile + new_cells
rate = new_cells / new_secs
print(f"dataset: {base_cells:,} cells (the PBMC files x7), its last tile {last_tile:,} cells; converted in {base_secs:.1f} s")
print(f"appended: pbmc_stim.h5ad, {new_cells:,} cells; medians of {runs} runs\n")
print(f"| {'step':<52} | {'cells encoded':>13} | {'seconds':>7} | {'peak MiB':>8} |")
print(f"|{'-' * 54}|{'-' * 15}|{'-' * 9}|{'-' * 10}|")
print(f"| {'append pbmc_stim.h5ad to the dataset':<52} | {encoded:>13,} | {append_secs:>7.1f} | {append_peak / 1024:>8.0f} |")
print(f"| {'convert pbmc_stim.h5ad alone':<52} | {new_cells:>13,} | {new_secs:>7.1f} | {new_peak / 1024:>8.0f} |")
print(f"| {'convert every cell (dataset inputs + the new file)':<52} | {base_cells + new_cells:>13,} | {all_secs:>7.1f} | {all_peak / 1024:>8.0f} |")
print()
print(f"append / convert of the new cells: {append_secs / new_secs:.2f}x")
print(f"the new cells plus the last tile's at convert's rate ({rate:,.0f} cells/s): {encoded / rate:.1f} s; the append took {append_secs / (encoded / rate):.2f}x that")
print(f"append / convert of every cell: {append_secs / all_secs:.2f}x ({all_secs / append_secs:.1f}x faster)")
EOF
