"""Deferred work: dropping the postings of removed heads and cutting moved copies out of
their old postings, once no running search can still need them.

A search that chose its postings before a split or a move may read them after it, so work
that takes data away from searches waits in a deferred queue, behind a reader-ticket
boundary. Moved copies then wait as *stale* copies (still valid, skipped as duplicates)
until enough of a posting is stale to be worth a rewrite (``policy.cut_due``): one rewrite
per copy moved out of a posting would cost the background most of its time during ingest.

The copies still waiting are saved with each checkpoint (``arrays``) and restored at open
when no log follows the checkpoint.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np

from .. import oplog
from ..engine import Engine
from ..errors import StorageError
from ..storage import Change, IOClass, records
from ..storage.directory import Lengths
from . import policy
from .reads import PostingReader, copies_named

log = logging.getLogger("vindex.rebalance")

#: Checkpoint arrays of the copies waiting to be cut: (posting, copy key) pairs.
STALE_ARRAYS = ("stale_pids", "stale_keys")


class Cuts:
    """The deferred queue, the stale copies and the removed heads still in the store of one
    index; their tables are guarded by ``cv``, the background's condition."""

    def __init__(self, engine: Engine, cv: threading.Condition, enabled: bool):
        self._engine = engine
        self._cv = cv
        # (ticket boundary, postings to drop, {posting: vid*256+version copies to cut out}), run once every
        # search that started before the boundary is done
        self._deferred: list[tuple[int, list[int], dict[int, np.ndarray]]] = []
        self._limbo_pids: set[int] = set()  # dropped heads whose postings still exist
        # {posting: copy keys} no search needs any more, cut out once enough of a posting is stale
        self._stale: dict[int, np.ndarray] = {}
        # when the background last rewrote or dropped each posting (``stamp`` counts them): a
        # reassignment planned on an older read does not trust what it saw there
        self._rewritten = Lengths()
        self.stamp = 0
        restored = unpair(engine.checkpoints.restored)  # saved by the last close: ready at once
        if restored and enabled:
            self._deferred.append((engine.readers.now(), [], restored))

    # --- state ----------------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        """Entries of deferred work queued (caller holds ``cv``)."""
        return len(self._deferred)

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

    def arrays(self) -> dict[str, np.ndarray]:
        """Every copy waiting to be cut, stale or deferred, as (posting, copy key) pairs for
        a checkpoint. Reopened with no log after it, no search is running: all may be cut."""
        with self._cv:
            tables = [self._stale] + [cuts for _, _, cuts in self._deferred]
            pairs = [(p, k) for t in tables for p, k in t.items() if k.size]
        pids = np.concatenate([np.full(k.size, p, dtype=np.int64) for p, k in pairs]) if pairs else np.zeros(0, np.int64)
        keys = np.concatenate([k for _, k in pairs]) if pairs else np.zeros(0, np.int64)
        return dict(zip(STALE_ARRAYS, (pids, keys)))

    def stale_mask(self, pids: np.ndarray, recs_u: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
        """Mask of the records that are stale copies (None when there are none)."""
        with self._cv:
            lists = [self._stale.get(int(p)) for p in pids]
        if all(k is None for k in lists):
            return None
        return copies_named(recs_u, offsets, [k if k is not None else np.zeros(0, np.int64) for k in lists])

    def mark_rewritten(self, pids) -> None:
        """Note postings the background rewrote or dropped (it alone removes records)."""
        pids = np.asarray(pids, dtype=np.int64)
        if pids.size == 0:
            return
        self.stamp += 1
        self._rewritten.put(pids, self.stamp)

    def rewritten_since(self, pids: np.ndarray, stamp: int) -> np.ndarray:
        """Mask of ``pids`` rewritten or dropped after ``stamp``."""
        return self._rewritten.get(pids) > stamp

    # --- changes to the tables ------------------------------------------------------------------
    def defer(self, drops: list[int], cuts: dict[int, np.ndarray]) -> None:
        """Drop ``drops`` and cut ``cuts`` once the searches running now are done."""
        with self._cv:
            self._deferred.append((self._engine.readers.now(), drops, cuts))
            self._limbo_pids.update(drops)
            self._cv.notify_all()  # a worker waiting without a timeout starts polling

    def forget(self, pids: list[int]) -> None:
        """Pending cuts of removed heads no longer apply: their records moved on (and the
        pid may be reused for a new posting, which must not lose records it holds)."""
        gone = set(pids)
        with self._cv:
            for _, _, cuts in self._deferred:
                for p in gone.intersection(cuts):
                    del cuts[p]
            for p in gone.intersection(self._stale):
                del self._stale[p]

    def rewritten_clean(self, pids) -> None:
        """``pids`` were rewritten without their stale copies (reads leave them out)."""
        with self._cv:
            for p in pids:
                self._stale.pop(p, None)

    def cancel(self, pids: np.ndarray, keys: np.ndarray) -> None:
        """Copies ``keys[i]`` were just written to posting ``pids[i]`` again (a reassignment
        back, or a merge): pending cuts of those copies there must not remove them."""
        # one membership test per table of cuts, not one per posting: a reassignment names
        # thousands of postings, and a test per posting was a large share of a drain
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

    # --- the job --------------------------------------------------------------------------------
    def run_ready(self, reader: PostingReader) -> None:
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
            self.mark_rewritten(drops)
        cuts = self._stage(ready)
        if cuts:
            plan = plan_cut(eng, reader, cuts)
            if plan is not None:
                self.apply_cut(plan)
        with self._cv:
            self._deferred = [d for d in self._deferred if not any(d is r for r in ready)]
            self._limbo_pids.difference_update(drops)
            self._cv.notify_all()

    def _stage(self, ready: list) -> dict[int, np.ndarray]:
        """Move the cuts of ``ready`` entries among the stale copies; return (and take out)
        those of postings now due for a rewrite."""
        with self._cv:
            grew = set()  # only postings with new stale copies can have reached the threshold
            for _, _, c in ready:
                for pid, keys in c.items():
                    if keys.size:
                        self._stale[pid] = np.union1d(self._stale.get(pid, keys[:0]), keys)
                        grew.add(pid)
            pids = np.fromiter(grew, dtype=np.int64, count=len(grew))
            n_stale = np.fromiter((self._stale[p].size for p in grew), dtype=np.int64, count=pids.size)
            full = policy.cut_due(n_stale, self._engine.state.garbage[pids], self._engine.lengths(pids))
            return {int(p): self._stale.pop(int(p)) for p in pids[full]}

    def apply_cut(self, plan: "CutPlan") -> None:
        """Commit ``plan``: under the writers' lock, with records appended since its read kept
        as they are."""
        eng = self._engine
        pids, offsets, snap_len = plan.pids, plan.offsets, np.diff(plan.offsets)
        eng.yield_to_searches()
        with eng.lock:
            now_len = eng.lengths(pids)
            grown = now_len > snap_len
            if grown.any():  # appended meanwhile: keep the new records as they are
                b = eng.store.read(pids[grown], IOClass.BACKGROUND)
                df, _ = records.view(np.array(b.data), eng.dim)
            replaces, j = {}, 0
            for i, pid in enumerate(pids):
                kept = plan.recs_f[offsets[i]:offsets[i + 1]][plan.keep[offsets[i]:offsets[i + 1]]]
                if grown[i]:
                    kept = np.concatenate((kept, df[b.offsets[j] + snap_len[i]:b.offsets[j + 1]]))
                    j += 1
                replaces[int(pid)] = kept.tobytes()
            rec = oplog.Record("cut", {"gc_pids": pids})
            eng.commit(Change(replaces=replaces), rec, IOClass.BACKGROUND)
            self.mark_rewritten(pids)


@dataclass
class CutPlan:
    """Postings to rewrite keeping the records ``keep`` of what was read of them."""

    pids: np.ndarray
    recs_f: np.ndarray
    offsets: np.ndarray
    keep: np.ndarray


def drop_orphans(engine: Engine) -> list[int]:
    """Drop the postings of removed heads whose deferred drop a crash cut short (at open,
    before any search runs). Returns those it could not drop (a store opened read-only on a
    full disk): the caller defers them, which keeps their pids from reuse until dropped."""
    g = engine.state.graph
    dead = np.flatnonzero(~g.alive[: g.n])
    orphans = [int(p) for p in dead[engine.lengths(dead) > 0]]
    if not orphans:
        return []
    try:
        engine.store.commit(Change(drops=orphans), IOClass.BACKGROUND)
    except StorageError as exc:
        log.warning("%d postings of removed heads stay until the store can write: %s", len(orphans), exc)
        return orphans
    return []


def plan_cut(engine: Engine, reader: PostingReader, cuts: dict[int, np.ndarray]) -> CutPlan | None:
    """Read the live postings among ``cuts`` and mark what stays: everything live but the
    copies named in ``cuts[pid]`` (``vid * 256 + version`` keys: a copy the user rewrote
    since has another version and stays). None when no posting is left to rewrite."""
    g = engine.state.graph
    pids = np.asarray(sorted(p for p in cuts if p < g.n and g.alive[p]), dtype=np.int64)
    if pids.size == 0:
        return None
    recs_f, recs_u, offsets, keep, _ = reader.snapshot(pids)
    keep[copies_named(recs_u, offsets, [cuts[int(p)] for p in pids])] = False
    return CutPlan(pids, recs_f, offsets, keep)


def unpair(arrays: dict[str, np.ndarray]) -> dict[int, np.ndarray]:
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
