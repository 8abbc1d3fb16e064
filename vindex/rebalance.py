"""Background rebalancing (SPFresh's LIRE): split, merge, garbage-collect and reassign.

One background thread runs rounds over the postings that need work: over their limit
(split), mostly garbage (rewrite), nearly empty (merge into a neighbour), or empty (drop). A
round reads its postings without any lock, plans in nogil kernels, and takes the writers'
lock only to fold in records appended meanwhile, link the new heads, and commit one atomic
batch. Searches never take the lock: new heads are linked before the commit (their postings
are still empty), and the old heads leave the graph only after it.

After a split, vectors near it may have lost their best posting; the two SPFresh conditions
pick candidates in the split's children and in the ``reassign_neighbors`` postings around it,
and each candidate whose current posting is no longer among its chosen replicas is copied to
the chosen postings (a compare-and-set on its version skips vectors a user changed meanwhile).
A second thread plans that reassignment (reads the neighbourhoods, checks the conditions,
chooses replicas) while the next round reads, plans and commits; the round thread applies
the moves, so all bookkeeping of copies to cut stays on one thread. A vector the plan saw in
a posting the rebalancer rewrote meanwhile stays where it is (``_apply_moves``).

A posting rewritten without its garbage also moves its head to the mean of the vectors whose
nearest posting it is (a step of Lloyd's k-means): heads made by splits of postings that
deletes and moves have since changed drift away from their vectors. The scrub then moves
vectors whose best postings changed.

Unlike SPFresh, a reassignment keeps the vector's version: the new copies are valid at once
and the old one is cut out of its posting later. Bumping the version instead would let a
search that chose its postings before the move, and reads them after, see neither copy.
Work that takes data away from searches already running (dropping the posting of a removed
head, cutting out moved copies) waits in a deferred queue until those searches finish.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import Future
from typing import NamedTuple

import numpy as np

from vindex import native

from . import oplog
from .engine import Engine
from .iosched import lower_thread_priority, yielding_pool
from .heads import connect
from .storage import Change, IOClass, records
from .storage.directory import Lengths
from .writes import group_appends, select_replicas

log = logging.getLogger("vindex.rebalance")

#: A posting stored in more pieces than this (one per append) is folded back into one: every
#: piece costs the search path one more store lookup.
FOLD_FRAGMENTS = 8
#: Distinct postings read together in one reassignment step: splits are grouped until their
#: neighbourhoods reach it (~50 MiB per step at the default 48 KiB posting budget; postings
#: waiting to split hold more, and ``_read_ahead`` holds two steps). A round's splits share
#: many neighbours, so one step per round (instead of 16 splits per step) read a third fewer
#: postings on 200k + 200k and drained it ~15% sooner; the read-ahead then rarely overlaps.
REASSIGN_POSTINGS = 1024
#: A posting rewritten without garbage moves its head to the mean of its primary copies
#: (vectors whose home it is) when it holds at least this many. On the 1M churn benchmark
#: this took recall@10 at max_postings 16 / 32 / 64 from 0.872 / 0.937 / 0.975 to
#: 0.884 / 0.945 / 0.979 (a fresh build: 0.896 / 0.953 / 0.981) at the same vectors scanned
#: (``scrub_ratio`` 1.0; with 0.5, 0.889 / 0.949 / 0.980).
RECENTRE_MIN = 4
#: Pause after a failed round before retrying its postings.
RETRY_PAUSE_S = 0.5
#: Longest sleep between re-pricing a pause the pacer asked for.
PACE_SLICE_S = 0.05
#: How often deferred work is checked for searches that still hold it back.
DEFERRED_POLL_S = 0.005
#: A posting is rewritten without the copies moved out of it once they and its garbage are
#: this fraction of it. A tenth (``gc_fraction``) cost a 1M drain 1.8 s of 31.6 (medians of 3
#: alternating runs; 8% more CPU time); the copies waiting are valid copies, so searches lose
#: nothing but the time to read them (1% more records at max_postings 16 after 1M churn).
CUT_FRACTION = 0.2
#: Checkpoint arrays of the copies waiting to be cut: (posting, copy key) pairs.
STALE_ARRAYS = ("stale_pids", "stale_keys")


def split_children(n_live: np.ndarray, limit: int, build_fill: float) -> np.ndarray:
    """How many postings a split makes of postings holding ``n_live`` live vectors: as many
    as leave them about as full as a build's (``build_fill`` of the ``limit``), at least 2.
    Rounding up instead made a posting one vector over the limit into three children at the
    merge threshold, which merges then undid (more heads, emptier postings, less recall)."""
    target = max(2, int(limit * build_fill))
    return np.maximum(2, np.rint(np.asarray(n_live) / target)).astype(np.int64)


class Rebalancer:
    """The background worker of one index."""

    def __init__(self, engine: Engine, enabled: bool):
        self._engine = engine
        self.enabled = enabled
        self._pending: set[int] = set()
        self._cv = threading.Condition()
        self._busy = False
        self._stop = False
        self._holds = 0  # open hold() contexts: no round starts while any is open
        self._error: BaseException | None = None
        self._rounds_started = 0  # numbers the rounds, so wait_idle can tell old failures from new
        self._failed_round = -1   # number of the last round that failed
        self._scratch = threading.local()  # per thread: live_dedupe's seen array
        # the reassignment of a round's splits runs on its own thread while the next round
        # plans and commits (see ``_start_reassign``): (future of its moves, reader ticket, ``_stamp``)
        self._job: tuple[Future, int, int] | None = None
        # when the rebalancer last rewrote or dropped each posting (``_stamp`` counts them): a
        # reassignment planned on an older read does not trust what it saw there
        self._rewritten = Lengths()
        self._stamp = 0
        # (ticket boundary, postings to drop, {posting: vid*256+version copies to cut out}), run once every
        # search that started before the boundary is done
        self._deferred: list[tuple[int, list[int], dict[int, np.ndarray]]] = []
        self._limbo_pids: set[int] = set()  # dropped heads whose postings still exist
        # {posting: copy keys} no search needs any more, cut out once enough of a posting is
        # stale (or when a round rewrites it anyway): one rewrite per copy moved out of a
        # posting cost half the background thread's time during ingest
        self._stale: dict[int, np.ndarray] = {}
        restored = _unpair(engine.restored_extras)  # saved by the last close: ready at once
        if restored and enabled:
            self._deferred.append((engine.readers.now(), [], restored))
        engine.checkpoint_extras = self._stale_arrays
        # scrubbing: vectors to re-check, earned by writes; a cursor walks the heads
        self._scrub_credit = 0.0
        self._scrub_cursor = 0
        self.counters = {"rounds": 0, "splits": 0, "merges": 0, "drops": 0, "gc": 0, "reassigns": 0,
                         "reassign_checked": 0, "reassign_overtaken": 0, "scrubbed": 0, "scrub_rechecked": 0,
                         "errors": 0, "checkpoints": 0}
        # replica selection for reassignments uses every core when the foreground is idle; its
        # threads run at the rebalancer's priority
        self._yields = engine.config.io_scheduler == "sla"
        self._pool = yielding_pool("vindex-background", self._yields)
        self._reader = yielding_pool("vindex-background-read", self._yields, workers=1)
        self._reassigner = yielding_pool("vindex-reassign", self._yields, workers=1)
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
                self._cv.notify_all()

    def earn_scrub(self, n_written: int) -> None:
        """Writes earn re-checks of as many stored vectors (times ``scrub_ratio``)."""
        if not self.enabled or self._engine.config.scrub_ratio <= 0:
            return
        with self._cv:
            cap = float(max(len(self._engine.state.idmap.versions), 1))
            self._scrub_credit = min(cap, self._scrub_credit + n_written * self._engine.config.scrub_ratio)
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

    def poke(self) -> None:
        """Wake the worker (e.g. a checkpoint is due)."""
        with self._cv:
            self._cv.notify_all()

    @property
    def limbo_pids(self) -> set[int]:
        """Removed heads whose postings are not dropped yet: their pids are not free."""
        with self._cv:
            return set(self._limbo_pids)

    @property
    def stale_copies(self) -> int:
        """Copies moved out of postings that no search needs any more, not cut out yet."""
        with self._cv:
            return sum(v.size for v in self._stale.values())

    @property
    def scrub_pending(self) -> int:
        """Re-checks of stored vectors earned by writes and not done yet (``_scrub``)."""
        with self._cv:
            return int(self._scrub_credit)

    @property
    def depth(self) -> int:
        """Postings waiting, plus one while a round runs."""
        with self._cv:
            return (len(self._pending) + int(self._busy or self._job is not None) + len(self._deferred)
                    + int(self._scrub_credit > 0))

    def _stale_arrays(self) -> dict[str, np.ndarray]:
        """Every copy waiting to be cut, stale or deferred, as (posting, copy key) pairs for
        a checkpoint. Reopened with no log after it, no search is running: all may be cut."""
        with self._cv:
            tables = [self._stale] + [cuts for _, _, cuts in self._deferred]
            pairs = [(p, k) for t in tables for p, k in t.items() if k.size]
        pids = np.concatenate([np.full(k.size, p, dtype=np.int64) for p, k in pairs]) if pairs else np.zeros(0, np.int64)
        keys = np.concatenate([k for _, k in pairs]) if pairs else np.zeros(0, np.int64)
        return dict(zip(STALE_ARRAYS, (pids, keys)))

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no work is queued or running; False on timeout. Raises the failure of a
        background round that starts after the call and fails (failed work is retried: once
        the cause, a full disk say, is gone, the next call returns True). A round already
        running when the call came may have met the cause before it was removed, so its
        failure is not reported; its retry is."""
        with self._cv:
            first = self._rounds_started + 1
            idle = self._cv.wait_for(lambda: (not self._pending and not self._busy and not self._deferred
                                              and self._job is None and self._scrub_credit <= 0)
                                     or self._failed_round >= first,
                                     timeout)
            if self._failed_round >= first and self._error is not None:
                raise self._error
            return bool(idle)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join()
        self._pool.shutdown(wait=True)
        self._reader.shutdown(wait=True)
        self._reassigner.shutdown(wait=True)

    # --- worker -------------------------------------------------------------------------------
    def _run(self) -> None:
        eng = self._engine
        if self._yields:
            lower_thread_priority()  # searches get the cores first
        while True:
            with self._cv:
                while not (self._stop or self._job is not None or not self._holds and (
                           self._pending or eng.checkpoint_due() or self._scrub_credit > 0)):
                    # with deferred work, poll until the searches it waits for finish
                    if not self._cv.wait(DEFERRED_POLL_S if self._deferred else None) and self._deferred:
                        break
                if self._stop:
                    break
                if self._holds and self._job is None:
                    continue
                held = self._holds > 0  # then only the reassignment of the last round finishes
                batch = [] if held else sorted(self._pending)[: eng.config.rebalance_batch]
                self._pending.difference_update(batch)
                scrub = not batch and not held and self._scrub_credit > 0  # when nothing more urgent waits
                self._busy = True
                self._rounds_started += 1
                this_round = self._rounds_started
            started = time.perf_counter()
            try:
                if held:
                    self._finish_reassign()
                    continue
                self._run_deferred()
                if batch:
                    job = self._job
                    self._round(np.asarray(batch, dtype=np.int64))
                    if self._job is job:  # no splits: no newer reassignment to overlap it with
                        self._finish_reassign()
                else:
                    self._finish_reassign()
                    if scrub:
                        self._scrub()
                if eng.checkpoint_due():
                    with eng.lock:
                        write = eng.start_checkpoint()
                    write()  # files and fsyncs without the writers' lock
                    self.counters["checkpoints"] += 1
                if batch or scrub:
                    with self._cv:
                        self._error = None  # the failure (a full disk, say) is over
            except BaseException as exc:  # keep the worker alive; report through wait_idle
                if not threading.main_thread().is_alive():
                    # the interpreter is exiting with the index open and has shut the thread
                    # pools down: stop quietly; the next open queues what is left over limit
                    log.info("background rebalancing stopped: the interpreter is exiting")
                    return
                log.exception("background round failed")
                with self._cv:
                    self.counters["errors"] += 1
                    self._error = exc
                    self._failed_round = this_round
                    self._pending.update(batch)
                self._finish_reassign(apply=False)
                time.sleep(RETRY_PAUSE_S)
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
        self._finish_reassign(apply=False)  # closing: its moves were only an improvement

    def _defer(self, drops: list[int], cuts: dict[int, np.ndarray]) -> None:
        with self._cv:
            self._deferred.append((self._engine.readers.now(), drops, cuts))
            self._limbo_pids.update(drops)
            self._cv.notify_all()  # a worker waiting without a timeout starts polling

    def _forget_cuts(self, pids: list[int]) -> None:
        """Pending cuts of removed heads no longer apply: their records moved on (and the
        pid may be reused for a new posting, which must not lose records it holds)."""
        gone = set(pids)
        with self._cv:
            for _, _, cuts in self._deferred:
                for p in gone.intersection(cuts):
                    del cuts[p]
            for p in gone.intersection(self._stale):
                del self._stale[p]

    def _cancel_cuts(self, pids: np.ndarray, keys: np.ndarray) -> None:
        """Copies ``keys[i]`` were just written to posting ``pids[i]`` again (a reassignment
        back, or a merge): pending cuts of those copies there must not remove them."""
        # one membership test per table of cuts, not one per posting: a reassignment names
        # thousands of postings, and a test per posting was a fifth of the drain's time
        written = _pair_keys(pids, keys)
        touched = set(np.unique(pids).tolist())
        with self._cv:
            for cuts in [c for _, _, c in self._deferred] + [self._stale]:
                hit = sorted(touched.intersection(cuts))
                if not hit:
                    continue
                pending = [cuts[p] for p in hit]
                sizes = [k.size for k in pending]
                back = np.isin(_pair_keys(np.repeat(hit, sizes), np.concatenate(pending)), written)
                if not back.any():
                    continue
                for p, keep in zip(hit, np.split(~back, np.cumsum(sizes)[:-1])):
                    if not keep.all():
                        cuts[p] = cuts[p][keep]

    def _run_deferred(self) -> None:
        """Drop postings of removed heads and cut moved copies out of their old postings, for
        the entries no running search can still depend on."""
        eng = self._engine
        with self._cv:
            ready = [d for d in self._deferred if eng.readers.drained(d[0])]
        if not ready:
            return
        drops = [p for _, group, _ in ready for p in group]
        if drops:
            eng.store.commit(Change(drops=drops), IOClass.BACKGROUND)
            self._mark_rewritten(drops)
        with self._cv:
            grew = set()  # only postings with new stale copies can have reached the threshold
            for _, _, c in ready:
                for pid, keys in c.items():
                    if keys.size:
                        self._stale[pid] = np.union1d(self._stale.get(pid, keys[:0]), keys)
                        grew.add(pid)
            pids = np.fromiter(grew, dtype=np.int64, count=len(grew))
            n_stale = np.fromiter((self._stale[p].size for p in grew), dtype=np.int64, count=pids.size)
            full = n_stale + self._engine.state.garbage[pids] >= np.maximum(
                1, CUT_FRACTION * self._engine.lengths(pids))
            cuts = {int(p): self._stale.pop(int(p)) for p in pids[full]}
        if cuts:
            self._cut(cuts)
        with self._cv:
            self._deferred = [d for d in self._deferred if not any(d is r for r in ready)]
            self._limbo_pids.difference_update(drops)
            self._cv.notify_all()

    def _cut(self, cuts: dict[int, np.ndarray]) -> None:
        """Rewrite postings without the copies named in ``cuts[pid]`` (``vid * 256 + version``
        keys: a copy the user rewrote since has another version and stays), and without
        garbage."""
        eng = self._engine
        g = eng.state.graph
        pids = np.asarray(sorted(p for p in cuts if p < g.n and g.alive[p]), dtype=np.int64)
        if pids.size == 0:
            return
        recs_f, recs_u, offsets, keep, _ = self._snapshot(pids)
        snap_len = np.diff(offsets)
        keep[_copies_named(recs_u, offsets, [cuts[int(p)] for p in pids])] = False
        eng.yield_to_searches()
        with eng.lock:
            now_len = eng.lengths(pids)
            grown = now_len > snap_len
            if grown.any():  # appended meanwhile: keep the new records as they are
                b = eng.store.read(pids[grown], IOClass.BACKGROUND)
                df, _ = records.view(np.array(b.data), eng.dim)
            replaces, j = {}, 0
            for i, pid in enumerate(pids):
                kept = recs_f[offsets[i]:offsets[i + 1]][keep[offsets[i]:offsets[i + 1]]]
                if grown[i]:
                    kept = np.concatenate((kept, df[b.offsets[j] + snap_len[i]:b.offsets[j + 1]]))
                    j += 1
                replaces[int(pid)] = kept.tobytes()
            rec = oplog.Record("cut", {"gc_pids": pids})
            eng.commit(Change(replaces=replaces), rec, IOClass.BACKGROUND)
            self._mark_rewritten(pids)

    def _seen_scratch(self) -> np.ndarray:
        n = self._engine.state.idmap.versions.shape[0]
        seen = getattr(self._scratch, "seen", np.zeros(0, dtype=np.int64))
        if seen.shape[0] < n:
            seen = self._scratch.seen = np.full(max(n, 2 * seen.shape[0]), -1, dtype=np.int64)
        return seen

    def _mark_rewritten(self, pids) -> None:
        """Note postings the rebalancer rewrote or dropped (it alone removes records)."""
        pids = np.asarray(pids, dtype=np.int64)
        if pids.size == 0:
            return
        self._stamp += 1
        self._rewritten.put(pids, self._stamp)

    def _read(self, pids: np.ndarray):
        """Posting records (copied out of the per-thread read buffer) and their liveness.

        Callers that drop records judged dead here hold the writers' lock: a foreground write
        commits its records before it marks their vids live, and a read in between would take
        new records for garbage."""
        return self._decode(pids, *self._fetch(pids))

    def _snapshot(self, pids: np.ndarray):
        """``_read``, fetching outside the writers' lock and judging liveness under it: a
        read under the lock held writers back ~45 ms a round, and taking it out raised a
        500k ingest's upserts/s by ~7%.

        Only this thread removes records, so what the fetch read of each posting
        (``np.diff(offsets)`` records) is a prefix of it once the lock is taken; and a writer
        holds the lock from its commit until it marks its vids live, so every record read is
        judged as its writer left it."""
        fetched = self._fetch(pids)
        eng = self._engine
        with eng.lock:
            if (eng.lengths(pids) < np.diff(fetched[1])).any():  # another writer removed records: read again
                return self._read(pids)
            return self._decode(pids, *fetched)

    def _fetch(self, pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posting bytes, copied out of the calling thread's read buffer, and record offsets."""
        batch = self._engine.store.read(pids, IOClass.BACKGROUND)
        return np.array(batch.data), batch.offsets

    def _decode(self, pids: np.ndarray, data: np.ndarray, offsets: np.ndarray):
        """``_read``'s records and liveness from fetched bytes (liveness as of now)."""
        recs_f, recs_u = records.view(data, self._engine.dim)
        keep, n_live = native.lire.live_dedupe(recs_u, offsets, self._engine.state.idmap.versions,
                                                self._seen_scratch())
        stale = self._stale_copies(pids, recs_u, offsets)
        if stale is not None:  # copies waiting to be cut count as garbage
            keep &= ~stale
            n_live = np.diff(np.concatenate(([0], np.cumsum(keep)))[offsets])
        return recs_f, recs_u, offsets, keep, n_live

    def _read_ahead(self, pid_lists: list[np.ndarray]):
        """``_read`` of each list in turn, fetching the next list while the caller works on
        this one: the store read releases the GIL, and waiting for the neighbourhoods'
        reads was a fifth of the drain. A fetched posting may miss a move the caller makes
        meanwhile; that costs at most a redundant copy (same version), which searches and
        ``live_dedupe`` drop as a duplicate."""
        ahead = None
        for i, pids in enumerate(pid_lists):
            fetched = ahead.result() if ahead is not None else self._fetch(pids)
            ahead = self._reader.submit(self._fetch, pid_lists[i + 1]) if i + 1 < len(pid_lists) else None
            try:
                yield self._decode(pids, *fetched)
            except GeneratorExit:
                if ahead is not None:
                    ahead.cancel()
                raise

    def _stale_copies(self, pids: np.ndarray, recs_u: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
        """Mask of the records that are copies in ``_stale`` (None when there are none)."""
        with self._cv:
            lists = [self._stale.get(int(p)) for p in pids]
        if all(k is None for k in lists):
            return None
        return _copies_named(recs_u, offsets, [k if k is not None else np.zeros(0, np.int64) for k in lists])

    # --- one round ----------------------------------------------------------------------------
    def _round(self, pids: np.ndarray) -> None:
        eng, cfg = self._engine, self._engine.config
        g = eng.state.graph
        pids = pids[(pids < g.n) & g.alive[np.minimum(pids, g.capacity - 1)]]
        if pids.size == 0:
            return
        self.counters["rounds"] += 1
        limit = eng.limit
        recs_f, recs_u, offsets, keep, n_live = self._snapshot(pids)
        snap_len = np.diff(offsets)  # what was read of each posting (``_Plan`` folds in the rest)
        split = n_live > limit
        ks = np.where(split, split_children(n_live, limit, cfg.build_fill), 0)
        many_heads = g.n_alive > 1
        drop = (n_live == 0) & many_heads
        merge = (n_live > 0) & (n_live < limit * cfg.merge_fraction) & many_heads & ~split
        scattered = eng.store.fragments(pids) > FOLD_FRAGMENTS
        gc = ~split & ~drop & ~merge & ((snap_len > n_live) | scattered)
        if not (split.any() or drop.any() or merge.any() or gc.any()):
            return
        cent_off = np.concatenate(([0], np.cumsum(ks)))
        centroids = np.zeros((int(cent_off[-1]), eng.dim), dtype=np.float32)
        labels = np.full(recs_f.shape[0], -1, dtype=np.int64)
        native.lire.split(recs_f, keep, offsets, ks, cent_off, 8, float(cfg.split_balance), labels, centroids)
        busy = set(pids[split | drop | merge].tolist())
        targets = self._merge_targets(pids, merge, n_live, busy)
        merge &= targets >= 0
        gc |= (n_live > 0) & ~split & ~drop & ~merge & ((snap_len > n_live) | scattered)

        eng.yield_to_searches()  # planning and linking the new heads hold the GIL
        with eng.lock:
            plan = _Plan(eng, pids, recs_f, recs_u, offsets, keep, labels, split, ks, cent_off,
                         centroids, drop, merge, targets, gc, snap_len, self._limbo_pids)
            old_centers = g.vectors[pids[split]].copy()
            plan.commit()
            self._mark_rewritten(list(plan.replaces) + list(plan.drops))
            with self._cv:  # rewritten without their stale copies (``_read`` left them out)
                for p in set(pids.tolist()).intersection(plan.replaces):
                    self._stale.pop(p, None)
            if plan.merged_vids.size:
                self._cancel_cuts(plan.merged_to, _copy_keys(plan.merged_vids, plan.merged_versions))
            if plan.drops:  # searches that started before now may still read these postings
                self._forget_cuts(plan.drops)
                self._defer(list(plan.drops), {})
        self.counters["splits"] += int(split.sum())
        self.counters["merges"] += int(merge.sum())
        self.counters["drops"] += int(drop.sum())
        self.counters["gc"] += int(gc.sum())
        self.notify(plan.followups())
        if plan.merged_vids.size:
            self._reassign_vids(plan.merged_vids, plan.merged_versions, plan.merged_vectors, plan.merged_to)
        if split.any() and cfg.reassign_neighbors > 0:
            self._start_reassign(old_centers, plan.children, centroids, cent_off[np.flatnonzero(split)], ks[split])

    def _merge_targets(self, pids: np.ndarray, merge: np.ndarray, n_live: np.ndarray, busy: set) -> np.ndarray:
        """For each posting to merge, the nearest other head with room (-1: none)."""
        eng = self._engine
        g = eng.state.graph
        out = np.full(pids.shape[0], -1, dtype=np.int64)
        idx = np.flatnonzero(merge)
        if idx.size == 0:
            return out
        m = min(8, g.n_alive)
        near, _, counts = g.search(g.vectors[pids[idx]], native.L2, m, np.inf, eng.config.ef_for(m))
        taken: dict[int, int] = {}
        for row, i in enumerate(idx):
            for t in range(counts[row]):
                b = int(near[row, t])
                if b == pids[i] or b in busy:
                    continue
                room = eng.limit - int(eng.lengths(np.array([b]))[0]) - taken.get(b, 0)
                if room >= n_live[i]:
                    out[i] = b
                    taken[b] = taken.get(b, 0) + int(n_live[i])
                    break
        return out

    # --- scrubbing ----------------------------------------------------------------------------
    def _scrub(self) -> None:
        """Re-check the vectors of the next ``rebalance_batch`` heads: move any whose posting
        is no longer among the ones the RNG rule picks for them. SPFresh's reassignment only
        looks around a split; heads made elsewhere (other splits, new regions, merges) also
        take vectors' best postings away, and on the churn benchmark 6% of vectors ended up
        outside their nearest head's posting without this. A cheap look at each posting's
        neighbourhood (``native.lire.scrub_doubts``) picks the records worth the full check,
        so a pass costs little more than its reads."""
        eng = self._engine
        g = eng.state.graph
        alive = np.flatnonzero(g.alive[: g.n])
        if alive.size == 0:
            with self._cv:
                self._scrub_credit = 0.0
            return
        start = np.searchsorted(alive, self._scrub_cursor)
        pids = np.roll(alive, -start)[: eng.config.rebalance_batch]
        self._scrub_cursor = int(pids[-1]) + 1
        recs_f, recs_u, offsets, keep, n_live = self._snapshot(pids)
        rows = np.flatnonzero(keep)
        with self._cv:
            self._scrub_credit = max(0.0, self._scrub_credit - max(1, rows.size))
        if rows.size == 0:
            return
        self.counters["scrubbed"] += int(rows.size)
        # a look at each posting's graph neighbourhood vouches for most records (5 in 6 after
        # a 1M ingest); replica selection runs again only for the rest
        home = np.full(recs_u.shape[0], -1, dtype=np.int32)
        home[rows] = eng.state.idmap.home[recs_u[rows, 0].astype(np.int64)]
        arrays = g.arrays_  # one generation, taken after the homes: it holds every head they name
        cfg = eng.config
        rows = np.flatnonzero(native.lire.scrub_doubts(
            recs_f, keep, offsets, pids.astype(np.int64), home, arrays.vectors, arrays.nbrs, arrays.alive,
            cfg.replica_eps, cfg.rng_factor))
        self.counters["scrub_rechecked"] += int(rows.size)
        if rows.size == 0:
            return
        owner = np.repeat(pids, np.diff(offsets))[rows]
        self._reassign_vids(recs_u[rows, 0].astype(np.int64), recs_u[rows, 1].astype(np.uint8),
                            recs_f[rows, records.HEADER_WORDS:], owner)

    # --- reassignment -------------------------------------------------------------------------
    def _start_reassign(self, old_centers: np.ndarray, children: list[np.ndarray], centroids: np.ndarray,
                        cent_starts: np.ndarray, ks: np.ndarray) -> None:
        """Plan the reassignment after this round's splits on the reassigner thread; the next
        round reads, plans and commits meanwhile, and this thread applies the moves after it.
        Reading the neighbourhoods, checking the conditions and choosing replicas were half of
        this thread's time, and it was the drain's critical path.

        The plan is made from reads the next round may overtake, so applying it checks what
        it saw (``_apply_moves``): a vector whose copies it read in a posting rewritten since
        stays where it is (the scrub looks again later). The job holds a reader ticket, as a
        search does, so no posting it read is dropped, and no pid reused, before it is applied."""
        self._finish_reassign()
        eng = self._engine
        ticket = eng.readers.begin(interactive=False)
        try:
            stamp = self._stamp
            future = self._reassigner.submit(self._plan_after_splits, old_centers, children, centroids,
                                             cent_starts, ks)
        except BaseException:
            eng.readers.end(ticket)
            raise
        with self._cv:
            self._job = (future, ticket, stamp)

    def _finish_reassign(self, apply: bool = True) -> None:
        """Wait for the reassignment in flight and apply its moves (or drop them)."""
        with self._cv:
            job = self._job
        if job is None:
            return
        future, ticket, stamp = job
        try:
            if not apply:
                future.cancel()
                with contextlib.suppress(BaseException):
                    future.result()
                return
            for moves in future.result():
                self._apply_moves(moves, stamp)
        finally:
            self._engine.readers.end(ticket)
            with self._cv:
                self._job = None
                self._cv.notify_all()

    def _plan_after_splits(self, old_centers: np.ndarray, children: list[np.ndarray],
                           centroids: np.ndarray, cent_starts: np.ndarray, ks: np.ndarray) -> list[_Moves]:
        """SPFresh's two conditions over the splits' children and ``reassign_neighbors``
        postings around each, then the moves of the candidates (``_plan_moves``)."""
        eng, cfg = self._engine, self._engine.config
        g = eng.state.graph
        m = min(cfg.reassign_neighbors, g.n_alive)
        near, _, counts = g.search(old_centers, native.L2, m, np.inf, cfg.ef_for(m))
        groups = []  # per group of splits: (lo, hi, examined postings, pair posting, pair split, pair is child)
        post: list[int] = []
        split_of: list[int] = []
        is_child: list[bool] = []
        seen: set[int] = set()
        lo = 0
        for s in range(old_centers.shape[0]):
            kids = [int(c) for c in children[s]]
            mine = kids + [b for b in near[s, :counts[s]].tolist() if b not in kids]
            if s > lo and len(seen.union(mine)) > REASSIGN_POSTINGS:
                groups.append(_group(lo, s, post, split_of, is_child))
                post, split_of, is_child, seen, lo = [], [], [], set(), s
            seen.update(mine)
            post += mine
            split_of += [s - lo] * len(mine)
            is_child += [True] * len(kids) + [False] * (len(mine) - len(kids))
        groups.append(_group(lo, old_centers.shape[0], post, split_of, is_child))
        reads = self._read_ahead([grp[2] for grp in groups])
        planned = []
        for (lo, hi, examined, pair_post, split_of, is_child), read in zip(groups, reads):
            recs_f, recs_u, offsets, keep, _ = read
            eng.yield_to_searches()
            new_off = np.concatenate(([0], np.cumsum(ks[lo:hi])))
            new_centers = np.concatenate([centroids[cent_starts[s]:cent_starts[s] + ks[s]] for s in range(lo, hi)])
            cand = native.lire.reassign_candidates(
                recs_f, keep, offsets, np.ascontiguousarray(g.vectors[examined]), pair_post.astype(np.int64),
                np.asarray(split_of, dtype=np.int64), np.asarray(is_child), np.ascontiguousarray(old_centers[lo:hi]),
                new_off.astype(np.int64), new_centers)
            rows = np.flatnonzero(cand)
            if rows.size == 0:
                continue
            posting_of = np.repeat(examined, np.diff(offsets))
            vids = recs_u[rows, 0].astype(np.int64)
            vids, first = np.unique(vids, return_index=True)
            rows = rows[first]
            # every live copy of a candidate in the examined postings: a copy no longer among
            # its postings is cut, not just the one the conditions looked at
            # a gather instead of np.isin, which sorted every record's vid
            candidate = np.zeros(int(recs_u[:, 0].max()) + 1, dtype=np.bool_)
            candidate[vids] = True
            held = np.flatnonzero(keep & candidate[recs_u[:, 0]])
            h_idx = np.searchsorted(vids, recs_u[held, 0].astype(np.int64))
            moves = self._plan_moves(vids, recs_u[rows, 1].astype(np.uint8), recs_f[rows, records.HEADER_WORDS:],
                                     posting_of[rows], (h_idx, posting_of[held]))
            planned.append(moves._replace(checked=int(rows.size)))
        return planned

    def _reassign_vids(self, vids: np.ndarray, versions: np.ndarray, vectors: np.ndarray,
                       owner: np.ndarray, holders: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Move ``vids`` now (``_plan_moves``, then ``_apply_moves``)."""
        self._apply_moves(self._plan_moves(vids, versions, vectors, owner, holders))

    def _plan_moves(self, vids: np.ndarray, versions: np.ndarray, vectors: np.ndarray,
                    owner: np.ndarray, holders: tuple[np.ndarray, np.ndarray] | None = None) -> _Moves:
        """Which of ``vids`` (seen with ``versions``, one copy in postings ``owner``) to move to
        the postings the RNG rule picks for them now. ``holders`` lists every posting known to
        hold a copy as ``(index into vids, pid)`` pairs (default: the owners). A vector moves
        when a known copy sits in a posting no longer picked, or its nearest picked posting
        lacks it: it is appended to the picked postings that lack it and its unpicked copies
        are cut out once running searches are done. Copies keep their version (see the
        module docstring)."""
        eng, cfg = self._engine, self._engine.config
        n = vids.size
        h_idx, h_pid = holders if holders is not None else (np.arange(n), owner)
        h_pid = np.asarray(h_pid, dtype=np.int64)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        # each search starts at the posting the vector was seen in, near where it ends up
        heads, counts, _ = select_replicas(eng.state, vectors, cfg, self._pool, seeds=owner)
        heads = heads.astype(np.int64)
        # has[i, j]: picked posting j of vector i already holds a copy (its home counts: the
        # posting its latest write or move put it in)
        home = eng.state.idmap.home[vids]
        has = heads == home[:, None]
        match = heads[h_idx] == h_pid[:, None]
        np.logical_or.at(has, h_idx, match)
        has &= heads >= 0
        stale = ~match.any(axis=1)  # holder pairs whose posting is no longer picked
        move = (np.bincount(h_idx[stale], minlength=n) > 0) | ~has[:, 0]
        move &= counts > 0
        # from here on, holder pairs are those of the moved vectors; ``cut`` marks the stale ones
        pairs = move[h_idx]
        (vids, versions, vectors, heads, counts, has, home), h_idx, h_pid = _rows_and_pairs(
            move, (vids, versions, vectors, heads, counts, has, home), h_idx, h_pid, pairs)
        return _Moves(vids, versions, vectors, heads, counts, has, home, h_idx, h_pid, stale[pairs], 0)

    def _apply_moves(self, mv: _Moves, stamp: int | None = None) -> None:
        """Commit the moves of ``_plan_moves``. ``stamp``: the plan was made from reads
        taken when ``_stamp`` was this; a vector seen in a posting rewritten since is left
        where it is, since what the plan took for its copies there may be gone."""
        eng = self._engine
        self.counters["reassign_checked"] += mv.checked
        if mv.vids.size == 0:
            return
        vids, versions, vectors, heads, counts, has = mv.vids, mv.versions, mv.vectors, mv.heads, mv.counts, mv.has
        h_idx, h_pid, cut = mv.h_idx, mv.h_pid, mv.cut
        eng.yield_to_searches()
        with eng.lock:
            g = eng.state.graph
            # compare-and-set: skip vids changed or deleted since they were read, and any whose
            # picked postings or stale copies went away meanwhile
            limbo = np.fromiter(self._limbo_pids, dtype=np.int64, count=len(self._limbo_pids))
            ok = eng.state.idmap.versions[vids] == versions
            ok &= (g.alive[np.maximum(heads, 0)] | (heads < 0)).all(axis=1)
            ok &= np.bincount(h_idx[cut & np.isin(h_pid, limbo)], minlength=vids.size) == 0
            if stamp is not None:  # planned on reads the next round may have overtaken
                ok &= eng.state.idmap.home[vids] == mv.home
                overtaken = np.bincount(h_idx[self._rewritten.get(h_pid) > stamp], minlength=vids.size) > 0
                self.counters["reassign_overtaken"] += int((ok & overtaken).sum())
                ok &= ~overtaken
            if not ok.any():
                return
            (vids, versions, vectors, heads, counts, has), h_idx, h_pid = _rows_and_pairs(
                ok, (vids, versions, vectors, heads, counts, has), h_idx, h_pid, ok[h_idx] & cut)
            add = np.where(has, -1, heads)  # only the picked postings that lack a copy
            add_counts = (add >= 0).sum(axis=1)
            appends = group_appends(add, add_counts, vids, versions, vectors) if add_counts.any() else {}
            rec = oplog.Record("reassign", {"r_vids": vids, "r_home": heads[:, 0].astype(np.int32)})
            eng.commit(Change(appends=appends), rec, IOClass.BACKGROUND)
            keys = _copy_keys(vids, versions)
            # the copies in every picked posting stay, appended now or relied on as held: a cut
            # still pending from an earlier move must not remove them
            chosen = heads >= 0
            self._cancel_cuts(heads[chosen], np.broadcast_to(keys[:, None], heads.shape)[chosen])
        self.counters["reassigns"] += int(vids.size)
        cut_keys = keys[h_idx]
        order = np.argsort(h_pid, kind="stable")  # one sort, not a pass over every pair per posting
        owners, starts = np.unique(h_pid[order], return_index=True)
        self._defer([], dict(zip(owners.tolist(), np.split(cut_keys[order], starts[1:]))))
        targets = np.asarray(list(appends), dtype=np.int64)
        if targets.size:
            self.notify(targets[eng.lengths(targets) > eng.limit])


class _Moves(NamedTuple):
    """The moves ``_plan_moves`` chose: rows of the vectors to move, with their picked
    postings (``heads``, -1 padded; ``has``: holds a copy already) and their ``home`` when
    planned; ``(h_idx, h_pid)`` every posting each was seen in, ``cut`` marking the copies
    there to cut out; ``checked``: candidates the split conditions found."""

    vids: np.ndarray
    versions: np.ndarray
    vectors: np.ndarray
    heads: np.ndarray
    counts: np.ndarray
    has: np.ndarray
    home: np.ndarray
    h_idx: np.ndarray
    h_pid: np.ndarray
    cut: np.ndarray
    checked: int


def _group(lo: int, hi: int, post: list[int], split_of: list[int], is_child: list[bool]) -> tuple:
    """One reassignment step over splits ``lo:hi``: the distinct postings to read and, per
    (posting, split) pair, the index of its posting among them."""
    examined, pair_post = np.unique(np.asarray(post, dtype=np.int64), return_inverse=True)
    return lo, hi, examined, pair_post, split_of, is_child


def _copy_keys(vids: np.ndarray, versions: np.ndarray) -> np.ndarray:
    """One int64 per copy of a vector, ``vid * 256 + version``: what cuts and stale copies
    name (a copy the user rewrote since has another version)."""
    return np.asarray(vids, dtype=np.int64) * 256 + np.asarray(versions, dtype=np.int64)


def _unpair(arrays: dict[str, np.ndarray]) -> dict[int, np.ndarray]:
    """``{posting: sorted copy keys}`` from a checkpoint's (posting, copy key) pairs."""
    if not all(name in arrays for name in STALE_ARRAYS):
        return {}
    pids, keys = (np.asarray(arrays[name], dtype=np.int64) for name in STALE_ARRAYS)
    order = np.argsort(pids, kind="stable")  # np.unique sorts each posting's keys
    pids, keys = pids[order], keys[order]
    starts = np.flatnonzero(np.concatenate(([True], pids[1:] != pids[:-1]))) if pids.size else pids
    return {int(pids[a]): np.unique(k) for a, k in zip(starts, np.split(keys, starts[1:]))}


def _pair_keys(owners: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """(owner, copy key) pairs packed into one int64 each, so that one membership test
    covers many postings (copy keys, ``vid * 256 + version``, are < 2^40)."""
    return (np.asarray(owners, dtype=np.int64) << 40) | np.asarray(keys, dtype=np.int64)


def _copies_named(recs_u: np.ndarray, offsets: np.ndarray, keys: list[np.ndarray]) -> np.ndarray:
    """Mask of the records of posting ``i`` (``offsets[i]:offsets[i+1]``) whose copy key
    (``vid * 256 + version``) is in ``keys[i]``."""
    sizes = np.fromiter((np.size(k) for k in keys), dtype=np.int64, count=len(keys))
    flat = np.concatenate([np.asarray(k, dtype=np.int64) for k in keys]) if keys else np.zeros(0, np.int64)
    return native.lire.copies_named(recs_u, np.asarray(offsets, dtype=np.int64),
                                    np.concatenate(([0], np.cumsum(sizes))), flat)


def _rows_and_pairs(rows: np.ndarray, arrays: tuple, h_idx: np.ndarray, h_pid: np.ndarray,
                    pairs: np.ndarray) -> tuple[tuple, np.ndarray, np.ndarray]:
    """The ``rows`` of each of ``arrays``, and the ``pairs`` of ``(h_idx, h_pid)`` with
    ``h_idx`` renumbered to index the kept rows (every kept pair must point at a kept row)."""
    renumber = np.cumsum(rows) - 1
    return tuple(a[rows] for a in arrays), renumber[h_idx[pairs]], h_pid[pairs]


class _Plan:
    """The writes of one round, built and committed under the writers' lock."""

    def __init__(self, eng: Engine, pids, recs_f, recs_u, offsets, keep, labels, split, ks, cent_off,
                 centroids, drop, merge, targets, gc, snap_len, limbo: set[int]):
        self.eng = eng
        g = eng.state.graph
        dim = eng.dim
        H = records.HEADER_WORDS
        versions = eng.state.idmap.versions
        # copies rewritten or deleted since the snapshot are garbage now: moving them would
        # point their vid's home at a posting without its current copy
        keep = keep & (versions[recs_u[:, 0]] == recs_u[:, 1])
        # records appended since the snapshot are folded in (writers hold this lock too)
        now_len = eng.lengths(pids)
        grown = np.flatnonzero((now_len > snap_len) & (split | drop | merge | gc))
        delta: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if grown.size:
            b = eng.store.read(pids[grown], IOClass.BACKGROUND)
            df, du = records.view(np.array(b.data), dim)
            for j, i in enumerate(grown):
                lo, hi = b.offsets[j] + snap_len[i], b.offsets[j + 1]
                live = versions[np.minimum(du[lo:hi, 0], versions.shape[0] - 1)] == du[lo:hi, 1]
                live &= du[lo:hi, 0] < versions.shape[0]
                delta[int(i)] = (df[lo:hi][live], du[lo:hi][live])
        drop = drop & np.array([int(i) not in delta for i in range(pids.shape[0])])  # not empty now
        gc = gc | ((~split & ~merge & ~drop) & np.array([int(i) in delta for i in range(pids.shape[0])]))

        self.children: list[np.ndarray] = []
        replaces: dict[int, bytes] = {}
        appends: dict[int, bytes] = {}
        drops: list[int] = []
        mv_vids, mv_from, mv_to = [], [], []
        split_idx = np.flatnonzero(split)
        new_pids = g.free_pids(int(ks[split].sum()), limbo) if split_idx.size else np.zeros(0, np.int64)
        pos = 0
        radius = []
        for i in split_idx:
            k = int(ks[i])
            kids = new_pids[pos:pos + k]
            pos += k
            self.children.append(kids)
            rng = slice(offsets[i], offsets[i + 1])
            kf, ku, kl = recs_f[rng][keep[rng]], recs_u[rng][keep[rng]], labels[rng][keep[rng]]
            if int(i) in delta:
                df, du = delta[int(i)]
                cents = centroids[cent_off[i]:cent_off[i + 1]]
                dl = np.argmin(((df[:, H:, None] - cents.T[None]) ** 2).sum(1), axis=1) if df.shape[0] else np.zeros(0, np.int64)
                kf, ku, kl = np.concatenate((kf, df)), np.concatenate((ku, du)), np.concatenate((kl, dl))
            cents = centroids[cent_off[i]:cent_off[i + 1]]
            for c in range(k):
                sel = kl == c
                replaces[int(kids[c])] = kf[sel].tobytes()
                radius.append(float(((kf[sel, H:] - cents[c]) ** 2).sum(axis=1).mean()) if sel.any() else 0.0)
                mv_vids.append(ku[sel, 0])
                mv_from.append(np.full(int(sel.sum()), pids[i]))
                mv_to.append(np.full(int(sel.sum()), kids[c]))
            drops.append(int(pids[i]))
        self.merged_vids = np.zeros(0, np.int64)
        self.merged_versions = np.zeros(0, np.uint8)
        self.merged_vectors = np.zeros((0, dim), np.float32)
        self.merged_to = np.zeros(0, np.int64)
        mvs, mvv, mvx, mvt = [], [], [], []
        for i in np.flatnonzero(merge):
            rng = slice(offsets[i], offsets[i + 1])
            kf, ku = recs_f[rng][keep[rng]], recs_u[rng][keep[rng]]
            if int(i) in delta:
                kf, ku = np.concatenate((kf, delta[int(i)][0])), np.concatenate((ku, delta[int(i)][1]))
            t = int(targets[i])
            appends[t] = appends.get(t, b"") + kf.tobytes()
            mv_vids.append(ku[:, 0])
            mv_from.append(np.full(ku.shape[0], pids[i]))
            mv_to.append(np.full(ku.shape[0], t))
            mvs.append(ku[:, 0])
            mvv.append(ku[:, 1])
            mvx.append(kf[:, H:])
            mvt.append(np.full(ku.shape[0], t))
            drops.append(int(pids[i]))
        if mvs:
            self.merged_vids = np.concatenate(mvs).astype(np.int64)
            self.merged_versions = np.concatenate(mvv).astype(np.uint8)
            self.merged_vectors = np.concatenate(mvx)
            self.merged_to = np.concatenate(mvt).astype(np.int64)
        for i in np.flatnonzero(drop):
            drops.append(int(pids[i]))
        centred, centres, centred_radius = [], [], []
        home = eng.state.idmap.home
        for i in np.flatnonzero(gc):
            rng = slice(offsets[i], offsets[i + 1])
            kf, ku = recs_f[rng][keep[rng]], recs_u[rng][keep[rng]]
            if int(i) in delta:
                kf, ku = np.concatenate((kf, delta[int(i)][0])), np.concatenate((ku, delta[int(i)][1]))
            replaces[int(pids[i])] = kf.tobytes()
            own = kf[home[ku[:, 0].astype(np.int64)] == pids[i], H:]
            if own.shape[0] >= RECENTRE_MIN:
                c = own.mean(axis=0, dtype=np.float64).astype(np.float32)
                centred.append(int(pids[i]))
                centres.append(c)
                centred_radius.append(float(((own - c) ** 2).sum(axis=1).mean()))
        # heads moved to the mean of their primary copies, and their new radii
        self.centred = np.asarray(centred, dtype=np.int64)
        self.centres = np.asarray(centres, dtype=np.float32).reshape(-1, dim)
        self.centred_radius = np.asarray(centred_radius, dtype=np.float32)

        self.replaces, self.appends, self.drops = replaces, appends, drops
        self.new_pids = new_pids
        self.split_heads = np.repeat(pids[split_idx], ks[split_idx])  # per new head, the head it splits
        self.new_radius = np.asarray(radius, dtype=np.float32)
        self.new_vectors = centroids[np.concatenate([np.arange(cent_off[i], cent_off[i + 1]) for i in split_idx])] \
            if split_idx.size else np.zeros((0, dim), np.float32)
        self.removed = np.asarray(drops, dtype=np.int64)
        self.gc_pids = np.concatenate((new_pids, pids[gc], self.removed)).astype(np.int64)
        cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))
        self.moves = (cat(mv_vids, np.int64), cat(mv_from, np.int32), cat(mv_to, np.int32))

    def commit(self) -> None:
        eng = self.eng
        g = eng.state.graph
        cfg = eng.config
        # 1. link the new heads in place: reachable now, their postings still empty
        touched_in = g.insert(self.new_pids, self.new_vectors, cfg.graph_build_ef, self.new_radius,
                              near=self.split_heads) if self.new_pids.size else np.zeros(0, np.int64)
        # 2. unlink the old heads on a copy, published only after the store commit
        nbrs = g.nbrs.copy()
        touched_out = np.zeros(0, np.int64)
        if self.removed.size:
            removed = np.zeros(g.capacity, dtype=np.bool_)
            removed[self.removed] = True
            mark = np.zeros(g.capacity, dtype=np.uint8)
            native.graph.remove_nodes(removed, g.vectors, nbrs, g.alpha2, mark)
            touched_out = np.flatnonzero(mark)
        rows = np.union1d(touched_in, touched_out).astype(np.int64)
        alive_after = g.alive.copy()
        alive_after[self.removed] = False
        entries = g.entries[alive_after[g.entries]]
        if entries.size < min(g.n_entries, int(alive_after.sum())):
            extra = np.setdiff1d(np.flatnonzero(alive_after[: g.n]), entries)[: g.n_entries - entries.size]
            entries = np.concatenate((entries, extra)).astype(np.int32)
        mark = np.zeros(g.capacity, dtype=np.uint8)
        connect(g.n, alive_after, entries, g.vectors, nbrs, mark)  # removal may cut heads off
        rows = np.union1d(rows, np.flatnonzero(mark)).astype(np.int64)
        # 3. move the recentred heads (a search racing it may see a head half moved: one
        # distance off, the postings it reads are the same)
        old_centres, old_radius = g.vectors[self.centred].copy(), g.radius[self.centred].copy()
        g.vectors[self.centred] = self.centres
        g.radius[self.centred] = self.centred_radius
        heads = np.concatenate((self.new_pids, self.removed, self.centred)).astype(np.int64)
        vids, frm, to = self.moves
        rec = oplog.Record("rebalance", {
            "g_pids": heads, "g_vectors": g.vectors[heads], "g_alive": alive_after[heads],
            "g_radius": g.radius[heads],
            "g_rows": rows, "g_row_values": nbrs[rows], "g_entries": entries,
            "m_vids": vids, "m_from": frm, "m_to": to, "gc_pids": self.gc_pids})
        change = Change(appends=self.appends, replaces=self.replaces)  # drops wait in limbo
        try:
            eng.commit(change, rec, IOClass.BACKGROUND, graph_done=True)
        except BaseException:
            g.vectors[self.centred] = old_centres  # undo step 3
            g.radius[self.centred] = old_radius
            if self.new_pids.size:  # undo step 1
                undo = np.zeros(g.capacity, dtype=np.bool_)
                undo[self.new_pids] = True
                native.graph.remove_nodes(undo, g.vectors, g.nbrs, g.alpha2, np.zeros(g.capacity, np.uint8))
                g.alive[self.new_pids] = False
                g.n_alive = int(g.alive[: g.n].sum())
            raise
        # 4. publish the unlinking
        g.publish_nbrs(nbrs)
        g.alive[self.removed] = False
        g.n_alive = int(g.alive[: g.n].sum())
        g.entries = entries

    def followups(self) -> np.ndarray:
        """Postings this round wrote that may need another look (still over the limit)."""
        written = np.asarray(list(self.replaces) + list(self.appends), dtype=np.int64)
        if written.size == 0:
            return written
        return written[self.eng.lengths(written) > self.eng.limit]

