"""What a search returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

__all__ = ["SearchResult"]


@dataclass(frozen=True)
class SearchResult:
    """Results of a batch of queries, best first.

    ``ids`` is ``(nq, k) int64`` padded with -1; ``distances`` is ``(nq, k) float32`` padded with
    +inf: squared L2 for ``l2``, ``1 - cos`` for ``cosine``, ``-<q, x>`` for ``ip``.
    Unpacks as ``ids, distances = result``. ``stats`` counts the work done: postings read
    (each once per batch), records scanned (summed over queries) and postings dropped
    (reads still queued when the search's ``timeout`` ran out).
    """

    ids: np.ndarray
    distances: np.ndarray
    stats: dict = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        """True when the search's ``timeout`` dropped some of its reads: the results cover
        only the postings read in time."""
        return self.stats.get("postings_dropped", 0) > 0

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter((self.ids, self.distances))
