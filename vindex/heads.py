"""Heads (posting centroids) and the graph that navigates them.

A head's id is its posting id (pid). Head vectors and adjacency live in arrays that are
replaced when they grow, so concurrent searches keep working on the arrays they started with.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

from vindex import native

from .config import IndexConfig

#: Shared entry points a seeded search (see ``HeadGraph.search``) also starts from.
SEED_ENTRIES = 4
#: Queries per BLAS block in exact head search (bounds the distance matrix).
EXACT_BLOCK = 1024
#: Up to this many queries, exact head search runs in a numba kernel instead of BLAS.
EXACT_KERNEL_MAX_QUERIES = 8
#: ...and only up to this many live heads: scoring every head costs a query a pass over all
#: of them (1439 x 384-d: ~65 us), where the graph's beam scores a few hundred (~20 us).
EXACT_KERNEL_MAX_HEADS = 512
#: Default of ``HeadGraph(nearest_entries_min_queries=)``: from this many queries, a graph
#: search scores the shared entry points in one pass and starts each query's beam from its
#: nearest ones only (see ``_nearest_entries``); below it copying the entry points' vectors
#: costs more than it saves (at a beam of 64, the search's default, the two cross at ~32
#: queries).
NEAREST_ENTRIES_MIN_QUERIES = 64


class _Scratch(threading.local):
    """Per-thread search scratch: visited stamps and beam arrays."""

    def __init__(self) -> None:
        self.visited = np.zeros(0, dtype=np.uint32)
        self.stamp = 0
        self.slot = np.zeros(0, dtype=np.int32)
        self.beam: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.chosen: tuple[np.ndarray, np.ndarray] | None = None

    def stamps(self, capacity: int, n: int) -> tuple[np.ndarray, int]:
        """Visited array for ``capacity`` nodes and the first of ``n`` fresh stamps."""
        if self.visited.shape[0] < capacity or self.stamp + n + 1 >= 2**32 - 1:
            self.visited = np.zeros(max(capacity, 2 * self.visited.shape[0]), dtype=np.uint32)
            self.stamp = 0
        first = self.stamp + 1
        self.stamp += n
        return self.visited, first

    def beam_arrays(self, ef: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.beam is None or self.beam[0].shape[0] != ef:
            self.beam = (np.empty(ef, np.float32), np.empty(ef, np.int32), np.empty(ef, np.bool_))
        return self.beam

    def chosen_arrays(self, nq: int, m: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids (nq, m) int32, dists (nq, m) float32)`` for a small search's chosen heads,
        reused by the thread's next search (the fused path reads them only during its call)."""
        c = self.chosen
        if c is None or c[0].shape[0] < nq or c[0].shape[1] != m:
            c = self.chosen = (np.empty((max(nq, 16), m), np.int32), np.empty((max(nq, 16), m), np.float32))
        return c[0][:nq], c[1][:nq]

    def slots(self, capacity: int) -> np.ndarray:
        if self.slot.shape[0] < capacity:
            self.slot = np.full(max(capacity, 2 * self.slot.shape[0]), -1, dtype=np.int32)
        return self.slot


_scratch = _Scratch()


def scratch() -> _Scratch:
    return _scratch


def _nearest_entries(queries: np.ndarray, vectors: np.ndarray, entries: np.ndarray, metric: int,
                     k: int) -> np.ndarray:
    """Per query, the ``k`` entry points nearest it (one start row per query).

    A beam of width ``k`` started from every entry point keeps just the ``k`` nearest and
    never takes another entry point later (the beam only gets closer), so starting from those
    ``k`` finds the same heads. The beam would score the entry points one at a time from
    scattered rows, a large share of an upsert's replica search; a kernel scores them four at
    a time from one contiguous copy instead. (Not BLAS: at its default of a thread per core,
    called from the upsert pool's threads, it oversubscribed the cores and doubled the
    search's CPU time.)"""
    out = np.empty((queries.shape[0], k), dtype=np.int32)
    native.graph.nearest_entries(queries, np.ascontiguousarray(vectors[entries]), entries, metric, k, out)
    return out


class _Arrays(NamedTuple):
    """One generation of the graph arrays. Searches take the whole tuple at once, so a node
    id read from ``nbrs`` always indexes the ``vectors`` of the same generation, even while a
    writer swaps in grown arrays."""

    vectors: np.ndarray  # (capacity, dim) float32
    nbrs: np.ndarray     # (capacity, degree) int32, -1 padded
    alive: np.ndarray    # (capacity,) bool


class HeadGraph:
    """Head vectors, liveness and the navigation graph.

    ``exact_max_heads``: up to this many live heads a search scores them all instead of
    walking the graph (``IndexConfig.exact_search_max_heads``). ``nearest_entries_min_queries``:
    from this many queries a graph search starts each query from its nearest entry points
    (``NEAREST_ENTRIES_MIN_QUERIES``)."""

    #: ``fused_args``' entry points: (entries, rows of the arrays they were cut to, those below)
    _starts: tuple = (None, 0, None)

    def __init__(self, dim: int, degree: int, alpha: float, n_entries: int, capacity: int = 64, *,
                 exact_max_heads: int = IndexConfig.exact_search_max_heads,
                 nearest_entries_min_queries: int = NEAREST_ENTRIES_MIN_QUERIES):
        capacity = max(capacity, 16)
        self.dim = dim
        self.alpha2 = float(alpha) ** 2  # graph geometry is squared L2
        self.n_entries = n_entries
        self.exact_max_heads = exact_max_heads
        self.nearest_entries_min_queries = nearest_entries_min_queries
        self.arrays_ = _Arrays(np.zeros((capacity, dim), dtype=np.float32),
                               np.full((capacity, degree), -1, dtype=np.int32),
                               np.zeros(capacity, dtype=np.bool_))
        self.entries = np.zeros(0, dtype=np.int32)
        # mean squared distance of a head's vectors to it when the head was made: the scale
        # that tells an insert far outside every posting (a new region) from an ordinary one
        self.radius = np.zeros(capacity, dtype=np.float32)
        self.n = 0  # high-water mark of pids
        self.n_alive = 0
        # bumped whenever heads appear: a search that chose its heads before can miss copies
        # written to the new ones (see ``search.search``)
        self.generation = 0

    # writers (serialised) use these; searches take ``arrays_`` once
    @property
    def vectors(self) -> np.ndarray:
        return self.arrays_.vectors

    @property
    def nbrs(self) -> np.ndarray:
        return self.arrays_.nbrs

    @property
    def alive(self) -> np.ndarray:
        return self.arrays_.alive

    def publish_nbrs(self, nbrs: np.ndarray) -> None:
        """Swap in adjacency computed on a copy (see ``rebalance``)."""
        self.arrays_ = self.arrays_._replace(nbrs=nbrs)

    @property
    def capacity(self) -> int:
        return self.arrays_.vectors.shape[0]

    # --- search ---------------------------------------------------------------------------------
    def search(self, queries: np.ndarray, metric: int, m: int, eps: float, ef: int,
               seeds: np.ndarray | None = None, held: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Nearest ``m`` heads per query with pruning: ``(ids (nq, m), dists, counts)``.
        ``held``: keep the GIL (``native.held``), for searches of a few queries.

        ``seeds`` (one head per query, -1 for none): a head known to lie near the query (the
        posting a stored vector sits in), which starts its search instead of the shared entry
        points (a replica search then takes less time and finds the same postings). Only
        the rebalancer, which alone retires heads, passes seeds; a dead one falls back to the
        shared entries. Inserts keep those: a new region is found through the entry points
        sampled from it (32 of them instead of 256 cost recall under drift)."""
        nq = queries.shape[0]
        ids = np.empty((nq, m), dtype=np.int32)
        dists = np.empty((nq, m), dtype=np.float32)
        if self.n_alive == 0:
            ids.fill(-1)
            dists.fill(np.inf)
            return ids, dists, np.zeros(nq, dtype=np.int32)
        arrays, entries = self.arrays_, self.entries
        few = nq <= EXACT_KERNEL_MAX_QUERIES
        if self.n_alive <= (min(self.exact_max_heads, EXACT_KERNEL_MAX_HEADS) if few else self.exact_max_heads):
            return self._search_exact(arrays, queries, metric, m, eps, ids, dists, held)
        vectors, nbrs = arrays.vectors, arrays.nbrs
        entries = entries[entries < vectors.shape[0]]  # entries may be newer than ``arrays``
        s = scratch()
        visited, stamp0 = s.stamps(vectors.shape[0], nq)
        bd, bi, bx = s.beam_arrays(max(ef, m))
        if seeds is not None:
            starts = self._seed_rows(np.asarray(seeds, dtype=np.int64), entries)
        elif nq >= self.nearest_entries_min_queries and entries.shape[0] > bd.shape[0]:
            starts = _nearest_entries(queries, vectors, entries, metric, bd.shape[0])
        else:
            starts = entries[None]
        kernels = native.held if held else native.graph
        counts = kernels.search_batch(queries, vectors, nbrs, starts, metric, m, eps, visited, stamp0, bd, bi, bx,
                                      ids, dists)
        return ids, dists, counts

    def fused_args(self, nq: int, m: int, ef: int) -> tuple | None:
        """What ``native.fast.search_resident`` needs to choose the heads of ``nq`` queries
        as ``search`` would, in its kernel: ``(exact, heads, nbrs, alive, starts, visited,
        first stamp, beam arrays...)``; None when ``search`` would not use a kernel here (no
        live head, or more than ``EXACT_KERNEL_MAX_QUERIES`` queries scored exactly: BLAS)."""
        if self.n_alive == 0:
            return None
        arrays = self.arrays_
        s = scratch()
        few = nq <= EXACT_KERNEL_MAX_QUERIES
        if self.n_alive <= (min(self.exact_max_heads, EXACT_KERNEL_MAX_HEADS) if few else self.exact_max_heads):
            if not few:
                return None
            n = min(self.n, arrays.vectors.shape[0])  # no head is alive past the high-water mark
            # (``_search_exact``'s copy of the flags is per batch; the kernel reads each
            # head's flag once per query, in index order, which is the same for one query)
            return (True, arrays.vectors[:n], arrays.nbrs, arrays.alive[:n], self.entries[None], s.visited, 0,
                    *s.beam_arrays(1))
        entries, rows, starts = self._starts
        if entries is not self.entries or rows != arrays.vectors.shape[0]:
            entries, rows = self.entries, arrays.vectors.shape[0]
            starts = entries[entries < rows][None]  # entries may be newer than ``arrays``
            self._starts = entries, rows, starts
        visited, stamp0 = s.stamps(arrays.vectors.shape[0], nq)
        return (False, arrays.vectors, arrays.nbrs, arrays.alive, starts, visited, stamp0, *s.beam_arrays(max(ef, m)))

    def _seed_rows(self, seeds: np.ndarray, entries: np.ndarray) -> np.ndarray:
        """Per-query entry rows: the query's seed and SEED_ENTRIES of the shared entry points
        (a way out should the seed's neighbourhood be a dead end), or every shared entry point
        where the seed is missing or dead."""
        rows = np.full((seeds.shape[0], max(entries.shape[0], 1 + SEED_ENTRIES)), -1, dtype=np.int32)
        ok = (seeds >= 0) & (seeds < self.n)
        ok[ok] = self.alive[seeds[ok]]
        rows[ok, 0] = seeds[ok]
        rows[ok, 1:1 + min(SEED_ENTRIES, entries.shape[0])] = entries[:SEED_ENTRIES]
        rows[~ok, :entries.shape[0]] = entries
        return rows

    def search_among(self, queries: np.ndarray, metric: int, m: int, eps: float, among: np.ndarray,
                     held: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Like ``search``, over the live heads flagged in ``among`` (bool per pid) only, by
        scoring each of them (a filtered search's choice among the postings with matches)."""
        nq = queries.shape[0]
        ids = np.empty((nq, m), dtype=np.int32)
        dists = np.empty((nq, m), dtype=np.float32)
        return self._search_exact(self.arrays_, queries, metric, m, eps, ids, dists, held, among)

    def _search_exact(self, arrays: _Arrays, queries: np.ndarray, metric: int, m: int,
                      eps: float, ids: np.ndarray, dists: np.ndarray, held: bool = False,
                      among: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # One copy of the liveness flags fixes the head set for the whole batch. Writers make
        # new heads alive before they retire old ones, so a copy taken in index order never
        # misses both a split head and its children.
        alive = arrays.alive.copy()
        if among is not None:
            n = min(alive.shape[0], among.shape[0])
            alive[:n] &= among[:n]
            alive[n:] = False
        n = int(np.flatnonzero(alive)[-1]) + 1 if alive.any() else 0
        vectors, alive = arrays.vectors[:n], alive[:n]
        if queries.shape[0] <= EXACT_KERNEL_MAX_QUERIES:  # BLAS call overheads dominate
            kernels = native.held if held else native.graph
            counts = kernels.exact_search(queries, vectors, alive, metric, m, eps, ids, dists)
            return ids, dists, counts
        l2 = metric == native.L2
        h_sq = np.einsum("ij,ij->i", vectors, vectors) if l2 else np.zeros(0, dtype=np.float32)
        counts = np.empty(queries.shape[0], dtype=np.int32)
        for lo in range(0, queries.shape[0], EXACT_BLOCK):
            q = queries[lo:lo + EXACT_BLOCK]
            q_sq = np.einsum("ij,ij->i", q, q) if l2 else h_sq
            counts[lo:lo + q.shape[0]] = native.heap.select_dot_rows(q @ vectors.T, q_sq, h_sq, alive, l2, m, eps,
                                                                     ids[lo:lo + EXACT_BLOCK],
                                                                     dists[lo:lo + EXACT_BLOCK])
        return ids, dists, counts

    # --- mutation (callers serialise writers; searches keep running) ---------------------------
    def free_pids(self, k: int, exclude: set[int] | None = None) -> np.ndarray:
        """``k`` unused pids: dead heads first, then new ones. ``exclude``: dead heads whose
        postings are not dropped yet."""
        dead = np.flatnonzero(~self.alive[: self.n])
        if exclude:
            dead = dead[~np.isin(dead, np.fromiter(exclude, dtype=np.int64))]
        dead = dead[:k]
        fresh = np.arange(self.n, self.n + (k - dead.size))
        return np.concatenate((dead, fresh)).astype(np.int64)

    def _reserve(self, n: int) -> None:
        cap = self.capacity
        if n <= cap:
            return
        new_cap = max(n, 2 * cap)
        vectors = np.zeros((new_cap, self.dim), dtype=np.float32)
        vectors[:cap] = self.vectors
        nbrs = np.full((new_cap, self.nbrs.shape[1]), -1, dtype=np.int32)
        nbrs[:cap] = self.nbrs
        alive = np.zeros(new_cap, dtype=np.bool_)
        alive[:cap] = self.alive
        radius = np.zeros(new_cap, dtype=np.float32)
        radius[: self.radius.shape[0]] = self.radius
        self.radius = radius
        # a search holding the old generation keeps a consistent (older) graph
        self.arrays_ = _Arrays(vectors, nbrs, alive)

    def insert(self, pids: np.ndarray, vectors: np.ndarray, build_ef: int,
               radius: np.ndarray | None = None, near: np.ndarray | None = None) -> np.ndarray:
        """Add heads ``pids`` with ``vectors`` (and posting radii) and link them; returns the
        rows it wrote. ``near``: per new head, a live head close to it, where the search for
        its neighbours starts (default: the entry points)."""
        pids = np.asarray(pids, dtype=np.int32)
        self._reserve(int(pids.max()) + 1)
        self.vectors[pids] = vectors
        self.radius[pids] = 0 if radius is None else radius
        touched = np.zeros(self.capacity, dtype=np.uint8)
        touched[pids] = 1
        self.n = max(self.n, int(pids.max()) + 1)
        self.nbrs[pids] = -1
        entries, link = self.entries, pids
        if entries.size == 0:  # an empty graph: the first new head is the way in
            entries, link, near = pids[:1], pids[1:], None
        starts = entries[None] if near is None else self._seed_rows(np.asarray(near, dtype=np.int64), entries)
        if link.size:
            s = scratch()
            visited, stamp0 = s.stamps(self.capacity, link.size)
            ef = max(build_ef, self.nbrs.shape[1])
            bd, bi, bx = np.empty(ef, np.float32), np.empty(ef, np.int32), np.empty(ef, np.bool_)
            native.graph.insert_nodes(link, self.vectors, self.nbrs, starts, self.alpha2,
                                      visited, stamp0, bd, bi, bx, touched)
        self.alive[pids] = True
        self.generation += 1
        self.n_alive = int(self.alive[: self.n].sum())
        self._refresh_entries(pids)
        connect(self.n, self.alive, self.entries, self.vectors, self.nbrs, touched)
        return np.flatnonzero(touched)

    def _refresh_entries(self, fresh: np.ndarray) -> None:
        """Keep ``n_entries`` alive entry points that sample the current heads: drop dead
        ones, top up from ``fresh`` heads and then any alive ones, and let each fresh head
        replace a random entry with probability ``n_entries / n_alive`` (reservoir sampling),
        so regions that appear later get entries too. The draw is seeded by the graph's
        generation and size, so the same sequence of changes picks the same entries (runs with
        rebalancing off repeat exactly)."""
        keep = self.entries[self.alive[self.entries]] if self.entries.size else self.entries
        want = min(self.n_entries, self.n_alive)
        fresh = np.asarray(fresh, np.int64)
        if keep.size < want:
            pool = np.concatenate((fresh, np.flatnonzero(self.alive[: self.n])))
            pool = pool[~np.isin(pool, keep)]
            _, first = np.unique(pool, return_index=True)
            pool = pool[np.sort(first)]
            keep = np.concatenate((keep, pool[: want - keep.size]))
        elif fresh.size and self.n_alive:
            rng = np.random.default_rng((self.generation, self.n))
            hit = rng.random(fresh.size) < keep.size / self.n_alive
            if hit.any():
                keep = keep.copy()
                keep[rng.integers(0, keep.size, int(hit.sum()))] = fresh[hit]
        self.entries = np.ascontiguousarray(keep, dtype=np.int32)

    def set_state(self, pids: np.ndarray, vectors: np.ndarray, alive: np.ndarray,
                  rows: np.ndarray, row_values: np.ndarray, entries: np.ndarray,
                  radius: np.ndarray | None = None) -> None:
        """Replay: heads ``pids`` get ``vectors``, liveness ``alive`` and ``radius``; graph rows
        ``rows`` get ``row_values``; entry points become ``entries``."""
        top = max(int(pids.max()) + 1 if pids.size else 0, int(rows.max()) + 1 if rows.size else 0)
        self._reserve(top)
        self.vectors[pids] = vectors
        if radius is not None:
            self.radius[pids] = radius
        self.alive[pids] = alive
        self.generation += 1
        self.nbrs[rows] = row_values
        self.n = max(self.n, top)
        self.n_alive = int(self.alive[: self.n].sum())
        self.entries = np.ascontiguousarray(entries, dtype=np.int32)

    # --- bulk construction ----------------------------------------------------------------------
    @classmethod
    def build(cls, vectors: np.ndarray, degree: int, alpha: float, n_entries: int, ef: int,
              seed: int, *, exact_max_heads: int = IndexConfig.exact_search_max_heads,
              nearest_entries_min_queries: int = NEAREST_ENTRIES_MIN_QUERIES) -> "HeadGraph":
        """Graph over ``vectors`` by inserting them in a seeded random order."""
        n = vectors.shape[0]
        g = cls(vectors.shape[1], degree, alpha, n_entries, capacity=n, exact_max_heads=exact_max_heads,
                nearest_entries_min_queries=nearest_entries_min_queries)
        g.vectors[:n] = vectors
        g.alive[:n] = True
        g.n = g.n_alive = n
        order = np.random.default_rng(seed).permutation(n).astype(np.int32)
        visited = np.zeros(g.capacity, dtype=np.uint32)
        bd, bi, bx = np.empty(ef, np.float32), np.empty(ef, np.int32), np.empty(ef, np.bool_)
        g.entries = native.graph.build(order, g.vectors, g.nbrs, n_entries, g.alpha2, visited, bd, bi, bx)
        connect(n, g.alive, g.entries, g.vectors, g.nbrs, np.zeros(g.capacity, np.uint8))
        return g

    # --- persistence ----------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        n = self.n
        return {"head_vectors": self.vectors[:n], "head_nbrs": self.nbrs[:n],
                "head_alive": self.alive[:n], "head_entries": self.entries, "head_radius": self.radius[:n]}

    def outside(self, c1: np.ndarray, d1: np.ndarray, factor: float) -> np.ndarray:
        """Which vectors, at squared distance ``d1`` from their nearest head ``c1``, lie far
        outside it: farther than ``factor`` times its radius (the median radius where a head
        has none)."""
        r = self.radius[c1]
        scale = r
        if (r <= 0).any():  # the median costs a pass over every head: only when needed
            alive_r = self.radius[: self.n][self.alive[: self.n]]
            alive_r = alive_r[alive_r > 0]
            floor = float(np.median(alive_r)) if alive_r.size else 0.0
            scale = np.where(r > 0, r, floor)
        return (scale > 0) & (d1 > factor * scale)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], alpha: float, *,
                    exact_max_heads: int = IndexConfig.exact_search_max_heads,
                    nearest_entries_min_queries: int = NEAREST_ENTRIES_MIN_QUERIES) -> "HeadGraph":
        """A graph over loaded arrays, used in place (writes grow them by replacement)."""
        vectors, nbrs = arrays["head_vectors"], arrays["head_nbrs"]
        n, dim = vectors.shape
        g = cls.__new__(cls)
        g.dim = dim
        g.alpha2 = float(alpha) ** 2
        g.n_entries = int(arrays["head_entries"].shape[0])
        g.exact_max_heads = exact_max_heads
        g.nearest_entries_min_queries = nearest_entries_min_queries
        g.arrays_ = _Arrays(np.require(vectors, np.float32, ["C", "W"]),
                            np.require(nbrs, np.int32, ["C", "W"]),
                            np.require(arrays["head_alive"], np.bool_, ["C", "W"]))
        g.entries = np.require(arrays["head_entries"], np.int32, ["C", "W"])
        radius = arrays.get("head_radius")
        g.radius = (np.require(radius, np.float32, ["C", "W"]) if radius is not None
                    else np.zeros(n, dtype=np.float32))
        g.n = n
        g.n_alive = int(g.alive.sum())
        g.generation = 0
        return g


def connect(n: int, alive: np.ndarray, entries: np.ndarray, vectors: np.ndarray, nbrs: np.ndarray,
            touched: np.ndarray, rounds: int = 8) -> None:
    """Make every live head reachable from the entry points (``native.graph.connect``),
    flagging rows written in ``touched``."""
    for _ in range(rounds):
        if native.graph.connect(n, alive, entries, vectors, nbrs, touched) == 0:
            return


METRIC_CODES = {"l2": native.L2, "cosine": native.L2, "ip": native.IP}
