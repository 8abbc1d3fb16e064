"""Background rebalancing (SPFresh's LIRE): split, merge, garbage-collect and reassign.

One background thread (``runner``) runs small jobs over the postings that need work
(``policy`` says which): rounds that split postings over their limit, rewrite those mostly
garbage, merge nearly empty ones into a neighbour and drop empty ones (``round``, with
``split``, ``merge`` and ``fold``); the reassignment of vectors near a split (``reassign``);
re-checks of stored vectors (``scrub``); and deferred drops and cuts that wait for running
searches (``cut``). Each job plans from reads without the writers' lock and applies its
change under it in one atomic commit.
"""
from __future__ import annotations

from . import policy
from .cut import STALE_ARRAYS, drop_orphans
from .policy import CUT_FRACTION, FOLD_FRAGMENTS
from .runner import PACE_SLICE_S, Rebalancer
from .split import split_children

__all__ = ["CUT_FRACTION", "policy", "FOLD_FRAGMENTS", "PACE_SLICE_S", "STALE_ARRAYS", "drop_orphans", "Rebalancer", "split_children"]
