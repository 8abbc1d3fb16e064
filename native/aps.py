"""Adaptive probing kernels (``vindex.aps``): how many postings a query needs for a recall target.

A query's candidate heads are visited nearest first. For head ``j`` the bisector hyperplane
between the query's nearest head ``c0`` and ``cj`` lies at distance
``h_j = (|q - cj|^2 - |q - c0|^2) / (2 |cj - c0|)`` from the query. With ``r`` the current
k-th result distance, the share of the ball of radius ``r`` around the query beyond that
hyperplane (a spherical cap: ``table[t]`` at ``t = h_j / r``) is head j's weight, the nearest
head's is 1; the estimated recall of the first ``c`` heads is their share of the total weight.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .distances import FASTMATH

_q = dict(cache=True, nogil=True, fastmath=FASTMATH)


@nb.njit(**_q)
def order_heads(queries, vectors, sel, counts, out_h):
    """Sort each query's heads ``sel[i, :counts[i]]`` nearest first (squared L2, in place)
    and write their hyperplane distances ``out_h[i, j]`` (0 for the nearest)."""
    nq, dim = queries.shape
    m = sel.shape[1]
    dist = np.empty(m, dtype=np.float32)
    for i in range(nq):
        c = counts[i]
        if c == 0:
            continue
        for j in range(c):
            h = sel[i, j]
            s = np.float32(0.0)
            for t in range(dim):
                x = queries[i, t] - vectors[h, t]
                s += x * x
            dist[j] = s
        order = np.argsort(dist[:c], kind="mergesort")  # stable: the graph's order on ties
        row = sel[i, :c].copy()
        for j in range(c):
            sel[i, j] = row[order[j]]
        c0 = sel[i, 0]
        d0 = dist[order[0]]
        out_h[i, 0] = 0.0
        for j in range(1, c):
            h = sel[i, j]
            s = np.float32(0.0)
            for t in range(dim):
                x = vectors[h, t] - vectors[c0, t]
                s += x * x
            gap = np.sqrt(s)
            out_h[i, j] = (dist[order[j]] - d0) / (2.0 * gap) if gap > 0 else 0.0


@nb.njit(inline="always", **_q)
def _weight(h, r, table):
    if not r < np.inf:
        return table[0]
    if r <= 0.0:
        return 0.0
    t = h / r
    if t >= 1.0:
        return 0.0
    return table[int(t * (table.shape[0] - 1) + 0.5)]


@nb.njit(**_q)
def _want_row(h_row, count, kth, table, tau, done):
    """Smallest number of heads, at least ``done``, whose estimated recall reaches ``tau``."""
    r = np.sqrt(kth) if kth < np.inf else np.inf
    total = 1.0
    for j in range(1, count):
        total += _weight(h_row[j], r, table)
    need = tau * total
    acc = 1.0
    c = 1
    while c < count and acc < need:
        acc += _weight(h_row[c], r, table)
        c += 1
    return max(c, done)


@nb.njit(**_q)
def want_counts(h, counts, kth, table, tau, done, out):
    """Per query, the heads it needs (``_want_row``) given its squared k-th distance ``kth``."""
    for i in range(h.shape[0]):
        out[i] = _want_row(h[i], counts[i], kth[i], table, tau, done[i])


@nb.njit(**_q)
def slice_heads(sel, lo, hi, out):
    """``out[i, :hi[i] - lo[i]] = sel[i, lo[i]:hi[i]]``; returns the counts."""
    n = sel.shape[0]
    cnt = np.empty(n, dtype=np.int32)
    for i in range(n):
        c = hi[i] - lo[i]
        for j in range(c):
            out[i, j] = sel[i, lo[i] + j]
        cnt[i] = c
    return cnt


@nb.njit(**_q)
def merge_topk(rows, best_i, best_d, new_i, new_d):
    """Merge the sorted top-k ``new_*[t]`` into ``best_*[rows[t]]`` (sorted, -1/inf padded):
    the k smallest of both, each id once (a vector's replicas sit in several postings)."""
    k = best_i.shape[1]
    ti = np.empty(2 * k, dtype=np.int64)
    td = np.empty(2 * k, dtype=np.float32)
    for t in range(rows.shape[0]):
        i = rows[t]
        a = b = n = 0
        while n < k and (a < k or b < k):
            ai = best_i[i, a] if a < k else -1
            bi = new_i[t, b] if b < k else -1
            if ai < 0 and bi < 0:
                break
            if bi < 0 or (ai >= 0 and (best_d[i, a] < new_d[t, b] or (best_d[i, a] == new_d[t, b] and ai <= bi))):
                x, d = ai, best_d[i, a]
                a += 1
            else:
                x, d = bi, new_d[t, b]
                b += 1
            dup = False
            for u in range(n):
                if ti[u] == x:
                    dup = True
                    break
            if not dup:
                ti[n] = x
                td[n] = d
                n += 1
        for u in range(k):
            best_i[i, u] = ti[u] if u < n else -1
            best_d[i, u] = td[u] if u < n else np.inf


@nb.njit(**_q)
def trace(res_i, res_d, counts, own, truth, k, r_out, recall_out):
    """Calibration traces. ``res_*[i, s]``: the best records of query ``i``'s ``s``-th head's
    posting alone (sorted, -1 padded). Per query and prefix of ``s + 1`` postings: the squared
    k-th distance of the best ``k`` distinct ids other than ``own[i]`` (the query's own
    record), and the share of ``truth[i]`` (-1 padded) among them."""
    nq, m, w = res_i.shape
    bi = np.empty(k, dtype=np.int64)
    bd = np.empty(k, dtype=np.float32)
    for i in range(nq):
        n = 0
        want = 0
        for u in range(truth.shape[1]):
            if truth[i, u] >= 0:
                want += 1
        for s in range(counts[i]):
            for e in range(w):
                x = res_i[i, s, e]
                if x < 0:
                    break
                if x == own[i]:
                    continue
                d = res_d[i, s, e]
                dup = False
                for u in range(n):
                    if bi[u] == x:
                        dup = True
                        break
                if dup or (n == k and d >= bd[n - 1]):
                    continue
                pos = n if n < k else k - 1
                while pos > 0 and bd[pos - 1] > d:
                    if pos < k:
                        bd[pos] = bd[pos - 1]
                        bi[pos] = bi[pos - 1]
                    pos -= 1
                bd[pos] = d
                bi[pos] = x
                if n < k:
                    n += 1
            r_out[i, s] = bd[k - 1] if n == k else np.inf
            hit = 0
            for u in range(n):
                for v in range(truth.shape[1]):
                    if truth[i, v] == bi[u]:
                        hit += 1
                        break
            recall_out[i, s] = hit / want if want > 0 else 1.0


@nb.njit(**_q)
def emulate(h, counts, r_trace, table, tau, first, out_stop, out_rounds):
    """The postings each calibration query reads at threshold ``tau`` under the search's own
    rounds (``first`` heads, then as many as the estimate asks for, until it asks no more),
    and the rounds it takes."""
    for i in range(h.shape[0]):
        c = counts[i]
        s = min(first, c)
        rounds = 1
        while s > 0:
            want = _want_row(h[i], c, r_trace[i, s - 1], table, tau, s)
            if want <= s:
                break
            s = want
            rounds += 1
        out_stop[i] = s
        out_rounds[i] = rounds


def warm() -> None:
    """Run every kernel once on tiny inputs of the types ``vindex.aps`` passes."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4)).astype(np.float32)
    heads = rng.standard_normal((6, 4)).astype(np.float32)
    sel = np.array([[0, 1, 2], [3, 4, 5]], dtype=np.int32)
    counts = np.array([3, 2], dtype=np.int32)
    h = np.zeros((2, 3), dtype=np.float32)
    order_heads(q, heads, sel, counts, h)
    table = np.linspace(0.5, 0.0, 9).astype(np.float32)
    done = np.ones(2, dtype=np.int32)
    out = np.empty(2, dtype=np.int32)
    want_counts(h, counts, np.array([1.0, np.inf], dtype=np.float32), table, 0.9, done, out)
    slice_heads(sel, done, out, np.empty_like(sel))
    best_i, best_d = np.full((2, 2), -1, dtype=np.int64), np.full((2, 2), np.inf, dtype=np.float32)
    merge_topk(np.arange(2), best_i, best_d, np.array([[1, 2], [3, -1]], dtype=np.int64),
               np.array([[0.1, 0.2], [0.3, np.inf]], dtype=np.float32))
    res_i = np.full((2, 3, 3), -1, dtype=np.int64)
    res_i[:, :, 0] = 7
    r_trace = np.empty((2, 3), dtype=np.float32)
    trace(res_i, np.zeros((2, 3, 3), dtype=np.float32), counts, np.zeros(2, dtype=np.int64), best_i, 2, r_trace,
          np.empty((2, 3), dtype=np.float64))
    emulate(h, counts, r_trace, table, 0.9, 1, out, np.empty(2, dtype=np.int32))
