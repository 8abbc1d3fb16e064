"""Keeping the garbage collector's pauses off the search path.

CPython's cyclic collector holds the GIL while it runs. A full (oldest-generation) collection
walks every tracked container in the process: the modules, numba's dispatchers and the open
indexes' Python objects, ~110k objects after one index is open, which took 45-75 ms on this
project's 2-core machine. With an ingest allocating beside the searches, one ran every few
seconds, and each stalled every search for its whole length (the largest share of the
search p99 under ingest in ``bench.sla`` on the block store).

:func:`freeze_heap` moves every object alive at that point into the collector's permanent
generation (:func:`gc.freeze`): later collections walk only what was made after, so a full
collection costs a few milliseconds. Call it once the process is ready to serve: kernels
compiled, indexes open. ``vindex serve`` does.
"""
from __future__ import annotations

import gc


def freeze_heap() -> int:
    """Collect once, then freeze every object still alive; returns how many are frozen.

    Objects frozen are never collected, even if they later become cyclic garbage, so call
    this after start-up work (which leaves its garbage behind) rather than in a loop."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
