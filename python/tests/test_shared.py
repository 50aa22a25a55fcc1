"""The reader with others: a dataset in an S3 bucket (moto's server on
127.0.0.1), and Python and command-line processes localizing one cache at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import deltacells
from conftest import S3_ENV, run


def test_a_dataset_in_a_bucket_reads_like_the_local_copy(
    binary: Path, golden: Path, s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    source = golden / "sources" / "obs_kinds.h5ad"
    local = tmp_path / "local"
    layout = ["--tile-size", "5", "--obs-tiles-per-file", "2", "--level", "3"]
    run(binary, "convert", "-q", *layout, source, local)
    run(binary, "convert", "-q", *layout, "--endpoint", s3_server, source, "s3://test/ds")
    remote = deltacells.open_dataset("s3://test/ds", endpoint=s3_server, cache_dir=str(tmp_path / "c1"))
    here = deltacells.open_dataset(str(local), cache_dir=str(tmp_path / "c2"))
    assert remote.manifest == here.manifest
    cells = np.random.default_rng(5).integers(0, here.n_cells, size=60)
    assert (remote.get_batch(cells).to_scipy() != here.get_batch(cells).to_scipy()).nnz == 0
    assert remote.var.equals(here.var) and remote.var_names == here.var_names
    np.testing.assert_array_equal(remote.gene_order, here.gene_order)
    columns = here.obs.columns
    remote.obs.localize(columns)
    here.obs.localize(columns)
    for name in columns:
        a, b = remote.obs.take(cells, [name])[name], here.obs.take(cells, [name])[name]
        assert a.dtype == b.dtype and [str(v) for v in a] == [str(v) for v in b], name
    with pytest.raises(deltacells.DatasetNotFoundError, match="s3://test/nothing"):
        deltacells.open_dataset("s3://test/nothing", endpoint=s3_server)


LOCALIZE_IN_PYTHON = """
import json, sys, deltacells
ds = deltacells.open_dataset(sys.argv[1], cache_dir=sys.argv[2])
print(json.dumps(ds.obs.localize(sys.argv[3].split(","))))
"""


def test_processes_localizing_at_once_each_fetch_a_column_once(binary: Path, golden: Path, tmp_path: Path) -> None:
    dataset = str(golden / "obs_kinds")
    cache = str(tmp_path / "cache")
    columns = ["cell_type", "donor", "n_counts", "obs_names"]
    env = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")
    processes = []
    for i in range(8):
        if i % 2 == 0:
            cmd = [sys.executable, "-c", LOCALIZE_IN_PYTHON, dataset, cache, ",".join(columns)]
        else:
            cmd = [str(binary), "obs", "localize", dataset, "--columns", ",".join(columns), "--cache-dir", cache,
                   "--json"]
        processes.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    reports = []
    for p in processes:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        reports.append(json.loads(out))
    for name in columns:
        fetched = sum(name in r["fetched"] for r in reports)
        local = sum(name in r["already_local"] for r in reports)
        assert (fetched, local) == (1, 7), (name, reports)
    # and each file is whole: the library finds them valid, the values are right
    ds = deltacells.open_dataset(dataset, cache_dir=cache)
    assert ds.obs.localize(columns)["already_local"] == columns
    expected = json.loads((golden / "expected" / "obs_kinds.obs.json").read_text())
    assert ds.obs.take(range(ds.n_cells), ["cell_type"])["cell_type"].tolist() == expected["cell_type"]["values"]
