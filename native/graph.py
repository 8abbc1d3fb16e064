"""Head graph: a navigable proximity graph over the heads (centroids).

The graph is an adjacency matrix ``nbrs (capacity, R) int32`` padded with -1, over the head
vectors ``heads (capacity, d) float32``. It is built and edited with DiskANN's rules: greedy
beam search over a sorted, bounded candidate list, robust pruning with a factor ``alpha`` for
out-edges, reverse edges on insert, and local repair of in-neighbours on removal
(FreshDiskANN). Geometry is always squared L2 between heads; searches may rank by the index's
metric.

Beam search state (``bd, bi, bx``: distances, ids, expanded flags, each of length ``ef``) and
the ``visited`` stamp array are scratch space owned by the caller, one set per thread, so the
kernels allocate nothing on the query path and are safe to run concurrently.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .distances import FASTMATH, L2, l2sq, to_gathered, to_rows
from . import heap
from .prefetch import prefetch_row

_q = dict(cache=True, nogil=True, fastmath=FASTMATH)


@nb.njit(inline="always", **_q)
def _beam_insert(bd, bi, bx, size, d, node):
    """Insert ``(d, node)`` into the sorted beam (after entries as near); returns ``(new
    size, position)``.

    The position is ``len(bd)`` when the beam is full and ``d`` does not beat its last entry.
    One pass from the end, shifting as it looks: a binary search, then the shift, takes about
    twice as long, because its branches are unpredictable.
    """
    ef = bd.shape[0]
    if size == ef and d >= bd[size - 1]:
        return size, ef
    t = size if size < ef else ef - 1
    while t > 0 and bd[t - 1] > d:
        bd[t] = bd[t - 1]
        bi[t] = bi[t - 1]
        bx[t] = bx[t - 1]
        t -= 1
    bd[t] = d
    bi[t] = node
    bx[t] = False
    if size < ef:
        size += 1
    return size, t


@nb.njit(inline="always", **_q)
def _insert_scored(q, heads, metric, fresh, fresh_d, n, bd, bi, bx, size):
    """Score heads ``fresh[:n]`` four at a time and insert them into the beam; returns
    ``(new size, the lowest position any of them took)``."""
    to_gathered(metric, q, heads, fresh, n, fresh_d)
    low = bd.shape[0]
    for j in range(n):
        size, pos = _beam_insert(bd, bi, bx, size, fresh_d[j], fresh[j])
        if pos < low:
            low = pos
    return size, low


@nb.njit(**_q)
def beam_search(q, heads, nbrs, entries, metric, visited, stamp, bd, bi, bx):
    """Greedy beam search for ``q``; fills ``bd/bi`` (sorted ascending) and returns their length."""
    size = 0
    degree = nbrs.shape[1]
    fresh = np.empty(degree, dtype=np.int32)
    fresh_d = np.empty(degree, dtype=np.float32)
    n_fresh = 0
    for t in range(entries.shape[0]):  # in pieces of ``degree``, as neighbours go below
        e = entries[t]
        if e >= 0 and visited[e] != stamp:
            visited[e] = stamp
            prefetch_row(heads, e)
            fresh[n_fresh] = e
            n_fresh += 1
            if n_fresh == degree:
                size, _ = _insert_scored(q, heads, metric, fresh, fresh_d, n_fresh, bd, bi, bx, size)
                n_fresh = 0
    if n_fresh:
        size, _ = _insert_scored(q, heads, metric, fresh, fresh_d, n_fresh, bd, bi, bx, size)
    cur = 0
    while cur < size:
        if bx[cur]:
            cur += 1
            continue
        bx[cur] = True
        node = bi[cur]
        # collect unvisited neighbours and prefetch their rows before any distance work
        n_fresh = 0
        for j in range(degree):
            nb_ = nbrs[node, j]
            if nb_ < 0:
                break
            if visited[nb_] == stamp:
                continue
            visited[nb_] = stamp
            prefetch_row(heads, nb_)
            fresh[n_fresh] = nb_
            n_fresh += 1
        size, low = _insert_scored(q, heads, metric, fresh, fresh_d, n_fresh, bd, bi, bx, size)
        cur = min(cur + 1, low)
    return size


@nb.njit(**_q)
def search_batch(queries, heads, nbrs, starts, metric, m, eps, visited, stamp0, bd, bi, bx,
                 out_ids, out_d):
    """Nearest ``m`` heads for each query, pruned by ``d <= d_1 + eps*|d_1|``.

    ``starts`` (rows of entry points, -1 padded): one row shared by every query, or one per
    query (heads known to lie near it, so the beam starts where it would end up).
    Writes ``out_ids (nq, m) int32`` (-1 padded) and ``out_d``; returns the kept count per
    query. Query ``i`` uses visited stamp ``stamp0 + i``.
    """
    nq = queries.shape[0]
    shared = starts.shape[0] == 1
    counts = np.zeros(nq, dtype=np.int32)
    for i in range(nq):
        size = beam_search(queries[i], heads, nbrs, starts[0 if shared else i], metric, visited,
                           np.uint32(stamp0 + i), bd, bi, bx)
        counts[i] = heap.emit_pruned(bd, bi, min(size, m), eps, out_ids[i], out_d[i])
    return counts


@nb.njit(**_q)
def nearest_entries(queries, entry_vectors, entries, metric, k, out):
    """``out[i]`` = the ``k`` of ``entries`` (vectors ``entry_vectors``, contiguous) nearest
    ``queries[i]``: the entries a beam of width ``k`` keeps in ``beam_search``."""
    ne = entries.shape[0]
    d = np.empty(ne, dtype=np.float32)
    bd = np.empty(k, dtype=np.float32)
    bi = np.empty(k, dtype=np.int32)
    bx = np.empty(k, dtype=np.bool_)
    for i in range(queries.shape[0]):
        to_rows(metric, queries[i], entry_vectors, 0, ne, 0, d)
        size = 0
        for j in range(ne):
            size, _ = _beam_insert(bd, bi, bx, size, d[j], entries[j])
        for j in range(size):
            out[i, j] = bi[j]


@nb.njit(**_q)
def exact_search(queries, heads, alive, metric, m, eps, out_ids, out_d):
    """``search_batch`` by scoring every alive head (small head sets, few queries)."""
    counts = np.zeros(queries.shape[0], dtype=np.int32)
    row = np.empty(heads.shape[0], dtype=np.float32)
    hd = np.empty(m, dtype=np.float32)
    hi = np.empty(m, dtype=np.int64)
    cand = np.empty(8 * m, dtype=np.int64)
    for i in range(queries.shape[0]):
        to_rows(metric, queries[i], heads, 0, heads.shape[0], 0, row)  # ``smallest`` skips dead heads
        size = heap.smallest_sampled(row, alive, hd, hi, cand)
        counts[i] = heap.emit_pruned(hd, hi, size, eps, out_ids[i], out_d[i])
    return counts


@nb.njit(**_q)
def robust_prune(p, cand, cand_d, heads, alpha2, out):
    """DiskANN RobustPrune: keep candidate c (ascending by distance to p) unless an already
    kept r has ``alpha2 * D(r, c) <= D(p, c)``. Writes up to ``len(out)`` ids, -1 padded;
    returns the count. Distances are squared L2, so ``alpha2`` is alpha squared."""
    R = out.shape[0]
    n = 0
    for t in range(cand.shape[0]):
        c = cand[t]
        if c < 0 or c == p:
            continue
        dup = False
        for r in range(n):
            if out[r] == c:
                dup = True
                break
        if dup:
            continue
        ok = True
        for r in range(n):
            if alpha2 * l2sq(heads[out[r]], heads[c]) <= cand_d[t]:
                ok = False
                break
        if ok:
            out[n] = c
            n += 1
            if n == R:
                break
    for r in range(n, R):
        out[r] = -1
    return n


@nb.njit(inline="always", **_q)
def _reprune(j, cand, heads, alpha2, nbrs):
    """Rewrite the out-edges of ``j`` by robust pruning over ``cand``, nearest first."""
    cd = np.empty(cand.shape[0], dtype=np.float32)
    for t in range(cand.shape[0]):
        cd[t] = l2sq(heads[j], heads[cand[t]])
    order = np.argsort(cd, kind="mergesort")
    _prune_into_row(j, cand[order], cd[order], heads, alpha2, nbrs)


@nb.njit(**_q)
def _repair(j, extra, heads, nbrs, alpha2):
    """Re-prune the out-edges of ``j`` over its current neighbours plus ``extra`` ids."""
    R = nbrs.shape[1]
    cand = np.empty(R + extra.shape[0], dtype=np.int32)
    n = 0
    for t in range(R):
        c = nbrs[j, t]
        if c >= 0:
            cand[n] = c
            n += 1
    for t in range(extra.shape[0]):
        if extra[t] >= 0:
            cand[n] = extra[t]
            n += 1
    _reprune(j, cand[:n], heads, alpha2, nbrs)


@nb.njit(**_q)
def _prune_into_row(p, cand, cand_d, heads, alpha2, nbrs):
    """Prune into a scratch row, then copy: concurrent searches read rows without locks, so a
    row should change in one short copy, not edge by edge during the pruning."""
    row = np.empty(nbrs.shape[1], dtype=np.int32)
    robust_prune(p, cand, cand_d, heads, alpha2, row)
    nbrs[p, :] = row


@nb.njit(**_q)
def insert_node(p, heads, nbrs, entries, alpha2, visited, stamp, bd, bi, bx, touched):
    """Link head ``p`` (its vector already in ``heads``) into the graph. Rows written are
    flagged in ``touched``."""
    size = beam_search(heads[p], heads, nbrs, entries, L2, visited, stamp, bd, bi, bx)
    _prune_into_row(p, bi[:size], bd[:size], heads, alpha2, nbrs)
    touched[p] = 1
    R = nbrs.shape[1]
    one = np.empty(1, dtype=np.int32)
    one[0] = p
    for t in range(R):
        r = nbrs[p, t]
        if r < 0:
            break
        placed = False
        for s in range(R):
            if nbrs[r, s] == p:
                placed = True
                break
            if nbrs[r, s] < 0:
                nbrs[r, s] = p
                touched[r] = 1
                placed = True
                break
        if not placed:
            _repair(r, one, heads, nbrs, alpha2)
            touched[r] = 1


@nb.njit(**_q)
def insert_nodes(ps, heads, nbrs, starts, alpha2, visited, stamp0, bd, bi, bx, touched):
    """``insert_node`` for each of ``ps`` in order (visited stamps ``stamp0 + i``), its beam
    starting from ``starts`` (rows of heads, -1 padded): one row shared by every node, or one
    per node (heads known to lie near it: a split's children start at the head they split,
    which needs much less beam work than starting from the graph's entry points)."""
    shared = starts.shape[0] == 1
    for t in range(ps.shape[0]):
        insert_node(ps[t], heads, nbrs, starts[0 if shared else t], alpha2, visited, np.uint32(stamp0 + t),
                    bd, bi, bx, touched)


@nb.njit(**_q)
def remove_nodes(removed, heads, nbrs, alpha2, touched):
    """Unlink every head with ``removed[p]`` set, in one pass over the graph (FreshDiskANN
    consolidation): each surviving node j with an edge into the removed set re-prunes over its
    surviving neighbours plus the surviving out-neighbours of its removed neighbours. Rows
    written are flagged in ``touched``."""
    R = nbrs.shape[1]
    for j in range(nbrs.shape[0]):
        if removed[j]:
            continue
        n_removed = 0
        for s in range(R):
            c = nbrs[j, s]
            if c < 0:
                break
            if removed[c]:
                n_removed += 1
        if n_removed == 0:
            continue
        cand = np.empty(R + n_removed * R, dtype=np.int32)
        n = 0
        for s in range(R):
            c = nbrs[j, s]
            if c < 0:
                break
            if not removed[c]:
                cand[n] = c
                n += 1
            else:
                for u in range(R):
                    e = nbrs[c, u]
                    if e < 0:
                        break
                    if e != j and not removed[e]:
                        cand[n] = e
                        n += 1
        _reprune(j, cand[:n], heads, alpha2, nbrs)
        touched[j] = 1
    for p in range(nbrs.shape[0]):
        if removed[p]:
            nbrs[p, :] = -1
            touched[p] = 1


@nb.njit(**_q)
def build(order, heads, nbrs, n_entries, alpha2, visited, bd, bi, bx):
    """Insert heads in ``order`` one by one; the first ``n_entries`` inserted serve as entry
    points for the later ones. Visited stamps start at 1; the caller passes a zeroed array."""
    entries = np.empty(min(n_entries, order.shape[0]), dtype=np.int32)
    touched = np.zeros(nbrs.shape[0], dtype=np.uint8)
    n_e = 0
    for t in range(order.shape[0]):
        p = order[t]
        if n_e > 0:
            insert_node(p, heads, nbrs, entries[:n_e], alpha2, visited, np.uint32(t + 1), bd, bi, bx,
                        touched)
        if n_e < entries.shape[0]:
            entries[n_e] = p
            n_e += 1
    return entries


@nb.njit(**_q)
def _spread(start, alive, nbrs, seen, queue):
    """Mark everything reachable from ``start`` (already marked) through live heads."""
    R = nbrs.shape[1]
    queue[0] = start
    head, tail = 0, 1
    while head < tail:
        v = queue[head]
        head += 1
        for t in range(R):
            c = nbrs[v, t]
            if c < 0:
                continue
            if alive[c] and not seen[c]:
                seen[c] = True
                queue[tail] = c
                tail += 1


@nb.njit(**_q)
def _free_slot(v, heads, nbrs, indeg):
    """A slot of ``v``'s row a new edge may take: a free one, else the one to its farthest
    neighbour that has other in-edges; -1 if every edge is some head's only way in."""
    slot, far = -1, -1.0
    for t in range(nbrs.shape[1]):
        c = nbrs[v, t]
        if c < 0:
            return t
        if indeg[c] > 1:
            d = l2sq(heads[v], heads[c])
            if d > far:
                slot, far = t, d
    return slot


@nb.njit(**_q)
def _nearest_with_room(u, cands, alive, seen, heads, nbrs, indeg):
    """The reachable live head among ``cands`` (-1 entries skipped) nearest to ``u`` that can
    take an edge, and the slot it would use; ``(-1, -1)`` if none can."""
    best, best_d, best_slot = -1, np.inf, -1
    for t in range(cands.shape[0]):
        c = cands[t]
        if c >= 0 and alive[c] and seen[c]:
            d = l2sq(heads[u], heads[c])
            if d < best_d:
                s = _free_slot(c, heads, nbrs, indeg)
                if s >= 0:
                    best, best_d, best_slot = c, d, s
    return best, best_slot


@nb.njit(**_q)
def connect(n, alive, entries, heads, nbrs, touched):
    """Give each live head that no path from the entry points reaches an in-edge from a
    nearby reachable head; returns the edges added.

    Pruning on insert and removal can take a head's last in-edge away; beam searches then never
    visit it, and its posting is lost to every query. The edge comes from the nearest
    reachable head with room (its own neighbours are tried first: they are near it), filling
    a free slot or replacing the source's farthest edge to a head that has other in-edges (so
    that rarely cuts another head off; callers repeat until nothing is added)."""
    R = nbrs.shape[1]
    seen = np.zeros(n, dtype=np.bool_)
    queue = np.empty(n, dtype=np.int32)
    indeg = np.zeros(n, dtype=np.int32)
    for v in range(n):
        if alive[v]:
            for t in range(R):
                c = nbrs[v, t]
                if c >= 0:
                    indeg[c] += 1
    for e in range(entries.shape[0]):
        p = entries[e]
        if alive[p] and not seen[p]:
            seen[p] = True
            _spread(p, alive, nbrs, seen, queue)
    added = 0
    for u in range(n):
        if not alive[u] or seen[u]:
            continue
        best, best_slot = _nearest_with_room(u, nbrs[u], alive, seen, heads, nbrs, indeg)
        if best < 0:
            best, best_slot = _nearest_with_room(u, np.arange(n), alive, seen, heads, nbrs, indeg)
        if best < 0:
            continue  # no reachable head can take an edge (or there are no entry points)
        old = nbrs[best, best_slot]
        if old >= 0:
            indeg[old] -= 1
        nbrs[best, best_slot] = u
        indeg[u] += 1
        touched[best] = 1
        seen[u] = True
        _spread(u, alive, nbrs, seen, queue)
        added += 1
    return added
