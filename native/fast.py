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
from .distances import FASTMATH
from .kept_table import CHUNKS_MASK, GEN, ROWS, SPAN, START

_q = dict(cache=True, nogil=True, fastmath=FASTMATH)


@nb.njit(**_q)
def resident_whole(table, pid, gens, spans):
    """True if the kept entry of ``pid`` holds the posting as it is now, all of it: the same
    generation and first chunk, every chunk, the first included (``native.kept.usable``'s
    ``whole``)."""
    if pid >= table.shape[0] or pid >= spans.shape[0] or table[pid, START] < 0:
        return False
    gen = gens[pid] if pid < gens.shape[0] else 0  # (the directory's arrays grow on first write)
    span = spans[pid]
    chunks = span & CHUNKS_MASK
    kspan = table[pid, SPAN]
    kgen = table[pid, GEN]
    return (chunks > 0 and kgen >> 1 == gen and kspan >> 32 == span >> 32
            and kgen & 1 == 1 and kspan & CHUNKS_MASK == chunks)


@nb.njit(**_q)
def scan_resident(sel, counts, slot, table, rows_f, rows_u, gens, spans, versions, vid2ext, queries, metric,
                  heap_d, heap_i, sizes):
    """Scan the kept postings among each query's heads ``sel[i, :counts[i]]`` into the heaps
    (as ``scan.scan_grouped``). ``table``: the kept postings' table; ``rows_f``/``rows_u``:
    their records as float32 and uint32; ``gens``/``spans``: the store directory's
    generations and span words by pid. Returns ``(miss pids, q_ptr, q_idx, postings scanned,
    records scanned)``, the misses grouped as ``scan.group_by_posting`` does; with no miss the
    heaps are also sorted and padded (``scan.finish``)."""
    pids, q_ptr, q_idx = scan.group_by_posting(sel, counts, slot)
    n = pids.shape[0]
    hit = np.zeros(n, dtype=np.bool_)
    n_hit = 0
    for p in range(n):
        if resident_whole(table, pids[p], gens, spans):
            hit[p] = True
            n_hit += 1
    starts = np.empty(n_hit, dtype=np.int64)
    ends = np.empty(n_hit, dtype=np.int64)
    q_lo = np.empty(n_hit, dtype=np.int64)
    q_hi = np.empty(n_hit, dtype=np.int64)
    miss = np.empty(n - n_hit, dtype=np.int32)
    m_ptr = np.zeros(n - n_hit + 1, dtype=np.int64)
    h = t = 0
    scanned = 0
    for p in range(n):
        if hit[p]:
            pid = pids[p]
            starts[h] = table[pid, START]
            ends[h] = table[pid, START] + table[pid, ROWS]
            q_lo[h] = q_ptr[p]
            q_hi[h] = q_ptr[p + 1]
            scanned += (ends[h] - starts[h]) * (q_hi[h] - q_lo[h])
            h += 1
        else:
            miss[t] = pids[p]
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
    if n_hit == n:
        scan.finish(heap_d, heap_i, sizes)
    return miss, m_ptr, m_idx, n_hit, scanned


@nb.njit(**_q)
def search_resident(queries, metric, m, eps, exact, heads, nbrs, alive, starts, visited, stamp0, bd, bi, bx,
                    sel, sel_d, slot, table, rows_f, rows_u, gens, spans, versions, vid2ext, heap_d, heap_i, sizes):
    """A small search in one call: each query's ``m`` nearest heads pruned by ``eps`` into
    ``sel``/``sel_d`` (``graph.exact_search`` over ``heads``/``alive`` if ``exact``, else
    ``graph.search_batch`` from ``starts`` with the beam scratch ``visited``..``bx``), then
    ``scan_resident`` of them. Returns ``(head counts, *scan_resident's result)``."""
    if exact:
        counts = graph.exact_search(queries, heads, alive, metric, m, eps, sel, sel_d)
    else:
        counts = graph.search_batch(queries, heads, nbrs, starts, metric, m, eps, visited, stamp0, bd, bi, bx, sel,
                                    sel_d)
    miss, m_ptr, m_idx, n_hit, scanned = scan_resident(sel, counts, slot, table, rows_f, rows_u, gens, spans,
                                                       versions, vid2ext, queries, metric, heap_d, heap_i, sizes)
    return counts, miss, m_ptr, m_idx, n_hit, scanned
