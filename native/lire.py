"""Rebalancing kernels (SPFresh's LIRE): garbage collection, split planning and the two
reassignment conditions. Pure functions over posting records (see ``scan`` for the layout).
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .distances import FASTMATH, l2sq, within_eps
from .kmeans import balanced_kmeans

_q = dict(cache=True, nogil=True, fastmath=FASTMATH)

HEADER = 2  # record header words (vid, version)


@nb.njit(**_q)
def live_dedupe(recs_u, offsets, versions, seen):
    """Per record: live (its version is the vid's current one) and the first copy of its vid
    within its posting. ``seen`` is int64 scratch, one slot per vid, all -1 on entry and
    restored to -1 on exit. Returns ``(keep (E,), live count per posting)``."""
    n_post = offsets.shape[0] - 1
    keep = np.zeros(recs_u.shape[0], dtype=np.bool_)
    n_live = np.zeros(n_post, dtype=np.int64)
    nv = versions.shape[0]
    for p in range(n_post):
        for e in range(offsets[p], offsets[p + 1]):
            vid = recs_u[e, 0]
            if vid < nv and versions[vid] == recs_u[e, 1] and seen[vid] != p:
                seen[vid] = p
                keep[e] = True
                n_live[p] += 1
    for e in range(recs_u.shape[0]):
        vid = recs_u[e, 0]
        if vid < nv:
            seen[vid] = -1
    return keep, n_live


@nb.njit(**_q)
def split(recs_f, keep, offsets, ks, cent_off, iters, lam, labels, centroids):
    """Balanced k-means over the kept records of every posting with ``ks[p] >= 2``; writes the
    child label of each kept record into ``labels`` and the children's centres into
    ``centroids[cent_off[p]:cent_off[p+1]]``."""
    d = recs_f.shape[1] - HEADER
    for p in range(offsets.shape[0] - 1):
        k = ks[p]
        if k < 2:
            continue
        idx = np.empty(offsets[p + 1] - offsets[p], dtype=np.int64)
        n = 0
        for e in range(offsets[p], offsets[p + 1]):
            if keep[e]:
                idx[n] = e
                n += 1
        x = np.empty((n, d), dtype=np.float32)
        for i in range(n):
            x[i] = recs_f[idx[i], HEADER:]
        lab = np.empty(n, dtype=np.int64)
        balanced_kmeans(x, k, iters, lam, lab, centroids[cent_off[p]:cent_off[p + 1]])
        for i in range(n):
            labels[idx[i]] = lab[i]


@nb.njit(**_q)
def reassign_candidates(recs_f, keep, offsets, centers, pair_post, pair_split, pair_child,
                        old_centers, cent_off, new_centers):
    """Records that may have lost their best posting to a split (SPFresh's two conditions).

    Each pair ``t`` says: examine posting ``pair_post[t]`` (centre ``centers[pair_post[t]]``)
    for split ``s = pair_split[t]`` (old centre ``old_centers[s]``, new centres
    ``new_centers[cent_off[s]:cent_off[s+1]]``). ``pair_child[t]`` is True when the posting is
    one of the split's children:
      (a) a child record is a candidate iff ``D(v, A_old) < D(v, A_child)``;
      (b) a neighbour record is a candidate unless ``D(v, A_old) <= min_i D(v, A_i)`` or
          ``D(v, B) <= min_i D(v, A_i)``.
    Returns a candidate mask over records."""
    out = np.zeros(recs_f.shape[0], dtype=np.bool_)
    for t in range(pair_post.shape[0]):
        p = pair_post[t]
        s = pair_split[t]
        for e in range(offsets[p], offsets[p + 1]):
            if not keep[e] or out[e]:
                continue
            v = recs_f[e, HEADER:]
            d_old = l2sq(v, old_centers[s])
            d_own = l2sq(v, centers[p])
            if pair_child[t]:
                out[e] = d_old < d_own
                continue
            d_new = np.inf
            for c in range(cent_off[s], cent_off[s + 1]):
                dc = l2sq(v, new_centers[c])
                if dc < d_new:
                    d_new = dc
            out[e] = not (d_old <= d_new or d_own <= d_new)
    return out


@nb.njit(**_q)
def copies_named(recs_u, offsets, key_off, keys):
    """Mask of the records of posting ``i`` (``offsets[i]:offsets[i+1]``) whose copy key,
    ``vid * 256 + version``, is among ``keys[key_off[i]:key_off[i+1]]``. A posting's keys
    are sorted here (a binary search per record): the postings with keys are few and their
    lists short, so this skips the rest where one ``np.isin`` over every record sorted all."""
    out = np.zeros(recs_u.shape[0], dtype=np.bool_)
    for i in range(offsets.shape[0] - 1):
        lo, hi = key_off[i], key_off[i + 1]
        if hi == lo:
            continue
        wanted = np.sort(keys[lo:hi])
        for r in range(offsets[i], offsets[i + 1]):
            key = np.int64(recs_u[r, 0]) * 256 + np.int64(recs_u[r, 1])
            j = np.searchsorted(wanted, key)
            out[r] = j < wanted.shape[0] and wanted[j] == key
    return out


@nb.njit(**_q)
def scrub_doubts(recs_f, keep, offsets, pids, home, centers, nbrs, alive, eps, rng_factor):
    """Kept records whose placement a look at their posting's graph neighbourhood cannot
    vouch for; the scrub re-runs replica selection for these only.

    Record ``e`` sits in posting ``pids[i]`` (``offsets[i] <= e < offsets[i+1]``) and its
    vector's nearest chosen posting when last placed is ``home[e]``. It is in doubt when that
    home is gone, when the posting or one of its graph neighbours is now nearer to it than
    its home (its nearest posting may lack it), or, for a copy outside its home, when the
    copy breaks the replica rules against the home (beyond ``eps`` of it, or RNG-blocked by
    it: such a copy would not be chosen). A record passing every test can still be misplaced
    by a head outside the neighbourhood; the check costs ~35 distances against a seeded graph
    search and replica selection for each record. Distances are squared L2."""
    out = np.zeros(recs_f.shape[0], dtype=np.bool_)
    for i in range(pids.shape[0]):
        p = pids[i]
        for e in range(offsets[i], offsets[i + 1]):
            if not keep[e]:
                continue
            h = home[e]
            if h < 0 or h >= alive.shape[0] or not alive[h]:
                out[e] = True
                continue
            v = recs_f[e, HEADER:]
            d_h = l2sq(v, centers[h])
            doubt = False
            if h != p:
                d_p = l2sq(v, centers[p])
                doubt = (d_p < d_h or not within_eps(d_p, d_h, eps)
                         or rng_factor * l2sq(centers[h], centers[p]) <= d_p)
            for j in range(nbrs.shape[1]):
                if doubt:
                    break
                q = nbrs[p, j]
                if q >= 0 and q != h and alive[q]:
                    doubt = l2sq(v, centers[q]) < d_h
            out[e] = doubt
    return out
