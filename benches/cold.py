"""Dropping a store's files from the page cache, for the cold-cache rows of
the benchmarks (benches/scale.py, benches/peers.py --cold)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def files_of(root: Path) -> list[Path]:
    """The files of a store: `root` itself when it is a file, else every file under it."""
    if root.is_file():
        return [root]
    return [p for p in root.rglob("*") if p.is_file()]


def evict(root: Path) -> int:
    """Drops every file of `root` from the page cache
    (posix_fadvise(POSIX_FADV_DONTNEED) after fdatasync); returns the bytes
    of them still cached after, as fincore counts them (which should be 0)."""
    files = files_of(root)
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    cached = 0
    for start in range(0, len(files), 200):
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES",
                              *map(str, files[start:start + 200])], capture_output=True, text=True)
        cached += sum(int(line.split()[0]) for line in out.stdout.splitlines() if line.strip())
    return cached
