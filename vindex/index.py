"""``vindex.Index``: the public API of one index."""
from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

import native

from . import checkpoint, layout, oplog, validation
from .build import build_postings
from .config import IndexConfig, check_metric, record_bytes
from .errors import CorruptionError, DuplicateIdError, IndexClosedError, InvalidInputError, preview
from .heads import METRIC_CODES, HeadGraph
from .idmap import DELETED, IdMap
from .progress import enabled
from .search import search as run_search
from .storage import Change, IOClass, PostingStore, open_store, records


@dataclass(frozen=True)
class SearchResult:
    """Results of a batch of queries, best first.

    ``ids`` is ``(nq, k) int64`` padded with -1; ``distances`` is ``(nq, k) float32`` padded with
    +inf: squared L2 for ``l2``, ``1 - cos`` for ``cosine``, ``-<q, x>`` for ``ip``.
    Unpacks as ``ids, distances = result``.
    """

    ids: np.ndarray
    distances: np.ndarray

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter((self.ids, self.distances))


class _Threads:
    """Use ``n`` threads in numba and faiss for the duration of a bulk operation."""

    def __init__(self, n: int):
        self.n = n or os.cpu_count() or 1

    def __enter__(self) -> None:
        import faiss
        import numba

        self._numba, self._faiss = numba.get_num_threads(), faiss.omp_get_max_threads()
        numba.set_num_threads(min(self.n, numba.config.NUMBA_NUM_THREADS))
        faiss.omp_set_num_threads(self.n)

    def __exit__(self, *exc: Any) -> None:
        import faiss
        import numba

        numba.set_num_threads(self._numba)
        faiss.omp_set_num_threads(self._faiss)


class Index:
    """An updatable, disk-resident approximate nearest-neighbour index.

    Create one with :meth:`build` (bulk), :meth:`create` (empty) or :meth:`open` (existing).
    Searches may run from many threads at once; writes are serialised.
    """

    def __init__(self, path: str, manifest: layout.Manifest, store: PostingStore, idmap: IdMap,
                 graph: HeadGraph, seq: int, build_stats: dict | None = None):
        self._path = path
        self._manifest = manifest
        self._store = store
        self._idmap = idmap
        self._graph = graph
        self._metric_code = METRIC_CODES[manifest.metric]
        self._write_lock = threading.RLock()
        self._closed = False
        self._seq = seq            # last applied log sequence number
        self._checkpoint_seq = seq  # log covered by the newest checkpoint
        self._build_stats = build_stats or {}

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def build(cls, path: str | os.PathLike, vectors: Any, ids: Any = None, *, metric: str = "l2",
              progress: bool | None = None, **config: Any) -> "Index":
        """Bulk-build an index over ``vectors`` (n, dim) at ``path`` and return it open.

        ``ids`` default to ``0..n-1``. ``progress`` shows progress bars (default: when stderr
        is a terminal). Keyword arguments set :class:`IndexConfig` fields.
        """
        metric = check_metric(metric)
        cfg = IndexConfig.from_kwargs(config)
        x = validation.matrix(vectors)
        dim = int(x.shape[1])
        exts = np.arange(x.shape[0], dtype=np.int64) if ids is None else validation.ids(ids)
        validation.same_length(exts, x)
        if metric == "cosine":
            x = validation.unit_rows(x, what="vectors")
        path = os.fspath(path)
        created = layout.prepare_new(path)
        store = None
        try:
            manifest = layout.Manifest(dim, metric, cfg)
            store = open_store(cfg.store, layout.store_path(path), record_size=record_bytes(dim),
                               cache_bytes=cfg.cache_bytes, create=True)
            idmap = IdMap(capacity=max(16, x.shape[0]))
            stats: dict = {}
            if x.shape[0]:
                show = enabled(progress)
                with _Threads(cfg.build_threads):
                    built = build_postings(x, np.arange(x.shape[0], dtype=np.int64), cfg, show)
                store.bulk_load(built.pids, built.records, built.offsets)
                idmap.allocate(exts)
                graph, stats = built.graph, built.stats
            else:
                graph = _empty_graph(dim, cfg)
            index = cls(path, manifest, store, idmap, graph, seq=0, build_stats=stats)
            index._save_checkpoint()
            if cfg.store != "memory":
                layout.write(path, manifest)
            return index
        except BaseException:
            if store is not None:
                store.close()
            if created:
                shutil.rmtree(path, ignore_errors=True)
            else:  # it was empty before we started
                for entry in os.listdir(path):
                    shutil.rmtree(os.path.join(path, entry), ignore_errors=True)
            raise

    @classmethod
    def create(cls, path: str | os.PathLike, *, dim: int, metric: str = "l2", **config: Any) -> "Index":
        """Create an empty index of dimension ``dim`` at ``path`` and return it open."""
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 1 <= dim <= 65536:
            raise validation.DimensionError(f"dim: expected an integer in 1..65536, got {dim!r}")
        return cls.build(path, np.zeros((0, int(dim)), np.float32), metric=metric, **config)

    @classmethod
    def open(cls, path: str | os.PathLike, **runtime: Any) -> "Index":
        """Open an existing index. ``runtime`` may change runtime settings such as ``cache_bytes``."""
        path = os.fspath(path)
        manifest = layout.read(path, runtime)
        cfg = manifest.config
        store = open_store(cfg.store, layout.store_path(path), record_size=record_bytes(manifest.dim),
                           cache_bytes=cfg.cache_bytes, create=False)
        try:
            seq = checkpoint.latest(path)
            if seq is None:
                raise CorruptionError(f"{path}: index has no checkpoint")
            arrays, stats = checkpoint.load(path, seq)
            idmap = IdMap.from_arrays(arrays["vid2ext"], arrays["versions"], arrays.get("id_table"))
            graph = (HeadGraph.from_arrays(arrays, cfg.graph_alpha) if arrays["head_vectors"].shape[0]
                     else _empty_graph(manifest.dim, cfg))
            index = cls(path, manifest, store, idmap, graph, seq=seq, build_stats=stats)
            for log_seq, data in store.log_since(seq):
                index._apply(oplog.decode(data))
                index._seq = log_seq
            return index
        except BaseException:
            store.close()
            raise

    # --- properties ---------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._manifest.dim

    @property
    def metric(self) -> str:
        return self._manifest.metric

    @property
    def config(self) -> IndexConfig:
        return self._manifest.config

    @property
    def path(self) -> str:
        return self._path

    def __len__(self) -> int:
        return self._idmap.n_live

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} vectors"
        return f"vindex.Index({self._path!r}, dim={self.dim}, metric={self.metric!r}, {state})"

    # --- search -------------------------------------------------------------------------------
    def search(self, queries: Any, k: int = 10, *, max_postings: int | None = None,
               eps: float | None = None, ef: int | None = None) -> SearchResult:
        """The ``k`` nearest stored vectors of each query.

        ``queries`` is ``(nq, dim)`` or one ``(dim,)`` query; results are always 2-D.
        ``max_postings`` bounds the postings a query visits, ``eps`` prunes postings whose head
        is farther than ``(1 + eps)`` times the nearest head, and ``ef`` is the head-graph beam
        width; each defaults to the index config.
        """
        self._check_open()
        cfg = self.config
        k = validation.k(k)
        m = cfg.max_postings if max_postings is None else validation.positive_int(max_postings, "max_postings", upper=4096)
        e = cfg.search_eps if eps is None else _eps(eps)
        beam = cfg.ef_for(m) if ef is None else validation.positive_int(ef, "ef", upper=65536)
        q = validation.vectors(queries, self.dim, what="queries")
        if self.metric == "cosine":
            q = validation.unit_rows(q, what="queries")
        if q.shape[0] == 0:
            return SearchResult(np.zeros((0, k), np.int64), np.zeros((0, k), np.float32))
        ids, dists = run_search(q, k, graph=self._graph, idmap=self._idmap, store=self._store,
                                metric=self._metric_code, max_postings=m, eps=e, ef=max(beam, m))
        if self.metric == "cosine":
            dists = dists * np.float32(0.5)  # |a - b|^2 = 2 - 2cos for unit vectors
        return SearchResult(ids, dists)

    # --- updates ------------------------------------------------------------------------------
    def add(self, ids: Any, vectors: Any) -> None:
        """Insert new vectors under ``ids``.

        Raises :class:`DuplicateIdError` naming any id already in the index; nothing is written
        then. Returns once the vectors are durable and visible to searches.
        """
        self._check_open()
        exts = validation.ids(ids)
        x = validation.vectors(vectors, self.dim)
        validation.same_length(exts, x)
        if exts.size == 0:
            return
        if self.metric == "cosine":
            x = validation.unit_rows(x, what="vectors")
        with self._write_lock:
            self._check_open()
            live = self._idmap.live_vids(exts)
            if (live >= 0).any():
                dup = exts[live >= 0]
                raise DuplicateIdError(f"ids already in the index: {preview(dup)}", dup)
            if (self._idmap.lookup(exts) >= 0).any():
                raise InvalidInputError("re-adding deleted ids needs upsert (not yet supported)")
            first = self._idmap.n_vids
            vids = np.arange(first, first + exts.size, dtype=np.int64)
            if self._graph.n_alive == 0:
                rec, change = self._bootstrap(x, exts, vids)
            else:
                rec, change = self._append(x, exts, vids)
            change.log = oplog.encode(rec)
            self._seq = self._store.commit(change, IOClass.UPDATE)
            self._apply(rec)

    def _append(self, x: np.ndarray, exts: np.ndarray, vids: np.ndarray) -> tuple[oplog.Record, Change]:
        cfg = self.config
        g = self._graph
        n_cand = min(cfg.replica_candidates, g.n_alive)
        cand, cand_d, _ = g.search(x, native.L2, n_cand, np.inf, cfg.ef_for(n_cand))
        reps = np.empty((x.shape[0], cfg.max_replicas), dtype=np.int32)
        reps_d = np.empty((x.shape[0], cfg.max_replicas), dtype=np.float32)
        counts = native.replicas.select(cand, cand_d, g.vectors, cfg.replica_eps, cfg.rng_factor, reps, reps_d)
        rows = np.repeat(np.arange(x.shape[0]), counts)
        heads = reps[reps >= 0]  # row-major, so aligned with ``rows``
        order = np.argsort(heads, kind="stable")
        heads, rows = heads[order], rows[order]
        recs = records.encode(vids[rows], np.zeros(rows.size, np.uint32), x[rows])
        bounds = np.flatnonzero(np.diff(heads)) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [heads.size]))
        appends = {int(heads[a]): recs[a:b].tobytes() for a, b in zip(starts, ends)}
        rec = oplog.Record(oplog.ADD, {"exts": exts}, {"first_vid": int(vids[0])})
        return rec, Change(appends=appends)

    def _bootstrap(self, x: np.ndarray, exts: np.ndarray, vids: np.ndarray) -> tuple[oplog.Record, Change]:
        """First vectors of an empty index: cluster them into the first heads."""
        built = build_postings(x, vids, self.config, show=False)
        replaces = {int(p): built.records[built.offsets[i]:built.offsets[i + 1]].tobytes()
                    for i, p in enumerate(built.pids)}
        arrays = {"exts": exts, **built.graph.arrays()}
        rec = oplog.Record(oplog.BOOTSTRAP, arrays, {"first_vid": int(vids[0])})
        return rec, Change(replaces=replaces)

    def _apply(self, rec: oplog.Record) -> None:
        """Apply a committed log record to the in-memory state (live and at replay)."""
        if rec.type == oplog.BOOTSTRAP:
            self._graph = HeadGraph.from_arrays(rec.arrays, self.config.graph_alpha)
        elif rec.type != oplog.ADD:
            raise CorruptionError(f"unknown operation log record type {rec.type!r}")
        exts = np.ascontiguousarray(rec.arrays["exts"], dtype=np.int64)
        if self._idmap.n_vids != rec.meta["first_vid"]:
            raise CorruptionError(
                f"operation log out of step: expected first vid {self._idmap.n_vids}, got {rec.meta['first_vid']}")
        self._idmap.allocate(exts)

    # --- maintenance --------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters describing the index (sizes, postings, store)."""
        self._check_open()
        g = self._graph
        limit = self.config.posting_limit(self.dim)
        stored = self._store.lengths()[: g.n]
        lengths = np.zeros(g.n, dtype=np.int64)
        lengths[: stored.shape[0]] = stored  # heads never written to have empty postings
        live_heads = lengths[g.alive[: g.n]]
        hist_edges = np.linspace(0, 2 * limit, 9).astype(np.int64)
        hist, _ = np.histogram(live_heads, bins=np.append(hist_edges, np.iinfo(np.int64).max))
        versions = self._idmap.versions[: self._idmap.n_vids]
        return {
            "dim": self.dim,
            "metric": self.metric,
            "live": len(self),
            "vids": self._idmap.n_vids,
            "deleted": int(((versions & DELETED) != 0).sum()),
            "heads": g.n_alive,
            "posting_limit": limit,
            "posting_entries": int(live_heads.sum()),
            "posting_mean": float(live_heads.mean()) if live_heads.size else 0.0,
            "posting_max": int(live_heads.max()) if live_heads.size else 0,
            "postings_over_limit": int((live_heads > limit).sum()),
            "posting_histogram": {"edges": hist_edges.tolist(), "counts": hist.tolist()},
            "replicas_mean": float(live_heads.sum() / max(1, self._idmap.n_vids)),
            "log_seq": self._seq,
            "checkpoint_seq": self._checkpoint_seq,
            "memory_bytes": self._memory_bytes(),
            "build": dict(self._build_stats),
            "store": self._store.stats(),
        }

    def _memory_bytes(self) -> int:
        g, m = self._graph, self._idmap
        return int(g.vectors.nbytes + g.nbrs.nbytes + g.alive.nbytes + m.vid2ext.nbytes
                   + m.versions.nbytes + m.table.nbytes)

    def checkpoint(self) -> None:
        """Save the in-memory state so reopening replays no log."""
        self._check_open()
        with self._write_lock:
            self._save_checkpoint()

    def _save_checkpoint(self) -> None:
        if self.config.store == "memory":
            return
        self._store.sync()
        arrays = {**self._idmap.arrays(), **self._graph.arrays()}
        checkpoint.save(self._path, self._seq, arrays, self._build_stats)
        self._store.truncate_log(self._seq)
        checkpoint.prune(self._path, self._seq)
        self._checkpoint_seq = self._seq

    def close(self) -> None:
        """Checkpoint if needed and release the store. Safe to call twice."""
        with self._write_lock:
            if self._closed:
                return
            try:
                if self._seq != self._checkpoint_seq:
                    self._save_checkpoint()
            finally:
                self._closed = True
                self._store.close()

    def _check_open(self) -> None:
        if self._closed:
            raise IndexClosedError(f"index {self._path!r} is closed")

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _empty_graph(dim: int, cfg: IndexConfig) -> HeadGraph:
    return HeadGraph(dim, cfg.graph_degree, cfg.graph_alpha, cfg.graph_entries)


def _eps(value: Any) -> float:
    if isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and value == np.inf:
        return float("inf")
    return validation.non_negative_float(value, "eps")

