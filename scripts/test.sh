#!/usr/bin/env bash
# Runs every test of deltacells from a fresh clone: installs what is missing
# (scripts/setup.sh), builds, and runs the unit, property, integration and
# documentation tests. Tests that need ../shared (conformance vectors, real
# PBMC data) say so and skip when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# Real data for the end-to-end test, when the shared folder is beside the repo.
if [ -x ../shared/data/fetch-pbmc.sh ] && [ -z "${DELTACELLS_PBMC:-}" ]; then
  ../shared/data/fetch-pbmc.sh data/pbmc >/dev/null
fi
export DELTACELLS_PYTHON="$PWD/.venv/bin/python"
cargo test "$@"
# The benchmarks are not run here (see README, "Performance"), only compiled,
# with the test profile so that nothing is built twice.
cargo test --benches --no-run --quiet
