"""A live recall monitor: the recall@k an index is serving, estimated in the background.

Each pass takes up to ``batch`` queries (a random draw from the recent queries ``SearchTap``
keeps, or stored vectors while nobody has searched), runs them through ``Index.search`` with
the index's default parameters, and compares the ids with the exact top-k over every live
vector (``exact_scan``: BLAS, GIL released). The per-query recalls of the last ``window``
queries give the estimate and a 95% confidence interval (normal approximation).

The cost is bounded by pacing, not by sampling less: a pass starts only once the time since the
index opened, times ``share`` (``IndexConfig.recall_monitor_cpu``, 1% of a core by default),
covers the wall time of every pass so far and of one more up to twice as long as the last; so
from the second pass on the monitor has been busy at most ``share`` of the time. Wall time
bounds the CPU a pass used, reads included, so the bound holds on a loaded machine too, where
passes only get rarer. An estimate under ``recall_alert`` logs a warning, once until it
recovers.
"""
from __future__ import annotations

import collections
import logging
import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from . import ids as idkinds
from .exact_scan import exact_topk
from .failures import RateLimitedLog
from .idmap import DELETED

if TYPE_CHECKING:
    from .index import Index

log = logging.getLogger("vindex.recall")

#: Queries per pass: the exact scan reads every posting once for all of them, so a large
#: batch costs little more than a small one.
BATCH = 256
#: Per-query recalls the estimate is made of (the most recent ones): one full pass, so the
#: estimate describes the index as it is now; 256 queries put the 95% interval within about
#: +-0.03 at a per-query spread of 0.25.
WINDOW = 256
#: Wait before the first pass, so a short-lived index (a script, a test) never pays for one.
FIRST_PASS_DELAY_S = 10.0
#: The next pass is paid for in advance as if it took this many times as long as the last.
PASS_HEADROOM = 2.0
#: An alert needs at least this many samples behind the estimate.
ALERT_MIN_SAMPLES = 32
#: 95% two-sided normal quantile.
Z95 = 1.96


class RecallMonitor:
    """Estimates ``index``'s recall@k; ``start()`` runs passes in a thread paced to ``cpu_share``."""

    def __init__(self, index: "Index", *, k: int, cpu_share: float, alert: float, batch: int = BATCH,
                 window: int = WINDOW, first_delay_s: float = FIRST_PASS_DELAY_S, seed: int = 0):
        self._index = weakref.ref(index)  # the index's finalizer must still run when it is dropped
        self._engine = index._engine
        self._tap = index._tap
        # the search method as the index opened: code that wraps ``Index.search`` later (a
        # test recording calls) sees only the searches it makes
        self._served = type(index).search
        self.k, self.cpu_share, self.alert = k, cpu_share, alert
        self.batch, self.first_delay_s = batch, first_delay_s
        self._recalls: collections.deque[float] = collections.deque(maxlen=window)
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()   # one pass at a time (background and ``check``)
        self._done = threading.Condition()  # notified at the end of each pass
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._alerting = False
        self._failures = RateLimitedLog(log)
        self.began = 0           # passes started
        self.passes = 0          # passes finished
        self.busy_s = 0.0        # wall time of all passes: an upper bound of the CPU they used
        self.cpu_s = 0.0         # CPU time of the passes' own thread (the store's I/O threads not included)
        self.source = "none"
        self.last_pass_s = 0.0

    # --- running ---------------------------------------------------------------------------
    def start(self) -> None:
        """Run passes in the background until ``close``."""
        if self.cpu_share > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="vindex-recall", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        opened = time.perf_counter()
        if self._stop.wait(self.first_delay_s):
            return
        while not self._stop.is_set():
            try:
                if not self.check():
                    return  # the index is gone or closed
            except Exception as e:  # a full or failing disk: try again after the pause
                if self._stop.is_set():  # the index closed under the pass
                    return
                self._failures.failure("recall monitor pass", e)
            # the next pass starts once the time since opening pays, at ``cpu_share``, for all
            # passes so far and one more of up to ``PASS_HEADROOM`` times the last (passes grow
            # with the index and slow down under load): the share stays within budget from the
            # second pass on (the first one's cost is unknown until it ran)
            due = opened + (self.busy_s + PASS_HEADROOM * self.last_pass_s) / self.cpu_share
            self._stop.wait(max(due - time.perf_counter(), 0.0))

    def check(self, n: int | None = None) -> bool:
        """One pass now over ``n`` queries (default ``batch``); False if the index is closed."""
        index = self._index()
        if index is None or index._closed:
            return False
        with self._lock:
            started, cpu = time.perf_counter(), time.thread_time()
            self.began += 1
            queries, source = self._queries(index, n or self.batch)
            if queries.shape[0]:
                recalls = self._measure(index, queries)
                self._recalls.extend(recalls.tolist())
                self.source = source
            self.last_pass_s = time.perf_counter() - started
            self.busy_s += self.last_pass_s
            self.cpu_s += time.thread_time() - cpu
            with self._done:
                self.passes += 1
                self._done.notify_all()
        self._maybe_alert(index.path)
        return True

    def wait_for_pass(self, passes: int, timeout: float | None = None) -> bool:
        """Wait until ``passes`` passes have finished; False on timeout."""
        with self._done:
            return self._done.wait_for(lambda: self.passes >= passes, timeout)

    def _queries(self, index: "Index", n: int) -> tuple[np.ndarray, str]:
        recent = self._tap.recent(n, self._rng)
        if recent.shape[0]:
            return recent, "queries"
        idm = self._engine.state.idmap
        live = np.flatnonzero((idm.versions[: idm.n_vids] & DELETED) == 0)
        if not live.shape[0]:
            return recent, "none"
        vids = self._rng.choice(live, size=min(n, live.shape[0]), replace=False)
        vectors, found = index._get_vectors(idm.vid2ext[vids], "default")
        return vectors[found], "stored"

    def _measure(self, index: "Index", queries: np.ndarray) -> np.ndarray:
        """Per query, the share of its exact top-k the served search returned."""
        k = self.k
        truth = idkinds.to_user(self._engine.state, exact_topk(self._engine, queries, k))
        with self._tap.muted():
            served = self._served(index, queries, k, interactive=False).ids
        pad = None if truth.dtype == object else -1
        out = np.empty(queries.shape[0], dtype=np.float64)
        for i in range(queries.shape[0]):  # per query, not per record: a batch is tens of queries
            want = {x for x in truth[i].tolist() if x != pad}
            out[i] = len(want.intersection(served[i].tolist())) / len(want) if want else 1.0
        return out

    def _maybe_alert(self, path: str) -> None:
        est = self.estimate()
        if est["recall"] is None or est["samples"] < ALERT_MIN_SAMPLES:
            return
        low = est["recall"] < self.alert
        if low and not self._alerting:
            log.warning("recall@%d of %s estimated at %.3f (95%% CI %.3f..%.3f, %d queries), under "
                        "recall_alert %.3f", self.k, path, est["recall"], est["low"], est["high"],
                        est["samples"], self.alert)
        self._alerting = low

    # --- results ---------------------------------------------------------------------------
    def estimate(self) -> dict[str, Any]:
        """``{"k", "recall", "low", "high", "samples", "source", "passes"}``: the mean recall@k
        of the window and its 95% confidence interval (None before the first pass)."""
        values = np.array(list(self._recalls), dtype=np.float64)  # list(): one step, under the GIL
        n = values.shape[0]
        out: dict[str, Any] = {"k": self.k, "recall": None, "low": None, "high": None, "samples": n,
                               "source": self.source, "passes": self.passes}
        if n:
            mean = float(values.mean())
            half = Z95 * float(values.std(ddof=1)) / math.sqrt(n) if n > 1 else 1.0
            out.update(recall=mean, low=max(0.0, mean - half), high=min(1.0, mean + half))
        return out

    def metrics(self) -> dict[str, Any]:
        """The estimate and the monitor's own cost, for ``Index.metrics()``."""
        est = self.estimate()
        return {"recall_estimate": est["recall"], "recall_low": est["low"], "recall_high": est["high"],
                "recall_samples": est["samples"], "recall_k": self.k, "recall_monitor_passes": self.passes,
                "recall_monitor_busy_s": self.busy_s, "recall_monitor_cpu_s": self.cpu_s}
