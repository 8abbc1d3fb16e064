"""Exact filtered top-k (the truth bench.filtered scores against) and recall against it.

Vectors come prepared for their metric (``bench.peers._prepare``: unit rows for cosine), so
"smaller is better" distances are ``-<q, x>`` for cosine and ip and ``|x|^2 - 2<q, x>`` for l2
(the query's own norm ranks nothing). Ties go to the smaller row number.
"""
from __future__ import annotations

import numpy as np

from bench.filter_workload import FilterCase


def _distances(queries: np.ndarray, rows: np.ndarray, metric: str,
               sq_norms: np.ndarray | None = None) -> np.ndarray:
    dots = queries @ rows.T
    if metric == "l2":
        sq = (rows * rows).sum(axis=1) if sq_norms is None else sq_norms
        return sq[None, :] - 2.0 * dots
    return -dots


def top_k(dist: np.ndarray, row_ids: np.ndarray, k: int) -> np.ndarray:
    """(nq, k) row ids of the ``k`` smallest of each row of ``dist`` (columns = ``row_ids``,
    ascending), best first, ties by id, padded with -1 when there are fewer than ``k``."""
    nq, m = dist.shape
    out = np.full((nq, k), -1, dtype=np.int64)
    if m == 0:
        return out
    kk = min(k, m)
    part = np.argpartition(dist, kk - 1, axis=1)[:, :kk] if kk < m else np.tile(np.arange(m), (nq, 1))
    # Widen the cut to every column tied with the k-th distance, so ties resolve by id.
    kth = np.take_along_axis(dist, part, axis=1).max(axis=1)
    for i in range(nq):
        cand = np.flatnonzero(dist[i] <= kth[i]) if kk < m else part[i]
        order = np.lexsort((row_ids[cand], dist[i, cand]))[:kk]
        out[i, :kk] = row_ids[cand[order]]
    return out


def exact(base: np.ndarray, queries: np.ndarray, metric: str, case: FilterCase, k: int,
          block: int = 256) -> np.ndarray:
    """(nq, k) exact filtered top-k row ids for every query of ``case``, -1 padded."""
    out = np.full((queries.shape[0], k), -1, dtype=np.int64)
    for f in np.unique(case.which):
        rows = np.flatnonzero(case.masks[f])
        sub = base[rows]
        qs = np.flatnonzero(case.which == f)
        for s in range(0, len(qs), block):
            part = qs[s:s + block]
            out[part] = top_k(_distances(queries[part], sub, metric), rows, k)
    return out


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of the share of each query's true neighbours found, where a query with
    fewer than k matching rows is scored against the ones that exist (queries with none skip)."""
    found = np.asarray(found, dtype=np.int64)
    valid = truth >= 0
    hit = ((found[:, :, None] == truth[:, None, :]).any(axis=1) & valid).sum(axis=1)
    have = valid.sum(axis=1)
    ok = have > 0
    return float((hit[ok] / have[ok]).mean()) if ok.any() else 1.0


class BruteForce:
    """Exact filtered search one query per call, given the matching rows as a payload index
    would hand them over: gather those vectors and score them with BLAS, or, when they are more
    than a quarter of the base, score the whole base in place and drop the rest (cheaper than the
    gather); keep the best k. Its QPS is the floor a filtered-search planner must never fall below."""

    name = "brute-force"

    def __init__(self) -> None:
        self.base: np.ndarray | None = None
        self.metric = "l2"
        self.rows: list[np.ndarray] = []
        self.dense: list[np.ndarray | None] = []
        self.all_rows = np.empty(0, dtype=np.int64)
        self.sq_norms = np.empty(0, dtype=np.float32)
        self.case: FilterCase | None = None

    def build(self, base: np.ndarray, metric: str, workload) -> None:
        self.base, self.metric = base, metric
        self.all_rows = np.arange(base.shape[0], dtype=np.int64)
        self.sq_norms = (base * base).sum(axis=1)

    def sweep(self) -> list[dict]:
        return [{}]

    def set_params(self, params: dict) -> None:
        pass

    def prepare(self, case: FilterCase) -> None:
        self.case = case
        self.rows = [np.flatnonzero(m) for m in case.masks]
        self.dense = [~m if 4 * len(r) > len(m) else None for m, r in zip(case.masks, self.rows)]

    def search_one(self, q: np.ndarray, qi: int, k: int) -> np.ndarray:
        f = int(self.case.which[qi])
        excluded = self.dense[f]
        if excluded is None:
            rows = self.rows[f]
            dist = _distances(q[None, :], self.base[rows], self.metric, self.sq_norms[rows])
            return top_k(dist, rows, k)[0]
        dist = _distances(q[None, :], self.base, self.metric, self.sq_norms)
        dist[0, excluded] = np.inf
        found = top_k(dist, self.all_rows, k)[0]
        found[len(self.rows[f]):] = -1  # fewer matches than k: the inf rows are not results
        return found

    def close(self) -> None:
        self.base = None
