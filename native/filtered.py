"""Filtered search kernels: gathering a filter's matching records out of their postings."""
from __future__ import annotations

import numba as nb


@nb.njit(cache=True, nogil=True)
def pick(rows_u, starts, ends, allowed, versions, vid2ext, out_rows, out_ids, n_out, taken):
    """Copy each record of ``rows_u[starts[j]:ends[j]]`` (for every ``j``) that ``allowed``
    marks and that is live against ``versions`` into ``out_rows[n_out:]`` (its external id
    into ``out_ids``), once per vid (``taken``: per vid, set on copy; replicas of a record
    carry the same version). Returns the new ``n_out``; stops when ``out_rows`` is full."""
    n = allowed.shape[0]
    for j in range(starts.shape[0]):
        for e in range(starts[j], ends[j]):
            vid = rows_u[e, 0]
            if vid >= n or not allowed[vid] or taken[vid] or versions[vid] != rows_u[e, 1]:
                continue
            if n_out == out_rows.shape[0]:
                return n_out
            taken[vid] = True
            out_rows[n_out, :] = rows_u[e, :]
            out_ids[n_out] = vid2ext[vid]
            n_out += 1
    return n_out
