"""SLA-aware I/O scheduling in user space (after Daredevil, EuroSys '25).

Every storage request carries a class (``IOClass``), a tenant and a deadline. With
``mode="sla"`` each class has its own queue and its own workers, so a search never queues
behind bulk or background work:

* ``interactive`` requests are served earliest deadline first; one whose deadline has passed
  when a worker reaches it is dropped (its future raises ``DeadlineExpired``) and the caller
  reports a partial result;
* ``update`` and ``background`` are served in arrival order; ``background`` is paced by a token
  bucket whose rate adapts to the interactive p99 latency (AIMD: halve on a miss, add a step
  per window on target; the target is ``IOTargets.read_p99_s``);
* per-tenant token buckets and bounded queues refuse work with ``ResourceExhaustedError``
  instead of buffering without bound;
* a disk request of another class waits (up to ``IOTargets.yield_max_s``) to be issued while
  interactive reads are in flight (``IOScheduler.yield_to_interactive``): the disk serves what
  it was given in order, so a search's reads wait behind whatever else went in first.

``mode="fifo"`` puts every class in one shared arrival-order queue, for comparison.
The policy (``Queues``, ``TokenBucket``, ``Aimd``) is separate from the threads, and takes the
time as an argument, so its ordering and drops are tested without sleeping.
"""
from __future__ import annotations

import enum
import heapq
import itertools
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from .config import IO_SCHEDULERS, SMALL_SEARCH_QUERIES, IndexConfig
from .errors import DeadlineExpired, ResourceExhaustedError

#: Nice value of threads doing background or bulk-update work under ``sla``: on a machine with
#: few cores the queue a search waits in is the CPU as much as the disk.
LOW_PRIORITY_NICE = 10


@dataclass(frozen=True)
class IOTargets:
    """The latencies a store's scheduler works to, both from ``IndexConfig.read_p99_ms``
    (the defaults are that field's).

    ``read_p99_s``: the p99 of interactive requests (queued to done) that the background
    pacing adapts to. ``yield_max_s``: the longest a disk request of the ``update`` or
    ``background`` class waits to be issued while interactive reads are in flight. It bounds
    what writes and rebalancing lose to searches: one wait per request (a write piece, a batch
    of reads, a sync), even beside searches reading back to back. A read still running after
    its target has missed it anyway, so waiting longer would only cost the writer; a longer
    bound bought nothing more (docs/sla.md)."""

    read_p99_s: float = IndexConfig.read_p99_ms / 1000
    yield_max_s: float = IndexConfig.read_p99_ms / 1000

    @classmethod
    def of(cls, config: IndexConfig) -> "IOTargets":
        """The targets ``config`` sets."""
        return cls(read_p99_s=config.read_p99_ms / 1000, yield_max_s=config.read_p99_ms / 1000)


class IOClass(str, enum.Enum):
    """Service class of a storage request; the scheduler gives each its own queue."""

    INTERACTIVE = "interactive"  # searches
    UPDATE = "update"            # foreground inserts, upserts, deletes
    BACKGROUND = "background"    # rebalancing, compaction, bulk work


def lower_thread_priority(nice: int = LOW_PRIORITY_NICE) -> bool:
    """Lower the CPU priority of the calling thread (Linux: nice is per thread). For threads
    the caller owns for good: an unprivileged thread cannot raise it back. Returns False
    where that is not possible."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), nice))
        return True
    except (AttributeError, OSError):
        return False


def yielding_pool(name: str, yields: bool = True, workers: int = 0) -> ThreadPoolExecutor:
    """A pool of ``workers`` threads (0: one per core) that run at ``LOW_PRIORITY_NICE`` if
    ``yields`` (work that gives the cores to searches first)."""
    return ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1, thread_name_prefix=name,
                              initializer=lower_thread_priority if yields else None)


def check_mode(mode: str) -> None:
    """Refuse an ``io_scheduler`` value other than ``sla`` and ``fifo``."""
    if mode not in IO_SCHEDULERS:
        raise ValueError(f"io_scheduler: expected one of {IO_SCHEDULERS}, got {mode!r}")


#: Classes in the order workers of the shared (fifo) pool would see them; sla never mixes them.
CLASSES = (IOClass.INTERACTIVE, IOClass.UPDATE, IOClass.BACKGROUND)


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; ``take`` spends if it can."""

    def __init__(self, rate: float, burst: float, now: float):
        self.rate, self.burst = float(rate), float(burst)
        self.tokens, self.stamp = float(burst), now

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self, cost: float, now: float) -> bool:
        self._refill(now)
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False

    def spend(self, cost: float, now: float) -> bool:
        """Like ``take``, but a request larger than the burst goes through when the bucket
        is full and leaves it in debt (it could never pass ``take``)."""
        self._refill(now)
        if self.tokens >= min(cost, self.burst):
            self.tokens -= cost
            return True
        return False

    def wait_time(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` tokens are there (0 if they are)."""
        self._refill(now)
        missing = min(cost, self.burst) - self.tokens
        return 0.0 if missing <= 0 else missing / max(self.rate, 1e-9)


def percentile(samples: list[float], q: float) -> float:
    """``np.percentile(samples, q)`` (linear interpolation) without leaving Python: a search
    closes the pacer's window, and numpy's partition releases the GIL, which beside a thread
    running Python cost that search one more switch interval (1 in 5 one-query searches in
    ``test_one_query_search_gives_the_gil_back_once``)."""
    s = sorted(samples)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


class Aimd:
    """Adapts the background rate to an interactive latency target: each ``window`` seconds,
    a p99 over the target halves the rate, one under it adds ``step``."""

    def __init__(self, bucket: TokenBucket, target_s: float, *, step: float, floor: float,
                 ceiling: float, window: float, now: float):
        self.bucket, self.target = bucket, target_s
        self.step, self.floor, self.ceiling, self.window = step, floor, ceiling, window
        self.samples: list[float] = []
        self.window_end = now + window

    def observe(self, latency_s: float, now: float) -> None:
        self.samples.append(latency_s)
        self.tick(now)

    def tick(self, now: float) -> None:
        """Close the window if it is over (a window without searches counts as on target)."""
        if now >= self.window_end:
            self._adjust(now)

    def _adjust(self, now: float) -> None:
        p99 = percentile(self.samples, 99) if self.samples else 0.0
        rate = self.bucket.rate
        rate = rate / 2 if p99 > self.target else rate + self.step
        self.bucket.rate = min(self.ceiling, max(self.floor, rate))
        self.samples.clear()
        self.window_end = now + self.window


@dataclass(order=True)
class Request:
    """One storage request. Ordered by (deadline, arrival) for the interactive heap."""

    deadline: float
    seq: int
    io: IOClass = field(compare=False)
    tenant: str = field(compare=False)
    fn: Callable[[], Any] = field(compare=False)
    cost: float = field(compare=False, default=1.0)
    submitted: float = field(compare=False, default=0.0)
    future: Future = field(compare=False, default_factory=Future)


class Queues:
    """The queues of one scheduler and the choice of the next request (no threads here)."""

    def __init__(self, mode: str, *, limit: int, background: TokenBucket | None):
        check_mode(mode)
        self.mode, self.limit, self.background = mode, limit, background
        self._heap: list[Request] = []                                 # interactive, EDF
        self._fifo: dict[IOClass, list[Request]] = {c: [] for c in CLASSES}
        self._heads: dict[IOClass, int] = {c: 0 for c in CLASSES}
        self._shared: list[Request] = []                               # fifo mode
        self._shared_head = 0
        self.dropped = {c: 0 for c in CLASSES}

    def depth(self, io: IOClass) -> int:
        if self.mode == "fifo":
            return sum(1 for r in self._shared[self._shared_head:] if r.io == io)
        if io == IOClass.INTERACTIVE:
            return len(self._heap)
        return len(self._fifo[io]) - self._heads[io]

    def push(self, req: Request) -> None:
        """Queue ``req``; raises ResourceExhaustedError when its queue is full."""
        full = (len(self._shared) - self._shared_head if self.mode == "fifo" else self.depth(req.io))
        if full >= self.limit:
            raise ResourceExhaustedError(
                f"{req.io.value} I/O queue is full ({self.limit} requests waiting); retry later")
        if self.mode == "fifo":
            self._shared.append(req)
        elif req.io == IOClass.INTERACTIVE:
            heapq.heappush(self._heap, req)
        else:
            self._fifo[req.io].append(req)

    def pop(self, io: IOClass | None, now: float) -> tuple[Request | None, list[Request], float]:
        """Next request for a worker of class ``io`` (None: the shared fifo pool).

        Returns ``(request or None, expired interactive requests to fail, seconds to wait
        before asking again when the background bucket is empty)``."""
        if self.mode == "fifo":
            if self._shared_head < len(self._shared):
                req = self._shared[self._shared_head]
                self._shared_head += 1
                self._compact_shared()
                return req, [], 0.0
            return None, [], 0.0
        if io == IOClass.INTERACTIVE:
            expired = []
            while self._heap and self._heap[0].deadline < now:
                expired.append(heapq.heappop(self._heap))
            self.dropped[IOClass.INTERACTIVE] += len(expired)
            return (heapq.heappop(self._heap) if self._heap else None), expired, 0.0
        q, h = self._fifo[io], self._heads[io]
        if h >= len(q):
            return None, [], 0.0
        if io == IOClass.BACKGROUND and self.background is not None:
            if not self.background.take(1.0, now):  # pacing counts requests (cost is the tenant's)
                return None, [], self.background.wait_time(1.0, now)
        self._heads[io] = h + 1
        if h + 1 > 1024 and 2 * (h + 1) > len(q):
            del q[: h + 1]
            self._heads[io] = 0
        return q[h], [], 0.0

    def queued(self) -> int:
        """Requests waiting in every queue."""
        return (len(self._heap) + len(self._shared) - self._shared_head
                + sum(len(self._fifo[c]) - self._heads[c] for c in CLASSES))

    def drain(self) -> list[Request]:
        """Remove and return every queued request."""
        out = self._heap + self._shared[self._shared_head:]
        for c in CLASSES:
            out += self._fifo[c][self._heads[c]:]
            self._fifo[c], self._heads[c] = [], 0
        self._heap, self._shared, self._shared_head = [], [], 0
        return out

    def _compact_shared(self) -> None:
        if self._shared_head > 1024 and 2 * self._shared_head > len(self._shared):
            del self._shared[: self._shared_head]
            self._shared_head = 0


class IOScheduler:
    """Runs storage requests on per-class worker threads (``sla``) or one shared pool
    (``fifo``). The work itself (a RocksDB multi-get, a preadv) must release the GIL for the
    classes to run side by side. ``targets``: the interactive read latency the background
    pacing adapts to and the bound on yielding to interactive reads (``IOTargets``)."""

    def __init__(self, mode: str = "sla", *, workers: dict[IOClass, int] | None = None,
                 queue_limit: int = 4096, targets: IOTargets = IOTargets(),
                 background_rate: float = 2000.0, background_burst: float = 64.0,
                 tenant_rate: float = float("inf"), tenant_burst: float = 1024.0,
                 clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        now = clock()
        self.bucket = TokenBucket(background_rate, background_burst, now)
        self.yield_max_s = targets.yield_max_s
        self.aimd = Aimd(self.bucket, targets.read_p99_s, step=background_rate / 10, floor=background_rate / 100,
                         ceiling=background_rate * 10, window=0.25, now=now)
        self.queues = Queues(mode, limit=queue_limit, background=self.bucket if mode == "sla" else None)
        self.mode = mode
        self._tenant_rate, self._tenant_burst = tenant_rate, tenant_burst
        self._tenants: dict[str, TokenBucket] = {}
        lock = threading.RLock()
        self._cv = threading.Condition(lock)
        self._quiet = threading.Condition(lock)  # notified when no interactive request is running
        self.yields = 0
        self._seq = itertools.count()
        self._stop = False
        self.completed = {c: 0 for c in CLASSES}
        # two background slots: a rebalancing round reads its postings while the reassignment
        # of the round before reads the neighbourhoods of its splits (``vindex/rebalance/reassign.py``)
        workers = workers or {IOClass.INTERACTIVE: 2, IOClass.UPDATE: 1, IOClass.BACKGROUND: 2}
        if mode == "fifo":
            plan = [(None, sum(workers.values()))]
        else:
            plan = [(c, workers.get(c, 1)) for c in CLASSES]
        # requests running per pool (a class under sla, everything under fifo), at most its
        # worker count whether a worker or the caller runs them
        self._slots = {c: n for c, n in plan}
        self._busy = {c: 0 for c, _ in plan}
        self.inline = 0
        self._threads = [threading.Thread(target=self._work, args=(c,), daemon=True,
                                          name=f"vindex-io-{c.value if c else 'fifo'}-{i}")
                         for c, n in plan for i in range(n)]
        for t in self._threads:
            t.start()

    def submit(self, io: IOClass, fn: Callable[[], Any], *, tenant: str = "default",
               deadline: float | None = None, cost: float = 1.0) -> Future:
        """Queue ``fn`` (the I/O) and return its future. ``deadline`` is a ``clock()`` time
        (interactive requests past it are dropped); ``cost`` (the postings it reads) is spent
        from the tenant's bucket. A background request spends one token of the pacing bucket,
        whatever its size."""
        now = self.clock()
        req = Request(deadline if deadline is not None else float("inf"), next(self._seq), io, tenant, fn,
                      cost, now)
        with self._cv:
            self._admit(tenant, cost, now)
            self.queues.push(req)
            self._cv.notify_all()
        return req.future

    def _admit(self, tenant: str, cost: float, now: float) -> None:
        """Refuse when closed or when ``tenant`` is over its quota. Caller holds ``_cv``."""
        if self._stop:
            raise RuntimeError("I/O scheduler is closed")
        bucket = self._tenants.get(tenant)
        if bucket is None and self._tenant_rate != float("inf"):
            bucket = self._tenants[tenant] = TokenBucket(self._tenant_rate, self._tenant_burst, now)
        if bucket is not None and not bucket.spend(cost, now):
            wait = bucket.wait_time(cost, now)
            raise ResourceExhaustedError(
                f"tenant {tenant!r} is over its I/O quota of {bucket.rate:g} postings/s (burst {bucket.burst:g}): "
                f"this read needs {cost:g}; retry in {wait * 1e3:.0f} ms")

    def admit(self, tenant: str, cost: float) -> None:
        """Charge ``tenant``'s quota for ``cost`` postings read from memory, with no request
        to run: a quota bounds what a tenant reads, wherever it is found."""
        with self._cv:
            self._admit(tenant, cost, self.clock())

    def set_tenant_quota(self, tenant: str, rate: float | None, burst: float | None = None) -> None:
        """Give ``tenant`` its own bucket of ``rate`` postings read per second up to ``burst``
        (default: one second's worth); ``rate=None`` puts it back on the default."""
        with self._cv:
            if rate is None:
                self._tenants.pop(tenant, None)
            else:
                self._tenants[tenant] = TokenBucket(rate, burst if burst is not None else max(1.0, rate),
                                                    self.clock())

    def run(self, io: IOClass, fn: Callable[[], Any], *, tenant: str = "default",
            deadline: float | None = None, cost: float = 1.0) -> Any:
        """Run ``fn`` as a request of class ``io`` and return its result.

        When nothing of its pool is queued and a slot is free, the calling thread runs it at
        once: a hand-off to a worker thread would add a thread switch (tens of microseconds
        with the GIL) and change nothing about the order. Otherwise it queues like ``submit``."""
        key = io if self.mode == "sla" else None
        with self._cv:
            now = self.clock()
            queued = self.queues.depth(io) if key is not None else self.queues.queued()
            free = not queued and self._busy[key] < self._slots[key]
            if free and key == IOClass.BACKGROUND:
                free = self.bucket.take(1.0, now)
            if free:
                self._admit(tenant, cost, now)
                if io == IOClass.INTERACTIVE and deadline is not None and deadline < now:
                    self.queues.dropped[io] += 1
                    raise DeadlineExpired(f"{io.value} request dropped: its deadline passed before it ran")
                self._busy[key] += 1
                self.inline += 1
        if not free:
            return self.submit(io, fn, tenant=tenant, deadline=deadline, cost=cost).result()
        try:
            if io != IOClass.INTERACTIVE:  # as a worker does, holding the slot
                self.yield_to_interactive()
            return fn()
        finally:
            self._finished(io, key, now)

    def yield_to_interactive(self) -> None:
        """Before a disk request of another class (a write, a sync, a batch of reads): while
        interactive requests are running, wait until they end, at most ``yield_max_s``.

        The disk (here one queue, served in order) would put a search's reads behind whatever
        was issued before them; held back this way they go first, while a request that is
        already on the disk still delays them. Nothing under ``fifo``."""
        if self.mode != "sla" or not self._busy[IOClass.INTERACTIVE]:
            return  # (read without the lock: most calls find no search running, and a miss costs little)
        with self._cv:
            if self._busy[IOClass.INTERACTIVE]:
                self.yields += 1
                self._quiet.wait_for(lambda: not self._busy[IOClass.INTERACTIVE], self.yield_max_s)

    def _finished(self, io: IOClass, key: IOClass | None, submitted: float) -> None:
        with self._cv:
            self._busy[key] -= 1
            if key == IOClass.INTERACTIVE and not self._busy[key]:
                self._quiet.notify_all()
            self._count_done(io, submitted)
            if self.queues.queued():  # a freed slot matters only to a worker with work waiting
                self._cv.notify_all()

    def _count_done(self, io: IOClass, submitted: float) -> None:
        """Count a finished request; interactive latencies feed the pacing. Caller holds ``_cv``."""
        done = self.clock()
        self.completed[io] += 1
        if io == IOClass.INTERACTIVE:
            self.aimd.observe(done - submitted, done)

    @staticmethod
    def _fail_expired(expired: list[Request]) -> None:
        for r in expired:
            r.future.set_exception(DeadlineExpired(
                f"{r.io.value} request dropped: its deadline passed in the queue"))

    def _work(self, io: IOClass | None) -> None:
        while True:
            with self._cv:
                while True:
                    if self._stop:
                        return
                    now = self.clock()
                    if io == IOClass.BACKGROUND:
                        self.aimd.tick(now)
                    req, expired, wait = None, [], 0.0
                    if self._busy[io] < self._slots[io]:  # callers running inline count too
                        req, expired, wait = self.queues.pop(io, now)
                    self._fail_expired(expired)
                    if req is not None:
                        self._busy[io] += 1
                        break
                    self._cv.wait(timeout=wait or None)
            if not req.future.set_running_or_notify_cancel():
                self._finished(req.io, io, req.submitted)
                continue
            if io != IOClass.INTERACTIVE:
                self.yield_to_interactive()
            try:
                req.future.set_result(req.fn())
            except BaseException as exc:
                req.future.set_exception(exc)
            self._finished(req.io, io, req.submitted)

    def stats(self) -> dict:
        with self._cv:
            return {"mode": self.mode, "inline": self.inline, "yields": self.yields,
                    "completed": {c.value: n for c, n in self.completed.items()},
                    "dropped": {c.value: n for c, n in self.queues.dropped.items()},
                    "queued": {c.value: self.queues.depth(c) for c in CLASSES},
                    "background_rate": self.bucket.rate}

    def close(self) -> None:
        with self._cv:
            self._stop = True
            left = self.queues.drain()
            self._cv.notify_all()
        for r in left:
            r.future.set_exception(RuntimeError("I/O scheduler closed before the request ran"))
        for t in self._threads:
            t.join()


class BusyClock:
    """Wall time during which at least one of several overlapping tasks ran: each task calls
    ``enter`` when it starts and ``leave`` when it ends, which returns the busy time since
    the last ``leave`` (the time to charge a pacer: the union of the tasks' times, not their
    sum)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._lock = threading.Lock()
        self._running = 0
        self._since = 0.0  # when the busy time below was last counted up to
        self._uncharged = 0.0

    def _count_up(self) -> None:
        now = self._clock()
        if self._running:
            self._uncharged += now - self._since
        self._since = now

    def enter(self) -> None:
        with self._lock:
            self._count_up()
            self._running += 1

    def leave(self) -> float:
        with self._lock:
            self._count_up()
            self._running -= 1
            seconds, self._uncharged = self._uncharged, 0.0
            return seconds


class BackgroundPacer:
    """Paces work that yields to searches (background rebalancing; foreground writes, with a
    higher floor) by its share of time, adapted to search latency.

    For the RocksDB store the queue a search waits in is the GIL and the CPU as much as the
    disk, so the budget is a duty cycle: background seconds per wall second, spent from a
    token bucket after each background step (a step over budget puts the bucket in debt and
    the worker sleeps, GIL released, until it is repaid). ``Aimd`` halves the duty cycle when
    the p99 of small interactive searches in a window misses the target and raises it by a
    step when it does not; with no searches it climbs back to 1 (background at full speed).
    The caller does the pausing (``charge`` says how long), so it can wake early to stop.
    ``mode="fifo"`` (no pacing) is for comparison."""

    def __init__(self, mode: str, target_p99_s: float, *, clock: Callable[[], float] = time.monotonic,
                 window: float = 0.25, floor: float = 0.05):
        check_mode(mode)
        self.mode, self.clock = mode, clock
        now = clock()
        self.bucket = TokenBucket(rate=1.0, burst=0.05, now=now)
        self.aimd = Aimd(self.bucket, target_p99_s, step=0.1, floor=floor, ceiling=1.0, window=window, now=now)
        self._lock = threading.Lock()
        self.paused_s = 0.0

    def observe(self, seconds: float, n_queries: int) -> None:
        """A search of ``n_queries`` took ``seconds``; small searches (``SMALL_SEARCH_QUERIES``)
        are the samples."""
        if self.mode == "sla" and n_queries <= SMALL_SEARCH_QUERIES:
            with self._lock:
                self.aimd.observe(seconds, self.clock())

    def charge(self, seconds: float) -> float:
        """The background worker spent ``seconds`` on a step; returns how long it should now
        pause (GIL released) to keep to its share."""
        if self.mode != "sla":
            return 0.0
        with self._lock:
            now = self.clock()
            self.aimd.tick(now)
            b = self.bucket
            # the step ran inside the wall time since the last charge: earn that time's share,
            # spend the step, then cap (capping first would charge a full-speed worker too)
            b.tokens = min(b.burst, b.tokens + (now - b.stamp) * b.rate - seconds)
            b.stamp = now
            debt = -b.tokens
            wait = debt / self.bucket.rate if debt > 0 else 0.0
            self.paused_s += wait
            return wait

    @property
    def duty(self) -> float:
        return self.bucket.rate

    @property
    def on_target(self) -> bool:
        """True unless, under ``sla``, searches missed their p99 target lately (the duty cycle
        is still below 1: it climbs back a step per window)."""
        return self.mode != "sla" or self.duty >= 1.0
