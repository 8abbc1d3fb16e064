"""Fault injection for tests: a posting store whose writes or syncs fail on demand, as a full
or failing disk would make them fail.

    faults = FaultyStore.install(index)
    faults.arm(commit_after=3)   # the 4th commit from now raises StorageError(ENOSPC)
    faults.clear()               # the disk has room again

A failing commit writes nothing (RocksDB applies a write batch entirely or not at all), so the
caller's write is neither acknowledged nor applied.
"""
from __future__ import annotations

import errno as errno_codes
import threading
import time
from typing import Any

from ..errors import StorageError
from .base import Change, IOClass


class FaultyStore:
    """Delegates to another store; ``arm`` makes chosen commits or syncs raise."""

    def __init__(self, inner: Any):
        self._inner = inner
        self._lock = threading.Lock()
        self._commit_after: int | None = None
        self._sync = False
        self._classes: frozenset[IOClass] = frozenset(IOClass)
        self._errno = errno_codes.ENOSPC
        self._hold: threading.Event | None = None
        self.holding = threading.Event()  # set once a failing commit waits for its hold
        self.failures = 0
        self.failed_at: list[float] = []  # time.monotonic() of each failing commit or sync

    @classmethod
    def install(cls, index: Any) -> "FaultyStore":
        """Put a fault-injecting wrapper in front of ``index``'s store."""
        eng = index._engine
        faulty = cls(eng.store)
        eng.store = faulty
        return faulty

    def arm(self, *, commit_after: int | None = None, sync: bool = False,
            classes: tuple[IOClass, ...] = tuple(IOClass), err: int = errno_codes.ENOSPC,
            hold: threading.Event | None = None) -> None:
        """From now on, every commit of ``classes`` after the first ``commit_after`` fails
        (None: commits succeed), and with ``sync`` every sync fails, with errno ``err``. With
        ``hold``, a failing commit sets ``holding`` and waits for ``hold`` before it raises:
        a failure met before the cause was removed (``clear``), reported after."""
        with self._lock:
            self._commit_after, self._sync = commit_after, sync
            self._classes, self._errno, self._hold = frozenset(classes), err, hold

    def clear(self) -> None:
        self.arm()

    @staticmethod
    def _fail(what: str, err: int) -> None:
        raise StorageError(err, f"injected fault: {what} failed ({errno_codes.errorcode[err]})")

    def commit(self, change: Change, io: IOClass) -> int:
        with self._lock:
            armed = self._commit_after is not None and io in self._classes
            fail = armed and self._commit_after <= 0
            if armed and not fail:
                self._commit_after -= 1
            self.failures += int(fail)
            if fail:
                self.failed_at.append(time.monotonic())
            hold, err = self._hold, self._errno
        if fail:
            if hold is not None:  # outside the lock: ``clear`` must not wait for it
                self.holding.set()
                hold.wait()
            self._fail("commit", err)
        return self._inner.commit(change, io)

    def sync(self, io: IOClass = IOClass.UPDATE) -> None:
        with self._lock:
            if self._sync:
                self.failures += 1
                self.failed_at.append(time.monotonic())
                self._fail("fsync", self._errno)
        self._inner.sync(io)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
