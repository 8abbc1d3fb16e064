"""Splitting postings over their budget: how many children, and the records each gets.

A split clusters a posting's live vectors (balanced k-means in ``native.lire.split``) into
children that replace it under new heads; the old head is removed after the commit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from vindex import native

from ..heads import HeadGraph
from ..storage import records

if TYPE_CHECKING:
    from .round import RoundInputs


def split_children(n_live: np.ndarray, limit: int, build_fill: float) -> np.ndarray:
    """How many postings a split makes of postings holding ``n_live`` live vectors: as many
    as leave them about as full as a build's (``build_fill`` of the ``limit``), at least 2.
    Rounding up instead made a posting one vector over the limit into three children at the
    merge threshold, which merges then undid (more heads, emptier postings, less recall)."""
    target = max(2, int(limit * build_fill))
    return np.maximum(2, np.rint(np.asarray(n_live) / target)).astype(np.int64)


@dataclass
class Clusters:
    """The split of a round's postings: ``labels`` (child per record, -1 if none) and the
    ``centroids`` of the children of posting ``i`` at ``cent_off[i]:cent_off[i+1]``."""

    labels: np.ndarray
    centroids: np.ndarray
    cent_off: np.ndarray


def cluster(recs_f: np.ndarray, keep: np.ndarray, offsets: np.ndarray, ks: np.ndarray, dim: int,
            balance: float) -> Clusters:
    """Cluster the live records of each posting into its ``ks`` children (0: not split)."""
    cent_off = np.concatenate(([0], np.cumsum(ks)))
    centroids = np.zeros((int(cent_off[-1]), dim), dtype=np.float32)
    labels = np.full(recs_f.shape[0], -1, dtype=np.int64)
    native.lire.split(recs_f, keep, offsets, ks, cent_off, 8, float(balance), labels, centroids)
    return Clusters(labels, centroids, cent_off)


@dataclass
class SplitPart:
    """What a round's splits write: the children's postings and heads, and the moves of
    their vectors."""

    children: list[np.ndarray] = field(default_factory=list)
    replaces: dict[int, bytes] = field(default_factory=dict)
    drops: list[int] = field(default_factory=list)
    moves: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    new_pids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    split_heads: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    new_radius: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    new_vectors: np.ndarray | None = None


def plan_splits(rnd: "RoundInputs", delta: dict[int, tuple[np.ndarray, np.ndarray]], graph: HeadGraph,
                limbo: set[int]) -> SplitPart:
    """The children of each posting ``rnd`` splits, with the records ``delta`` appended
    since the read assigned to the nearest child; their heads get pids free in ``graph``
    and not in ``limbo``."""
    H = records.HEADER_WORDS
    pids, offsets, keep = rnd.pids, rnd.read.offsets, rnd.keep
    recs_f, recs_u = rnd.read.recs_f, rnd.read.recs_u
    ks, labels = rnd.decision.ks, rnd.clusters.labels
    centroids, cent_off = rnd.clusters.centroids, rnd.clusters.cent_off
    split_idx = np.flatnonzero(rnd.decision.split)
    out = SplitPart()
    out.new_pids = (graph.free_pids(int(ks[rnd.decision.split].sum()), limbo) if split_idx.size
                    else np.zeros(0, np.int64))
    pos = 0
    radius = []
    for i in split_idx:
        k = int(ks[i])
        kids = out.new_pids[pos:pos + k]
        pos += k
        out.children.append(kids)
        rng = slice(offsets[i], offsets[i + 1])
        kf, ku, kl = recs_f[rng][keep[rng]], recs_u[rng][keep[rng]], labels[rng][keep[rng]]
        if int(i) in delta:
            df, du = delta[int(i)]
            cents = centroids[cent_off[i]:cent_off[i + 1]]
            dl = np.argmin(((df[:, H:, None] - cents.T[None]) ** 2).sum(1), axis=1) if df.shape[0] else np.zeros(0, np.int64)
            kf, ku, kl = np.concatenate((kf, df)), np.concatenate((ku, du)), np.concatenate((kl, dl))
        cents = centroids[cent_off[i]:cent_off[i + 1]]
        for c in range(k):
            sel = kl == c
            out.replaces[int(kids[c])] = kf[sel].tobytes()
            radius.append(float(((kf[sel, H:] - cents[c]) ** 2).sum(axis=1).mean()) if sel.any() else 0.0)
            out.moves.append((ku[sel, 0], np.full(int(sel.sum()), pids[i]), np.full(int(sel.sum()), kids[c])))
        out.drops.append(int(pids[i]))
    out.split_heads = np.repeat(pids[split_idx], ks[split_idx])  # per new head, the head it splits
    out.new_radius = np.asarray(radius, dtype=np.float32)
    out.new_vectors = centroids[np.concatenate([np.arange(cent_off[i], cent_off[i + 1]) for i in split_idx])] \
        if split_idx.size else np.zeros((0, graph.dim), np.float32)
    return out
