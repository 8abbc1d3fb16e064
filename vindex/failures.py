"""Repeated failures of background work: a log that reports each kind of failure once per
interval with the count of repeats it held back, and a capped exponential backoff between
retries. A full disk fails every retry of the same work the same way; a traceback for each
would bury everything else in the log.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from .errors import StorageError

#: Default for ``RateLimitedLog(interval_s=)``.
LOG_INTERVAL_S = 60.0


def failure_kind(exc: BaseException) -> tuple[str, int | None]:
    """What makes two failures "the same": the exception's class and errno."""
    return type(exc).__name__, getattr(exc, "errno", None)


class RateLimitedLog:
    """Logs at most one line per kind of failure per ``interval_s``; the next line it logs of
    that kind says how many it held back. A ``StorageError`` (a full disk, a failing disk) is
    logged without its traceback: the message says what failed, the code path is known."""

    def __init__(self, logger: logging.Logger, interval_s: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self._log = logger
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[tuple[str, int | None], tuple[float, int]] = {}  # kind -> (last logged, held back)

    def failure(self, what: str, exc: BaseException) -> bool:
        """Log ``what`` failed with ``exc`` unless its kind was logged within the interval;
        True if logged."""
        kind, now = failure_kind(exc), self._clock()
        with self._lock:
            last, held = self._kinds.get(kind, (None, 0))
            if last is not None and now - last < self.interval_s:
                self._kinds[kind] = (last, held + 1)
                return False
            self._kinds[kind] = (now, 0)
        repeats = f" ({held} more like it in the last {now - last:.0f} s not logged)" if held else ""
        self._log.error("%s: %s: %s%s", what, type(exc).__name__, exc, repeats,
                        exc_info=None if isinstance(exc, StorageError) else exc)
        return True


class Backoff:
    """Pauses between retries: ``first_s``, doubling after each failure up to ``max_s``;
    ``reset`` after a success."""

    def __init__(self, first_s: float, max_s: float):
        self.first_s, self.max_s = first_s, max_s
        self._next = first_s

    def next(self) -> float:
        """The pause before the next retry (and doubles the one after)."""
        pause = self._next
        self._next = min(self._next * 2, self.max_s)
        return pause

    def reset(self) -> None:
        self._next = self.first_s
