"""``Index.metrics()``: the counters and gauges an operator watches, as one flat dict.

Everything here is read at call time (a scrape) from state the index keeps anyway; nothing
is added to the search path but ``SearchTap``'s counters. Values are numbers, or dicts of
numbers keyed by an I/O class (``io_queued`` and friends), which exporters turn into a label.
"""
from __future__ import annotations

import os
import resource
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .engine import Engine
    from .rebalance import Rebalancer
    from .recall_monitor import RecallMonitor
    from .searchtap import SearchTap

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size of this process now (its peak where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def disk_bytes(path: str) -> int:
    """Bytes the files under ``path`` occupy on disk (0 for a path that does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:  # removed meanwhile (a compaction, a checkpoint rotating)
                continue
            total += getattr(st, "st_blocks", 0) * 512 or st.st_size
    return total


def collect(engine: "Engine", rebalancer: "Rebalancer", tap: "SearchTap",
            monitor: "RecallMonitor | None") -> dict:
    """The metrics of one open index (see ``docs/observability.md`` for each)."""
    state = engine.state
    g, idm = state.graph, state.idmap
    alive = np.flatnonzero(g.alive[: g.n])
    lengths = engine.lengths(alive)
    counters = rebalancer.counters
    out = {
        "searches": tap.searches,
        "queries": tap.queries,
        "rows_written": tap.rows_written,
        "rows_deleted": tap.rows_deleted,
        "live_vectors": idm.n_live,
        "tombstones": idm.n_deleted,
        "heads": g.n_alive,
        "postings": int((lengths > 0).sum()),
        "posting_entries": int(lengths.sum()),
        "postings_over_limit": int((lengths > engine.limit).sum()),
        "splits": counters["splits"],
        "merges": counters["merges"],
        "reassigns": counters["reassigns"],
        "background_rounds": counters["rounds"],
        "background_errors": counters["errors"] + engine.checkpoints.errors,
        **rebalancer.backlog(),
        "background_duty": engine.pacer.duty,
        "update_duty": engine.update_pacer.duty,
        "log_seq": engine.seq,
        "checkpoint_seq": engine.checkpoints.seq,
        "store_bytes": disk_bytes(engine.path),
        "memory_bytes": state_bytes(engine),
        "rss_bytes": rss_bytes(),
    }
    sched = engine.store.scheduler
    if sched is not None:
        io = sched.stats()
        out.update(io_yields=io["yields"], io_queued=io["queued"], io_completed=io["completed"],
                   io_dropped=io["dropped"])
    if monitor is not None:
        out.update(monitor.metrics())
    return out


def state_bytes(engine: "Engine") -> int:
    """Bytes of the in-memory state: heads, graph, id map, garbage counts."""
    st = engine.state
    g, m = st.graph, st.idmap
    return int(g.vectors.nbytes + g.nbrs.nbytes + g.alive.nbytes + m.vid2ext.nbytes
               + m.versions.nbytes + m.home.nbytes + m.table.nbytes + st.garbage.nbytes)
