"""Size-penalised balanced k-means for splitting one posting (SPFresh's balanced 2-means,
generalised to k clusters for postings that grew far past their limit).

Assignment minimises ``D(x, c) + lam * scale * n_c / (n / k)``: the running size ``n_c`` of a
cluster makes it more expensive to join, so the split stays balanced (a lopsided split would
leave one child over the limit and force another split right away). ``scale`` is the mean
nearest-centre distance of the previous pass, so ``lam`` is unit-free.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .distances import FASTMATH, l2sq

_q = dict(cache=True, nogil=True, fastmath=FASTMATH)


@nb.njit(**_q)
def _farthest_first(x, k, centroids):
    """Deterministic seeding: the point farthest from the mean, then farthest from those chosen."""
    n, d = x.shape
    mean = np.zeros(d, dtype=np.float32)
    for i in range(n):
        mean += x[i]
    mean /= n
    best = np.full(n, np.inf, dtype=np.float32)
    far, far_d = 0, -1.0
    for i in range(n):
        di = l2sq(x[i], mean)
        if di > far_d:
            far, far_d = i, di
    for c in range(k):
        centroids[c] = x[far]
        far, far_d = 0, -1.0
        for i in range(n):
            di = l2sq(x[i], centroids[c])
            if di < best[i]:
                best[i] = di
            if best[i] > far_d:
                far, far_d = i, best[i]


@nb.njit(**_q)
def balanced_kmeans(x, k, iters, lam, labels, centroids):
    """Cluster rows of ``x (n, d)`` into ``k`` balanced groups; writes ``labels (n,)`` and
    ``centroids (k, d)``. Every cluster is non-empty when ``n >= k``."""
    n, d = x.shape
    _farthest_first(x, k, centroids)
    counts = np.zeros(k, dtype=np.int64)
    scale = 0.0
    fair = max(n / k, 1.0)
    for it in range(iters):
        counts[:] = 0
        total = 0.0
        for i in range(n):
            best, best_cost, best_d = 0, np.inf, 0.0
            for c in range(k):
                dc = l2sq(x[i], centroids[c])
                cost = dc + lam * scale * counts[c] / fair
                if cost < best_cost:
                    best, best_cost, best_d = c, cost, dc
            labels[i] = best
            counts[best] += 1
            total += best_d
        scale = total / n
        # recompute centres; an empty cluster restarts at the point farthest from its centre
        centroids[:] = 0
        for i in range(n):
            centroids[labels[i]] += x[i]
        for c in range(k):
            if counts[c] > 0:
                centroids[c] /= counts[c]
        for c in range(k):
            if counts[c] == 0:
                far, far_d = 0, -1.0
                for i in range(n):
                    di = l2sq(x[i], centroids[labels[i]])
                    if counts[labels[i]] > 1 and di > far_d:
                        far, far_d = i, di
                counts[labels[far]] -= 1
                labels[far] = c
                counts[c] = 1
                centroids[c] = x[far]
