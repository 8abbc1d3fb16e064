"""Coalescing of concurrent small searches into one batch call.

A batch-size-1 search through the library pays a fixed cost per call (Python glue, one RocksDB
multi-get, kernel launches) that is several times its per-query cost, and a batch reads each
posting once for all the queries that need it. Under concurrent load the server therefore
queues small searches (at most ``vindex.config.SMALL_SEARCH_QUERIES`` queries; larger
requests are batches already) that share a collection and parameters, and runs whatever has
queued as one ``Index.search`` call. There is no timer: a lone request runs at once (at most
``max_running`` batches per key run together, one per core); requests that arrive while those
run form the next batch. Bookkeeping runs on the event loop only, so it needs no locks.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Callable, Hashable, NamedTuple

import numpy as np

from vindex.results import SearchResult

#: Queries per coalesced call at most.
MAX_BATCH_ROWS = 256


class Rows(NamedTuple):
    """A caller's queries are rows ``lo:hi`` of ``result``."""

    result: SearchResult
    lo: int
    hi: int


class SearchBatcher:
    def __init__(self, pool: Executor, max_running: int):
        self._pool = pool
        self._max_running = max(1, max_running)
        self._queues: dict[Hashable, list[tuple[np.ndarray, asyncio.Future, float | None]]] = {}
        self._running: dict[Hashable, int] = {}

    async def search(self, key: Hashable, run: Callable[[np.ndarray, float | None], SearchResult],
                     queries: np.ndarray, deadline: float | None = None) -> Rows:
        """Run ``run(queries, deadline)``, possibly as part of a larger call for the same ``key``;
        ``queries``' results are the returned rows of that call's result.

        ``run`` must give each query row the result it would get alone (``Index.search`` does),
        and ``queries`` must already be valid: one bad row would fail the whole batch.
        ``deadline`` (``time.monotonic()``, None for none): a batch runs with the latest
        deadline among its requests, so none loses reads it still had time for."""
        fut = asyncio.get_running_loop().create_future()
        self._queues.setdefault(key, []).append((queries, fut, deadline))
        if self._running.get(key, 0) < self._max_running:
            self._running[key] = self._running.get(key, 0) + 1
            asyncio.ensure_future(self._drain(key, run))
        return await fut

    async def _drain(self, key: Hashable, run: Callable[[np.ndarray, float | None], SearchResult]) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queues.get(key):
                queue = self._queues[key]
                take, rows = 0, 0
                while take < len(queue) and (take == 0 or rows + queue[take][0].shape[0] <= MAX_BATCH_ROWS):
                    rows += queue[take][0].shape[0]
                    take += 1
                batch, self._queues[key] = queue[:take], queue[take:]
                batch = [b for b in batch if not b[1].done()]  # cancelled (deadline) meanwhile
                if not batch:
                    continue
                deadlines = [d for _, _, d in batch]
                deadline = None if None in deadlines else max(deadlines)
                try:
                    res = await loop.run_in_executor(self._pool, run, np.concatenate([q for q, _, _ in batch]),
                                                     deadline)
                except BaseException as e:  # noqa: BLE001 - every waiter gets the failure
                    for _, f, _ in batch:
                        if not f.done():
                            f.set_exception(e)
                    continue
                lo = 0
                for q, f, _ in batch:
                    hi = lo + q.shape[0]
                    if not f.done():
                        f.set_result(Rows(res, lo, hi))
                    lo = hi
        finally:
            self._running[key] -= 1
            if not self._running[key]:
                del self._running[key]
                if not self._queues.get(key):
                    self._queues.pop(key, None)
