"""A read's pass over the postings the RocksDB store keeps in memory (the table of
``vindex/storage/kept.py``): which it can use, and which a search can scan where they lie."""
from __future__ import annotations

import numba as nb
import numpy as np

from .kept_table import CHUNKS_MASK, GEN, SEQ, SPAN, START


@nb.njit(cache=True)  # keeps the GIL: microseconds of work on the search path, where a release costs a hand-off
def find(table, pids):
    """``(rows, oldest)``: each pid's table row (start -1 where none is kept, or the pid is
    past the table) and the smallest entry number among those found (-1 if none)."""
    n = pids.shape[0]
    out = np.full((n, table.shape[1]), -1, dtype=np.int64)
    oldest = -1
    for i in range(n):
        p = pids[i]
        if p < table.shape[0]:
            for c in range(table.shape[1]):
                out[i, c] = table[p, c]
            if out[i, START] >= 0 and (oldest < 0 or out[i, SEQ] < oldest):
                oldest = out[i, SEQ]
    return out, oldest


@nb.njit(cache=True)  # keeps the GIL: microseconds of work on the search path, where a release costs a hand-off
def usable(found, gens, spans):
    """``(usable, whole, rest)`` for the postings of a read, given their kept entries' table
    rows ``found`` (start -1: none) and the directory's generations and span words now.
    ``usable`` (a mask): the entry holds the posting as it is now (same generation and first
    chunk, no chunk dropped since). ``whole`` (positions): it also holds every chunk, the
    first included; ``rest``: the other positions."""
    n = found.shape[0]
    use = np.zeros(n, dtype=np.bool_)
    is_whole = np.zeros(n, dtype=np.bool_)
    n_whole = 0
    for i in range(n):
        chunks = spans[i] & CHUNKS_MASK
        kspan = found[i, SPAN]
        kgen = found[i, GEN]
        kchunks = kspan & CHUNKS_MASK
        if (found[i, START] >= 0 and kgen >> 1 == gens[i] and kspan >> 32 == spans[i] >> 32
                and kchunks <= chunks and chunks > 0):
            use[i] = True
            if kgen & 1 == 1 and kchunks == chunks:
                is_whole[i] = True
                n_whole += 1
    whole = np.empty(n_whole, dtype=np.int64)
    rest = np.empty(n - n_whole, dtype=np.int64)
    w = r = 0
    for i in range(n):
        if is_whole[i]:
            whole[w] = i
            w += 1
        else:
            rest[r] = i
            r += 1
    return use, whole, rest


@nb.njit(cache=True, nogil=True)
def resident_whole(table, pid, gens, spans):
    """True if the kept entry of ``pid`` holds the posting as it is now, all of it: the same
    generation and first chunk, every chunk, the first included (``usable``'s ``whole``).
    ``table`` is either store ring's: the float32 postings' or the codes'."""
    if pid >= table.shape[0] or pid >= spans.shape[0] or table[pid, START] < 0:
        return False
    gen = gens[pid] if pid < gens.shape[0] else 0  # (the directory's arrays grow on first write)
    span = spans[pid]
    chunks = span & CHUNKS_MASK
    kspan = table[pid, SPAN]
    kgen = table[pid, GEN]
    return (chunks > 0 and kgen >> 1 == gen and kspan >> 32 == span >> 32
            and kgen & 1 == 1 and kspan & CHUNKS_MASK == chunks)
