"""Bulk build: heads, head graph and postings for a set of vectors.

1. Hierarchical balanced k-means picks heads (leaf centroids), sized so the mean posting
   fills ``build_fill`` of the posting budget.
2. Each vector's ``replica_candidates`` nearest heads are found blockwise with BLAS: the
   vectors of one top cluster against the heads of the top clusters nearest to it.
3. The RNG rule (native, parallel) picks at most ``max_replicas`` postings per vector.
4. A posting above its budget keeps its primary vectors (those for which it is the nearest
   head) and the nearest replicas; heads left without vectors are dropped.
5. The head graph is built over the surviving heads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from vindex import native

from . import clustering
from .config import IndexConfig
from .heads import HeadGraph
from .progress import bar, step
from .storage import records

#: Sample size of the pilot run that measures how many replicas the RNG rule gives.
PILOT_SAMPLE = 20_000
#: Top clusters whose heads are candidates for the vectors of one top cluster.
PROBE_TOP = 8


@dataclass
class BuiltPostings:
    graph: HeadGraph
    pids: np.ndarray        # ascending posting ids
    records: np.ndarray     # (E, dim + 2) float32 records, grouped by posting
    offsets: np.ndarray     # (len(pids) + 1,) int64
    home: np.ndarray        # (n,) posting of each input row's primary copy
    stats: dict = field(default_factory=dict)


def _sqnorms(x: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", x, x, dtype=np.float32)


def nearest_heads(x: np.ndarray, cl: clustering.Clustering, n_cand: int, show: bool
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Approximate ``n_cand`` nearest heads of every row of ``x`` (ascending, -1 padded)."""
    n = x.shape[0]
    heads = cl.heads
    h_norm = _sqnorms(heads)
    cand = np.full((n, n_cand), -1, dtype=np.int32)
    cand_d = np.full((n, n_cand), np.inf, dtype=np.float32)
    k1 = cl.top.shape[0]
    probe = min(k1, PROBE_TOP)
    top_d = (_sqnorms(cl.top)[:, None] - 2 * cl.top @ cl.top.T + _sqnorms(cl.top)[None, :])
    near_tops = np.argsort(top_d, axis=1)[:, :probe]
    heads_by_top = np.argsort(cl.head_top, kind="stable")
    top_bounds = np.searchsorted(cl.head_top[heads_by_top], np.arange(k1 + 1))
    pts_by_top = np.argsort(cl.point_top, kind="stable")
    pt_bounds = np.searchsorted(cl.point_top[pts_by_top], np.arange(k1 + 1))
    for c in bar(range(k1), desc="assigning", show=show):
        rows = pts_by_top[pt_bounds[c]:pt_bounds[c + 1]]
        if rows.size == 0:
            continue
        hs = np.concatenate([heads_by_top[top_bounds[t]:top_bounds[t + 1]] for t in near_tops[c]])
        hv, hn = heads[hs], h_norm[hs]
        m = min(n_cand, hs.size)
        for b in range(0, rows.size, 4096):
            r = rows[b:b + 4096]
            xr = x[r]
            d = _sqnorms(xr)[:, None] - 2 * (xr @ hv.T) + hn[None, :]
            np.maximum(d, 0, out=d)
            part = np.argpartition(d, m - 1, axis=1)[:, :m] if m < hs.size else np.tile(np.arange(hs.size), (r.size, 1))
            pd = np.take_along_axis(d, part, axis=1)
            srt = np.argsort(pd, axis=1, kind="stable")
            cand[r, :m] = hs[np.take_along_axis(part, srt, axis=1)]
            cand_d[r, :m] = np.take_along_axis(pd, srt, axis=1)
    return cand, cand_d


def _cluster_and_assign(x: np.ndarray, n_heads: int, limit: int, config: IndexConfig, show: bool):
    cl = clustering.hierarchical(x, n_heads, iters=config.kmeans_iters,
                                 max_ppc=config.kmeans_max_points_per_centroid, seed=config.seed,
                                 max_leaf=max(1, int(0.75 * limit)), show=show)
    n_cand = min(config.replica_candidates, cl.heads.shape[0])
    cand, cand_d = nearest_heads(x, cl, n_cand, show)
    reps = np.empty((x.shape[0], config.max_replicas), dtype=np.int32)
    reps_d = np.empty((x.shape[0], config.max_replicas), dtype=np.float32)
    counts = native.replicas.select_parallel(cand, cand_d, cl.heads, config.replica_eps, config.rng_factor,
                                      reps, reps_d)
    return cl, reps, reps_d, counts


def _pilot_replication(x: np.ndarray, target: float, config: IndexConfig) -> float:
    """Mean replicas per vector the RNG rule gives on a sample clustered at the same density.

    The head count must be known before clustering, but the mean posting size it produces
    depends on how many replicas the data admits (1.0 to 1.6 on the sets measured so far).
    """
    rng = np.random.default_rng(config.seed)
    sample = x[np.sort(rng.choice(x.shape[0], PILOT_SAMPLE, replace=False))]
    limit = config.posting_limit(x.shape[1])
    n_heads = max(1, math.ceil(PILOT_SAMPLE / target))
    _, _, _, counts = _cluster_and_assign(sample, n_heads, limit, config, show=False)
    return float(counts.mean())


def build_postings(x: np.ndarray, vids: np.ndarray, config: IndexConfig, show: bool,
                   versions: np.ndarray | None = None) -> BuiltPostings:
    """Heads, graph and grouped posting records for vectors ``x`` with internal ids ``vids``
    (and record versions ``versions``, 0 by default)."""
    n, dim = x.shape
    limit = config.posting_limit(dim)
    target = max(2.0, limit * config.build_fill)
    replication = _pilot_replication(x, target, config) if n > PILOT_SAMPLE else 1.0
    n_heads = max(1, math.ceil(n * replication / target))
    step(f"clustering {n} vectors into ~{n_heads} heads ({replication:.2f} replicas per vector "
         f"expected)", show)
    cl, reps, reps_d, counts = _cluster_and_assign(x, n_heads, limit, config, show)

    # (head, vid, distance, primary) pairs, grouped by head: primaries first, then nearest.
    rows = np.repeat(np.arange(n), counts)
    slot = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
    head = reps[rows, slot]
    dist = reps_d[rows, slot]
    primary = slot == 0
    order = np.lexsort((dist, ~primary, head))
    head, rows, primary = head[order], rows[order], primary[order]
    starts = np.searchsorted(head, head, side="left")
    rank = np.arange(head.size) - starts
    keep = primary | (rank < limit)
    head, rows = head[keep], rows[keep]

    # drop heads without vectors and renumber the rest densely
    used = np.unique(head)
    new_id = np.full(cl.heads.shape[0], -1, dtype=np.int64)
    new_id[used] = np.arange(used.size)
    head = new_id[head]
    sizes = np.bincount(head, minlength=used.size)
    offsets = np.zeros(used.size + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(sizes)

    step(f"building head graph over {used.size} heads", show)
    graph = HeadGraph.build(cl.heads[used], config.graph_degree, config.graph_alpha,
                            config.graph_entries, config.graph_build_ef, config.seed,
                            exact_max_heads=config.exact_search_max_heads)
    primary_head = new_id[reps[:, 0]]
    counts_p = np.bincount(primary_head, minlength=used.size)
    sums = np.bincount(primary_head, weights=reps_d[:, 0], minlength=used.size)
    graph.radius[: used.size] = np.where(counts_p > 0, sums / np.maximum(counts_p, 1), 0)
    if versions is None:
        versions = np.zeros(n, dtype=np.uint8)
    recs = records.encode(vids[rows], versions[rows], x[rows])
    stats = {
        "heads": int(used.size),
        "entries": int(rows.size),
        "mean_replicas": float(rows.size / max(n, 1)),
        "truncated_replicas": int((~keep).sum()),
        "posting_mean": float(sizes.mean()) if sizes.size else 0.0,
        "posting_max": int(sizes.max()) if sizes.size else 0,
        "posting_limit": int(limit),
    }
    home = primary_head.astype(np.int32)
    return BuiltPostings(graph, np.arange(used.size, dtype=np.int64), recs, offsets, home, stats)
