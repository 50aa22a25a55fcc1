"""The Python reader against the conformance vectors, the real PBMC files as
anndata reads them, and bad input of every kind."""

from __future__ import annotations

import json
import math
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest

import deltacells

VALID = ["tiny", "exceptions", "empty_chunk", "obs_kinds"]


def expected_matrix(golden: Path, name: str):
    import scipy.sparse

    e = json.loads((golden / "expected" / f"{name}.json").read_text())
    return scipy.sparse.csr_matrix((e["data"], e["indices"], e["indptr"]), shape=tuple(e["shape"]))


@pytest.mark.parametrize("name", VALID)
def test_golden_datasets_read_as_expected(golden: Path, name: str) -> None:
    ds = deltacells.open_dataset(str(golden / name))
    want = expected_matrix(golden, name)
    assert (ds.n_cells, ds.n_genes) == want.shape
    assert len(ds) == ds.n_cells and ds.tile_cells.sum() == ds.n_cells
    whole = ds.get_batch(range(ds.n_cells))
    assert whole.indptr.dtype == np.int64 and whole.indices.dtype == np.int32 and whole.data.dtype == np.int32
    assert (whole.to_scipy() != want).nnz == 0
    # any order, repeats, as a list, an array and a slice
    rng = np.random.default_rng(1)
    cells = rng.integers(0, ds.n_cells, size=3 * ds.n_cells)
    assert (ds.get_batch(list(cells)).to_scipy() != want[cells]).nnz == 0
    assert (ds.get_batch(cells[::-1].copy()).to_scipy() != want[cells[::-1]]).nnz == 0
    assert (ds.get_batch(slice(1, None, 2)).to_scipy() != want[1::2]).nnz == 0
    np.testing.assert_array_equal(ds.get_batch([0, 1]).to_dense(), want[[0, 1]].toarray().astype(np.float32))
    for t in range(ds.n_tiles):
        start = int(ds.tile_cells[:t].sum())
        tile = ds.read_tile(t).to_scipy()
        assert (tile != want[start : start + int(ds.tile_cells[t])]).nnz == 0


def test_the_scipy_matrix_shares_the_decoded_buffers(golden: Path) -> None:
    batch = deltacells.open_dataset(str(golden / "tiny")).get_batch([1, 2, 4])
    x = batch.to_scipy()
    # the nonzeros' buffers are shared; scipy makes its own int32 indptr (one
    # entry per cell) because it wants both index arrays of one type
    assert np.shares_memory(x.data, batch.data) and np.shares_memory(x.indices, batch.indices)


def test_golden_obs_every_kind_with_missing_values(golden: Path, cache: str) -> None:
    expected = json.loads((golden / "expected" / "obs_kinds.obs.json").read_text())
    ds = deltacells.open_dataset(str(golden / "obs_kinds"), obs_columns=list(expected), cache_dir=cache)
    assert ds.obs.columns == list(expected)
    cells = np.array([22, 0, 4, 4, 13, 7])
    values = ds.obs.take(cells, list(expected))
    frame = ds.obs.take_pandas(cells, list(expected))
    for name, e in expected.items():
        assert ds.obs.kind(name) == e["kind"] and ds.obs.arrow_type(name) == e["arrow_type"]
        assert ds.obs.categories(name) == e["categories"]
        want = [e["values"][c] for c in cells]
        got = values[name]
        if e["kind"] == "category":
            assert got.tolist() == want
            assert list(frame[name].cat.categories) == e["categories"]
            assert [None if c < 0 else e["categories"][c] for c in want] == [
                None if isinstance(v, float) and math.isnan(v) else v for v in frame[name].tolist()
            ]
        elif e["kind"] == "numeric" and any(v is None for v in e["values"]):
            assert got.dtype == np.float64
            assert [None if math.isnan(v) else v for v in got.tolist()] == want
        elif any(v is None for v in e["values"]):
            assert got.dtype == object and got.tolist() == want
        else:
            assert got.tolist() == want, name


def test_a_column_not_localized_is_fetched_with_a_warning(golden: Path, cache: str) -> None:
    ds = deltacells.open_dataset(str(golden / "obs_kinds"), cache_dir=cache)
    with pytest.warns(UserWarning, match="was not localized"):
        ds.obs.take([0], ["cell_type"])
    assert Path(ds.obs.cache_root) == Path(cache)
    # Another process (here, another opening) finds it in the cache: no warning.
    again = deltacells.open_dataset(str(golden / "obs_kinds"), cache_dir=cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = again.obs.take([0], ["cell_type"])["cell_type"]
    assert got.tolist() == ds.obs.take([0], ["cell_type"])["cell_type"].tolist()


def test_bad_input_raises_the_librarys_messages(golden: Path, tmp_path: Path) -> None:
    with pytest.raises(deltacells.DatasetNotFoundError, match="no dataset here") as e:
        deltacells.open_dataset(str(tmp_path / "nothing"))
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, deltacells.DeltacellsError)
    (tmp_path / "incomplete" / "tiles").mkdir(parents=True)
    (tmp_path / "incomplete" / "tiles" / "tile_000000.dct").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="incomplete dataset: no manifest.json"):
        deltacells.open_dataset(str(tmp_path / "incomplete"))
    ds = deltacells.open_dataset(str(golden / "tiny"))
    with pytest.raises(IndexError, match="cell 10 is out of range: the dataset has 10 cells"):
        ds.get_batch([0, 10])
    with pytest.raises(deltacells.CellIndexError, match="cell -1 is out of range"):
        ds.get_batch(np.array([-1]))
    with pytest.raises(TypeError):
        ds.get_batch([0.5])
    with pytest.raises(deltacells.CorruptDatasetError, match="manifest.json"):
        deltacells.open_dataset(str(golden / "corrupt_manifest_version"))


def test_a_corrupt_tile_names_the_tile_and_the_rule(golden: Path) -> None:
    ds = deltacells.open_dataset(str(golden / "corrupt_crc_flip"))
    with pytest.raises(deltacells.CorruptDatasetError, match=r"(?i)tile_00000\d\.dct: tile \d+: crc32 mismatch") as e:
        ds.get_batch(range(ds.n_cells))
    assert isinstance(e.value, ValueError)
    index = {d["name"]: d for d in json.loads((golden / "INDEX.json").read_text())["datasets"]}
    for name, entry in index.items():
        if entry["valid"] or entry["expect_rule"] is None or not entry["expect_rule"].startswith("tile:"):
            continue
        try:
            ds = deltacells.open_dataset(str(golden / name))
            ds.get_batch(range(ds.n_cells))
        except deltacells.DeltacellsError:
            continue
        pytest.fail(f"{name} ({entry['description']}) was read without an error")


def test_pbmc_batches_are_anndatas_rows(pbmc, pbmc_dataset: Path) -> None:
    import anndata

    a = anndata.read_h5ad(pbmc[0])
    b = anndata.read_h5ad(pbmc[1])
    x = __import__("scipy.sparse", fromlist=["vstack"]).vstack([a.X, b.X]).tocsr()
    ds = deltacells.open_dataset(str(pbmc_dataset))
    assert (ds.n_cells, ds.n_genes) == x.shape and ds.n_tiles > 2
    source_column = np.argsort(ds.gene_order)  # stored column of each source gene
    rng = np.random.default_rng(7)
    for size in [1, 17, 1024]:
        cells = rng.integers(0, ds.n_cells, size=size)
        got = ds.get_batch(cells).to_scipy()[:, source_column]
        assert (got != x[cells].astype(np.int32)).nnz == 0
    # var: the first input's table, in stored order, with its index
    np.testing.assert_array_equal(ds.var.index.to_numpy(), a.var.index.to_numpy()[ds.gene_order])
    assert list(ds.var.columns) == list(a.var.columns)
    for column in a.var.columns:
        np.testing.assert_array_equal(ds.var[column].to_numpy(), a.var[column].to_numpy()[ds.gene_order])
    assert ds.var_names == list(a.var.index[ds.gene_order])


def test_pbmc_obs_is_anndatas_obs(pbmc, pbmc_dataset: Path, cache: str) -> None:
    import anndata
    import pandas as pd

    obs = pd.concat([anndata.read_h5ad(p, backed="r").obs for p in pbmc])
    ds = deltacells.open_dataset(str(pbmc_dataset), obs_columns=None, cache_dir=cache)
    report = ds.obs.localize()
    assert sorted(report["fetched"]) == sorted(ds.obs.columns)
    cells = np.random.default_rng(3).integers(0, ds.n_cells, size=500)
    frame = ds.obs.take_pandas(cells, ds.obs.columns)
    np.testing.assert_array_equal(frame["obs_names"].to_numpy(), obs.index.to_numpy()[cells])
    for column in obs.columns:
        want = obs[column].iloc[cells]
        got = frame[column]
        if isinstance(want.dtype, pd.CategoricalDtype):
            assert got.tolist() == want.astype(object).tolist(), column
            assert set(want.cat.categories) <= set(got.cat.categories)
        else:
            np.testing.assert_array_equal(got.to_numpy(), want.to_numpy(), err_msg=column)


def test_the_cache_is_the_command_lines(binary, golden: Path, cache: str) -> None:
    from conftest import run

    run(binary, "obs", "localize", golden / "obs_kinds", "--columns", "cell_type,donor", "--cache-dir", cache)
    ds = deltacells.open_dataset(str(golden / "obs_kinds"), cache_dir=cache)
    report = ds.obs.localize(["cell_type", "donor", "n_counts"], threads=3)
    assert report["already_local"] == ["cell_type", "donor"] and report["fetched"] == ["n_counts"]
    info = json.loads(run(binary, "obs", "info", golden / "obs_kinds", "--json", "--cache-dir", cache).stdout)
    local = {c["name"] for c in info["columns"] if c["cached"]}
    assert local == {"cell_type", "donor", "n_counts"}


def test_repr_and_manifest(golden: Path) -> None:
    ds = deltacells.open_dataset(str(golden / "tiny"))
    assert repr(ds).startswith("<deltacells.Dataset ") and "10 cells x 50 genes in 3 tiles" in repr(ds)
    assert ds.manifest["format"] == "deltacells-dataset" and ds.manifest["version"] == 2
    assert ds.var is None and ds.var_names is None and ds.gene_order is None
    assert "3 cells" in repr(ds.get_batch([0, 1, 2]))
    # A dataset pickles to its root and options (the Rust handle never
    # crosses processes) and opens again on first use.
    with pytest.raises(TypeError):
        pickle.dumps(ds.native)
    again = pickle.loads(pickle.dumps(ds))
    assert again._handle is None and again.root == ds.root
    assert again.n_cells == 10 and (again.get_batch([9, 0]).to_scipy() != ds.get_batch([9, 0]).to_scipy()).nnz == 0


@pytest.mark.parametrize("source", ["golden", "pbmc"])
def test_to_anndata_gives_back_the_source(source: str, request, binary: Path, tmp_path: Path) -> None:
    import anndata
    import pandas as pd

    from conftest import run

    if source == "golden":
        path = request.getfixturevalue("golden") / "sources" / "obs_kinds.h5ad"
    else:
        path = request.getfixturevalue("pbmc")[0]
    out = tmp_path / "ds"
    run(binary, "convert", "-q", "--tile-size", "700", "--level", "3", path, out)
    ds = deltacells.open_dataset(str(out), cache_dir=str(tmp_path / "cache"))
    want = anndata.read_h5ad(path)
    got = ds.to_anndata()
    assert got.X.dtype == np.int32 and (got.X != want.X.astype(np.int32)).nnz == 0
    # the cell names (the format keeps no name for the index itself)
    np.testing.assert_array_equal(got.obs.index.to_numpy(), want.obs.index.to_numpy())
    assert list(got.obs.columns) == list(want.obs.columns)
    for column in want.obs.columns:
        w, g = want.obs[column], got.obs[column]
        if isinstance(w.dtype, pd.CategoricalDtype):
            assert list(g.cat.categories) == list(w.cat.categories), column
            assert g.astype(object).tolist() == w.astype(object).tolist(), column
        else:
            assert [str(v) for v in g.tolist()] == [str(v) for v in w.tolist()], column
    np.testing.assert_array_equal(got.var.index.to_numpy(), want.var.index.to_numpy())
    for column in want.var.columns:
        np.testing.assert_array_equal(got.var[column].to_numpy(), want.var[column].to_numpy(), err_msg=column)
    # a subset, in stored gene order
    part = ds.to_anndata(cells=[3, 1], obs_columns=[], source_gene_order=False)
    assert part.shape == (2, ds.n_genes) and list(part.obs.columns) == []
    assert (part.X != ds.get_batch([3, 1]).to_scipy()).nnz == 0


@pytest.mark.parametrize("cache_bytes", [1, 2_000, 10**9])
def test_the_tile_cache_gives_the_same_batches(golden: Path, cache_bytes: int) -> None:
    # 1 byte keeps no tile, 2,000 bytes one or two of tiny's (evicting), 10**9 all of them
    plain = deltacells.open_dataset(str(golden / "obs_kinds"))
    cached = deltacells.open_dataset(str(golden / "obs_kinds"), cache_bytes=cache_bytes)
    rng = np.random.default_rng(cache_bytes)
    for _ in range(20):
        cells = rng.integers(0, plain.n_cells, size=int(rng.integers(1, 12)))
        assert (cached.get_batch(cells).to_scipy() != plain.get_batch(cells).to_scipy()).nnz == 0
        # ranges go through the cache too
        a = int(rng.integers(0, plain.n_cells))
        b = int(rng.integers(a, plain.n_cells + 1))
        assert (cached.get_batch(slice(a, b)).to_scipy() != plain.get_batch(slice(a, b)).to_scipy()).nnz == 0
        assert cached.get_batch(slice(a, b)).to_scipy().shape == (b - a, plain.n_genes)
    with pytest.raises(IndexError):
        cached.get_batch([plain.n_cells])
    with pytest.raises(IndexError):
        cached.native.get_range(0, plain.n_cells + 1)


@pytest.mark.parametrize("source", ["golden", "pbmc"])
def test_export_writes_obs_and_var_back(source: str, request, binary: Path, tmp_path: Path) -> None:
    """`deltacells export --source-gene-order` gives back the source: X, and obs
    and var with their columns and dtypes, as anndata reads them."""
    import anndata
    import pandas as pd

    from conftest import run

    if source == "golden":
        path = request.getfixturevalue("golden") / "sources" / "obs_kinds.h5ad"
    else:
        path = request.getfixturevalue("pbmc")[1]
    run(binary, "convert", "-q", "--tile-size", "900", "--level", "3", path, tmp_path / "ds")
    run(binary, "export", "-q", "--source-gene-order", tmp_path / "ds", tmp_path / "back.h5ad")
    want, got = anndata.read_h5ad(path), anndata.read_h5ad(tmp_path / "back.h5ad")
    assert (got.X != want.X.astype(np.int32)).nnz == 0
    np.testing.assert_array_equal(got.obs.index.to_numpy(), want.obs.index.to_numpy())
    for frame_want, frame_got in [(want.obs, got.obs), (want.var, got.var)]:
        assert list(frame_got.columns) == list(frame_want.columns)
        for column in frame_want.columns:
            w, g = frame_want[column], frame_got[column]
            assert g.dtype == w.dtype, (column, g.dtype, w.dtype)
            if isinstance(w.dtype, pd.CategoricalDtype):
                assert list(g.cat.categories) == list(w.cat.categories), column
            assert [str(v) for v in g.tolist()] == [str(v) for v in w.tolist()], column
    np.testing.assert_array_equal(got.var.index.to_numpy(), want.var.index.to_numpy())
    assert got.var.index.name == want.var.index.name


def test_tiles_read_into_reused_buffers_stay_intact(golden: Path) -> None:
    ds = deltacells.open_dataset(str(golden / "obs_kinds"))
    want = expected_matrix(golden, "obs_kinds")
    starts = np.concatenate([[0], np.cumsum(ds.tile_cells)])
    for _ in range(3):
        held = [ds.read_tile(t) for t in range(ds.n_tiles)] * 2  # more than the pool keeps
        held += [ds.read_tile(t) for t in range(ds.n_tiles)]
        for i, tile in enumerate(held):
            t = i % ds.n_tiles
            assert (tile.to_scipy() != want[starts[t] : starts[t + 1]]).nnz == 0, t
        del held
        for t in range(ds.n_tiles):  # one at a time, each into buffers given back
            assert (ds.read_tile(t).to_scipy() != want[starts[t] : starts[t + 1]]).nnz == 0


def test_obs_take_reads_any_cells_in_any_order_across_many_tiles(binary: Path, tmp_path: Path, cache: str) -> None:
    """obs columns of every kind, with and without missing values, over 43
    tiles: any cells, shuffled, repeated, give the source's values (numbers
    and codes are gathered from the cache file in one step, the others tile
    by tile)."""
    import anndata
    import pandas as pd

    from conftest import REPO, run

    source = anndata.read_h5ad(REPO / "examples" / "pbmc_1k.h5ad")[:300].copy()
    rng = np.random.default_rng(3)
    n = source.n_obs
    with_gaps = rng.random(n) < 0.2
    source.obs = pd.DataFrame(
        {
            "label": pd.Categorical(rng.choice(["x", "y", "z"], n)),
            "label_missing": pd.Categorical(np.where(with_gaps, None, rng.choice(["p", "q"], n))),
            "count": rng.integers(0, 1000, n).astype(np.int32),
            "score": rng.random(n),
            "score_missing": np.where(with_gaps, np.nan, rng.random(n)),
            "flag": rng.random(n) < 0.5,
            "barcode": [f"cell-{i:04d}" for i in range(n)],
            "note": pd.array([None if g else f"note {i}" for i, g in enumerate(with_gaps)], dtype="string"),
        },
        index=source.obs_names,
    )
    path = tmp_path / "obs.h5ad"
    source.write_h5ad(path)
    out = tmp_path / "ds"
    run(binary, "convert", "-q", "--tile-size", "7", path, out)
    columns = list(source.obs.columns)
    ds = deltacells.open_dataset(str(out), obs_columns=columns, cache_dir=cache)
    assert ds.n_tiles == 43
    cells = np.concatenate([rng.permutation(n), [5, 5, 299, 0, 150, 5]])
    got = ds.obs.take_pandas(cells, columns)
    want = source.obs.iloc[cells]

    def plain(values) -> list:
        return [None if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v for v in values]

    for name in columns:
        assert plain(got[name].tolist()) == plain(want[name].tolist()), name
    codes = ds.obs.take(cells, ["label"])["label"]
    assert codes.dtype == np.int8 and [ds.obs.categories("label")[c] for c in codes] == want["label"].tolist()
    assert ds.obs.take(cells[:0], ["count"])["count"].shape == (0,)
