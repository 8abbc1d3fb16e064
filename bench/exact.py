"""Exact search (the ground truth every benchmark scores against) and recall@k."""
from __future__ import annotations

import sys
import time

import numpy as np

METRICS = ("l2", "cosine", "ip")


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _normalized(x: np.ndarray) -> np.ndarray:
    x = np.array(x, dtype=np.float32, order="C", copy=True)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    np.divide(x, norms, out=x, where=norms > 0)  # zero vectors stay zero
    return x


def ground_truth(
    base: np.ndarray,
    queries: np.ndarray,
    k: int,
    metric: str,
    block: int = 4096,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k by brute force with faiss: returns (ids int64, dists float32), ascending.

    Distances: squared L2 for "l2", ``1 - cos`` for "cosine" (vectors normalised first),
    ``-<q, x>`` for "ip". Queries are processed in blocks to bound result memory and to
    report progress; faiss uses its current OpenMP thread count.
    """
    import faiss

    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if metric == "cosine":
        base, queries = _normalized(base), _normalized(queries)
    else:
        base, queries = _f32(base), _f32(queries)
    d = base.shape[1]
    index = faiss.IndexFlatL2(d) if metric == "l2" else faiss.IndexFlatIP(d)
    index.add(base)
    nq = queries.shape[0]
    ids = np.empty((nq, k), dtype=np.int64)
    dists = np.empty((nq, k), dtype=np.float32)
    t0 = time.perf_counter()
    for start in range(0, nq, block):
        stop = min(nq, start + block)
        dd, ii = index.search(queries[start:stop], k)
        ids[start:stop], dists[start:stop] = ii, dd
        if progress:
            print(f"  ground truth {stop}/{nq} queries, {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    if metric == "cosine":
        dists = (1.0 - dists).astype(np.float32)
    elif metric == "ip":
        dists = -dists
    return ids, dists


def recall_at_k(found_ids: np.ndarray, gt_ids: np.ndarray, k: int = 10) -> float:
    """Mean over queries of ``|found[:, :k] ∩ gt[:, :k]| / k``; -1 and repeated ids in found count once/never."""
    found = np.asarray(found_ids)[:, :k].astype(np.int64)
    gt = np.asarray(gt_ids)[:, :k].astype(np.int64)
    if found.shape[0] != gt.shape[0]:
        raise ValueError(f"found has {found.shape[0]} queries, gt has {gt.shape[0]}")
    if gt.shape[1] < k:
        raise ValueError(f"gt has only {gt.shape[1]} neighbours per query, need k={k}")
    if found.shape[0] == 0:
        return 0.0
    # Drop duplicate ids within a row so a repeated hit is not counted twice.
    found = np.sort(found, axis=1)
    dup = np.zeros_like(found, dtype=bool)
    dup[:, 1:] = found[:, 1:] == found[:, :-1]
    found[dup] = -1
    hits = 0
    step = max(1, (1 << 22) // (k * k))  # bound the (rows, k, k) comparison tensor
    for s in range(0, found.shape[0], step):
        f, g = found[s : s + step], gt[s : s + step]
        match = (f[:, :, None] == g[:, None, :]).any(axis=2) & (f >= 0)
        hits += int(match.sum())
    return hits / (found.shape[0] * k)
