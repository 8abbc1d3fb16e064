"""Coordination between searches and writers without making searches wait for rebalancing.

Two mechanisms, both cheap for readers:

* **Read sections.** A search reads postings and then checks each record's version against
  the version map. A writer commits new copies to the store first and changes the version
  map after; if that change could land between a search's read and its check, the search
  would see neither the old copy (now stale) nor the new one (not read). So a search holds a
  shared *read section* around read + check, and applying a committed record takes the
  section exclusively for the few microseconds the in-memory update needs.
* **Tickets.** A search that chose its postings before a split may read them after it. A
  replaced posting therefore leaves the store only once every search that started before the
  split has finished (``drained``).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class Readers:
    """Read sections and search tickets of one index."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._active: dict[int, bool] = {}  # tickets of running searches, in start order: interactive?
        self._interactive = 0  # running searches that writers yield to
        self._next = 0
        self._reading = 0
        self._writing = False
        self._yielding = 0  # threads in ``wait_for_searches``: what ``end`` must wake

    # --- tickets ------------------------------------------------------------------------------
    def begin(self, interactive: bool = True) -> int:
        with self._lock:
            t = self._next
            self._next += 1
            self._active[t] = interactive
            self._interactive += interactive
            return t

    def end(self, ticket: int) -> None:
        with self._lock:
            if self._active.pop(ticket, False):
                self._interactive -= 1
                if not self._interactive and self._yielding:
                    self._cv.notify_all()

    def wait_for_searches(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no interactive search is running; True if
        none is.

        Writes and rebalancing steps call this before a stretch that holds the GIL (a
        RocksDB write does), so a running search finishes first instead of stalling
        behind it: searches go first, and a write waits at most ``timeout``. Large batches
        (``interactive=False`` in ``search``) are throughput work: yielding to them, back to
        back, held rebalancing to about one step per ``timeout`` (docs/sla.md)."""
        with self._lock:
            self._yielding += 1
            try:
                return self._cv.wait_for(lambda: not self._interactive, timeout)
            finally:
                self._yielding -= 1

    def now(self) -> int:
        """A ticket boundary: searches holding smaller tickets started before this call."""
        with self._lock:
            return self._next

    def drained(self, boundary: int) -> bool:
        """True once no search that started before ``boundary`` is still running."""
        with self._lock:
            return not self._active or next(iter(self._active)) >= boundary

    @contextmanager
    def search(self, interactive: bool = True) -> Iterator[None]:
        t = self.begin(interactive)
        try:
            yield
        finally:
            self.end(t)

    # --- read sections ------------------------------------------------------------------------
    def reading(self) -> "_ReadSection":
        """A context in which writers do not apply committed records (the read section)."""
        return _ReadSection(self)

    def _enter_reading(self) -> None:
        with self._lock:
            while self._writing:
                self._cv.wait()
            self._reading += 1

    def _leave_reading(self) -> None:
        with self._lock:
            self._reading -= 1
            if self._reading == 0 and self._writing:  # a writer (set under this lock) waits for it
                self._cv.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._lock:
            while self._writing:
                self._cv.wait()
            self._writing = True  # new read sections wait from here on
            while self._reading:
                self._cv.wait()
        try:
            yield
        finally:
            with self._lock:
                self._writing = False
                self._cv.notify_all()


class _ReadSection:
    """``Readers.reading()``: a plain class, not a generator context (a search enters one or
    two of these; a generator's setup cost a batch-size-1 search ~2 us each)."""

    __slots__ = ("_readers",)

    def __init__(self, readers: Readers):
        self._readers = readers

    def __enter__(self) -> None:
        self._readers._enter_reading()

    def __exit__(self, *exc: object) -> None:
        self._readers._leave_reading()
