"""Checks of query and vector rows in one pass: finite values, bounded norms, unit length."""
from __future__ import annotations

import numba as nb
import numpy as np

# keeps the GIL: a search's argument check is too short to share the cores, and each release
# costs it up to a switch interval beside a thread running Python (``native.held``)
_q = dict(cache=True)


@nb.njit(**_q)
def check_rows(x, unit, max_sq, out):
    """Check each row of ``x (n, d) float32``: every value finite, and under ``unit`` a
    non-zero norm (``out`` gets the row scaled to unit length), else a squared norm of at
    most ``max_sq``. Returns the first row that fails, -1 if none does. Norms are summed in
    float64, where no float32 row overflows or underflows."""
    n, d = x.shape
    for i in range(n):
        sq = 0.0
        for j in range(d):
            v = np.float64(x[i, j])
            sq += v * v
        if not np.isfinite(sq):  # a NaN or inf value (float32 squares cannot overflow float64)
            return i
        if unit:
            if sq == 0.0:
                return i
            norm = np.sqrt(sq)
            for j in range(d):
                out[i, j] = np.float32(x[i, j] / norm)
        elif not sq <= max_sq:
            return i
    return -1
