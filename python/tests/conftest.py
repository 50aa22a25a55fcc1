"""Fixtures: the conformance vectors, the real PBMC files, and the deltacells
command to make datasets with (the package's own, or cargo's build). Where one is absent the tests that need it are
skipped, unless DELTACELLS_REQUIRE_ALL is set (as CI sets it): then a missing
fixture is a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[2]


def _missing(what: str) -> NoReturn:
    if os.environ.get("DELTACELLS_REQUIRE_ALL", "") not in ("", "0"):
        pytest.fail(f"{what}, and DELTACELLS_REQUIRE_ALL is set: this test must not be skipped")
    pytest.skip(what)


@pytest.fixture(scope="session")
def golden() -> Path:
    path = Path(os.environ.get("DELTACELLS_GOLDEN", REPO.parent / "shared" / "golden"))
    if not (path / "INDEX.json").is_file():
        _missing(f"{path} not found")
    return path


@pytest.fixture(scope="session")
def binary() -> Path:
    """The deltacells command the tests make their datasets with:
    $DELTACELLS_BIN (CI sets it to cargo's build), else the package's own
    command (its console script, the same command line: no cargo needed),
    else cargo's release build in this clone."""
    candidates = [os.environ.get("DELTACELLS_BIN"), Path(sys.executable).parent / "deltacells",
                  shutil.which("deltacells"), REPO / "target" / "release" / "deltacells"]
    if candidates[0]:
        candidates = candidates[:1]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    if os.environ.get("DELTACELLS_BIN"):
        _missing(f"DELTACELLS_BIN={os.environ['DELTACELLS_BIN']} is not a file")
    _missing("no deltacells command (pip install ./python, or cargo build --release)")


@pytest.fixture(scope="session")
def pbmc() -> tuple[Path, Path]:
    folder = Path(os.environ.get("DELTACELLS_PBMC", REPO / "data" / "pbmc"))
    files = (folder / "pbmc_ctrl.h5ad", folder / "pbmc_stim.h5ad")
    if not all(f.is_file() for f in files):
        _missing(f"the PBMC files are not in {folder} (scripts/test.sh fetches them)")
    return files


@pytest.fixture(scope="session")
def torch():
    """torch, which scripts/setup.sh installs for the tests (it is not a
    dependency of deltacells)."""
    try:
        import torch
    except ImportError:
        _missing("torch is not installed (bash scripts/setup.sh installs it into .venv)")
    return torch


@pytest.fixture(scope="session")
def lightning():
    """lightning.pytorch, which scripts/setup.sh installs for the tests of
    deltacells.lightning (it is not a dependency of deltacells)."""
    try:
        import lightning.pytorch
    except ImportError:
        _missing("lightning is not installed (bash scripts/setup.sh installs it into .venv)")
    return lightning.pytorch


@pytest.fixture(scope="session")
def scvi():
    """scvi-tools, which scripts/setup.sh installs for the tests of
    deltacells.scvi (it is not a dependency of deltacells)."""
    try:
        import scvi
    except ImportError:
        _missing("scvi-tools is not installed (bash scripts/setup.sh installs it into .venv)")
    return scvi


def run(binary: Path, *args: str | Path) -> subprocess.CompletedProcess:
    """Runs the deltacells binary; fails the test with its stderr if it fails."""
    env = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")
    done = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, f"deltacells {' '.join(map(str, args))}: {done.stderr}"
    return done


@pytest.fixture(scope="session")
def pbmc_dataset(tmp_path_factory: pytest.TempPathFactory, binary: Path, pbmc: tuple[Path, Path]) -> Path:
    """Both PBMC files converted with small tiles (several tiles, tiles across the
    file boundary) and obs shards of two tiles."""
    out = tmp_path_factory.mktemp("pbmc") / "ds"
    run(binary, "convert", "-q", "--tile-size", "1500", "--obs-tiles-per-file", "2", "--level", "3", *pbmc, out)
    return out


@pytest.fixture()
def cache(tmp_path: Path) -> str:
    return str(tmp_path / "cache")


@pytest.fixture()
def copy_of(tmp_path: Path):
    def copy(src: Path) -> Path:
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        return dst

    return copy


S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


@pytest.fixture()
def s3_server():
    """moto's S3 server with the bucket "test", started by tests/servers/serve.py."""
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "servers" / "serve.py"), "s3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = server.stdout.readline().strip()
    if not line.startswith("PORT "):
        server.kill()
        pytest.fail(f"the S3 server did not start: {line!r}")
    yield f"http://127.0.0.1:{line.split()[1]}"
    server.stdin.close()
    try:
        server.wait(timeout=5)
    except subprocess.TimeoutExpired:
        server.kill()


@pytest.fixture()
def http_server():
    """Starts tests/servers/serve.py's HTTP server for a folder, with the
    fault options given (``--fail-every 3``...); yields a function that takes
    the folder and the options and returns the server's address."""
    servers = []

    def start(root: Path, *options: str) -> str:
        server = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "servers" / "serve.py"), "http", str(root), *options],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        servers.append(server)
        line = server.stdout.readline().strip()
        if not line.startswith("PORT "):
            pytest.fail(f"the HTTP server did not start: {line!r}")
        return f"http://127.0.0.1:{line.split()[1]}"

    yield start
    for server in servers:
        server.stdin.close()
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
