"""Metadata and filters for bench.filtered: every filter both as a vindex filter dict and as the
boolean mask over base rows it selects, so engines without a filter language get the same set.

Each base row gets five metadata keys:

- ``label``: int in ``[0, LABELS)``, drawn so that ``{"label": {"$lt": t}}`` hits exactly
  ``ceil(n * t / LABELS)`` rows (a random permutation scaled down), independent of the vectors;
- ``year``: int uniform in ``[YEAR_LO, YEAR_HI)``, so a 10-year range hits about 5%;
- ``cluster``: the row's k-means cluster of the base (correlated with the vectors);
- on wiki ``topic`` (the article's real topic name) and ``chunk`` (its chunk number); elsewhere
  ``rank`` (the row's position in the source file) and ``group`` (a keyword, ``label`` // 100).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LABELS = 10_000
SELECTIVITIES = (0.5, 0.1, 0.01, 0.001, 0.0001)
YEAR_LO, YEAR_HI = 1900, 2100
YEAR_RANGE = (2000, 2010)
#: Far-cluster queries pick among this share of clusters farthest from the query.
FAR_SHARE = 0.1


@dataclass
class FilterCase:
    """One filter kind over all queries: ``filters[which[i]]`` / ``masks[which[i]]`` for query i."""

    name: str
    kind: str  # "none" | "label" | "range" | "topic" | "far-cluster"
    filters: list[dict | None]
    masks: np.ndarray  # (len(filters), n) bool
    which: np.ndarray  # (nq,) int

    def filter_of(self, qi: int) -> dict | None:
        """The vindex filter dict query ``qi`` runs with (None: unfiltered)."""
        return self.filters[int(self.which[qi])]

    @property
    def selectivity(self) -> float:
        """Mean share of base rows the queries' filters match."""
        return float(self.masks.mean(axis=1)[self.which].mean())

    def matches(self) -> np.ndarray:
        """(nq,) number of base rows each query's filter matches."""
        return self.masks.sum(axis=1)[self.which]


@dataclass
class Workload:
    """Per-row metadata (and documents, where the data set has text) plus the filter cases."""

    metadata: list[dict]
    documents: list[str] | None
    cases: list[FilterCase]


def _labels(n: int, rng: np.random.Generator) -> np.ndarray:
    return (rng.permutation(n).astype(np.int64) * LABELS) // n


def _same_for_all(nq: int) -> np.ndarray:
    return np.zeros(nq, dtype=np.int64)


def label_cases(labels: np.ndarray, nq: int) -> list[FilterCase]:
    """``{"label": {"$lt": t}}`` at each of :data:`SELECTIVITIES`."""
    cases = []
    for s in SELECTIVITIES:
        t = max(1, round(s * LABELS))
        cases.append(FilterCase(f"label {s:.2%}", "label", [{"label": {"$lt": t}}],
                                (labels < t)[None, :], _same_for_all(nq)))
    return cases


def range_case(years: np.ndarray, nq: int) -> FilterCase:
    """``{"year": {"$gte": a, "$lt": b}}`` over :data:`YEAR_RANGE` (about 5%)."""
    a, b = YEAR_RANGE
    return FilterCase(f"year [{a}, {b})", "range", [{"year": {"$gte": a, "$lt": b}}],
                      ((years >= a) & (years < b))[None, :], _same_for_all(nq))


def topic_case(topics: np.ndarray, names: list[str], nq: int, rng: np.random.Generator) -> FilterCase:
    """``{"topic": name}`` with a topic drawn at random for each query."""
    return FilterCase("topic", "topic", [{"topic": name} for name in names],
                      topics[None, :] == np.arange(len(names))[:, None],
                      rng.integers(0, len(names), nq))


def kmeans(base: np.ndarray, n_clusters: int, metric: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(centroids, assignment of each base row) by faiss k-means on ``base`` as prepared for
    ``metric`` (unit rows for cosine, which also keeps the centroids on the sphere)."""
    import faiss

    km = faiss.Kmeans(base.shape[1], n_clusters, niter=20, seed=seed, spherical=metric == "cosine",
                      max_points_per_centroid=256)
    km.train(base)
    if metric == "l2":
        _, assign = km.index.search(base, 1)
    else:
        _, assign = faiss.knn(base, km.centroids, 1, metric=faiss.METRIC_INNER_PRODUCT)
    return km.centroids, assign[:, 0].astype(np.int64)


def far_cluster_case(centroids: np.ndarray, assign: np.ndarray, queries: np.ndarray, metric: str,
                     rng: np.random.Generator) -> FilterCase:
    """``{"cluster": c}`` where, for each query, ``c`` is drawn among the :data:`FAR_SHARE` of
    clusters whose centroids are farthest from it: the matching rows lie away from the query."""
    c = centroids.shape[0]
    if metric == "l2":
        dist = (queries ** 2).sum(1)[:, None] - 2 * queries @ centroids.T + (centroids ** 2).sum(1)[None, :]
    else:
        dist = -(queries @ centroids.T)
    n_far = max(1, math.ceil(FAR_SHARE * c))
    farthest = np.argsort(-dist, axis=1, kind="stable")[:, :n_far]
    which = farthest[np.arange(len(queries)), rng.integers(0, n_far, len(queries))]
    return FilterCase("far cluster", "far-cluster", [{"cluster": int(i)} for i in range(c)],
                      assign[None, :] == np.arange(c)[:, None], which.astype(np.int64))


def unfiltered_case(n: int, nq: int) -> FilterCase:
    """No filter: the case that fixes the setting giving recall 0.95."""
    return FilterCase("unfiltered", "none", [None], np.ones((1, n), dtype=bool), _same_for_all(nq))


def make(base: np.ndarray, queries: np.ndarray, metric: str, *, n_clusters: int = 100, seed: int = 0,
         topics: np.ndarray | None = None, topic_names: list[str] | None = None,
         chunks: np.ndarray | None = None, titles: list[str] | None = None) -> Workload:
    """The metadata and filter cases for ``base`` / ``queries`` (both prepared for ``metric``).

    ``topics``/``topic_names``/``chunks``/``titles`` are the wiki set's real columns; without
    them the rows get ``rank`` and ``group`` instead and no documents.
    """
    n, nq = base.shape[0], queries.shape[0]
    rng = np.random.default_rng(seed)
    labels = _labels(n, rng)
    years = rng.integers(YEAR_LO, YEAR_HI, n)
    centroids, assign = kmeans(base, min(n_clusters, n), metric, seed)
    cases = [unfiltered_case(n, nq), *label_cases(labels, nq), range_case(years, nq)]
    if topics is not None:
        cases.append(topic_case(topics, list(topic_names), nq, rng))
        extra = [{"topic": topic_names[t], "chunk": int(c)} for t, c in zip(topics.tolist(), chunks.tolist())]
    else:
        extra = [{"rank": i, "group": f"g{lab // 100:03d}"} for i, lab in enumerate(labels.tolist())]
    cases.append(far_cluster_case(centroids, assign, queries, metric, rng))
    metadata = [{"label": lab, "year": y, "cluster": c, **e}
                for lab, y, c, e in zip(labels.tolist(), years.tolist(), assign.tolist(), extra)]
    return Workload(metadata, list(titles) if titles is not None else None, cases)
