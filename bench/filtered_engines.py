"""The engines bench.filtered compares, behind one interface: ``build(base, metric, workload)``,
``sweep()`` / ``set_params(params)``, ``prepare(case)`` once per filter case, then
``search_one(q, qi, k) -> (k,) row ids`` (-1 padded) for query ``qi`` of that case, and ``close()``.

Base rows are ids ``0..n-1`` in every engine. The peers get each filter as the mask of base rows
it selects (they have no filter language); vindex gets the filter dict.
"""
from __future__ import annotations

import inspect

import numpy as np

import vindex
from bench.filter_workload import FilterCase, Workload
from bench.filtered_truth import BruteForce
from bench.peers import FaissIVFFlat, Hnswlib
from bench.vindex_peer import MAX_POSTINGS, Vindex

__all__ = ["ENGINES", "BruteForce", "FaissIVFBitmap", "HnswlibFilter", "VindexFiltered", "Unsupported"]


class Unsupported(RuntimeError):
    """This engine cannot run here (the reason is the message); the benchmark goes on without it."""


class FaissIVFBitmap:
    """faiss IndexIVFFlat (as in bench.peers) searched with ``SearchParametersIVF(sel=
    IDSelectorBitmap(...), nprobe=...)``: lists are scanned as usual, rows outside the bitmap skipped."""

    name = "faiss-ivfflat+bitmap"

    def __init__(self, build_threads: int = 1) -> None:
        self.ivf = FaissIVFFlat(build_threads=build_threads)
        self.nprobe = 1
        self.params: list = []  # one SearchParametersIVF per distinct filter of the case
        self._bitmaps: list[np.ndarray] = []  # kept alive: faiss holds raw pointers into them
        self.case: FilterCase | None = None

    def build(self, base: np.ndarray, metric: str, workload: Workload) -> None:
        self.ivf.build(base, metric)

    def sweep(self) -> list[dict]:
        """bench.peers' nprobe sweep, continued by doubling up to every list: a selective filter
        leaves few rows per list, so faiss may need to scan all of them to find k."""
        probes = [p["nprobe"] for p in self.ivf.sweep()]
        while probes[-1] < self.ivf.nlist:
            probes.append(min(2 * probes[-1], self.ivf.nlist))
        return [{"nprobe": p} for p in probes]

    def set_params(self, params: dict) -> None:
        self.nprobe = int(params["nprobe"])
        for p in self.params:
            p.nprobe = self.nprobe

    def prepare(self, case: FilterCase) -> None:
        import faiss

        self.case = case
        self._bitmaps, self.params = [], []
        for f, mask in zip(case.filters, case.masks):
            p = faiss.SearchParametersIVF()
            p.nprobe = self.nprobe
            if f is not None:
                bits = np.packbits(mask, bitorder="little")
                self._bitmaps.append(bits)
                p.sel = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(bits))
            self.params.append(p)

    def search_one(self, q: np.ndarray, qi: int, k: int) -> np.ndarray:
        params = self.params[int(self.case.which[qi])]
        _, ids = self.ivf.index.search(q[None, :], k, params=params)
        return ids[0]

    def close(self) -> None:
        self.ivf.index = None


class HnswlibFilter:
    """hnswlib (as in bench.peers) with ``knn_query(filter=fn)``. hnswlib calls ``fn`` back in
    Python for every candidate it visits: that is what filtering costs through its Python API,
    and it is reported as is. When fewer than ``k`` rows pass, hnswlib refuses to return a
    partial row, so ``k`` is lowered until it answers."""

    name = "hnswlib+filter"

    def __init__(self, build_threads: int = 1) -> None:
        self.hnsw = Hnswlib(build_threads=build_threads)
        self.allowed: list = []
        self.case: FilterCase | None = None

    def build(self, base: np.ndarray, metric: str, workload: Workload) -> None:
        self.hnsw.build(base, metric)

    def sweep(self) -> list[dict]:
        return self.hnsw.sweep()

    def set_params(self, params: dict) -> None:
        self.hnsw.set_params(params)

    def prepare(self, case: FilterCase) -> None:
        self.case = case
        # list.__getitem__ over Python bools: the cheapest callable hnswlib can call per label.
        self.allowed = [None if f is None else mask.tolist().__getitem__
                        for f, mask in zip(case.filters, case.masks)]
        self.counts = case.masks.sum(axis=1)

    def search_one(self, q: np.ndarray, qi: int, k: int) -> np.ndarray:
        f = int(self.case.which[qi])
        out = np.full(k, -1, dtype=np.int64)
        kk = min(k, int(self.counts[f]))
        while kk > 0:
            try:
                labels, _ = self.hnsw.index.knn_query(q[None, :], k=kk, num_threads=1, filter=self.allowed[f])
            except RuntimeError:  # fewer than kk passed the filter within ef
                kk -= 1
                continue
            out[:kk] = labels[0]
            break
        return out

    def close(self) -> None:
        self.hnsw.index = None


def _has_filter_api() -> bool:
    build = inspect.signature(vindex.Index.build).parameters
    search = inspect.signature(vindex.Index.search).parameters
    return "metadata" in build and "filter" in search


class VindexFiltered(Vindex):
    """vindex built with the workload's metadata (and documents) through ``Index.build``,
    searched with ``search(q, k, filter=..., max_postings=...)``; a warm block cache as in
    bench.recall_qps."""

    name = "vindex"
    #: fields each search returns beside ids (``Index.search(include=...)``)
    include: tuple[str, ...] = ()

    def build(self, base: np.ndarray, metric: str, workload: Workload) -> None:  # type: ignore[override]
        if not _has_filter_api():
            raise Unsupported("this vindex has no Index.build(metadata=...) / search(filter=...) "
                              "(issue 44's API is not on this branch)")
        import shutil

        shutil.rmtree(self.path, ignore_errors=True)
        with vindex.Index.build(self.path, base, metric=metric, metadata=workload.metadata,
                                documents=workload.documents, build_threads=self.build_threads,
                                progress=False, **self.config) as index:
            self.build_stats = index.stats()["build"]
        self.reopen()

    def prepare(self, case: FilterCase) -> None:
        self.case = case
        self.index.search(np.zeros((1, self.index.dim), np.float32) + 1, 10, filter=case.filters[0],
                          max_postings=max(MAX_POSTINGS))  # compiles this filter's path once

    def search_one(self, q: np.ndarray, qi: int, k: int) -> np.ndarray:
        res = self.index.search(q[None, :], k, filter=self.case.filter_of(qi), include=self.include,
                                **self.params)
        return np.asarray(res.ids[0], dtype=np.int64)


def _vindex(threads: int, index_dir: str, config: dict, include: tuple[str, ...]) -> VindexFiltered:
    engine = VindexFiltered(index_dir, build_threads=threads, config=config)
    engine.include = include
    return engine


#: name -> factory(build_threads, index_dir, vindex config, vindex include)
ENGINES = {
    "vindex": _vindex,
    "faiss-ivfflat": lambda threads, index_dir, config, include: FaissIVFBitmap(build_threads=threads),
    "hnswlib": lambda threads, index_dir, config, include: HnswlibFilter(build_threads=threads),
    "brute-force": lambda threads, index_dir, config, include: BruteForce(),
}
