"""Scalar int8 posting codes: encode records, scan codes into candidate heaps, rerank exactly.

A code record is ``[vid u32][version u32][dim uint8 codes, padded to whole words]``: the
posting record's header, then each dimension quantized as ``round((x - lo) / scale)`` clipped
to 0..255 (``lo``/``scale`` per dimension, see ``vindex.storage.codes``). A scan estimates a
record's distance from its codes; the best ``rerank`` candidates of each query are then
scored exactly against their float32 vectors, read with ``pread`` from the vector file (one
row per vid), and offered to the exact top-k heaps.

``rerank`` and ``write_vectors`` call libc's ``pread``/``pwrite`` through ctypes: numba
cannot cache a kernel that holds a foreign function's address, so those two compile once per
process (``native.warmup`` does it up front).
"""
from __future__ import annotations

import ctypes

import numba as nb
import numpy as np

from . import heap
from .distances import FASTMATH, to_picked, to_rows
from .kept import resident_whole
from .metrics import L2
from .scan import RECORD_HEADER_WORDS, nearest_first

_q = dict(cache=True, nogil=True, fastmath=FASTMATH)
_io = dict(nogil=True, fastmath=FASTMATH)  # not cached: calls libc through ctypes

HEADER_BYTES = 8

_libc = ctypes.CDLL(None, use_errno=True)
_pread = _libc.pread
_pread.restype = ctypes.c_ssize_t
_pread.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64)
_pwrite = _libc.pwrite
_pwrite.restype = ctypes.c_ssize_t
_pwrite.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64)


@nb.njit(**_q)
def encode(recs_u, recs_f, lo, inv_scale, out_u, out_b):
    """Code records of float32 records ``recs_u``/``recs_f`` (``(n, dim + 2)`` views of the
    same rows) into ``out_u``/``out_b`` (``(n, words)`` uint32 and its bytes). Returns per
    record whether clipping to the range moved it further than rounding does (squared, in
    steps: rounding's is ``dim / 12`` on average): such a record would be misplaced
    (vectors that drifted past the trained range all share the end codes, and their
    estimates tie), so its posting is not coded. A tail value a few steps out is coded."""
    dim = lo.shape[0]
    clipped = np.zeros(recs_u.shape[0], dtype=np.bool_)
    budget = max(np.float32(dim) / np.float32(12.0), np.float32(1.0))
    for e in range(recs_u.shape[0]):
        out_u[e, 0] = recs_u[e, 0]
        out_u[e, 1] = recs_u[e, 1]
        excess = np.float32(0.0)
        for d in range(dim):
            c = (recs_f[e, 2 + d] - lo[d]) * inv_scale[d] + np.float32(0.5)
            if c < 0:
                excess += c * c
                c = 0
            elif c > 256:
                excess += (c - 256) * (c - 256)
                c = 255
            elif c > 255:
                c = 255
            out_b[e, HEADER_BYTES + d] = np.uint8(c)
        clipped[e] = excess > budget
        for d in range(HEADER_BYTES + dim, out_b.shape[1]):
            out_b[e, d] = 0
    return clipped


@nb.njit(**_q)
def _prepare(queries, metric, lo, scale):
    """Per query, what a code distance needs: for L2 ``q - lo`` (then ``sum (t - c*scale)^2``),
    for IP ``q * scale`` and ``-q.lo`` (then ``-q.lo - sum (q*scale) * c``)."""
    nq, dim = queries.shape
    t = np.empty((nq, dim), dtype=np.float32)
    base = np.zeros(nq, dtype=np.float32)
    for i in range(nq):
        for d in range(dim):
            if metric == L2:
                t[i, d] = queries[i, d] - lo[d]
            else:
                t[i, d] = queries[i, d] * scale[d]
                base[i] -= queries[i, d] * lo[d]
    return t, base


@nb.njit(inline="always", **_q)
def _code_rows(metric, t, base, scale, codes_b, e0, e1, out):
    """``out[e - e0]``: the estimated distance of code record ``e`` for ``e0 <= e < e1``
    (``t``, ``base``: the query's, from ``_prepare``). Four records share each pass over the
    dimensions (independent sums keep the FPU busy, as ``distances.to_rows``)."""
    dim = t.shape[0]
    last = e1 - 1
    h = HEADER_BYTES
    for e in range(e0, e1, 4):
        e_1 = min(e + 1, last)
        e_2 = min(e + 2, last)
        e_3 = min(e + 3, last)
        s0 = np.float32(0.0)
        s1 = np.float32(0.0)
        s2 = np.float32(0.0)
        s3 = np.float32(0.0)
        if metric == L2:
            for d in range(dim):
                x = t[d]
                w = scale[d]
                a = x - np.float32(codes_b[e, h + d]) * w
                b = x - np.float32(codes_b[e_1, h + d]) * w
                c = x - np.float32(codes_b[e_2, h + d]) * w
                f = x - np.float32(codes_b[e_3, h + d]) * w
                s0 += a * a
                s1 += b * b
                s2 += c * c
                s3 += f * f
        else:
            for d in range(dim):
                x = t[d]
                s0 -= x * np.float32(codes_b[e, h + d])
                s1 -= x * np.float32(codes_b[e_1, h + d])
                s2 -= x * np.float32(codes_b[e_2, h + d])
                s3 -= x * np.float32(codes_b[e_3, h + d])
            s0 += base
            s1 += base
            s2 += base
            s3 += base
        out[e - e0] = s0
        out[e_1 - e0] = s1
        out[e_2 - e0] = s2
        out[e_3 - e0] = s3


@nb.njit(**_q)
def scan_codes(pids, q_ptr, q_idx, sel, counts, table, codes_u, codes_b, gens, spans, versions, vid2ext, queries,
               metric, lo, scale, cand_d, cand_v, cand_n):
    """Scan the code records of postings ``pids`` (each wanted by queries
    ``q_idx[q_ptr[p]:q_ptr[p+1]]``, in ``scan.nearest_first`` order of the heads chosen,
    ``sel``/``counts``) that the code table holds whole and current
    (``fast.resident_whole``) into per-query candidate heaps ``cand_d``/``cand_v`` (estimated
    distance, vid; sizes ``cand_n``), live records only, each vid once. Returns ``(miss pids,
    q_ptr, q_idx, postings scanned, records scanned)``, the misses grouped as given."""
    n = pids.shape[0]
    t, base = _prepare(queries, metric, lo, scale)
    dist = np.empty(256, dtype=np.float32)
    nv = versions.shape[0]
    hit = np.zeros(n, dtype=np.bool_)
    n_hit = 0
    scanned = 0
    m_ptr = np.zeros(n + 1, dtype=np.int64)
    m_idx = np.empty(q_ptr[n], dtype=np.int32)
    miss = np.empty(n, dtype=np.int32)
    n_miss = 0
    for p in range(n):  # the misses by pid, for the store
        if resident_whole(table, pids[p], gens, spans):
            hit[p] = True
            n_hit += 1
            continue
        miss[n_miss] = pids[p]
        lo_q = m_ptr[n_miss]
        for j in range(q_ptr[p], q_ptr[p + 1]):
            m_idx[lo_q + j - q_ptr[p]] = q_idx[j]
        m_ptr[n_miss + 1] = lo_q + q_ptr[p + 1] - q_ptr[p]
        n_miss += 1
    for p in nearest_first(sel, counts, pids):
        if not hit[p]:
            continue
        pid = pids[p]
        e0 = table[pid, 0]
        e1 = e0 + table[pid, 1]
        scanned += (e1 - e0) * (q_ptr[p + 1] - q_ptr[p])
        if dist.shape[0] < e1 - e0:
            dist = np.empty(2 * (e1 - e0), dtype=np.float32)
        for j in range(q_ptr[p], q_ptr[p + 1]):
            qi = q_idx[j]
            hd = cand_d[qi]
            hv = cand_v[qi]
            size = cand_n[qi]
            worst = hd[0] if size == hd.shape[0] else np.float32(np.inf)
            _code_rows(metric, t[qi], base[qi], scale, codes_b, e0, e1, dist)
            for e in range(e0, e1):
                s = dist[e - e0]
                if s > worst:
                    continue
                vid = codes_u[e, 0]
                if vid >= nv or versions[vid] != codes_u[e, 1] or vid2ext[vid] < 0:
                    continue
                v = np.int64(vid)
                if heap.accepts(hd, hv, size, s, v) and not heap.contains(hv, size, v):
                    size = heap.push(hd, hv, size, s, v)
                    if size == hd.shape[0]:
                        worst = hd[0]
            cand_n[qi] = size
    return miss[:n_miss].copy(), m_ptr[:n_miss + 1].copy(), m_idx[:m_ptr[n_miss]].copy(), n_hit, scanned


@nb.njit(**_q)
def scan_kept(queries, metric, lo, scale, err, rows, code_rows, lengths, codes_b, rows_f, rows_u, versions, vid2ext,
              heap_d, heap_i, sizes):
    """One query's (``queries`` is ``(1, dim)``) scan of postings kept both as float32 and
    as codes: posting ``j`` is ``lengths[j]`` records from row ``rows[j]`` of
    ``rows_f``/``rows_u`` (the float32 ring) and from row ``code_rows[j]`` of ``codes_b``
    (the codes' ring), in the same order. Every record's distance is estimated from its code
    (a quarter of the bytes to fetch); then live records are scored exactly, nearest
    estimate first, into the heaps until ``_beyond`` says no record left can enter them.
    The heaps end as a scan of the float32 rows would leave them, but for the last bit of
    a distance: numba inlines and vectorizes the sum anew in each kernel, and fastmath lets
    it sum in another order here than in ``scan.scan_records`` (a record scanned both ways,
    as a replica in two postings, may then show either distance; one id, as everywhere).
    Returns the records scored exactly."""
    query = queries[0]
    prepared, bases = _prepare(queries, metric, lo, scale)
    t, base = prepared[0], bases[0]
    q_sq = np.float32(0.0)
    for d in range(query.shape[0]):
        q_sq += query[d] * query[d]
    total = 0
    for j in range(lengths.shape[0]):
        total += lengths[j]
    est = np.empty(total, dtype=np.float32)
    row = np.empty(total, dtype=np.int64)
    n = 0
    for j in range(lengths.shape[0]):
        _code_rows(metric, t, base, scale, codes_b, code_rows[j], code_rows[j] + lengths[j], est[n:])
        for e in range(lengths[j]):
            row[n + e] = rows[j] + e
        n += lengths[j]
    heap.heapify_min(est, row, n)
    q_norm = np.float32(np.sqrt(q_sq))
    picked = np.empty(4, dtype=np.int64)
    ids = np.empty(4, dtype=np.int64)
    dist = np.empty(4, dtype=np.float32)
    k = heap_d.shape[1]
    nv = versions.shape[0]
    hd = heap_d[0]
    hi = heap_i[0]
    size = sizes[0]
    scored = 0
    done = False
    while not done:
        g = 0  # four live records to a pass, as ``to_rows`` sums
        while g < 4:
            if n == 0 or (size == k and _beyond(metric, est[0], err, q_norm, hd[0])):
                done = True
                break
            r = row[0]
            n = heap.pop_min(est, row, n)
            vid = rows_u[r, 0]
            ext = vid2ext[vid] if vid < nv and versions[vid] == rows_u[r, 1] else -1
            if ext >= 0:
                picked[g] = r
                ids[g] = ext
                g += 1
        to_picked(metric, query, rows_f, picked, g, RECORD_HEADER_WORDS, dist)
        scored += g
        for j in range(g):
            if heap.accepts(hd, hi, size, dist[j], ids[j]) and not heap.contains(hi, size, ids[j]):
                size = heap.push(hd, hi, size, dist[j], ids[j])
    sizes[0] = size
    return scored


@nb.njit(**_io)
def rerank(cand_d, cand_v, cand_n, fd, queries, metric, vid2ext, heap_d, heap_i, sizes, err):
    """Score the candidates exactly against their float32 vectors (row ``vid`` of the vector
    file ``fd``), nearest estimate first, with the scan kernels' arithmetic
    (``distances.to_rows``: the same distance, bit for bit, as a scan of the float32 posting
    gives) and offer them to the exact heaps; a candidate whose row cannot be read keeps its
    estimate. Returns the rows read.

    ``err`` bounds how far a coded vector lies from its float32 one (``|x - x_hat|``; see
    ``vindex.storage.codes``), so a candidate whose estimate, less that, is still farther
    than a full heap's worst cannot enter it, nor can any after it: the rerank stops there,
    with the heaps it would have left, reading a fraction of the candidates' rows."""
    dim = queries.shape[1]
    rows = np.empty((4, dim), dtype=np.float32)
    got = np.zeros(4, dtype=np.bool_)
    dist = np.empty(4, dtype=np.float32)
    nbytes = dim * 4
    reads = 0
    k = heap_d.shape[1]
    for qi in range(cand_n.shape[0]):
        n = cand_n[qi]
        if n == 0:
            continue
        order = np.argsort(cand_d[qi, :n])
        q = queries[qi]
        q_sq = np.float32(0.0)
        for d in range(dim):
            q_sq += q[d] * q[d]
        q_norm = np.float32(np.sqrt(q_sq))
        hd = heap_d[qi]
        hi = heap_i[qi]
        size = sizes[qi]
        for c0 in range(0, n, 4):
            if size == k and _beyond(metric, cand_d[qi, order[c0]], err, q_norm, hd[0]):
                break
            g = min(4, n - c0)
            for j in range(g):
                vid = cand_v[qi, order[c0 + j]]
                got[j] = _pread(fd, rows[j].ctypes.data, nbytes, vid * nbytes) == nbytes
            reads += g
            to_rows(metric, q, rows, 0, g, 0, dist)
            for j in range(g):
                c = order[c0 + j]
                ext = vid2ext[cand_v[qi, c]]
                if ext < 0:
                    continue
                s = dist[j] if got[j] else cand_d[qi, c]
                if heap.accepts(hd, hi, size, s, ext) and not heap.contains(hi, size, ext):
                    size = heap.push(hd, hi, size, s, ext)
        sizes[qi] = size
    return reads


@nb.njit(inline="always", **_q)
def _beyond(metric, estimate, err, q_norm, worst):
    """True if a vector whose code's distance is ``estimate`` is surely farther than
    ``worst``: by the triangle inequality ``|q - x| >= |q - x_hat| - err`` (L2, distances
    squared), ``-q.x >= -q.x_hat - |q| err`` (IP); a relative 1e-4 covers the float32 sums'
    rounding."""
    slack = np.float32(1e-4)
    if metric == L2:
        low = np.float32(np.sqrt(max(estimate, np.float32(0.0)))) * (1 - slack) - err
        return low > 0 and low * low > worst * (1 + slack) + slack * abs(worst)
    return estimate - q_norm * err - slack * abs(estimate) > worst + slack * abs(worst)


@nb.njit(**_q)
def newer_rows(recs_u, file_versions):
    """Rows of ``recs_u`` whose vector the vector file lacks: its vid has no row yet (version
    0xFF), or an older version (a vid's versions only grow: one that would wrap moves to a
    new vid). Marks them written in ``file_versions``."""
    n = recs_u.shape[0]
    out = np.empty(n, dtype=np.int64)
    m = 0
    for e in range(n):
        vid = recs_u[e, 0]
        ver = recs_u[e, 1]
        if vid >= file_versions.shape[0]:
            continue
        have = file_versions[vid]
        if have == 0xFF or ver > have:
            file_versions[vid] = ver
            out[m] = e
            m += 1
    return out[:m].copy()


@nb.njit(**_io)
def write_vectors(fd, recs_u, recs_f, rows):
    """pwrite the vectors of records ``rows`` to their vid's row of the vector file; returns
    how many writes fell short (a full disk)."""
    dim = recs_f.shape[1] - 2
    nbytes = dim * 4
    buf = np.empty(dim, dtype=np.float32)
    short = 0
    for e in rows:
        for d in range(dim):
            buf[d] = recs_f[e, 2 + d]
        vid = np.int64(recs_u[e, 0])
        if _pwrite(fd, buf.ctypes.data, nbytes, vid * nbytes) != nbytes:
            short += 1
    return short


# Entry points that keep the GIL, for searches of a few queries (see ``native.held``: each
# release costs a search a hand-off beside a thread running Python): a search served by
# its kept postings and its codes then releases the GIL not once.
@nb.njit(cache=True)
def scan_codes_held(pids, q_ptr, q_idx, sel, counts, table, codes_u, codes_b, gens, spans, versions, vid2ext, queries,
                    metric, lo, scale, cand_d, cand_v, cand_n):
    """:func:`scan_codes`, GIL held."""
    return scan_codes(pids, q_ptr, q_idx, sel, counts, table, codes_u, codes_b, gens, spans, versions, vid2ext,
                      queries, metric, lo, scale, cand_d, cand_v, cand_n)


@nb.njit
def rerank_held(cand_d, cand_v, cand_n, fd, queries, metric, vid2ext, heap_d, heap_i, sizes, err):
    """:func:`rerank`, GIL held (not cached either)."""
    return rerank(cand_d, cand_v, cand_n, fd, queries, metric, vid2ext, heap_d, heap_i, sizes, err)
