#!/usr/bin/env bash
# Installs what building and testing deltacells needs beyond rustup and python3,
# into .venv in the repository (nothing system-wide):
#   - cmake >= 3.26 from PyPI, for the statically linked HDF5 build;
#   - anndata, h5py, pandas and pyarrow, for the tests that check that Python
#     reads what we write.
# Safe to run again: it only installs what is missing.
# Prints the line to source for the environment: `. .venv/bin/activate`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
want=(cmake anndata h5py pandas pyarrow)
read -r -a missing < <(.venv/bin/python - "${want[@]}" <<'PY'
import importlib.metadata, sys
missing = []
for name in sys.argv[1:]:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        missing.append(name)
print(" ".join(missing))
PY
)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} into .venv" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "${missing[@]}" >&2
fi
