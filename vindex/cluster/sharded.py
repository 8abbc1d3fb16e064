"""``vindex.cluster.ShardedIndex``: one collection split over shards, each replicated on Ray actors.

Ids route to shards by a stable hash (:mod:`.routing`); each shard's writes are numbered and
applied on all its in-sync replicas (:mod:`.shard`); a search asks one replica of each shard
and merges their top-k exactly (:mod:`.merge`). Bad input is checked here, before any shard
is written, so a call that raises changed nothing.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import numpy as np

from vindex import aps, ids as idkinds, payloads, validation
from vindex.config import MAX_SEARCH_THREADS, IndexConfig, check_metric
from vindex.errors import (IdExistsError, IndexClosedError, InvalidConfigError, InvalidInputError, UnknownIdError,
                           preview)
from vindex.filters import compile_filter
from vindex.results import GetResult, ScrollPage, SearchResult
from vindex.strids import StrIds

from . import manifest as layout, placement, routing
from .merge import merge
from .pacing import WritePacing
from .replica import PIPELINE_DEPTH
from .shard import Shard

#: Seconds a call waits for some replica of a shard to answer (restarting actors) before failing.
DEFAULT_TIMEOUT_S = 60.0
#: A scroll cursor is ``shard << CURSOR_SHIFT | the shard's own cursor``.
CURSOR_SHIFT = 48
#: Stats of the replicas that add up over shards.
_SUMMED = ("live", "tombstones", "heads", "postings", "posting_entries", "splits", "merges", "reassigns",
           "background_errors", "background_queue", "memory_bytes")


class _Repairs:
    """A background thread bringing stale replicas back into their shard's in-sync set."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stop = False
        self.shards: list[Shard] = []
        self._thread = threading.Thread(target=self._run, name="vindex-cluster-repair", daemon=True)
        self._thread.start()

    def notify(self, shard: Shard) -> None:
        self._wake.set()

    def _run(self) -> None:
        delay = 0.1
        while not self._stop:
            self._wake.wait(timeout=delay)  # woken by a replica going stale; else retry with back-off
            self._wake.clear()
            if self._stop:
                return
            pending = [s for s in self.shards if s.stale]
            for s in pending:
                try:
                    s.repair()
                except Exception:  # noqa: BLE001 - logged by the shard; retried next round
                    pass
            delay = 0.1 if not pending else min(2.0, delay * 2)

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join()


class ShardedIndex:
    """A collection over ``shards`` x ``replicas`` Ray actors, with the :class:`vindex.Index` API.

    Create one with :meth:`create`, reopen it with :meth:`open`. Thread-safe: searches run
    beside writes; writes to one shard are applied in order, shards in parallel.
    """

    def __init__(self, path: str, manifest: layout.ClusterManifest, shards: list[Shard], groups: list,
                 repairs: _Repairs):
        self._path, self._manifest, self._shards, self._groups = path, manifest, shards, groups
        self._repairs = repairs
        self._config = IndexConfig.from_kwargs(dict(manifest.config))
        self._pacing = WritePacing(self._config)
        # a thread per write in flight to each shard
        self._pool = ThreadPoolExecutor(max_workers=len(shards) * PIPELINE_DEPTH, thread_name_prefix="vindex-shard")
        self._kind_lock = threading.Lock()
        self._closed = False

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str, dim: int, metric: str = "l2", *, shards: int = 2, replicas: int = 1,
               path: str | os.PathLike, ray_address: str | None = None, id_type: str | None = None,
               actor_cpus: float | None = None, timeout: float = DEFAULT_TIMEOUT_S,
               **index_config: Any) -> "ShardedIndex":
        """Create an empty sharded collection at ``path`` (a new or empty directory, on the
        local disk of every node that runs a replica) and start its actors.

        ``ray_address``: the Ray cluster to join ("auto": the local ``ray start`` one; None:
        the one this process is connected to, or a new local one). ``actor_cpus``: CPUs each
        replica reserves (default: the cluster's free CPUs shared over the replicas, at most 1).
        ``timeout``: how long a call waits for a restarting shard. Other keyword arguments set
        each replica's :class:`vindex.IndexConfig` fields."""
        if not isinstance(name, str) or not name:
            raise InvalidInputError(f"name: expected a non-empty str, got {name!r}")
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise validation.DimensionError(f"dim: expected a positive integer, got {dim!r}")
        metric = check_metric(metric)
        shards = validation.positive_int(shards, "shards", upper=4096)
        replicas = validation.positive_int(replicas, "replicas", upper=16)
        id_type = idkinds.check_id_type(id_type)
        config = IndexConfig.from_kwargs(dict(index_config))
        if config.store == "memory":
            raise InvalidConfigError("store: a sharded collection needs a persistent store (a restarted "
                                     "replica reopens its index), got 'memory'")
        path = os.fspath(path)
        layout.prepare_new(path)
        manifest = layout.ClusterManifest(name, int(dim), metric, shards, replicas, id_type, dict(index_config))
        try:
            layout.write(path, manifest)
            return cls._start(path, manifest, ray_address, actor_cpus, timeout)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise

    @classmethod
    def open(cls, path: str | os.PathLike, *, ray_address: str | None = None, actor_cpus: float | None = None,
             timeout: float = DEFAULT_TIMEOUT_S) -> "ShardedIndex":
        """Reopen the sharded collection at ``path``: start its actors, which reopen their
        indexes; replicas that missed writes catch up from their peers before serving."""
        path = os.fspath(path)
        return cls._start(path, layout.read(path), ray_address, actor_cpus, timeout)

    @classmethod
    def _start(cls, path: str, manifest: layout.ClusterManifest, ray_address: str | None,
               actor_cpus: float | None, timeout: float) -> "ShardedIndex":
        timeout = validation.seconds(timeout, "timeout")
        placement.connect(ray_address)
        n = manifest.shards * manifest.replicas
        cpus = placement.default_actor_cpus(n) if actor_cpus is None else \
            validation.non_negative_float(actor_cpus, "actor_cpus")
        repairs = _Repairs()
        groups, shards = [], []
        try:
            for s in range(manifest.shards):
                group = placement.place_shard(manifest.replicas, cpus)
                groups.append(group)
                actors = [placement.start_replica(group, r, cpus, layout.replica_dir(path, s, r), manifest.dim,
                                                  manifest.metric, manifest.id_type, manifest.config)
                          for r in range(manifest.replicas)]
                shards.append(Shard(s, actors, timeout, repairs.notify))
            for shard in shards:  # the first open of an index compiles nothing but may replay its log
                with shard.lock:
                    shard._wait_for_a_replica(_deadline(max(timeout, 120.0)))
        except BaseException:
            repairs.close()
            _stop_actors(shards, groups)
            raise
        repairs.shards = shards
        return cls(path, manifest, shards, groups, repairs)

    # --- properties ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._manifest.name

    @property
    def dim(self) -> int:
        return self._manifest.dim

    @property
    def metric(self) -> str:
        return self._manifest.metric

    @property
    def path(self) -> str:
        return self._path

    @property
    def config(self) -> IndexConfig:
        return self._config

    @property
    def id_type(self) -> str | None:
        return self._manifest.id_type

    @property
    def shards(self) -> int:
        return self._manifest.shards

    @property
    def replicas(self) -> int:
        return self._manifest.replicas

    def __len__(self) -> int:
        return sum(self._each_shard("live"))

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.shards} shards x {self.replicas} replicas"
        return f"vindex.cluster.ShardedIndex({self.path!r}, dim={self.dim}, metric={self.metric!r}, {state})"

    # --- routing ------------------------------------------------------------------------------
    def _resolve(self, ids: Any, *, writing: bool) -> idkinds.Resolved:
        """Validated ids (a write fixes the collection's id kind if it is not yet)."""
        resolved = idkinds.resolve(self.id_type, StrIds(), ids)
        if writing and self.id_type is None and len(resolved):
            with self._kind_lock:
                if self._manifest.id_type is None:
                    self._manifest.id_type = resolved.kind
                    layout.write(self._path, self._manifest)
            if resolved.kind != self.id_type:
                resolved = idkinds.resolve(self.id_type, StrIds(), ids)
        return resolved

    def _split(self, resolved: idkinds.Resolved) -> list[tuple[int, np.ndarray, Any]]:
        """``(shard, row positions, that shard's ids)`` of every shard holding some of them."""
        keys = resolved.exts if resolved.strs is None else resolved.strs
        parts = routing.split(routing.shard_of(keys, self.shards), self.shards)
        out = []
        for s, rows in enumerate(parts):
            if rows.size:
                sub = resolved.exts[rows] if resolved.strs is None else [resolved.strs[i] for i in rows.tolist()]
                out.append((s, rows, sub))
        return out

    def _each_shard(self, method: str, *args: Any) -> list:
        started = [(shard, shard.submit(method, *args)) for shard in self._shards]
        return [shard.collect(st, method, *args) for shard, st in started]

    # --- search -------------------------------------------------------------------------------
    def search(self, queries: Any, k: int = 10, *, filter: Any = None, include: Any = (),
               max_postings: int | None = None, eps: float | None = None, ef: int | None = None,
               timeout: float | None = None, tenant: str = "default", interactive: bool | None = None,
               threads: int | None = None, rerank: int | None = None, recall_target: float | None = None
               ) -> SearchResult:
        """As :meth:`vindex.Index.search`: each shard's ``k`` nearest, merged exactly (ties
        to the smaller id). ``stats`` add up the shards' work. ``threads``, ``rerank`` and
        ``recall_target`` apply within each shard (a recall target calibrates per replica)."""
        q, k = self._queries(queries), validation.k(k)
        self.check_queries(q, k, max_postings=max_postings, eps=eps, ef=ef, threads=threads, rerank=rerank,
                           recall_target=recall_target)
        if filter is not None:
            compile_filter(filter)
        payloads.check_include(include)
        params = {"filter": filter, "include": include, "max_postings": max_postings, "eps": eps, "ef": ef,
                  "timeout": timeout, "tenant": tenant, "interactive": interactive, "threads": threads,
                  "rerank": rerank, "recall_target": recall_target}
        with self._pacing.search(q.shape[0], interactive):
            return merge(self._each_shard("search", q, k, params), k)

    def check_queries(self, queries: Any, k: int = 10, *, max_postings: int | None = None,
                      eps: float | None = None, ef: int | None = None, threads: int | None = None,
                      rerank: int | None = None, recall_target: float | None = None) -> None:
        """Raise what :meth:`search` would raise for these arguments, without searching."""
        self._queries(queries)
        k = validation.k(k)
        if threads is not None:
            validation.positive_int(threads, "threads", upper=MAX_SEARCH_THREADS)
        if rerank is not None:
            validation.rerank(rerank, k)
        if recall_target is not None:
            aps.check_target(recall_target)
        if max_postings is not None:
            validation.positive_int(max_postings, "max_postings", upper=4096)
        if eps is not None:
            validation.check_eps(eps)
        if ef is not None:
            validation.positive_int(ef, "ef", upper=65536)

    def _queries(self, x: Any, what: str = "queries") -> np.ndarray:
        self._check_open()
        v = validation.vectors(x, self.dim, what=what)
        if self.metric == "cosine":
            return validation.unit_rows(v, what=what) if v.shape[0] else v
        return validation.bounded_rows(v, what=what)

    # --- writes -------------------------------------------------------------------------------
    def upsert(self, ids: Any, vectors: Any, *, metadata: Any = None, documents: Any = None) -> None:
        """As :meth:`vindex.Index.upsert`; returns once every in-sync replica of each shard
        written has the change durable."""
        self._write("upsert", ids, vectors, metadata, documents)

    def add(self, ids: Any, vectors: Any, *, metadata: Any = None, documents: Any = None) -> None:
        """As :meth:`vindex.Index.add`: raises :class:`IdExistsError` naming ids already in
        the collection, and then writes nothing."""
        self._write("add", ids, vectors, metadata, documents)

    def _write(self, kind: str, ids: Any, vectors: Any, metadata: Any, documents: Any) -> None:
        with self._pacing.write():
            self._write_paced(kind, ids, vectors, metadata, documents)

    def _write_paced(self, kind: str, ids: Any, vectors: Any, metadata: Any, documents: Any) -> None:
        resolved = self._resolve(ids, writing=True)
        x = self._queries(vectors, "vectors")
        validation.same_length(resolved.exts, x)
        n = len(resolved)
        payloads.encode_metadata(metadata, n, self.config.max_metadata_bytes)
        payloads.encode_documents(documents, n, self.config.max_document_bytes)
        if n == 0:
            return
        metas = payloads.metadata_rows(metadata, n)  # columns too
        docs = None if documents is None else payloads.as_list(documents)
        writes = {}
        for s, rows, sub in self._split(resolved):
            pick = rows.tolist()
            writes[s] = (kind, {"ids": sub, "vectors": x[rows],
                                "metadata": None if metas is None else [metas[i] for i in pick],
                                "documents": None if docs is None else [docs[i] for i in pick]})
        if kind == "add":
            with self._holding(writes):
                self._refuse(writes, lambda found: found, IdExistsError, "ids already in the index")
                self._apply(writes, locked=True)
        else:
            self._apply(writes)

    @contextlib.contextmanager
    def _holding(self, writes: dict) -> Iterator[None]:
        """Hold the write locks of the shards in ``writes`` (in shard order: no deadlock), so
        that a check and the writes it allows see no other writer between them."""
        with contextlib.ExitStack() as stack:
            for s in sorted(writes):
                stack.enter_context(self._shards[s].lock)
                self._shards[s].settle()  # the writes in flight are in before the check
            yield

    def _refuse(self, writes: dict, bad: Any, error: type, what: str) -> None:
        """Raise ``error`` naming the ids of ``writes`` whose ``found`` flag ``bad`` selects."""
        found = {s: self._shards[s].call("get", w[1]["ids"], ()) for s, w in writes.items()}
        wrong = []
        for s, (_, f, _) in found.items():
            ids = writes[s][1]["ids"]
            mask = bad(np.asarray(f))
            wrong.extend(ids[mask].tolist() if isinstance(ids, np.ndarray) else
                         [i for i, m in zip(ids, mask.tolist()) if m])
        if wrong:
            wrong = sorted(wrong)
            raise error(f"{what}: {preview(wrong)}", wrong)

    def _apply(self, writes: dict, locked: bool = False) -> list:
        """Run each shard's write, shards in parallel; their results. Writes under the locks
        this thread holds (``locked``) run on it, one shard after the other: the pool's
        threads may all be waiting for those locks."""
        if locked:
            return [self._shards[s].write_locked(writes[s]) for s in sorted(writes)]
        futures = [self._pool.submit(self._shards[s].write, writes[s]) for s in sorted(writes)]
        return [f.result() for f in futures]

    def delete(self, ids: Any = None, *, filter: Any = None) -> int:
        """As :meth:`vindex.Index.delete`: ``ids`` or ``filter`` (one of them); how many were live."""
        self._check_open()
        if (ids is None) == (filter is None):
            raise InvalidInputError("delete: give ids or filter (one of them)")
        if filter is not None:
            compile_filter(filter)
            writes = {s: ("delete", {"filter": filter}) for s in range(self.shards)}
        else:
            resolved = self._resolve(ids, writing=False)
            writes = {s: ("delete", {"ids": sub}) for s, _, sub in self._split(resolved)}
        return sum(int(c or 0) for c in self._apply(writes))

    def set_metadata(self, ids: Any, metadata: Any, *, merge: bool = True) -> None:
        """As :meth:`vindex.Index.set_metadata`; raises :class:`UnknownIdError` naming ids not
        live, and then changes nothing."""
        resolved = self._resolve(ids, writing=False)
        n = len(resolved)
        rows = [metadata] * n if isinstance(metadata, dict) else metadata
        payloads.encode_metadata(rows, n, self.config.max_metadata_bytes)
        if n == 0:
            return
        rows = list(rows)
        writes = {s: ("set_metadata", {"ids": sub, "metadata": [rows[i] for i in pos.tolist()], "merge": merge})
                  for s, pos, sub in self._split(resolved)}
        with self._holding(writes):
            self._refuse(writes, lambda found: ~found, UnknownIdError, "set_metadata: ids not in the index")
            self._apply(writes, locked=True)

    # --- reads --------------------------------------------------------------------------------
    def get(self, ids: Any, *, include: Any = (), tenant: str = "default") -> GetResult:
        """As :meth:`vindex.Index.get`."""
        self._check_open()
        include = payloads.check_include(include)
        resolved = self._resolve(ids, writing=False)
        n = len(resolved)
        vectors = np.zeros((n, self.dim), np.float32)
        found = np.zeros(n, bool)
        included: dict[str, list] = {name: [None] * n for name in include - {"vectors"}}
        parts = self._split(resolved)
        started = [(s, rows, sub, self._shards[s].submit("get", sub, include)) for s, rows, sub in parts]
        for s, rows, sub, st in started:
            vec, fnd, inc = self._shards[s].collect(st, "get", sub, include)
            vectors[rows], found[rows] = vec, fnd
            for name, values in inc.items():
                for i, v in zip(rows.tolist(), values):
                    included[name][i] = v
        return GetResult(vectors, found, included)

    def count(self, filter: Any = None) -> int:
        """Live records, or those whose metadata matches ``filter``."""
        self._check_open()
        if filter is not None:
            compile_filter(filter)
        return sum(self._each_shard("count", filter))

    def scroll(self, filter: Any = None, *, batch: int = 1000, include: Any = (),
               cursor: int | None = None) -> Iterator[ScrollPage]:
        """Every live record (or those matching ``filter``): shard 0's in their insertion order,
        then shard 1's, and so on, at most ``batch`` a page. Each page's ``cursor`` resumes
        after it, also in another process."""
        self._check_open()
        if filter is not None:
            compile_filter(filter)
        batch = validation.positive_int(batch, "batch", upper=1_000_000)
        payloads.check_include(include)
        start = 0 if cursor is None else validation.positive_int(cursor, "cursor", lower=0, upper=1 << 62)
        shard, inner = start >> CURSOR_SHIFT, start & ((1 << CURSOR_SHIFT) - 1)
        if shard >= self.shards:
            raise InvalidInputError(f"cursor: {cursor} is not a cursor of this collection")
        return self._pages(filter, batch, include, shard, inner)

    def _pages(self, f: Any, batch: int, include: Any, shard: int, inner: int) -> Iterator[ScrollPage]:
        yielded = False
        while True:
            self._check_open()
            ids, after, included = self._shards[shard].call("scroll_page", f, batch, include, inner or None)
            if after is None:
                shard, inner = shard + 1, 0
                cursor = None if shard >= self.shards else shard << CURSOR_SHIFT
            else:
                inner = after
                cursor = shard << CURSOR_SHIFT | after
            if len(ids) or (cursor is None and not yielded):
                yielded = True
                yield ScrollPage(ids, cursor, included)
            if cursor is None:
                return

    # --- maintenance --------------------------------------------------------------------------
    def set_tenant_quota(self, tenant: str, postings_per_s: float | None, burst: float | None = None) -> None:
        """As :meth:`vindex.Index.set_tenant_quota`, on every replica: the quota holds per
        shard (a tenant's search reads postings of every shard, each shard's against its own
        bucket). Replicas that restart get it again before they serve; not stored."""
        self._check_open()
        tenant, quota = str(tenant), (postings_per_s, burst)
        for shard in self._shards:  # bad values fail on the first replica, the same everywhere
            shard.broadcast("set_tenant_quotas", {tenant: quota})
            if postings_per_s is None:
                shard.quotas.pop(tenant, None)
            else:
                shard.quotas[tenant] = quota

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every replica's background rebalancing is idle; False if ``timeout``
        seconds pass first."""
        self._check_open()
        return all(all(shard.broadcast("wait_idle", timeout)) for shard in self._shards)

    def checkpoint(self) -> None:
        self._check_open()
        for shard in self._shards:
            shard.broadcast("checkpoint")

    def stats(self) -> dict:
        """Sums over shards (one replica each) of the main counters, and ``shards``: per shard,
        its write number, in-sync replicas and each replica's own stats."""
        self._check_open()
        per_shard = []
        for shard in self._shards:
            replicas = shard.broadcast("stats")
            per_shard.append({"seq": shard.seq, "in_sync": list(shard.in_sync), "restored": shard.restored,
                              "snapshots": shard.snapshots, "writes_during_catch_up": shard.writes_during_catch_up,
                              "replicas": replicas})
        first = [p["replicas"][0] for p in per_shard if p["replicas"]]
        out: dict[str, Any] = {"dim": self.dim, "metric": self.metric, "name": self.name,
                               "shard_count": self.shards, "replica_count": self.replicas}
        for key in _SUMMED:
            out[key] = sum(int(r.get(key, 0)) for r in first)
        out["shards"] = per_shard
        return out

    def close(self) -> None:
        """Close every replica's index (checkpointing it) and stop the actors. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._repairs.close()
        self._pool.shutdown(wait=True)
        _stop_actors(self._shards, self._groups)

    def _check_open(self) -> None:
        if self._closed:
            raise IndexClosedError(f"sharded collection {self.path!r} is closed")

    def __enter__(self) -> "ShardedIndex":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _deadline(seconds: float) -> float:
    import time

    return time.monotonic() + seconds


def _stop_actors(shards: list[Shard], groups: list) -> None:
    import ray

    from .remote import result

    for shard in shards:
        refs = [a.close.remote() for a in shard.actors]
        for ref in refs:
            with contextlib.suppress(Exception):
                result(ref, timeout=60)
        for a in shard.actors:
            ray.kill(a, no_restart=True)
    for group in groups:
        with contextlib.suppress(Exception):
            placement.release(group)
