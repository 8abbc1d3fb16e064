"""Invariant checks over a whole index: ``Index.verify()`` and ``vindex verify DIR``.

What must hold after every committed change (writers are held off while it runs):

* every live id has a copy with its current version in its home posting (``get`` reads it
  there), and its home is a live head;
* the id map is self-consistent: each id's hash slot leads back to its vid, retired vids are
  dead, the live count matches the version map;
* posting records are well formed: the directory's record counts match what the store
  returns, vids are allocated, vectors finite; removed heads hold no records (except those
  whose drop waits for running searches);
* the head graph is sound: edges point at live heads, no self-loops, entry points alive, and
  every live head reachable from the entry points (else searches could never find it);
* when rebalancing is on and idle, no posting holds more live vectors than its limit.

Damage that opening the index detects (checksums of the manifest, checkpoints, log records
and the store's write-ahead log) raises ``CorruptionError`` before this runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .engine import Engine
from .errors import preview
from .idmap import DELETED
from .progress import Mode, track
from .storage import IOClass, records

#: Postings read per store call while checking records.
READ_GROUP = 1024


@dataclass
class VerifyReport:
    """Outcome of :meth:`Index.verify`: ``ok`` iff ``violations`` is empty; ``checked``
    counts what was examined."""

    violations: list[str] = field(default_factory=list)
    checked: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, what: str, items: np.ndarray | None = None) -> None:
        if items is None:
            self.violations.append(what)
        elif items.size:
            self.violations.append(f"{what}: {items.size} ({preview(items.tolist())})")

    def __str__(self) -> str:
        lines = [f"{k}: {v}" for k, v in self.checked.items()]
        lines += ["OK"] if self.ok else [f"VIOLATION {v}" for v in self.violations]
        return "\n".join(lines)


def verify(eng: Engine, *, limbo: set[int], check_limits: bool, progress: Mode = False) -> VerifyReport:
    """Check every invariant; the caller holds ``eng.lock``."""
    report = VerifyReport()
    # the manifest's checksum was checked when the index opened; one written before
    # manifests had checksums is reported, as nothing protects it
    report.checked["manifest_checksum"] = "ok" if eng.manifest.checksummed else "none (written before checksums)"
    _check_graph(eng, report)
    _check_idmap(eng, report)
    _check_postings(eng, report, limbo, check_limits, progress)
    return report


def _check_graph(eng: Engine, report: VerifyReport) -> None:
    g = eng.state.graph
    n = g.n
    alive = g.alive[:n]
    report.checked["heads"] = int(alive.sum())
    if g.n_alive != int(alive.sum()):
        report.add(f"head count {g.n_alive} differs from the {int(alive.sum())} heads marked alive")
    live = np.flatnonzero(alive)
    nbrs = g.nbrs[live]
    bad_range = live[((nbrs < -1) | (nbrs >= n)).any(axis=1)]
    report.add("heads with edges outside the graph", bad_range)
    safe = np.where((nbrs >= 0) & (nbrs < n), nbrs, 0)
    edge = (nbrs >= 0) & (nbrs < n)
    report.add("heads with edges to removed heads", live[(edge & ~alive[safe]).any(axis=1)])
    report.add("heads with self-loops", live[(edge & (safe == live[:, None])).any(axis=1)])
    report.add("heads with non-finite vectors", live[~np.isfinite(g.vectors[live]).all(axis=1)])
    entries = np.asarray(g.entries, dtype=np.int64)
    if live.size and entries.size == 0:
        report.add("the graph has live heads but no entry points")
    bad_entries = entries[(entries < 0) | (entries >= n)]
    report.add("entry points outside the graph", bad_entries)
    entries = entries[(entries >= 0) & (entries < n)]
    report.add("entry points at removed heads", entries[~alive[entries]])
    # every live head reachable from the entry points, following edges between live heads
    seen = np.zeros(n, dtype=np.bool_)
    frontier = entries[alive[entries]]
    seen[frontier] = True
    while frontier.size:
        nxt = g.nbrs[frontier].ravel()
        nxt = nxt[(nxt >= 0) & (nxt < n)]
        nxt = np.unique(nxt[alive[nxt] & ~seen[nxt]])
        seen[nxt] = True
        frontier = nxt
    report.add("heads unreachable from the entry points", live[~seen[live]])


def _check_idmap(eng: Engine, report: VerifyReport) -> None:
    idm, g = eng.state.idmap, eng.state.graph
    nv = idm.n_vids
    versions, exts, home = idm.versions[:nv], idm.vid2ext[:nv], idm.home[:nv]
    live = (versions & DELETED) == 0
    report.checked["live"] = int(live.sum())
    report.checked["vids"] = nv
    if idm.n_live != int(live.sum()):
        report.add(f"live count {idm.n_live} differs from the {int(live.sum())} live versions")
    retired = exts < 0
    report.add("retired vids marked live", np.flatnonzero(retired & live))
    vids = np.flatnonzero(~retired)
    back = idm.lookup(exts[vids]) if vids.size else vids
    report.add("ids whose hash slot leads elsewhere", exts[vids[back != vids]])
    lv = np.flatnonzero(live)
    h = home[lv].astype(np.int64)
    bad_home = (h < 0) | (h >= g.n)
    bad_home[~bad_home] = ~g.alive[h[~bad_home]]
    report.add("live ids whose home is not a live head", exts[lv[bad_home]])
    if (eng.state.garbage < 0).any():
        report.add("postings with negative garbage counts", np.flatnonzero(eng.state.garbage < 0))


def _check_postings(eng: Engine, report: VerifyReport, limbo: set[int], check_limits: bool,
                    progress: Mode = False) -> None:
    idm, g = eng.state.idmap, eng.state.graph
    nv = idm.n_vids
    versions, home = idm.versions[:nv], idm.home[:nv]
    lengths = eng.store.lengths()
    top = max(g.n, lengths.shape[0])
    pids = np.arange(top, dtype=np.int64)
    alive = np.zeros(top, dtype=np.bool_)
    alive[: g.n] = g.alive[: g.n]
    held = np.zeros(top, dtype=np.bool_)
    held[[p for p in limbo if p < top]] = True
    stray = pids[~alive & ~held & (eng.lengths(pids) > 0)]
    report.add("removed heads whose postings still hold records", stray)
    found = np.zeros(nv, dtype=np.bool_)
    at_home = np.zeros(nv, dtype=np.bool_)
    over, entries, mismatched, bad_vid, bad_vec = [], 0, [], [], []
    live_pids = pids[alive]
    groups = range(0, live_pids.size, READ_GROUP)
    for start in track(groups, desc=f"verifying the postings of {eng.path}", total=len(groups), progress=progress):
        group = live_pids[start:start + READ_GROUP]
        batch = eng.store.read(group, IOClass.BACKGROUND)
        counts = np.diff(batch.offsets)
        mismatched.append(group[counts != eng.lengths(group)])
        recs_f, recs_u = records.view(np.array(batch.data), eng.dim)
        entries += recs_u.shape[0]
        owner = np.repeat(group, counts)
        vid = recs_u[:, 0].astype(np.int64)
        ok_vid = vid < nv
        bad_vid.append(np.unique(owner[~ok_vid]))
        bad_vec.append(np.unique(owner[~np.isfinite(recs_f[:, records.HEADER_WORDS:]).all(axis=1)]))
        vid, owner, ver = vid[ok_vid], owner[ok_vid], recs_u[ok_vid, 1]
        current = (versions[vid] & DELETED) == 0
        current[current] = versions[vid[current]] == ver[current]
        found[vid[current]] = True
        at_home[vid[current & (home[vid] == owner)]] = True
        # live vectors per posting (a copy counted once per posting)
        span = max(nv, 1)
        keys = np.unique(owner[current] * np.int64(span) + vid[current])
        n_live = np.bincount(keys // span - group[0], minlength=int(group[-1] - group[0]) + 1)
        over.append(group[n_live[group - group[0]] > eng.limit])
    cat = (lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64))
    report.checked["postings"] = int(live_pids.size)
    report.checked["posting_entries"] = entries
    report.add("postings whose directory count differs from their records", cat(mismatched))
    report.add("postings with records of unallocated vids", cat(bad_vid))
    report.add("postings with non-finite vectors", cat(bad_vec))
    live = (versions & DELETED) == 0
    report.add("live ids with no current copy in any posting", idm.vid2ext[:nv][live & ~found])
    report.add("live ids missing from their home posting", idm.vid2ext[:nv][live & found & ~at_home])
    over_ids = cat(over)
    report.checked["postings_over_limit"] = int(over_ids.size)
    if check_limits:
        report.add(f"postings over the limit of {eng.limit} live vectors with rebalancing idle", over_ids)
