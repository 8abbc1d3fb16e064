"""Exact top-k of the shards' top-k lists: by distance, ties to the smaller id."""
from __future__ import annotations

import numpy as np

from vindex.results import SearchResult

#: Work counters that add up over shards.
_SUMMED = ("postings", "records_scanned", "postings_dropped", "filter_matches")


def _object_rows(rows: list[list], shape: tuple[int, int]) -> np.ndarray:
    flat = np.fromiter((v for row in rows for v in row), dtype=object, count=shape[0] * shape[1])
    return flat.reshape(shape)


def tie_keys(ids: np.ndarray) -> np.ndarray:
    """Keys ordering ``ids`` as ids compare: the ids themselves, or the rank of each string
    among them (str ids; None padding ranks first, but its distance is +inf)."""
    if ids.dtype != object:
        return ids
    text = np.where(ids == None, "", ids).astype(str)  # noqa: E711 (element-wise)
    return np.unique(text, return_inverse=True)[1].reshape(ids.shape)


def merge(parts: list[tuple], k: int) -> SearchResult:
    """One :class:`SearchResult` from each shard's ``(ids, distances, stats, included)``."""
    ids = np.concatenate([p[0] for p in parts], axis=1)
    dists = np.concatenate([p[1] for p in parts], axis=1)
    nq = ids.shape[0]
    order = np.lexsort((tie_keys(ids), dists), axis=-1)[:, :k]
    stats = {key: sum(int(p[2].get(key, 0)) for p in parts) for key in _SUMMED if key in parts[0][2]}
    included = {}
    for name in parts[0][3]:
        if name == "vectors":
            joined = np.concatenate([p[3][name] for p in parts], axis=1)
            included[name] = np.take_along_axis(joined, order[:, :, None], axis=1)
        else:
            cols = [_object_rows(p[3][name], p[0].shape) for p in parts]
            picked = np.take_along_axis(np.concatenate(cols, axis=1), order, axis=1)
            included[name] = picked.tolist()
    return SearchResult(np.take_along_axis(ids, order, axis=1), np.take_along_axis(dists, order, axis=1),
                        stats, included) if nq else SearchResult(ids[:, :k], dists[:, :k], stats, included)
