"""What the processes of test_torch.py's distributed test run (a module of
its own, so that processes started with spawn can import it)."""

from __future__ import annotations

import json
from pathlib import Path


def distributed_rank(rank: int, world_size: int, port: int, root: str, cache: str, out: str) -> None:
    """One rank of a gloo job on 127.0.0.1: two DataLoader workers read its
    share of two epochs; the cells of each epoch go to OUT/rank{rank}.json."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from deltacells.torch import CellDataset

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        data = CellDataset(root, batch_size=300, cache_dir=cache, transform=cells_of)
        loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, persistent_workers=True)
        epochs = []
        for epoch in range(2):
            data.set_epoch(epoch)
            epochs.append(np.concatenate(list(loader)).tolist())
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(epochs))


def cells_of(batch):  # noqa: ANN001, ANN201 - a transform that spawn workers can import
    """The batch's cell indices (a transform for CellDataset)."""
    return batch.cells
