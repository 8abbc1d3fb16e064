"""The small-search fast path: head search and the scan of the postings kept in memory, in
one call.

``search_resident`` chooses each query's heads (the graph's beam, or every head scored) and
hands them to ``scan_resident``, which groups them by posting, looks each posting up in the
RocksDB store's table of kept postings (``native.kept_table``), scans those kept whole and
current for every query that wants them, and hands back the others (the misses) grouped the
same way, for the store to read. With no misses it also sorts the heaps: the search is then
one kernel call, with no store round trip.

A record's liveness (its version against the version map) is looked up only for records
near enough to enter a heap (``scan.scan_records``), in the same call, so against the same
state of the maps.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from . import graph, scan
from .codes import scan_kept as codes_scan_kept
from .distances import FASTMATH
from .kept import resident_whole
from .kept_table import ROWS, START

_q = dict(cache=True, nogil=True, fastmath=FASTMATH)

#: Kept postings are scanned as codes first from this many dimensions on, where the scan is
#: bound by fetching the records (one query, p50 medians of six alternated runs: 155 -> 126
#: us on wiki-minilm-15k, 384-d; 437 -> 395 us on synthetic-1m, 128-d); at 50-d the estimates
#: and their queue cost what the bytes saved do (glove-100k: 300 -> 302 us).
CODES_FIRST_MIN_DIM = 128
#: ``scan_resident``'s ``codes`` when the store has none to scan: every kept posting as float32.
NO_CODES = (np.full((0, 5), -1, dtype=np.int64), np.zeros((0, 0), dtype=np.uint8), np.zeros(0, dtype=np.float32),
            np.zeros(0, dtype=np.float32), np.float32(0.0))


@nb.njit(**_q)
def scan_resident(sel, counts, slot, table, rows_f, rows_u, gens, spans, versions, vid2ext, queries, metric,
                  heap_d, heap_i, sizes, codes):
    """Scan the kept postings among each query's heads ``sel[i, :counts[i]]`` into the heaps
    (as ``scan.scan_grouped``). ``table``: the kept postings' table; ``rows_f``/``rows_u``:
    their records as float32 and uint32; ``gens``/``spans``: the store directory's
    generations and span words by pid. ``codes``: ``(table, codes as bytes, lo, scale,
    error bound)`` of the store's code ring (an empty table: none); a search of one query
    scans the kept postings that are also coded whole as codes first
    (``codes.scan_kept``): the same ids, distances to the last bit. Returns ``(miss pids, q_ptr, q_idx,
    postings scanned, records scanned, postings scanned as codes)``, the misses grouped as
    ``scan.group_by_posting`` does; with no miss the heaps are also sorted and padded
    (``scan.finish``)."""
    ctable, codes_b, lo, scale, err = codes
    pids, q_ptr, q_idx = scan.group_by_posting(sel, counts, slot)
    n = pids.shape[0]
    hit = np.zeros(n, dtype=np.bool_)
    coded = np.zeros(n, dtype=np.bool_)
    one = sel.shape[0] == 1 and ctable.shape[0] > 0
    n_hit = n_coded = 0
    for p in range(n):
        pid = pids[p]
        if resident_whole(table, pid, gens, spans):
            hit[p] = True
            n_hit += 1
            if one and resident_whole(ctable, pid, gens, spans) and ctable[pid, ROWS] == table[pid, ROWS]:
                coded[p] = True
                n_coded += 1
    starts = np.empty(n_hit - n_coded, dtype=np.int64)
    ends = np.empty(n_hit - n_coded, dtype=np.int64)
    q_lo = np.empty(n_hit - n_coded, dtype=np.int64)
    q_hi = np.empty(n_hit - n_coded, dtype=np.int64)
    c_rows = np.empty(n_coded, dtype=np.int64)
    c_codes = np.empty(n_coded, dtype=np.int64)
    c_lens = np.empty(n_coded, dtype=np.int64)
    miss = np.empty(n - n_hit, dtype=np.int32)
    m_ptr = np.zeros(n - n_hit + 1, dtype=np.int64)
    h = c = t = 0
    scanned = 0
    for p in range(n):
        pid = pids[p]
        if coded[p]:
            c_rows[c] = table[pid, START]
            c_codes[c] = ctable[pid, START]
            c_lens[c] = table[pid, ROWS]
            scanned += table[pid, ROWS]
            c += 1
        elif hit[p]:
            starts[h] = table[pid, START]
            ends[h] = table[pid, START] + table[pid, ROWS]
            q_lo[h] = q_ptr[p]
            q_hi[h] = q_ptr[p + 1]
            scanned += (ends[h] - starts[h]) * (q_hi[h] - q_lo[h])
            h += 1
        else:
            miss[t] = pid
            m_ptr[t + 1] = m_ptr[t] + q_ptr[p + 1] - q_ptr[p]
            t += 1
    m_idx = np.empty(m_ptr[t], dtype=np.int32)
    t = 0
    for p in range(n):
        if not hit[p]:
            m_idx[m_ptr[t]:m_ptr[t + 1]] = q_idx[q_ptr[p]:q_ptr[p + 1]]
            t += 1
    none = np.empty(0, dtype=np.int64)  # ids looked up as the scan goes
    scan.scan_records(rows_f, rows_u, starts, ends, none, starts, q_lo, q_hi, q_idx, queries, metric, versions,
                      vid2ext, heap_d, heap_i, sizes)
    if n_coded:
        codes_scan_kept(queries, metric, lo, scale, err, c_rows, c_codes, c_lens, codes_b, rows_f, rows_u, versions,
                        vid2ext, heap_d, heap_i, sizes)
    if n_hit == n:
        scan.finish(heap_d, heap_i, sizes)
    return miss, m_ptr, m_idx, n_hit, scanned, n_coded


@nb.njit(**_q)
def search_resident(queries, metric, m, eps, exact, heads, nbrs, alive, starts, visited, stamp0, bd, bi, bx,
                    sel, sel_d, slot, table, rows_f, rows_u, gens, spans, versions, vid2ext, heap_d, heap_i, sizes,
                    codes):
    """A small search in one call: each query's ``m`` nearest heads pruned by ``eps`` into
    ``sel``/``sel_d`` (``graph.exact_search`` over ``heads``/``alive`` if ``exact``, else
    ``graph.search_batch`` from ``starts`` with the beam scratch ``visited``..``bx``), then
    ``scan_resident`` of them. Returns ``(head counts, *scan_resident's result)``."""
    if exact:
        counts = graph.exact_search(queries, heads, alive, metric, m, eps, sel, sel_d)
    else:
        counts = graph.search_batch(queries, heads, nbrs, starts, metric, m, eps, visited, stamp0, bd, bi, bx, sel,
                                    sel_d)
    miss, m_ptr, m_idx, n_hit, scanned, n_coded = scan_resident(sel, counts, slot, table, rows_f, rows_u, gens,
                                                                spans, versions, vid2ext, queries, metric, heap_d,
                                                                heap_i, sizes, codes)
    return counts, miss, m_ptr, m_idx, n_hit, scanned, n_coded
