"""When a posting needs background work: the one place these rules are written.

The write path (``Index``), the reopening of an index and the background rounds all ask
here: a posting over its budget is split, one mostly garbage (or stored in many pieces) is
rewritten (gc / fold), one with few live vectors is merged into a neighbour, an empty one is
dropped, and copies moved out of a posting are cut once enough of it is stale.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import IndexConfig
from .split import split_children

#: A posting stored in more pieces than this (one per append) is folded back into one: every
#: piece costs the search path one more store lookup.
FOLD_FRAGMENTS = 8
#: A posting is rewritten without the copies moved out of it once they and its garbage are
#: this fraction of it. A tenth (``gc_fraction``) made a large drain noticeably slower for
#: more CPU time; the copies waiting are valid copies, so searches lose nothing but the time
#: to read them (a few more records scanned per query meanwhile).
CUT_FRACTION = 0.2


def over_budget(lengths: np.ndarray, limit: int) -> np.ndarray:
    """Mask of postings holding more records (or live vectors) than ``limit``: to split."""
    return np.asarray(lengths) > limit


def scattered(fragments: np.ndarray) -> np.ndarray:
    """Mask of postings stored in so many pieces that they are folded back into one."""
    return np.asarray(fragments) > FOLD_FRAGMENTS


def mostly_garbage(garbage: np.ndarray, lengths: np.ndarray, gc_fraction: float) -> np.ndarray:
    """Mask of postings whose garbage reached ``gc_fraction`` of them: to rewrite."""
    return np.asarray(garbage) >= np.maximum(1, gc_fraction * np.asarray(lengths))


def cut_due(n_stale: np.ndarray, garbage: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Mask of postings whose copies waiting to be cut, with their garbage, reached
    ``CUT_FRACTION`` of them: to rewrite without both."""
    return np.asarray(n_stale) + np.asarray(garbage) >= np.maximum(1, CUT_FRACTION * np.asarray(lengths))


def needing_work(engine, written: np.ndarray, old_homes: np.ndarray) -> np.ndarray:
    """Postings to queue after a write: those it appended to (``written``) that went over
    their budget or into too many pieces, and the homes its replaced or deleted vectors left
    (``old_homes``) that are now mostly garbage. Reopening an index passes every head as
    both."""
    work = [np.zeros(0, np.int64)]
    if written.size:
        work.append(written[over_budget(engine.lengths(written), engine.limit)
                            | scattered(engine.store.fragments(written))])
    if old_homes.size:
        work.append(old_homes[mostly_garbage(engine.state.garbage[old_homes], engine.lengths(old_homes),
                                             engine.config.gc_fraction)])
    return np.concatenate(work)


@dataclass
class Decision:
    """What a round does with each posting it read (masks over its postings): ``split``
    into ``ks`` children, ``drop`` (empty), ``merge`` into a neighbour, ``gc`` (rewrite
    without garbage, folding its pieces). ``rewrite`` marks postings with garbage or pieces
    worth a rewrite, which one that cannot merge falls back to."""

    split: np.ndarray
    ks: np.ndarray
    drop: np.ndarray
    merge: np.ndarray
    gc: np.ndarray
    rewrite: np.ndarray

    def any(self) -> bool:
        return bool(self.split.any() or self.drop.any() or self.merge.any() or self.gc.any())

    def settle_merges(self, targets: np.ndarray, n_live: np.ndarray) -> None:
        """Postings to merge that found no neighbour with room are rewritten instead."""
        self.merge &= targets >= 0
        self.gc |= (n_live > 0) & ~self.split & ~self.drop & ~self.merge & self.rewrite


def decide(n_live: np.ndarray, n_read: np.ndarray, fragments: np.ndarray, limit: int,
           config: IndexConfig, n_heads: int) -> Decision:
    """The work each posting of a round needs, from its live vectors ``n_live`` among the
    ``n_read`` records read and the pieces it is stored in."""
    split = over_budget(n_live, limit)
    ks = np.where(split, split_children(n_live, limit, config.build_fill), 0)
    many_heads = n_heads > 1  # the last head stays, empty or not
    drop = (n_live == 0) & many_heads
    merge = (n_live > 0) & (n_live < limit * config.merge_fraction) & many_heads & ~split
    rewrite = (n_read > n_live) | scattered(fragments)
    gc = ~split & ~drop & ~merge & rewrite
    return Decision(split, ks, drop, merge, gc, rewrite)
