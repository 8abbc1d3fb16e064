"""Planning foreground writes: which vids and versions, which postings, which log record.

Functions here read the state and return ``(Record, Change)`` without changing anything; the
caller commits the change with the record and then applies the record (see ``state``).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from vindex import native

from . import oplog, payloads, strids
from .build import build_postings
from .config import IndexConfig
from .idmap import DELETED, VERSION_MASK
from .state import State
from .storage import Change, records

#: Fewest rows worth a thread of their own when replica candidates are searched in parallel
#: (the graph kernel releases the GIL; a hand-off costs ~0.1 ms, a row ~28 us at 1M).
PARALLEL_MIN_ROWS = 256
#: Beam width of a seeded replica search (the rebalancer's). It starts next to its answer, so
#: a beam as wide as the answer finds it; a wider one only slows the drain after an ingest.
SEEDED_EF = 16


def select_replicas(state: State, x: np.ndarray, config: IndexConfig,
                    pool: ThreadPoolExecutor | None = None, seeds: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Postings for each row of ``x``: ``(heads (n, max_replicas) -1 padded, counts,
    squared distance to the nearest head)``. ``seeds``: a head near each row to start its
    search from (see ``HeadGraph.search``; the rebalancer's, which alone retires heads)."""
    g = state.graph
    n_cand = min(config.insert_candidates, g.n_alive)
    # (``HeadGraph.search`` widens a beam narrower than ``n_cand`` to it)
    ef = SEEDED_EF if seeds is not None else config.insert_ef

    def one(part: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cand, cand_d, _ = g.search(x[part], native.L2, n_cand, np.inf, ef,
                                   None if seeds is None else seeds[part])
        reps = np.empty((cand.shape[0], config.max_replicas), dtype=np.int32)
        reps_d = np.empty((cand.shape[0], config.max_replicas), dtype=np.float32)
        counts = native.replicas.select(cand, cand_d, g.vectors, config.replica_eps,
                                        config.rng_factor, reps, reps_d)
        return reps, counts, reps_d[:, 0]

    n_parts = min(os.cpu_count() or 1, x.shape[0] // PARALLEL_MIN_ROWS)
    if pool is None or n_parts < 2:
        return one(slice(None))
    bounds = np.linspace(0, x.shape[0], n_parts + 1).astype(np.int64).tolist()
    done = list(pool.map(one, [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]))
    return tuple(np.concatenate([d[j] for d in done]) for j in range(3))


def group_appends(heads: np.ndarray, counts: np.ndarray, vids: np.ndarray, versions: np.ndarray,
                  x: np.ndarray) -> dict[int, bytes]:
    """Records of rows ``x`` grouped by the postings in ``heads`` (-1 padded rows)."""
    rows = np.repeat(np.arange(x.shape[0]), counts)
    flat = heads[heads >= 0]  # row-major, aligned with ``rows``
    order = np.argsort(flat, kind="stable")
    flat, rows = flat[order], rows[order]
    recs = records.encode(vids[rows], versions[rows], x[rows])
    bounds = np.flatnonzero(np.diff(flat)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [flat.size]))
    return {int(flat[a]): recs[a:b].tobytes() for a, b in zip(starts, ends)}


def plan_upsert(state: State, exts: np.ndarray, x: np.ndarray, config: IndexConfig,
                pool: ThreadPoolExecutor | None = None, exclude_pids: set[int] | None = None
                ) -> tuple[oplog.Record, Change, Callable[[], None] | None]:
    """Insert or replace ``exts`` with vectors ``x`` (validated, distinct ids).

    Returns the record, the posting change, and an undo for graph changes already made in
    memory (new heads for vectors far outside every posting), or None when there are none.
    ``exclude_pids``: dead heads whose postings still exist (their pids cannot be reused).
    """
    idm = state.idmap
    vids = idm.lookup(exts)
    known = vids >= 0
    versions = np.zeros(exts.shape[0], dtype=np.uint8)
    bumped = ((idm.versions[vids[known]] & VERSION_MASK) + 1) & VERSION_MASK
    versions[known] = bumped
    # a version that wraps to 0 could match a 128-versions-old copy: move the id to a new vid
    wrap = np.zeros_like(known)
    wrap[known] = bumped == 0
    retired = vids[wrap]
    fresh = ~known | wrap
    first_new = idm.n_vids
    vids[fresh] = np.arange(first_new, first_new + int(fresh.sum()))
    versions[fresh] = 0
    arrays: dict[str, np.ndarray] = {}
    change = Change()
    undo = None
    if state.graph.n_alive == 0:
        # an empty index: the first vectors are clustered into the first heads
        built = build_postings(x, vids, config, show=False, versions=versions)
        change.replaces = {int(p): built.records[built.offsets[i]:built.offsets[i + 1]].tobytes()
                           for i, p in enumerate(built.pids)}
        g = built.graph
        n = g.n
        arrays.update(g_pids=np.arange(n, dtype=np.int64), g_vectors=g.vectors[:n], g_alive=g.alive[:n],
                      g_radius=g.radius[:n], g_rows=np.arange(n, dtype=np.int64), g_row_values=g.nbrs[:n],
                      g_entries=g.entries)
        home = built.home
        kind = "bootstrap"
    else:
        heads, counts, d1 = select_replicas(state, x, config, pool)
        if config.new_head_factor > 0:
            undo = _heads_for_outliers(state, x, heads, counts, d1, config, pool, exclude_pids, arrays)
        change.appends = group_appends(heads, counts, vids, versions, x)
        home = heads[:, 0]
        kind = "upsert"
    arrays.update(u_exts=exts, u_vids=vids, u_versions=versions, u_home=home.astype(np.int32),
                  u_retired=retired)
    return oplog.Record(kind, arrays, {"first_new_vid": int(first_new)}), change, undo


def _heads_for_outliers(state: State, x: np.ndarray, heads: np.ndarray, counts: np.ndarray,
                        d1: np.ndarray, config: IndexConfig, pool: ThreadPoolExecutor | None,
                        exclude_pids: set[int] | None, arrays: dict) -> Callable[[], None] | None:
    """Give vectors far outside every posting heads of their own.

    Appended to the nearest (but far) heads, a batch from a new region would sit in postings
    whose heads point elsewhere; splits would carve new heads out of them eventually, but the
    vectors' other copies stay scattered where no query near them looks. Clustering such a
    batch into new heads at once puts it where its queries will search. Rewrites ``heads`` and
    ``counts`` in place (replicas chosen again with the new heads) and fills the graph
    section of ``arrays``.
    """
    g = state.graph
    far = g.outside(heads[:, 0], d1, config.new_head_factor)
    target = max(2.0, config.posting_limit(x.shape[1]) * config.build_fill)
    if far.sum() < max(2, target / 2):
        return None  # a few stragglers: ordinary appends, splits take care of them
    xo = np.ascontiguousarray(x[far])
    k = int(np.ceil(xo.shape[0] / target))
    labels = np.empty(xo.shape[0], dtype=np.int64)
    cents = np.empty((k, x.shape[1]), dtype=np.float32)
    native.kmeans.balanced_kmeans(xo, k, 8, float(config.split_balance), labels, cents)
    # A new head must be nearer its vectors than the heads they have. Far vectors that are
    # only the tail of the data (~3% of every batch of the 1M synthetic set) lie in all
    # directions: their centre is twice as far from them as their nearest heads, and a head
    # there would only take copies from better postings.
    sizes = np.bincount(labels, minlength=k)
    radius = (np.bincount(labels, ((xo - cents[labels]) ** 2).sum(axis=1), minlength=k)
              / np.maximum(sizes, 1)).astype(np.float32)
    near_now = np.bincount(labels, d1[far], minlength=k) / np.maximum(sizes, 1)
    useful = (sizes > 0) & (radius < near_now)
    if not useful.any():
        return None
    cents, radius, k = np.ascontiguousarray(cents[useful]), radius[useful], int(useful.sum())
    pids = g.free_pids(k, exclude_pids)
    touched = g.insert(pids, cents, config.graph_build_ef, radius)

    def undo() -> None:
        removed = np.zeros(g.capacity, dtype=np.bool_)
        removed[pids] = True
        native.graph.remove_nodes(removed, g.vectors, g.nbrs, g.alpha2, np.zeros(g.capacity, np.uint8))
        g.alive[pids] = False
        g.n_alive = int(g.alive[: g.n].sum())

    # Choose again for the rows a new head can enter the choice of: a head farther than
    # ``replica_eps`` beyond a row's nearest one is never a replica (native.replicas), so
    # only rows with a new head that close (rows just inside the threshold too) can change.
    redo = _near_new_heads(x, cents, d1, config.replica_eps)
    if redo.any():
        h, c, _ = select_replicas(state, x[redo], config, pool)
        heads[redo], counts[redo] = h, c
    arrays.update(g_pids=pids, g_vectors=cents, g_alive=np.ones(k, np.bool_), g_radius=radius,
                  g_rows=touched.astype(np.int64), g_row_values=g.nbrs[touched], g_entries=g.entries)
    return undo


def _near_new_heads(x: np.ndarray, cents: np.ndarray, d1: np.ndarray, eps: float) -> np.ndarray:
    """Rows of ``x`` with a head of ``cents`` within the replica rule of their nearest head at
    squared distance ``d1`` (conservatively: a little float slack, and every row whose nearest
    head is at distance 0, where the rule takes another reference)."""
    if not np.isfinite(eps):
        return np.ones(x.shape[0], dtype=bool)
    d = ((x * x).sum(axis=1)[:, None] - 2.0 * (x @ cents.T) + (cents * cents).sum(axis=1)[None, :]).min(axis=1)
    limit = d1 + eps * np.abs(d1)
    return (d <= limit * (1 + 1e-3) + 1e-6 * np.abs(d).max(initial=0.0)) | (d1 == 0)


def plan_delete(state: State, exts: np.ndarray) -> tuple[oplog.Record, Change] | None:
    """Delete the live ones among ``exts`` (and their metadata and documents); None when none
    is live."""
    vids = state.idmap.live_vids(exts)
    vids = vids[vids >= 0]
    if vids.size == 0:
        return None
    change = Change()
    if state.has_payload:
        change.payload.update(payloads.delete_puts(state.idmap.vid2ext[vids]))
    return oplog.Record("delete", {"d_vids": vids}), change


def is_live(state: State, vids: np.ndarray) -> np.ndarray:
    return (state.idmap.versions[vids] & DELETED) == 0


def attach_ids(rec: oplog.Record, state: State, id_type: str, new_strs: list[str]) -> None:
    """Add a write's new string ids (and, with the index's first write, its id type)."""
    if state.id_type is None:
        rec.meta["id_type"] = id_type
    if new_strs:
        rec.arrays["s_data"], rec.arrays["s_offsets"] = strids.encode(new_strs)
        rec.meta["first_str"] = len(state.strids)


def attach_payload(rec: oplog.Record, change: Change, state: State, exts: np.ndarray,
                   metas: payloads.Metadata | None, docs: list[bytes | None] | None) -> None:
    """Add an upsert's metadata and documents to its record and change. An upsert replaces the
    whole record: once the index holds any, rows written without them lose theirs."""
    given = metas is not None or docs is not None
    if not (given or state.has_payload):
        return
    _attach_metadata(rec, "u_meta", metas or payloads.Metadata.none(exts.shape[0]))
    change.payload.update(payloads.record_puts(exts, None if metas is None else metas.encoded, docs))
    if given:
        rec.meta["payload"] = True


def plan_set_metadata(state: State, vids: np.ndarray, exts: np.ndarray, metas: payloads.Metadata,
                      docs: list[bytes | None]) -> tuple[oplog.Record, Change]:
    """Give live ``vids`` (ids ``exts``, whose documents are ``docs``) new metadata."""
    rec = oplog.Record("metadata", {"p_vids": vids}, {"payload": True})
    _attach_metadata(rec, "p_meta", metas)
    return rec, Change(payload=payloads.record_puts(exts, metas.encoded, docs))


def _attach_metadata(rec: oplog.Record, name: str, metas: payloads.Metadata) -> None:
    """``metas`` as ``rec``'s arrays ``name`` and ``name_off`` (replay decodes them), and as
    they are for applying ``rec`` now."""
    rec.arrays[name], rec.arrays[name + "_off"] = payloads.pack(metas.encoded)
    rec.decoded[name] = metas
