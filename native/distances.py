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
