"""The search path: head-graph search -> grouped posting reads -> scan -> top-k
(docs/search-path.md).

A search of up to ``SMALL_SEARCH_QUERIES`` queries first scans the postings the store keeps
in memory where they lie, in one kernel call (``RocksStore.scan_resident``), and reads only
the others. A batch is grouped by posting, so each posting is read from the store once per
batch however many queries want it, and scanned while it is in cache for all of them. Reads
go in pieces of ``READ_CHUNK`` postings to bound memory; the per-query heaps carry over
between pieces.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from vindex import native

from .config import SMALL_SEARCH_QUERIES
from .heads import HeadGraph, scratch
from .idmap import IdMap
from .errors import DeadlineExpired
from .readers import Readers
from .storage import IOClass, PostingBatch, PostingStore, records

#: Postings per store read; bounds the bytes held at once (~25 KB each by default).
READ_CHUNK = 2048

#: Head selections a search makes before it accepts one that heads created meanwhile may
#: have outdated.
SELECT_ATTEMPTS = 3


class SearchThreads:
    """The threads that run the pieces of a batch searched with ``threads=N``: N - 1 of
    them, started on first use (the calling thread runs a piece too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._size = 0
        # smaller pools a larger ``threads`` replaced: another search may still submit to
        # one it took before, so they are shut down only with the index
        self._retired: list[ThreadPoolExecutor] = []

    def map(self, fn: Callable, pieces: list) -> list:
        """``[fn(p) for p in pieces]``, the pieces after the first on the pool's threads."""
        with self._lock:
            if self._size < len(pieces) - 1:
                if self._pool is not None:
                    self._retired.append(self._pool)
                self._size = len(pieces) - 1
                self._pool = ThreadPoolExecutor(self._size, thread_name_prefix="vindex-search")
            pool = self._pool
        futures = [pool.submit(fn, p) for p in pieces[1:]]
        first = fn(pieces[0])
        return [first] + [f.result() for f in futures]

    def close(self) -> None:
        with self._lock:
            pools, self._retired = [*self._retired, *([self._pool] if self._pool else [])], []
            self._pool, self._size = None, 0
        for pool in pools:
            pool.shutdown(wait=True)


def search_threads(queries: np.ndarray, k: int, *, threads: int, pool: SearchThreads, **kwargs
                   ) -> tuple[np.ndarray, np.ndarray, dict]:
    """``search`` on up to ``threads`` threads (the kernels release the GIL): the heads of a
    batch are chosen in pieces of its queries, one per thread, and its postings are read and
    scanned in pieces of postings that the threads take in turn, each for every query that
    wants them, into heaps of its own, merged at the end. So each posting is read, and its
    records' ids mapped, once per batch however many threads share it (cut into pieces of
    queries, every piece of a large batch read nearly every posting). A piece of queries has
    more than ``SMALL_SEARCH_QUERIES``: smaller batches run the kernels that keep the GIL,
    and would take turns. Results and counters as ``search``'s."""
    nq = queries.shape[0]
    n = min(threads, nq // (SMALL_SEARCH_QUERIES + 1))
    return search(queries, k, parallel=(pool, n) if n > 1 else None, **kwargs)


def search(queries: np.ndarray, k: int, *, graph: HeadGraph, idmap: IdMap, store: PostingStore,
           readers: Readers, metric: int, max_postings: int, eps: float, ef: int,
           io: IOClass = IOClass.INTERACTIVE, deadline: float | None = None, tenant: str = "default",
           choose: Callable[[np.ndarray, bool], tuple[np.ndarray, np.ndarray]] | None = None,
           versions: Callable[[np.ndarray], np.ndarray] | None = None, rerank: int = 0,
           parallel: tuple[SearchThreads, int] | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """Top-``k`` ``(ext ids (nq, k) int64, internal distances (nq, k) float32)``, padded, and
    work counters: postings read (once each per batch), records scanned (summed over
    queries: the distance computations) and postings dropped (reads the I/O scheduler dropped
    because they were still queued at ``deadline``, a ``time.monotonic()`` time; the result
    then covers only the postings read).

    Heads are chosen before postings are read. If heads appear in between (a split, or new
    heads for an upsert far from every posting) and an upsert writes a vector's new copy there,
    the chosen postings hold only its old, now stale copy and the search would miss it. So a
    search whose read section sees a newer head generation than its choice starts over.

    A filtered search (see ``filtered``) passes ``choose(queries, held) -> (head ids,
    counts)``, the postings to scan instead of the graph's nearest, and ``versions(live
    version map) -> version map`` that marks the records it must skip as deleted.

    ``rerank`` > 0: a small search scans the postings it did not find kept as float32 as
    the store's int8 codes where it has them, and scores its best ``rerank`` candidates
    exactly (``RocksStore.scan_codes``).

    ``parallel`` ``(pool, n)``: a batch of over ``n * SMALL_SEARCH_QUERIES`` queries on
    ``n`` threads (see ``search_threads``)."""
    for attempt in range(SELECT_ATTEMPTS):
        out = _search_once(queries, k, graph, idmap, store, readers, metric, (max_postings, eps, ef), choose,
                           versions, io, deadline, tenant, rerank, parallel, last=attempt == SELECT_ATTEMPTS - 1)
        if out is not None:
            return out
    raise AssertionError("unreachable: the last attempt always returns")


def _search_once(queries, k, graph, idmap, store, readers, metric, heads, choose, versions, io, deadline, tenant,
                 rerank, parallel, *, last: bool):
    """One attempt of ``search``; None when it must start over (see there). ``heads``:
    ``(max_postings, eps, ef)`` of the graph's choice when ``choose`` is None."""
    nq = queries.shape[0]
    heap_d = np.empty((nq, k), dtype=np.float32)
    heap_i = np.empty((nq, k), dtype=np.int64)
    sizes = np.zeros(nq, dtype=np.int32)
    generation = graph.generation
    held = nq <= SMALL_SEARCH_QUERIES  # small searches keep the GIL (``native.held``)
    fused = _search_fused(queries, graph, idmap, store, readers, metric, heads, versions, heap_d, heap_i, sizes,
                          tenant, generation, last, rerank > 0) if held and choose is None else None
    if fused is RETRY:
        return None
    if fused is not None:
        head_ids, counts, grouped = fused
    else:
        head_ids, counts = _choose(queries, graph, metric, heads, choose, held, parallel)
        grouped = None
        resident = getattr(store, "scan_resident", None) if held else None
        if resident is not None:  # postings kept in memory scanned where they lie
            with readers.reading():
                if graph.generation != generation and not last:
                    return None
                live = idmap.versions if versions is None else versions(idmap.versions)
                grouped = resident(head_ids, counts, scratch().slots(graph.capacity), queries, metric, live,
                                   idmap.vid2ext, heap_d, heap_i, sizes, tenant, rerank > 0)
    if grouped is not None and grouped[0].shape[0] and rerank:  # the misses' codes, where the store has them
        with readers.reading():
            if graph.generation != generation and not last:
                return None
            live = idmap.versions if versions is None else versions(idmap.versions)
            grouped = store.scan_codes(grouped, head_ids, counts, queries, metric, live, idmap.vid2ext, heap_d, heap_i,
                                       sizes, rerank, tenant)
        if not grouped[0].shape[0]:  # the rest were coded: sorted here
            native.held.finish(heap_d, heap_i, sizes)
    if grouped is not None and not grouped[0].shape[0]:  # every posting was kept (the kernel sorted the heaps)
        return heap_i, heap_d, {"postings": grouped[3], "records_scanned": grouped[4], "postings_dropped": 0}
    return _read_rest(queries, head_ids, counts, grouped, graph, idmap, store, readers, metric, versions, io,
                      deadline, tenant, generation, last, heap_d, heap_i, sizes, parallel)


def _choose(queries, graph, metric, heads, choose, held, parallel) -> tuple[np.ndarray, np.ndarray]:
    """Each query's postings ``(head ids (nq, m), counts)``: the graph's nearest heads, or
    ``choose``'s; with ``parallel``, in pieces of the queries on the pool's threads."""
    def one(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if choose is None:
            ids, _, counts = graph.search(q, metric, heads[0], heads[1], heads[2], held=held)
            return ids, counts
        return choose(q, held)

    if parallel is None:
        return one(queries)
    pool, n = parallel
    bounds = np.linspace(0, queries.shape[0], n + 1).astype(np.int64).tolist()
    parts = pool.map(lambda lh: one(queries[lh[0]:lh[1]]), list(zip(bounds, bounds[1:])))
    width = max(p[0].shape[1] for p in parts)  # (a filter's choice may differ in width by piece)
    ids = np.full((queries.shape[0], width), -1, dtype=np.int32)
    for (lo, hi), (piece, _) in zip(zip(bounds, bounds[1:]), parts):
        ids[lo:hi, :piece.shape[1]] = piece
    return ids, np.concatenate([p[1] for p in parts])


#: ``_search_fused``'s answer when the heads it chose may be outdated: search again.
RETRY = object()


def _search_fused(queries, graph, idmap, store, readers, metric, heads, versions, heap_d, heap_i, sizes, tenant,
                  generation, last, coded):
    """Head search and resident scan in one kernel call (``RocksStore.search_resident``;
    ``coded``: kept postings may be scanned as their codes first): ``(head ids, counts,
    grouped misses or None for every posting)``, ``RETRY``, or None where the fused path
    does not apply (another store, no live head, BLAS head scoring, nothing kept, a commit
    landing)."""
    fused = getattr(store, "search_resident", None)
    if fused is None:
        return None
    nq = queries.shape[0]
    m, eps, ef = heads
    head_args = graph.fused_args(nq, m, ef)
    if head_args is None:
        return None
    s = scratch()
    sel, sel_d = s.chosen_arrays(nq, m)
    with readers.reading():
        live = idmap.versions if versions is None else versions(idmap.versions)
        out = fused(head_args, m, eps, sel, sel_d, s.slots(graph.capacity), queries, metric, live, idmap.vid2ext,
                    heap_d, heap_i, sizes, tenant, coded)
        if out is not None and graph.generation != generation and not last:
            return RETRY
    if out is None:
        return None
    counts, grouped = out
    return sel, counts, grouped


def _read_rest(queries, head_ids, counts, grouped, graph, idmap, store, readers, metric, versions, io, deadline,
               tenant, generation, last, heap_d, heap_i, sizes, parallel=None):
    """Read from the store and scan the postings the resident scan left (``grouped``: its
    misses, counters; None: every chosen posting), then sort the heaps. With ``parallel``
    ``(pool, n)``, ``n`` threads take pieces of the postings in turn, each scanning into heaps
    of its own (the first thread into the caller's), merged before the sort."""
    held = queries.shape[0] <= SMALL_SEARCH_QUERIES
    kernels = native.held if held else native.scan
    if grouped is None:
        pids, q_ptr, q_idx = kernels.group_by_posting(head_ids, counts, scratch().slots(graph.capacity))
        postings = scanned = 0
    else:
        pids, q_ptr, q_idx, postings, scanned = grouped
    n_threads = 1 if parallel is None else parallel[1]
    step = READ_CHUNK if n_threads == 1 else max(PARALLEL_CHUNK_MIN, min(READ_CHUNK, -(-pids.shape[0] // (
        PARALLEL_CHUNKS * n_threads))))
    pieces = _Pieces(pids.shape[0], step)
    args = (pieces, queries, pids, q_ptr, q_idx, graph, idmap, store, readers, metric, versions, io, deadline, tenant,
            generation, last, kernels)
    if parallel is None:
        outs = [_scan_pieces(*args, heap_d, heap_i, sizes)]
    else:
        nq, k = heap_d.shape
        heaps = [(heap_d, heap_i, sizes)] + [
            (np.empty((nq, k), np.float32), np.empty((nq, k), np.int64), np.zeros(nq, np.int32))
            for _ in range(n_threads - 1)]
        outs = parallel[0].map(lambda h: _scan_pieces(*args, *h), heaps)
        if all(o is not None for o in outs):
            for other_d, other_i, other_sizes in heaps[1:]:
                native.scan.merge_heaps(heap_d, heap_i, sizes, other_d, other_i, other_sizes)
    if any(o is None for o in outs):
        return None
    kernels.finish(heap_d, heap_i, sizes)
    return heap_i, heap_d, {"postings": postings + sum(o[0] for o in outs),
                            "records_scanned": scanned + sum(o[1] for o in outs),
                            "postings_dropped": sum(o[2] for o in outs)}


#: A batch searched on n threads is cut into about ``PARALLEL_CHUNKS * n`` pieces of postings
#: (of ``PARALLEL_CHUNK_MIN`` to ``READ_CHUNK`` postings), which the threads take in turn:
#: a thread that the machine's other work slows down then takes fewer.
PARALLEL_CHUNKS = 8
PARALLEL_CHUNK_MIN = 64


class _Pieces:
    """Consecutive ranges of ``total`` postings, ``step`` at a time, handed to threads in turn;
    ``stop`` ends the handing out (a thread found the heads outdated)."""

    def __init__(self, total: int, step: int):
        self._next, self.total, self.step = 0, total, step
        self._lock = threading.Lock()
        self.stopped = False

    def take(self) -> tuple[int, int] | None:
        with self._lock:
            lo = self._next
            if self.stopped or lo >= self.total:
                return None
            self._next = min(lo + self.step, self.total)
            return lo, self._next

    def stop(self) -> None:
        self.stopped = True


def _scan_pieces(pieces, queries, pids, q_ptr, q_idx, graph, idmap, store, readers, metric, versions, io, deadline,
                 tenant, generation, last, kernels, heap_d, heap_i, sizes) -> tuple[int, int, int] | None:
    """Read and scan the ranges of postings ``pieces`` hands this thread into the heaps
    given: ``(postings read, records scanned, postings dropped)``, or None when the heads
    chosen may be outdated (a head appeared since: see ``search``)."""
    dim = queries.shape[1]
    postings = scanned = dropped = 0
    while (piece := pieces.take()) is not None:
        lo, hi = piece
        with readers.reading():  # versions checked against the same state the read saw
            if graph.generation != generation and not last:
                pieces.stop()
                return None
            try:
                batch = store.read(pids[lo:hi], io, deadline=deadline, tenant=tenant, in_place=True)
            except DeadlineExpired:
                dropped += hi - lo
                continue
            try:  # the map arrays change (in place, too) only under the exclusive side of this section
                live = idmap.versions if versions is None else versions(idmap.versions)
                parts = _parts(batch, dim, idmap.vid2ext, live, kernels)
            except BaseException:
                if batch.in_place is not None:
                    batch.in_place.release()
                raise
        postings += hi - lo
        try:
            for recs_f, starts, ends, ids, id_starts, at in parts:
                q_lo, q_hi = q_ptr[lo:hi], q_ptr[lo + 1:hi + 1]
                if at is not None:
                    q_lo, q_hi = q_lo[at], q_hi[at]
                scanned += int(np.dot(ends - starts, q_hi - q_lo))
                kernels.scan_grouped(recs_f, starts, ends, ids, id_starts, q_lo, q_hi, q_idx, queries, metric,
                                     heap_d, heap_i, sizes)
        finally:
            if batch.in_place is not None:
                batch.in_place.release()
    return postings, scanned, dropped


def _parts(batch: PostingBatch, dim: int, vid2ext: np.ndarray, versions: np.ndarray, kernels) -> list[tuple]:
    """What to scan of one read: ``(records as float32, starts, ends, live ids, the ids'
    starts, positions of these postings in the read or None for all)``: the postings read
    into the buffer, and those the store left where it keeps them."""
    recs_f, recs_u = records.view(batch.data, dim)
    starts, ends = batch.offsets[:-1], batch.offsets[1:]
    kept = batch.in_place
    if kept is None:
        return [(recs_f, starts, ends, kernels.live_ids(recs_u, versions, vid2ext), starts, None)]
    kept_ids = kernels.live_ids_ranges(kept.rows, kept.starts, kept.ends, versions, vid2ext)
    id_starts = np.zeros(kept.starts.shape[0], dtype=np.int64)
    np.cumsum((kept.ends - kept.starts)[:-1], out=id_starts[1:])
    parts = [(kept.rows.view(np.float32), kept.starts, kept.ends, kept_ids, id_starts, kept.index)]
    if starts.shape[0]:  # (none when every posting was in place: no kernel call, no GIL hand-off)
        rest = np.ones(starts.shape[0] + kept.index.shape[0], dtype=bool)
        rest[kept.index] = False
        ids = kernels.live_ids(recs_u, versions, vid2ext)
        parts.append((recs_f, starts, ends, ids, starts, np.flatnonzero(rest)))
    return parts
