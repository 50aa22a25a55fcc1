"""``deltacells.compact``: a dataset's tiles encoded again at a higher zstd
level after a fast conversion, as ``deltacells compact`` does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Unpack

from . import _deltacells
from ._args import integer, keywords, location
from ._jobs import run
from ._options import CONVERT_DEFAULTS
from ._reaching import reaching
from ._types import JobArgs, PathLike

ARCHIVE_LEVEL: int = _deltacells.ARCHIVE_LEVEL
"""The zstd level :func:`compact` encodes at unless told: the smallest tiles."""


@dataclass(frozen=True)
class CompactSummary:
    """What a compaction did.

    Attributes:
        outcome: ``"compacted"``; ``"completed"`` (an interrupted compaction
            to the same level, finished); or ``"unchanged"`` (the tiles were
            at that level already: nothing was written).
        level_before: the zstd level the tiles were at.
        level: the zstd level they are at now.
        tiles: tiles in the dataset.
        tiles_encoded: tiles encoded by this call (fewer than ``tiles`` when
            an interrupted compaction had staged some).
        bytes_before: bytes of the tiles before.
        bytes_after: bytes of the tiles now.
        seconds: wall time.
        notes: what the compaction noted that is not an error.
    """

    outcome: str
    level_before: int
    level: int
    tiles: int
    tiles_encoded: int
    bytes_before: int
    bytes_after: int
    seconds: float
    notes: tuple[str, ...] = ()


def compact(
    dataset: PathLike,
    *,
    level: int = CONVERT_DEFAULTS["compact_level"],
    **job: Unpack[JobArgs],
) -> CompactSummary:
    """Encode the tiles of ``dataset`` again at zstd ``level``, as ``deltacells
    compact DATASET --level N`` does.

    The cells, obs and genes stay as they are and the tiles become byte for
    byte those a conversion at ``level`` writes: smaller, and as fast to
    decode. A reader never sees a half-compacted dataset: the new tiles are
    staged in the dataset and moved into place last, and a compaction that
    is interrupted is resumed (keeping the tiles it had encoded) by the next
    call with the same level.

    Args:
        dataset: a local folder, or an ``s3://`` or ``gs://`` prefix.
        level: the zstd level, 1 to 22 (default 19, the smallest tiles).
        threads, anonymous, endpoint, progress: as for :func:`convert`.

    Returns:
        What the compaction did.

    Raises:
        DatasetNotFoundError: no complete dataset at ``dataset``.
        CorruptDatasetError: a tile fails its checks (nothing is changed).
        InvalidArgumentError: ``level`` is outside 1..22, or an append into
            the dataset is unfinished.
    """
    keywords("compact", job, JobArgs.__annotations__)
    chosen = integer("level", level, 1, 22)
    reach = reaching(job)
    root = location("dataset", dataset)
    raw, notes = run(job.get("progress"), lambda bar: _deltacells.compact_dataset(root, chosen, reach, bar))
    return CompactSummary(
        outcome=raw["outcome"], level_before=raw["level_before"], level=raw["level"], tiles=raw["n_tiles"],
        tiles_encoded=raw["tiles_encoded"], bytes_before=raw["bytes_before"], bytes_after=raw["bytes_after"],
        seconds=raw["seconds"], notes=notes,
    )
