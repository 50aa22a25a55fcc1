"""A dataset converted with ``--shuffle``: one input per sample, stored in a
random order, gives batches as mixed as random ones even when read in order,
and ``to_anndata(source_order=True)`` gives the inputs' order back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import deltacells
from conftest import run
from samples import make_sample_inputs, mixing


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> tuple[deltacells.Dataset, deltacells.Dataset]:
    """The 8 sample inputs converted in order, and shuffled."""
    folder = tmp_path_factory.mktemp("shuffle")
    inputs = make_sample_inputs(folder)
    layout = ["--tile-size", "1000", "--level", "3"]
    run(binary, "convert", "-q", *layout, *inputs, folder / "plain")
    run(binary, "convert", "-q", *layout, "--shuffle", "3", "--spill-dir", folder, *inputs, folder / "shuffled")
    cache = str(folder / "cache")
    return (
        deltacells.open_dataset(str(folder / "plain"), cache_dir=cache, obs_columns=["sample"]),
        deltacells.open_dataset(str(folder / "shuffled"), cache_dir=cache, obs_columns=["sample"]),
    )


def sample_codes(ds: deltacells.Dataset, cells) -> np.ndarray:
    return np.asarray(ds.obs.take(cells, ["sample"])["sample"], dtype=np.int64)


def test_batches_of_a_shuffled_dataset_mix_like_random_ones(pair) -> None:
    _, shuffled = pair
    everything = sample_codes(shuffled, range(shuffled.n_cells))
    # every tile holds every sample
    for tile in range(shuffled.n_tiles):
        assert np.unique(everything[tile * 1000:(tile + 1) * 1000]).size == 8
    for options in ({}, {"shuffle": False}, {"window_tiles": 1, "mix_chunks": 1}):
        batches = [sample_codes(shuffled, b.cells) for b in shuffled.batches(256, **options)]
        assert mixing(batches, everything) >= 0.97, options


def test_to_anndata_in_source_order_is_the_unshuffled_dataset(pair) -> None:
    plain, shuffled = pair
    a = plain.to_anndata()
    b = shuffled.to_anndata(source_order=True)
    assert (a.X != b.X).nnz == 0
    assert list(a.obs_names) == list(b.obs_names)
    assert list(b.obs.columns) == list(a.obs.columns)  # source_file and source_row left out
    for column in a.obs.columns:
        assert a.obs[column].equals(b.obs[column]), column
    # A part of the cells, in their source order; where each was read.
    cells = np.arange(500, 3000, 7)
    part = shuffled.to_anndata(cells, source_order=True, obs_columns=["source_file", "source_row"])
    files = np.asarray(part.obs["source_file"].cat.codes, np.int64)
    rows = np.asarray(part.obs["source_row"], np.int64)
    assert np.all(np.diff(files * 10**6 + rows) > 0)
    assert list(part.obs["source_file"].cat.categories) == [str(p) for p in sorted(
        Path(shuffled.root).parent.glob("sample_*.h5ad"))]


def test_source_order_of_an_unshuffled_dataset_is_refused(pair) -> None:
    plain, _ = pair
    with pytest.raises(deltacells.InvalidArgumentError, match="not converted with --shuffle"):
        plain.to_anndata(source_order=True)
    with pytest.raises(deltacells.InvalidArgumentError, match="source_order"):
        plain.to_anndata(source_order="yes")


def test_an_unknown_obs_column_is_the_same_error_from_rust_as_from_python(pair) -> None:
    plain, _ = pair
    with pytest.raises(deltacells.UnknownNameError, match="no_such_column"):
        plain.obs.localize(["no_such_column"])  # refused by the Python layer
    with pytest.raises(deltacells.UnknownNameError, match="no_such_column") as raised:
        plain.native.localize(["no_such_column"], plain.obs.cache_root)  # by the Rust library
    assert isinstance(raised.value, KeyError)
