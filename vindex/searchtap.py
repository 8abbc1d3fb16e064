"""What the search path leaves behind for observers: counters and a ring of recent queries.

``SearchTap.searched`` runs once per search call. It takes no lock and does a constant amount
of work whatever the search read: two integer additions and a copy of at most
``rows_per_search`` query rows into a preallocated ring (the recall monitor's samples). The
counters are plain attributes: two searches finishing at the same instant may, rarely, count
as one (they stay monotonic, which is what a rate over them needs).
"""
from __future__ import annotations

import threading

import numpy as np

#: Query rows a search leaves in the ring: spread over a batch, so one large batch does not
#: fill the ring with its neighbouring rows.
ROWS_PER_SEARCH = 16
#: Recent queries kept for the recall monitor: up to 1024, in at most 2 MiB (at least 256,
#: the monitor's batch).
RING_ROWS = 1024
RING_MIN_ROWS = 256
RING_BYTES = 2 << 20


class _Local(threading.local):
    """Per thread: muted? A class default, so an unmuted thread's check finds the attribute
    (a miss raises and catches an AttributeError inside ``getattr``: ~0.5 us a search)."""

    muted = False


class SearchTap:
    """Counters of one index's searches and writes, and its recent queries."""

    def __init__(self, dim: int, *, ring_rows: int | None = None, rows_per_search: int = ROWS_PER_SEARCH):
        if ring_rows is None:
            ring_rows = max(RING_MIN_ROWS, min(RING_ROWS, RING_BYTES // (4 * dim)))
        self.searches = 0
        self.queries = 0
        self.rows_written = 0
        self.rows_deleted = 0
        self._ring = np.zeros((ring_rows, dim), dtype=np.float32)
        self._next = 0          # queries ever put in the ring; the slot is this modulo its size
        self._taken = 0         # ``_next`` at the last ``recent`` call
        self._rows_per_search = rows_per_search
        self._local = _Local()

    def searched(self, queries: np.ndarray) -> None:
        """Count a search of ``queries`` (nq, dim) and keep a few of its rows."""
        if self._local.muted:
            return
        nq = queries.shape[0]
        self.searches += 1
        self.queries += nq
        per = self._rows_per_search
        take = queries if nq <= per else queries[:: nq // per][:per]
        at = self._next
        n = take.shape[0]
        size = self._ring.shape[0]
        lo = at % size
        if lo + n <= size:  # (a slice copy: a search of one query pays ~1 us here, not ~10)
            self._ring[lo:lo + n] = take
        else:
            self._ring[np.arange(at, at + n) % size] = take
        # advanced once the rows are in: ``recent`` on another thread never takes a slot
        # still being written (it took unwritten zero rows, which cosine refuses)
        self._next = at + n

    def recent(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Up to ``n`` distinct queries drawn at random (a copy) from those kept since the
        previous call, so no query is checked twice; empty when none came since."""
        end = self._next
        size = self._ring.shape[0]
        fresh = min(end - self._taken, size)
        self._taken = end
        if fresh <= 0:
            return self._ring[:0].copy()
        rows = (end - 1 - rng.choice(fresh, size=min(n, fresh), replace=False)) % size
        return self._ring[rows].copy()

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Up to ``n`` distinct queries drawn at random (a copy) from those in the ring,
        leaving ``recent``'s position alone (a recall target's calibration)."""
        held = min(self._next, self._ring.shape[0])
        return self._ring[np.sort(rng.choice(held, size=min(n, held), replace=False))].copy()

    def muted(self) -> "_Muted":
        """A context in which this thread's searches are not counted (the monitor's own)."""
        return _Muted(self._local)


class _Muted:
    def __init__(self, local: _Local):
        self._local = local

    def __enter__(self) -> None:
        self._local.muted = True

    def __exit__(self, *exc: object) -> None:
        self._local.muted = False
