"""The block store's cache of partly filled tail blocks.

An append rewrites its posting's partly filled last block into a new block. The commit that
wrote that block keeps its bytes here, so the next append need not read it back (under a
flat-out ingest most appends would, one I/O each). A kept tail is used only while the map
still names its block with its checksum; past the byte budget, those written longest ago go.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, NamedTuple

import numpy as np

from .blockmap import Entry

#: Default budget of kept tail bytes (~2 KiB a posting).
TAIL_CACHE_BYTES = 64 << 20


class Tail(NamedTuple):
    """The bytes of a posting's partly filled last block, kept by the commit that wrote it."""

    block: int
    checksum: int
    data: bytes


class TailCache:
    """Kept tail blocks, oldest first, within ``budget`` bytes. Not thread-safe: the block
    store uses it under its write lock."""

    def __init__(self, budget: int):
        self.budget = budget
        self.tails: OrderedDict[int, Tail] = OrderedDict()
        self.bytes = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self.tails)

    def keep(self, written: Iterable[tuple[int, Entry | None]], tails: list[bytes]) -> None:
        """After a commit: for each posting it wrote (its new entry, None if dropped), keep the
        bytes of its partly filled last block (``tails``; empty if that block is full)."""
        for (pid, e), tail in zip(written, tails):
            old = self.tails.pop(pid, None)
            if old is not None:
                self.bytes -= len(old.data)
            if e is not None and tail:
                self.tails[pid] = Tail(int(e.blocks[-1]), int(e.sums[-1]), tail)
                self.bytes += len(tail)
        while self.bytes > self.budget:
            self.bytes -= len(self.tails.popitem(last=False)[1].data)

    def get(self, pid: int, blocks: np.ndarray, sums: np.ndarray) -> bytes:
        """The bytes of the posting's partly filled last block as the commit that wrote it
        kept them, or b"" if none are kept or the map no longer names that block."""
        t = self.tails.get(pid)
        if t is None or (t.block, t.checksum) != (int(blocks[-1]), int(sums[-1])):
            return b""
        self.hits += 1
        return t.data
