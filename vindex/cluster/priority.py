"""The CPU priority of a replica's write thread: below its searches while searches come in.

Replicas of different shards share a machine's cores, and a search waits for every shard:
its threads must win the cores from the other replicas' writes, which in-process pacing
(:meth:`vindex.Index.upsert` yields only to searches of its own index) cannot arrange. The
kernel can: the thread that applies writes runs at ``LOW_PRIORITY_NICE`` (the nice of the
index's own background threads) for ``window`` seconds after each search, and at normal
priority otherwise, so an ingest with no searches keeps its full share of a loaded machine.
"""
from __future__ import annotations

import os
import threading
import time

from vindex.iosched import LOW_PRIORITY_NICE

#: Seconds after a search during which writes run at low priority.
SEARCH_WINDOW_S = 1.0


class WritePriority:
    def __init__(self, window: float = SEARCH_WINDOW_S, nice: int = LOW_PRIORITY_NICE):
        self.window, self.nice = window, nice
        self._last_search = -float("inf")

    def searched(self) -> None:
        """A search arrived (called on the search's own thread; a plain store, no lock)."""
        self._last_search = time.monotonic()

    def before_write(self) -> int:
        """Set the calling thread's nice for the write it is about to apply; returns it."""
        want = self.nice if time.monotonic() - self._last_search < self.window else 0
        tid = threading.get_native_id()
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) != want:
                os.setpriority(os.PRIO_PROCESS, tid, want)
        except (AttributeError, OSError):  # raising it back needs privilege; not POSIX
            pass
        try:
            return os.getpriority(os.PRIO_PROCESS, tid)
        except (AttributeError, OSError):
            return 0
