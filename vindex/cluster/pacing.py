"""The coordinator's side of pacing writes to searches, as :class:`vindex.Index` does in-process.

A search's latency is the coordinator's work (validation, the fan-out, the merge) plus the
slowest shard's; a write's coordinator work (validation, splitting, serialising the vectors)
holds the same interpreter lock. So, with the index's own ``io_scheduler`` and
``interactive_p99_ms``, a write here waits for running small searches before its stretch
that holds the lock (at most the target), and the writer gets a share of wall time (at least
``UPDATE_DUTY_FLOOR``) that shrinks while small searches, timed end to end, miss the target.
The share is of wall time with some write running: writers overlapping (several threads
writing, each waiting for its shards) are charged their union, not the sum, which at full
duty would pause them for as long as they overlap.
Each replica's index paces its own part of the write the same way against its own searches.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

from vindex.config import SMALL_SEARCH_QUERIES, IndexConfig
from vindex.engine import UPDATE_DUTY_FLOOR
from vindex.iosched import BackgroundPacer, BusyClock
from vindex.readers import Readers


class WritePacing:
    def __init__(self, config: IndexConfig, clock: Callable[[], float] = time.monotonic):
        self._sla = config.io_scheduler == "sla"
        self._target = config.interactive_p99_ms / 1000
        self._pacer = BackgroundPacer(config.io_scheduler, self._target, clock=clock, floor=UPDATE_DUTY_FLOOR)
        self._searches = Readers()
        self._busy = BusyClock()  # wall time with some write running

    @contextlib.contextmanager
    def search(self, n_queries: int, interactive: bool | None = None) -> Iterator[None]:
        """Around a whole search: writers yield to an interactive one (by default, one of at
        most ``SMALL_SEARCH_QUERIES`` queries), and its time feeds the pacer."""
        if interactive is None:
            interactive = n_queries <= SMALL_SEARCH_QUERIES
        started = time.perf_counter()
        with self._searches.search(interactive=bool(interactive)):
            yield
        self._pacer.observe(time.perf_counter() - started, n_queries)

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        """Around a write's coordinator work and its wait for the shards; the writer pauses
        after it (lock released) once it used its share."""
        if self._sla:
            self._searches.wait_for_searches(self._target)
        self._busy.enter()
        try:
            yield
        finally:
            pause = self._pacer.charge(self._busy.leave())
        if pause > 0:
            time.sleep(pause)

    @property
    def duty(self) -> float:
        return self._pacer.duty
