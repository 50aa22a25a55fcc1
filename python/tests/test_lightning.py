"""deltacells.lightning.DataModule with real Lightning: a small model trained
by Trainer(strategy="ddp") on 2 processes (gloo, CPU) reads, on each rank,
its share of the train and validation cells, every train cell once per
epoch, another order each epoch; in one process the trainer's epoch reaches
the loader (each epoch's order is CellDataset's with set_epoch(epoch)), also
through DataLoader workers; validation, test and prediction read their cells
once; splits by obs group, by fraction and given; weights of the train
cells; bad arguments named. Data: the bundled PBMC cells (training_data.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import deltacells
from training_data import convert_with_columns

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def root(lightning, tmp_path_factory: pytest.TempPathFactory) -> str:  # noqa: ANN001
    _, ds = convert_with_columns(tmp_path_factory.mktemp("lightning"), tile_size=250)
    return str(ds)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def ds(root: str, cache: str) -> deltacells.Dataset:
    return deltacells.open_dataset(root, cache_dir=cache, obs_columns=["donor", "cls"])


def test_ddp_ranks_read_their_shares_and_every_train_cell_once(lightning, root: str, cache: str,  # noqa: ANN001
                                                                 tmp_path: Path) -> None:
    # The script imports the package these tests import (installed, or python/ on the path).
    package = str(Path(deltacells.__file__).parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(HERE / "lightning_ddp.py"), root, cache, str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks)
    train, val = np.array(ranks[0]["train_cells"]), np.array(ranks[0]["val_cells"])
    assert ranks[1]["train_cells"] == ranks[0]["train_cells"]  # the same split on both ranks
    for part in ("train", "val"):
        want = train if part == "train" else val
        for epoch in range(len(ranks[0]["seen"][part])):
            shares = [np.array(r["seen"][part][epoch]) for r in ranks]
            assert abs(len(shares[0]) - len(shares[1])) <= 1, (part, epoch)
            # Every cell of the part once, across the ranks.
            np.testing.assert_array_equal(np.sort(np.concatenate(shares)), want)
    orders = ranks[0]["seen"]["train"]
    assert orders[0] != orders[1] and orders[1] != orders[2], "the trainer's epoch reached the loader"
    assert ranks[0]["train_batches"] == ranks[1]["train_batches"] == -(-len(train) // 2 // 64)
    for r in ranks:
        assert "the 2 ranks' shares of 301 train cells make 1 to 2 batches" in r["refused"]


def recorder(lightning, n_genes: int):  # noqa: ANN001, ANN201
    """A LightningModule that notes the cells of every batch by stage and epoch."""
    import torch

    class Recorder(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(n_genes, 1)
            self.seen: dict[tuple[str, int], list[np.ndarray]] = {}

        def note(self, stage: str, batch: dict) -> torch.Tensor:
            self.seen.setdefault((stage, self.current_epoch), []).append(batch["cells"].numpy())
            return self.layer(torch.log1p(batch["X"].to_dense())).mean()

        def training_step(self, batch: dict, index: int) -> torch.Tensor:
            return self.note("train", batch)

        def validation_step(self, batch: dict, index: int) -> None:
            self.note("val", batch)

        def test_step(self, batch: dict, index: int) -> None:
            self.note("test", batch)

        def predict_step(self, batch: dict, index: int) -> np.ndarray:
            return batch["cells"].numpy()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Recorder()


def trainer(lightning, epochs: int):  # noqa: ANN001, ANN201
    return lightning.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_trainers_epoch_reaches_the_loader(lightning, root: str, cache: str, workers: int) -> None:
    from deltacells.lightning import DataModule
    from deltacells.torch import CellDataset

    options = {} if not workers else {"num_workers": workers, "persistent_workers": True}
    data = DataModule(root, 100, split_by="donor", seed=3, cache_dir=cache, dataloader_options=options)
    model = recorder(lightning, data.n_genes)
    fit = trainer(lightning, 3)
    fit.fit(model, datamodule=data)
    assert fit.num_training_batches == len(data.train_dataloader()) == -(-len(data.train_cells) // 100)
    assert fit.estimated_stepping_batches == 3 * fit.num_training_batches
    for epoch in range(3):
        order = np.concatenate(model.seen[("train", epoch)])
        np.testing.assert_array_equal(np.sort(order), data.train_cells)
        reference = CellDataset(root, 100, cells=data.train_cells, seed=3, cache_dir=cache, transform=lambda b: b.cells)
        reference.set_epoch(epoch)
        if not workers:
            np.testing.assert_array_equal(order, np.concatenate(list(reference)))
        np.testing.assert_array_equal(np.concatenate(model.seen[("val", epoch)]), data.val_cells)
    assert not np.array_equal(np.concatenate(model.seen[("train", 0)]), np.concatenate(model.seen[("train", 1)]))
    fit.test(model, datamodule=data)
    np.testing.assert_array_equal(np.concatenate(model.seen[("test", 3)]), data.test_cells)
    predicted = fit.predict(model, datamodule=data)
    np.testing.assert_array_equal(np.sort(np.concatenate(predicted)), np.arange(1000))


def test_a_resumed_run_reads_the_epoch_it_resumes_at(lightning, root: str, cache: str,  # noqa: ANN001
                                                       tmp_path: Path) -> None:
    from deltacells.lightning import DataModule
    from deltacells.torch import CellDataset

    data = DataModule(root, 100, seed=5, cache_dir=cache)
    model = recorder(lightning, data.n_genes)
    first = trainer(lightning, 2)
    first.fit(model, datamodule=data)
    first.save_checkpoint(tmp_path / "two.ckpt")
    resumed = recorder(lightning, data.n_genes)
    trainer(lightning, 3).fit(resumed, datamodule=DataModule(root, 100, seed=5, cache_dir=cache),
                              ckpt_path=tmp_path / "two.ckpt")
    assert list(resumed.seen) == [("train", 2), ("val", 2)]
    reference = CellDataset(root, 100, cells=data.train_cells, seed=5, cache_dir=cache, transform=lambda b: b.cells)
    reference.set_epoch(2)
    np.testing.assert_array_equal(np.concatenate(resumed.seen[("train", 2)]), np.concatenate(list(reference)))


def test_splits_by_group_by_fraction_and_given(lightning, root: str, ds: deltacells.Dataset, cache: str) -> None:
    from deltacells.lightning import DataModule, random_split

    data = DataModule(root, split_by="donor", fractions=(0.6, 0.2, 0.2), cache_dir=cache)
    donors = ds.obs.take(np.arange(1000), ["donor"])["donor"]
    parts = [set(donors[p].tolist()) for p in (data.train_cells, data.val_cells, data.test_cells)]
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    assert sum(map(len, (data.train_cells, data.val_cells, data.test_cells))) == 1000
    data = DataModule(root, fractions=(0.9, 0.1), cache_dir=cache, cells=range(500))
    assert (len(data.train_cells), len(data.val_cells), len(data.test_cells)) == (450, 50, 0)
    assert len(data.val_dataloader()) == 1 and data.test_dataloader() == []
    assert np.all(data.train_cells < 500)
    train, val = random_split(np.arange(1000), (0.9, 0.1), seed=0)
    assert len(train) == 900 and not set(train) & set(val)
    data = DataModule(ds, splits=(range(0, 800), [900, 800], range(950, 1000)))
    np.testing.assert_array_equal(data.val_cells, [800, 900])
    # weights are given per cell of the dataset; the train cells' are used.
    cls = ds.obs.take(np.arange(1000), ["cls"])["cls"]
    data = DataModule(ds, 50, fractions=(0.5, 0.5), weights=(cls == 0).astype(float), num_samples=300,
                      obs_columns=["cls"])
    drawn = np.concatenate([b["obs"]["cls"].numpy() for b in data.train_dataloader()])
    assert len(drawn) == 300 and np.all(drawn == 0)


def test_bad_arguments_are_named(lightning, root: str, cache: str) -> None:
    from deltacells.lightning import DataModule

    with pytest.raises(deltacells.ArgumentTypeError, match="nope: not an argument of DataModule"):
        DataModule(root, nope=1)
    with pytest.raises(deltacells.InvalidArgumentError, match="dataloader_options: batch_size is set by the"):
        DataModule(root, cache_dir=cache, dataloader_options={"batch_size": 4})
    with pytest.raises(deltacells.ArgumentTypeError, match="dataloader_options: 'workers' is not an argument"):
        DataModule(root, cache_dir=cache, dataloader_options={"workers": 4})
    with pytest.raises(deltacells.InvalidArgumentError, match="fractions must sum to 1"):
        DataModule(root, cache_dir=cache, fractions=(0.5, 0.2))
    with pytest.raises(deltacells.InvalidArgumentError, match="fractions must be 1 to 3 numbers"):
        DataModule(root, cache_dir=cache, fractions=(0.25,) * 4)
    with pytest.raises(deltacells.InvalidArgumentError, match="splits: a cell is in two parts"):
        DataModule(root, cache_dir=cache, splits=([1, 2], [2, 3]))
    with pytest.raises(deltacells.InvalidArgumentError, match="the train split has no cells"):
        DataModule(root, cache_dir=cache, fractions=(0.0, 1.0))
    with pytest.raises(deltacells.InvalidArgumentError, match="weights has 3 values"):
        DataModule(root, cache_dir=cache, weights=[1.0, 2.0, 3.0])
    with pytest.raises(deltacells.UnknownNameError, match="no obs column 'nope'"):
        DataModule(root, cache_dir=cache, split_by="nope")
    with pytest.raises(deltacells.InvalidArgumentError, match="batch_size must be at least 1"):
        DataModule(root, 0, cache_dir=cache)
    with pytest.raises(deltacells.DatasetNotFoundError):
        DataModule(root + "-missing")
