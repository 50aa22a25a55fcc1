"""Collections (open_collection): several datasets with different gene sets
read as one, checked against SciPy references built from the input files on
real cells (the two PBMC files, the second with a subset of its genes in
another order and genes of its own), locally, from an S3 server and through
torch."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deltacells
from conftest import REPO, S3_ENV, run


class Source:
    """A dataset of a collection and what it was converted from."""

    def __init__(self, root: Path, x: sp.csr_matrix, names: list[str], obs: pd.DataFrame) -> None:
        self.root, self.x, self.names, self.obs = root, x, names, obs


def _write(adata, folder: Path, name: str, binary: Path, tile_size: int = 1500) -> Source:
    path = folder / f"{name}.h5ad"
    adata.write_h5ad(path)
    run(binary, "convert", "-q", "--tile-size", str(tile_size), "--level", "3", path, folder / name)
    x = sp.csr_matrix(adata.X).astype(np.int64)
    return Source(folder / name, x, list(adata.var_names), adata.obs.copy())


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, binary: Path, pbmc: tuple[Path, Path]) -> list[Source]:
    """The control PBMC cells with all 14,053 genes, and the stimulated ones
    with 9,000 of them in a random order plus 200 genes of their own; obs
    columns that overlap (label, with categories in other orders) and that
    do not (sample only in the first, score only in the second)."""
    import anndata

    rng = np.random.default_rng(5)
    folder = tmp_path_factory.mktemp("collection")
    a = anndata.read_h5ad(pbmc[0])
    a.obs["label"] = pd.Categorical(rng.choice(["T", "B", "NK"], a.n_obs), categories=["T", "B", "NK"])
    a.obs["sample"] = pd.Categorical(["ctrl"] * a.n_obs)
    b = anndata.read_h5ad(pbmc[1])
    keep = rng.choice(b.n_vars, 9000, replace=False)
    own = sp.random(b.n_obs, 200, density=0.01, random_state=1, format="csr", dtype=np.float32)
    own.data = np.ceil(own.data * 20)
    x = sp.hstack([b.X[:, keep], own], format="csr").astype(np.float32)
    var = pd.DataFrame(index=list(b.var_names[keep]) + [f"B_ONLY_{i}" for i in range(200)])
    labels = rng.choice(["Mono", "T", "DC"], b.n_obs)
    obs = pd.DataFrame(
        {"label": pd.Categorical(labels, categories=["Mono", "T", "DC"]), "score": rng.random(b.n_obs)},
        index=b.obs_names,
    )
    b2 = anndata.AnnData(X=x, obs=obs, var=var)
    return [_write(a, folder, "a", binary), _write(b2, folder, "b", binary, tile_size=1000)]


def reference(sources: list[Source], genes: list[str], cells: np.ndarray, starts: list[int]) -> np.ndarray:
    """The collection's cells `cells` as dense counts in `genes` (by name)."""
    out = np.zeros((len(cells), len(genes)), dtype=np.int64)
    for i, s in enumerate(sources):
        end = starts[i] + s.x.shape[0]
        at = np.flatnonzero((cells >= starts[i]) & (cells < end))
        where = {n: j for j, n in enumerate(s.names)}
        dense = s.x[cells[at] - starts[i]].toarray()
        for k, gene in enumerate(genes):
            if gene in where:
                out[at, k] = dense[:, where[gene]]
    return out


def open_both(sources: list[Source], **options) -> deltacells.Collection:
    return deltacells.open_collection({"a": str(sources[0].root), "b": str(sources[1].root)}, **options)


def test_one_cell_space_in_one_vocabulary(sources) -> None:
    coll = open_both(sources)
    a, b = sources
    assert coll.n_cells == len(coll) == a.x.shape[0] + b.x.shape[0]
    assert [m.name for m in coll.datasets] == ["a", "b"]
    assert [m.start for m in coll.datasets] == [0, a.x.shape[0]]
    # Union: a's genes in its column order, then b's new ones in its order.
    stored_a = deltacells.open_dataset(str(a.root)).var_names
    stored_b = deltacells.open_dataset(str(b.root)).var_names
    assert coll.var_names == stored_a + [g for g in stored_b if g.startswith("B_ONLY_")]
    var = coll.var
    assert list(var.columns) == ["n_datasets", "a", "b"]
    assert int(var["n_datasets"].eq(2).sum()) == 9000
    assert var.loc["B_ONLY_0", "a"] == False and var.loc["B_ONLY_0", "b"] == True  # noqa: E712
    dataset, row = coll.locate([0, a.x.shape[0], coll.n_cells - 1])
    np.testing.assert_array_equal(dataset, [0, 1, 1])
    np.testing.assert_array_equal(row, [0, 0, b.x.shape[0] - 1])
    inter = open_both(sources, genes="intersection")
    assert inter.var_names == [g for g in stored_a if g in set(b.names)]
    assert inter.n_genes == 9000


def test_get_batch_is_each_datasets_rows_in_the_vocabulary(sources) -> None:
    starts = [0, sources[0].x.shape[0]]
    rng = np.random.default_rng(2)
    cells = rng.integers(0, starts[1] + sources[1].x.shape[0], 600)
    for genes in ("union", "intersection", ["B_ONLY_3", "NOT_A_GENE", *sources[1].names[:50][::-1]]):
        coll = open_both(sources, genes=genes)
        batch = coll.get_batch(cells)
        x = batch.to_scipy()
        assert x.has_sorted_indices and x.shape == (600, coll.n_genes)
        np.testing.assert_array_equal(x.toarray(), reference(sources, coll.var_names, cells, starts))
    dense = coll.get_batch(cells[:20], dense=True, normalize=1e4, normalize_over="output")
    want = reference(sources, coll.var_names, cells[:20], starts).astype(np.float64)
    sums = want.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(dense, np.divide(want * 1e4, sums, out=np.zeros_like(want), where=sums > 0),
                               rtol=1e-5)


def test_obs_categories_are_merged_by_value(sources, cache: str) -> None:
    coll = open_both(sources, cache_dir=cache, obs_columns=["label"])
    a, b = sources
    obs = coll.obs
    assert obs.columns == ["obs_names", "label", "sample", "score"]
    assert obs.categories("label") == ["T", "B", "NK", "Mono", "DC"]
    assert obs.datasets_with("score") == ["b"]
    cells = np.array([0, 5, a.x.shape[0], a.x.shape[0] + 7, 3])
    frame = obs.take_pandas(cells, ["label", "sample", "score"])
    want = [a.obs["label"].iloc[0], a.obs["label"].iloc[5], b.obs["label"].iloc[0], b.obs["label"].iloc[7],
            a.obs["label"].iloc[3]]
    assert list(frame["label"]) == want
    assert list(frame["label"].cat.categories) == ["T", "B", "NK", "Mono", "DC"]
    assert frame["sample"].isna().tolist() == [False, False, True, True, False]
    assert np.isnan(frame["score"][0]) and frame["score"][2] == pytest.approx(b.obs["score"].iloc[0])
    assert obs.take(cells, ["label"])["label"].dtype == np.int32
    assert len(obs.where("label", "Mono")) == int((b.obs["label"] == "Mono").sum())
    train, test = coll.split(by="label", fractions=(0.6, 0.4), seed=1)
    assert len(train) + len(test) == coll.n_cells
    labels = obs.take(train, ["label"])["label"]
    assert not set(labels) & set(obs.take(test, ["label"])["label"])
    adata = coll.to_anndata(cells, obs_columns=["label"])
    assert adata.shape == (5, coll.n_genes)
    assert list(adata.obs["dataset"]) == ["a", "a", "b", "b", "a"]


def test_every_cell_once_across_ranks_and_workers_batches_mixing_datasets(sources, cache: str) -> None:
    coll = open_both(sources, genes="intersection", cache_dir=cache, obs_columns=["label"])
    starts = [0, sources[0].x.shape[0]]
    seen, mixed, batches = [], 0, 0
    for rank in range(2):
        for worker in range(2):
            for batch in coll.batches(256, seed=3, rank=rank, world_size=2, worker=worker, num_workers=2,
                                      obs_columns=["label"]):
                np.testing.assert_array_equal(batch.X.to_scipy().toarray(),
                                              reference(sources, coll.var_names, batch.cells, starts))
                labels = coll.obs.take(batch.cells, ["label"])["label"]
                np.testing.assert_array_equal(batch.obs["label"], labels)
                seen.append(batch.cells)
    cells = np.sort(np.concatenate(seen))
    np.testing.assert_array_equal(cells, np.arange(coll.n_cells))
    # One process reads all 12 tiles: its windows draw on both datasets.
    for batch in coll.batches(256, seed=3):
        in_b = batch.cells >= starts[1]
        mixed += bool(in_b.any() and (~in_b).any())
        batches += 1
    assert mixed >= 0.8 * batches, f"only {mixed} of {batches} batches hold cells of both datasets"


def test_weights_give_each_dataset_its_share(sources) -> None:
    coll = open_both(sources, weights={"a": 0.8, "b": 0.2})
    n_a = sources[0].x.shape[0]
    for epoch in range(2):
        cells = np.concatenate([b.cells for b in coll.batches(512, epoch=epoch, num_samples=30000)])
        in_a = int((cells < n_a).sum())
        # Exactly the share (largest remainders), a's cells each 3 or 4 times.
        assert (in_a, len(cells) - in_a) == (24000, 6000)
        counts = np.bincount(cells[cells < n_a], minlength=n_a)
        assert set(np.unique(counts)) <= {3, 4}
    # A dataset left out of the weights is not drawn; per-cell weights draw within the shares.
    only_b = open_both(sources, weights={"b": 1.0})
    assert all((b.cells >= n_a).all() for b in only_b.batches(1000))
    w = np.zeros(only_b.n_cells)
    w[n_a:n_a + 10] = 1.0
    drawn = np.concatenate([b.cells for b in only_b.batches(100, weights=w, num_samples=500)])
    assert set(np.unique(drawn)) <= set(range(n_a, n_a + 10))


def test_a_collection_file_is_read_back_and_names_a_changed_dataset(sources, binary: Path, tmp_path: Path,
                                                                     pbmc) -> None:
    roots = {}
    for s in sources:
        roots[s.root.name] = tmp_path / s.root.name
        shutil.copytree(s.root, roots[s.root.name])
    coll = deltacells.open_collection({k: str(v) for k, v in roots.items()}, genes="intersection",
                                      weights={"a": 1, "b": 3})
    path = tmp_path / "atlas.json"
    coll.save(path)
    text = json.loads(path.read_text())
    assert text["genes"] == "intersection" and text["weights"] == {"a": 1.0, "b": 3.0}
    again = deltacells.open_collection(path)
    assert (again.var_names, again.n_cells, again.weights) == (coll.var_names, coll.n_cells, {"a": 1.0, "b": 3.0})
    lazy = again._copy(1)  # as a worker gets it: nothing opened
    lazy.get_batch([0])
    assert lazy.native.is_open(0) and not lazy.native.is_open(1)
    # b converted again (other cells): the file and the lazy copy both name it.
    shutil.rmtree(roots["b"])
    run(binary, "convert", "-q", "--tile-size", "700", pbmc[1], roots["b"])
    with pytest.raises(deltacells.DatasetChangedError, match=r'dataset "b" .* changed since the collection'):
        deltacells.open_collection(path)
    with pytest.raises(deltacells.DeltacellsError, match=r'dataset "b" .* changed since the collection'):
        lazy.get_batch([coll.n_cells - 1])
    pickled = pickle.loads(pickle.dumps(coll))
    with pytest.raises(deltacells.DeltacellsError, match='dataset "b"'):
        list(pickled.batches(4096))
    shutil.rmtree(roots["b"])
    with pytest.raises(deltacells.DatasetNotFoundError, match=r'dataset "b": .*b'):
        deltacells.open_collection({k: str(v) for k, v in roots.items()})


def test_bad_arguments_are_refused_by_name(sources, tmp_path: Path) -> None:
    a, b = str(sources[0].root), str(sources[1].root)
    with pytest.raises(deltacells.InvalidArgumentError, match="the list is empty"):
        deltacells.open_collection([])
    with pytest.raises(deltacells.InvalidArgumentError, match="is given twice"):
        deltacells.open_collection([a, b, a + "/"])
    with pytest.raises(deltacells.InvalidArgumentError, match="'c' is not a dataset"):
        deltacells.open_collection({"a": a, "b": b}, weights={"c": 1.0})
    with pytest.raises(deltacells.InvalidArgumentError, match=r"weights\['b'\] must be finite and not negative"):
        deltacells.open_collection({"a": a, "b": b}, weights={"a": 1.0, "b": -2})
    with pytest.raises(deltacells.InvalidArgumentError, match="genes must be"):
        deltacells.open_collection([a, b], genes="everything")
    with pytest.raises(deltacells.InvalidArgumentError, match="not a collection file"):
        deltacells.open_collection(str(tmp_path / "nothing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{\"deltacells_collection\": 1, \"datasets\": [{\"name\": \"x\"}]}")
    with pytest.raises(deltacells.InvalidArgumentError, match=r'bad.json: datasets\[0\] has no "root"'):
        deltacells.open_collection(bad)
    coll = deltacells.open_collection([a, b])
    with pytest.raises(deltacells.CellIndexError, match="the collection has"):
        coll.get_batch([coll.n_cells])
    with pytest.raises(deltacells.UnknownNameError, match="no obs column 'nope'"):
        coll.batches(obs_columns=["nope"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(weights=st.dictionaries(st.sampled_from(["a", "b", "c", ""]), st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.text(max_size=3), st.none())))
def test_any_weights_give_a_valid_collection_or_a_clear_error(sources, weights) -> None:
    try:
        coll = open_both(sources, weights=weights)
    except deltacells.InvalidArgumentError as e:
        assert "weights" in str(e)
        return
    assert coll.weights is not None and sum(coll.weights.values()) > 0
    assert len(coll.batches(4096)) >= 1


def test_a_dataset_in_a_bucket_beside_a_local_one(
    sources, binary: Path, s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    example = REPO / "examples" / "pbmc_1k.h5ad"
    run(binary, "convert", "-q", "--tile-size", "300", "--endpoint", s3_server, example, "s3://test/one_k")
    import anndata

    k = anndata.read_h5ad(example)
    local = sources[1]
    coll = deltacells.open_collection({"b": str(local.root), "k": "s3://test/one_k"}, endpoint=s3_server,
                                      genes="intersection")
    both = [local, Source(Path(), sp.csr_matrix(k.X).astype(np.int64), list(k.var_names), k.obs)]
    starts = [0, local.x.shape[0]]
    assert coll.n_cells == local.x.shape[0] + k.n_obs
    seen = []
    for batch in coll.batches(500, seed=4):
        np.testing.assert_array_equal(batch.X.to_scipy().toarray(),
                                      reference(both, coll.var_names, batch.cells, starts))
        seen.append(batch.cells)
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(coll.n_cells))


def test_torch_workers_read_every_cell_of_a_collection_once(sources, torch, cache: str) -> None:
    from deltacells.torch import CellDataset

    coll = open_both(sources, genes="intersection", cache_dir=cache)
    data = CellDataset(coll, batch_size=300, obs_columns=["label"], seed=1)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    cells, labels = [], []
    for batch in loader:
        assert batch["X"].shape[1] == coll.n_genes
        cells.append(batch["cells"].numpy())
        labels.append(batch["obs"]["label"].numpy())
    cells_all = np.concatenate(cells)
    np.testing.assert_array_equal(np.sort(cells_all), np.arange(coll.n_cells))
    np.testing.assert_array_equal(np.concatenate(labels), coll.obs.take(cells_all, ["label"])["label"])
    with pytest.raises(deltacells.InvalidArgumentError, match="its own genes"):
        CellDataset(coll, genes=["A"])


def test_members_share_the_collections_threads(sources, tmp_path: Path, cache: str) -> None:
    """A process reading the obs of many datasets runs them on the
    collection's one pool: its threads do not grow with the datasets (each
    dataset's own pool cost 2 threads and about 0.2 MiB per dataset)."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        pytest.skip("counts threads in /proc")
    roots = {}
    for i in range(24):
        roots[f"m{i}"] = str(tmp_path / f"m{i}")
        shutil.copytree(sources[0].root, roots[f"m{i}"])
    coll = deltacells.open_collection(roots, threads=2, cache_dir=cache)
    n = sources[0].x.shape[0]
    coll.obs.take([0], ["label"])  # the pool is made, and pyarrow's threads
    before = len(list(tasks.iterdir()))
    cells = np.arange(3, coll.n_cells, n)  # a cell of every dataset
    labels = coll.obs.take(cells, ["label"])["label"]
    after = len(list(tasks.iterdir()))
    assert after - before <= 2, f"{after - before} threads for {len(roots)} datasets"
    want = sources[0].obs["label"].iloc[3]
    assert [coll.obs.categories("label")[c] for c in labels] == [want] * len(roots)
