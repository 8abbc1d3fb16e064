"""Distance kernels.

Two internal metrics: ``L2`` (squared Euclidean) and ``IP`` (negative inner product, so
smaller is always better). Cosine is L2 over unit vectors, handled by the library before
vectors reach a kernel. Every function here is a pure function over arrays.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .metrics import IP, L2  # noqa: F401  (re-exported)

#: LLVM fast-math flags that let sums vectorise (reassociation) while keeping inf/NaN
#: semantics: the kernels use +inf as a sentinel, which ``fastmath=True`` ("ninf") would
#: let the optimiser assume away.
FASTMATH = {"reassoc", "contract", "arcp", "nsz", "afn"}

_opts = dict(cache=True, nogil=True, fastmath=FASTMATH)


@nb.njit(inline="always", **_opts)
def l2sq(a, b):
    s = np.float32(0.0)
    for i in range(a.shape[0]):
        t = a[i] - b[i]
        s += t * t
    return s


@nb.njit(inline="always", **_opts)
def neg_dot(a, b):
    s = np.float32(0.0)
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return -s


@nb.njit(inline="always", **_opts)
def distance(metric, a, b):
    if metric == L2:
        return l2sq(a, b)
    return neg_dot(a, b)


@nb.njit(inline="always", **_opts)
def _four(metric, q, rows, r0, r1, r2, r3, col0):
    """``distance(metric, q, rows[r, col0:])`` for rows ``r0..r3`` in one pass over ``q``."""
    d = q.shape[0]
    s0 = np.float32(0.0)
    s1 = np.float32(0.0)
    s2 = np.float32(0.0)
    s3 = np.float32(0.0)
    if metric == L2:
        for j in range(d):
            x = q[j]
            a = x - rows[r0, col0 + j]
            b = x - rows[r1, col0 + j]
            c = x - rows[r2, col0 + j]
            e = x - rows[r3, col0 + j]
            s0 += a * a
            s1 += b * b
            s2 += c * c
            s3 += e * e
        return s0, s1, s2, s3
    for j in range(d):
        x = q[j]
        s0 += x * rows[r0, col0 + j]
        s1 += x * rows[r1, col0 + j]
        s2 += x * rows[r2, col0 + j]
        s3 += x * rows[r3, col0 + j]
    return -s0, -s1, -s2, -s3


@nb.njit(inline="always", **_opts)
def to_rows(metric, q, rows, lo, hi, col0, out):
    """``out[r - lo] = distance(metric, q, rows[r, col0:])`` for ``r`` in ``lo:hi``.

    Four rows share each pass over ``q``: one row's sum is a chain of dependent vector adds
    ending in a horizontal sum, and four independent chains keep the FPU busy while each
    waits, which pays most in searches that scan many rows (large ``max_postings``). The last group repeats its last row rather than finishing
    one row at a time: a row's distance then always comes out of the same arithmetic, bit
    for bit, wherever it sits (replicas of a vector in different postings must tie exactly,
    or which copy a search meets first would show)."""
    last = hi - 1
    for r in range(lo, hi, 4):
        r1 = min(r + 1, last)
        r2 = min(r + 2, last)
        r3 = min(r + 3, last)
        s0, s1, s2, s3 = _four(metric, q, rows, r, r1, r2, r3, col0)
        out[r - lo] = s0
        out[r1 - lo] = s1
        out[r2 - lo] = s2
        out[r3 - lo] = s3


@nb.njit(inline="always", **_opts)
def _four_by_four(metric, queries, a0, a1, a2, a3, rows, r0, r1, r2, r3, col0):
    """``distance(metric, queries[a], rows[r, col0:])`` for queries ``a0..a3`` by rows
    ``r0..r3`` in one pass: each element loaded serves four sums, not one (a batch's
    posting scan, where every query of a posting meets every record, is bound by the loads)."""
    d = queries.shape[1]
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = np.float32(0.0)
    s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = np.float32(0.0)
    if metric == L2:
        for j in range(d):
            x0 = queries[a0, j]
            x1 = queries[a1, j]
            x2 = queries[a2, j]
            x3 = queries[a3, j]
            y0 = rows[r0, col0 + j]
            y1 = rows[r1, col0 + j]
            y2 = rows[r2, col0 + j]
            y3 = rows[r3, col0 + j]
            s00 += (x0 - y0) * (x0 - y0)
            s01 += (x0 - y1) * (x0 - y1)
            s02 += (x0 - y2) * (x0 - y2)
            s03 += (x0 - y3) * (x0 - y3)
            s10 += (x1 - y0) * (x1 - y0)
            s11 += (x1 - y1) * (x1 - y1)
            s12 += (x1 - y2) * (x1 - y2)
            s13 += (x1 - y3) * (x1 - y3)
            s20 += (x2 - y0) * (x2 - y0)
            s21 += (x2 - y1) * (x2 - y1)
            s22 += (x2 - y2) * (x2 - y2)
            s23 += (x2 - y3) * (x2 - y3)
            s30 += (x3 - y0) * (x3 - y0)
            s31 += (x3 - y1) * (x3 - y1)
            s32 += (x3 - y2) * (x3 - y2)
            s33 += (x3 - y3) * (x3 - y3)
        return (s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33)
    for j in range(d):
        x0 = queries[a0, j]
        x1 = queries[a1, j]
        x2 = queries[a2, j]
        x3 = queries[a3, j]
        y0 = rows[r0, col0 + j]
        y1 = rows[r1, col0 + j]
        y2 = rows[r2, col0 + j]
        y3 = rows[r3, col0 + j]
        s00 -= x0 * y0
        s01 -= x0 * y1
        s02 -= x0 * y2
        s03 -= x0 * y3
        s10 -= x1 * y0
        s11 -= x1 * y1
        s12 -= x1 * y2
        s13 -= x1 * y3
        s20 -= x2 * y0
        s21 -= x2 * y1
        s22 -= x2 * y2
        s23 -= x2 * y3
        s30 -= x3 * y0
        s31 -= x3 * y1
        s32 -= x3 * y2
        s33 -= x3 * y3
    return (s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33)


@nb.njit(inline="always", **_opts)
def to_block(metric, queries, a0, a1, a2, a3, rows, lo, hi, col0, out):
    """``out[g, r - lo] = distance(metric, queries[a_g], rows[r, col0:])`` for the four
    queries ``a0..a3`` and ``r`` in ``lo:hi``: ``to_rows`` for four queries at once."""
    last = hi - 1
    for r in range(lo, hi, 4):
        r1 = min(r + 1, last)
        r2 = min(r + 2, last)
        r3 = min(r + 3, last)
        (out[0, r - lo], out[0, r1 - lo], out[0, r2 - lo], out[0, r3 - lo],
         out[1, r - lo], out[1, r1 - lo], out[1, r2 - lo], out[1, r3 - lo],
         out[2, r - lo], out[2, r1 - lo], out[2, r2 - lo], out[2, r3 - lo],
         out[3, r - lo], out[3, r1 - lo], out[3, r2 - lo], out[3, r3 - lo]) = _four_by_four(
            metric, queries, a0, a1, a2, a3, rows, r, r1, r2, r3, col0)


@nb.njit(inline="always", **_opts)
def to_gathered(metric, q, rows, idx, n, out):
    """``out[j] = distance(metric, q, rows[idx[j]])`` for ``j < n``: ``to_rows``' arithmetic
    over rows picked by index (a graph search's neighbours)."""
    to_picked(metric, q, rows, idx, n, 0, out)


@nb.njit(inline="always", **_opts)
def to_picked(metric, q, rows, idx, n, col0, out):
    """``out[j] = distance(metric, q, rows[idx[j], col0:])`` for ``j < n``, four rows a pass
    as in ``to_rows``."""
    last = n - 1
    for r in range(0, n, 4):
        j1 = min(r + 1, last)
        j2 = min(r + 2, last)
        j3 = min(r + 3, last)
        out[r], out[j1], out[j2], out[j3] = _four(metric, q, rows, idx[r], idx[j1], idx[j2], idx[j3], col0)


@nb.njit(**_opts)
def pairwise(metric, xs, ys):
    """Distances between every row of ``xs`` and every row of ``ys`` -> (len(xs), len(ys))."""
    out = np.empty((xs.shape[0], ys.shape[0]), dtype=np.float32)
    for i in range(xs.shape[0]):
        for j in range(ys.shape[0]):
            out[i, j] = distance(metric, xs[i], ys[j])
    return out


@nb.njit(inline="always", **_opts)
def within_eps(d, d_best, eps):
    """Relative pruning rule ``d <= d_best + eps * |d_best|``.

    For non-negative distances this is ``d <= (1 + eps) * d_best`` (SPANN's rule); the absolute
    value keeps it meaningful for negative inner-product distances. ``eps = inf`` disables the
    rule. Callers pass ``reference`` below as ``d_best``.
    """
    if eps == np.inf:
        return True
    return d <= d_best + eps * abs(d_best)


@nb.njit(inline="always", **_opts)
def reference(dists, n):
    """The distance pruning is relative to: the nearest one, or the first non-zero one when the
    nearest is exactly 0 (a query equal to a head would otherwise prune every other head)."""
    for t in range(n):
        if dists[t] != 0:
            return dists[t]
    return dists[0] if n > 0 else np.float32(0)
