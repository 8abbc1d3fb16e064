"""External id -> internal vid hash table.

Open addressing with linear probing over an ``int32`` slot array holding vids (-1 = empty);
the key of a slot is ``vid2ext[vid]``, so the table stores 4 bytes per slot and no keys of its
own. Entries are never removed: a deleted id keeps its vid (its version byte says deleted),
and a later upsert of the same id reuses it.
"""
from __future__ import annotations

import numba as nb
import numpy as np

_q = dict(cache=True, nogil=True)

_MULT = np.uint64(0x9E3779B97F4A7C15)


@nb.njit(inline="always", **_q)
def _home(ext, mask):
    h = np.uint64(ext) * _MULT
    return np.int64((h >> np.uint64(32)) & np.uint64(mask))


@nb.njit(**_q)
def lookup(table, vid2ext, exts):
    """vids of ``exts`` (-1 where unknown)."""
    mask = table.shape[0] - 1
    out = np.empty(exts.shape[0], dtype=np.int64)
    for i in range(exts.shape[0]):
        ext = exts[i]
        s = _home(ext, mask)
        while True:
            v = table[s]
            if v < 0:
                out[i] = -1
                break
            if vid2ext[v] == ext:
                out[i] = v
                break
            s = (s + 1) & mask
    return out


@nb.njit(**_q)
def insert(table, vid2ext, vids):
    """Add ``vids`` (whose ``vid2ext`` entries are set and not yet in the table)."""
    mask = table.shape[0] - 1
    for i in range(vids.shape[0]):
        v = vids[i]
        s = _home(vid2ext[v], mask)
        while table[s] >= 0:
            s = (s + 1) & mask
        table[s] = v


@nb.njit(**_q)
def rebuild(table, vid2ext, n_vids):
    """Fill an all -1 ``table`` with vids ``0..n_vids-1`` (retired vids, ext -1, are left out)."""
    mask = table.shape[0] - 1
    for v in range(n_vids):
        if vid2ext[v] < 0:
            continue
        s = _home(vid2ext[v], mask)
        while table[s] >= 0:
            s = (s + 1) & mask
        table[s] = v
