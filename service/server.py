"""The gRPC server: ``vindex.v1.VectorIndex`` over the collections in one data directory.

grpc.aio serves the network on one event loop; every call's index work (numba kernels that
release the GIL, RocksDB reads and writes) runs on a thread pool, so a long search or a
durable write never blocks the loop. Health reports SERVING only once the kernels are compiled
and every collection is open; SIGTERM/SIGINT reports NOT_SERVING, refuses new calls with
UNAVAILABLE, lets running calls finish, then checkpoints and closes every collection.
:class:`~service.admission.AdmissionInterceptor` caps calls in flight per client and overall,
request bytes in flight and idle streams, never refusing health checks or reflection.
With a tenants file, :class:`~service.tenants.TenantInterceptor` authenticates every call by
its API key, checks its RPC class and charges its quota before the servicer sees it; TLS
(optionally mutual) comes from PEM files.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

import vindex
from vindex import errors
from vindex.config import SMALL_SEARCH_QUERIES
from vindex.iosched import lower_thread_priority

from . import vindex_pb2 as pb
from . import vindex_pb2_grpc as pb_grpc
from .admission import Admission, AdmissionInterceptor
from .batching import Rows, SearchBatcher
from .collections import Collections, Sharding
from .decoding import decode_request_ids, decode_vectors, values_sent
from .logs import add_key_digests
from .payloads import decode_documents, decode_filter, decode_metadata, encode_rows, from_struct
from .status import RequestTooLargeError, code_for, library_error, message, trailers
from .tenants import TenantInterceptor, current_tenant, load_tenants
from .tls import server_credentials

log = logging.getLogger("vindex.service")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["VectorIndex"].full_name
MESSAGE_BYTES = 64 * 1024 * 1024
#: Seconds before a search's gRPC deadline at which its still-queued reads are dropped.
DEADLINE_MARGIN_S = 0.005


@dataclass(frozen=True)
class Limits:
    """Per-request caps (the 64 MiB message limit applies as well) and admission caps."""

    max_rows: int = 100_000          # ids or vectors in one upsert, delete or get; records in a scroll page
    max_queries: int = 10_000        # queries in one search
    max_k: int = 1024
    max_results: int = 1_000_000     # queries x k in one search (bounds the response size)
    max_search_threads: int = 0      # SearchRequest.threads allowed; 0: the machine's CPU cores
    # admission (service/admission.py); health checking and reflection are never refused
    max_concurrent_rpcs: int = 256   # calls in flight, all clients together
    max_client_rpcs: int = 64        # calls in flight of one client (tenant, or peer address)
    max_inflight_bytes: int = 512 << 20  # request bytes being worked on, all calls together
    inflight_wait_s: float = 1.0     # how long a request waits for room in that budget
    stream_idle_timeout_s: float = 30.0  # an UpsertStream sending nothing this long is ended


def grpc_options() -> list[tuple[str, Any]]:
    return [("grpc.max_receive_message_length", MESSAGE_BYTES),
            ("grpc.max_send_message_length", MESSAGE_BYTES)]


# --- request parsing ----------------------------------------------------------------------------
class Undecodable:
    """A request whose bytes are not a valid message of its type (garbage, truncated, invalid
    UTF-8 in a string field). Parsing never raises: grpc would answer UNKNOWN; the handler
    answers INVALID_ARGUMENT instead."""

    def __init__(self, type_name: str, error: BaseException):
        self.type_name, self.error = type_name, error

    def exception(self) -> errors.InvalidInputError:
        return errors.InvalidInputError(
            f"request: not a valid {self.type_name} message ({type(self.error).__name__}: {self.error})")


def _parser(cls: Any) -> Callable[[bytes], Any]:
    def parse(raw: bytes) -> Any:
        try:
            return cls.FromString(raw)
        except Exception as e:  # DecodeError, and whatever else malformed bytes raise
            return Undecodable(cls.DESCRIPTOR.full_name, e)
    return parse


async def _refuse(context: grpc.aio.ServicerContext, bad: Undecodable) -> None:
    exc = bad.exception()
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message(exc), trailing_metadata=trailers(exc))


def _unary(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await _refuse(context, request)
        return await fn(request, context)
    return handler


def _streaming(fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def handler(request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[Any]:
        async def requests() -> AsyncIterator[Any]:
            async for request in request_iterator:
                if isinstance(request, Undecodable):
                    await _refuse(context, request)  # after the chunks before it were acknowledged
                yield request

        async for response in fn(requests(), context):
            yield response
    return handler


def add_servicer(servicer: pb_grpc.VectorIndexServicer, server: grpc.aio.Server) -> None:
    """``pb_grpc.add_VectorIndexServicer_to_server``, but with requests that fail to parse
    answered INVALID_ARGUMENT (grpc's own deserialization failure is UNKNOWN)."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["VectorIndex"].methods:
        request_cls = getattr(pb, method.input_type.name)
        response_cls = getattr(pb, method.output_type.name)
        fn = getattr(servicer, method.name)
        if method.client_streaming and method.server_streaming:
            make, fn = grpc.stream_stream_rpc_method_handler, _streaming(fn)
        elif not method.client_streaming and not method.server_streaming:
            make, fn = grpc.unary_unary_rpc_method_handler, _unary(fn)
        else:
            raise NotImplementedError(f"{method.full_name}: only unary and bidirectional RPCs are served")
        handlers[method.name] = make(fn, request_deserializer=_parser(request_cls),
                                     response_serializer=response_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def decode_config(text: str) -> dict:
    """``CreateCollectionRequest.config_json`` as keyword arguments for ``IndexConfig``."""
    try:
        config = json.loads(text) if text else {}
    except (ValueError, RecursionError) as e:  # JSONDecodeError; ints over 4300 digits; deep nesting
        raise errors.InvalidConfigError(f"config_json: not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(config, dict):
        raise errors.InvalidConfigError(f"config_json: expected a JSON object, got {text!r}")
    for key in ("dim", "metric"):
        if key in config:
            raise errors.InvalidConfigError(f"config_json: set {key!r} as its own field, not in config")
    for key, value in config.items():
        # no setting is meaningful beyond 64 bits; the store's own arguments overflow past them
        if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
            raise errors.InvalidConfigError(f"config {key}: expected a 64-bit integer, got {value}")
    return config


def collection_info(name: str, index: vindex.Index) -> pb.CollectionInfo:
    return pb.CollectionInfo(name=name, dim=index.dim, metric=index.metric, count=len(index),
                             config_json=json.dumps(dataclasses.asdict(index.config)), id_type=index.id_type or "")


#: Scroll page size when a request leaves ``batch`` 0 (the library's default).
SCROLL_BATCH = 1000
#: Room for the vectors of a Get response (the rest of the 64 MiB is for everything else).
RESPONSE_BYTES = MESSAGE_BYTES - (1 << 20)


def _include(request: Any) -> tuple[str, ...]:
    return tuple(request.include)


def _id_type(ids: Any) -> str:
    """"str" for the ids of a collection of string ids (an object array or a list), else "int"."""
    return "str" if isinstance(ids, list) or getattr(ids, "dtype", None) == object else "int"


def encode_ids(message: Any, ids: Any) -> None:
    """Result ids into ``message.ids`` or (string ids; None padding as "") ``message.str_ids``."""
    message.id_type = _id_type(ids)
    flat = np.asarray(ids, dtype=object if message.id_type == "str" else np.int64).ravel().tolist()
    if message.id_type == "str":
        message.str_ids.extend("" if i is None else i for i in flat)
    else:
        message.ids.extend(flat)


def encode_included(message: Any, result: Any, include: tuple[str, ...], lo: int = 0, hi: int | None = None,
                    flat: bool = False) -> None:
    """The included fields of ``result`` (rows ``lo:hi``) into ``message``; ``flat``: the
    result's per-row lists are per query (of ``k``) and are flattened query by query."""
    def rows(values: Any) -> list:
        part = list(values[lo:hi])
        return [v for per_query in part for v in per_query] if flat else part

    encode_rows(message, rows(result.metadata) if "metadata" in include else None,
                rows(result.documents) if "documents" in include else None)
    if "vectors" in include:
        x = np.asarray(result.vectors[lo:hi], dtype="<f4")
        message.dim = x.shape[-1] if x.ndim > 1 else 0
        message.vectors = np.ascontiguousarray(x).tobytes()


def check_response_size(message: Any, what: str) -> Any:
    """``message``, or ``RequestTooLargeError`` when it would not fit in a response."""
    size = message.ByteSize()
    if size > MESSAGE_BYTES:
        raise RequestTooLargeError(f"{what}: the response would take {size} bytes, over the 64 MiB limit; "
                                   f"ask for fewer records or include less")
    return message


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


# --- the servicer -------------------------------------------------------------------------------
class VectorIndexServicer(pb_grpc.VectorIndexServicer):
    def __init__(self, collections: Collections, pool: ThreadPoolExecutor, limits: Limits,
                 update_pool: ThreadPoolExecutor | None = None):
        self.collections, self.pool, self.limits = collections, pool, limits
        self.update_pool = update_pool or pool  # upserts and deletes
        self.batcher = SearchBatcher(pool, max_running=os.cpu_count() or 1)
        self.ready = False
        self.stopping = False
        self.active = 0                  # calls running index work (drained before stopping)
        self.idle = asyncio.Event()
        self.idle.set()

    async def _call(self, context: grpc.aio.ServicerContext, fn: Callable[..., Any], *args: Any,
                    coroutine: Callable[[], Awaitable[Any]] | None = None,
                    pool: ThreadPoolExecutor | None = None) -> Any:
        """Run ``fn`` on ``pool`` (default: the pool searches use) or await ``coroutine()``,
        answering library errors with their status codes."""
        if self.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        if not self.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is starting (warming up kernels)")
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before the call started")
        self.active += 1
        self.idle.clear()
        try:
            if coroutine is not None:
                return await coroutine()
            return await asyncio.get_running_loop().run_in_executor(pool or self.pool, fn, *args)
        except Exception as e:
            e = library_error(e)  # a plain OSError of a full disk answers as the StorageError it is
            code = code_for(e)
            if code != grpc.StatusCode.INTERNAL:  # the message says it all: no traceback
                await context.abort(code, message(e), trailing_metadata=trailers(e))
            log.exception("internal error")
            detail = message(e) if isinstance(e, errors.VindexError) else message(f"{type(e).__name__}: {e}")
            await context.abort(grpc.StatusCode.INTERNAL, detail,
                                trailing_metadata=trailers(e) if isinstance(e, errors.VindexError) else ())
        finally:
            self.active -= 1
            if not self.active:
                self.idle.set()

    # collections
    async def CreateCollection(self, request, context):
        def run():
            config = decode_config(request.config_json)
            index = self.collections.create(request.name, dim=request.dim, metric=request.metric or "l2",
                                            config=config, if_not_exists=request.if_not_exists,
                                            id_type=request.id_type or None)
            return collection_info(request.name, index)
        return await self._call(context, run)

    async def DropCollection(self, request, context):
        return pb.DropCollectionResponse(dropped=await self._call(context, self.collections.drop, request.name))

    async def ListCollections(self, request, context):
        def run():
            out = []
            for name in self.collections.names():
                try:
                    with self.collections.use(name) as index:
                        out.append(collection_info(name, index))
                except errors.IndexNotFoundError:
                    pass  # dropped meanwhile
                except errors.CorruptionError:
                    pass  # damaged: calls naming it answer DATA_LOSS
            return pb.ListCollectionsResponse(collections=out)
        return await self._call(context, run)

    async def DescribeCollection(self, request, context):
        def run():
            with self.collections.use(request.name) as index:
                return collection_info(request.name, index)
        return await self._call(context, run)

    # updates
    def _upsert(self, request: pb.UpsertRequest, name: str) -> int:
        ids = decode_request_ids(request, self.limits.max_rows)
        n = len(ids)
        x = decode_vectors(request.vectors, request.float_vectors, request.dim, n, "vectors",
                           self.limits.max_rows, rows_are="ids")
        metadata = decode_metadata(request, n, self.limits.max_rows)
        documents = decode_documents(request, n, self.limits.max_rows)
        with self.collections.use(name) as index:
            (index.add if request.add_only else index.upsert)(ids, x, metadata=metadata, documents=documents)
        return n

    async def Upsert(self, request, context):
        return pb.UpsertResponse(upserted=await self._call(context, self._upsert, request, request.collection,
                                                           pool=self.update_pool))

    async def UpsertStream(self, request_iterator, context) -> AsyncIterator[pb.UpsertAck]:
        total, name = 0, ""
        chunk = -1
        async for request in request_iterator:
            chunk += 1
            name = request.collection or name
            n = await self._call(context, self._upsert, request, name, pool=self.update_pool)
            total += n
            yield pb.UpsertAck(chunk=chunk, upserted=n, total=total)

    async def Delete(self, request, context):
        def run():
            ids = decode_request_ids(request, self.limits.max_rows)
            where = decode_filter(request)
            if where is not None and len(ids):
                raise errors.InvalidInputError("ids and filter: set one of them, not both")
            with self.collections.use(request.collection) as index:
                return index.delete(filter=where) if where is not None else index.delete(ids)
        return pb.DeleteResponse(deleted=await self._call(context, run, pool=self.update_pool))

    async def SetMetadata(self, request, context):
        def run():
            ids = decode_request_ids(request, self.limits.max_rows)
            n, sent = len(ids), len(request.metadata)
            if sent not in (1, n):
                raise errors.LengthMismatchError(f"metadata: {sent} for {n} ids; expected one per id, or one for all")
            metadata = from_struct(request.metadata[0]) if sent == 1 else [from_struct(m) for m in request.metadata]
            with self.collections.use(request.collection) as index:
                index.set_metadata(ids, metadata, merge=not request.replace)
            return pb.SetMetadataResponse(updated=n)
        return await self._call(context, run, pool=self.update_pool)

    async def Get(self, request, context):
        tenant = self.tenant_of(context)

        def run():
            ids = decode_request_ids(request, self.limits.max_rows)
            include = _include(request)
            with self.collections.use(request.collection) as index:
                if len(ids) * index.dim * 4 > RESPONSE_BYTES:
                    raise RequestTooLargeError(
                        f"ids: {len(ids)} vectors of dimension {index.dim} exceed the 64 MiB response limit; "
                        f"ask for at most {RESPONSE_BYTES // (4 * index.dim)} per request")
                res = index.get(ids, include=include, tenant=tenant)
                x, found = res
                out = pb.GetResponse(vectors=np.ascontiguousarray(x, "<f4").tobytes(), dim=index.dim,
                                     found=found.tolist())
            encode_included(out, res, tuple(f for f in include if f != "vectors"))
            return check_response_size(out, "ids")
        return await self._call(context, run)

    async def Count(self, request, context):
        def run():
            where = decode_filter(request)
            with self.collections.use(request.collection) as index:
                return pb.CountResponse(count=index.count(where))
        return await self._call(context, run)

    async def Scroll(self, request, context):
        def run():
            where, include = decode_filter(request), _include(request)
            batch = request.batch or SCROLL_BATCH
            if batch > self.limits.max_rows:
                raise RequestTooLargeError(f"batch: at most {self.limits.max_rows} records per page, got {batch}")
            cursor = _page_cursor(request.page_token)
            with self.collections.use(request.collection) as index:
                pages = index.scroll(where, batch=batch, include=include, cursor=cursor)
                try:
                    page = next(pages, None)
                finally:
                    getattr(pages, "close", lambda: None)()  # a generator: let it clean up now
                id_type = index.id_type or "int"
            out = pb.ScrollResponse(id_type=id_type)
            if page is None:  # nothing (left) to scroll
                return out
            encode_ids(out, page.ids)
            encode_included(out, page, include)
            if page.cursor is not None:
                out.next_page_token = str(page.cursor)
            return check_response_size(out, "batch")
        return await self._call(context, run)

    # search
    async def Search(self, request, context):
        name, k = request.collection, request.k
        params: dict[str, Any] = {}
        if request.max_postings:
            params["max_postings"] = request.max_postings
        if request.ef:
            params["ef"] = request.ef
        if request.HasField("eps"):
            params["eps"] = float(request.eps)
        if request.threads:
            params["threads"] = request.threads
        if request.HasField("recall_target"):
            params["recall_target"] = float(request.recall_target)
        include, where = _include(request), decode_filter(request)  # the library checks both

        tenant = self.tenant_of(context)
        remaining = context.time_remaining()
        # reads still queued when the call's deadline is near are dropped (a partial result
        # beats DEADLINE_EXCEEDED); the margin leaves time to answer
        deadline = None if remaining is None else time.monotonic() + max(remaining - DEADLINE_MARGIN_S, 1e-3)

        def search(q: np.ndarray, deadline: float | None = deadline, interactive: bool | None = None
                   ) -> vindex.SearchResult:
            timeout = None if deadline is None else max(deadline - time.monotonic(), 1e-6)
            with self.collections.use(name) as index:
                return index.search(q, k, filter=where, include=include, timeout=timeout, tenant=tenant,
                                    interactive=interactive, **params)

        def respond(rows: Rows) -> pb.SearchResponse:
            res, lo, hi = rows
            out = pb.SearchResponse(nq=hi - lo, k=k, distances=res.distances[lo:hi].ravel().tolist(),
                                    postings=res.stats.get("postings", 0),
                                    records_scanned=res.stats.get("records_scanned", 0),
                                    partial=res.partial, postings_dropped=res.stats.get("postings_dropped", 0))
            encode_ids(out, res.ids[lo:hi])
            encode_included(out, res, include, lo, hi, flat=True)
            return check_response_size(out, "queries x k")

        def alone(res: vindex.SearchResult) -> pb.SearchResponse:
            return respond(Rows(res, 0, res.ids.shape[0]))

        def checked() -> np.ndarray:
            if not 1 <= k <= self.limits.max_k:
                raise errors.InvalidKError(f"k: expected an integer in 1..{self.limits.max_k}, got {k}")
            cap = self.limits.max_search_threads or os.cpu_count() or 1
            if request.threads > cap:
                raise errors.InvalidKError(f"threads: expected an integer in 1..{cap} (the server's "
                                           f"--max-search-threads), got {request.threads}")
            q = decode_vectors(request.queries, request.float_queries, request.dim, request.nq or None, "queries",
                               self.limits.max_queries, rows_are="nq")
            if q.shape[0] * k > self.limits.max_results:
                raise RequestTooLargeError(f"queries x k: at most {self.limits.max_results} results per request, "
                                           f"got {q.shape[0]} x {k}")
            with self.collections.use(name) as index:
                index.check_queries(q, k, **params)  # a bad row must not fail a coalesced batch
            return q

        async def coalesced() -> pb.SearchResponse:
            if values_sent(request.queries, request.float_queries) > SMALL_SEARCH_QUERIES * max(1, request.dim):
                # a batch already: checked and run on the pool, off the event loop
                return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: alone(search(checked())))
            q = checked()  # small: cheap enough for the event loop
            if q.shape[0] == 0:  # (a small request has at most SMALL_SEARCH_QUERIES rows)
                return alone(await asyncio.get_running_loop().run_in_executor(self.pool, search, q))
            # one filter and one include per batch: the library takes one of each per call
            key = (name, k, tenant, tuple(sorted(params.items())), json.dumps(where, sort_keys=True), include)
            # a coalesced batch is many small requests, each waited for: interactive at any size
            rows = await self.batcher.search(key, lambda qs, d: search(qs, d, interactive=True), q, deadline)
            return await asyncio.get_running_loop().run_in_executor(self.pool, respond, rows) if include \
                else respond(rows)  # payloads take a while to encode: off the event loop

        return await self._call(context, None, coroutine=coalesced)

    def tenant_of(self, context: grpc.aio.ServicerContext) -> str:
        """The tenant a call's storage requests are charged to: the one its API key names
        (:class:`TenantInterceptor` authenticated it), or "default" without tenants."""
        state = current_tenant()
        return "default" if state is None else state.name

    # maintenance
    async def Stats(self, request, context):
        state = current_tenant()
        tenant = None if state is None else state.snapshot()  # the caller's own counters only

        def run():
            with self.collections.use(request.collection) as index:
                stats = index.stats()
                if tenant is not None:
                    stats["tenant"] = tenant
                return pb.StatsResponse(stats_json=json.dumps(stats, default=_json_default))
        return await self._call(context, run)

    async def Flush(self, request, context):
        remaining = context.time_remaining()

        def run():
            with self.collections.use(request.collection) as index:
                idle = index.wait_idle(None if remaining is None else max(0.0, remaining - 0.5),
                                       progress="log") if request.wait_idle else True
                index.checkpoint()
                return pb.FlushResponse(idle=idle)
        return await self._call(context, run)


def _page_cursor(token: str) -> int | None:
    """The library cursor a Scroll ``page_token`` carries (None for the first page)."""
    if not token:
        return None
    if token.isascii() and token.isdigit() and len(token) <= 19 and int(token) < 2**63:
        return int(token)
    raise errors.InvalidInputError(f"page_token: expected the next_page_token of a previous Scroll "
                                   f"response, got {token[:64]!r}")


# --- server lifecycle ---------------------------------------------------------------------------
@dataclass
class ServerConfig:
    data_dir: str = "./vindex-data"
    host: str = "127.0.0.1"
    port: int = 50051
    workers: int = 0                 # search/update threads; 0 = 2 x CPU cores
    limits: Limits = Limits()
    grace_s: float = 30.0            # how long SIGTERM lets running calls finish
    sample: str | None = None        # load this bundled data set as a collection if absent
    tenants: str | None = None       # tenants file (service/tenants.py); None: no authentication
    tls_cert: str | None = None      # PEM certificate chain; with tls_key, serve TLS only
    tls_key: str | None = None       # PEM private key
    tls_client_ca: str | None = None  # PEM CA bundle: require client certificates it signed
    sharding: Sharding | None = None  # serve --ray: collections sharded over Ray actors
    metrics_port: int | None = None  # serve Prometheus metrics on this port (0: any free one)


class Server:
    """A running server; ``await start()``, then ``await wait()`` until stopped."""

    def __init__(self, config: ServerConfig, on_ready: Callable[["Server"], None] | None = None):
        self.config = config
        self.on_ready = on_ready
        # bad tenants or TLS files fail here, before the data directory is locked
        self.tenants = load_tenants(config.tenants) if config.tenants else None
        if self.tenants is not None:  # the keys never reach a log line, whoever logs them
            add_key_digests(d for s in self.tenants.states.values() for d in s.tenant.key_digests)
        self.credentials = server_credentials(config)
        workers = config.workers or 2 * (os.cpu_count() or 1)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vindex-rpc")
        # Upserts and deletes run on threads of their own at a lower CPU priority, so that on
        # a machine with few cores an ingest does not take the cores searches need.
        self.update_pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vindex-update",
                                              initializer=lower_thread_priority)
        self.collections = Collections(config.data_dir, sharding=config.sharding,
                                       on_open=None if self.tenants is None else self.tenants.apply_io_quotas)
        self.servicer = VectorIndexServicer(self.collections, self.pool, config.limits, self.update_pool)
        self.health = health_aio.HealthServicer()
        # admission is ours, not grpc's maximum_concurrent_rpcs: that one global counter also
        # refuses health checks, and idle streams could fill it
        self.admission = Admission(config.limits)
        interceptors: list[grpc.aio.ServerInterceptor] = [
            AdmissionInterceptor(self.admission, SERVICE_NAME, self.tenants)]  # outermost: see its docstring
        self.metrics_registry = self._metrics(interceptors) if config.metrics_port is not None else None
        self.metrics_http: Any = None
        if self.tenants is not None:
            interceptors.append(TenantInterceptor(self.tenants, SERVICE_NAME))
        self.server = grpc.aio.server(options=grpc_options(), interceptors=interceptors)
        add_servicer(self.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self.server)
        self.port = 0
        self._stopped = asyncio.Event()
        self._stopping = False
        self._start_done = asyncio.Event()   # clear while start() runs: stop() waits for it
        self._start_done.set()

    def _metrics(self, interceptors: list[grpc.aio.ServerInterceptor]) -> Any:
        """The Prometheus registry: RPC metrics (an interceptor just inside admission) and
        each collection's ``Index.metrics()`` read at scrape time."""
        from . import metrics

        registry = metrics.require().CollectorRegistry()
        interceptors.append(metrics.MetricsInterceptor(metrics.ServiceMetrics(registry), SERVICE_NAME,
                                                       self.collections.has))
        registry.register(metrics.IndexCollector(self.collections.open_indexes,
                                                 lambda: dict(self.admission.refused)))
        return registry

    async def start(self) -> None:
        """Listen (health NOT_SERVING), warm up and open collections, then report SERVING."""
        self._start_done.clear()
        try:
            await self._start()
        finally:
            self._start_done.set()

    async def _start(self) -> None:
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{self.config.host}:{self.config.port}"
        self.port = (self.server.add_insecure_port(address) if self.credentials is None
                     else self.server.add_secure_port(address, self.credentials))
        if self.port == 0:
            raise OSError(f"cannot listen on {address}")
        if self.credentials is not None:
            log.info("TLS on%s", " with client certificates required" if self.config.tls_client_ca else "")
        if self.tenants is not None:
            log.info("loaded %d tenant(s) from %s: %s", len(self.tenants), self.config.tenants,
                     ", ".join(self.tenants.names()))
            if self.credentials is None and self.config.host not in ("127.0.0.1", "localhost", "::1"):
                log.warning("API keys travel in plaintext: serve with --tls-cert and --tls-key")
        await self.server.start()
        if self.metrics_registry is not None:
            from .metrics import serve_http

            self.metrics_http = serve_http(self.config.metrics_port, self.config.host, self.metrics_registry)
            log.info("metrics on http://%s:%d/metrics", self.config.host, self.metrics_http.server_port)
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        await loop.run_in_executor(self.pool, vindex.warmup)
        names = await loop.run_in_executor(self.pool, self.collections.open_all)
        if self.config.sample:
            from .sample import load_sample

            name = await loop.run_in_executor(self.pool, load_sample, self.collections, self.config.sample)
            if name not in names:
                names.append(name)
        if self._stopping:  # SIGTERM while starting: stop() takes over once we return
            return
        frozen = vindex.freeze_heap()  # full GC passes then skip start-up's objects (see vindex.gcpause)
        log.debug("froze %d objects out of the garbage collector's full passes", frozen)
        self.servicer.ready = True
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving %d collection(s) on %s:%d (ready in %.1f s)", len(names), self.config.host,
                 self.port, time.perf_counter() - t0)
        if self.on_ready:
            self.on_ready(self)

    async def stop(self) -> None:
        """Graceful stop: NOT_SERVING, refuse new calls, finish running ones, close collections.

        While running calls drain, health answers NOT_SERVING and new calls get UNAVAILABLE
        from the servicer; the listener closes only after that (or after ``grace_s``)."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        await self.health.enter_graceful_shutdown()
        self.servicer.stopping = True
        await self._start_done.wait()  # a start() in progress finishes opening collections first
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.grace_s
        try:
            await asyncio.wait_for(self.servicer.idle.wait(), self.config.grace_s)
        except asyncio.TimeoutError:
            pass
        await self.server.stop(max(0.0, deadline - loop.time()))
        if self.metrics_http is not None:
            self.metrics_http.shutdown()
            self.metrics_http.server_close()
        # on a thread of its own: calls that outlived the grace period may hold every worker
        await asyncio.get_running_loop().run_in_executor(None, self.collections.close)
        self.update_pool.shutdown(wait=True)
        self.pool.shutdown(wait=True)
        self._stopped.set()

    async def wait(self) -> None:
        await self._stopped.wait()


async def serve_async(config: ServerConfig, on_ready: Callable[[Server], None] | None = None) -> None:
    """Run a server until SIGTERM or SIGINT, then stop it gracefully."""
    server = Server(config, on_ready)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(server.stop()))
    try:
        await server.start()
    except BaseException:
        await server.stop()
        raise
    await server.wait()
    log.info("stopped")


def serve(config: ServerConfig, on_ready: Callable[[Server], None] | None = None) -> None:
    asyncio.run(serve_async(config, on_ready))
