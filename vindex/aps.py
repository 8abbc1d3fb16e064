"""``search(..., recall_target=)``: adaptive probing, after Quake's APS (docs/search-path.md).

A query's candidate postings (up to ``max_postings``, nearest head first) are read in rounds.
The first round reads ``FIRST_POSTINGS``. After each round the query's k-th distance ``r``
gives every candidate head a weight, the share of the ball of radius ``r`` around the query
that lies beyond the bisector hyperplane between the nearest head and that head (a spherical
cap of a ``dim_eff``-dimensional ball, looked up in a table), and the query asks for as many
postings as make the weight read reach ``threshold`` of the total (``native.aps``); it stops
once it asks for no more. Queries that stop leave the batch.

The geometric model alone is not the recall: data has fewer effective dimensions than its
vectors, and SPANN replicates boundary vectors into several postings, so a neighbour beyond a
hyperplane is often found in a posting read already. So each index calibrates itself, once per
``k`` on first use: it draws ``CALIBRATION_QUERIES`` stored vectors as queries, reads each
one's candidate postings one by one and records, after each, the k-th distance and the true
recall@k (exact top-k over every live vector, the query's own record left out). Replaying the
rounds on these traces gives, for every ``dim_eff`` tried and every threshold, the mean recall
and postings the search would get; the calibration keeps the ``dim_eff`` that reads fewest
postings at recall 0.9 and 0.95, and maps a recall target to the threshold whose replayed
mean recall reaches it.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from vindex import native

from .errors import InvalidKError
from .heads import HeadGraph

#: Postings every query reads before the estimate is first made.
FIRST_POSTINGS = 4
#: What a round after the first costs, in postings read (a store call and the Python around
#: it, against a posting's scan): the calibration weighs the estimate's rounds with it.
ROUND_POSTINGS = 8.0
#: Queries a calibration uses.
CALIBRATION_QUERIES = 256
#: A calibration uses served queries (the search tap's ring) once it holds this many, else
#: stored vectors; one made from stored vectors is made again from served queries once the
#: index has served ``RECALIBRATE_AFTER`` queries since.
CALIBRATION_MIN_SERVED = 128
RECALIBRATE_AFTER = 1024
#: Entries of the spherical-cap table (hyperplane distance / radius in [0, 1]).
TABLE_SIZE = 1025
#: Thresholds replayed by a calibration: 1 - 10^-x.
THRESHOLDS = 1.0 - 10.0 ** -np.linspace(0.15, 4.0, 48)
#: Targets whose thresholds a calibration remembers (``Calibration.threshold``).
MEMO_TARGETS = 64
#: Recall targets the effective dimension is chosen for.
FIT_TARGETS = (0.9, 0.95)

Search = Callable[[np.ndarray, np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray, dict]]


def check_target(value: Any) -> float:
    """A recall target: a number strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) < 1:
        raise InvalidKError(f"recall_target: expected a number strictly between 0 and 1, got {value!r}")
    return float(value)


def cap_table(dim: float, size: int = TABLE_SIZE) -> np.ndarray:
    """``table[i]``: the share of a ``dim``-ball's volume beyond a hyperplane at distance
    ``i / (size - 1)`` of its radius from the centre (0.5 at the centre; the regularized
    incomplete beta ``I_{1-t^2}((dim+1)/2, 1/2) / 2``)."""
    x = np.linspace(0.0, 1.0, 16 * (size - 1) + 1)
    density = np.power(1.0 - x * x, 0.5 * (dim - 1))  # slice area at height x
    area = np.concatenate(([0.0], np.cumsum((density[1:] + density[:-1]) * 0.5 * np.diff(x))))
    beyond = (area[-1] - area) / (2.0 * area[-1])
    return np.ascontiguousarray(beyond[:: 16], dtype=np.float32)


@dataclass(frozen=True)
class Calibration:
    """How one index meets a recall target, for one ``k`` and candidate setting: by the
    estimate (``dim_eff > 0``: ``thresholds`` are thresholds of the estimate) or, where that
    reads more than a fixed number of postings for the same recall, by that number
    (``dim_eff == 0``: ``thresholds`` are posting counts)."""

    dim_eff: int
    table: np.ndarray        # cap_table(dim_eff)
    thresholds: np.ndarray   # ascending
    recalls: np.ndarray      # replayed mean recall at each threshold (made non-decreasing)
    postings: np.ndarray     # replayed mean postings read at each threshold
    queries: int
    served: bool = False     # made from served queries (else from stored vectors)
    seen: int = 0            # queries the index had served when it was made (in this process)
    live: int = 0            # live records the index held when it was made
    # ``threshold``'s answers by target: a search reads it first thing, with its caches cold
    # from the previous search's scan, where ``searchsorted`` took ~20 us and a lookup ~1
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def to_json(self) -> dict:
        """The fields that are kept across opens (``from_json``; ``seen`` starts again at 0)."""
        return {"dim_eff": self.dim_eff, "thresholds": self.thresholds.tolist(), "recalls": self.recalls.tolist(),
                "postings": self.postings.tolist(), "queries": self.queries, "served": self.served,
                "live": self.live}

    @classmethod
    def from_json(cls, d: dict) -> "Calibration":
        dim_eff = int(d["dim_eff"])
        table = cap_table(dim_eff) if dim_eff > 0 else np.zeros(1, np.float32)
        arrays = [np.asarray(d[f], dtype=np.float64) for f in ("thresholds", "recalls", "postings")]
        if dim_eff < 0 or len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1 or not arrays[0].size:
            raise ValueError("thresholds, recalls and postings must be 1-d arrays of one non-zero length")
        return cls(dim_eff, table, *arrays, int(d["queries"]), bool(d["served"]), 0, int(d["live"]))

    @property
    def adaptive(self) -> bool:
        return self.dim_eff > 0

    def threshold(self, target: float) -> float:
        """The threshold whose replayed recall reaches ``target``, linear between the two
        around it (the largest if none does: the target is past what the candidates give)."""
        found = self._memo.get(target)
        if found is None:
            if len(self._memo) >= MEMO_TARGETS:
                self._memo.clear()
            found = self._memo[target] = self._threshold(target)
        return found

    def _threshold(self, target: float) -> float:
        at = int(np.searchsorted(self.recalls, target))
        if at >= self.recalls.shape[0]:
            return float(self.thresholds[-1])
        if at == 0:
            return float(self.thresholds[0])
        lo, hi = self.recalls[at - 1], self.recalls[at]
        f = (target - lo) / (hi - lo) if hi > lo else 1.0
        return float(self.thresholds[at - 1] + f * (self.thresholds[at] - self.thresholds[at - 1]))

    def cost(self, target: float, rounds: float = 0.0) -> float:
        """Mean postings read at ``target`` (plus ``rounds``); infinite if out of reach."""
        if self.recalls[-1] < target:
            return float("inf")
        return float(np.interp(target, self.recalls, self.postings)) + rounds

    def summary(self) -> dict:
        return {"model": "estimate" if self.adaptive else "fixed", "dim_eff": self.dim_eff, "queries": self.queries,
                "from": "served queries" if self.served else "stored vectors",
                **{f"postings@{t}": self.cost(t) for t in FIT_TARGETS}}


def candidate_heads(graph: HeadGraph, queries: np.ndarray, sel: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Sort each query's candidate heads nearest first (in place) and return their
    hyperplane distances ``(nq, m)``."""
    h = np.zeros(sel.shape, dtype=np.float32)
    native.aps.order_heads(queries, graph.arrays_.vectors, sel, counts, h)
    return h


def search_rounds(queries: np.ndarray, k: int, sel: np.ndarray, counts: np.ndarray, h: np.ndarray,
                  table: np.ndarray, threshold: float, scan: Search) -> tuple[np.ndarray, np.ndarray, dict]:
    """Read each query's postings ``sel[i, :counts[i]]`` (nearest first) in rounds until its
    estimate reaches ``threshold``. ``scan(queries, heads, counts, k)`` searches the given
    postings only (``vindex.search.search``). Returns internal ``(ids, dists, work)``."""
    nq = queries.shape[0]
    best_i = np.full((nq, k), -1, dtype=np.int64)
    best_d = np.full((nq, k), np.inf, dtype=np.float32)
    done = np.zeros(nq, dtype=np.int32)
    want = np.minimum(counts, FIRST_POSTINGS).astype(np.int32)
    rows = np.arange(nq)
    work = {"postings": 0, "records_scanned": 0, "postings_dropped": 0}
    part = np.empty_like(sel)
    while rows.shape[0]:
        n_part = native.aps.slice_heads(sel[rows], done[rows], want[rows], part)
        ids, dists, got = scan(queries[rows], part[:rows.shape[0]], n_part, k)
        for key in work:
            work[key] += got[key]
        native.aps.merge_topk(rows, best_i, best_d, ids, dists)
        done[rows] = want[rows]
        kth = np.ascontiguousarray(best_d[rows, k - 1])
        more = np.empty(rows.shape[0], dtype=np.int32)
        native.aps.want_counts(h[rows], counts[rows], kth, table, threshold, done[rows], more)
        want[rows] = more
        rows = rows[more > done[rows]]
    return best_i, best_d, work


def calibrate(queries: np.ndarray, own: np.ndarray, truth: np.ndarray, k: int, sel: np.ndarray,
              counts: np.ndarray, h: np.ndarray, scan: Search, dim: int, round_postings: float,
              estimate: bool = True) -> Calibration:
    """Fit a :class:`Calibration` on stored vectors ``queries`` (internal ids ``own``) with
    exact neighbours ``truth`` (``(n, k)`` internal ids, own left out), their candidate heads
    ``sel``/``counts`` sorted by ``candidate_heads`` and hyperplane distances ``h``. A round
    after the first costs as much as reading ``round_postings`` postings more. ``estimate``
    False: the fixed count only (``h`` unused)."""
    n, m = sel.shape
    # each (query, head) pair as a query of its own that reads that one posting
    flat_q = np.repeat(queries, m, axis=0)
    flat_sel = np.ascontiguousarray(sel.reshape(-1, 1))
    flat_cnt = (np.arange(m)[None, :] < counts[:, None]).reshape(-1).astype(np.int32)
    ids, dists, _ = scan(flat_q, flat_sel, flat_cnt, k + 1)
    r_trace = np.full((n, m), np.inf, dtype=np.float32)
    recall_trace = np.zeros((n, m), dtype=np.float64)
    native.aps.trace(ids.reshape(n, m, k + 1), dists.reshape(n, m, k + 1), counts, own, truth, k, r_trace,
                     recall_trace)
    rows = np.arange(n)
    fixed = np.arange(1, m + 1)
    fixed_recall = np.array([np.where(counts >= c, recall_trace[:, c - 1], recall_trace[rows, np.maximum(counts, 1) - 1])
                             .mean() for c in fixed])
    best = Calibration(0, np.zeros(1, np.float32), fixed.astype(np.float64), np.maximum.accumulate(fixed_recall),
                       np.minimum(fixed, counts.mean()).astype(np.float64), n)
    if not estimate:
        return best
    best_cost = sum(best.cost(t) for t in FIT_TARGETS)
    stop = np.empty(n, dtype=np.int32)
    rounds = np.empty(n, dtype=np.int32)
    for d in _dims(dim):
        table = cap_table(d)
        recalls = np.empty(THRESHOLDS.shape[0])
        postings = np.empty(THRESHOLDS.shape[0])
        extra = np.empty(THRESHOLDS.shape[0])
        for t, tau in enumerate(THRESHOLDS):
            native.aps.emulate(h, counts, r_trace, table, float(tau), FIRST_POSTINGS, stop, rounds)
            recalls[t] = np.where(stop > 0, recall_trace[rows, np.maximum(stop, 1) - 1], 0.0).mean()
            postings[t], extra[t] = stop.mean(), (rounds - 1).mean() * round_postings
        cal = Calibration(d, table, THRESHOLDS.copy(), np.maximum.accumulate(recalls), postings, n)
        cost = sum(cal.cost(t, float(np.interp(t, cal.recalls, extra))) for t in FIT_TARGETS)
        if cost < best_cost:
            best, best_cost = cal, cost
    return best


def _dims(dim: int) -> list[int]:
    """Effective dimensions a calibration tries: powers of two up to ``dim``, and ``dim``."""
    out = [2 ** p for p in range(1, 12) if 2 ** p < dim]
    return out + [dim]

