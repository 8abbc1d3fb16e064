"""Responses of ``vindex.v1`` as the library's result objects, for the client.

Search, Get and Scroll responses become the very types :class:`vindex.Index` returns
(``SearchResult``, ``GetResult``, ``ScrollPage``), so code reading ``res.metadata[i][j]`` runs
unchanged against a server.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from vindex import results

from .payloads import decode_rows


def _ids(message: Any, shape: tuple[int, ...]) -> np.ndarray | list[str]:
    """The response's ids: int64, or for string ids an object array with None padding."""
    if message.id_type == "str":
        return np.array([i or None for i in message.str_ids], dtype=object).reshape(shape)
    return np.array(message.ids, dtype=np.int64).reshape(shape)


def _included(message: Any, include: list[str], rows: int) -> dict:
    """The included fields of ``rows`` records: lists of metadata / documents, vectors (rows, dim)."""
    out: dict = {}
    if "metadata" in include or "documents" in include:
        meta, docs = decode_rows(message, rows)
        if "metadata" in include:
            out["metadata"] = meta
        if "documents" in include:
            out["documents"] = docs
    if "vectors" in include:
        dim = message.dim
        out["vectors"] = np.frombuffer(message.vectors, dtype="<f4").reshape(rows, dim).astype(np.float32) \
            if dim else np.zeros((rows, 0), np.float32)
    return out


def search_result(res: Any, include: list[str]) -> Any:
    nq, k = res.nq, res.k
    ids = _ids(res, (nq, k))
    dists = np.array(res.distances, dtype=np.float32).reshape(nq, k)
    stats = {"postings": res.postings, "records_scanned": res.records_scanned,
             "postings_dropped": res.postings_dropped}
    fields = _included(res, include, nq * k)
    per_query = {name: [rows[q * k:(q + 1) * k] for q in range(nq)] for name, rows in fields.items()
                 if name != "vectors"}
    if "vectors" in fields:
        per_query["vectors"] = fields["vectors"].reshape(nq, k, -1)
    return results.SearchResult(ids, dists, stats, per_query)


def get_result(res: Any, include: list[str]) -> Any:
    x = np.frombuffer(res.vectors, dtype="<f4").reshape(-1, res.dim).astype(np.float32)
    found = np.array(res.found, dtype=bool)
    fields = _included(res, [f for f in include if f != "vectors"], len(found))
    return results.GetResult(x, found, fields)


def scroll_page(res: Any, include: list[str]) -> tuple[Any, str | None]:
    """A ``Scroll`` response as ``(page, next page token)``: the page is None when it holds no
    records and is the last, the token None after the last page."""
    ids = _ids(res, (-1,))
    if res.id_type == "str":
        ids = list(ids)
    n, token = len(ids), res.next_page_token or None
    if n == 0 and token is None:
        return None, None
    return results.ScrollPage(ids, None if token is None else int(token), _included(res, include, n)), token
