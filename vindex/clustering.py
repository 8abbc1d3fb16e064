"""Hierarchical balanced clustering for heads (SPANN-style, with faiss k-means).

Two levels: a top-level k-means with about sqrt(H) centroids, then each top cluster split
into a number of leaves proportional to its size, so every leaf gets about n/H vectors
wherever the data is dense or sparse. Leaves larger than ``max_leaf`` are split again, which
keeps every posting's primary vectors under the posting budget. Leaf centroids become heads.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .progress import bar


@dataclass
class Clustering:
    heads: np.ndarray        # (H, d) float32 leaf centroids
    top: np.ndarray          # (k1, d) float32 top-level centroids
    head_top: np.ndarray     # (H,) int64: top cluster of each head
    point_top: np.ndarray    # (n,) int64: top cluster of each point


def _kmeans(x: np.ndarray, k: int, iters: int, seed: int, max_ppc: int) -> np.ndarray:
    import faiss

    if k <= 1 or x.shape[0] <= k:
        return x.mean(axis=0, keepdims=True) if k <= 1 else x.copy()
    km = faiss.Kmeans(x.shape[1], k, niter=iters, seed=seed, min_points_per_centroid=1,
                      max_points_per_centroid=max_ppc, verbose=False)
    km.train(x)
    return km.centroids


def _assign(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    import faiss

    index = faiss.IndexFlatL2(centroids.shape[1])
    index.add(centroids)
    _, a = index.search(x, 1)
    return a[:, 0].astype(np.int64)


def _leaves(x: np.ndarray, k: int, iters: int, seed: int, max_leaf: int) -> list[np.ndarray]:
    """Centroids of ``k`` leaves over ``x``, splitting any leaf above ``max_leaf`` points."""
    cents = _kmeans(x, k, iters, seed, max_ppc=1 << 30)
    if cents.shape[0] == 1 and x.shape[0] <= max_leaf:
        return [cents]
    a = _assign(x, cents) if cents.shape[0] > 1 else np.zeros(x.shape[0], np.int64)
    sizes = np.bincount(a, minlength=cents.shape[0])
    out = [cents[(sizes > 0) & (sizes <= max_leaf)]]
    for c in np.flatnonzero(sizes > max_leaf):
        members = x[a == c]
        sub_k = max(2, -(-members.shape[0] // max(1, max_leaf // 2)))
        if sub_k >= members.shape[0]:
            out.append(members)
        elif sizes[c] == x.shape[0] and np.all(members == members[0]):
            # identical points: k-means cannot split them and recursion would never end;
            # several heads at the same place share them out
            out.append(np.repeat(members[:1], sub_k, axis=0))
        else:
            out.extend(_leaves(members, sub_k, iters, seed + 1, max_leaf))
    return out


def hierarchical(x: np.ndarray, n_heads: int, *, iters: int, max_ppc: int, seed: int,
                 max_leaf: int, show: bool = False) -> Clustering:
    """Cluster ``x`` into about ``n_heads`` leaves of at most ``max_leaf`` points."""
    n = x.shape[0]
    n_heads = max(1, min(n_heads, n))
    k1 = max(1, min(n_heads, int(round(np.sqrt(n_heads)))))
    top = _kmeans(x, k1, iters, seed, max_ppc).astype(np.float32)
    point_top = _assign(x, top) if top.shape[0] > 1 else np.zeros(n, np.int64)
    order = np.argsort(point_top, kind="stable")
    bounds = np.searchsorted(point_top[order], np.arange(top.shape[0] + 1))
    heads, head_top = [], []
    for c in bar(range(top.shape[0]), desc="clustering", show=show):
        members = x[order[bounds[c]:bounds[c + 1]]]
        if members.shape[0] == 0:
            continue
        k = max(1, int(round(members.shape[0] * n_heads / n)))
        for leaf in _leaves(members, k, iters, seed + 1000 + c, max_leaf):
            heads.append(leaf)
            head_top.append(np.full(leaf.shape[0], c, dtype=np.int64))
    return Clustering(np.ascontiguousarray(np.concatenate(heads), dtype=np.float32), top,
                      np.concatenate(head_top), point_top)
