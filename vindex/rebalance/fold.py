"""Rewriting postings without their garbage (gc), folding their pieces into one, and moving
their heads to their vectors.

A posting rewritten without its garbage also moves its head to the mean of the vectors
whose nearest posting it is (a step of Lloyd's k-means): heads made by splits of postings
that deletes and moves have since changed drift away from their vectors. The scrub then
moves vectors whose best postings changed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..storage import records

if TYPE_CHECKING:
    from .round import RoundInputs

#: A posting rewritten without garbage moves its head to the mean of its primary copies
#: (vectors whose home it is) when it holds at least this many: fewer make a noisy mean.
#: On a large churn benchmark this raised recall@10 at every ``max_postings`` at the same
#: vectors scanned, most of the way back to a fresh build's.
RECENTRE_MIN = 4


@dataclass
class FoldPart:
    """What a round's rewrites write, and the heads they move (``centred``) to ``centres``
    with their new radii."""

    replaces: dict[int, bytes]
    centred: np.ndarray
    centres: np.ndarray
    radius: np.ndarray


def plan_rewrites(rnd: "RoundInputs", delta: dict[int, tuple[np.ndarray, np.ndarray]], home: np.ndarray,
                  dim: int) -> FoldPart:
    """The rewrite of each posting ``rnd`` marks ``gc``, with the records ``delta`` appended
    since the read; ``home``: each vid's home posting."""
    H = records.HEADER_WORDS
    pids, offsets, keep = rnd.pids, rnd.read.offsets, rnd.keep
    recs_f, recs_u = rnd.read.recs_f, rnd.read.recs_u
    replaces: dict[int, bytes] = {}
    centred, centres, centred_radius = [], [], []
    for i in np.flatnonzero(rnd.decision.gc):
        rng = slice(offsets[i], offsets[i + 1])
        kf, ku = recs_f[rng][keep[rng]], recs_u[rng][keep[rng]]
        if int(i) in delta:
            kf, ku = np.concatenate((kf, delta[int(i)][0])), np.concatenate((ku, delta[int(i)][1]))
        replaces[int(pids[i])] = kf.tobytes()
        own = kf[home[ku[:, 0].astype(np.int64)] == pids[i], H:]
        if own.shape[0] >= RECENTRE_MIN:
            c = own.mean(axis=0, dtype=np.float64).astype(np.float32)
            centred.append(int(pids[i]))
            centres.append(c)
            centred_radius.append(float(((own - c) ** 2).sum(axis=1).mean()))
    return FoldPart(replaces, np.asarray(centred, dtype=np.int64),
                    np.asarray(centres, dtype=np.float32).reshape(-1, dim),
                    np.asarray(centred_radius, dtype=np.float32))
