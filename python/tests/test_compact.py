"""``deltacells.compact``: the tiles of a conversion at the level asked for,
without the cargo-built binary; bad arguments named; a bucket compacted as a
folder is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deltacells
from conftest import REPO

EXAMPLE = REPO / "examples" / "pbmc_1k.h5ad"
LAYOUT = {"tile_size": 250, "obs_tiles_per_file": 2}


def content(root: Path) -> tuple[dict[str, bytes], dict]:
    """The dataset's files but its manifest, and the manifest without metadata."""
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("metadata")
    return files, manifest


def test_compact_gives_the_tiles_of_a_conversion_at_that_level(tmp_path: Path) -> None:
    fast, archive = tmp_path / "fast", tmp_path / "archive"
    deltacells.convert(EXAMPLE, fast, level=1, progress=False, **LAYOUT)
    deltacells.convert(EXAMPLE, archive, level=19, progress=False, **LAYOUT)
    rows = deltacells.open_dataset(str(fast)).get_batch(np.arange(1000)).to_scipy()

    summary = deltacells.compact(fast, progress=False)

    assert isinstance(summary, deltacells.CompactSummary)
    assert (summary.outcome, summary.level_before, summary.level) == ("compacted", 1, 19)
    assert summary.tiles == summary.tiles_encoded == 4
    assert summary.bytes_after < summary.bytes_before
    assert content(fast) == content(archive)
    again = deltacells.open_dataset(str(fast)).get_batch(np.arange(1000)).to_scipy()
    assert (again != rows).nnz == 0
    assert deltacells.compact(fast, level=19, progress=False).outcome == "unchanged"


@settings(max_examples=25, deadline=None)
@given(level=st.one_of(st.integers(max_value=0), st.integers(min_value=23), st.floats(), st.text(), st.none()))
def test_a_level_outside_1_to_22_is_named(level: object) -> None:
    with pytest.raises((deltacells.InvalidArgumentError, deltacells.ArgumentTypeError), match="level"):
        deltacells.compact("never-read", level=level)  # type: ignore[arg-type]


def test_a_missing_dataset_raises_not_found(tmp_path: Path) -> None:
    with pytest.raises(deltacells.DatasetNotFoundError, match="nothing"):
        deltacells.compact(tmp_path / "nothing", progress=False)


def test_a_damaged_tile_is_named_and_the_dataset_kept(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    deltacells.convert(EXAMPLE, ds, level=1, progress=False, **LAYOUT)
    tile = ds / "tiles" / "tile_000002.dct"
    damaged = bytearray(tile.read_bytes())
    damaged[len(damaged) // 2] ^= 0x55
    tile.write_bytes(bytes(damaged))
    before = content(ds)
    with pytest.raises(deltacells.CorruptDatasetError, match="tile_000002"):
        deltacells.compact(ds, progress=False)
    after = content(ds)
    assert {k: v for k, v in after[0].items() if not k.startswith(".append/")} == before[0]
    assert after[1] == before[1]


def test_a_dataset_in_s3_is_compacted_as_a_folder_is(
    tmp_path: Path, s3_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    local = tmp_path / "local"
    deltacells.convert(EXAMPLE, local, level=1, progress=False, **LAYOUT)
    deltacells.convert(EXAMPLE, "s3://test/ds", level=1, endpoint=s3_server, progress=False, **LAYOUT)
    deltacells.compact(local, progress=False)
    summary = deltacells.compact("s3://test/ds", endpoint=s3_server, progress=False)
    assert summary.outcome == "compacted"
    remote = deltacells.open_dataset("s3://test/ds", endpoint=s3_server)
    ours = deltacells.open_dataset(str(local))
    assert remote.n_cells == ours.n_cells == 1000
    cells = np.random.default_rng(0).choice(1000, size=300, replace=False)
    assert (remote.get_batch(cells).to_scipy() != ours.get_batch(cells).to_scipy()).nnz == 0
    assert summary.bytes_after == sum(p.stat().st_size for p in (local / "tiles").iterdir())
