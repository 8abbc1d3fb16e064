"""Moving posting bytes within a read buffer (the block store's read path).

A read lands each posting at the start of its first block; its records end partway through
its last block. ``compact`` moves every posting down to where the previous one's records end,
in one call (``check_and_compact``: with the checksum check). A ``ctypes.memmove`` per posting
from Python released and re-took the GIL once per posting, and on a busy interpreter each
re-take can wait a whole switch interval. A plain byte loop does not vectorise (the source
and destination may overlap); copying through a small local buffer lets both halves
vectorise, at close to the memmoves' speed without their GIL hand-offs.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .checksum import first_bad

_q = dict(cache=True, nogil=True)

_CHUNK = 64  # words per round trip through the local buffer (a constant: the loops unroll)


@nb.njit(**_q)
def _move(w, src, dst, n, tmp):
    """The moves of ``compact`` in units of ``w``'s words."""
    c = _CHUNK
    for i in range(src.shape[0]):
        s, d, k = src[i], dst[i], n[i]
        if s == d:
            continue
        j = 0
        while j + c <= k:
            for t in range(c):
                tmp[t] = w[s + j + t]
            for t in range(c):
                w[d + j + t] = tmp[t]
            j += c
        while j < k:
            w[d + j] = w[s + j]
            j += 1


@nb.njit(**_q)
def compact(buf, src, dst, nbytes):
    """Move ``buf[src[i]:src[i] + nbytes[i]]`` to ``dst[i]``, in order of ``i``. All values are
    multiples of 4 (records are whole 32-bit words), ``dst[i] <= src[i]``, and a move never
    reaches bytes still to be moved (``dst[i] + nbytes[i] <= src[i + 1]``). A move may overlap
    its own source: copying forward, a chunk is read before any of it is overwritten. Moves
    go in 64-bit words when every value allows (twice as fast as 32-bit ones)."""
    wide = True
    for i in range(src.shape[0]):
        if (src[i] | dst[i] | nbytes[i]) & 7:
            wide = False
    if wide:
        _move(buf.view(np.uint64), src // 8, dst // 8, nbytes // 8, np.empty(_CHUNK, np.uint64))
    else:
        _move(buf.view(np.uint32), src // 4, dst // 4, nbytes // 4, np.empty(_CHUNK, np.uint32))


@nb.njit(**_q)
def check_and_compact(buf, sums, src, dst, nbytes):
    """A read's checks and moves in one call: the index of the first block of ``buf`` whose
    checksum is not ``sums[i]`` (nothing moved then), or -1 once ``compact`` is done."""
    bad = first_bad(buf, sums)
    if bad < 0:
        compact(buf, src, dst, nbytes)
    return bad
