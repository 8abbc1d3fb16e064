"""What a search returns."""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SearchResult", "GetResult", "ScrollPage"]


def _included(obj: Any, name: str, call: str) -> Any:
    try:
        return obj.__dict__["included"][name]
    except KeyError:
        raise AttributeError(f"{name} was not included: pass include=[{name!r}] to {call}") from None


class SearchResult(tuple):
    """Results of a batch of queries, best first.

    ``ids`` is ``(nq, k) int64`` padded with -1 (in a string-id index, an object array of str
    padded with None); ``distances`` is ``(nq, k) float32`` padded with +inf: squared L2 for
    ``l2``, ``1 - cos`` for ``cosine``, ``-<q, x>`` for ``ip``. With ``include``,
    ``metadata[i][j]`` and ``documents[i][j]`` belong to query ``i``'s result ``j`` (None for
    padding and records without one) and ``vectors`` is ``(nq, k, dim) float32`` (zero rows
    for padding).
    A named pair, like a named tuple: ``ids, distances = result``, ``result[0]``, ``len(result)
    == 2``. ``stats`` (not part of the pair) counts the work done: postings read (each once per
    batch), records scanned (summed over queries) and postings dropped (reads still queued when
    the search's ``timeout`` ran out). Immutable.
    """

    _fields = ("ids", "distances")

    def __new__(cls, ids: np.ndarray, distances: np.ndarray, stats: dict | None = None,
                included: dict | None = None) -> "SearchResult":
        self = super().__new__(cls, (ids, distances))
        # stats lives in the instance dict: a tuple subclass cannot hold it in __slots__
        object.__setattr__(self, "stats", {} if stats is None else stats)
        object.__setattr__(self, "included", {} if included is None else included)
        return self

    stats: dict

    @property
    def ids(self) -> np.ndarray:
        return self[0]

    @property
    def distances(self) -> np.ndarray:
        return self[1]

    @property
    def metadata(self) -> list[list[dict | None]]:
        return _included(self, "metadata", "search")

    @property
    def documents(self) -> list[list[str | None]]:
        return _included(self, "documents", "search")

    @property
    def vectors(self) -> np.ndarray:
        return _included(self, "vectors", "search")

    @property
    def partial(self) -> bool:
        """True when the search's ``timeout`` dropped some of its reads: the results cover
        only the postings read in time."""
        return self.stats.get("postings_dropped", 0) > 0

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"SearchResult is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"SearchResult is immutable: cannot delete {name!r}")

    def __getnewargs__(self) -> tuple:  # copy and pickle keep stats
        return (self[0], self[1], self.stats, self.included)

    def __getstate__(self) -> None:  # everything is in __getnewargs__
        return None

    def __repr__(self) -> str:
        return f"SearchResult(ids={self[0]!r}, distances={self[1]!r}, stats={self.stats!r})"


class GetResult(tuple):
    """``(vectors (n, dim) float32, found (n,) bool)`` of a ``get``, rows of ids not found
    zero; with ``include``, ``metadata`` and ``documents`` hold one entry per id (None when
    missing)."""

    def __new__(cls, vectors: np.ndarray, found: np.ndarray, included: dict | None = None) -> "GetResult":
        self = super().__new__(cls, (vectors, found))
        object.__setattr__(self, "included", {} if included is None else included)
        return self

    @property
    def vectors(self) -> np.ndarray:
        return self[0]

    @property
    def found(self) -> np.ndarray:
        return self[1]

    @property
    def metadata(self) -> list[dict | None]:
        return _included(self, "metadata", "get")

    @property
    def documents(self) -> list[str | None]:
        return _included(self, "documents", "get")

    def __getnewargs__(self) -> tuple:
        return (self[0], self[1], self.included)


class ScrollPage:
    """One page of ``scroll``: ``ids`` (int64 array, or a list of str), ``cursor`` (pass it
    as ``scroll(cursor=...)`` to continue after this page; None after the last one) and, with
    ``include``, ``metadata`` / ``documents`` (lists) and ``vectors`` ((n, dim) float32)."""

    def __init__(self, ids: Any, cursor: int | None, included: dict):
        self.ids, self.cursor, self.included = ids, cursor, included

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def metadata(self) -> list[dict | None]:
        return _included(self, "metadata", "scroll")

    @property
    def documents(self) -> list[str | None]:
        return _included(self, "documents", "scroll")

    @property
    def vectors(self) -> np.ndarray:
        return _included(self, "vectors", "scroll")

    def __repr__(self) -> str:
        return f"ScrollPage({len(self)} records, cursor={self.cursor!r}, included={sorted(self.included)})"
