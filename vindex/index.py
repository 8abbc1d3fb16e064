"""``vindex.Index``: the public API of one index."""
from __future__ import annotations

import contextlib
import os
import shutil
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import numpy as np

from . import adaptive, aps, checkpoint, filtered, gauges, ids as idkinds, layout, oplog, payloads, validation, writes
from .build import build_postings
from .calibrations import Calibrations
from .checkpointer import Checkpointer
from .config import APS_CANDIDATES, MAX_SEARCH_THREADS, SMALL_SEARCH_QUERIES, IndexConfig, check_metric, record_bytes
from .engine import Engine
from .errors import (CorruptionError, IdExistsError, IndexClosedError, InvalidInputError,
                     UnknownIdError, preview)
from .filters import Filter, compile_filter
from .filters.memo import compile_cached
from .heads import METRIC_CODES, HeadGraph
from .idmap import DELETED, IdMap
from .iosched import IOTargets, yielding_pool
from .progress import Mode, check_mode, enabled, track, watch
from .rebalance import STALE_ARRAYS, Rebalancer, drop_orphans, policy
from .recall_monitor import RecallMonitor
from .results import GetResult, ScrollPage, SearchResult
from .search import SearchThreads, search_threads
from .searchtap import SearchTap
from .state import State
from .strids import StrIds
from .storage import Change, IOClass, open_store, records
from .verify import VerifyReport
from .verify import verify as verify_index

#: ``include`` of a search that asks for nothing beside ids and distances.
_NOTHING: frozenset[str] = frozenset()
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
#: Attempts of an optimistic ``get`` before it reads under the writers' lock.
GET_RETRIES = 3
#: Rows of metadata and documents per store write of a bulk build.
BUILD_PAYLOAD_ROWS = 10_000


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


def _shutdown(monitor: RecallMonitor, rebalancer: Rebalancer, checkpoints: Checkpointer, pool: ThreadPoolExecutor,
              store, search_pool: SearchThreads) -> None:
    """Stop the background work and release the store (``close`` or garbage collection)."""
    monitor.close()
    rebalancer.close()
    checkpoints.close()
    pool.shutdown(wait=True)
    search_pool.close()
    store.close()


class Index:
    """An updatable, disk-resident approximate nearest-neighbour index.

    Create one with :meth:`build` (bulk), :meth:`create` (empty) or :meth:`open` (existing).
    Searches may run from many threads at once and never wait for writers or for background
    rebalancing; writes are serialised.
    """

    def __init__(self, engine: Engine):
        self._engine = engine
        self._metric_code = METRIC_CODES[engine.manifest.metric]
        self._closed = False
        cfg = engine.config
        # before any thread starts: if it fails, the caller releases the store and nothing
        # has checkpointed the index that failed to open
        orphans = drop_orphans(engine)
        # replica selection for upserts; under sla its threads yield the cores to searches
        self._pool = yielding_pool("vindex-insert", cfg.io_scheduler == "sla")
        self._rebalancer = Rebalancer(engine, enabled=cfg.rebalance)
        self._plans = filtered.PlanCache(cfg.filter_cache_bytes)
        self._calibrations = Calibrations(engine.path, live=engine.state.idmap.n_live)
        if orphans:  # dropped by the background once the store can write; never reused before
            self._rebalancer.cuts.defer(orphans, {})
        self._tap = SearchTap(engine.dim)
        self._monitor = RecallMonitor(self, k=cfg.recall_k, cpu_share=cfg.recall_monitor_cpu,
                                      alert=cfg.recall_alert)
        engine.checkpoints.start_thread()
        self._search_pool = SearchThreads()
        self._finalizer = weakref.finalize(self, _shutdown, self._monitor, self._rebalancer, engine.checkpoints,
                                           self._pool, engine.store, self._search_pool)
        self._monitor.start()
        # postings left over their limit or full of garbage by an earlier process
        g = engine.state.graph
        if g.n:
            alive = np.flatnonzero(g.alive[: g.n])
            self._rebalancer.notify(policy.needing_work(engine, alive, alive))

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def build(cls, path: str | os.PathLike, vectors: Any, ids: Any = None, *, metadata: Any = None,
              documents: Any = None, id_type: str | None = None, metric: str = "l2",
              progress: bool | None = None, **config: Any) -> "Index":
        """Bulk-build an index over ``vectors`` (n, dim) at ``path`` and return it open.

        ``ids`` default to ``0..n-1``; they may be strs instead (a str-id index). ``id_type``
        ("int" or "str") fixes the kind of ids even before any is written. ``metadata`` (one
        dict or None per row) and ``documents`` (one str or None per row) are stored with the
        vectors (see :meth:`upsert`). ``progress`` shows progress bars (default: when stderr
        is a terminal). Keyword arguments set :class:`IndexConfig` fields.
        """
        metric = check_metric(metric)
        cfg = IndexConfig.from_kwargs(config)
        x = validation.matrix(vectors)
        dim = int(x.shape[1])
        id_type = idkinds.check_id_type(id_type)
        if ids is None and id_type == "str" and x.shape[0]:
            raise InvalidInputError("ids: a str-id index needs its ids (no default for string ids)")
        table = StrIds()
        resolved = (idkinds.Resolved("int", np.arange(x.shape[0], dtype=np.int64)) if ids is None
                    else idkinds.resolve(id_type, table, ids))
        idkinds.plan_new(table, resolved)
        exts = resolved.exts
        validation.same_length(exts, x)
        checked = payloads.check_metadata_rows(metadata, x.shape[0], cfg.max_metadata_bytes)
        metas = None if checked is None else checked.encoded
        docs = payloads.encode_documents(documents, x.shape[0], cfg.max_document_bytes)
        if metas is not None or docs is not None:
            payloads.require_store(cfg.store)
        x = (validation.unit_rows(x, what="vectors") if metric == "cosine"
             else validation.bounded_rows(x, what="vectors"))
        path = os.fspath(path)
        created = layout.prepare_new(path)
        store = None
        try:
            manifest = layout.Manifest(dim, metric, cfg)
            store = open_store(cfg.store, layout.store_path(path), record_size=record_bytes(dim),
                               cache_bytes=cfg.cache_bytes, resident_bytes=cfg.resident_budget(),
                               codes_bytes=cfg.codes_budget(), create=True,
                               io_scheduler=cfg.io_scheduler,
                               targets=IOTargets.of(cfg))
            idmap = IdMap(capacity=max(16, x.shape[0]))
            stats: dict = {}
            given = metas is not None or docs is not None
            for lo in range(0, x.shape[0] if given else 0, BUILD_PAYLOAD_ROWS):
                part = slice(lo, lo + BUILD_PAYLOAD_ROWS)
                store.commit(Change(payload=payloads.record_puts(
                    exts[part], None if metas is None else metas[part], None if docs is None else docs[part])),
                    IOClass.BACKGROUND)
            if x.shape[0]:
                with _Threads(cfg.build_threads):
                    built = build_postings(x, np.arange(x.shape[0], dtype=np.int64), cfg, enabled(progress))
                store.bulk_load(built.pids, built.records, built.offsets)
                idmap.allocate(exts)
                idmap.home[: x.shape[0]] = built.home
                graph, stats = built.graph, built.stats
            else:
                graph = HeadGraph(dim, cfg.graph_degree, cfg.graph_alpha, cfg.graph_entries,
                                  exact_max_heads=cfg.exact_search_max_heads)
            state = State(idmap, graph)
            state.id_type = resolved.kind if x.shape[0] else id_type
            state.strids.register(resolved.new, 0)
            if metas is not None or docs is not None:
                state.has_payload = True
                if checked is not None:
                    checked.index(state.payload, np.arange(x.shape[0], dtype=np.int64))
            engine = Engine(path, manifest, store, state, seq=0, build_stats=stats)
            engine.checkpoints.save()
            if cfg.store != "memory":
                layout.write(path, manifest)
            return cls(engine)
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
    def create(cls, path: str | os.PathLike, *, dim: int, metric: str = "l2", id_type: str | None = None,
               **config: Any) -> "Index":
        """Create an empty index of dimension ``dim`` at ``path`` and return it open.
        ``id_type`` ("int" or "str") fixes the kind of ids; by default the first write does."""
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 1 <= dim <= layout.MAX_DIM:
            raise validation.DimensionError(f"dim: expected an integer in 1..{layout.MAX_DIM}, got {dim!r}")
        return cls.build(path, np.zeros((0, int(dim)), np.float32), metric=metric, id_type=id_type, **config)

    @classmethod
    def open(cls, path: str | os.PathLike, *, progress: Mode = None, **runtime: Any) -> "Index":
        """Open an existing index. ``runtime`` may change runtime settings such as
        ``cache_bytes`` or ``rebalance``. ``progress`` reports the replay of the log since
        the last checkpoint: True/None (a bar; None only on a terminal), False, or "log"
        (log lines, for servers)."""
        path = os.fspath(path)
        progress = check_mode(progress)
        manifest = layout.read(path, runtime)
        cfg = manifest.config
        store = open_store(cfg.store, layout.store_path(path), record_size=record_bytes(manifest.dim),
                           cache_bytes=cfg.cache_bytes, resident_bytes=cfg.resident_budget(),
                           codes_bytes=cfg.codes_budget(), create=False,
                           io_scheduler=cfg.io_scheduler,
                           targets=IOTargets.of(cfg))
        try:
            seq = checkpoint.latest(path)
            if seq is None:
                raise CorruptionError(f"{path}: index has no checkpoint")
            arrays, stats = checkpoint.load(path, seq)
            exact = cfg.exact_search_max_heads
            graph = (HeadGraph.from_arrays(arrays, cfg.graph_alpha, exact_max_heads=exact)
                     if arrays["head_vectors"].shape[0]
                     else HeadGraph(manifest.dim, cfg.graph_degree, cfg.graph_alpha, cfg.graph_entries,
                                    exact_max_heads=exact))
            state = State(IdMap.from_arrays(arrays), graph, arrays.get("garbage"), arrays)
            engine = Engine(path, manifest, store, state, seq=seq, build_stats=stats)
            for log_seq, data in track(store.log_since(seq), desc=f"replaying the log of {path}",
                                       progress=progress):
                if log_seq != engine.seq + 1:
                    raise CorruptionError(f"{path}: operation log gap: record {engine.seq + 1} is "
                                          f"missing (the next one is {log_seq})")
                rec = oplog.decode(data)
                state.apply(rec)
                engine.seq = log_seq
                engine.checkpoints.ops_since += 1
            if engine.seq == seq:  # nothing happened after the checkpoint: its extras still hold
                engine.checkpoints.restored = {k: arrays[k] for k in STALE_ARRAYS if k in arrays}
            return cls(engine)
        except BaseException:
            store.close()
            raise

    # --- properties ---------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._engine.dim

    @property
    def metric(self) -> str:
        return self._engine.manifest.metric

    @property
    def config(self) -> IndexConfig:
        return self._engine.config

    @property
    def path(self) -> str:
        return self._engine.path

    @property
    def id_type(self) -> str | None:
        """"int" or "str": the kind of ids the index holds; None while it is empty and was
        created without ``id_type``."""
        return self._engine.state.id_type

    def __len__(self) -> int:
        return self._engine.state.idmap.n_live

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} vectors"
        return f"vindex.Index({self.path!r}, dim={self.dim}, metric={self.metric!r}, {state})"

    # --- search -------------------------------------------------------------------------------
    def search(self, queries: Any, k: int = 10, *, filter: Any = None, include: Any = (),
               max_postings: int | None = None, eps: float | None = None, ef: int | None = None,
               timeout: float | None = None, tenant: str = "default", interactive: bool | None = None,
               threads: int | None = None, rerank: int | None = None,
               recall_target: float | None = None) -> SearchResult:
        """The ``k`` nearest stored vectors of each query.

        ``filter`` (a dict in the filter language, docs/filters.md) restricts the results to
        records whose metadata matches it; ``include`` names what to return beside ids and
        distances: any of "metadata", "documents", "vectors" (see :class:`SearchResult`).

        ``queries`` is ``(nq, dim)`` or one ``(dim,)`` query; results are always 2-D.
        ``max_postings`` bounds the postings a query visits, ``eps`` prunes postings whose head
        is farther than ``(1 + eps)`` times the nearest head, and ``ef`` is the head-graph beam
        width; each defaults to the index config. Posting reads still queued ``timeout``
        seconds after the call are dropped and the result is ``partial``. ``tenant`` names
        whose I/O quota the reads count against. ``interactive``: someone waits for this
        search, so under ``io_scheduler="sla"`` writes and rebalancing let it finish before
        each stretch that holds the GIL (waiting at most ``interactive_p99_ms``); by default,
        searches of up to 16 queries are (larger batches are throughput work, which the
        background would otherwise fall behind). ``threads``: cores a batch's search uses
        (pieces of over 16 queries each, in parallel); default ``IndexConfig.search_threads``.
        ``rerank``: candidates per query scored exactly after a scan of int8 posting codes
        (searches of up to 16 queries; 0: float32 postings only); default ``IndexConfig.rerank``.
        ``recall_target`` (in (0, 1); default ``IndexConfig.recall_target``): each query reads
        its candidate postings nearest first and stops once its estimated recall@k reaches the
        target (``max_postings`` then bounds the candidates; docs/search-path.md).
        """
        q, k, m, e, beam, n_threads = self._search_args(queries, k, max_postings, eps, ef, threads)
        n_rerank = self._rerank_arg(rerank, k)
        target = self._recall_target(recall_target)
        if target is not None and max_postings is None:
            m = min(APS_CANDIDATES * self.config.max_postings, 4096)
        f = None if filter is None else compile_cached(filter)
        include = _NOTHING if type(include) is tuple and not include else payloads.check_include(include)
        timeout = None if timeout is None else validation.seconds(timeout, "timeout")
        if interactive is not None and not isinstance(interactive, (bool, np.bool_)):
            raise InvalidInputError(f"interactive: expected True, False or None, got {interactive!r}")
        eng = self._engine
        if q.shape[0] == 0:
            ids = np.zeros((0, k), np.int64)
            return SearchResult(idkinds.to_user(eng.state, ids), np.zeros((0, k), np.float32),
                                {"postings": 0, "records_scanned": 0, "postings_dropped": 0},
                                self._included(ids, include))
        started = time.perf_counter()
        fplan = None
        if f is not None:
            lean, fplan = self._search_gathered(q, k, m, f, include, str(tenant), started)
            if lean is not None:
                return lean
        deadline = None if timeout is None else time.monotonic() + timeout
        # postings this search may still read stay in the store; writers yield to interactive ones
        if interactive is None:
            interactive = q.shape[0] <= SMALL_SEARCH_QUERIES
        st = eng.state
        beam_given = None if ef is None else beam  # (a target's fixed count gets the config's beam for it)
        cal = None if target is None else adaptive.calibration(self, k, m, e, beam_given)
        ticket = eng.readers.begin(bool(interactive))
        try:
            choose = versions = broad = None
            if f is not None:
                if fplan.applied != st.applied:  # a write landed since: plan anew
                    with eng.readers.reading():
                        fplan = self._plans.get(st, f)
                if target is None:
                    broad = filtered.broad_budget(st.graph, fplan, m, self.config)

                def choose(queries: np.ndarray, held: bool, limit: int = m) -> tuple[np.ndarray, np.ndarray]:
                    return filtered.choose_postings(st.graph, queries, self._metric_code, fplan, limit, e,
                                                    max(beam, limit), self.config, held)

                def versions(live: np.ndarray) -> np.ndarray:
                    return fplan.versions_for(live, st.applied)
            if target is not None:
                ids, dists, work = adaptive.search(self, q, k, target, max_postings=m, eps=e, ef=beam_given, cal=cal,
                                                   threads=n_threads, deadline=deadline, tenant=str(tenant),
                                                   choose=choose, versions=versions, rerank=n_rerank)
            else:
                if broad is not None:  # the graph's nearest postings, as unfiltered (fused path included)
                    choose, m = None, broad
                ids, dists, work = search_threads(
                    q, k, threads=n_threads, pool=self._search_pool, graph=st.graph, idmap=st.idmap, store=eng.store,
                    readers=eng.readers, metric=self._metric_code, max_postings=m, eps=e, ef=max(beam, m),
                    deadline=deadline, tenant=str(tenant), choose=choose, versions=versions, rerank=n_rerank)
        finally:
            eng.readers.end(ticket)
        if f is not None:
            if st.applied != fplan.applied:  # (else every result passed the plan's mask, still current)
                ids, dists = filtered.recheck(st, f, ids, dists)
            work["filter_matches"] = fplan.matches
        if self.metric == "cosine":
            dists *= _HALF  # |a - b|^2 = 2 - 2cos for unit vectors (the search's own array)
        eng.observe_search(time.perf_counter() - started, q.shape[0])
        self._tap.searched(q)
        return SearchResult(idkinds.to_user(st, ids), dists, work,
                            self._included(ids, include, str(tenant)) if include else {})

    def _search_gathered(self, q: np.ndarray, k: int, m: int, f: Filter, include: frozenset[str], tenant: str,
                         started: float) -> tuple[SearchResult | None, filtered.FilterPlan]:
        """``(result, plan)``: ``search`` when the filter's plan scores just its matching
        records (docs/filters.md): one kernel call over their vectors, gathered once per plan
        with writers held off, so the answer is exact and current, reads no posting and needs
        no search ticket or recheck. The result is None when the plan scans postings instead."""
        eng = self._engine
        st = eng.state
        with eng.readers.reading():  # a plan and its gathered vectors: one state
            fplan = self._plans.get(st, f)
            found = filtered.gathered_for(st, eng.store, fplan, m, self.config, self.dim, tenant)
        if found is None:
            return None, fplan
        # (cosine: |a - b|^2 = 2 - 2cos for unit vectors, halved in the kernel)
        ids, dists, work = filtered.search_gathered(found, q, k, self._metric_code,
                                                    _HALF if self.metric == "cosine" else _ONE)
        work["filter_matches"] = fplan.matches
        eng.observe_search(time.perf_counter() - started, q.shape[0])
        self._tap.searched(q)
        return SearchResult(idkinds.to_user(st, ids), dists, work,
                            self._included(ids, include, tenant) if include else {}), fplan

    def _included(self, exts: np.ndarray, include: frozenset[str], tenant: str = "default") -> dict:
        """What ``include`` asks for, for internal ids ``exts`` of any shape (-1: padding):
        lists shaped like ``exts`` for metadata and documents, an array for vectors."""
        out: dict[str, Any] = {}
        flat = exts.reshape(-1).tolist()
        shape = exts.shape
        for name, kind in (("metadata", payloads.META), ("documents", payloads.DOC)):
            if name in include:
                values = payloads.read(self._engine.store, flat, kind)
                out[name] = values if len(shape) == 1 else [values[i:i + shape[1]]
                                                            for i in range(0, len(values), max(shape[1], 1))]
        if "vectors" in include:
            real = np.unique(exts[exts >= 0])
            vecs, found = self._get_vectors(real, tenant)
            rows = np.searchsorted(real, exts)
            have = exts >= 0
            have[have] = found[rows[have]]
            out["vectors"] = np.zeros((*shape, self.dim), dtype=np.float32)
            out["vectors"][have] = vecs[rows[have]]
        return out

    def set_tenant_quota(self, tenant: str, postings_per_s: float | None, burst: float | None = None) -> None:
        """Limit the posting reads of ``tenant``'s searches and gets to ``postings_per_s`` a
        second, up to ``burst`` at once (default: one second's worth; a single search larger
        than the burst still runs when the bucket is full, and leaves it in debt). A search over
        the quota raises :class:`vindex.iosched.ResourceExhaustedError` (RESOURCE_EXHAUSTED over
        gRPC) and reads nothing more. ``None`` lifts the limit. Quotas are not stored with the
        index: set them after each open (``vindex serve`` does, from its tenants file)."""
        self._check_open()
        sched = self._engine.store.scheduler
        if sched is None:
            raise ValueError(f"store {self.config.store!r} reads without an I/O scheduler: it has no quotas")
        if postings_per_s is None:
            sched.set_tenant_quota(str(tenant), None)
            return
        rate = validation.non_negative_float(postings_per_s, "postings_per_s")
        size = None if burst is None else validation.non_negative_float(burst, "burst")
        if rate <= 0 or (size is not None and size < 1):
            raise ValueError(f"postings_per_s must be > 0 and burst >= 1, got {postings_per_s!r} and {burst!r}")
        sched.set_tenant_quota(str(tenant), rate, size)

    def check_queries(self, queries: Any, k: int = 10, *, max_postings: int | None = None,
                      eps: float | None = None, ef: int | None = None, threads: int | None = None,
                      recall_target: float | None = None) -> None:
        """Raise what :meth:`search` would raise for these arguments, without searching."""
        self._search_args(queries, k, max_postings, eps, ef, threads)
        self._recall_target(recall_target)

    def _recall_target(self, value: Any) -> float | None:
        """The validated recall target of a search: ``value``, else the config's (None: none)."""
        value = self.config.recall_target if value is None else value
        return None if value is None else aps.check_target(value)

    def _search_args(self, queries: Any, k: Any, max_postings: Any, eps: Any, ef: Any, threads: Any = None
                     ) -> tuple[np.ndarray, int, int, float, int, int]:
        """Validated ``(queries, k, max_postings, eps, ef, threads)`` with the config's defaults."""
        self._check_open()
        cfg = self.config
        k = validation.k(k)
        m = cfg.max_postings if max_postings is None else validation.positive_int(max_postings, "max_postings", upper=4096)
        e = cfg.search_eps if eps is None else validation.check_eps(eps)
        beam = cfg.ef_for(m) if ef is None else validation.positive_int(ef, "ef", upper=65536)
        n_threads = (cfg.search_threads if threads is None
                     else validation.positive_int(threads, "threads", upper=MAX_SEARCH_THREADS))
        return self._vectors(queries, "queries"), k, m, e, beam, n_threads

    def _rerank_arg(self, rerank: Any, k: int) -> int:
        """Validated ``rerank`` (0, or at least ``k``), with the config's default."""
        if rerank is None:
            return self.config.rerank_for(k)
        return validation.rerank(rerank, k)

    def _vectors(self, x: Any, what: str) -> np.ndarray:
        return validation.search_rows(x, self.dim, unit=self.metric == "cosine", what=what)

    # --- updates ------------------------------------------------------------------------------
    def upsert(self, ids: Any, vectors: Any, *, metadata: Any = None, documents: Any = None) -> None:
        """Insert ``ids`` or replace their records. Returns once the change is durable and
        visible: a search that starts afterwards never sees a replaced vector.

        ``metadata``: one dict (JSON-compatible: str keys; str, int, float, bool, None, lists
        of those, nested dicts) or None per row, or columns: a mapping of key to one value per
        row (a list, numpy array or pyarrow array) or a pyarrow Table, where None (null) leaves
        the key out of that row; ``documents``: one str or None per row (a list, or a numpy or
        pyarrow array). They are written atomically with the vectors. An upsert replaces the whole record: a row
        written without metadata or a document has none afterwards (see :meth:`set_metadata`
        to change metadata alone)."""
        self._write(ids, vectors, metadata, documents, replace=True)

    def add(self, ids: Any, vectors: Any, *, metadata: Any = None, documents: Any = None) -> None:
        """Insert new ids (as :meth:`upsert`). Raises :class:`IdExistsError` naming ids already
        in the index; nothing is written then. Ids deleted earlier may be added again."""
        self._write(ids, vectors, metadata, documents, replace=False)

    def _write(self, ids: Any, vectors: Any, metadata: Any, documents: Any, *, replace: bool) -> None:
        self._check_open()
        eng = self._engine
        resolved = idkinds.resolve(eng.state.id_type, eng.state.strids, ids)
        x = self._vectors(vectors, "vectors")
        validation.same_length(resolved.exts, x)
        n = len(resolved)
        metas = payloads.check_metadata_rows(metadata, n, self.config.max_metadata_bytes)
        docs = payloads.encode_documents(documents, n, self.config.max_document_bytes)
        if metas is not None or docs is not None:
            payloads.require_store(self.config.store)
        if n == 0:
            return
        with self._paced_write():
            with eng.lock:
                self._check_open()
                if resolved.kind != (eng.state.id_type or resolved.kind):  # another writer fixed the kind first
                    resolved = idkinds.resolve(eng.state.id_type, eng.state.strids, ids)
                idkinds.plan_new(eng.state.strids, resolved)
                exts = resolved.exts
                if not replace:
                    live = eng.state.idmap.live_vids(exts) >= 0
                    if live.any():
                        dup = sorted(resolved.user(live))
                        raise IdExistsError(f"ids already in the index: {preview(dup)}", dup)
                old_homes = self._homes_of(exts)
                # the replica search runs on the upsert pool's threads, unless searches are missing
                # their target: each thread's hand-backs of the GIL add to a search's waits
                pool = self._pool if eng.update_pacer.on_target else None
                rec, change, undo = writes.plan_upsert(eng.state, exts, x, self.config, pool,
                                                       self._rebalancer.limbo_pids)
                writes.attach_ids(rec, eng.state, resolved.kind, resolved.new)
                writes.attach_payload(rec, change, eng.state, exts, metas, docs)
                try:
                    eng.commit(change, rec, IOClass.UPDATE, graph_done=undo is not None)
                except BaseException:
                    if undo is not None:
                        undo()
                    raise
                seq = eng.seq
                written = np.asarray(list(change.appends) + list(change.replaces), dtype=np.int64)
                self._after_write(written, old_homes)
                self._rebalancer.earn_scrub(int(exts.size))
                self._tap.rows_written += n
            eng.acknowledge(seq)

    def delete(self, ids: Any = None, *, filter: Any = None) -> int:
        """Delete ``ids``, or every record whose metadata matches ``filter`` (give one of
        them); returns how many were live. Unknown or already deleted ids are ignored. Returns
        once durable: no search that starts afterwards returns them."""
        self._check_open()
        if (ids is None) == (filter is None):
            raise InvalidInputError("delete: give ids or filter (one of them)")
        eng = self._engine
        f = None if filter is None else compile_filter(filter)
        exts = None if f is not None else idkinds.resolve(eng.state.id_type, eng.state.strids, ids).exts
        with self._paced_write():
            with eng.lock:
                self._check_open()
                if f is not None:
                    with eng.readers.reading():
                        vids = np.flatnonzero(self._plans.get(eng.state, f).allowed)
                    exts = eng.state.idmap.vid2ext[vids]
                planned = writes.plan_delete(eng.state, exts)
                if planned is None:
                    return 0
                rec, change = planned
                old_homes = self._homes_of(exts)
                eng.commit(change, rec, IOClass.UPDATE)
                seq = eng.seq
                self._after_write(np.zeros(0, np.int64), old_homes)
                deleted = int(rec.arrays["d_vids"].shape[0])
                self._tap.rows_deleted += deleted
            eng.acknowledge(seq)
        return deleted

    @contextlib.contextmanager
    def _paced_write(self) -> Iterator[None]:
        """Around a write (its wait for the writers' lock and for durability included): under
        ``io_scheduler="sla"``, foreground writes get a share of wall time that shrinks (to
        70% at least) while small searches miss their p99 target, and the writer pauses after
        the write, GIL released, once it has used its share. Writers overlapping (threads
        waiting for each other's lock) are charged the wall time during which some write ran,
        not the sum of their times, which at full duty would pause them for as long as they
        overlap."""
        eng = self._engine
        eng.write_time.enter()
        try:
            yield
        finally:
            seconds = eng.write_time.leave()
        pause = eng.update_pacer.charge(seconds)
        if pause > 0:
            time.sleep(pause)

    def _homes_of(self, exts: np.ndarray) -> np.ndarray:
        vids = self._engine.state.idmap.live_vids(exts)
        homes = self._engine.state.idmap.home[vids[vids >= 0]]
        return np.unique(homes[homes >= 0]).astype(np.int64)

    def _after_write(self, written: np.ndarray, old_homes: np.ndarray) -> None:
        """Queue postings a write pushed over their limit or filled with garbage."""
        self._rebalancer.notify(policy.needing_work(self._engine, written, old_homes))

    def get(self, ids: Any, *, include: Any = (), tenant: str = "default") -> GetResult:
        """Stored vectors of ``ids``: ``(vectors (n, dim) float32, found (n,) bool)``; rows of
        ids not found are zero. Cosine indexes store (and return) unit vectors. ``include``:
        "metadata" and/or "documents" to return as well (``.metadata``, ``.documents``)."""
        self._check_open()
        include = payloads.check_include(include)
        exts = idkinds.resolve(self._engine.state.id_type, self._engine.state.strids, ids).exts
        vectors, found = self._get_vectors(exts, str(tenant))
        live = np.where(found, exts, -1)
        return GetResult(vectors, found, self._included(live, include - {"vectors"}))

    def _get_vectors(self, exts: np.ndarray, tenant: str) -> tuple[np.ndarray, np.ndarray]:
        """``get`` by internal ids (-1: never seen)."""
        for _ in range(GET_RETRIES):
            out = self._get(exts, tenant)
            if out is not None:
                return out
        with self._engine.lock:  # the copies moved under us each time: read with writers held off
            out = self._get(exts, tenant)
        if out is None:
            raise CorruptionError("a live vector is missing from its home posting")
        return out

    def _get(self, exts: np.ndarray, tenant: str) -> tuple[np.ndarray, np.ndarray] | None:
        eng = self._engine
        idm = eng.state.idmap
        with eng.readers.search(), eng.readers.reading():
            vids = idm.live_vids(exts)
            found = vids >= 0
            out = np.zeros((exts.shape[0], self.dim), dtype=np.float32)
            if not found.any():
                return out, found
            want = vids[found]
            want_versions = idm.versions[want]
            homes = np.unique(idm.home[want]).astype(np.int64)
            batch = eng.store.read(homes, IOClass.INTERACTIVE, tenant=tenant)
            recs_f, recs_u = records.view(batch.data, self.dim)
        order = np.argsort(want)
        pos = np.searchsorted(want[order], recs_u[:, 0])
        pos = np.minimum(pos, want.shape[0] - 1)
        hit = (want[order][pos] == recs_u[:, 0]) & (want_versions[order][pos] == recs_u[:, 1])
        rows = np.full(want.shape[0], -1, dtype=np.int64)
        rows[order[pos[hit]]] = np.flatnonzero(hit)
        if (rows < 0).any():
            return None
        out[found] = recs_f[rows, records.HEADER_WORDS:]
        return out, found

    # --- metadata ----------------------------------------------------------------------------
    def set_metadata(self, ids: Any, metadata: Any, *, merge: bool = True) -> None:
        """Change the metadata of live ``ids`` without sending their vectors again.

        ``metadata``: one dict per id, or a single dict for all of them. ``merge=True`` sets
        the given top-level keys and keeps the others; ``merge=False`` replaces the metadata.
        Raises :class:`UnknownIdError` naming ids that are not live; nothing changes then."""
        self._check_open()
        eng = self._engine
        resolved = idkinds.resolve(eng.state.id_type, eng.state.strids, ids)
        n = len(resolved)
        rows = [metadata] * n if isinstance(metadata, dict) else metadata
        given = payloads.check_metadata_rows(rows, n, self.config.max_metadata_bytes)
        payloads.require_store(self.config.store)
        if n == 0:
            return
        with self._paced_write():
            with eng.lock:
                self._check_open()
                vids = eng.state.idmap.live_vids(resolved.exts)
                if (vids < 0).any():
                    missing = resolved.user(vids < 0)
                    raise UnknownIdError(f"set_metadata: ids not in the index: {preview(missing)}", missing)
                metas = given
                exts = resolved.exts.tolist()
                if merge:
                    old = payloads.read(eng.store, exts, payloads.META)
                    merged = [{**(o or {}), **(g or {})} for o, g in zip(old, given.rows)]  # type: ignore[union-attr]
                    metas = payloads.check_metadata_rows(merged, n, self.config.max_metadata_bytes)
                docs = payloads.read_raw(eng.store, exts, payloads.DOC)  # the record's value holds both
                rec, change = writes.plan_set_metadata(eng.state, vids, resolved.exts, metas, docs)  # type: ignore[arg-type]
                eng.commit(change, rec, IOClass.UPDATE)
                seq = eng.seq
            eng.acknowledge(seq)

    def count(self, filter: Any = None) -> int:
        """Live records, or those whose metadata matches ``filter``."""
        self._check_open()
        if filter is None:
            return len(self)
        f = compile_filter(filter)
        with self._engine.readers.reading():
            return self._plans.get(self._engine.state, f).matches

    def scroll(self, filter: Any = None, *, batch: int = 1000, include: Any = (),
               cursor: int | None = None) -> Iterator[ScrollPage]:
        """Every live record (or those matching ``filter``), ``batch`` per page, in a stable
        order (that of their first insertion). Each page's ``cursor`` resumes the scroll after
        it (``scroll(..., cursor=page.cursor)``), also in another process."""
        self._check_open()
        f = None if filter is None else compile_filter(filter)
        batch = validation.positive_int(batch, "batch", upper=1_000_000)
        include = payloads.check_include(include)
        start = 0 if cursor is None else validation.positive_int(cursor, "cursor", lower=0, upper=1 << 62)
        return self._pages(f, batch, include, start)

    def _pages(self, f: Filter | None, batch: int, include: frozenset[str], start: int) -> Iterator[ScrollPage]:
        eng = self._engine
        while True:
            self._check_open()
            with eng.readers.reading():
                idm = eng.state.idmap
                n = idm.n_vids
                if f is None:
                    live = (idm.versions[start:n] & DELETED) == 0
                else:
                    live = self._plans.get(eng.state, f).allowed[start:n]
                vids = start + np.flatnonzero(live)[:batch]
                exts = idm.vid2ext[vids]
            more = vids.shape[0] == batch and bool(live[vids[-1] - start + 1:].any())
            cursor = int(vids[-1]) + 1 if more else None
            ids = idkinds.to_user(eng.state, exts)
            yield ScrollPage(ids.tolist() if ids.dtype == object else ids, cursor, self._included(exts, include))
            if cursor is None:
                return
            start = cursor

    # --- maintenance --------------------------------------------------------------------------
    def wait_idle(self, timeout: float | None = None, *, progress: Mode = False) -> bool:
        """Wait until background rebalancing has nothing queued or running (nor a build of
        the posting codes that a search started after open); False if
        ``timeout`` seconds pass first. Raises the failure of a background round that starts
        after the call and fails (the work is retried, so a call after the cause is gone
        returns True; a round already running when it came is not held against it).
        ``progress`` shows the backlog draining (see :meth:`open`; default: nothing)."""
        self._check_open()
        started = time.monotonic()
        with watch(f"background work of {self.path}", lambda: self._rebalancer.depth, check_mode(progress)):
            idle = self._rebalancer.wait_idle(timeout)
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        idle = self._engine.checkpoints.wait_idle(left) and idle
        wait_codes = getattr(self._engine.store, "wait_codes", None)  # a build of the codes begun (RocksDB store)
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        return (wait_codes is None or wait_codes(left)) and idle

    def pause_background(self) -> contextlib.AbstractContextManager[None]:
        """A context in which no background rebalancing round starts (one already running
        finishes first). Writes go on and queue their work, which runs once the last open
        pause ends. For measurements that must not give the background extra time, and
        short maintenance windows: postings grow past their limit meanwhile, and
        ``wait_idle`` inside it waits for work that cannot run."""
        self._check_open()
        return self._rebalancer.hold()

    def stats(self) -> dict:
        """Counters describing the index: sizes, postings, rebalancing, store."""
        self._check_open()
        eng = self._engine
        g, idm = eng.state.graph, eng.state.idmap
        limit = eng.limit
        alive = np.flatnonzero(g.alive[: g.n])
        lengths = eng.lengths(alive)
        hist_edges = np.linspace(0, 2 * limit, 9).astype(np.int64)
        hist, _ = np.histogram(lengths, bins=np.append(hist_edges, np.iinfo(np.int64).max))
        bg = dict(self._rebalancer.counters)
        return {
            "dim": self.dim,
            "metric": self.metric,
            "live": len(self),
            "tombstones": idm.n_deleted,
            "retired_vids": idm.n_retired,
            "vids": idm.n_vids,
            "heads": g.n_alive,
            "postings": int((lengths > 0).sum()),
            "posting_limit": limit,
            "posting_entries": int(lengths.sum()),
            "posting_mean": float(lengths.mean()) if lengths.size else 0.0,
            "posting_max": int(lengths.max()) if lengths.size else 0,
            "postings_over_limit": int((lengths > limit).sum()),
            "posting_histogram": {"edges": hist_edges.tolist(), "counts": hist.tolist()},
            "replicas_mean": float(lengths.sum() / max(1, len(self))),
            "rebalance": self.config.rebalance,
            "splits": bg["splits"], "merges": bg["merges"], "reassigns": bg["reassigns"],
            "reassigns_overtaken": bg["reassign_overtaken"],
            "gc": bg["gc"], "drops": bg["drops"], "background_rounds": bg["rounds"],
            "stale_copies": self._rebalancer.stale_copies,
            "background_errors": bg["errors"] + eng.checkpoints.errors, "background_queue": self._rebalancer.depth,
            "scrub_pending": self._rebalancer.scrub_pending,
            "scrubbed": bg["scrubbed"], "scrub_rechecked": bg["scrub_rechecked"],
            "log_seq": eng.seq,
            "checkpoint_seq": eng.checkpoints.seq,
            "checkpoints": eng.checkpoints.count,
            "durability": self.config.durability,
            "io_scheduler": self.config.io_scheduler,
            "background_duty": eng.pacer.duty,
            "background_paused_s": eng.pacer.paused_s,
            "update_duty": eng.update_pacer.duty,
            "update_paused_s": eng.update_pacer.paused_s,
            "fsyncs": eng.group.syncs,
            "memory_bytes": gauges.state_bytes(eng),
            "recall": self._monitor.estimate(),
            "build": dict(eng.build_stats),
            "store": eng.store.stats(),
        }

    def metrics(self) -> dict:
        """Counters and gauges for monitoring (docs/observability.md): searches, queries and
        rows written so far, live vectors, postings, the background backlog by kind, the I/O
        scheduler's queues and yields, bytes on disk and in memory, RSS, the recall estimate.
        Cheap enough for every scrape; searches pay only two counter increments for it."""
        self._check_open()
        return gauges.collect(self._engine, self._rebalancer, self._tap, self._monitor)

    def check_recall(self, queries: int | None = None) -> dict:
        """Run one recall-monitor pass now over ``queries`` sampled queries (default 256;
        recent searches, else stored vectors) and return the estimate as ``stats()["recall"]``
        shows it: ``recall`` (mean recall@k of the last 256 queries checked), its 95%
        interval ``low``..``high``, ``samples``, ``source``, ``passes``."""
        self._check_open()
        n = None if queries is None else validation.positive_int(queries, "queries", upper=100_000)
        self._monitor.check(n)
        return self._monitor.estimate()

    def verify(self, *, progress: Mode = False) -> "VerifyReport":
        """Check the index's invariants (see :mod:`vindex.verify`) and report each violation.

        Writers wait while it runs; searches do not. Postings over their limit count as a
        violation only when rebalancing is on and has nothing queued. Raises
        :class:`CorruptionError` when the store fails its checksums. ``progress`` reports
        the postings read (see :meth:`open`; default: nothing)."""
        self._check_open()
        progress = check_mode(progress)
        with self._engine.lock:
            idle = self.config.rebalance and self._rebalancer.depth == 0
            return verify_index(self._engine, limbo=self._rebalancer.limbo_pids, check_limits=idle,
                                progress=progress)

    def checkpoint(self) -> None:
        """Save the in-memory state so reopening replays no log."""
        self._check_open()
        with self._engine.lock:
            self._engine.checkpoints.save()

    def close(self) -> None:
        """Stop background work, checkpoint if needed and release the store. Safe to call
        twice. Queued rebalancing resumes when the index is opened again."""
        eng = self._engine
        with eng.lock:
            if self._closed:
                return
            self._closed = True
        self._calibrations.close()
        self._monitor.close()
        self._rebalancer.close()
        eng.checkpoints.close()
        try:
            with eng.lock:
                if eng.seq != eng.checkpoints.seq:
                    eng.checkpoints.save()
        finally:
            self._finalizer()

    def _check_open(self) -> None:
        if self._closed:
            raise IndexClosedError(f"index {self.path!r} is closed")

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
