"""deltacells.torch in real torch: DataLoader workers started with fork and
spawn, persistent workers that follow set_epoch, pin_memory, no warnings,
torch.distributed with gloo in two processes of two workers each, and a
linear classifier that learns from the batches."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from torch_workers import cells_of, distributed_rank

import deltacells
from conftest import run
from samples import make_samples_dataset


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> str:
    return str(make_samples_dataset(tmp_path_factory.mktemp("samples"), binary))


@pytest.fixture(scope="module")
def ds(root: str, tmp_path_factory: pytest.TempPathFactory) -> deltacells.Dataset:
    return deltacells.open_dataset(root, cache_dir=str(tmp_path_factory.mktemp("cache")), obs_columns=["sample"])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_workers_yield_every_cell_once_with_its_row_and_obs(torch, root, ds, method: str) -> None:
    from deltacells.torch import CellDataset

    data = CellDataset(root, batch_size=700, obs_columns=["sample"], cache_dir=ds.obs.cache_root)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context=method)
    seen = []
    for batch in loader:
        cells = batch["cells"].numpy()
        x = batch["X"]
        assert x.layout == torch.sparse_csr and x.dtype == torch.float32 and x.shape == (len(cells), ds.n_genes)
        want = ds.get_batch(cells)
        np.testing.assert_array_equal(x.crow_indices().numpy(), want.indptr)
        np.testing.assert_array_equal(x.col_indices().numpy(), want.indices)
        np.testing.assert_array_equal(x.values().numpy(), want.data.astype(np.float32))
        np.testing.assert_array_equal(batch["obs"]["sample"].numpy(), ds.obs.take(cells, ["sample"])["sample"])
        seen.append(cells)
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(ds.n_cells))


def epoch_order(torch, data, epoch: int, **loader_options) -> np.ndarray:
    data.set_epoch(epoch)
    return np.concatenate(list(torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, **loader_options)))


def test_persistent_workers_follow_set_epoch(torch, root, ds) -> None:
    from deltacells.torch import CellDataset

    data = CellDataset(root, batch_size=500, transform=cells_of, cache_dir=ds.obs.cache_root)
    persistent = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, persistent_workers=True)
    orders = []
    for epoch in range(3):
        data.set_epoch(epoch)
        orders.append(np.concatenate(list(persistent)))
    for epoch, order in enumerate(orders):
        np.testing.assert_array_equal(np.sort(order), np.arange(ds.n_cells))
        # The same order as workers started afresh for that epoch.
        np.testing.assert_array_equal(order, epoch_order(torch, CellDataset(root, batch_size=500, transform=cells_of,
                                                                            cache_dir=ds.obs.cache_root), epoch))
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])


def test_pin_memory_and_no_warnings(torch, root, ds) -> None:
    from deltacells.torch import CellDataset

    data = CellDataset(root, batch_size=1000, obs_columns=["sample"], cache_dir=ds.obs.cache_root)
    batches = list(torch.utils.data.DataLoader(data, batch_size=None, pin_memory=True))
    assert sum(b["X"].shape[0] for b in batches) == ds.n_cells
    if torch.cuda.is_available():  # pinning itself needs an accelerator
        assert batches[0]["X"].values().is_pinned()
    # In a fresh process (torch warns some things once per process), the
    # default path prints no warning at all.
    code = (
        "import sys, torch; from deltacells.torch import CellDataset; "
        "data = CellDataset(sys.argv[1], batch_size=1000, obs_columns=['sample'], cache_dir=sys.argv[2]); "
        "n = sum(b['X'].shape[0] for b in torch.utils.data.DataLoader(data, batch_size=None)); print(n)"
    )
    done = subprocess.run([sys.executable, "-W", "always", "-c", code, root, ds.obs.cache_root],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(ds.n_cells)
    assert "Warning" not in done.stderr, done.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_distributed_ranks_read_disjoint_shares(torch, root, ds, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(distributed_rank, args=(2, free_port(), root, ds.obs.cache_root, str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in range(2):
        shares = [np.array(r[epoch]) for r in ranks]
        assert not set(shares[0].tolist()) & set(shares[1].tolist())
        np.testing.assert_array_equal(np.sort(np.concatenate(shares)), np.arange(ds.n_cells))
        assert abs(len(shares[0]) - len(shares[1])) <= 1
    assert ranks[0][0] != ranks[0][1], "set_epoch reached the persistent workers"


def test_a_linear_classifier_learns_the_condition(torch, binary: Path, pbmc, tmp_path: Path) -> None:
    """Control against IFN-beta stimulated cells (the real PBMC files), from
    log1p counts through a linear layer: the training accuracy passes 0.9."""
    import anndata
    import pandas as pd

    inputs = []
    for path, condition in zip(pbmc, ["ctrl", "stim"], strict=True):
        adata = anndata.read_h5ad(path)
        adata.obs = pd.DataFrame({"condition": pd.Categorical([condition] * adata.n_obs,
                                                               categories=["ctrl", "stim"])},
                                 index=adata.obs_names)
        inputs.append(tmp_path / f"{condition}.h5ad")
        adata.write_h5ad(inputs[-1])
    run(binary, "convert", "-q", "--level", "3", *inputs, tmp_path / "ds")
    from deltacells.torch import CellDataset

    data = CellDataset(str(tmp_path / "ds"), batch_size=256, obs_columns=["condition"],
                       cache_dir=str(tmp_path / "cache"))
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2)
    torch.manual_seed(0)
    n_genes = deltacells.open_dataset(str(tmp_path / "ds")).n_genes
    model = torch.nn.Linear(n_genes, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    accuracy = 0.0
    for epoch in range(3):
        data.set_epoch(epoch)
        right = total = 0
        for batch in loader:
            x = torch.log1p(batch["X"].to_dense())
            y = batch["obs"]["condition"].long()
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            right += int((logits.argmax(1) == y).sum())
            total += len(y)
        accuracy = right / total
        assert total == 13_999
    assert accuracy > 0.9, accuracy


def test_bad_options_are_refused_when_the_dataset_is_made(torch, root, ds) -> None:
    from deltacells.torch import CellDataset

    with pytest.raises(deltacells.InvalidArgumentError, match=r"weights has 3 values"):
        CellDataset(root, weights=[1.0, 2.0, 3.0], cache_dir=ds.obs.cache_root)
    with pytest.raises(deltacells.UnknownNameError, match="no obs column 'nope'"):
        CellDataset(root, balance="nope", cache_dir=ds.obs.cache_root)
    with pytest.raises(deltacells.InvalidArgumentError, match="rank must be at most 1, not 2"):
        CellDataset(root, rank=2, world_size=2, cache_dir=ds.obs.cache_root)
    with pytest.raises(deltacells.DatasetNotFoundError):
        CellDataset(root + "-missing")


def test_cell_dataset_takes_the_epoch_keywords_and_the_open_ones(torch, root, ds) -> None:
    """CellDataset's keywords are the epoch's (``EpochArgs``, as
    ``Dataset.batches`` takes them) and the open ones (``OpenArgs``): each
    reaches what it is for, and any other is refused as Python refuses an
    unknown keyword, naming it."""
    from deltacells._types import CellDatasetArgs, EpochArgs, OpenArgs
    from deltacells.torch import CellDataset

    assert set(CellDatasetArgs.__annotations__) == set(EpochArgs.__annotations__) | set(OpenArgs.__annotations__)
    data = CellDataset(root, 16, shuffle=False, window_tiles=2, cells=range(40), obs_columns=["sample"],
                       cache_dir=ds.obs.cache_root, cache_bytes=0, transform=lambda b: b)
    assert data.open_options == {"cache_dir": ds.obs.cache_root, "cache_bytes": 0}
    assert data.batch_options["window_tiles"] == 2 and "cache_bytes" not in data.batch_options
    batches = list(data)
    assert [len(b) for b in batches] == [16, 16, 8]
    assert np.concatenate([b.cells for b in batches]).tolist() == list(range(40))  # not shuffled
    assert all("sample" in b.obs for b in batches)
    for wrong in ("shufle", "epoch", "worker"):  # a typo; what CellDataset fills in itself
        with pytest.raises(deltacells.ArgumentTypeError, match=f"unexpected keyword argument '{wrong}'"):
            CellDataset(root, **{wrong: 1}, cache_dir=ds.obs.cache_root)
