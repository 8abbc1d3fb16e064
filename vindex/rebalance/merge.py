"""Merging nearly empty postings into a neighbour with room.

A merged posting's live vectors are appended to the nearest other head's posting and the
head is removed; the merged vectors are then reassigned (their new posting is near, not
necessarily among the ones the replica rule picks).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from vindex import native

from ..engine import Engine
from ..storage import records

if TYPE_CHECKING:
    from .round import RoundInputs


def merge_targets(engine: Engine, pids: np.ndarray, merge: np.ndarray, n_live: np.ndarray,
                  busy: set) -> np.ndarray:
    """For each posting to merge, the nearest other head with room (-1: none). ``busy``:
    postings this round changes otherwise, which take no merges."""
    g = engine.state.graph
    out = np.full(pids.shape[0], -1, dtype=np.int64)
    idx = np.flatnonzero(merge)
    if idx.size == 0:
        return out
    m = min(8, g.n_alive)
    near, _, counts = g.search(g.vectors[pids[idx]], native.L2, m, np.inf, engine.config.ef_for(m))
    taken: dict[int, int] = {}
    for row, i in enumerate(idx):
        for t in range(counts[row]):
            b = int(near[row, t])
            if b == pids[i] or b in busy:
                continue
            room = engine.limit - int(engine.lengths(np.array([b]))[0]) - taken.get(b, 0)
            if room >= n_live[i]:
                out[i] = b
                taken[b] = taken.get(b, 0) + int(n_live[i])
                break
    return out


@dataclass
class MergePart:
    """What a round's merges write (appends to their targets), the moves of their vectors,
    and the merged vectors (``vids``, ``versions``, ``vectors``, posting ``to``) to reassign."""

    appends: dict[int, bytes] = field(default_factory=dict)
    drops: list[int] = field(default_factory=list)
    moves: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    vids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    versions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    vectors: np.ndarray | None = None
    to: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def plan_merges(rnd: "RoundInputs", delta: dict[int, tuple[np.ndarray, np.ndarray]], dim: int) -> MergePart:
    """The appends of each posting ``rnd`` merges into its target, with the records
    ``delta`` appended since the read."""
    H = records.HEADER_WORDS
    pids, offsets, keep = rnd.pids, rnd.read.offsets, rnd.keep
    recs_f, recs_u = rnd.read.recs_f, rnd.read.recs_u
    out = MergePart(vectors=np.zeros((0, dim), np.float32))
    mvs, mvv, mvx, mvt = [], [], [], []
    for i in np.flatnonzero(rnd.decision.merge):
        rng = slice(offsets[i], offsets[i + 1])
        kf, ku = recs_f[rng][keep[rng]], recs_u[rng][keep[rng]]
        if int(i) in delta:
            kf, ku = np.concatenate((kf, delta[int(i)][0])), np.concatenate((ku, delta[int(i)][1]))
        t = int(rnd.targets[i])
        out.appends[t] = out.appends.get(t, b"") + kf.tobytes()
        out.moves.append((ku[:, 0], np.full(ku.shape[0], pids[i]), np.full(ku.shape[0], t)))
        mvs.append(ku[:, 0])
        mvv.append(ku[:, 1])
        mvx.append(kf[:, H:])
        mvt.append(np.full(ku.shape[0], t))
        out.drops.append(int(pids[i]))
    if mvs:
        out.vids = np.concatenate(mvs).astype(np.int64)
        out.versions = np.concatenate(mvv).astype(np.uint8)
        out.vectors = np.concatenate(mvx)
        out.to = np.concatenate(mvt).astype(np.int64)
    return out
