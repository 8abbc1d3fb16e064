"""The background runner of one index: its thread, the queue of postings waiting for a
look, hold/pause, ``wait_idle`` and ``close``. The jobs it runs live beside it: ``round``
(split, merge, drop, gc/fold), ``reassign``, ``scrub`` and ``cut`` (deferred drops and cuts).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time

import numpy as np

from ..attempts import Attempts
from ..engine import Engine
from ..exiting import interpreter_exiting
from ..failures import LOG_INTERVAL_S, Backoff, RateLimitedLog
from ..iosched import lower_thread_priority, yielding_pool
from . import policy
from .cut import Cuts
from .reads import PostingReader
from .reassign import Reassigner
from .round import Rounds
from .scrub import Scrubber

log = logging.getLogger("vindex.rebalance")

#: Pause after a failed round before retrying its postings; it doubles with each failure in
#: a row up to ``RETRY_PAUSE_MAX_S`` (a full disk stays full for a while), and a write that
#: succeeds meanwhile (room is back) cuts it short.
RETRY_PAUSE_S = 0.5
RETRY_PAUSE_MAX_S = 30.0
#: Longest sleep between re-pricing a pause the pacer asked for.
PACE_SLICE_S = 0.05
#: How often deferred work is checked for searches that still hold it back.
DEFERRED_POLL_S = 0.005


class Rebalancer:
    """The background worker of one index. A failed round is retried after
    ``retry_pause_s``, doubling up to ``retry_pause_max_s`` while failures repeat; each kind
    of failure is logged once per ``log_interval_s``."""

    def __init__(self, engine: Engine, enabled: bool, *, retry_pause_s: float = RETRY_PAUSE_S,
                 retry_pause_max_s: float = RETRY_PAUSE_MAX_S, log_interval_s: float = LOG_INTERVAL_S):
        self._engine = engine
        self.enabled = enabled
        self._backoff = Backoff(retry_pause_s, retry_pause_max_s)
        self._failures = RateLimitedLog(log, log_interval_s)
        self._retry_now = False  # a write succeeded since the last failure: the cause may be gone
        self._pending: set[int] = set()
        self._cv = threading.Condition()
        self._busy = False
        self._stop = False
        self._holds = 0  # open hold() contexts: no round starts while any is open
        self._rounds = Attempts()  # numbers the turns, so wait_idle can tell old failures from new
        self.counters = {"rounds": 0, "splits": 0, "merges": 0, "drops": 0, "gc": 0, "reassigns": 0,
                         "reassign_checked": 0, "reassign_overtaken": 0, "scrubbed": 0, "scrub_rechecked": 0,
                         "errors": 0}
        # replica selection for reassignments uses every core when the foreground is idle; its
        # threads run at the rebalancer's priority
        self._yields = engine.config.io_scheduler == "sla"
        self._pool = yielding_pool("vindex-background", self._yields)
        self._read_pool = yielding_pool("vindex-background-read", self._yields, workers=1)
        self._reassign_pool = yielding_pool("vindex-reassign", self._yields, workers=1)
        self.cuts = Cuts(engine, self._cv, enabled)
        engine.checkpoints.extras = self.cuts.arrays
        self.reader = PostingReader(engine, self.cuts.stale_mask, self._read_pool)
        self.reassign = Reassigner(engine, self.reader, self.cuts, self.counters, self.notify,
                                   self._pool, self._reassign_pool, self._cv)
        self.scrub = Scrubber(engine, self.reader, self.reassign, self.counters, self._cv)
        self.rounds = Rounds(engine, self.reader, self.cuts, self.reassign, self.counters, self.notify)
        self._thread = threading.Thread(target=self._run, name="vindex-background", daemon=True)
        self._thread.start()

    # --- control ------------------------------------------------------------------------------
    def notify(self, pids) -> None:
        """Queue postings for a look (split / merge / gc as they need)."""
        if not self.enabled:
            return
        pids = [int(p) for p in np.atleast_1d(pids)]
        if pids:
            with self._cv:
                self._pending.update(pids)
                self._retry_now = True
                self._cv.notify_all()

    def earn_scrub(self, n_written: int) -> None:
        """Writes earn re-checks of as many stored vectors (times ``scrub_ratio``)."""
        if not self.enabled or self._engine.config.scrub_ratio <= 0:
            return
        with self._cv:
            self.scrub.earn(n_written)
            self._retry_now = True
            self._cv.notify_all()

    @contextlib.contextmanager
    def hold(self):
        """No round starts inside this context (a round already running finishes); work
        queues meanwhile and runs after it."""
        with self._cv:
            self._holds += 1
        try:
            yield
        finally:
            with self._cv:
                self._holds -= 1
                self._cv.notify_all()

    @property
    def limbo_pids(self) -> set[int]:
        """Removed heads whose postings are not dropped yet: their pids are not free."""
        return self.cuts.limbo_pids

    @property
    def stale_copies(self) -> int:
        """Copies moved out of postings that no search needs any more, not cut out yet."""
        return self.cuts.stale_copies

    @property
    def scrub_pending(self) -> int:
        """Re-checks of stored vectors earned by writes and not done yet (``Scrubber``)."""
        with self._cv:
            return int(self.scrub.credit)

    @property
    def depth(self) -> int:
        """Postings waiting, plus one while a round runs."""
        with self._cv:
            return (len(self._pending) + int(self._busy or self.reassign.job is not None)
                    + self.cuts.waiting + int(self.scrub.credit > 0))

    def backlog(self) -> dict[str, int]:
        """Work queued, by kind: postings waiting whose records put them over their budget
        (splits) or under the merge threshold (merges; the rest are rewrites), a
        reassignment in flight, vectors the scrub owes a re-check, deferred cuts."""
        with self._cv:
            pending = np.fromiter(self._pending, dtype=np.int64, count=len(self._pending))
            reassigning = int(self.reassign.job is not None)
            scrub, cuts = int(max(0, self.scrub.credit)), self.cuts.waiting
        eng = self._engine
        lengths = eng.lengths(pending)
        splits = policy.over_budget(lengths, eng.limit)
        merges = ~splits & (lengths < eng.limit * eng.config.merge_fraction)
        return {"postings_pending": int(pending.shape[0]), "splits_pending": int(splits.sum()),
                "merges_pending": int(merges.sum()), "reassigns_pending": reassigning,
                "scrub_pending": scrub, "cuts_pending": int(cuts)}

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no work is queued or running; False on timeout. Raises the failure of a
        background round that starts after the call and fails (failed work is retried: once
        the cause, a full disk say, is gone, the next call returns True). A round already
        running when the call came may have met the cause before it was removed, so its
        failure is not reported; its retry is."""
        with self._cv:
            return self._rounds.wait(self._cv, lambda: (not self._pending and not self._busy and not self.cuts.waiting
                                                        and self.reassign.job is None and self.scrub.credit <= 0),
                                     timeout)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join()
        self._pool.shutdown(wait=True)
        self._read_pool.shutdown(wait=True)
        self._reassign_pool.shutdown(wait=True)

    # --- worker -------------------------------------------------------------------------------
    def _run(self) -> None:
        eng = self._engine
        if self._yields:
            lower_thread_priority()  # searches get the cores first
        while True:
            with self._cv:
                while not (self._stop or self.reassign.job is not None or not self._holds and (
                           self._pending or self.scrub.credit > 0)):
                    # with deferred work, poll until the searches it waits for finish
                    if not self._cv.wait(DEFERRED_POLL_S if self.cuts.waiting else None) and self.cuts.waiting:
                        break
                if self._stop:
                    break
                if self._holds and self.reassign.job is None:
                    continue
                held = self._holds > 0  # then only the reassignment of the last round finishes
                batch = [] if held else sorted(self._pending)[: eng.config.rebalance_batch]
                self._pending.difference_update(batch)
                scrub = not batch and not held and self.scrub.credit > 0  # when nothing more urgent waits
                self._busy = True
                this_round = self._rounds.begin()
            started = time.perf_counter()
            try:
                with eng.checkpoints.excluded():  # a checkpoint never copies a job half applied
                    self._run_jobs(held, batch, scrub)
                if batch or scrub:
                    with self._cv:
                        self._rounds.error = None  # the failure (a full disk, say) is over
                    self._backoff.reset()
            except BaseException as exc:  # keep the worker alive; report through wait_idle
                if interpreter_exiting():
                    # the interpreter is exiting with the index open and has shut the thread
                    # pools down: stop quietly; the next open queues what is left over limit
                    log.info("background rebalancing stopped: the interpreter is exiting")
                    return
                self._failures.failure("background round failed", exc)
                with self._cv:
                    self.counters["errors"] += 1
                    self._rounds.failed(this_round, exc)
                    self._pending.update(batch)
                self.reassign.finish(apply=False)
                pause = self._backoff.next()
                with self._cv:
                    self._retry_now = False
                    self._cv.wait_for(lambda: self._stop or self._retry_now, timeout=pause)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
            pause = eng.pacer.charge(time.perf_counter() - started)
            while pause > PACE_SLICE_S / 50:  # searches are missing their latency target: yield the CPU and GIL
                # in slices: the pause was priced at the share of time searches allowed then,
                # and that share grows back once they stop (a long round at the floor share
                # would otherwise sleep on for tens of seconds after the last search)
                with self._cv:
                    if self._cv.wait_for(lambda: self._stop, timeout=min(pause, PACE_SLICE_S)):
                        break
                pause = eng.pacer.charge(0.0)
        self.reassign.finish(apply=False)  # closing: its moves were only an improvement

    def _run_jobs(self, held: bool, batch: list[int], scrub: bool) -> None:
        """One turn of the worker: deferred work, then a round (its reassignment overlapping
        the next round's) or the scrub."""
        if held:
            self.reassign.finish()
            return
        self.cuts.run_ready(self.reader)
        if batch:
            job = self.reassign.job
            self.rounds.run(np.asarray(batch, dtype=np.int64))
            if self.reassign.job is job:  # no splits: no newer reassignment to overlap it with
                self.reassign.finish()
        else:
            self.reassign.finish()
            if scrub:
                self.scrub.run()
