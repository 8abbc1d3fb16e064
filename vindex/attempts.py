"""Failures of background work, reported to callers that wait for it.

Background work (rebalancing turns, checkpoints) runs on its own threads and is retried
when it fails; a caller waiting for it should hear of a failure only if the attempt started
after the caller began waiting: an attempt already running may have met a cause the caller
has just removed, and its retry is what the caller asks about.
"""
from __future__ import annotations

import threading
from typing import Callable


class Attempts:
    """Numbers attempts and remembers the last failure. Guarded by the caller's condition."""

    def __init__(self) -> None:
        self.started = 0
        self._failed_at = -1
        self.error: BaseException | None = None

    def begin(self) -> int:
        """Number a new attempt."""
        self.started += 1
        return self.started

    def failed(self, attempt: int, exc: BaseException) -> None:
        self._failed_at = attempt
        self.error = exc

    def wait(self, cv: threading.Condition, idle: Callable[[], bool], timeout: float | None) -> bool:
        """Wait on ``cv`` (held by the caller) until ``idle()``; False on timeout. Raises the
        failure of an attempt that starts after the call."""
        first = self.started + 1
        done = cv.wait_for(lambda: idle() or self._failed_at >= first, timeout)
        if self._failed_at >= first and self.error is not None:
            raise self.error
        return bool(done)
