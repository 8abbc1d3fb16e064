"""The engine: store + in-memory state + the commit path shared by foreground writes and
background rebalancing. Its checkpoints are ``checkpoints`` (see ``checkpointer``)."""
from __future__ import annotations

import threading

import numpy as np

from . import layout, oplog
from .checkpointer import Checkpointer
from .groupsync import GroupSync
from .iosched import BackgroundPacer, BusyClock
from .readers import Readers
from .state import State
from .storage import Change, IOClass, PostingStore

#: The smallest share of wall time foreground writes get under ``io_scheduler="sla"``.
UPDATE_DUTY_FLOOR = 0.7


class Engine:
    """Everything an index is made of, and the lock that serialises its writers."""

    def __init__(self, path: str, manifest: layout.Manifest, store: PostingStore, state: State,
                 seq: int, build_stats: dict | None = None):
        self.path = path
        self.manifest = manifest
        self.config = manifest.config
        self.dim = manifest.dim
        self.store = store
        self.state = state
        self.lock = threading.RLock()
        self.readers = Readers()
        self.seq = seq                # last applied log sequence number
        self.build_stats = build_stats or {}
        self.checkpoints = Checkpointer(self, seq)
        self.limit = self.config.posting_limit(self.dim)
        store.continue_after(seq)
        self.group = GroupSync(lambda: self.store.sync(), lambda: self.seq)
        target = self.config.interactive_p99_ms / 1000
        self.pacer = BackgroundPacer(self.config.io_scheduler, target)
        # Foreground writes are paced too, but never below 70% of the time: an ingest still
        # progresses while searches miss their target.
        self.update_pacer = BackgroundPacer(self.config.io_scheduler, target, floor=UPDATE_DUTY_FLOOR)
        self.write_time = BusyClock()  # what foreground writes charge the update pacer

    def observe_search(self, seconds: float, n_queries: int) -> None:
        """A search of ``n_queries`` took ``seconds``: what both pacers adapt to."""
        self.pacer.observe(seconds, n_queries)
        self.update_pacer.observe(seconds, n_queries)

    def yield_to_searches(self) -> None:
        """Under ``io_scheduler="sla"``, wait (GIL released, at most the p99 target) until no
        search is running. Writers and rebalancing call this between stretches that hold the
        GIL, so a search runs to its end instead of waiting for the GIL at every step."""
        if self.config.io_scheduler == "sla":
            self.readers.wait_for_searches(self.config.interactive_p99_ms / 1000)

    def commit(self, change: Change, rec: oplog.Record, io: IOClass, *, graph_done: bool = False) -> None:
        """Write ``change`` with ``rec`` atomically, then apply ``rec``. Caller holds ``lock``."""
        change.log = oplog.encode(rec)
        change.pause = self.yield_to_searches
        self.yield_to_searches()
        self.seq = self.store.commit(change, io)
        with self.readers.exclusive():  # no search is between reading postings and checking versions
            self.state.apply(rec, graph_done=graph_done)
        self.checkpoints.note(rec)

    def acknowledge(self, seq: int) -> None:
        """Return once the user write committed as log record ``seq`` may be acknowledged:
        at once under ``durability="process"`` (the log write survives a process kill), after
        a (shared) fsync under ``"fsync"``. Call without holding ``lock``, so that writers
        committing meanwhile join the next fsync."""
        if self.config.durability == "fsync" and seq > 0:
            self.group.wait(seq)

    def lengths(self, pids: np.ndarray) -> np.ndarray:
        """Records per posting (0 for postings never written)."""
        stored = self.store.lengths()
        pids = np.asarray(pids, dtype=np.int64)
        out = np.zeros(pids.shape[0], dtype=np.int64)
        inside = pids < stored.shape[0]
        out[inside] = stored[pids[inside]]
        return out
