"""numba kernels for every hot loop of vindex.

Pure functions over arrays: no I/O, no Python objects, no closures over index data. Query-path
kernels are ``nogil`` so searches run in parallel threads (``held`` calls them keeping the GIL,
for searches of a few queries); all are ``cache=True``. Call
:func:`warmup` before serving so compilation (or cache loading) happens up front.

numba checks a cached kernel against the timestamp of the file defining it only, not of the
files whose kernels it inlines or calls: after editing ``distances.py`` in a working tree,
delete ``native/__pycache__`` or ``scan.py``'s kernels keep the old code. (A fresh install
writes every file anew, so it recompiles all.)

Submodules load on first use (``native.graph`` imports numba then), so a process that only
opens an index, or a command-line tool that never searches, does not pay numba's import time
and memory (about 60 MB and half a second).
"""
from __future__ import annotations

import importlib

from .metrics import IP as IP, L2 as L2  # re-exported: native.L2, native.IP

_SUBMODULES = ("aps", "checksum", "codes", "distances", "fast", "filtered", "graph", "heap", "held", "idhash", "kept",
               "kept_table", "kmeans", "layout", "lire", "prefetch", "replicas", "rows", "scan")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def warmup() -> None:
    """Run every kernel once on tiny inputs of the exact types the library passes."""
    import numpy as np

    from . import distances, fast, filtered, graph, heap, held, idhash, kept, kmeans, lire, replicas, rows, scan

    rng = np.random.default_rng(0)
    d, n = 8, 40
    heads = rng.standard_normal((n, d)).astype(np.float32)
    nbrs = np.full((n, 8), -1, dtype=np.int32)
    visited = np.zeros(n, dtype=np.uint32)
    bd, bi, bx = np.empty(16, np.float32), np.empty(16, np.int32), np.empty(16, np.bool_)
    entries = graph.build(np.arange(n, dtype=np.int32), heads, nbrs, 4, 1.44, visited, bd, bi, bx)
    touched = np.zeros(n, np.uint8)
    removed = np.zeros(n, np.bool_)
    removed[3] = True
    graph.remove_nodes(removed, heads, nbrs, 1.44, touched)
    graph.insert_nodes(np.array([3], np.int32), heads, nbrs, entries[None], 1.44, visited, n + 30, bd, bi, bx,
                       touched)
    graph.connect(n, np.ones(n, np.bool_), entries, heads, nbrs, touched)
    q = heads[:2].copy()
    for unit in (False, True):
        rows.check_rows(q, unit, 1e37, np.empty_like(q))
    for metric in (distances.L2, distances.IP):
        ids = np.empty((2, 8), np.int32)
        dd = np.empty((2, 8), np.float32)
        counts = graph.search_batch(q, heads, nbrs, entries[None], metric, 8, 10.0, visited,
                                    n + 10, bd, bi, bx, ids, dd)
        graph.search_batch(q, heads, nbrs, entries[None], metric, 8, np.inf, visited,
                           n + 20, bd, bi, bx, ids, dd)
        held.search_batch(q, heads, nbrs, entries[None], metric, 8, 10.0, visited, n + 25, bd, bi, bx, ids, dd)
        graph.nearest_entries(q, np.ascontiguousarray(heads[entries]), entries, metric, 2, np.empty((2, 2), np.int32))
        distances.pairwise(metric, q, heads)
        graph.exact_search(q, heads, np.ones(n, np.bool_), metric, 8, 10.0, ids, dd)
        held.exact_search(q, heads, np.ones(n, np.bool_), metric, 8, 10.0, ids, dd)
        sq = np.einsum("ij,ij->i", heads, heads)
        heap.select_dot_rows(q @ heads.T, sq[:2], sq, np.ones(n, np.bool_), metric == distances.L2, 8, 10.0,
                             ids, dd)
        top_d, top_i, top_n = np.empty((2, 4), np.float32), np.empty((2, 4), np.int64), np.zeros(2, np.int32)
        heap.offer_dot_rows(q @ heads.T, sq, np.arange(n, dtype=np.int64), metric == distances.IP, top_d, top_i,
                            top_n)
        scan.finish(top_d, top_i, top_n)
    reps = np.empty((2, 4), np.int32)
    reps_d = np.empty((2, 4), np.float32)
    replicas.select(ids, dd, heads, 0.5, 1.0, reps, reps_d)
    replicas.select_parallel(ids, dd, heads, 0.5, 1.0, reps, reps_d)
    slot = np.full(n, -1, dtype=np.int32)
    pids, q_ptr, q_idx = scan.group_by_posting(ids, counts, slot)
    held.group_by_posting(ids, counts, slot)
    recs = np.zeros((4, d + 2), np.float32)
    recs[:, 2:] = heads[:4]
    data = np.frombuffer(bytearray(recs.tobytes()), dtype=np.uint8)  # writable, as stores return
    recs_f = np.frombuffer(data, dtype=np.float32).reshape(-1, d + 2)
    recs_u = recs_f.view(np.uint32)
    versions = np.zeros(8, np.uint8)
    vid2ext = np.arange(8, dtype=np.int64)
    live = scan.live_ids(recs_u, versions, vid2ext)
    held.live_ids(recs_u, versions, vid2ext)
    offsets = np.array([0, 4], dtype=np.int64)
    starts, ends = offsets[:-1], offsets[1:]
    scan.live_ids_ranges(recs_u, starts, ends, versions, vid2ext)
    held.live_ids_ranges(recs_u, starts, ends, versions, vid2ext)
    one_ptr = np.array([0, 2], dtype=np.int64)
    one_idx = np.array([0, 1], dtype=np.int32)
    for metric in (distances.L2, distances.IP):
        hd = np.empty((2, 3), np.float32)
        hi = np.empty((2, 3), np.int64)
        sizes = np.zeros(2, np.int32)
        for kernels in (scan, held):
            sizes[:] = 0
            kernels.scan_grouped(recs_f, starts, ends, live, starts, one_ptr[:-1], one_ptr[1:], one_idx, q, metric,
                                 hd, hi, sizes)
            kernels.finish(hd, hi, sizes)
        table = np.full((4, 5), -1, np.int64)
        table[1] = (0, 4, 1, 3, 0)  # posting 1: rows 0..3, whole, generation 1, one chunk
        spans, gens = np.array([0, 1], np.int64), np.array([0, 1], np.int64)
        for kernels in (fast, held):
            sizes[:] = 0
            kernels.scan_resident(ids, counts, slot, table, recs_f, recs_u, gens, spans, versions, vid2ext, q, metric,
                                  hd, hi, sizes, fast.NO_CODES)
        for exact, kernels in ((False, fast), (True, fast), (False, held), (True, held)):
            sizes[:] = 0
            kernels.search_resident(q, metric, 8, 10.0, exact, heads, nbrs, np.ones(n, np.bool_), entries[None], visited,
                                 n + 40, bd, bi, bx, ids, dd, slot, table, recs_f, recs_u, gens, spans, versions,
                                 vid2ext, hd, hi, sizes, fast.NO_CODES)
    from . import codes

    lo, scale = np.full(d, -1, np.float32), np.full(d, 2 / 255, np.float32)
    code_u = np.zeros((4, 2 + (d + 3) // 4), np.uint32)  # a code record's words
    grouped = (np.array([1], np.int32), one_ptr, one_idx)
    for metric in (distances.L2, distances.IP):
        cand_d, cand_v, cand_n = np.empty((2, 3), np.float32), np.empty((2, 3), np.int64), np.zeros(2, np.int32)
        for scan_codes, rerank in ((codes.scan_codes, codes.rerank), (codes.scan_codes_held, codes.rerank_held)):
            scan_codes(*grouped, ids, counts, table, code_u, code_u.view(np.uint8), gens, spans, versions, vid2ext, q,
                       metric, lo, scale, cand_d, cand_v, cand_n)
            rerank(cand_d, cand_v, cand_n, -1, q, metric, vid2ext, hd, hi, sizes, np.float32(0.1))
    read_only = np.frombuffer(recs.tobytes(), dtype=np.float32).reshape(-1, d + 2)  # a commit's bytes
    for rows_f in (recs_f, read_only):
        rows_u = rows_f.view(np.uint32)
        codes.encode(rows_u, rows_f, lo, 1 / scale, code_u, code_u.view(np.uint8))
        codes.newer_rows(rows_u, np.full(8, 0xFF, np.uint8))
        codes.write_vectors(-1, rows_u, rows_f, np.zeros(0, np.int64))
    filtered.pick(recs_u, starts, ends, np.ones(8, np.bool_), versions, vid2ext, np.empty((4, d + 2), np.uint32),
                  np.empty(4, np.int64), 0, np.zeros(8, np.bool_))
    for metric in (distances.L2, distances.IP):
        filtered.top_k(recs_f, live, q, metric, 3, 256, np.float32(0.5))
        filtered.top_k_held(recs_f, live, q, metric, 3, 256, np.float32(0.5))
    labels = np.full(4, -1, np.int64)
    cents = np.zeros((2, d), np.float32)
    keep, n_live = lire.live_dedupe(recs_u, offsets, versions, np.full(8, -1, np.int64))
    lire.split(recs_f, keep, offsets, np.array([2], np.int64), np.array([0, 2], np.int64), 4, 1.0,
               labels, cents)
    lire.reassign_candidates(recs_f, keep, offsets, heads[:1].copy(), np.array([0], np.int64),
                             np.array([0], np.int64), np.array([True]), heads[:1].copy(),
                             np.array([0, 2], np.int64), cents)
    lire.copies_named(recs_u, offsets, np.array([0, 1], np.int64), np.array([7], np.int64))
    lire.scrub_doubts(recs_f, keep, offsets, np.array([0], np.int64), np.zeros(4, np.int32), heads, nbrs,
                      np.ones(n, np.bool_), 0.5, 1.0)
    kmeans.balanced_kmeans(heads, 3, 2, 1.0, np.empty(n, np.int64), np.empty((3, d), np.float32))
    kept.usable(np.full((2, 5), -1, np.int64), np.zeros(2, np.int64), np.ones(2, np.int64))
    kept.find(np.full((4, 5), -1, np.int64), np.arange(2, dtype=np.int64))
    table = np.full(32, -1, dtype=np.int32)
    idhash.rebuild(table, vid2ext, 8)
    idhash.insert(np.full(32, -1, dtype=np.int32), vid2ext, np.arange(8, dtype=np.int64))
    idhash.lookup(table, vid2ext, np.arange(10, dtype=np.int64))
    _ = pids, q_ptr, q_idx
    from . import aps, checksum, layout

    aps.warm()

    block, sums = np.zeros(checksum.BLOCK, np.uint8), np.empty(1, np.uint32)
    checksum.block_sums(block, 1, sums)
    checksum.first_bad(block, sums)
    one = np.zeros(1, np.int64)
    layout.check_and_compact(block, sums, one, one, one)
    held.check_and_compact(block, sums, one, one, one)
