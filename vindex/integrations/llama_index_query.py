"""LlamaIndex queries in vindex terms: ``MetadataFilters`` as a vindex filter dict, distances as
similarity scores, and MMR re-ranking of fetched candidates.

Kept apart from the store so each piece is testable without an index.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from vindex.errors import FilterError

__all__ = ["to_vindex_filter", "all_of", "similarities", "mmr_select", "DEFAULT_MMR_THRESHOLD"]

# llama-index's own default (get_top_k_mmr_embeddings)
DEFAULT_MMR_THRESHOLD = 0.5

_COMPARISONS = {FilterOperator.EQ: "$eq", FilterOperator.NE: "$ne", FilterOperator.GT: "$gt",
                FilterOperator.GTE: "$gte", FilterOperator.LT: "$lt", FilterOperator.LTE: "$lte",
                FilterOperator.CONTAINS: "$eq"}  # a list value matches $eq when an element does
_LISTS = {FilterOperator.IN: "$in", FilterOperator.NIN: "$nin", FilterOperator.ANY: "$in"}
_SUPPORTED = "==, !=, >, >=, <, <=, in, nin, any, all, contains"


def to_vindex_filter(filters: MetadataFilters | None) -> dict | None:
    """``filters`` as a vindex filter dict (docs/filters.md); None when they restrict nothing.

    Raises :class:`vindex.FilterError` naming the filter whose operator or value has no vindex
    equivalent (text_match, is_empty; a list for a comparison, a scalar for in/nin)."""
    if filters is None:
        return None
    if not isinstance(filters, MetadataFilters):
        raise FilterError(f"filters: expected llama_index MetadataFilters, got {type(filters).__name__}")
    if not filters.filters:
        return None
    return _group(filters, "filters")


def all_of(*parts: dict | None) -> dict | None:
    """The filter matching records that match every given one (None parts ignored)."""
    given = [p for p in parts if p is not None]
    if not given:
        return None
    return given[0] if len(given) == 1 else {"$and": given}


def _group(filters: MetadataFilters, where: str) -> dict:
    parts = [_group(f, f"{where}[{i}]") if isinstance(f, MetadataFilters) else _one(f, f"{where}[{i}]")
             for i, f in enumerate(filters.filters)]
    if not parts:  # an empty nested group restricts nothing, as an empty top level does
        return {}
    condition = filters.condition or FilterCondition.AND
    if condition == FilterCondition.NOT:  # llama-index: none of the filters matches
        return {"$not": parts[0] if len(parts) == 1 else {"$or": parts}}
    if len(parts) == 1:
        return parts[0]
    if condition == FilterCondition.AND:
        return {"$and": parts}
    if condition == FilterCondition.OR:
        return {"$or": parts}
    raise FilterError(f"{where}: condition {condition!r} has no vindex equivalent (expected and, or, not)")


def _one(f: MetadataFilter, where: str) -> dict:
    op, value, key = FilterOperator(f.operator), f.value, f.key
    if op in _COMPARISONS:
        if isinstance(value, list):
            raise FilterError(f"{where}: operator {op.value!r} on key {key!r} expects one value, got a list "
                              f"{value!r}; use 'in' to match any of several")
        return {key: {_COMPARISONS[op]: value}}
    if op in _LISTS or op == FilterOperator.ALL:
        if not isinstance(value, list):
            raise FilterError(f"{where}: operator {op.value!r} on key {key!r} expects a list of values, "
                              f"got {value!r}")
        if op == FilterOperator.ALL:  # every value is an element of the list at key
            return {"$and": [{key: {"$eq": v}} for v in value]} if value else {}
        return {key: {_LISTS[op]: value}}
    raise FilterError(f"{where}: operator {op.value!r} on key {key!r} has no vindex equivalent "
                      f"(supported: {_SUPPORTED})")


def similarities(metric: str, distances: np.ndarray) -> list[float]:
    """vindex distances as llama-index similarity scores, higher is better: ``cos`` for
    cosine (``1 - d``), ``<q, x>`` for ip (``-d``), ``1 / (1 + d)`` for l2 (squared)."""
    d = np.asarray(distances, dtype=np.float64)
    if metric == "cosine":
        s = 1.0 - d
    elif metric == "ip":
        s = -d
    else:
        s = 1.0 / (1.0 + d)
    return s.tolist()


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def mmr_select(query: Sequence[float], candidates: np.ndarray, k: int,
               threshold: float | None = None) -> tuple[list[int], list[float]]:
    """Positions of ``k`` of ``candidates`` (n, dim) by maximal marginal relevance, and their
    MMR scores: exactly what llama-index's ``get_top_k_mmr_embeddings`` picks and scores (each
    pick maximises ``threshold * cos(query, c) - (1 - threshold) * cos(c, previous pick)``),
    with numpy over the candidates instead of a Python loop over pairs."""
    t = DEFAULT_MMR_THRESHOLD if threshold is None else float(threshold)
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"mmr_threshold: expected a number in [0, 1], got {threshold!r}")
    x = _unit(np.asarray(candidates, dtype=np.float64))
    relevance = x @ _unit(np.asarray(query, dtype=np.float64))
    picked: list[int] = []
    scores: list[float] = []
    left = np.ones(x.shape[0], dtype=bool)
    score = t * relevance
    for _ in range(min(k, x.shape[0])):
        masked = np.where(left, score, -np.inf)
        best = int(np.argmax(masked))  # the first of equals, as llama-index's strict '>' keeps
        picked.append(best)
        scores.append(float(masked[best]))
        left[best] = False
        score = t * relevance - (1.0 - t) * (x @ x[best])
    return picked, scores

