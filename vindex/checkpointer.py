"""When to checkpoint, and running it: the durability side of an open index.

Every commit counts the vectors it touched (``note``); once ``checkpoint_every`` have been
written since the last checkpoint (or the last one failed), one is due, and a thread of its
own saves it. The part that needs the writers' lock (making the store durable up to the
log's end and copying the state) runs under it; writing the copy (tens of MB on a large
index, with its fsyncs) and truncating the log it covers run without, so writers and the
background go on meanwhile.

A checkpoint never captures a half-applied background job. A job changes the store and its
own tables (the copies it leaves to cut) in steps, so it runs inside ``excluded()``: a
checkpoint copies the state only when no job is inside, and while one is due no job enters
until it has started. So a due checkpoint lands between two background turns, as soon as
the running one ends.

The copies waiting to be cut are saved with each checkpoint (``extras``) and, when no log
follows it, restored at open (``restored``).
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from . import checkpoint, oplog
from .attempts import Attempts
from .exiting import interpreter_exiting
from .failures import Backoff, RateLimitedLog
from .iosched import lower_thread_priority

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger("vindex.checkpoint")

#: Pause after a failed checkpoint before trying again (the log keeps everything meanwhile);
#: it doubles with each failure in a row up to ``RETRY_PAUSE_MAX_S``, and a commit cuts it short.
RETRY_PAUSE_S = 0.5
RETRY_PAUSE_MAX_S = 30.0


def record_ops(rec: oplog.Record) -> int:
    """Vectors a record touches (checkpoint pacing)."""
    a = rec.arrays
    return sum(int(a[k].shape[0]) for k in ("u_vids", "d_vids", "r_vids", "m_vids") if k in a) or 1


class Checkpointer:
    """Checkpoints of one engine: counts writes, decides when one is due and saves it, on
    its own thread between ``start_thread`` and ``close`` (``save`` at build and close)."""

    def __init__(self, engine: "Engine", seq: int):
        self._engine = engine
        self.seq = seq               # log covered by the newest checkpoint
        self.ops_since = 0           # vectors written since it
        self._write_lock = threading.Lock()  # one checkpoint written at a time
        self._failed = False
        # more arrays for each checkpoint (the background's copies waiting to be cut), and
        # those a checkpoint with no log after it held (see ``Index.open``)
        self.extras: Callable[[], dict[str, np.ndarray]] | None = None
        self.restored: dict[str, np.ndarray] = {}
        self.count = 0               # checkpoints the thread wrote
        self.errors = 0              # ... and those that failed
        self._cv = threading.Condition()
        self._jobs = 0               # background jobs inside ``excluded()``
        self._attempts = Attempts()  # checkpoints the thread started (copied the state for)
        self._writing = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self._backoff = Backoff(RETRY_PAUSE_S, RETRY_PAUSE_MAX_S)
        self._failures = RateLimitedLog(log)  # a full disk fails every retry alike
        self._retry_now = False  # a commit went through since the last failure

    # --- when -----------------------------------------------------------------------------------
    def note(self, rec: oplog.Record) -> None:
        """A record was committed (caller holds the writers' lock): count its vectors, and
        wake the thread once a checkpoint is due."""
        self.ops_since += record_ops(rec)
        if self.due():
            with self._cv:
                self._retry_now = True
                self._cv.notify_all()

    def due(self) -> bool:
        return self._failed or self.ops_since >= self._engine.config.checkpoint_every

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        """A background job runs inside this context: no checkpoint copies the state while
        one is inside, and a job waits to enter while a checkpoint is due and not started,
        so back-to-back jobs cannot hold checkpoints off."""
        with self._cv:
            if self._thread is not None and not self._stop and self.due():
                want = self._attempts.started + 1
                self._cv.wait_for(lambda: self._attempts.started >= want or self._stop)
            self._jobs += 1
        try:
            yield
        finally:
            with self._cv:
                self._jobs -= 1
                self._cv.notify_all()

    # --- how ------------------------------------------------------------------------------------
    def save(self) -> None:
        """Save the state so reopening replays no log. Caller holds the writers' lock."""
        self.start()()

    def start(self) -> Callable[[], None]:
        """The part of a checkpoint that needs the writers' lock (caller holds it): make
        the store durable up to the engine's ``seq`` and copy the state. Returns the rest,
        which does not: writing the copy, then dropping the log it covers (writers waited
        for those fsyncs when they ran under the lock). Any thread may run it; one older than
        a checkpoint already written is skipped."""
        eng = self._engine
        if eng.config.store == "memory":
            self.ops_since = 0
            return lambda: None
        eng.store.sync()
        extras = self.extras() if self.extras is not None else {}
        # copies: the writers change these arrays in place once the lock is released
        arrays = {k: np.array(v) for k, v in {**eng.state.arrays(), **extras}.items()}
        seq, stats = eng.seq, dict(eng.build_stats)
        self.ops_since = 0

        def write() -> None:
            with self._write_lock:
                if seq < self.seq:
                    return
                try:
                    checkpoint.save(eng.path, seq, arrays, stats)
                    eng.store.truncate_log(seq)
                    checkpoint.prune(eng.path, seq)
                except BaseException:
                    self._failed = True  # due again at once (the log keeps everything)
                    raise
                self._failed = False
                self.seq = seq
        return write

    # --- the thread -----------------------------------------------------------------------------
    def start_thread(self) -> None:
        """Checkpoint on a thread of its own whenever one is due, until ``close``."""
        self._thread = threading.Thread(target=self._run, name="vindex-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._engine.config.io_scheduler == "sla":
            lower_thread_priority()  # copying and writing the state gives the cores to searches first
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._stop or self.due())
                if self._stop:
                    return
                self._writing = True
            failed = False
            try:
                self._checkpoint()
                self.count += 1
                self._backoff.reset()
            except BaseException as exc:  # keep the thread alive; report through wait_idle
                if interpreter_exiting():
                    log.info("checkpoints stopped: the interpreter is exiting")
                    return
                failed = True
                self._failures.failure("background checkpoint failed", exc)
                with self._cv:
                    self.errors += 1
                    self._attempts.failed(self._attempts.started, exc)
            finally:
                with self._cv:
                    self._writing = False
                    self._cv.notify_all()
            if failed:  # (one failing before its write, as a sync on a full disk does, is still due)
                pause = self._backoff.next()
                with self._cv:
                    self._retry_now = False
                    self._cv.wait_for(lambda: self._stop or self._retry_now, timeout=pause)

    def _checkpoint(self) -> None:
        """Wait until no background job is inside (none enters meanwhile: one is due), copy
        the state under the writers' lock, then write it without."""
        with self._cv:
            self._cv.wait_for(lambda: self._jobs == 0)
        try:
            with self._engine.lock:
                write = self.start()
        finally:
            with self._cv:
                self._attempts.begin()
                self._cv.notify_all()
        write()  # files and fsyncs without the writers' lock

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no checkpoint is being written (a due one that has not started is not
        waited for); False on timeout. Raises the failure of a checkpoint that starts after
        the call and fails."""
        with self._cv:
            return self._attempts.wait(self._cv, lambda: not self._writing, timeout)

    def close(self) -> None:
        """Stop the thread (a checkpoint being written finishes first)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
