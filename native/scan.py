"""Posting scan: exact distances over posting records, version filter, replica dedupe.

A posting record is one row of a ``(E, 2 + d)`` 32-bit matrix: word 0 is the internal vector
id (vid), word 1 the version it was written with, words 2.. the float32 vector. The same
memory is passed twice, as ``float32`` (vectors) and ``uint32`` (vid, version), so decoding a
posting is ``numpy.frombuffer`` and nothing else.

An entry is live iff ``versions[vid] == version``: the version map stores a deleted flag in
its high bit, so a deleted vid never matches, and an upsert bumps the version so old copies
stop matching. A vid appears in up to ``max_replicas`` postings; results hold each external
id at most once.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from . import heap
from .distances import FASTMATH, to_block, to_rows
from .prefetch import prefetch_row

_q = dict(cache=True, nogil=True, fastmath=FASTMATH)

RECORD_HEADER_WORDS = 2


@nb.njit(**_q)
def live_ids(recs_u, versions, vid2ext):
    """Per record, its external id if it is live against the version map, else -1. Computed
    once per batch, in the same read section as the read: a writer retiring a vid rewrites
    ``vid2ext`` in place, so the ids must be taken from the state the versions were."""
    return live_ids_ranges(recs_u, np.zeros(1, dtype=np.int64), np.full(1, recs_u.shape[0], dtype=np.int64),
                           versions, vid2ext)


@nb.njit(**_q)
def group_by_posting(sel, counts, slot):
    """Invert per-query head lists into per-posting query lists.

    ``sel (nq, m) int32`` holds each query's heads (first ``counts[i]`` valid). ``slot`` is
    scratch of length >= number of heads, all -1 on entry and restored to -1 on exit.
    Returns ``(pids ascending, q_ptr (P+1) int64, q_idx)``: posting ``pids[p]`` is wanted by
    queries ``q_idx[q_ptr[p]:q_ptr[p+1]]``.
    """
    nq = sel.shape[0]
    total = 0
    for i in range(nq):
        total += counts[i]
    uniq = np.empty(total, dtype=np.int32)
    n_u = 0
    for i in range(nq):
        for t in range(counts[i]):
            h = sel[i, t]
            if slot[h] < 0:
                slot[h] = 0
                uniq[n_u] = h
                n_u += 1
    pids = np.sort(uniq[:n_u])
    for p in range(n_u):
        slot[pids[p]] = p
    q_ptr = np.zeros(n_u + 1, dtype=np.int64)
    for i in range(nq):
        for t in range(counts[i]):
            q_ptr[slot[sel[i, t]] + 1] += 1
    for p in range(n_u):
        q_ptr[p + 1] += q_ptr[p]
    fill = q_ptr[:-1].copy()
    q_idx = np.empty(total, dtype=np.int32)
    for i in range(nq):
        for t in range(counts[i]):
            p = slot[sel[i, t]]
            q_idx[fill[p]] = i
            fill[p] += 1
    for p in range(n_u):
        slot[pids[p]] = -1
    return pids, q_ptr, q_idx


@nb.njit(**_q)
def nearest_first(sel, counts, pids):
    """The order to scan postings ``pids`` (ascending: ``group_by_posting``'s, or some of
    them) in: for one query, its heads' order, nearest first, so its heap fills with near
    records early and most records after fail its bound before their liveness and
    duplicate checks (random reads of the id maps); for several queries, which share
    postings, pid order."""
    if sel.shape[0] != 1:
        return np.arange(pids.shape[0])
    at = np.searchsorted(pids, sel[0, :counts[0]])
    out = np.empty(pids.shape[0], dtype=np.int64)
    n = 0
    for t in range(at.shape[0]):  # (``pids`` may be some of the heads: the misses of a scan)
        if at[t] < pids.shape[0] and pids[at[t]] == sel[0, t] and n < out.shape[0]:
            out[n] = at[t]
            n += 1
    return out[:n]


@nb.njit(**_q)
def live_ids_ranges(recs_u, starts, ends, versions, vid2ext):
    """``live_ids`` of the records ``starts[j]:ends[j]`` of each posting ``j``, one posting
    after another: posting ``j``'s ids start at the sum of the lengths before it."""
    total = 0
    for j in range(starts.shape[0]):
        total += ends[j] - starts[j]
    out = np.empty(total, dtype=np.int64)
    nv = versions.shape[0]
    t = 0
    for j in range(starts.shape[0]):
        for e in range(starts[j], ends[j]):
            vid = recs_u[e, 0]
            out[t] = vid2ext[vid] if vid < nv and versions[vid] == recs_u[e, 1] else -1
            t += 1
    return out


@nb.njit(**_q)
def scan_grouped(recs_f, starts, ends, ids, id_starts, q_lo, q_hi, q_idx, queries, metric, heap_d, heap_i, sizes):
    """Scan each posting once for every query that wants it, posting-major so a posting stays
    in cache while its queries run over it. Posting ``p`` is records ``starts[p]:ends[p]``
    of ``recs_f``, with ids from ``ids[id_starts[p]]`` on (per record its external id, -1
    when it is not live: ``live_ids``), wanted by queries ``q_idx[q_lo[p]:q_hi[p]]``. Heaps
    ``heap_d/heap_i (nq, k)`` and ``sizes`` carry over between calls, so a batch can be
    scanned in pieces."""
    scan_records(recs_f, np.empty((0, 0), np.uint32), starts, ends, ids, id_starts, q_lo, q_hi, q_idx, queries,
                 metric, np.empty(0, np.uint8), ids, heap_d, heap_i, sizes)


@nb.njit(**_q)
def scan_records(recs_f, recs_u, starts, ends, ids, id_starts, q_lo, q_hi, q_idx, queries, metric, versions, vid2ext,
                 heap_d, heap_i, sizes):
    """``scan_grouped``; with an empty ``ids``, each record's live id is looked up (as
    ``live_ids`` does, against ``versions``/``vid2ext``) only once its distance could enter
    the heap: most records are farther than the k-th best, and the two random reads cost as
    much as a distance at 50 dimensions. The same results either way."""
    lazy = ids.shape[0] == 0
    longest = 0
    for p in range(starts.shape[0]):
        longest = max(longest, ends[p] - starts[p])
    dist = np.empty((4, longest), dtype=np.float32)
    nv = versions.shape[0]
    # records of 1 KiB and more (256-d): each spans 16+ cache lines and a posting several
    # pages, where the hardware prefetcher stops (at 50-d it kept up: no gain measured)
    wide = recs_f.shape[1] >= 256
    for p in range(starts.shape[0]):
        e0 = starts[p]
        e1 = ends[p]
        shift = id_starts[p] - e0
        if wide and p + 1 < starts.shape[0]:  # the next posting's rows load while this one is scanned
            for e in range(starts[p + 1], ends[p + 1]):
                prefetch_row(recs_f, e)
        t = q_lo[p]
        while t < q_hi[p]:
            # every record's distance first (dead ones too: no branch in the arithmetic), for
            # four queries at a time while four want the posting
            if q_hi[p] - t >= 4:
                to_block(metric, queries, q_idx[t], q_idx[t + 1], q_idx[t + 2], q_idx[t + 3], recs_f, e0, e1,
                         RECORD_HEADER_WORDS, dist)
                group = 4
            else:
                to_rows(metric, queries[q_idx[t]], recs_f, e0, e1, RECORD_HEADER_WORDS, dist[0])
                group = 1
            for g in range(group):
                qi = q_idx[t + g]
                hd = heap_d[qi]
                hi = heap_i[qi]
                size = sizes[qi]
                worst = hd[0] if size == hd.shape[0] else np.float32(np.inf)
                for e in range(e0, e1):
                    s = dist[g, e - e0]
                    if s > worst:
                        continue
                    if lazy:
                        vid = recs_u[e, 0]
                        ext = vid2ext[vid] if vid < nv and versions[vid] == recs_u[e, 1] else -1
                    else:
                        ext = ids[e + shift]
                    if ext < 0:
                        continue
                    if heap.accepts(hd, hi, size, s, ext) and not heap.contains(hi, size, ext):
                        size = heap.push(hd, hi, size, s, ext)
                        if size == hd.shape[0]:
                            worst = hd[0]
                sizes[qi] = size
            t += group


@nb.njit(**_q)
def merge_heaps(heap_d, heap_i, sizes, other_d, other_i, other_sizes):
    """Offer each entry of the heaps ``other_d/other_i`` (sizes ``other_sizes``) to the heaps
    ``heap_d/heap_i``, each id at most once (a replica may be in both): the heaps of two
    threads that scanned different postings of one batch, merged."""
    for qi in range(heap_d.shape[0]):
        hd = heap_d[qi]
        hi = heap_i[qi]
        size = sizes[qi]
        for t in range(other_sizes[qi]):
            s = other_d[qi, t]
            ext = other_i[qi, t]
            if heap.accepts(hd, hi, size, s, ext) and not heap.contains(hi, size, ext):
                size = heap.push(hd, hi, size, s, ext)
        sizes[qi] = size


@nb.njit(**_q)
def finish(heap_d, heap_i, sizes):
    """Sort each heap ascending by (distance, id); pad with +inf / -1."""
    for i in range(heap_d.shape[0]):
        heap.sort_inplace(heap_d[i], heap_i[i], sizes[i])
        for t in range(sizes[i], heap_d.shape[1]):
            heap_d[i, t] = np.inf
            heap_i[i, t] = -1
