"""Indexes driven through a streaming runbook: insert, delete, replace, search.

Every method gets the same operations in the same order; searches run on one thread and take
a search-parameter setting from the method's ``sweep()``.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile

import numpy as np

import vindex


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.where(n > 0, n, 1), dtype=np.float32)


class VindexStream:
    """vindex taking the runbook in place (``rebalance`` on or off), or rebuilt from scratch
    on the live set before every search step (``rebuild``: the ceiling)."""

    POSTINGS = (1, 2, 4, 8, 16, 32, 64)

    def __init__(self, name: str = "vindex", *, rebalance: bool = True, rebuild: bool = False,
                 config: dict | None = None) -> None:
        self.name = name
        self.rebalance = rebalance
        self.rebuild = rebuild
        self.config = dict(config or {})
        self.dir = tempfile.mkdtemp(prefix="vindex-stream-")
        self.index: vindex.Index | None = None
        self.metric = "l2"
        self.dim = 0
        self.builds = 0

    def setup(self, dim: int, metric: str, max_pts: int) -> None:
        self.dim, self.metric = dim, metric
        if not self.rebuild:
            self.index = vindex.Index.create(f"{self.dir}/index", dim=dim, metric=metric,
                                             rebalance=self.rebalance, **self.config)

    def insert(self, ids: np.ndarray, x: np.ndarray) -> None:
        if self.index is not None:
            self.index.upsert(ids, x)

    replace = insert

    def delete(self, ids: np.ndarray) -> None:
        if self.index is not None:
            self.index.delete(ids)

    def prepare_search(self, live_ids: np.ndarray, live_x: np.ndarray) -> None:
        if not self.rebuild:
            return
        if self.index is not None:
            self.index.close()
        path = f"{self.dir}/build-{self.builds}"
        self.builds += 1
        shutil.rmtree(f"{self.dir}/build-{self.builds - 2}", ignore_errors=True)
        self.index = vindex.Index.build(path, live_x, live_ids, metric=self.metric, progress=False,
                                        **self.config)

    def sweep(self) -> list[dict]:
        return [{"max_postings": m} for m in self.POSTINGS]

    def paused(self) -> contextlib.AbstractContextManager:
        """No background rounds start inside (timing passes that must not give it time)."""
        return self.index.pause_background() if self.index is not None else contextlib.nullcontext()

    def search(self, q: np.ndarray, k: int, params: dict) -> np.ndarray:
        res = self.index.search(q, k, **params)
        self.last_distances = res.stats["records_scanned"] / max(1, q.shape[0])
        return res.ids

    def stats(self) -> dict:
        s = self.index.stats() if self.index is not None else {}
        return {k: s.get(k) for k in ("heads", "posting_mean", "posting_max", "postings_over_limit",
                                      "splits", "merges", "reassigns", "gc", "background_queue")}

    def close(self) -> None:
        if self.index is not None:
            self.index.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class FaissIVFStream:
    """faiss IVFFlat with centroids trained once on the first inserted batch, then
    ``add_with_ids`` / ``remove_ids``; replace = remove + add."""

    name = "faiss-ivfflat"
    NPROBES = (1, 2, 4, 8, 16)

    def __init__(self) -> None:
        self.index = None
        self.metric = "l2"
        self.nlist = 0

    def setup(self, dim: int, metric: str, max_pts: int) -> None:
        self.dim, self.metric, self.max_pts = dim, metric, max_pts

    def _prep(self, x: np.ndarray) -> np.ndarray:
        return _unit(x) if self.metric == "cosine" else np.ascontiguousarray(x, dtype=np.float32)

    def insert(self, ids: np.ndarray, x: np.ndarray) -> None:
        import faiss

        x = self._prep(x)
        if self.index is None:
            # nlist about 4 sqrt(n) for the final size, but at least ~4 training points each
            self.nlist = max(1, min(int(round(4 * np.sqrt(self.max_pts))), x.shape[0] // 4))
            ip = self.metric != "l2"
            quant = faiss.IndexFlatIP(self.dim) if ip else faiss.IndexFlatL2(self.dim)
            self.index = faiss.IndexIVFFlat(quant, self.dim, self.nlist,
                                            faiss.METRIC_INNER_PRODUCT if ip else faiss.METRIC_L2)
            self.index.cp.min_points_per_centroid = 1
            self.index.train(x)
        self.index.add_with_ids(x, ids.astype(np.int64))

    def delete(self, ids: np.ndarray) -> None:
        if self.index is not None:
            self.index.remove_ids(np.ascontiguousarray(ids, dtype=np.int64))

    def replace(self, ids: np.ndarray, x: np.ndarray) -> None:
        self.delete(ids)
        self.insert(ids, x)

    def prepare_search(self, live_ids: np.ndarray, live_x: np.ndarray) -> None:
        pass

    def sweep(self) -> list[dict]:
        return [{"nprobe": p} for p in self.NPROBES]

    def paused(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # no background work

    def search(self, q: np.ndarray, k: int, params: dict) -> np.ndarray:
        import faiss

        faiss.omp_set_num_threads(1)
        self.index.nprobe = params["nprobe"]
        faiss.cvar.indexIVF_stats.reset()
        _, ids = self.index.search(self._prep(q), k)
        self.last_distances = faiss.cvar.indexIVF_stats.ndis / max(1, q.shape[0])
        return ids

    def stats(self) -> dict:
        return {"nlist": self.nlist}

    def close(self) -> None:
        self.index = None


class HnswlibStream:
    """hnswlib (M=16, ef_construction=200) with ``mark_deleted`` and ``replace_deleted``."""

    name = "hnswlib"
    EFS = (10, 16, 32, 64)

    def __init__(self) -> None:
        self.index = None
        self.live = 0

    def setup(self, dim: int, metric: str, max_pts: int) -> None:
        import hnswlib

        self.metric = metric
        self.index = hnswlib.Index(space="l2" if metric == "l2" else "ip", dim=dim)
        self.index.init_index(max_elements=max_pts, M=16, ef_construction=200, random_seed=100,
                              allow_replace_deleted=True)
        self.deleted: set[int] = set()

    def _prep(self, x: np.ndarray) -> np.ndarray:
        return _unit(x) if self.metric == "cosine" else np.ascontiguousarray(x, dtype=np.float32)

    def insert(self, ids: np.ndarray, x: np.ndarray) -> None:
        self.index.add_items(self._prep(x), ids, num_threads=1, replace_deleted=True)
        self.live += int(ids.size)

    def replace(self, ids: np.ndarray, x: np.ndarray) -> None:
        self.index.add_items(self._prep(x), ids, num_threads=1)  # an existing label is updated

    def delete(self, ids: np.ndarray) -> None:
        for i in ids.tolist():
            self.index.mark_deleted(i)
        self.live -= int(ids.size)

    def prepare_search(self, live_ids: np.ndarray, live_x: np.ndarray) -> None:
        self.live = int(live_ids.size)

    def sweep(self) -> list[dict]:
        return [{"ef": e} for e in self.EFS]

    def paused(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # no background work

    def search(self, q: np.ndarray, k: int, params: dict) -> np.ndarray:
        self.index.set_ef(max(params["ef"], k))
        kk = min(k, self.live)
        labels, _ = self.index.knn_query(self._prep(q), k=kk, num_threads=1)
        out = np.full((q.shape[0], k), -1, dtype=np.int64)
        out[:, :kk] = labels
        return out

    def stats(self) -> dict:
        return {"elements": self.index.get_current_count()}

    def close(self) -> None:
        self.index = None


def make(name: str):
    if name == "vindex":
        return VindexStream("vindex")
    if name == "vindex-norebalance":
        return VindexStream("vindex-norebalance", rebalance=False)
    if name == "vindex-rebuild":
        return VindexStream("vindex-rebuild", rebuild=True)
    if name == "faiss-ivfflat":
        return FaissIVFStream()
    if name == "hnswlib":
        return HnswlibStream()
    raise ValueError(f"unknown streaming method {name!r}")


METHODS = ("vindex", "vindex-norebalance", "faiss-ivfflat", "hnswlib", "vindex-rebuild")
