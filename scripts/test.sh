#!/usr/bin/env bash
# Runs every test of deltacells from a fresh clone: installs what is missing
# (scripts/setup.sh), builds, and runs the unit, property, integration and
# documentation tests. Tests that need ../shared (conformance vectors, real
# PBMC data) or the Python packages of .venv say so and skip when they are
# absent; with DELTACELLS_REQUIRE_ALL=1 (as .ci/run sets it) a skip fails.
#
# Everything is built in the release profile, the one scripts/example.sh
# builds the binary in, so that running both builds the dependencies (HDF5
# among them) once.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# Real data for the end-to-end test, when the shared folder is beside the repo.
if [ -x ../shared/data/fetch-pbmc.sh ] && [ -z "${DELTACELLS_PBMC:-}" ]; then
  ../shared/data/fetch-pbmc.sh data/pbmc >/dev/null
fi
export DELTACELLS_PYTHON="$PWD/.venv/bin/python"
if [ ! -d target/release ]; then
  echo "test: first build of the dependencies (HDF5 from source among them): about 5 minutes on 2 cores" >&2
fi
# The crash tests need the test-only feature `fault-injection` (a hook that
# aborts an append's commit half-way); every build here has it, so that the
# crate is built once.
# Checks skipped for want of something (servers, ../shared, PBMC files) are
# recorded there, and listed after the tests (a passing test shows nothing).
skipped=target/tmp/skipped.txt
rm -f "$skipped"
cargo test --release --features fault-injection "$@"
if [ -s "$skipped" ]; then
  echo "test: $(sort -u "$skipped" | wc -l) checks of the Rust tests were skipped (DELTACELLS_REQUIRE_ALL=1 makes a skip fail):" >&2
  sort -u "$skipped" | sed 's/^/  /' >&2
fi
# The reading core's own tests, without HDF5, clap or indicatif.
cargo test --release --no-default-features --lib --quiet
# The Python extension's own Rust tests (its allocator's settings).
PYO3_PYTHON="$PWD/.venv/bin/python" cargo test --release -p deltacells-python --lib --quiet
# The benchmarks are not run here (see docs/performance.md), only compiled,
# in the same profile so that nothing is built twice.
cargo test --release --features fault-injection --benches --no-run --quiet
# The Python package: built (into the same target folder) and installed into
# .venv as a user installs it, then its tests, against the binary built above.
cargo build --release --features fault-injection --quiet
# The wheel is kept in target/wheels: a test installs it alone into a fresh
# virtual environment and runs its `deltacells` command there.
started=$SECONDS
rm -f target/wheels/deltacells-*.whl
.venv/bin/python -m pip wheel --quiet --disable-pip-version-check --no-deps -w target/wheels ./python
wheel=$(ls target/wheels/deltacells-*.whl)
.venv/bin/python -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
echo "test: the Python package's wheel ($(du -h "$wheel" | cut -f1)) was built and installed in $((SECONDS - started)) s" >&2
DELTACELLS_BIN="$PWD/target/release/deltacells" DELTACELLS_WHEEL_DIR="$PWD/target/wheels" \
  .venv/bin/pytest -q -p no:cacheprovider python/tests
