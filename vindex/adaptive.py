"""``Index.search(recall_target=)`` on an index: its calibration and its rounds (``vindex.aps``)."""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from . import aps
from .config import SMALL_SEARCH_QUERIES
from .exact_scan import exact_topk
from .idmap import DELETED
from .search import search as search_postings, search_threads

if TYPE_CHECKING:
    from .index import Index

#: ``choose(queries, held, max_postings) -> (heads, counts)``: a filtered search's candidates.
Choose = Callable[[np.ndarray, bool, int], tuple[np.ndarray, np.ndarray]]


def search(index: "Index", queries: np.ndarray, k: int, target: float, *, max_postings: int, eps: float,
           ef: int | None, cal: aps.Calibration, threads: int, deadline: float | None, tenant: str, choose: Choose | None,
           versions: Callable | None, rerank: int = 0) -> tuple[np.ndarray, np.ndarray, dict]:
    """Internal ``(ids, dists, work)`` of a search that reads each query's candidate postings
    (its ``max_postings`` nearest heads, or ``choose``'s filtered choice) until its estimated
    recall reaches the calibrated threshold for ``target``, or, where the calibration found
    that a fixed number of postings reads fewer for the same recall, that number. ``ef``:
    the head search's beam (None: the config's for the number of postings searched);
    ``cal``: ``calibration``'s for these settings."""
    nq = queries.shape[0]
    eng, metric = index._engine, index._metric_code
    graph = eng.state.graph
    held = nq <= SMALL_SEARCH_QUERIES
    cfg = index.config
    if not cal.adaptive:  # the estimate does not pay here: the fixed count that meets the target
        m = min(max_postings, math.ceil(cal.threshold(target)))
        ef = max(ef or cfg.ef_for(m), m)
        fixed = None if choose is None else lambda q, held_: choose(q, held_, m)
        ids, dists, work = search_threads(queries, k, threads=threads, pool=index._search_pool, graph=graph,
                                          idmap=eng.state.idmap, store=eng.store, readers=eng.readers, metric=metric,
                                          max_postings=m, eps=eps, ef=ef, deadline=deadline, tenant=tenant,
                                          choose=fixed, versions=versions, rerank=rerank)
        return ids, dists, work
    n = min(threads, nq // (SMALL_SEARCH_QUERIES + 1))
    if n > 1:  # pieces of the queries searched in parallel, each adapting on its own
        bounds = np.linspace(0, nq, n + 1).astype(np.int64).tolist()
        parts = index._search_pool.map(
            lambda lh: search(index, queries[lh[0]:lh[1]], k, target, max_postings=max_postings, eps=eps, ef=ef,
                              cal=cal, threads=1, deadline=deadline, tenant=tenant, choose=choose, versions=versions,
                              rerank=rerank),
            list(zip(bounds, bounds[1:])))
        work = {key: sum(p[2][key] for p in parts) for key in parts[0][2]}
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), work
    ef = max(ef or cfg.ef_for(max_postings), max_postings)
    if choose is None:
        sel, _, counts = graph.search(queries, metric, max_postings, eps, ef, held=held)
    else:
        sel, counts = choose(queries, held, max_postings)
        sel = np.array(sel, dtype=np.int32, order="C")  # writable: sorted in place
    h = aps.candidate_heads(graph, queries, sel, counts)
    scan = _scanner(index, deadline=deadline, tenant=tenant, versions=versions, rerank=rerank)
    return aps.search_rounds(queries, k, sel, counts, h, cal.table, cal.threshold(target), scan)


def calibration(index: "Index", k: int, max_postings: int, eps: float, ef: int | None) -> aps.Calibration:
    """The index's calibration for ``k`` and these candidate settings (``ef`` as ``search``
    takes it), made on first use, and made again from served queries once enough have come
    since one made from stored vectors. Call it outside a search's ticket: it reads every
    posting."""
    ef = max(ef or index.config.ef_for(max_postings), max_postings)
    key = (k, max_postings, eps, ef)
    tap = index._tap
    cals = index._calibrations
    found = cals.peek(key)
    if found is None:
        return cals.make(key, None, lambda: _calibrate(index, k, max_postings, eps, ef))
    if not found.served and tap.queries - found.seen >= aps.RECALIBRATE_AFTER:
        cals.refresh(key, found, lambda: _calibrate(index, k, max_postings, eps, ef))
    return found


def _calibrate(index: "Index", k: int, max_postings: int, eps: float, ef: int) -> aps.Calibration:
    eng = index._engine
    rng = np.random.default_rng(eng.config.seed)
    seen = index._tap.queries
    queries = index._tap.sample(aps.CALIBRATION_QUERIES, rng)
    served = queries.shape[0] >= aps.CALIBRATION_MIN_SERVED
    if served:  # the queries this index serves: their neighbours' layout is what a target is about
        own = np.full(queries.shape[0], -1, dtype=np.int64)
    else:  # stored vectors, each with its own record left out
        idm = eng.state.idmap
        live = np.flatnonzero((idm.versions[: idm.n_vids] & DELETED) == 0)
        vids = rng.choice(live, size=min(aps.CALIBRATION_QUERIES, live.shape[0]), replace=False)
        own = idm.vid2ext[vids]
        vectors, found = index._get_vectors(own, "default")
        queries, own = np.ascontiguousarray(vectors[found]), np.ascontiguousarray(own[found])
    with index._tap.muted():
        truth = exact_topk(eng, queries, k + 1)
    keep = np.argsort(truth == own[:, None], axis=1, kind="stable")[:, :k]
    truth = np.ascontiguousarray(np.take_along_axis(truth, keep, axis=1))
    graph = eng.state.graph
    sel, _, counts = graph.search(queries, index._metric_code, max_postings, eps, ef)
    # the estimate is Euclidean geometry: an ip index meets a target by the fixed count alone,
    # its heads in the graph's order (best inner product first)
    euclidean = index.metric != "ip"
    h = aps.candidate_heads(graph, queries, sel, counts) if euclidean else np.zeros(sel.shape, np.float32)
    scan = _scanner(index, deadline=None, tenant="default", versions=None)
    cal = aps.calibrate(queries, own, truth, k, sel, counts, h, scan, index.dim, aps.ROUND_POSTINGS,
                        estimate=euclidean)
    return dataclasses.replace(cal, served=served, seen=seen, live=eng.state.idmap.n_live)


def _scanner(index: "Index", *, deadline: float | None, tenant: str, versions: Callable | None,
             rerank: int = 0) -> aps.Search:
    """``scan(queries, heads, counts, k)``: the search path over exactly these postings."""
    eng = index._engine
    state = eng.state

    def scan(queries: np.ndarray, heads: np.ndarray, counts: np.ndarray, k: int):
        def chosen(_q: np.ndarray, _held: bool) -> tuple[np.ndarray, np.ndarray]:
            return heads, counts
        return search_postings(queries, k, graph=state.graph, idmap=state.idmap, store=eng.store,
                               readers=eng.readers, metric=index._metric_code, max_postings=max(heads.shape[1], 1),
                               eps=0.0, ef=1, deadline=deadline, tenant=tenant, choose=chosen, versions=versions,
                               rerank=rerank)
    return scan

