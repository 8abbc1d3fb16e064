"""A read's pass over the postings the RocksDB store keeps in memory (the table of
``vindex/storage/kept.py``): which it can use, and which a search can scan where they lie."""
from __future__ import annotations

import numba as nb
import numpy as np

#: The kept table's columns (``vindex.storage.kept`` uses these).
START, ROWS, SPAN, GEN, SEQ = range(5)
#: A span word is ``first chunk << 32 | chunk count``.
CHUNKS_MASK = (1 << 32) - 1


@nb.njit(cache=True, nogil=True)
def usable(found, gens, spans):
    """``(usable, whole)`` per posting of a read, given its kept entries' table rows
    ``found`` (start -1: none) and the directory's generations and span words now. Usable:
    the entry holds the posting as it is now (same generation and first chunk, no chunk
    dropped since). Whole: it also holds every chunk, the first included."""
    n = found.shape[0]
    use = np.zeros(n, dtype=np.bool_)
    whole = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        chunks = spans[i] & CHUNKS_MASK
        kspan = found[i, SPAN]
        kgen = found[i, GEN]
        kchunks = kspan & CHUNKS_MASK
        if (found[i, START] >= 0 and kgen >> 1 == gens[i] and kspan >> 32 == spans[i] >> 32
                and kchunks <= chunks and chunks > 0):
            use[i] = True
            whole[i] = kgen & 1 == 1 and kchunks == chunks
    return use, whole
