"""One shard's replicas, seen from the coordinator: numbered writes, replica choice, repair.

Writes to a shard are numbered here 1, 2, 3..., in the order they are sent; each goes to
every replica that is in sync, in parallel, and is acknowledged once all of them have it in
their write log and index. Up to ``PIPELINE_DEPTH`` writes are in flight per shard (each
replica applies them in number order), so a replica's next write is already queued while the
coordinator collects the last acknowledgement. Whatever needs the shard to itself (a repair,
a checked ``add``) takes :attr:`Shard.lock`, which stops new writes, and waits for those in
flight (:meth:`Shard.settle`). A replica that fails a call (dead, restarting, recovering) leaves the in-sync set;
:meth:`Shard.repair` brings it back. While the shard goes on taking writes on its in-sync
replicas, the stale one copies what it lacks from one of them: the log records after its own
last write, or, when that log no longer reaches back (trimmed, or the replica lost its disk),
a snapshot of the peer's index plus the records after it. Once it is at most
``TAIL_WRITES`` behind, writes are held for the last few records and it starts serving. A
write that reached no replica is retried with its number (a replica ignores a number it
already has) until one comes back.

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
from .replica import PIPELINE_DEPTH
from .writelog import LogTrimmedError

log = logging.getLogger("vindex.cluster")

#: Seconds a repair waits for a replica's state before counting it as still down.
PROBE_TIMEOUT_S = 2.0
#: Trim the replicas' write logs once per this many writes.
TRIM_EVERY = 256
#: Writes the logs keep for a replica that is down; one further behind copies a snapshot.
LOG_KEEP_WRITES = 4096
#: A catch-up beside the shard's writes ends this close to the newest write; the rest is
#: copied with the shard's writes held.
TAIL_WRITES = 32
#: Log records a catch-up copies per call (each holds a write's vectors).
COPY_RECORDS = 32
#: Rounds of catch-up beside the writes before the rest is copied with them held (a replica
#: that cannot keep up with the ingest would chase it for ever).
CATCH_UP_ROUNDS = 8


class ShardUnavailableError(VindexError, RuntimeError):
    """No replica of a shard could take a call before its deadline."""


class _Outcome:
    """The result of a write resent by another thread (:meth:`Shard.settle`)."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def succeed(self, value: Any) -> None:
        self._value = value
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._ready.set()

    def get(self) -> Any:
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._value


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
        self.snapshots = 0  # of them, those that copied a peer's index
        self._catching_up = 0  # catch-ups running beside the writes
        self.writes_during_catch_up = 0  # writes acknowledged meanwhile
        self._slots = threading.BoundedSemaphore(PIPELINE_DEPTH)  # writes in flight
        self._flight = threading.Condition()  # guards the three below
        self._in_flight = 0
        self._acked_above: set[int] = set()  # writes acknowledged above ``acked``
        self._failed: dict[int, tuple[tuple[str, dict], "_Outcome"]] = {}  # reached no replica
        #: Tenant I/O quotas (``tenant -> (postings_per_s, burst)``) a replica is given before it
        #: serves: a restarted one has lost them (they are not stored with an index).
        self.quotas: dict[str, tuple[float | None, float | None]] = {}

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
        stale = self.stale
        states = self._probe(list(range(len(self.actors))), timeout)
        if stale and not set(stale) & set(states) and any(self.in_sync):
            return False  # the stale ones still down: do not hold up writes
        for r, st in states.items():
            if not (self.in_sync[r] and st["serving"]):  # (a restart not noticed yet is not serving)
                self._catch_up_beside_writes(r, st["seq"])
        with self.lock:
            return self._repair_locked(timeout)

    def _catch_up_beside_writes(self, r: int, seq: int) -> None:
        """Bring stale replica ``r`` (at write ``seq``) near the newest write from an in-sync
        peer, without the write lock: the shard goes on taking writes meanwhile."""
        for _ in range(CATCH_UP_ROUNDS):
            sources = [p for p, ok in enumerate(self.in_sync) if ok and p != r]
            if not sources or self.seq - seq <= TAIL_WRITES:
                return
            with self._load_lock:
                self._catching_up += 1
            try:
                seq = self._copy(sources[0], r, seq)
            except REPLICA_DOWN:
                return
            finally:
                with self._load_lock:
                    self._catching_up -= 1

    def _copy(self, source: int, r: int, seq: int) -> int:
        """Copy to replica ``r`` what it lacks after write ``seq`` from replica ``source``:
        its log records, ``COPY_RECORDS`` a call, after a snapshot of its index if its log no
        longer reaches back. Returns ``r``'s newest write after."""
        copied = False
        while True:
            try:
                records = result(self.actors[source].log_since.remote(seq, COPY_RECORDS))
            except LogTrimmedError:
                if copied:
                    raise  # trimmed again past the copy: the next repair starts over
                seq = result(self.actors[r].restore_from.remote(self.actors[source]))
                copied = True
                self.snapshots += 1
                log.info("shard %d replica %d copied replica %d's index at write %d", self.number, r, source, seq)
                continue
            if records:
                seq = result(self.actors[r].catch_up.remote(records))
            self.known[r] = max(self.known[r], seq)
            if len(records) < COPY_RECORDS:
                return seq

    def _repair_locked(self, timeout: float) -> bool:
        self.settle()
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
                    self._copy(source, r, st["seq"])
                if not st["serving"] and self.quotas:  # (re)started: it lost them
                    result(self.actors[r].set_tenant_quotas.remote(dict(self.quotas)))
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
        them have it. Raises what the replicas raise for bad input (nothing is written then).
        Up to ``PIPELINE_DEPTH`` writes run at once, applied in the order they got the lock."""
        with self._slots:
            with self.lock:
                targets = [r for r, ok in enumerate(self.in_sync) if ok]
                if not targets or self._failed:  # a replica to wait for, writes to resend: in turn
                    return self.write_locked(write)
                self.seq += 1
                seq = self.seq
                refs = {r: self.actors[r].apply.remote(seq, write) for r in targets}
                with self._flight:
                    self._in_flight += 1
            return self._collect_write(seq, write, refs)

    def _collect_write(self, seq: int, write: tuple[str, dict], refs: dict) -> Any:
        """The acknowledgement of write ``seq`` sent as ``refs``; one that reached no replica
        is resent by :meth:`settle`, in number order, once a replica is back."""
        done, out, error = self._gather(refs)
        with self._flight:
            self._in_flight -= 1
            if done:
                self._acknowledged(seq, done)
            else:
                outcome = self._failed[seq] = (write, _Outcome())
            self._flight.notify_all()
        if done:
            return self._after_ack(seq, out, error)
        with self.lock:
            self.settle()
        return outcome[1].get()

    def _after_ack(self, seq: int, out: Any, error: VindexError | None) -> Any:
        """Write ``seq`` acknowledged: its result, or the error its bad input raised."""
        if self._catching_up:
            self.writes_during_catch_up += 1
        if seq % TRIM_EVERY == 0:
            self._trim()
        if error is not None:
            raise error
        return out

    def _gather(self, refs: dict) -> tuple[list[int], Any, VindexError | None]:
        """The replicas that answered, the first answer, and the error a bad input raised."""
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
        return done, out, error

    def _acknowledged(self, seq: int, replicas: list[int]) -> None:
        """With ``_flight`` held: ``replicas`` have write ``seq``."""
        for r in replicas:
            self.known[r] = max(self.known[r], seq)
        self._acked_above.add(seq)
        while self.acked + 1 in self._acked_above:
            self.acked += 1
            self._acked_above.discard(self.acked)

    def settle(self) -> None:
        """With :attr:`lock` held: wait for the writes in flight, then resend, in number order,
        those that reached no replica (a repair first spreads any a replica logged before going
        down). Afterwards no write is in flight and ``seq == acked``."""
        with self._flight:
            self._flight.wait_for(lambda: self._in_flight == 0)
            failed, self._failed = sorted(self._failed.items()), {}
            self._acked_above.clear()
        if not failed:
            return
        self.seq = self.acked  # every write after acked is one of the failed
        error: BaseException | None = None
        for seq, (write, outcome) in failed:
            if error is not None:  # the shard is unavailable: the later ones fail alike
                outcome.fail(error)
            elif seq <= self.acked:  # a replica logged it before going down; a repair spread it
                outcome.succeed(None)
            else:
                try:  # the writes before it are in: it goes out as the same number
                    outcome.succeed(self.write_locked(write))
                except ShardUnavailableError as exc:
                    outcome.fail(exc)
                    error = exc
                except BaseException as exc:  # noqa: BLE001 - bad input: that write's caller gets it
                    outcome.fail(exc)

    def write_locked(self, write: tuple[str, dict]) -> Any:
        """:meth:`write` alone on the shard (none in flight), the caller holding :attr:`lock`."""
        self.settle()
        deadline = time.monotonic() + self.timeout
        seq = self.seq + 1
        while True:
            if not any(self.in_sync):
                self._wait_for_a_replica(deadline)
                if self.acked >= seq:  # a replica had logged it before going down: repair spread it
                    return None
            targets = [r for r, ok in enumerate(self.in_sync) if ok]
            refs = {r: self.actors[r].apply.remote(seq, write) for r in targets}
            done, out, error = self._gather(refs)
            if done:
                self.seq = self.acked = seq
                for r in done:
                    self.known[r] = seq
                return self._after_ack(seq, out, error)
            # it reached no replica that answered: once one is back, retried as the same number

    def _trim(self) -> None:
        """Drop the log records every in-sync replica has, keeping ``LOG_KEEP_WRITES`` for
        replicas that are down (beyond that they copy a snapshot when back)."""
        in_sync = [k for k, ok in zip(self.known, self.in_sync) if ok]
        keep_after = min(min(in_sync, default=0), max(min(self.known), self.seq - LOG_KEEP_WRITES))
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
