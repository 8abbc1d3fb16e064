"""The query kernels again, as entry points that keep the GIL: for searches of a few queries.

Every ``nogil`` kernel call releases the GIL and takes it back on return. Taking it back is a
hand-off: when another thread runs Python meanwhile (an ingest does), the search waits until
that thread lets go, up to the switch interval. A batch-size-1 search made five such calls,
so beside a thread running a plain Python loop it could wait five switch intervals, many
times its own work; these entry points leave it one release: its read from the store.

A small search over postings all kept in memory makes one kernel call in all,
``search_resident`` (head search and resident scan, ``native.fast``), here: no hand-off at
all; one that misses some postings releases the GIL once more, for its read.

Holding the GIL costs parallelism only for the time these kernels run, about 50 us for one
query, less than such a search spends in Python anyway; batches larger than
``vindex.config.SMALL_SEARCH_QUERIES`` use the ``nogil`` kernels and run in parallel threads.
The block store checks and moves reads of up to ``HELD_MAX_BLOCKS`` blocks here too, for
the same reason: one hand-off fewer per search beside a busy thread.

A call from one compiled function to another is a plain native call, so each entry point
runs the ``nogil`` kernel's own code.
"""
from __future__ import annotations

import numba as nb

from . import fast, graph, layout, scan

_h = dict(cache=True)


@nb.njit(**_h)
def search_batch(queries, heads, nbrs, starts, metric, m, eps, visited, stamp0, bd, bi, bx, out_ids, out_d):
    """:func:`native.graph.search_batch`, GIL held."""
    return graph.search_batch(queries, heads, nbrs, starts, metric, m, eps, visited, stamp0, bd, bi, bx,
                              out_ids, out_d)


@nb.njit(**_h)
def exact_search(queries, heads, alive, metric, m, eps, out_ids, out_d):
    """:func:`native.graph.exact_search`, GIL held."""
    return graph.exact_search(queries, heads, alive, metric, m, eps, out_ids, out_d)


@nb.njit(**_h)
def group_by_posting(sel, counts, slot):
    """:func:`native.scan.group_by_posting`, GIL held."""
    return scan.group_by_posting(sel, counts, slot)


@nb.njit(**_h)
def live_ids(recs_u, versions, vid2ext):
    """:func:`native.scan.live_ids`, GIL held."""
    return scan.live_ids(recs_u, versions, vid2ext)


@nb.njit(**_h)
def live_ids_ranges(recs_u, starts, ends, versions, vid2ext):
    """:func:`native.scan.live_ids_ranges`, GIL held."""
    return scan.live_ids_ranges(recs_u, starts, ends, versions, vid2ext)


@nb.njit(**_h)
def scan_grouped(recs_f, starts, ends, ids, id_starts, q_lo, q_hi, q_idx, queries, metric, heap_d, heap_i, sizes):
    """:func:`native.scan.scan_grouped`, GIL held."""
    scan.scan_grouped(recs_f, starts, ends, ids, id_starts, q_lo, q_hi, q_idx, queries, metric, heap_d, heap_i,
                      sizes)


@nb.njit(**_h)
def scan_resident(sel, counts, slot, table, rows_f, rows_u, gens, spans, versions, vid2ext, queries, metric,
                  heap_d, heap_i, sizes, codes):
    """:func:`native.fast.scan_resident`, GIL held."""
    return fast.scan_resident(sel, counts, slot, table, rows_f, rows_u, gens, spans, versions, vid2ext, queries,
                              metric, heap_d, heap_i, sizes, codes)


@nb.njit(**_h)
def search_resident(queries, metric, m, eps, exact, heads, nbrs, alive, starts, visited, stamp0, bd, bi, bx, sel,
                    sel_d, slot, table, rows_f, rows_u, gens, spans, versions, vid2ext, heap_d, heap_i, sizes, codes):
    """:func:`native.fast.search_resident`, GIL held."""
    return fast.search_resident(queries, metric, m, eps, exact, heads, nbrs, alive, starts, visited, stamp0, bd,
                                bi, bx, sel, sel_d, slot, table, rows_f, rows_u, gens, spans, versions, vid2ext,
                                heap_d, heap_i, sizes, codes)


@nb.njit(**_h)
def finish(heap_d, heap_i, sizes):
    """:func:`native.scan.finish`, GIL held."""
    scan.finish(heap_d, heap_i, sizes)


@nb.njit(**_h)
def check_and_compact(buf, sums, src, dst, nbytes):
    """:func:`native.layout.check_and_compact`, GIL held."""
    return layout.check_and_compact(buf, sums, src, dst, nbytes)
