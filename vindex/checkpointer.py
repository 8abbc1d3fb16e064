"""When to checkpoint, and running it: the durability side of an open index.

Every commit counts the vectors it touched (``note``); once ``checkpoint_every`` have been
written since the last checkpoint (or the last one failed), one is due. The part that needs
the writers' lock (making the store durable up to the log's end and copying the state) runs
under it; writing the copy (tens of MB on a large index, with its fsyncs) and truncating the
log it covers run without, so writers go on meanwhile.

Due checkpoints run on the background thread between its turns (``run``), never inside a
job: a job changes the store and its own tables (the copies it leaves to cut) in steps, and
a checkpoint must not capture one half applied. The copies waiting to be cut are saved with
it (``extras``) and, when no log follows it, restored at open (``restored``).
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from . import checkpoint, oplog


def record_ops(rec: oplog.Record) -> int:
    """Vectors a record touches (checkpoint pacing)."""
    a = rec.arrays
    return sum(int(a[k].shape[0]) for k in ("u_vids", "d_vids", "r_vids", "m_vids") if k in a) or 1


class Checkpointer:
    """Checkpoints of one engine: counts writes, says when one is due, and saves it."""

    def __init__(self, engine, seq: int):
        self._engine = engine
        self.seq = seq               # log covered by the newest checkpoint
        self.ops_since = 0           # vectors written since it
        self._write_lock = threading.Lock()  # one checkpoint written at a time
        self._failed = False
        # more arrays for each checkpoint (the background's copies waiting to be cut), and
        # those a checkpoint with no log after it held (see ``Index.open``)
        self.extras: Callable[[], dict[str, np.ndarray]] | None = None
        self.restored: dict[str, np.ndarray] = {}
        self.count = 0               # checkpoints ``run`` made

    def note(self, rec: oplog.Record) -> None:
        """A record was committed (caller holds the writers' lock): count its vectors."""
        self.ops_since += record_ops(rec)

    def due(self) -> bool:
        return self._failed or self.ops_since >= self._engine.config.checkpoint_every

    def run(self) -> None:
        """Checkpoint now: copy the state under the writers' lock, write it without."""
        with self._engine.lock:
            write = self.start()
        write()  # files and fsyncs without the writers' lock
        self.count += 1

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
