"""Exact top-k over every live vector of an index: the recall monitor's ground truth.

Reads every posting (background I/O class, in groups of ``READ_GROUP``), keeps each live
vector once (the copy in its home posting) and ranks it against all queries at once with one
BLAS product per group, whose columns a kernel offers to each query's heap. The Python loop
runs once per group, never per record or posting.
"""
from __future__ import annotations

import numpy as np

from vindex import native

from .engine import Engine
from .storage import IOClass, records

#: Postings per store read (bounds the bytes held at once).
READ_GROUP = 1024


def exact_topk(engine: Engine, queries: np.ndarray, k: int) -> np.ndarray:
    """Internal ids ``(nq, k) int64`` of the ``k`` nearest live vectors of each query under
    the index's metric (-1 padding when fewer are live), nearest first, ties by id."""
    nq = queries.shape[0]
    heap_d = np.empty((nq, k), dtype=np.float32)
    heap_i = np.empty((nq, k), dtype=np.int64)
    sizes = np.zeros(nq, dtype=np.int32)
    inner = engine.manifest.metric == "ip"
    g = engine.state.graph
    pids = np.flatnonzero(g.alive[: g.n]).astype(np.int64)
    for lo in range(0, pids.shape[0], READ_GROUP):
        vecs, ids = _live_group(engine, pids[lo:lo + READ_GROUP])
        if not ids.shape[0]:
            continue
        dots = queries @ vecs.T  # BLAS, GIL released
        # cosine indexes hold unit vectors, ranked as L2 (``Index.search`` does the same)
        v_sq = np.einsum("ij,ij->i", vecs, vecs)
        native.heap.offer_dot_rows(dots, v_sq, ids, inner, heap_d, heap_i, sizes)  # nogil
    native.scan.finish(heap_d, heap_i, sizes)
    return heap_i


def _live_group(engine: Engine, pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(vectors, internal ids)`` of the live vectors whose home is one of ``pids``."""
    idm = engine.state.idmap
    with engine.readers.reading():  # versions and homes as of the read
        batch = engine.store.read(pids, IOClass.BACKGROUND)
        recs_f, recs_u = records.view(batch.data, engine.dim)
        exts = native.scan.live_ids(recs_u, idm.versions, idm.vid2ext)
        owner = np.repeat(pids, np.diff(batch.offsets))
        vids = recs_u[:, 0].astype(np.int64)
        keep = exts >= 0
        keep[keep] = idm.home[vids[keep]] == owner[keep]
        # copies: the read buffer is reused by this thread's next read
        return recs_f[keep, records.HEADER_WORDS:].copy(), exts[keep].copy()


