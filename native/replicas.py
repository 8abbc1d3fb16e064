"""RNG-rule replica selection (SPANN).

Given a vector's candidate heads in ascending distance order, accept head c only while
``D(x, c) <= D(x, c_1) + eps * |D(x, c_1)|`` and only if ``rng_factor * D(c, c') > D(x, c)``
for every head c' already accepted; stop at ``max_replicas``. This spreads a boundary
vector's copies over postings that point in different directions instead of piling them
into near-duplicate neighbours. Distances are squared L2 (the index's geometry).
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .distances import FASTMATH, l2sq, reference, within_eps


@nb.njit(inline="always", cache=True, nogil=True, fastmath=FASTMATH)
def _select_row(cand, cand_d, heads, eps, rng_factor, out, out_d):
    n = 0
    if cand.shape[0] == 0 or cand[0] < 0:
        for t in range(out.shape[0]):
            out[t] = -1
            out_d[t] = np.inf
        return 0
    n_valid = 0
    while n_valid < cand.shape[0] and cand[n_valid] >= 0:
        n_valid += 1
    best = reference(cand_d, n_valid)
    for t in range(cand.shape[0]):
        c = cand[t]
        if c < 0 or not within_eps(cand_d[t], best, eps):
            break
        ok = True
        for a in range(n):
            if rng_factor * l2sq(heads[c], heads[out[a]]) <= cand_d[t]:
                ok = False
                break
        if ok:
            out[n] = c
            out_d[n] = cand_d[t]
            n += 1
            if n == out.shape[0]:
                break
    for t in range(n, out.shape[0]):
        out[t] = -1
        out_d[t] = np.inf
    return n


@nb.njit(cache=True, nogil=True, fastmath=FASTMATH)
def select(cand, cand_d, heads, eps, rng_factor, out, out_d):
    """Rows of ``cand (n, C) int32`` / ``cand_d`` -> chosen heads ``out (n, max_replicas)`` and
    their distances ``out_d``; returns counts."""
    counts = np.empty(cand.shape[0], dtype=np.int32)
    for i in range(cand.shape[0]):
        counts[i] = _select_row(cand[i], cand_d[i], heads, eps, rng_factor, out[i], out_d[i])
    return counts


@nb.njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def select_parallel(cand, cand_d, heads, eps, rng_factor, out, out_d):
    """``select`` over all cores, for bulk builds."""
    counts = np.empty(cand.shape[0], dtype=np.int32)
    for i in nb.prange(cand.shape[0]):
        counts[i] = _select_row(cand[i], cand_d[i], heads, eps, rng_factor, out[i], out_d[i])
    return counts
