"""The engine: store + in-memory state + the commit path shared by foreground writes and
background rebalancing, and checkpoints."""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from . import checkpoint, layout, oplog
from .groupsync import GroupSync
from .iosched import BackgroundPacer
from .readers import Readers
from .state import State
from .storage import Change, IOClass, PostingStore


def _ops(rec: oplog.Record) -> int:
    """Vectors a record touches (checkpoint pacing)."""
    a = rec.arrays
    return sum(int(a[k].shape[0]) for k in ("u_vids", "d_vids", "r_vids", "m_vids") if k in a) or 1


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
        self.checkpoint_seq = seq     # log covered by the newest checkpoint
        self._checkpoint_lock = threading.Lock()  # one checkpoint written at a time
        self._checkpoint_failed = False
        self.ops_since_checkpoint = 0
        self.build_stats = build_stats or {}
        # more arrays for each checkpoint (the rebalancer's copies waiting to be cut), and
        # those a checkpoint with no log after it held (see ``Index.open``)
        self.checkpoint_extras: Callable[[], dict[str, np.ndarray]] | None = None
        self.restored_extras: dict[str, np.ndarray] = {}
        self.limit = self.config.posting_limit(self.dim)
        store.continue_after(seq)
        self.group = GroupSync(lambda: self.store.sync(), lambda: self.seq)
        target = self.config.interactive_p99_ms / 1000
        self.pacer = BackgroundPacer(self.config.io_scheduler, target)
        # Foreground writes are paced too, but never below 70% of the time: an ingest still
        # progresses while searches miss their target.
        self.update_pacer = BackgroundPacer(self.config.io_scheduler, target, floor=UPDATE_DUTY_FLOOR)

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
        self.ops_since_checkpoint += _ops(rec)

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

    def save_checkpoint(self) -> None:
        """Save the state so reopening replays no log. Caller holds ``lock``."""
        self.start_checkpoint()()

    def start_checkpoint(self) -> Callable[[], None]:
        """The part of a checkpoint that needs ``lock`` (caller holds it): make the store
        durable up to ``seq`` and copy the state. Returns the rest, which does not: writing
        the copy (47 MB on 1M, 0.2-0.4 s with its fsyncs, which writers waited for when it
        ran under the lock), then dropping the log it covers. Any thread may run it; one
        older than a checkpoint already written is skipped."""
        if self.config.store == "memory":
            self.ops_since_checkpoint = 0
            return lambda: None
        self.store.sync()
        extras = self.checkpoint_extras() if self.checkpoint_extras is not None else {}
        # copies: the writers change these arrays in place once the lock is released
        arrays = {k: np.array(v) for k, v in {**self.state.arrays(), **extras}.items()}
        seq, stats = self.seq, dict(self.build_stats)
        self.ops_since_checkpoint = 0

        def write() -> None:
            with self._checkpoint_lock:
                if seq < self.checkpoint_seq:
                    return
                try:
                    checkpoint.save(self.path, seq, arrays, stats)
                    self.store.truncate_log(seq)
                    checkpoint.prune(self.path, seq)
                except BaseException:
                    self._checkpoint_failed = True  # due again at once (the log keeps everything)
                    raise
                self._checkpoint_failed = False
                self.checkpoint_seq = seq
        return write

    def checkpoint_due(self) -> bool:
        return self._checkpoint_failed or self.ops_since_checkpoint >= self.config.checkpoint_every
