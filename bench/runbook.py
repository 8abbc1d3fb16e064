"""big-ann-benchmarks streaming runbooks: parse, scale to a data set, replay the live set.

A runbook is YAML ``{dataset_key: {max_pts: N, 1: {operation: ..., ...}, 2: ...}}`` with
operations ``insert``/``delete`` (rows ``start:end``, the row number is the id), ``replace``
(ids ``tags_start:tags_end`` get the vectors of rows ``ids_start:ids_end``) and ``search``.
Row ranges scale by ``n / max_pts`` when a runbook written for one size runs on a data set of
another.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Step:
    op: str                 # insert | delete | replace | search
    ids: np.ndarray         # ids inserted, deleted or replaced (empty for search)
    rows: np.ndarray        # data rows holding their vectors (insert, replace)


def load(path: str, key: str | None = None) -> tuple[str, int, list[dict]]:
    """``(key, max_pts, raw steps in order)`` of one runbook in the file."""
    import yaml

    with open(path) as f:
        doc = yaml.safe_load(f)
    if key is None:
        key = next(iter(doc))
    if key not in doc:
        raise ValueError(f"runbook key {key!r} not in {path}; available: {sorted(doc)}")
    book = doc[key]
    steps = [book[k] for k in sorted((k for k in book if isinstance(k, int)))]
    return key, int(book["max_pts"]), steps


def max_row(raw: list[dict]) -> int:
    """One past the largest data row the runbook touches."""
    top = 0
    for s in raw:
        for k in ("end", "ids_end", "tags_end"):
            if k in s:
                top = max(top, int(s[k]))
    return top


def scaled(raw: list[dict], factor: float) -> list[Step]:
    """Steps with row ranges multiplied by ``factor`` (rounded)."""
    def r(v: int) -> int:
        return int(round(v * factor))

    out = []
    for s in raw:
        op = s["operation"]
        if op in ("insert", "delete"):
            ids = np.arange(r(s["start"]), r(s["end"]), dtype=np.int64)
            out.append(Step(op, ids, ids))
        elif op == "replace":
            tags = np.arange(r(s["tags_start"]), r(s["tags_end"]), dtype=np.int64)
            rows = np.arange(r(s["ids_start"]), r(s["ids_start"]) + tags.size, dtype=np.int64)
            out.append(Step(op, tags, rows))
        elif op == "search":
            out.append(Step(op, np.zeros(0, np.int64), np.zeros(0, np.int64)))
        else:
            raise ValueError(f"unknown runbook operation {op!r}")
    return out


class LiveSet:
    """Which ids are live and which data row each holds, as the runbook plays."""

    def __init__(self) -> None:
        self.row_of: dict[int, int] = {}

    def apply(self, step: Step) -> None:
        if step.op == "insert" or step.op == "replace":
            self.row_of.update(zip(step.ids.tolist(), step.rows.tolist()))
        elif step.op == "delete":
            for i in step.ids.tolist():
                self.row_of.pop(i, None)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        ids = np.fromiter(self.row_of.keys(), dtype=np.int64, count=len(self.row_of))
        rows = np.fromiter(self.row_of.values(), dtype=np.int64, count=len(self.row_of))
        return ids, rows


def cluster_order(base: np.ndarray, n_clusters: int, seed: int = 0) -> np.ndarray:
    """A row permutation that groups rows by k-means cluster, so that the row ranges of a
    "clustered" runbook insert one region of the space after another, as the data sets the
    runbooks were written for do."""
    import faiss

    km = faiss.Kmeans(base.shape[1], n_clusters, niter=20, seed=seed, verbose=False)
    km.train(np.ascontiguousarray(base, dtype=np.float32))
    _, labels = km.index.search(np.ascontiguousarray(base, dtype=np.float32), 1)
    return np.argsort(labels[:, 0], kind="stable")


def max_row_steps(steps: list[Step]) -> int:
    """One past the largest id the steps use (a bound on the live set)."""
    return max((int(s.ids.max()) + 1 for s in steps if s.ids.size), default=1)
