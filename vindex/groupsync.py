"""Group commit: one fsync makes every write committed before it durable.

Writers commit under the engine lock, release it, then wait here for their log sequence
number to become durable. The first waiter syncs the store's log; writers that committed
while that fsync ran wait for it to finish and share the next one. Under concurrency the
fsync cost is paid once per group instead of once per write.
"""
from __future__ import annotations

import threading
from typing import Callable


class GroupSync:
    """Tracks the highest durable log sequence number and elects one syncing thread."""

    def __init__(self, sync: Callable[[], None], committed: Callable[[], int]):
        self._sync = sync            # make everything committed so far durable
        self._committed = committed  # highest sequence number whose commit has returned
        self._cv = threading.Condition()
        self._durable = 0
        self._syncing = False
        self.syncs = 0

    @property
    def durable(self) -> int:
        return self._durable

    def wait(self, seq: int) -> None:
        """Return once log record ``seq`` is durable; raises the sync's error if the fsync that
        would cover it fails (the write is then not acknowledged)."""
        with self._cv:
            while self._durable < seq:
                if not self._syncing:
                    self._syncing = True
                    break
                self._cv.wait()
            else:
                return
        target, ok = self._committed(), False
        try:
            self._sync()
            ok = True
        finally:
            with self._cv:
                self._syncing = False
                if ok:
                    self._durable = max(self._durable, target)
                    self.syncs += 1
                self._cv.notify_all()
