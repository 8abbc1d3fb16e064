"""What a search returns."""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SearchResult"]


class SearchResult(tuple):
    """Results of a batch of queries, best first.

    ``ids`` is ``(nq, k) int64`` padded with -1; ``distances`` is ``(nq, k) float32`` padded with
    +inf: squared L2 for ``l2``, ``1 - cos`` for ``cosine``, ``-<q, x>`` for ``ip``.
    A named pair, like a named tuple: ``ids, distances = result``, ``result[0]``, ``len(result)
    == 2``. ``stats`` (not part of the pair) counts the work done: postings read (each once per
    batch), records scanned (summed over queries) and postings dropped (reads still queued when
    the search's ``timeout`` ran out). Immutable.
    """

    _fields = ("ids", "distances")

    def __new__(cls, ids: np.ndarray, distances: np.ndarray, stats: dict | None = None) -> "SearchResult":
        self = super().__new__(cls, (ids, distances))
        # stats lives in the instance dict: a tuple subclass cannot hold it in __slots__
        object.__setattr__(self, "stats", {} if stats is None else stats)
        return self

    stats: dict

    @property
    def ids(self) -> np.ndarray:
        return self[0]

    @property
    def distances(self) -> np.ndarray:
        return self[1]

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
        return (self[0], self[1], self.stats)

    def __getstate__(self) -> None:  # everything is in __getnewargs__
        return None

    def __repr__(self) -> str:
        return f"SearchResult(ids={self[0]!r}, distances={self[1]!r}, stats={self.stats!r})"
