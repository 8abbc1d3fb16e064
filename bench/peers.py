"""Peer ANN indexes (faiss IVF-Flat, faiss HNSW-Flat, hnswlib) behind one small interface.

Benchmarks run vindex side by side with these, so each peer is configured the way its
authors' own benchmarks use it and always searched single-threaded (one query stream per
core is what a latency comparison means). Build threads are a constructor argument.

Metric handling is shared: "cosine" normalises base and queries and then uses inner
product, "ip" uses inner product on the raw vectors, "l2" uses squared L2.
"""

from __future__ import annotations

import json
import math
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["PEERS", "FaissHNSWFlat", "FaissIVFFlat", "Hnswlib", "Peer", "make_peer"]

_METRICS = ("l2", "cosine", "ip")


@runtime_checkable
class Peer(Protocol):
    """What every peer index offers; ``build`` is timed by the caller."""

    name: str

    def build(self, base: np.ndarray, metric: str) -> None: ...

    def sweep(self) -> list[dict]: ...

    def set_params(self, params: dict) -> None: ...

    def search(self, queries: np.ndarray, k: int) -> np.ndarray: ...

    def save(self, path: str) -> None: ...

    @staticmethod
    def open_for_rss(path: str) -> object: ...


def _prepare(x: np.ndarray, metric: str) -> np.ndarray:
    """float32 C-contiguous copy-if-needed; unit rows for cosine."""
    if metric not in _METRICS:
        raise ValueError(f"metric must be one of {_METRICS}, got {metric!r}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if metric == "cosine":
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        x = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
    return x


class _FaissPeer:
    """Shared faiss plumbing: thread control, metric mapping, save/load."""

    name = "faiss"

    def __init__(self, build_threads: int = 1) -> None:
        self.build_threads = int(build_threads)
        self.index = None
        self.metric = "l2"

    @staticmethod
    def _faiss_metric(metric: str) -> int:
        import faiss

        return faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT

    def _require(self) -> None:
        if self.index is None:
            raise RuntimeError(f"{self.name}: build() first")

    def search(self, queries: np.ndarray, k: int) -> np.ndarray:
        import faiss

        self._require()
        faiss.omp_set_num_threads(1)  # searches are single-threaded by contract
        _, ids = self.index.search(_prepare(queries, self.metric), k)
        return ids.astype(np.int64, copy=False)

    def save(self, path: str) -> None:
        import faiss

        self._require()
        faiss.write_index(self.index, str(path))

    @staticmethod
    def open_for_rss(path: str) -> object:
        import faiss

        return faiss.read_index(str(path))


class FaissIVFFlat(_FaissPeer):
    """faiss IndexIVFFlat with a flat coarse quantizer; sweeps nprobe."""

    name = "faiss-ivfflat"
    NPROBES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)

    def __init__(
        self,
        nlist: int | None = None,
        build_threads: int = 1,
        max_train_per_list: int = 256,
        seed: int = 0,
    ) -> None:
        super().__init__(build_threads)
        self.nlist = nlist  # None: round(4 * sqrt(n)) at build time
        self.max_train_per_list = max_train_per_list
        self.seed = seed

    def build(self, base: np.ndarray, metric: str) -> None:
        import faiss

        self.metric = metric
        x = _prepare(base, metric)
        n, d = x.shape
        nlist = self.nlist or max(1, round(4 * math.sqrt(n)))
        nlist = min(nlist, n)
        self.nlist = nlist
        quantizer = faiss.IndexFlatL2(d) if metric == "l2" else faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, nlist, self._faiss_metric(metric))
        index.cp.seed = self.seed
        index.cp.spherical = metric == "cosine"  # keep centroids on the unit sphere
        # Train on at most max_train_per_list points per list, the usual faiss budget.
        n_train = min(n, self.max_train_per_list * nlist)
        index.cp.max_points_per_centroid = self.max_train_per_list
        if n_train < n:
            rows = np.sort(np.random.default_rng(self.seed).choice(n, n_train, replace=False))
            train = x[rows]
        else:
            train = x
        faiss.omp_set_num_threads(self.build_threads)
        try:
            index.train(train)
            index.add(x)
        finally:
            faiss.omp_set_num_threads(1)
        index.nprobe = 1
        self.index = index

    def sweep(self) -> list[dict]:
        limit = self.nlist or max(self.NPROBES)
        return [{"nprobe": p} for p in self.NPROBES if p <= limit]

    def set_params(self, params: dict) -> None:
        self._require()
        self.index.nprobe = int(params["nprobe"])


class FaissHNSWFlat(_FaissPeer):
    """faiss IndexHNSWFlat (M=16, efConstruction=200); sweeps efSearch."""

    name = "faiss-hnsw"
    EFS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)

    def __init__(self, M: int = 16, ef_construction: int = 200, build_threads: int = 1) -> None:
        super().__init__(build_threads)
        self.M = M
        self.ef_construction = ef_construction

    def build(self, base: np.ndarray, metric: str) -> None:
        import faiss

        self.metric = metric
        x = _prepare(base, metric)
        index = faiss.IndexHNSWFlat(x.shape[1], self.M, self._faiss_metric(metric))
        index.hnsw.efConstruction = self.ef_construction
        faiss.omp_set_num_threads(self.build_threads)
        try:
            index.add(x)
        finally:
            faiss.omp_set_num_threads(1)
        index.hnsw.efSearch = self.EFS[0]
        self.index = index

    def sweep(self) -> list[dict]:
        return [{"efSearch": ef} for ef in self.EFS]

    def set_params(self, params: dict) -> None:
        self._require()
        self.index.hnsw.efSearch = int(params["efSearch"])


class Hnswlib:
    """hnswlib (M=16, ef_construction=200); sweeps ef. Cosine = "ip" on normalised data."""

    name = "hnswlib"
    EFS = (10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)

    def __init__(self, M: int = 16, ef_construction: int = 200, build_threads: int = 1, seed: int = 100) -> None:
        self.M = M
        self.ef_construction = ef_construction
        self.build_threads = int(build_threads)
        self.seed = seed
        self.index = None
        self.metric = "l2"

    @staticmethod
    def _space(metric: str) -> str:
        # hnswlib "ip" is 1 - <q, x>; on unit vectors that ranks exactly like cosine.
        return "l2" if metric == "l2" else "ip"

    def build(self, base: np.ndarray, metric: str) -> None:
        import hnswlib

        self.metric = metric
        x = _prepare(base, metric)
        n, d = x.shape
        index = hnswlib.Index(space=self._space(metric), dim=d)
        index.init_index(max_elements=n, M=self.M, ef_construction=self.ef_construction, random_seed=self.seed)
        index.add_items(x, np.arange(n, dtype=np.int64), num_threads=self.build_threads)
        index.set_ef(self.EFS[0])
        self.index = index

    def sweep(self) -> list[dict]:
        return [{"ef": ef} for ef in self.EFS]

    def set_params(self, params: dict) -> None:
        if self.index is None:
            raise RuntimeError("hnswlib: build() first")
        self.index.set_ef(int(params["ef"]))

    def search(self, queries: np.ndarray, k: int) -> np.ndarray:
        if self.index is None:
            raise RuntimeError("hnswlib: build() first")
        labels, _ = self.index.knn_query(_prepare(queries, self.metric), k=k, num_threads=1)
        return labels.astype(np.int64)

    def save(self, path: str) -> None:
        if self.index is None:
            raise RuntimeError("hnswlib: build() first")
        self.index.save_index(str(path))
        # hnswlib needs space and dim to load, which its file does not record.
        with open(str(path) + ".json", "w") as f:
            json.dump({"space": self._space(self.metric), "dim": self.index.dim, "metric": self.metric}, f)

    @staticmethod
    def open_for_rss(path: str) -> object:
        import hnswlib

        with open(str(path) + ".json") as f:
            meta = json.load(f)
        index = hnswlib.Index(space=meta["space"], dim=int(meta["dim"]))
        index.load_index(str(path))
        return index


PEERS: dict[str, type] = {
    "faiss-ivfflat": FaissIVFFlat,
    "faiss-hnsw": FaissHNSWFlat,
    "hnswlib": Hnswlib,
}


def make_peer(name: str, **kwargs) -> Peer:
    """Instantiate a peer by its ``PEERS`` key; unknown names raise ValueError."""
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; valid: {', '.join(PEERS)}")
    return PEERS[name](**kwargs)
