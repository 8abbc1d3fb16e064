"""One shard's replicas, seen from the coordinator: numbered writes, replica choice, repair.

Writes to a shard are serialised here and numbered 1, 2, 3...; each goes to every replica
that is in sync, in parallel, and is acknowledged once all of them have it in their write log
and index. A replica that fails a call (dead, restarting, recovering) leaves the in-sync set;
:meth:`Shard.repair` brings it back: it copies the writes it lacks from the log of a replica
that has the newest one, then lets it serve. A write that reached no replica is retried with
its number (a replica ignores a number it already has) until one comes back.

Reads go to the in-sync replica with the fewest calls outstanding.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any, Callable

from vindex.errors import VindexError

from .remote import REPLICA_DOWN, result

log = logging.getLogger("vindex.cluster")

#: Seconds a repair waits for a replica's state before counting it as still down.
PROBE_TIMEOUT_S = 2.0
#: Trim the replicas' write logs once per this many writes.
TRIM_EVERY = 256


class ShardUnavailableError(VindexError, RuntimeError):
    """No replica of a shard could take a call before its deadline."""


class Shard:
    def __init__(self, number: int, actors: list, timeout: float, on_stale: Callable[["Shard"], None]):
        self.number, self.actors, self.timeout = number, actors, timeout
        self._on_stale = on_stale
        n = len(actors)
        self.in_sync = [False] * n
        self.known = [0] * n  # the newest write each replica is known to have
        self.seq = 0  # the newest write number given out that some replica may hold
        self.acked = 0  # every write up to this one was acknowledged (or failed everywhere)
        self.lock = threading.RLock()  # writes and repairs (a read that finds no replica repairs too)
        self._load = [0] * n
        self._load_lock = threading.Lock()
        self._turn = itertools.count()
        self.restored = 0  # replicas brought back by repair

    # --- repair -------------------------------------------------------------------------------
    @property
    def stale(self) -> list[int]:
        return [r for r, ok in enumerate(self.in_sync) if not ok]

    def _mark_stale(self, r: int, why: BaseException) -> None:
        if self.in_sync[r]:
            log.warning("shard %d replica %d left the in-sync set: %s", self.number, r, type(why).__name__)
        self.in_sync[r] = False
        self._on_stale(self)

    def _probe(self, replicas: list[int], timeout: float) -> dict[int, dict]:
        refs = {r: self.actors[r].state.remote() for r in replicas}
        states = {}
        deadline = time.monotonic() + timeout
        for r, ref in refs.items():
            try:
                states[r] = result(ref, timeout=max(0.0, deadline - time.monotonic()))
            except REPLICA_DOWN:
                pass
        return states

    def repair(self, timeout: float = PROBE_TIMEOUT_S) -> bool:
        """Bring every reachable replica up to the newest write any of them has and let it
        serve; True if the whole shard is in sync."""
        if not self._probe(self.stale, timeout) and self.stale and any(self.in_sync):
            return False  # the stale ones still down: do not hold up writes
        with self.lock:
            return self._repair_locked(timeout)

    def _repair_locked(self, timeout: float) -> bool:
        states = self._probe(list(range(len(self.actors))), timeout)
        if not states:
            return False
        source = max(states, key=lambda r: states[r]["seq"])
        target = states[source]["seq"]
        if target < self.acked:  # a replica holding acknowledged writes is still down
            return False
        for r, st in states.items():
            try:
                if st["seq"] < target:
                    records = result(self.actors[source].log_since.remote(st["seq"]))
                    result(self.actors[r].catch_up.remote(records))
                if not result(self.actors[r].serve.remote(target)):
                    continue
            except REPLICA_DOWN:
                continue
            if not self.in_sync[r]:
                self.restored += 1
                log.info("shard %d replica %d is in sync at write %d", self.number, r, target)
            self.in_sync[r], self.known[r] = True, target
        self.seq = self.acked = max(self.acked, target)
        return all(self.in_sync)

    def _wait_for_a_replica(self, deadline: float) -> None:
        """With the lock held: repair until some replica is in sync, or raise at ``deadline``."""
        delay = 0.05
        while not self._repair_locked(min(PROBE_TIMEOUT_S, max(0.0, deadline - time.monotonic()))) \
                and not any(self.in_sync):
            if time.monotonic() >= deadline:
                raise ShardUnavailableError(f"shard {self.number}: no replica answered within {self.timeout:.0f} s")
            time.sleep(delay)  # backing off between probes of restarting actors
            delay = min(1.0, delay * 2)

    # --- writes -------------------------------------------------------------------------------
    def write(self, write: tuple[str, dict]) -> Any:
        """Apply ``write`` on every in-sync replica; its result (a delete's count) once all of
        them have it. Raises what the replicas raise for bad input (nothing is written then)."""
        with self.lock:
            return self.write_locked(write)

    def write_locked(self, write: tuple[str, dict]) -> Any:
        """:meth:`write`, the caller holding :attr:`lock`."""
        deadline = time.monotonic() + self.timeout
        seq = self.seq + 1
        while True:
            if not any(self.in_sync):
                self._wait_for_a_replica(deadline)
                if self.acked >= seq:  # a replica had logged it before going down: repair spread it
                    return None
            targets = [r for r, ok in enumerate(self.in_sync) if ok]
            refs = {r: self.actors[r].apply.remote(seq, write) for r in targets}
            done, out, error = [], None, None
            for r, ref in refs.items():
                try:
                    value = result(ref)
                except REPLICA_DOWN as exc:
                    self._mark_stale(r, exc)
                    continue
                except VindexError as exc:  # the same on every replica: logged, nothing written
                    value, error = None, exc
                done.append(r)
                out = value if out is None else out
            if done:
                self.seq = self.acked = seq
                for r in done:
                    self.known[r] = seq
                if seq % TRIM_EVERY == 0:
                    self._trim()
                if error is not None:
                    raise error
                return out
            # it reached no replica that answered: once one is back, retried as the same number

    def _trim(self) -> None:
        keep_after = min(self.known)
        refs = [a.trim.remote(keep_after) for a, ok in zip(self.actors, self.in_sync) if ok]
        for ref in refs:
            try:
                result(ref)
            except REPLICA_DOWN:
                pass

    # --- reads --------------------------------------------------------------------------------
    def _pick(self, exclude: set[int]) -> int | None:
        with self._load_lock:
            ready = [r for r, ok in enumerate(self.in_sync) if ok and r not in exclude]
            if not ready:
                return None
            turn = next(self._turn)
            r = min(ready, key=lambda r: (self._load[r], (r + turn) % len(self.actors)))
            self._load[r] += 1
            return r

    def _done(self, r: int) -> None:
        with self._load_lock:
            self._load[r] -= 1

    def submit(self, method: str, *args: Any) -> tuple[int | None, Any]:
        """Start ``method`` on the least loaded in-sync replica: ``(replica, ref)`` for
        :meth:`collect` (``(None, None)`` when none is in sync now)."""
        r = self._pick(set())
        if r is None:
            return None, None
        return r, getattr(self.actors[r], method).remote(*args)

    def collect(self, started: tuple[int | None, Any], method: str, *args: Any) -> Any:
        """The result of a :meth:`submit`; on a replica that went down, the call runs again on
        another (after a repair when none is left)."""
        r, ref = started
        tried: set[int] = set()
        deadline = time.monotonic() + self.timeout
        while True:
            if r is not None:
                try:
                    return result(ref)
                except REPLICA_DOWN as exc:
                    self._mark_stale(r, exc)
                    tried.add(r)
                finally:
                    self._done(r)
            r = self._pick(tried)
            if r is None:
                with self.lock:
                    self._wait_for_a_replica(deadline)
                tried.clear()
                r = self._pick(tried)
                if r is None:
                    continue
            ref = getattr(self.actors[r], method).remote(*args)

    def call(self, method: str, *args: Any) -> Any:
        return self.collect(self.submit(method, *args), method, *args)

    def broadcast(self, method: str, *args: Any) -> list:
        """``method`` on every in-sync replica (maintenance: wait_idle, checkpoint, stats); the
        answers of those that answered (one that went down leaves the in-sync set)."""
        refs = {r: getattr(a, method).remote(*args) for r, (a, ok) in enumerate(zip(self.actors, self.in_sync)) if ok}
        out = []
        for r, ref in refs.items():
            try:
                out.append(result(ref))
            except REPLICA_DOWN as exc:
                self._mark_stale(r, exc)
        return out
