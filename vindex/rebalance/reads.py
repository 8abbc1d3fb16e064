"""Reading postings for background work: records, liveness, and copies waiting to be cut.

Only the background removes records, so what it fetched of a posting without the writers'
lock is a prefix of that posting once the lock is taken (see ``PostingReader.snapshot``).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, NamedTuple

import numpy as np

from vindex import native

from ..engine import Engine
from ..storage import IOClass, records


class Postings(NamedTuple):
    """Records of postings read together: float and integer views of each record,
    ``offsets`` (posting ``i`` is ``offsets[i]:offsets[i+1]``), ``keep`` (live and not a
    duplicate or a copy waiting to be cut) and live vectors per posting."""

    recs_f: np.ndarray
    recs_u: np.ndarray
    offsets: np.ndarray
    keep: np.ndarray
    n_live: np.ndarray


def copy_keys(vids: np.ndarray, versions: np.ndarray) -> np.ndarray:
    """One int64 per copy of a vector, ``vid * 256 + version``: what cuts and stale copies
    name (a copy the user rewrote since has another version)."""
    return np.asarray(vids, dtype=np.int64) * 256 + np.asarray(versions, dtype=np.int64)


def copies_named(recs_u: np.ndarray, offsets: np.ndarray, keys: list[np.ndarray]) -> np.ndarray:
    """Mask of the records of posting ``i`` (``offsets[i]:offsets[i+1]``) whose copy key
    (``vid * 256 + version``) is in ``keys[i]``."""
    sizes = np.fromiter((np.size(k) for k in keys), dtype=np.int64, count=len(keys))
    flat = np.concatenate([np.asarray(k, dtype=np.int64) for k in keys]) if keys else np.zeros(0, np.int64)
    return native.lire.copies_named(recs_u, np.asarray(offsets, dtype=np.int64),
                                    np.concatenate(([0], np.cumsum(sizes))), flat)


class PostingReader:
    """Reads postings for the background. ``stale_mask(pids, recs_u, offsets)``: mask of the
    records that are copies waiting to be cut (None when there are none); they count as
    garbage. ``pool``: the one thread ``read_ahead`` fetches on."""

    def __init__(self, engine: Engine, stale_mask: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray | None],
                 pool: ThreadPoolExecutor):
        self._engine = engine
        self._stale_mask = stale_mask
        self.pool = pool
        self._scratch = threading.local()  # per thread: live_dedupe's seen array

    def read(self, pids: np.ndarray) -> Postings:
        """Posting records (copied out of the per-thread read buffer) and their liveness.

        Callers that drop records judged dead here hold the writers' lock: a foreground write
        commits its records before it marks their vids live, and a read in between would take
        new records for garbage."""
        return self.decode(pids, *self.fetch(pids))

    def snapshot(self, pids: np.ndarray) -> Postings:
        """``read``, fetching outside the writers' lock and judging liveness under it: a
        read under the lock held writers back for a good part of every round.

        Only the background removes records, so what the fetch read of each posting
        (``np.diff(offsets)`` records) is a prefix of it once the lock is taken; and a writer
        holds the lock from its commit until it marks its vids live, so every record read is
        judged as its writer left it."""
        fetched = self.fetch(pids)
        eng = self._engine
        with eng.lock:
            if (eng.lengths(pids) < np.diff(fetched[1])).any():  # another writer removed records: read again
                return self.read(pids)
            return self.decode(pids, *fetched)

    def fetch(self, pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posting bytes, copied out of the calling thread's read buffer, and record offsets."""
        batch = self._engine.store.read(pids, IOClass.BACKGROUND)
        return np.array(batch.data), batch.offsets

    def decode(self, pids: np.ndarray, data: np.ndarray, offsets: np.ndarray) -> Postings:
        """``read``'s records and liveness from fetched bytes (liveness as of now)."""
        recs_f, recs_u = records.view(data, self._engine.dim)
        keep, n_live = native.lire.live_dedupe(recs_u, offsets, self._engine.state.idmap.versions,
                                                self._seen_scratch())
        stale = self._stale_mask(pids, recs_u, offsets)
        if stale is not None:  # copies waiting to be cut count as garbage
            keep &= ~stale
            n_live = np.diff(np.concatenate(([0], np.cumsum(keep)))[offsets])
        return Postings(recs_f, recs_u, offsets, keep, n_live)

    def read_ahead(self, pid_lists: list[np.ndarray]) -> Iterator[Postings]:
        """``read`` of each list in turn, fetching the next list while the caller works on
        this one: the store read releases the GIL, and waiting for the neighbourhoods'
        reads was a large share of a drain. A fetched posting may miss a move the caller
        makes meanwhile; that costs at most a redundant copy (same version), which searches
        and ``live_dedupe`` drop as a duplicate."""
        ahead = None
        for i, pids in enumerate(pid_lists):
            fetched = ahead.result() if ahead is not None else self.fetch(pids)
            ahead = self.pool.submit(self.fetch, pid_lists[i + 1]) if i + 1 < len(pid_lists) else None
            try:
                yield self.decode(pids, *fetched)
            except GeneratorExit:
                if ahead is not None:
                    ahead.cancel()
                raise

    def _seen_scratch(self) -> np.ndarray:
        n = self._engine.state.idmap.versions.shape[0]
        seen = getattr(self._scratch, "seen", np.zeros(0, dtype=np.int64))
        if seen.shape[0] < n:
            seen = self._scratch.seen = np.full(max(n, 2 * seen.shape[0]), -1, dtype=np.int64)
        return seen
