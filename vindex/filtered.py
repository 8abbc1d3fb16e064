"""Filtered search: which records a filter lets through, and how to search them.

The payload index compiles a filter into the set of live matching records before any posting
is read (a ``FilterPlan``), so the plan knows their number and the postings that hold them
(each record's home posting holds its live copy). Then, per search (docs/filters.md):

* few matches for what a posting scan would score (``gathers``): score just them, their
  vectors gathered once per plan into one matrix (``search_gathered``): the exact answer;
* few postings with a match (at most ``filter_exact_factor * max_postings``): scan all of
  them, for every query: the exact answer too;
* otherwise: scan the postings nearest the query among those that hold a match, more of them
  the rarer the matches (``max_postings / selectivity``, at most ``filter_widen *
  max_postings``). Restricting the choice to postings with matches serves filters whose
  matches lie far from the query as well as those near it.

A posting scan is the unfiltered one, given a version map in which every record outside the
set reads as deleted (``versions_for``, made once per plan), so it skips them without
computing their distance.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from vindex import native

from .config import SMALL_SEARCH_QUERIES, IndexConfig
from .filters import Filter
from .heads import HeadGraph
from .idmap import DELETED
from .state import State
from .storage import IOClass, PostingStore, records


#: Share of the postings holding a match above which a filtered search picks its postings
#: with the graph search (then few of those it picks hold no match).
BROAD_SHARE = 0.75

#: Rows of gathered records each query scores in turn (about 100 KB at 96 dimensions).
GATHER_PIECE = 256


@dataclass(frozen=True)
class FilterPlan:
    """The records a filter lets through, as the state was when planned (``applied``)."""

    allowed: np.ndarray   # bool per vid: live and matching
    matches: int          # how many
    live: int             # live records then (the selectivity's denominator)
    heads: np.ndarray     # bool per head: its posting is the home of a match
    applied: int = -1     # ``State.applied`` when planned
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @cached_property
    def n_heads(self) -> int:
        return int(np.count_nonzero(self.heads))

    @property
    def nbytes(self) -> int:
        """Memory the plan holds (its masked version map and gathered vectors once made)."""
        made = self.__dict__
        gathered = made.get("_gathered")
        return (self.allowed.nbytes + self.heads.nbytes + getattr(made.get("_masked"), "nbytes", 0)
                + (gathered.rows.nbytes + gathered.ids.nbytes if gathered is not None else 0))

    @cached_property
    def head_ids(self) -> np.ndarray:
        """The heads of ``heads``, ascending (int32)."""
        return np.flatnonzero(self.heads).astype(np.int32)

    @cached_property
    def _keep(self) -> tuple[np.ndarray, np.ndarray]:
        """Byte masks: ``versions & keep | outside`` is a version where allowed, else DELETED
        (two byte-wise passes, several times faster than a masked copy)."""
        keep = self.allowed.view(np.uint8) * np.uint8(0xFF)
        return keep, ~keep & DELETED

    def versions_for(self, versions: np.ndarray, applied: int = -2) -> np.ndarray:
        """``versions`` (the live version map, any length) with every record outside the
        plan marked deleted: records written since the plan was made are outside it. With
        ``applied`` the plan's own (no record applied since), the map is made once per plan."""
        if applied == self.applied:
            with self._lock:
                masked = self.__dict__.get("_masked")
                if masked is None or masked.shape[0] != versions.shape[0]:
                    masked = self.__dict__["_masked"] = self._mask_versions(versions)
            return masked
        return self._mask_versions(versions)

    def _mask_versions(self, versions: np.ndarray) -> np.ndarray:
        keep, outside = self._keep
        n = min(keep.shape[0], versions.shape[0])
        out = np.empty(versions.shape[0], dtype=np.uint8)
        np.bitwise_and(versions[:n], keep[:n], out=out[:n])
        out[:n] |= outside[:n]
        out[n:] = DELETED
        return out

    def gathers_at(self, graph: HeadGraph, max_postings: int, config: IndexConfig, dim: int) -> bool:
        """``gathers(graph, self, ...)``, remembered per ``max_postings`` and live head count
        (a one-query search repeats it; a plan is one open index's, whose config is fixed)."""
        key = (max_postings, graph.n_alive)
        memo = self.__dict__.setdefault("_gathers", {})
        found = memo.get(key)
        if found is None:
            found = memo[key] = gathers(graph, self, max_postings, config, dim)
        return found

    def gathered(self, state: State, store: PostingStore, dim: int, tenant: str) -> Gathered | None:
        """The matching records' vectors in one matrix, read once per plan from their home
        postings; call with writers held off, at the plan's ``applied``. None if a live copy
        was not where the id map says (the caller falls back to the posting scan)."""
        with self._lock:
            if "_gathered" not in self.__dict__:
                self.__dict__["_gathered"] = gather(state, store, self.allowed, dim, tenant)
            return self.__dict__["_gathered"]


@dataclass(frozen=True)
class Gathered:
    """Records (``(n, 2 + dim)`` float32 rows, as in a posting) and their external ids."""

    rows: np.ndarray
    ids: np.ndarray


def gather(state: State, store: PostingStore, allowed: np.ndarray, dim: int, tenant: str) -> Gathered | None:
    """The live copies of the records ``allowed`` marks, picked out of their home postings
    where the store keeps them in memory (read otherwise); None when a copy is missing."""
    idm = state.idmap
    vids = np.flatnonzero(allowed)
    m = vids.shape[0]
    rows = np.empty((m, dim + records.HEADER_WORDS), dtype=np.uint32)
    ids = np.empty(m, dtype=np.int64)
    if not m:
        return Gathered(rows.view(np.float32), ids)
    homes = np.unique(idm.home[vids]).astype(np.int64)
    batch = store.read(homes[homes >= 0], IOClass.INTERACTIVE, tenant=tenant, in_place=True)
    taken = np.zeros(allowed.shape[0], dtype=bool)
    kernels = native.filtered
    try:
        _, recs_u = records.view(batch.data, dim)
        n = kernels.pick(recs_u, batch.offsets[:-1], batch.offsets[1:], allowed, idm.versions, idm.vid2ext,
                         rows, ids, 0, taken)
        kept = batch.in_place
        if kept is not None:
            n = kernels.pick(kept.rows, kept.starts, kept.ends, allowed, idm.versions, idm.vid2ext, rows, ids, n,
                             taken)
    finally:
        if batch.in_place is not None:
            batch.in_place.release()
    return Gathered(rows.view(np.float32), ids) if n == m else None


class PlanCache:
    """The plans of recent filters, valid while no record is applied: a pipeline tends to
    search with the same filters (a tenant's, a source's) over and over. Least recently used
    plans go first once the plans hold more than ``max_bytes`` (masks, gathered vectors)."""

    def __init__(self, max_bytes: int):
        self._max_bytes = max_bytes
        self._plans: dict[tuple[Filter, int], FilterPlan] = {}
        self._lock = threading.Lock()

    def get(self, state: State, f: Filter) -> FilterPlan:
        """``plan(state, f)``; call with writers held off (``Readers.reading``)."""
        key = (f, state.applied)
        with self._lock:
            found = self._plans.pop(key, None)
            if found is not None:
                self._plans[key] = found  # most recently used last
                return found
        made = plan(state, f)
        with self._lock:
            plans = {k: v for k, v in self._plans.items() if k[1] == state.applied}
            plans[key] = made
            total = sum(p.nbytes for p in plans.values())
            while total > self._max_bytes and len(plans) > 1:
                total -= plans.pop(next(iter(plans))).nbytes
            self._plans = plans
        return made


def plan(state: State, f: Filter) -> FilterPlan:
    """Compile ``f`` against the state; call with writers held off (``Readers.reading``)."""
    idm = state.idmap
    n = idm.n_vids
    allowed = state.payload.mask(f, n)
    allowed &= (idm.versions[:n] & DELETED) == 0
    vids = np.flatnonzero(allowed)
    homes = idm.home[vids]
    heads = np.zeros(state.graph.capacity, dtype=bool)
    heads[homes[homes >= 0]] = True
    return FilterPlan(allowed, int(vids.shape[0]), int(idm.n_live), heads, state.applied)


def gathers(graph: HeadGraph, fplan: FilterPlan, max_postings: int, config: IndexConfig, dim: int) -> bool:
    """Whether scoring just the matching records beats scanning postings for them: they are
    at most ``filter_gather_ratio`` times the rows the posting scan scores (every head that
    holds a match, then its budget of postings of the mean length), and their vectors fit in
    a quarter of the plan cache."""
    if fplan.matches * (dim + records.HEADER_WORDS) * 4 > config.filter_cache_bytes // 4:
        return False
    mean_len = fplan.live / max(graph.n_alive, 1)
    if fplan.n_heads <= config.filter_exact_factor * max_postings:  # every posting with a match
        scanned = fplan.n_heads * mean_len
    else:
        scanned = fplan.n_heads + posting_budget(fplan, max_postings, config) * mean_len
    return fplan.matches <= config.filter_gather_ratio * scanned


def gathered_for(state: State, store: PostingStore, fplan: FilterPlan, max_postings: int, config: IndexConfig,
                 dim: int, tenant: str) -> Gathered | None:
    """The plan's gathered records when scoring just them is the cheaper way (``gathers``),
    else None (scan the postings). Call with writers held off since ``fplan`` was made: the
    copy is then the state's, and stays so however the state moves on."""
    if fplan.applied != state.applied or not fplan.gathers_at(state.graph, max_postings, config, dim):
        return None
    return fplan.gathered(state, store, dim, tenant)


def search_gathered(found: Gathered, queries: np.ndarray, k: int, metric: int,
                    scale: np.float32) -> tuple[np.ndarray, np.ndarray, dict]:
    """The exact top-``k`` of ``queries`` among the gathered records, as ``search.search``
    returns it, distances times ``scale`` (float32)."""
    nq = queries.shape[0]
    top_k = native.filtered.top_k_held if nq <= SMALL_SEARCH_QUERIES else native.filtered.top_k
    heap_i, heap_d = top_k(found.rows, found.ids, queries, metric, k, GATHER_PIECE, scale)
    return heap_i, heap_d, {"postings": 0, "records_scanned": found.rows.shape[0] * nq, "postings_dropped": 0}


def posting_budget(fplan: FilterPlan, max_postings: int, config: IndexConfig) -> int:
    """Postings a query scans among those with matches: more the rarer the matches."""
    selectivity = fplan.matches / max(fplan.live, 1)
    return min(fplan.n_heads, math.ceil(max_postings / max(selectivity, 1e-9)),
               math.ceil(config.filter_widen * max_postings), 4096)


def broad_budget(graph: HeadGraph, fplan: FilterPlan, max_postings: int, config: IndexConfig) -> int | None:
    """Postings a query scans when most postings hold a match, so the graph's nearest serve
    as well as the nearest among those with matches: the unfiltered search then runs as it
    is (fused path included) over ``versions_for``'s map, on ``max_postings / sqrt(selectivity)``
    postings. Matches this dense lie in every posting, and the k nearest of them are about
    the k / selectivity nearest records, which the postings of the sqrt widening hold about as
    well as ``max_postings`` hold the k nearest (wiki-minilm-15k, half the records matching,
    recall@10 against the exact filtered answer: 0.953 at 68 postings, unfiltered 0.956 at 48;
    docs/filters.md). None when the postings must be chosen among those with matches
    (``choose_postings``)."""
    n_heads = fplan.n_heads
    if n_heads <= config.filter_exact_factor * max_postings or n_heads < BROAD_SHARE * graph.n_alive:
        return None
    selectivity = fplan.matches / max(fplan.live, 1)
    return min(math.ceil(max_postings / math.sqrt(max(selectivity, 1e-9))),
               math.ceil(config.filter_widen * max_postings), 4096)


def choose_postings(graph: HeadGraph, queries: np.ndarray, metric: int, fplan: FilterPlan, max_postings: int,
                    eps: float, ef: int, config: IndexConfig, held: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(head ids (nq, m) -1 padded, counts (nq,))``: the postings each query scans. When
    most postings hold a match, the graph's nearest (``ef`` its beam) serve as well as the
    nearest among those with matches, and cost a graph search instead of scoring them all."""
    nq = queries.shape[0]
    n_heads = fplan.n_heads
    if n_heads <= config.filter_exact_factor * max_postings:
        every = np.empty((nq, n_heads), dtype=np.int32)
        every[:] = fplan.head_ids
        return every, np.full(nq, n_heads, dtype=np.int32)
    budget = posting_budget(fplan, max_postings, config)
    if n_heads >= BROAD_SHARE * graph.n_alive:
        ids, _, counts = graph.search(queries, metric, budget, eps, max(ef, budget), held=held)
    else:
        ids, _, counts = graph.search_among(queries, metric, budget, eps, fplan.heads, held=held)
    return ids, counts


def recheck(state: State, f: Filter, ids: np.ndarray, dists: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop results whose metadata stopped matching while the search ran (a concurrent
    ``set_metadata``), keeping each row's order; ``ids`` are internal (-1 padding)."""
    flat = ids.reshape(-1)
    vids = state.idmap.lookup(flat)
    ok = np.ones(flat.shape[0], dtype=bool)  # padding stays where it is
    ok[flat >= 0] = False
    known = vids >= 0
    ok[known] = state.payload.check(f, vids[known])
    if ok.all():
        return ids, dists
    ok = ok.reshape(ids.shape)
    ids, dists = ids.copy(), dists.copy()
    for row in np.flatnonzero(~ok.all(axis=1)):
        keep = ok[row]
        n = int(keep.sum())
        ids[row, :n], dists[row, :n] = ids[row, keep], dists[row, keep]
        ids[row, n:], dists[row, n:] = -1, np.inf
    return ids, dists
