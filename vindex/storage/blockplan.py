"""Commit planning for the block store: what a ``Change`` rewrites, posting by posting, and
the blocks it releases. Pure but for the reads of the map and the tail cache.

A commit never overwrites a block the map points at: an append rewrites the partly filled
tail block into a new block followed by new blocks, a replace writes new blocks. Each append
leaves the posting's full blocks where they were, so a posting appended to many times ends up
in as many places, and a search pays one I/O per place: an append that would leave a posting
in more than ``MAX_RUNS`` runs of consecutive blocks rewrites it whole into one run instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .base import Change
from .blockmap import BLOCK, EMPTY, BlockMap
from .tails import TailCache

#: The most runs of consecutive blocks an append leaves a posting in; past it, the append
#: rewrites the posting whole. Unbounded, a long run of upserts leaves postings in several
#: runs each, and a search's reads (one per run) multiply by as much. At 2, a posting is
#: rewritten about once per block its appends fill.
MAX_RUNS = 2


@dataclass
class Rewrite:
    """A posting a commit changes: full blocks it keeps (and their checksums), then new bytes
    in new blocks."""

    kept: np.ndarray
    records: int
    pieces: list = field(default_factory=list)
    kept_sums: np.ndarray = field(default_factory=lambda: EMPTY)
    # old blocks read back whose first ``reread_bytes`` start the new bytes: the partly filled
    # tail, or the whole posting when the append folds it into one run; and their checksums
    reread: np.ndarray = field(default_factory=lambda: EMPTY)
    reread_bytes: int = 0
    reread_sums: np.ndarray = field(default_factory=lambda: EMPTY)


def count_records(data: bytes, record_size: int) -> int:
    """Records in ``data``, which must hold whole ones."""
    if len(data) % record_size:
        raise ValueError(f"expected whole {record_size}-byte records, got {len(data)} bytes")
    return len(data) // record_size


def plan(change: Change, bmap: BlockMap, tails: TailCache, record_size: int) -> tuple[dict[int, Rewrite], np.ndarray]:
    """What ``change`` rewrites, in the order drops, replaces, appends (as rocks applies
    them), and the blocks it releases."""
    rs = record_size
    work: dict[int, Rewrite] = {}
    released: list[np.ndarray] = []

    def fresh(pid: int, records: int, data: bytes | None) -> None:
        if pid not in work:
            e = bmap.get(pid)
            if e is not None:
                released.append(e.blocks)
        work[pid] = Rewrite(EMPTY, records, [] if data is None else [data])

    for pid in change.drops:
        if int(pid) not in work:
            fresh(int(pid), 0, None)
    for pid, data in change.replaces.items():
        fresh(int(pid), count_records(data, rs), data)
    for pid, data in change.appends.items():
        pid, n = int(pid), count_records(data, rs)
        if n == 0:
            continue
        w = work.get(pid)
        if w is not None:
            w.pieces.append(data)
            w.records += n
            continue
        e = bmap.get(pid)
        if e is None:
            work[pid] = Rewrite(EMPTY, n, [data])
            continue
        blocks, r, sums = e
        tail = (r * rs) % BLOCK
        keep = blocks.shape[0] - (1 if tail else 0)
        if kept_runs(bmap, pid, blocks, keep) + 1 > MAX_RUNS:  # fold: the whole posting to new blocks
            keep = 0
        if keep == blocks.shape[0]:
            work[pid] = Rewrite(blocks, r + n, [data], kept_sums=sums)
            continue
        # blocks[keep:] (the partly filled tail, or the runs a fold rewrites) move, with the
        # new records, to new blocks; the tail's bytes come from memory when the commit
        # that wrote it left them there, the rest is read back
        released.append(blocks[keep:])
        kept_tail = tails.get(pid, blocks, sums) if tail else b""
        end = blocks.shape[0] - (1 if kept_tail else 0)
        work[pid] = Rewrite(blocks[:keep], r + n, [kept_tail, data] if kept_tail else [data],
                            kept_sums=sums[:keep], reread=blocks[keep:end],
                            reread_bytes=r * rs - keep * BLOCK - len(kept_tail), reread_sums=sums[keep:end])
    return work, (np.concatenate(released) if released else EMPTY)


def kept_runs(bmap: BlockMap, pid: int, blocks: np.ndarray, keep: int) -> int:
    """Runs of consecutive blocks in ``blocks[:keep]`` (a posting's blocks an append keeps),
    from the map's count for all of them: the dropped tail was a run of its own unless it
    followed the block before it."""
    if keep == 0:
        return 0
    n = bmap.runs.get_one(pid)
    if keep < blocks.shape[0] and int(blocks[keep]) != int(blocks[keep - 1]) + 1:
        n -= 1
    return n
