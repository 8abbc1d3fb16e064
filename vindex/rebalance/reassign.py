"""Reassignment (SPFresh's LIRE): moving vectors whose best postings changed.

After a split, vectors near it may have lost their best posting; the two SPFresh conditions
pick candidates in the split's children and in the ``reassign_neighbors`` postings around it,
and each candidate whose current posting is no longer among its chosen replicas is copied to
the chosen postings (a compare-and-set on its version skips vectors a user changed meanwhile).
A thread of its own plans that reassignment (reads the neighbourhoods, checks the conditions,
chooses replicas) while the next round reads, plans and commits; the round thread applies
the moves, so all bookkeeping of copies to cut stays on one thread. A vector the plan saw in
a posting the background rewrote meanwhile stays where it is (``apply_moves``).

Unlike SPFresh, a reassignment keeps the vector's version: the new copies are valid at once
and the old one is cut out of its posting later (``cut``). Bumping the version instead would
let a search that chose its postings before the move, and reads them after, see neither copy.
"""
from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, NamedTuple

import numpy as np

from vindex import native

from .. import oplog
from ..engine import Engine
from ..storage import Change, IOClass, records
from ..writes import group_appends, select_replicas
from .cut import Cuts
from .policy import over_budget
from .reads import PostingReader, copy_keys

#: Distinct postings read together in one reassignment step: splits are grouped until their
#: neighbourhoods reach it (~50 MiB per step at the default 48 KiB posting budget; postings
#: waiting to split hold more, and ``read_ahead`` holds two steps). A round's splits share
#: many neighbours, so one step per round (instead of a few splits per step) reads fewer
#: postings and drains sooner; the read-ahead then rarely overlaps.
REASSIGN_POSTINGS = 1024


class Moves(NamedTuple):
    """The moves ``plan_moves`` chose: rows of the vectors to move, with their picked
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


class Reassigner:
    """Plans and applies moves. ``notify`` queues postings the moves pushed over their
    budget; ``pool`` runs replica selection, ``planner`` the plan after a round's splits;
    ``cv`` guards the job in flight (the background's condition)."""

    def __init__(self, engine: Engine, reader: PostingReader, cuts: Cuts, counters: dict,
                 notify: Callable[[np.ndarray], None], pool: ThreadPoolExecutor, planner: ThreadPoolExecutor,
                 cv: threading.Condition):
        self._engine = engine
        self._reader = reader
        self._cuts = cuts
        self._counters = counters
        self._notify = notify
        self._pool = pool
        self._planner = planner
        self._cv = cv
        # the reassignment of a round's splits runs on the planner while the next round
        # plans and commits (see ``start``): (future of its moves, reader ticket, ``cuts.stamp``)
        self.job: tuple[Future, int, int] | None = None

    def start(self, old_centers: np.ndarray, children: list[np.ndarray], centroids: np.ndarray,
              cent_starts: np.ndarray, ks: np.ndarray) -> None:
        """Plan the reassignment after this round's splits on the planner thread; the next
        round reads, plans and commits meanwhile, and the round thread applies the moves
        after it. Reading the neighbourhoods, checking the conditions and choosing replicas
        were half of the round thread's time, and it was the drain's critical path.

        The plan is made from reads the next round may overtake, so applying it checks what
        it saw (``apply_moves``): a vector whose copies it read in a posting rewritten since
        stays where it is (the scrub looks again later). The job holds a reader ticket, as a
        search does, so no posting it read is dropped, and no pid reused, before it is applied."""
        self.finish()
        eng = self._engine
        ticket = eng.readers.begin(interactive=False)
        try:
            stamp = self._cuts.stamp
            future = self._planner.submit(self.plan_after_splits, old_centers, children, centroids,
                                          cent_starts, ks)
        except BaseException:
            eng.readers.end(ticket)
            raise
        with self._cv:
            self.job = (future, ticket, stamp)

    def finish(self, apply: bool = True) -> None:
        """Wait for the reassignment in flight and apply its moves (or drop them)."""
        with self._cv:
            job = self.job
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
                self.apply_moves(moves, stamp)
        finally:
            self._engine.readers.end(ticket)
            with self._cv:
                self.job = None
                self._cv.notify_all()

    def plan_after_splits(self, old_centers: np.ndarray, children: list[np.ndarray],
                          centroids: np.ndarray, cent_starts: np.ndarray, ks: np.ndarray) -> list[Moves]:
        """SPFresh's two conditions over the splits' children and ``reassign_neighbors``
        postings around each, then the moves of the candidates (``plan_moves``)."""
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
        reads = self._reader.read_ahead([grp[2] for grp in groups])
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
            moves = self.plan_moves(vids, recs_u[rows, 1].astype(np.uint8), recs_f[rows, records.HEADER_WORDS:],
                                    posting_of[rows], (h_idx, posting_of[held]))
            planned.append(moves._replace(checked=int(rows.size)))
        return planned

    def reassign_vids(self, vids: np.ndarray, versions: np.ndarray, vectors: np.ndarray,
                      owner: np.ndarray, holders: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Move ``vids`` now (``plan_moves``, then ``apply_moves``)."""
        self.apply_moves(self.plan_moves(vids, versions, vectors, owner, holders))

    def plan_moves(self, vids: np.ndarray, versions: np.ndarray, vectors: np.ndarray,
                   owner: np.ndarray, holders: tuple[np.ndarray, np.ndarray] | None = None) -> Moves:
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
        return Moves(vids, versions, vectors, heads, counts, has, home, h_idx, h_pid, stale[pairs], 0)

    def apply_moves(self, mv: Moves, stamp: int | None = None) -> None:
        """Commit the moves of ``plan_moves``. ``stamp``: the plan was made from reads
        taken when ``cuts.stamp`` was this; a vector seen in a posting rewritten since is
        left where it is, since what the plan took for its copies there may be gone."""
        eng = self._engine
        cuts = self._cuts
        self._counters["reassign_checked"] += mv.checked
        if mv.vids.size == 0:
            return
        vids, versions, vectors, heads, counts, has = mv.vids, mv.versions, mv.vectors, mv.heads, mv.counts, mv.has
        h_idx, h_pid, cut = mv.h_idx, mv.h_pid, mv.cut
        eng.yield_to_searches()
        with eng.lock:
            g = eng.state.graph
            # compare-and-set: skip vids changed or deleted since they were read, and any whose
            # picked postings or stale copies went away meanwhile
            limbo_pids = cuts.limbo_pids
            limbo = np.fromiter(limbo_pids, dtype=np.int64, count=len(limbo_pids))
            ok = eng.state.idmap.versions[vids] == versions
            ok &= (g.alive[np.maximum(heads, 0)] | (heads < 0)).all(axis=1)
            ok &= np.bincount(h_idx[cut & np.isin(h_pid, limbo)], minlength=vids.size) == 0
            if stamp is not None:  # planned on reads the next round may have overtaken
                ok &= eng.state.idmap.home[vids] == mv.home
                overtaken = np.bincount(h_idx[cuts.rewritten_since(h_pid, stamp)], minlength=vids.size) > 0
                self._counters["reassign_overtaken"] += int((ok & overtaken).sum())
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
            keys = copy_keys(vids, versions)
            # the copies in every picked posting stay, appended now or relied on as held: a cut
            # still pending from an earlier move must not remove them
            chosen = heads >= 0
            cuts.cancel(heads[chosen], np.broadcast_to(keys[:, None], heads.shape)[chosen])
        self._counters["reassigns"] += int(vids.size)
        cut_keys = keys[h_idx]
        order = np.argsort(h_pid, kind="stable")  # one sort, not a pass over every pair per posting
        owners, starts = np.unique(h_pid[order], return_index=True)
        cuts.defer([], dict(zip(owners.tolist(), np.split(cut_keys[order], starts[1:]))))
        targets = np.asarray(list(appends), dtype=np.int64)
        if targets.size:
            self._notify(targets[over_budget(eng.lengths(targets), eng.limit)])


def _group(lo: int, hi: int, post: list[int], split_of: list[int], is_child: list[bool]) -> tuple:
    """One reassignment step over splits ``lo:hi``: the distinct postings to read and, per
    (posting, split) pair, the index of its posting among them."""
    examined, pair_post = np.unique(np.asarray(post, dtype=np.int64), return_inverse=True)
    return lo, hi, examined, pair_post, split_of, is_child


def _rows_and_pairs(rows: np.ndarray, arrays: tuple, h_idx: np.ndarray, h_pid: np.ndarray,
                    pairs: np.ndarray) -> tuple[tuple, np.ndarray, np.ndarray]:
    """The ``rows`` of each of ``arrays``, and the ``pairs`` of ``(h_idx, h_pid)`` with
    ``h_idx`` renumbered to index the kept rows (every kept pair must point at a kept row)."""
    renumber = np.cumsum(rows) - 1
    return tuple(a[rows] for a in arrays), renumber[h_idx[pairs]], h_pid[pairs]
