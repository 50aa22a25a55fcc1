"""deltacells.torch.CellMapDataset in real torch: a batch of sampled indices
is exactly get_batch's rows (any order, repeats, any integer type, across
tiles), DataLoaders with two worker processes (fork and spawn) give each index
of RandomSampler, WeightedRandomSampler and SequentialSampler in the
sampler's order, two DistributedSampler ranks of two workers each read every
cell once per epoch (the padding accounted for), the forms and obs columns
are those of get_batch and to_tensors, a collection works, and bad arguments
are named. Data made from the bundled PBMC cells (no ../shared)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

import deltacells
from conftest import REPO, run
from samples import make_samples_dataset

#: Cells of the small dataset: odd, so that two DistributedSampler ranks pad.
ODD_CELLS = 999


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> str:
    """8,000 cells in tiles of 1,000 (obs: sample, cls, n_counts, obs_names...)."""
    return str(make_samples_dataset(tmp_path_factory.mktemp("samples"), binary))


@pytest.fixture(scope="module")
def odd_root(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> str:
    """999 PBMC cells in tiles of 250, with 5,000 of the genes in another
    order and a "sample" column of its own."""
    import anndata
    import pandas as pd

    folder = tmp_path_factory.mktemp("odd")
    source = anndata.read_h5ad(REPO / "examples" / "pbmc_1k.h5ad")
    genes = np.random.default_rng(3).permutation(source.n_vars)[:5000]
    part = source[:ODD_CELLS, genes].copy()
    part.obs = pd.DataFrame({"sample": pd.Categorical(["odd"] * part.n_obs)}, index=part.obs_names)
    part.write_h5ad(folder / "odd.h5ad")
    run(binary, "convert", "-q", "--tile-size", "250", "--level", "3", folder / "odd.h5ad", folder / "odd")
    return str(folder / "odd")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def ds(root: str, cache: str) -> deltacells.Dataset:
    return deltacells.open_dataset(root, cache_dir=cache, obs_columns=["sample", "cls", "n_counts"])


def assert_rows(x, want, dtype=None) -> None:  # noqa: ANN001
    """A batch's X tensor holds `want` (get_batch's Batch or dense array), as `dtype`."""
    import torch

    if isinstance(want, np.ndarray):
        assert x.layout == torch.strided and x.shape == want.shape
        np.testing.assert_array_equal(x.numpy(), want.astype(x.numpy().dtype))
        return
    assert x.layout == torch.sparse_csr and tuple(x.shape) == want.shape
    np.testing.assert_array_equal(x.crow_indices().numpy(), want.indptr)
    np.testing.assert_array_equal(x.col_indices().numpy(), want.indices)
    values = x.values().numpy()
    if dtype is not None:
        assert x.dtype == dtype
    np.testing.assert_array_equal(values, want.data.astype(values.dtype))


def loader_cells(loader) -> tuple[np.ndarray, list]:  # noqa: ANN001
    batches = list(loader)
    return np.concatenate([b["cells"].numpy() for b in batches]), batches


def test_a_batch_is_get_batchs_rows_in_any_order_with_repeats_and_any_integer_type(torch, root, ds, cache) -> None:
    from deltacells.torch import CellMapDataset, collate

    data = CellMapDataset(root, obs_columns=["sample"], cache_dir=cache)
    assert len(data) == ds.n_cells == 8000 and data.n_genes == ds.n_genes
    rng = np.random.default_rng(0)
    # Every tile, tile edges, repeats (one cell four times), descending runs.
    cells = np.concatenate([rng.integers(0, ds.n_cells, 600), [999, 1000, 7999, 0, 0, 1000, 5, 5, 5, 5],
                            np.arange(3100, 2900, -1)])
    want = ds.get_batch(cells)
    forms = [cells.tolist(), *(cells.astype(t) for t in (np.int16, np.int32, np.int64, np.uint16, np.uint32,
                                                          np.uint64)),
             torch.from_numpy(cells), torch.from_numpy(cells.astype(np.int32))]
    for given in forms:
        batch = collate(data.__getitems__(given))
        assert type(batch) is dict and set(batch) == {"X", "cells", "obs"}
        np.testing.assert_array_equal(batch["cells"].numpy(), cells)
        assert batch["cells"].dtype == torch.int64
        assert_rows(batch["X"], want, torch.float32)
        np.testing.assert_array_equal(batch["obs"]["sample"].numpy(), ds.obs.take(cells, ["sample"])["sample"])
    small = np.array([3, 120, 3, 0])
    for t in (np.int8, np.uint8):
        assert_rows(data.__getitems__(small.astype(t))["X"], ds.get_batch(small))
    assert data.__getitems__([])["X"].shape == (0, ds.n_genes)
    for i in (0, 999, 1000, 7999, np.int64(4321), np.uint8(200), np.int16(3), torch.tensor(17)):
        one = data[i]
        assert type(one) is dict and one["X"].shape == (1, ds.n_genes)
        assert one["cells"].tolist() == [int(i)]
        assert_rows(one["X"], ds.get_batch([int(i)]))
    for bad in ([0, 8000], [-1], np.array([7, 2**63], dtype=np.uint64)):
        with pytest.raises(deltacells.CellIndexError, match="out of range: the dataset has 8000 cells"):
            data.__getitems__(bad)
    with pytest.raises(IndexError, match="cell 8000 is out of range"):
        data[8000]
    with pytest.raises(deltacells.CellIndexError, match="cell -1 is out of range"):
        data[-1]
    with pytest.raises(deltacells.InvalidArgumentError, match="index must be an integer"):
        data["3"]
    with pytest.raises(deltacells.ArgumentTypeError, match="cells must be integers"):
        data.__getitems__([1.5])


def sampler_of(torch, kind: str, n: int, seed: int):  # noqa: ANN001, ANN201
    generator = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.utils.data.RandomSampler(range(n), generator=generator)
    if kind == "weighted":  # with replacement: repeats within and across batches
        weights = np.random.default_rng(seed).random(n) ** 4
        return torch.utils.data.WeightedRandomSampler(weights, 3000, replacement=True, generator=generator)
    return torch.utils.data.SequentialSampler(range(n))


@pytest.mark.parametrize(("kind", "method"), [("random", "fork"), ("weighted", "fork"), ("sequential", "fork"),
                                              ("random", "spawn")])
def test_dataloader_workers_give_each_sampled_index_in_the_samplers_order(torch, root, ds, cache, kind: str,
                                                                          method: str) -> None:
    from deltacells.torch import CellMapDataset, collate

    data = CellMapDataset(root, obs_columns=["cls"], cache_dir=cache)
    data[0]  # used in this process first: forked workers must open their own
    order = np.array(list(sampler_of(torch, kind, len(data), seed=11)))
    loader = torch.utils.data.DataLoader(data, batch_size=512, sampler=sampler_of(torch, kind, len(data), seed=11),
                                         num_workers=2, collate_fn=collate, multiprocessing_context=method)
    cells, batches = loader_cells(loader)
    np.testing.assert_array_equal(cells, order)
    if kind == "weighted":
        assert len(np.unique(cells)) < len(cells)
    else:
        np.testing.assert_array_equal(np.sort(cells), np.arange(len(data)))
    assert [len(b["cells"]) for b in batches] == [len(order[i:i + 512]) for i in range(0, len(order), 512)]
    for batch in batches[:2] + batches[-1:]:
        got = batch["cells"].numpy()
        assert_rows(batch["X"], ds.get_batch(got), torch.float32)
        np.testing.assert_array_equal(batch["obs"]["cls"].numpy(), ds.obs.take(got, ["cls"])["cls"])


@pytest.mark.parametrize("over", ["dataset", "collection"])
def test_distributed_samplers_of_two_ranks_with_two_workers_read_every_cell_once_an_epoch(
    torch, root, odd_root, cache, over: str
) -> None:
    from deltacells.torch import CellMapDataset, collate

    if over == "dataset":
        data = CellMapDataset(odd_root, cache_dir=cache)
    else:
        data = CellMapDataset(deltacells.open_collection([odd_root, root], cache_dir=cache))
    n = len(data)
    assert n % 2 == 1  # 999 or 8,999: the ranks pad with one repeated cell
    samplers = [torch.utils.data.DistributedSampler(data, num_replicas=2, rank=r, shuffle=True, seed=7,
                                                    drop_last=False) for r in range(2)]
    loaders = [torch.utils.data.DataLoader(data, batch_size=128, sampler=s, num_workers=2, collate_fn=collate,
                                           persistent_workers=True) for s in samplers]
    epochs = []
    for epoch in range(2):
        shares = []
        for sampler, loader in zip(samplers, loaders, strict=True):
            sampler.set_epoch(epoch)
            shares.append(loader_cells(loader)[0])
            np.testing.assert_array_equal(shares[-1], list(sampler))  # the sampler's order
        # DistributedSampler shuffles with seed + epoch, pads the list to a
        # multiple of the ranks with its first cells, and deals it out.
        permutation = torch.randperm(n, generator=torch.Generator().manual_seed(7 + epoch)).numpy()
        padding = -n % 2
        padded = np.concatenate([permutation, permutation[:padding]])
        for rank in range(2):
            np.testing.assert_array_equal(shares[rank], padded[rank::2])
        counts = np.bincount(np.concatenate(shares), minlength=n)
        assert counts.sum() == n + padding == 2 * len(shares[0])
        np.testing.assert_array_equal(np.flatnonzero(counts != 1), np.sort(permutation[:padding]))
        assert (counts[permutation[:padding]] == 2).all() and counts.min() == 1
        epochs.append(np.concatenate(shares))
    assert not np.array_equal(epochs[0], epochs[1])


def test_forms_and_obs_are_those_of_get_batch_and_to_tensors(torch, root, ds, cache) -> None:
    from deltacells import CellBatch
    from deltacells.torch import CellMapDataset, collate, to_tensors

    cells = np.random.default_rng(4).integers(0, ds.n_cells, 300)
    columns = ["sample", "n_counts", "obs_names"]
    ds.obs.localize(["obs_names"])
    names = list(ds.var_names[:40][::-1]) + ["NOT_A_GENE"] + list(ds.var_names[500:700])
    cases = [
        (dict(), dict(), torch.float32),
        (dict(dense=True), dict(dense=True), torch.float32),
        (dict(dense=True, dtype=torch.int32), dict(dense=True), torch.int32),
        (dict(dtype=np.int64), dict(), torch.int64),
        (dict(dtype=torch.float64), dict(), torch.float64),
        (dict(genes=names), dict(genes=names), torch.float32),
        (dict(genes=ds.vocabulary(names)), dict(genes=names), torch.float32),
        (dict(genes="source", sorted_columns=False), dict(genes="source", sorted_columns=False), torch.float32),
        (dict(normalize=1e4, log1p=True), dict(normalize=1e4, log1p=True), torch.float32),
        (dict(genes=names, normalize=10.0, normalize_over="output", dense=True, dtype=torch.float16),
         dict(genes=names, normalize=10.0, normalize_over="output", dense=True), torch.float16),
    ]
    for options, read, dtype in cases:
        data = CellMapDataset(root, obs_columns=columns, cache_dir=cache, **options)
        batch = collate(data.__getitems__(cells))
        want = ds.get_batch(cells, **read)
        expected = to_tensors(CellBatch(want, cells, ds.obs.take(cells, columns)), dtype)
        assert batch["X"].dtype == dtype == expected["X"].dtype, options
        assert batch["X"].layout == expected["X"].layout
        assert data.n_genes == batch["X"].shape[1] == want.shape[1]
        if batch["X"].layout == torch.sparse_csr:
            for part in ("crow_indices", "col_indices", "values"):
                got, exp = getattr(batch["X"], part)(), getattr(expected["X"], part)()
                assert got.dtype == exp.dtype
                np.testing.assert_array_equal(got.numpy(), exp.numpy())
        else:
            np.testing.assert_array_equal(batch["X"].numpy(), expected["X"].numpy())
        for name in columns:
            got, exp = batch["obs"][name], expected["obs"][name]
            assert type(got) is type(exp)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(exp))
    # A transform gets the CellBatch (float32 values read by the Rust reader).
    data = CellMapDataset(root, obs_columns=["sample"], cache_dir=cache, transform=lambda b: b)
    raw = data.__getitems__(cells)
    assert isinstance(raw, deltacells.CellBatch) and collate(raw) is raw
    assert raw.X.data.dtype == np.float32
    np.testing.assert_array_equal(raw.X.data, ds.get_batch(cells).data)
    # genes= in worker processes: each builds its vocabulary.
    data = CellMapDataset(root, genes=ds.vocabulary(names), cache_dir=cache)
    loader = torch.utils.data.DataLoader(data, batch_size=100, num_workers=2, collate_fn=collate,
                                         sampler=sampler_of(torch, "random", len(data), seed=2))
    for batch in loader:
        assert_rows(batch["X"], ds.get_batch(batch["cells"].numpy(), genes=names))


def test_a_collection_and_an_open_dataset_work_in_spawned_workers(torch, root, odd_root, ds, cache) -> None:
    from deltacells.torch import CellMapDataset, collate

    coll = deltacells.open_collection({"odd": odd_root, "samples": root}, genes="intersection", cache_dir=cache)
    data = CellMapDataset(coll, obs_columns=["sample", "cls"])
    assert len(data) == coll.n_cells == ODD_CELLS + 8000 and data.n_genes == coll.n_genes == 5000
    edge = [ODD_CELLS - 1, ODD_CELLS, 0, coll.n_cells - 1, ODD_CELLS, 17]
    batch = collate(data.__getitems__(edge))
    assert_rows(batch["X"], coll.get_batch(edge))
    taken = coll.obs.take(edge, ["sample", "cls"])
    for name in ("sample", "cls"):
        np.testing.assert_array_equal(batch["obs"][name].numpy(), taken[name])
    assert coll.obs.categories("sample")[int(batch["obs"]["sample"][0])] == "odd"
    assert int(batch["obs"]["cls"][0]) == -1  # odd has no cls column
    loader = torch.utils.data.DataLoader(data, batch_size=700, sampler=sampler_of(torch, "random", len(data), seed=3),
                                         num_workers=2, collate_fn=collate, multiprocessing_context="spawn")
    cells, batches = loader_cells(loader)
    np.testing.assert_array_equal(np.sort(cells), np.arange(coll.n_cells))
    for batch in batches[:3]:
        got = batch["cells"].numpy()
        assert_rows(batch["X"], coll.get_batch(got))
        np.testing.assert_array_equal(batch["obs"]["cls"].numpy(), coll.obs.take(got, ["cls"])["cls"])
    # An open dataset: pickled to its root and options, opened again by each worker.
    data = CellMapDataset(ds, obs_columns=["sample"], dense=True)
    state = pickle.dumps(data)
    assert len(state) < 4000 and pickle.loads(state)._opened is None
    loader = torch.utils.data.DataLoader(data, batch_size=1000, num_workers=2, collate_fn=collate,
                                         multiprocessing_context="spawn")
    cells, batches = loader_cells(loader)
    np.testing.assert_array_equal(cells, np.arange(ds.n_cells))
    assert_rows(batches[3]["X"], ds.get_batch(range(3000, 4000), dense=True))


def test_cells_drawn_again_come_from_each_process_cache(torch, root, ds, cache) -> None:  # noqa: ARG001
    from deltacells.torch import CellMapDataset

    cells = np.random.default_rng(5).choice(ds.n_cells, 256, replace=False)
    data = CellMapDataset(root, cache_dir=cache)  # the default cache, all of it in one process
    first = data.__getitems__(cells)
    opened = data._dataset()[0]
    before = opened.io_stats()["requests"]
    again = data.__getitems__(cells[::-1])
    assert opened.io_stats()["requests"] == before
    assert_rows(again["X"], ds.get_batch(cells[::-1]))
    assert torch.equal(first["cells"], torch.from_numpy(cells))
    uncached = CellMapDataset(root, cache_dir=cache, cache_bytes=0)
    uncached.__getitems__(cells)
    opened = uncached._dataset()[0]
    before = opened.io_stats()["requests"]
    uncached.__getitems__(cells)
    assert opened.io_stats()["requests"] > before


def test_bad_arguments_are_refused_by_name(torch, root, ds, cache) -> None:
    from deltacells.torch import CellMapDataset

    def refused(error: type[Exception], match: str, root: object = root, **options: object) -> None:
        with pytest.raises(error, match=match):
            CellMapDataset(root, cache_dir=cache, **options)

    refused(deltacells.UnknownNameError, "no obs column 'nope'", obs_columns=["sample", "nope"])
    refused(deltacells.ArgumentTypeError, "obs_columns must be a list of column names", obs_columns="sample")
    refused(deltacells.InvalidArgumentError, "normalize must be a finite number above zero", normalize=-1)
    refused(deltacells.InvalidArgumentError, "normalize_over must be 'stored'", normalize_over="all")
    refused(deltacells.InvalidArgumentError, "log1p must be True or False", log1p="yes")
    refused(deltacells.InvalidArgumentError, "dense must be True or False", dense=1)
    refused(deltacells.InvalidArgumentError, "sorted_columns must be True or False", sorted_columns=None)
    refused(deltacells.InvalidArgumentError, "dtype must be a torch dtype of numbers", dtype="nope")
    refused(deltacells.InvalidArgumentError, "dtype must be a torch dtype of real numbers", dtype=torch.complex64)
    refused(deltacells.InvalidArgumentError, r"dtype torch.int64: normalize and log1p give float values",
            dtype=torch.int64, log1p=True)
    refused(deltacells.InvalidArgumentError, "threads must be at least 1", threads=0)
    refused(deltacells.InvalidArgumentError, "gene_column goes with genes=", gene_column="gene_ids")
    refused(deltacells.ArgumentTypeError, "genes: entry 1 is 5", genes=["A", 5])
    refused(deltacells.UnknownNameError, "gene_column 'nope'", genes=["A"], gene_column="nope")
    refused(deltacells.InvalidArgumentError, "cache_bytes must be at least 0", cache_bytes=-1)
    refused(deltacells.ArgumentTypeError, "batch_size: not an argument of CellMapDataset", batch_size=64)
    refused(deltacells.ArgumentTypeError, "root must be a path or a URL", root=5)
    refused(deltacells.DatasetNotFoundError, "-missing", root=root + "-missing")
    coll = deltacells.open_collection([root], cache_dir=cache)
    with pytest.raises(deltacells.InvalidArgumentError, match="genes: a collection's batches are in its own genes"):
        CellMapDataset(coll, genes=["A"])
    with pytest.raises(deltacells.InvalidArgumentError, match="cache_bytes: a collection is opened with the options"):
        CellMapDataset(coll, cache_bytes=10)
    # torch's default collate (a list of cells) is refused by name.
    data = CellMapDataset(root, cache_dir=cache)
    with pytest.raises(deltacells.InvalidArgumentError, match="collate_fn=deltacells.torch.collate"):
        next(iter(torch.utils.data.DataLoader(data, batch_size=8)))


def test_the_form_arguments_are_get_batchs(torch) -> None:
    """Every argument of Dataset.get_batch but the cells is one of
    CellMapDataset's, with the same default."""
    import inspect

    from deltacells.torch import CellMapDataset

    ours = inspect.signature(CellMapDataset.__init__).parameters
    theirs = inspect.signature(deltacells.Dataset.get_batch).parameters
    for name, parameter in theirs.items():
        if name not in ("self", "cells"):
            assert name in ours and ours[name].default == parameter.default, name
