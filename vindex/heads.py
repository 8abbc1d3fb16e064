"""Heads (posting centroids) and the graph that navigates them.

A head's id is its posting id (pid). Head vectors and adjacency live in arrays that are
replaced when they grow, so concurrent searches keep working on the arrays they started with.
"""
from __future__ import annotations

import threading

import numpy as np

import native

#: Up to this many heads, a search scores every head with one BLAS product instead of walking
#: the graph: cheaper below a few thousand heads, and exact.
EXACT_MAX_HEADS = 4096
#: Queries per BLAS block in exact head search (bounds the distance matrix).
EXACT_BLOCK = 1024
#: Up to this many queries, exact head search runs in a numba kernel instead of BLAS.
EXACT_KERNEL_MAX_QUERIES = 8


class _Scratch(threading.local):
    """Per-thread search scratch: visited stamps and beam arrays."""

    def __init__(self) -> None:
        self.visited = np.zeros(0, dtype=np.uint32)
        self.stamp = 0
        self.slot = np.zeros(0, dtype=np.int32)
        self.beam: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

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

    def slots(self, capacity: int) -> np.ndarray:
        if self.slot.shape[0] < capacity:
            self.slot = np.full(max(capacity, 2 * self.slot.shape[0]), -1, dtype=np.int32)
        return self.slot


_scratch = _Scratch()


def scratch() -> _Scratch:
    return _scratch


class HeadGraph:
    """Head vectors, liveness and the navigation graph."""

    def __init__(self, dim: int, degree: int, alpha: float, n_entries: int, capacity: int = 64):
        capacity = max(capacity, 16)
        self.dim = dim
        self.alpha2 = float(alpha) ** 2  # graph geometry is squared L2
        self.n_entries = n_entries
        self.vectors = np.zeros((capacity, dim), dtype=np.float32)
        self.nbrs = np.full((capacity, degree), -1, dtype=np.int32)
        self.alive = np.zeros(capacity, dtype=np.bool_)
        self.entries = np.zeros(0, dtype=np.int32)
        self.n = 0  # high-water mark of pids
        self.n_alive = 0
        self._norms: tuple | None = None

    @property
    def capacity(self) -> int:
        return self.vectors.shape[0]

    # --- search ---------------------------------------------------------------------------------
    def search(self, queries: np.ndarray, metric: int, m: int, eps: float, ef: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Nearest ``m`` heads per query with pruning: ``(ids (nq, m), dists, counts)``."""
        nq = queries.shape[0]
        ids = np.empty((nq, m), dtype=np.int32)
        dists = np.empty((nq, m), dtype=np.float32)
        if self.n_alive == 0:
            ids.fill(-1)
            dists.fill(np.inf)
            return ids, dists, np.zeros(nq, dtype=np.int32)
        if self.n_alive <= EXACT_MAX_HEADS:
            return self._search_exact(queries, metric, m, eps, ids, dists)
        vectors, nbrs, entries = self.vectors, self.nbrs, self.entries
        s = scratch()
        visited, stamp0 = s.stamps(vectors.shape[0], nq)
        bd, bi, bx = s.beam_arrays(max(ef, m))
        counts = native.graph.search_batch(queries, vectors, nbrs, entries, metric, m, eps, visited,
                                    stamp0, bd, bi, bx, ids, dists)
        return ids, dists, counts

    def _search_exact(self, queries: np.ndarray, metric: int, m: int, eps: float,
                      ids: np.ndarray, dists: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = self.n
        vectors, alive = self.vectors[:n], self.alive[:n]
        if queries.shape[0] <= EXACT_KERNEL_MAX_QUERIES:  # BLAS call overheads dominate
            counts = native.graph.exact_search(queries, vectors, alive, metric, m, eps, ids, dists)
            return ids, dists, counts
        norms = self._sqnorms()
        counts = np.empty(queries.shape[0], dtype=np.int32)
        for lo in range(0, queries.shape[0], EXACT_BLOCK):
            q = queries[lo:lo + EXACT_BLOCK]
            d = q @ vectors.T
            if metric == native.L2:
                d *= -2
                d += norms[None, :]
                d += np.einsum("ij,ij->i", q, q)[:, None]
                np.maximum(d, 0, out=d)
            else:
                np.negative(d, out=d)
            counts[lo:lo + q.shape[0]] = native.heap.select_rows(d, alive, m, eps, ids[lo:lo + EXACT_BLOCK],
                                                          dists[lo:lo + EXACT_BLOCK])
        return ids, dists, counts

    def _sqnorms(self) -> np.ndarray:
        """Squared norms of the heads, cached until the heads change."""
        cached = self._norms
        if cached is None or cached[0] is not self.vectors or cached[1] != self.n:
            n = self.n
            cached = (self.vectors, n, np.einsum("ij,ij->i", self.vectors[:n], self.vectors[:n]))
            self._norms = cached
        return cached[2]

    # --- bulk construction ----------------------------------------------------------------------
    @classmethod
    def build(cls, vectors: np.ndarray, degree: int, alpha: float, n_entries: int, ef: int,
              seed: int) -> "HeadGraph":
        """Graph over ``vectors`` by inserting them in a seeded random order."""
        n = vectors.shape[0]
        g = cls(vectors.shape[1], degree, alpha, n_entries, capacity=n)
        g.vectors[:n] = vectors
        g.alive[:n] = True
        g.n = g.n_alive = n
        order = np.random.default_rng(seed).permutation(n).astype(np.int32)
        visited = np.zeros(g.capacity, dtype=np.uint32)
        bd, bi, bx = np.empty(ef, np.float32), np.empty(ef, np.int32), np.empty(ef, np.bool_)
        g.entries = native.graph.build(order, g.vectors, g.nbrs, n_entries, g.alpha2, visited, bd, bi, bx)
        return g

    # --- persistence ----------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        n = self.n
        return {"head_vectors": self.vectors[:n], "head_nbrs": self.nbrs[:n],
                "head_alive": self.alive[:n], "head_entries": self.entries}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], alpha: float) -> "HeadGraph":
        """A graph over loaded arrays, used in place (writes grow them by replacement)."""
        vectors, nbrs = arrays["head_vectors"], arrays["head_nbrs"]
        n, dim = vectors.shape
        g = cls.__new__(cls)
        g.dim = dim
        g.alpha2 = float(alpha) ** 2
        g.n_entries = int(arrays["head_entries"].shape[0])
        g.vectors = np.require(vectors, np.float32, ["C", "W"])
        g.nbrs = np.require(nbrs, np.int32, ["C", "W"])
        g.alive = np.require(arrays["head_alive"], np.bool_, ["C", "W"])
        g.entries = np.require(arrays["head_entries"], np.int32, ["C", "W"])
        g.n = n
        g.n_alive = int(g.alive.sum())
        g._norms = None
        return g


METRIC_CODES = {"l2": native.L2, "cosine": native.L2, "ip": native.IP}
