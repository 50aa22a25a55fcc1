"""What test_lightning.py's distributed test runs: a small Lightning model
trained by ``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` (gloo)
from a :class:`deltacells.lightning.DataModule`, as a user's script runs it.
Lightning starts the second rank by running this script again.

    python lightning_ddp.py ROOT CACHE OUT

Each rank writes OUT/rank{R}.json: the cells of each epoch's training and
validation batches it read, the module's splits, its loaders' lengths, and
the error a module whose ranks would take unequal steps raised."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch

import deltacells
from deltacells.lightning import DataModule

EPOCHS = 3


class Recorder(pl.LightningModule):
    """A linear classifier of the cls column that notes every cell it is given."""

    def __init__(self, n_genes: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(n_genes, 4)
        self.seen: dict[str, list[list[int]]] = {"train": [[] for _ in range(EPOCHS)],
                                                 "val": [[] for _ in range(EPOCHS)]}

    def loss(self, batch: dict) -> torch.Tensor:
        x = torch.log1p(batch["X"].to_dense())
        return torch.nn.functional.cross_entropy(self.layer(x), batch["obs"]["cls"].long())

    def training_step(self, batch: dict, index: int) -> torch.Tensor:
        self.seen["train"][self.current_epoch] += batch["cells"].tolist()
        return self.loss(batch)

    def validation_step(self, batch: dict, index: int) -> None:
        self.seen["val"][self.current_epoch] += batch["cells"].tolist()
        self.log("val_loss", self.loss(batch), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(root: str, cache: str, out: str) -> None:
    torch.set_num_threads(1)
    data = DataModule(root, 64, split_by="donor", fractions=(0.7, 0.15, 0.15), split_seed=1, obs_columns=["cls"],
                      cache_dir=cache, threads=1)
    model = Recorder(data.n_genes)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(model, datamodule=data)
    # An odd number of train cells in batches of half of them: one rank
    # would take two steps, the other one.
    uneven = DataModule(root, 150, splits=(np.arange(301),), cache_dir=cache, threads=1)
    try:
        uneven.train_dataloader()
        refused = ""
    except deltacells.InvalidArgumentError as e:
        refused = str(e)
    report = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "seen": model.seen,
        "train_cells": data.train_cells.tolist(),
        "val_cells": data.val_cells.tolist(),
        "test_cells": data.test_cells.tolist(),
        "train_batches": len(data.train_dataloader()),
        "refused": refused,
    }
    Path(out, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
