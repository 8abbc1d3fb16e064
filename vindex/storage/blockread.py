"""Reads of the block store: per-thread aligned buffers, the read job of one request (runs of
consecutive blocks), and checking what was read against the map's checksums.

A read gathers every block of every wanted posting, coalesced into runs of consecutive blocks,
into a page-aligned buffer of the calling thread. ``ReadJob`` does the runs with ``os.preadv``
at the class's ioprio; ``RingScheduler`` puts the same runs on an io_uring ring instead. The
blocks are checked before anything else touches them: a mismatch raises ``CorruptionError``
naming the data file, the block and its posting, never a wrong vector.
"""
from __future__ import annotations

import errno
import os
import threading
from typing import Callable

import numpy as np

from vindex import native  # its kernels load on first use

from ..errors import CorruptionError
from .blockmap import BLOCK, runs
from .diskio import Aligned
from .uring import thread_ioprio

#: ``locate(i)``: ``(posting, its block number from 1, its block count)`` of block ``i`` of a read.
Locate = Callable[[int], tuple[int, int, int]]


class ThreadBuffers(threading.local):
    """One growable aligned read buffer per thread: a result stays valid until the thread's
    next read (a grown buffer is a new mapping; the old one lives while a result uses it)."""

    def __init__(self) -> None:
        self.buf: Aligned | None = None

    def get(self, size: int) -> Aligned:
        if self.buf is None or self.buf.size < size:
            old = 0 if self.buf is None else self.buf.size
            self.buf = Aligned(max(size, 2 * old, 256 * 1024))
        return self.buf


class ReadJob:
    """The reads of one request: ``runs`` rows ``(file offset, buffer offset, length)``.

    Calling it does them with ``os.preadv`` (which releases the GIL) at the class's ioprio, on
    a preadv worker or inline on the caller (``IOScheduler.run``); ``RingScheduler`` puts the
    same runs on a ring instead."""

    __slots__ = ("fd", "buf", "address", "runs", "prio")

    def __init__(self, fd: int, buf: Aligned, runs_: np.ndarray, prio: int | None):
        self.fd, self.buf, self.address, self.runs, self.prio = fd, buf, buf.address, runs_, prio

    def __call__(self) -> None:
        mv = self.buf.mv
        with thread_ioprio(self.prio):
            for off, pos, n in self.runs.tolist():
                got = os.preadv(self.fd, [mv[pos:pos + n]], off)
                if got != n:
                    raise OSError(errno.EIO, f"short read: {got} of {n} bytes at offset {off}")


def read_table(blocks: np.ndarray) -> np.ndarray:
    """The reads that gather ``blocks`` into a buffer in order: ``(file offset, buffer offset,
    length)`` per run of consecutive blocks (``ReadJob``'s ``runs``)."""
    starts, lens = runs(blocks)
    b = blocks.astype(np.int64)
    return np.stack([b[starts] * BLOCK, starts * BLOCK, lens * BLOCK], axis=1)


def locate(pids: np.ndarray, counts: np.ndarray, i: int) -> tuple[int, int, int]:
    """Block ``i`` of a read of postings ``pids`` with ``counts`` blocks each: ``(posting, its
    block number from 1, its block count)``."""
    ends = np.cumsum(counts)
    p = int(np.searchsorted(ends, i, side="right"))
    return int(pids[p]), i - int(ends[p] - counts[p]) + 1, int(counts[p])


def corrupt(data_path: str, blocks: np.ndarray, bad: int, where: Locate) -> CorruptionError:
    """The error for ``blocks[bad]`` failing its checksum, naming the file, block and posting."""
    b = int(blocks[bad])
    pid, nth, n = where(int(bad))
    return CorruptionError(
        f"block store data file {data_path}: block {b} of posting {pid} fails its checksum "
        f"(file offset {b * BLOCK}, the posting's block {nth} of {n}); the data file is damaged")


def verify(data_path: str, buf: Aligned, blocks: np.ndarray, sums: np.ndarray, where: Locate) -> None:
    """Check the blocks of one read against their checksums (one kernel call for all): ``buf``
    holds ``blocks`` in order; ``where`` locates a block for the error."""
    bad = native.checksum.first_bad(buf.arr, sums)
    if bad >= 0:
        raise corrupt(data_path, blocks, bad, where)
