"""Block allocation for the block store: free blocks from the map, the data file grown to
hold them, and a sync first when growing would leave many released blocks unused.

Released blocks are reused only once the commit that released them is fsynced and every read
that started before it has ended (``BlockMap.reclaim``); until then they wait in limbo. When
the file would have to grow while plenty of blocks wait only for an fsync, syncing lets the
commit reuse them instead.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .blockmap import EMPTY, BlockMap
from .datafile import DataFile

SYNC_TO_REUSE = 1024      # blocks waiting only for an fsync that make a commit sync, not grow


def _top(chosen: list[np.ndarray]) -> int:
    """One past the highest block in ``chosen`` (0 if none)."""
    flat = np.concatenate(chosen) if chosen else EMPTY
    return int(flat.max()) + 1 if flat.shape[0] else 0


def allocate(bmap: BlockMap, data: DataFile, sizes: list[int], *,
             sync: Callable[[], None], reclaim: Callable[[], int]) -> list[np.ndarray]:
    """Blocks for postings of ``sizes`` blocks; the file grows to hold them. If it would grow
    while many released blocks wait only for an fsync, ``sync`` first and, if ``reclaim``
    frees any, reuse them."""
    chosen = bmap.allocate(sizes)
    if _top(chosen) > bmap.high and bmap.limbo_blocks >= max(SYNC_TO_REUSE, bmap.high // 8):
        sync()
        if reclaim():
            chosen = bmap.allocate(sizes)
    data.grow(_top(chosen))
    return chosen
