"""A checker for concurrent histories of one index: what each read saw against when each write
ran.

A history is a list of :class:`Write` (one ``upsert`` or ``delete`` call, with the
``time.monotonic_ns`` just before the call and just after it returned) and a list of
:class:`Read` (one ``get`` call, or one query row of a ``search`` call, with its times and what
it returned). :func:`check_history` is a pure function of the two lists.

Every id is a register. Its possible values are the vectors upserted to it and "absent", which
a delete writes and every id holds before its first write (an implicit initial write that
completed before time began). A read observes, for some ids, one of these:

* a **value**: ``get`` returned the id's vector; exactly the upserts of that id that wrote this
  vector can explain it;
* a **distance**: a search returned the id at distance ``d`` from its query; the upserts of that
  id whose vector lies at exactly ``d`` from the query can explain it (vectors must have small
  integer coordinates, so float32 distances are exact);
* **absent**: ``get`` did not find the id, or a *complete* search (``k`` at least the number of
  ids, every posting read) did not return it; the deletes of that id and its initial state can
  explain it.

For each observation of id ``x`` by read ``R``, with ``C`` the writes of ``x`` that can explain
it and began before ``R`` ended:

1. **unwritten** (rule 4): ``C`` is empty. The read returned something no write of ``x`` that
   began before the read ended could have produced (another id's vector, a made-up distance,
   a value from the future).
2. **deleted** (rule 2): ``x`` was present although an acknowledged delete ``D`` of ``x``
   completed before ``R`` began and every upsert of ``x`` that began before ``R`` ended had
   completed before ``D`` began (none overlaps ``D`` or follows it).
3. **stale** (rule 1): every write in ``C`` is *superseded*: for each ``W`` in ``C`` there is an
   acknowledged write ``W2`` of ``x`` with ``W.end < W2.start`` (``W`` finished before ``W2``
   began, so ``W2`` takes effect after it) and ``W2.end < R.start`` (``W2`` finished before the
   read began). The read saw a value older than one that was already in place. Writes that
   overlap in time may take effect in either order, so neither supersedes the other.
4. **duplicate** (rule 3): a search row holds an id twice.

A write that raised (``ok=False``) may or may not have taken effect: it can explain an
observation but never supersedes anything, and it is never "completed" (its end is +inf).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

NEG = np.iinfo(np.int64).min
POS = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Write:
    """One ``upsert`` or ``delete`` call on ``ids``; ``vectors`` has a row per id for upserts."""

    writer: int
    seq: int
    kind: str                      # "upsert" or "delete"
    ids: tuple[int, ...]
    vectors: np.ndarray | None
    start: int                     # time.monotonic_ns() before the call
    end: int                       # time.monotonic_ns() after it returned or raised
    ok: bool = True                # False: it raised, its effect is unknown

    @property
    def label(self) -> str:
        return f"{self.kind}#w{self.writer}.{self.seq}"


@dataclass(frozen=True)
class Read:
    """One ``get`` call, or one query row of a ``search`` call.

    get: ``ids`` asked, ``found`` and ``vectors`` as returned.
    search: ``ids`` and ``distances`` are the result row (padded with -1 / +inf), ``query`` the
    query vector; ``complete`` says the call had ``k`` at least the number of ids and read every
    posting, so an id missing from the row is not live.
    """

    reader: int
    kind: str                      # "get" or "search"
    start: int
    end: int
    ids: np.ndarray
    found: np.ndarray | None = None
    vectors: np.ndarray | None = None
    query: np.ndarray | None = None
    distances: np.ndarray | None = None
    complete: bool = False


@dataclass(frozen=True)
class Violation:
    rule: str                      # "unwritten", "deleted", "stale" or "duplicate"
    read: int                      # index into the reads
    id: int
    detail: str = field(default="")
    seen: str = ""                 # what the read observed: "value", "distance" or "absent"

    def __str__(self) -> str:
        return f"{self.rule}: read #{self.read}, id {self.id}: {self.detail}"


_NONE, _VALUE, _DIST, _ABSENT = 0, 1, 2, 3


class _Entries:
    """Every (write, id) pair plus one initial "absent" per id, sorted by start time."""

    def __init__(self, writes: list[Write], universe: np.ndarray, dim: int):
        dense = {int(x): i for i, x in enumerate(universe)}
        n0 = universe.shape[0]
        rows = [(dense[int(x)], w.kind == "upsert", w.vectors[j] if w.kind == "upsert" else None,
                 w.start, w.end if w.ok else POS, w.ok, wi)
                for wi, w in enumerate(writes) for j, x in enumerate(w.ids)]
        n = n0 + len(rows)
        self.id = np.empty(n, np.int64)
        self.upsert = np.zeros(n, bool)
        self.vec = np.zeros((n, dim), np.float64)
        self.start = np.empty(n, np.int64)
        self.end = np.empty(n, np.int64)
        self.ok = np.ones(n, bool)
        self.write = np.full(n, -1, np.int64)
        self.id[:n0], self.start[:n0], self.end[:n0] = np.arange(n0), NEG, NEG  # initial: absent
        for r, (i, up, v, s, e, ok, wi) in enumerate(rows, n0):
            self.id[r], self.upsert[r], self.start[r], self.end[r], self.ok[r], self.write[r] = i, up, s, e, ok, wi
            if up:
                self.vec[r] = v
        order = np.argsort(self.start, kind="stable")
        for name in ("id", "upsert", "vec", "start", "end", "ok", "write"):
            setattr(self, name, getattr(self, name)[order])
        self.dense = dense


class _FreshIndex:
    """Finds, for a read and a set of ids, the entries that are not superseded for it (its
    *fresh* entries) without scanning the whole history: a correct read is explained by one of
    them, and only reads that are not go through the exact check.

    With ``newest`` the latest start among acknowledged writes of the id completed before the
    read began, the fresh entries of the id are those begun before the read ended with
    ``end >= newest``: every entry starting at or after ``newest`` (contiguous in start order),
    the few that started earlier but were still running at ``newest`` (at most ``lookback``
    positions before, the most that ever overlap the start of another write of the same id)
    and writes that failed.
    """

    def __init__(self, ent: _Entries, t_lo: int, t_hi: int):
        # times relative to t_lo: initial entries at -1, failed writes end after every read
        self.span = span = int(t_hi - t_lo) + 3
        init = ent.write < 0
        start = np.where(init, -1, ent.start - t_lo)
        end = np.where(init, -1, np.where(ent.ok, ent.end - t_lo, span - 2))
        # by (id, end) over acknowledged entries: running max of start within each id
        ok = np.flatnonzero(ent.ok)
        by_end = ok[np.lexsort((end[ok], ent.id[ok]))]
        self.end_keys = ent.id[by_end] * span + end[by_end]
        self.newest = np.maximum.accumulate(ent.id[by_end] * span + start[by_end])  # segments rise with id
        # by (id, start) over all entries
        self.rows = np.lexsort((start, ent.id))
        self.start_keys = ent.id[self.rows] * span + start[self.rows]
        self.end_by_start = end[self.rows]
        ids_sorted = ent.id[self.rows]
        self.seg_lo = np.searchsorted(ids_sorted, np.arange(int(ent.id.max()) + 1 if ent.id.size else 0))
        # lookback: for each entry, how many earlier-starting acknowledged entries of its id were
        # still running when it started (failed writes are added separately)
        end_ok = np.where(ent.ok[self.rows], self.end_by_start, np.minimum(start[self.rows], self.end_by_start))
        run_max = np.maximum.accumulate(ids_sorted * span + end_ok)
        first = np.searchsorted(run_max, self.start_keys, side="left")
        self.lookback = int((np.arange(self.rows.size) - first).max()) if self.rows.size else 0
        self.failed = np.flatnonzero(~ent.ok)
        self.failed_id, self.failed_start = ent.id[self.failed], start[self.failed]
        self.t_lo = t_lo

    def fresh(self, ids: np.ndarray, r_start: int, r_end: int) -> tuple[np.ndarray, np.ndarray]:
        """Entry rows (into ``_Entries``) fresh for a read over ``[r_start, r_end]`` among
        ``ids`` (sorted dense ids), and the position in ``ids`` each belongs to."""
        span, rs, re_ = self.span, int(r_start - self.t_lo), int(r_end - self.t_lo)
        base = ids * span
        newest = self.newest[np.searchsorted(self.end_keys, base + rs, side="left") - 1] - base
        lo = np.searchsorted(self.start_keys, base + newest, side="left")
        lo = np.maximum(lo - self.lookback, self.seg_lo[ids])
        hi = np.searchsorted(self.start_keys, base + re_, side="left")
        n = np.maximum(hi - lo, 0)
        owner = np.repeat(np.arange(ids.size), n)
        pos = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(lo, n)
        keep = self.end_by_start[pos] >= newest[owner]
        rows, owner = self.rows[pos[keep]], owner[keep]
        if self.failed.size:  # never superseded, however early they began
            f = self.failed[self.failed_start < re_]
            at = np.minimum(np.searchsorted(ids, self.failed_id[self.failed_start < re_]), ids.size - 1)
            mine = ids[at] == self.failed_id[self.failed_start < re_]
            rows, owner = np.concatenate((rows, f[mine])), np.concatenate((owner, at[mine]))
        return rows, owner


def _describe(writes: list[Write], ent: _Entries, rows: np.ndarray) -> str:
    labels = [writes[w].label if w >= 0 else "initial" for w in ent.write[rows]]
    return ", ".join(labels[:4]) + (f" (+{len(labels) - 4})" if len(labels) > 4 else "")


def _match(ent: _Entries, rows: np.ndarray, kind: np.ndarray, obs_vec: np.ndarray, obs_d: np.ndarray,
           query: np.ndarray | None) -> np.ndarray:
    """Which entries ``rows`` can explain what the read observed of their id."""
    e_id, e_up = ent.id[rows], ent.upsert[rows]
    k = kind[e_id]
    match = (k == _ABSENT) & ~e_up
    sel = (k == _VALUE) & e_up
    if sel.any():
        match[sel] = (ent.vec[rows[sel]] == obs_vec[e_id[sel]]).all(axis=1)
    sel = (k == _DIST) & e_up
    if sel.any():
        d = ((ent.vec[rows[sel]] - np.asarray(query, np.float64)) ** 2).sum(axis=1).astype(np.float32)
        match[sel] = d == obs_d[e_id[sel]]
    return match


def check_history(writes: list[Write], reads: list[Read]) -> list[Violation]:
    """Every violation of the rules in the module docstring; empty for a correct history."""
    out: list[Violation] = []
    universe = np.unique(np.array([x for w in writes for x in w.ids], dtype=np.int64))
    nu = universe.shape[0]
    if nu == 0:
        writes = []
    dim = next((w.vectors.shape[1] for w in writes if w.kind == "upsert"), None)
    if dim is None:  # deletes only: take the width of what gets returned
        dim = next((np.shape(r.vectors)[1] for r in reads if r.kind == "get" and np.ndim(r.vectors) == 2), 1)
    ent = _Entries(writes, universe, dim)
    times = [t for w in writes for t in (w.start, w.end)] + [t for r in reads for t in (r.start, r.end)]
    fast = _FreshIndex(ent, min(times, default=0) - 1, max(times, default=0) + 1) if nu else None
    for ri, r in enumerate(reads):
        kind = np.zeros(nu, np.int8)
        obs_vec = np.zeros((nu, dim), np.float64)
        obs_d = np.zeros(nu, np.float32)
        if r.kind == "get":
            for x, f, v in zip(np.asarray(r.ids).tolist(), np.asarray(r.found).tolist(), r.vectors):
                i = ent.dense.get(x)
                if i is None:
                    if f:
                        out.append(Violation("unwritten", ri, x, "get found an id never written", "value"))
                    continue
                kind[i] = _VALUE if f else _ABSENT
                if f:
                    obs_vec[i] = v
        else:
            row = np.asarray(r.ids, np.int64)
            d_row = np.asarray(r.distances, np.float32)
            hits = row >= 0
            vals, counts = np.unique(row[hits], return_counts=True)
            for x in vals[counts > 1].tolist():
                out.append(Violation("duplicate", ri, x, f"search row holds id {x} {int(counts[vals == x][0])} times",
                                     "distance"))
            if r.complete:
                kind[:] = _ABSENT
            row, d_row = row[hits], d_row[hits]
            pos = np.minimum(np.searchsorted(universe, row), max(nu - 1, 0))
            known = (universe[pos] == row) if nu else np.zeros(row.shape, bool)
            for x in row[~known].tolist():
                out.append(Violation("unwritten", ri, x, "search returned an id never written", "distance"))
            kind[pos[known]], obs_d[pos[known]] = _DIST, d_row[known]
        observed = np.flatnonzero(kind)
        if not observed.size:
            continue
        # fast path: an id observed as one of its fresh entries wrote it is fine
        rows, owner = fast.fresh(observed, r.start, r.end)
        ok = _match(ent, rows, kind, obs_vec, obs_d, r.query)
        explained = np.zeros(observed.size, bool)
        explained[owner[ok]] = True
        suspects = np.zeros(nu, bool)
        suspects[observed[~explained]] = True
        if suspects.any():
            _check_exact(out, writes, ent, ri, r, suspects, kind, obs_vec, obs_d, universe)
    return out


def _check_exact(out: list[Violation], writes: list[Write], ent: _Entries, ri: int, r: Read,
                 suspects: np.ndarray, kind: np.ndarray, obs_vec: np.ndarray, obs_d: np.ndarray,
                 universe: np.ndarray) -> None:
    """The rules over the whole history for the observations of ``suspects`` in read ``r``."""
    nu = universe.shape[0]
    p = int(np.searchsorted(ent.start, r.end, side="left"))  # entries that began before R ended
    rows = np.flatnonzero(suspects[ent.id[:p]])
    e_id, e_up, e_start, e_end = ent.id[rows], ent.upsert[rows], ent.start[rows], ent.end[rows]
    match = _match(ent, rows, kind, obs_vec, obs_d, r.query)
    # newest start among acknowledged writes of each id completed before R began
    done = ent.ok[rows] & (e_end < r.start)
    newest = np.full(nu, NEG, np.int64)
    np.maximum.at(newest, e_id[done], e_start[done])
    fresh = match & (e_end >= newest[e_id])
    has_match = np.bincount(e_id[match], minlength=nu) > 0
    has_fresh = np.bincount(e_id[fresh], minlength=nu) > 0
    # rule 2: an acknowledged delete done before R began, no upsert of the id ending after it began
    dele = done & ~e_up & (ent.write[rows] >= 0)
    del_start = np.full(nu, NEG, np.int64)
    np.maximum.at(del_start, e_id[dele], e_start[dele])
    up_end = np.full(nu, NEG, np.int64)
    np.maximum.at(up_end, e_id[e_up], e_end[e_up])
    present = (kind != _NONE) & (kind != _ABSENT) & suspects
    deleted = present & (del_start != NEG) & (del_start > up_end)
    unwritten = suspects & ~deleted & ~has_match
    stale = suspects & ~deleted & has_match & ~has_fresh
    for i in np.flatnonzero(deleted | unwritten | stale).tolist():
        x = int(universe[i])
        seen = {_VALUE: "value", _DIST: "distance", _ABSENT: "absent"}[int(kind[i])]
        if deleted[i]:
            which = rows[dele & (e_id == i) & (e_start == del_start[i])]
            out.append(Violation("deleted", ri, x, f"{r.kind} saw the id after {_describe(writes, ent, which)} "
                                                   f"completed and no upsert overlapped or followed it", seen))
        elif unwritten[i]:
            what = {_VALUE: "a vector", _DIST: f"distance {obs_d[i]}", _ABSENT: "absence"}[int(kind[i])]
            out.append(Violation("unwritten", ri, x, f"{r.kind} saw {what} that no write of the id "
                                                     f"begun before the read ended produced", seen))
        else:
            saw = rows[match & (e_id == i)]
            newer = rows[done & (e_id == i) & (e_start == newest[i])]
            out.append(Violation("stale", ri, x, f"{r.kind} saw the value of {_describe(writes, ent, saw)}, "
                                                 f"superseded by {_describe(writes, ent, newer)} which "
                                                 f"completed before the read began", seen))
