"""Filtered search kernels: gathering a filter's matching records out of their postings, and
scoring just them."""
from __future__ import annotations

import numba as nb
import numpy as np

from . import scan


@nb.njit(cache=True, nogil=True)
def pick(rows_u, starts, ends, allowed, versions, vid2ext, out_rows, out_ids, n_out, taken):
    """Copy each record of ``rows_u[starts[j]:ends[j]]`` (for every ``j``) that ``allowed``
    marks and that is live against ``versions`` into ``out_rows[n_out:]`` (its external id
    into ``out_ids``), once per vid (``taken``: per vid, set on copy; replicas of a record
    carry the same version). Returns the new ``n_out``; stops when ``out_rows`` is full."""
    n = allowed.shape[0]
    for j in range(starts.shape[0]):
        for e in range(starts[j], ends[j]):
            vid = rows_u[e, 0]
            if vid >= n or not allowed[vid] or taken[vid] or versions[vid] != rows_u[e, 1]:
                continue
            if n_out == out_rows.shape[0]:
                return n_out
            taken[vid] = True
            out_rows[n_out, :] = rows_u[e, :]
            out_ids[n_out] = vid2ext[vid]
            n_out += 1
    return n_out


@nb.njit(cache=True, nogil=True)
def top_k(rows_f, ids, queries, metric, k, piece, scale):
    """Exact top-``k`` ``(ids (nq, k) int64, distances (nq, k) float32)`` of ``queries``
    over records ``rows_f`` (posting rows: header words, then the vector) with external
    ``ids``, sorted by (distance, id) and padded with -1 / +inf: rows in pieces of ``piece``,
    each scored by every query while it is in cache. Distances come out times ``scale``
    (0.5 turns cosine's squared distances of unit vectors into 1 - cos: no numpy call after)."""
    nq, m = queries.shape[0], rows_f.shape[0]
    heap_d = np.empty((nq, k), dtype=np.float32)
    heap_i = np.empty((nq, k), dtype=np.int64)
    sizes = np.zeros(nq, dtype=np.int32)
    starts = np.arange(0, m, piece).astype(np.int64)
    ends = np.minimum(starts + piece, m)
    q_lo = np.zeros(starts.shape[0], dtype=np.int64)
    q_hi = np.full(starts.shape[0], nq, dtype=np.int64)
    scan.scan_grouped(rows_f, starts, ends, ids, starts, q_lo, q_hi, np.arange(nq).astype(np.int32), queries,
                      metric, heap_d, heap_i, sizes)
    scan.finish(heap_d, heap_i, sizes)
    if scale != 1.0:
        for i in range(nq):
            for j in range(k):
                heap_d[i, j] *= scale
    return heap_i, heap_d


@nb.njit(cache=True)
def top_k_held(rows_f, ids, queries, metric, k, piece, scale):
    """:func:`top_k`, GIL held (``native.held``: a few queries)."""
    return top_k(rows_f, ids, queries, metric, k, piece, scale)
