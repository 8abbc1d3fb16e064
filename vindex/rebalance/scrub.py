"""Scrubbing: re-checking stored vectors whose best postings may have changed.

SPFresh's reassignment only looks around a split; heads made elsewhere (other splits, new
regions, merges, recentred heads) also take vectors' best postings away, and on a churn
benchmark a few percent of vectors ended up outside their nearest head's posting without
this. Writes earn re-checks (``scrub_ratio`` per vector written); a cursor walks the heads.
"""
from __future__ import annotations

import threading

import numpy as np

from vindex import native

from ..engine import Engine
from ..storage import records
from .reads import PostingReader
from .reassign import Reassigner


class Scrubber:
    """The scrub job of one index; its credit is guarded by ``cv`` (the background's)."""

    def __init__(self, engine: Engine, reader: PostingReader, reassigner: Reassigner, counters: dict,
                 cv: threading.Condition):
        self._engine = engine
        self._reader = reader
        self._reassigner = reassigner
        self._counters = counters
        self._cv = cv
        self.credit = 0.0  # re-checks earned and not done yet
        self._cursor = 0

    def earn(self, n_written: int) -> None:
        """Writes earn re-checks of as many stored vectors (times ``scrub_ratio``); caller
        holds ``cv``."""
        cap = float(max(len(self._engine.state.idmap.versions), 1))
        self.credit = min(cap, self.credit + n_written * self._engine.config.scrub_ratio)

    def run(self) -> None:
        """Re-check the vectors of the next ``rebalance_batch`` heads: move any whose posting
        is no longer among the ones the RNG rule picks for them. A cheap look at each
        posting's neighbourhood (``native.lire.scrub_doubts``) picks the records worth the
        full check, so a pass costs little more than its reads."""
        eng = self._engine
        g = eng.state.graph
        alive = np.flatnonzero(g.alive[: g.n])
        if alive.size == 0:
            with self._cv:
                self.credit = 0.0
            return
        start = np.searchsorted(alive, self._cursor)
        pids = np.roll(alive, -start)[: eng.config.rebalance_batch]
        self._cursor = int(pids[-1]) + 1
        recs_f, recs_u, offsets, keep, n_live = self._reader.snapshot(pids)
        rows = np.flatnonzero(keep)
        with self._cv:
            self.credit = max(0.0, self.credit - max(1, rows.size))
        if rows.size == 0:
            return
        self._counters["scrubbed"] += int(rows.size)
        # a look at each posting's graph neighbourhood vouches for most records; replica
        # selection runs again only for the rest
        home = np.full(recs_u.shape[0], -1, dtype=np.int32)
        home[rows] = eng.state.idmap.home[recs_u[rows, 0].astype(np.int64)]
        arrays = g.arrays_  # one generation, taken after the homes: it holds every head they name
        cfg = eng.config
        rows = np.flatnonzero(native.lire.scrub_doubts(
            recs_f, keep, offsets, pids.astype(np.int64), home, arrays.vectors, arrays.nbrs, arrays.alive,
            cfg.replica_eps, cfg.rng_factor))
        self._counters["scrub_rechecked"] += int(rows.size)
        if rows.size == 0:
            return
        owner = np.repeat(pids, np.diff(offsets))[rows]
        self._reassigner.reassign_vids(recs_u[rows, 0].astype(np.int64), recs_u[rows, 1].astype(np.uint8),
                                       recs_f[rows, records.HEADER_WORDS:], owner)
