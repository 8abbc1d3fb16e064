"""One background round over a batch of postings: plan its splits, merges, drops and
rewrites from one read, then commit them in one atomic batch.

A round reads its postings without any lock, plans in nogil kernels, and takes the writers'
lock only to fold in records appended meanwhile, link the new heads, and commit. Searches
never take the lock: new heads are linked before the commit (their postings are still
empty), and the old heads leave the graph only after it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from vindex import native

from .. import oplog
from ..engine import Engine
from ..heads import connect
from ..storage import Change, IOClass, records
from .cut import Cuts
from .fold import plan_rewrites
from .merge import merge_targets, plan_merges
from .policy import Decision, decide, over_budget
from .reads import PostingReader, Postings, copy_keys
from .reassign import Reassigner
from .split import Clusters, cluster, plan_splits


@dataclass
class RoundInputs:
    """What a round read and decided: its postings ``pids``, the records read of them
    (``read``; ``keep`` may be narrowed under the lock), the work ``decision``, the split's
    ``clusters`` and each merge's ``targets`` (-1: none)."""

    pids: np.ndarray
    read: Postings
    keep: np.ndarray
    decision: Decision
    clusters: Clusters
    targets: np.ndarray

    @property
    def snap_len(self) -> np.ndarray:
        """Records read of each posting (the plan folds in what was appended since)."""
        return np.diff(self.read.offsets)


class RoundPlan:
    """The writes of one round, built and committed under the writers' lock."""

    def __init__(self, eng: Engine, inputs: RoundInputs, limbo: set[int]):
        self.eng = eng
        g = eng.state.graph
        dim = eng.dim
        pids, recs_u = inputs.pids, inputs.read.recs_u
        d = inputs.decision
        versions = eng.state.idmap.versions
        # copies rewritten or deleted since the snapshot are garbage now: moving them would
        # point their vid's home at a posting without its current copy
        keep = inputs.keep & (versions[recs_u[:, 0]] == recs_u[:, 1])
        delta = self._appended_since(pids, inputs.snap_len, d.split | d.drop | d.merge | d.gc)
        grown = np.array([int(i) in delta for i in range(pids.shape[0])], dtype=bool)
        drop = d.drop & ~grown  # not empty now
        gc = d.gc | ((~d.split & ~d.merge & ~drop) & grown)
        rnd = dataclasses.replace(inputs, keep=keep, decision=dataclasses.replace(d, drop=drop, gc=gc))

        splits = plan_splits(rnd, delta, g, limbo)
        merges = plan_merges(rnd, delta, dim)
        fold = plan_rewrites(rnd, delta, eng.state.idmap.home, dim)
        self.children = splits.children
        self.merged_vids, self.merged_versions = merges.vids, merges.versions
        self.merged_vectors, self.merged_to = merges.vectors, merges.to
        # heads moved to the mean of their primary copies, and their new radii
        self.centred, self.centres, self.centred_radius = fold.centred, fold.centres, fold.radius
        self.replaces = {**splits.replaces, **fold.replaces}
        self.appends = merges.appends
        self.drops = splits.drops + merges.drops + [int(pids[i]) for i in np.flatnonzero(drop)]
        self.new_pids = splits.new_pids
        self.split_heads = splits.split_heads
        self.new_radius = splits.new_radius
        self.new_vectors = splits.new_vectors
        self.removed = np.asarray(self.drops, dtype=np.int64)
        self.gc_pids = np.concatenate((self.new_pids, pids[gc], self.removed)).astype(np.int64)
        moves = splits.moves + merges.moves
        cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))
        self.moves = (cat([m[0] for m in moves], np.int64), cat([m[1] for m in moves], np.int32),
                      cat([m[2] for m in moves], np.int32))

    def _appended_since(self, pids: np.ndarray, snap_len: np.ndarray, changed: np.ndarray
                        ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Live records appended since the read to the postings this round changes, by
        index into ``pids`` (writers hold the lock too, so none is appended meanwhile)."""
        eng = self.eng
        versions = eng.state.idmap.versions
        now_len = eng.lengths(pids)
        grown = np.flatnonzero((now_len > snap_len) & changed)
        delta: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if grown.size:
            b = eng.store.read(pids[grown], IOClass.BACKGROUND)
            df, du = records.view(np.array(b.data), eng.dim)
            for j, i in enumerate(grown):
                lo, hi = b.offsets[j] + snap_len[i], b.offsets[j + 1]
                live = versions[np.minimum(du[lo:hi, 0], versions.shape[0] - 1)] == du[lo:hi, 1]
                live &= du[lo:hi, 0] < versions.shape[0]
                delta[int(i)] = (df[lo:hi][live], du[lo:hi][live])
        return delta

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
        return written[over_budget(self.eng.lengths(written), self.eng.limit)]


class Rounds:
    """The round job: ``run`` reads a batch of postings, decides (``policy.decide``), plans
    (``RoundPlan``) and commits, then queues follow-ups and hands the vectors it moved to
    the reassignment."""

    def __init__(self, engine: Engine, reader: PostingReader, cuts: Cuts, reassigner: Reassigner, counters: dict,
                 notify: Callable[[np.ndarray], None]):
        self._engine = engine
        self._reader = reader
        self._cuts = cuts
        self._reassigner = reassigner
        self._counters = counters
        self._notify = notify

    def run(self, pids: np.ndarray) -> None:
        eng, cfg = self._engine, self._engine.config
        g = eng.state.graph
        pids = pids[(pids < g.n) & g.alive[np.minimum(pids, g.capacity - 1)]]
        if pids.size == 0:
            return
        self._counters["rounds"] += 1
        read = self._reader.snapshot(pids)
        snap_len = np.diff(read.offsets)
        decision = decide(read.n_live, snap_len, eng.store.fragments(pids), eng.limit, cfg, g.n_alive)
        if not decision.any():
            return
        clusters = cluster(read.recs_f, read.keep, read.offsets, decision.ks, eng.dim, cfg.split_balance)
        split, drop, merge = decision.split, decision.drop, decision.merge
        busy = set(pids[split | drop | merge].tolist())
        targets = merge_targets(eng, pids, merge, read.n_live, busy)
        decision.settle_merges(targets, read.n_live)
        inputs = RoundInputs(pids, read, read.keep, decision, clusters, targets)

        eng.yield_to_searches()  # planning and linking the new heads hold the GIL
        cuts = self._cuts
        with eng.lock:
            plan = RoundPlan(eng, inputs, cuts.limbo_pids)
            old_centers = g.vectors[pids[split]].copy()
            plan.commit()
            cuts.mark_rewritten(list(plan.replaces) + list(plan.drops))
            # rewritten without their stale copies (reads left them out)
            cuts.rewritten_clean(set(pids.tolist()).intersection(plan.replaces))
            if plan.merged_vids.size:
                cuts.cancel(plan.merged_to, copy_keys(plan.merged_vids, plan.merged_versions))
            if plan.drops:  # searches that started before now may still read these postings
                cuts.forget(plan.drops)
                cuts.defer(list(plan.drops), {})
        self._counters["splits"] += int(split.sum())
        self._counters["merges"] += int(decision.merge.sum())
        self._counters["drops"] += int(drop.sum())
        self._counters["gc"] += int(decision.gc.sum())
        self._notify(plan.followups())
        if plan.merged_vids.size:
            self._reassigner.reassign_vids(plan.merged_vids, plan.merged_versions, plan.merged_vectors,
                                           plan.merged_to)
        if split.any() and cfg.reassign_neighbors > 0:
            self._reassigner.start(old_centers, plan.children, clusters.centroids,
                                   clusters.cent_off[np.flatnonzero(split)], decision.ks[split])
