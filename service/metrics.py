"""Prometheus metrics of ``vindex serve --metrics-port``.

Two sources, one registry, served by prometheus_client's own HTTP server:

* :class:`MetricsInterceptor` counts every ``VectorIndex`` call by method, collection,
  tenant and status code, times it (a histogram per method and collection) and counts search
  responses that are partial. It sits just inside admission, so a call admission refuses is
  counted there (``vindex_admission_refused_total``), not here.
* :class:`IndexCollector` reads ``Index.metrics()`` of every open collection at scrape time
  (no thread of its own), plus admission's refusals.

prometheus-client is optional (the ``metrics`` extra): :func:`require` names what to install.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable, Iterator

import grpc

from .grants import collection_named
from .tenants import current_tenant

#: Latency buckets (seconds): a one-query search takes about a millisecond, a large upsert seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
#: ``Index.metrics()`` keys that only grow: exported as counters (``..._total``).
COUNTERS = frozenset({"searches", "queries", "rows_written", "rows_deleted", "splits", "merges", "reassigns",
                      "background_rounds", "background_errors", "io_yields", "io_completed", "io_dropped",
                      "recall_monitor_passes", "recall_monitor_busy_s", "recall_monitor_cpu_s"})
#: The label of a collection the server does not have (keeps typos out of the label space).
UNKNOWN = "(unknown)"


def require() -> Any:
    """The prometheus_client module, or an ImportError saying how to get it."""
    try:
        import prometheus_client
    except ImportError:
        raise ImportError("--metrics-port needs the prometheus-client package: pip install 'vindex[metrics]'") \
            from None
    return prometheus_client


class ServiceMetrics:
    """The RPC metrics, registered in ``registry``."""

    def __init__(self, registry: Any):
        prom = require()
        labels = ("method", "collection", "tenant")
        self.calls = prom.Counter("vindex_rpc", "Calls by method, collection, tenant and status code",
                                  (*labels, "code"), registry=registry)
        self.latency = prom.Histogram("vindex_rpc_seconds", "Call latency in seconds, from the handler's start",
                                      ("method", "collection"), buckets=LATENCY_BUCKETS, registry=registry)
        self.partial = prom.Counter("vindex_search_partial", "Searches answered with a partial result "
                                    "(reads dropped at the deadline)", ("collection", "tenant"), registry=registry)

    def observe(self, method: str, collection: str, code: grpc.StatusCode, seconds: float) -> None:
        tenant = _tenant()
        self.calls.labels(method, collection, tenant, code.name).inc()
        self.latency.labels(method, collection).observe(seconds)

    def partial_result(self, collection: str) -> None:
        self.partial.labels(collection, _tenant()).inc()


def _tenant() -> str:
    state = current_tenant()  # set by the tenant interceptor inside this one, in this task
    return "default" if state is None else state.name


def _code(context: grpc.aio.ServicerContext, error: BaseException | None) -> grpc.StatusCode:
    """The status a call ended with: what ``abort`` set, OK without error, else UNKNOWN."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):  # some grpc versions keep the raw number
        return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    if error is None:
        return grpc.StatusCode.OK
    return grpc.StatusCode.CANCELLED if isinstance(error, asyncio.CancelledError) else grpc.StatusCode.UNKNOWN


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts and times the calls of ``service`` into ``metrics``; ``known(name)`` says whether
    a collection exists (other names are labelled ``UNKNOWN``)."""

    def __init__(self, metrics: ServiceMetrics, service: str, known: Callable[[str], bool]):
        self.metrics, self.prefix, self.known = metrics, f"/{service}/", known

    def _label(self, rpc: str, request: Any) -> str:
        name = collection_named(rpc, request)
        return "" if name is None else name if self.known(name) else UNKNOWN

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails
                                ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self.prefix):
            return handler
        rpc = details.method[len(self.prefix):]
        if not handler.request_streaming and not handler.response_streaming:
            return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary, rpc),
                                                       request_deserializer=handler.request_deserializer,
                                                       response_serializer=handler.response_serializer)
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(self._stream(handler.stream_stream, rpc),
                                                         request_deserializer=handler.request_deserializer,
                                                         response_serializer=handler.response_serializer)
        return handler

    def _unary(self, behavior: Callable, rpc: str) -> Callable:
        metrics = self.metrics

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            error: BaseException | None = None
            try:
                response = await behavior(request, context)
            except BaseException as e:
                error = e
                raise
            finally:
                collection = self._label(rpc, request)
                metrics.observe(rpc, collection, _code(context, error), time.perf_counter() - started)
            if rpc == "Search" and getattr(response, "partial", False):
                metrics.partial_result(collection)
            return response
        return call

    def _stream(self, behavior: Callable, rpc: str) -> Callable:
        metrics = self.metrics

        async def call(request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[Any]:
            started = time.perf_counter()
            first: list[Any] = []

            async def requests() -> AsyncIterator[Any]:
                async for request in request_iterator:
                    if not first:
                        first.append(request)
                    yield request

            error: BaseException | None = None
            try:
                async for response in behavior(requests(), context):
                    yield response
            except BaseException as e:
                error = e
                raise
            finally:
                collection = self._label(rpc, first[0]) if first else ""
                metrics.observe(rpc, collection, _code(context, error), time.perf_counter() - started)
        return call


class IndexCollector:
    """A custom collector: ``Index.metrics()`` of each open collection, read when scraped.

    ``indexes()`` yields ``(name, index)`` of the open collections; ``refused()`` gives
    admission's refusals by reason."""

    def __init__(self, indexes: Callable[[], Iterator[tuple[str, Any]]],
                 refused: Callable[[], dict[str, int]] | None = None):
        self.indexes, self.refused = indexes, refused

    def describe(self) -> list:
        return []  # unknown until scraped: keeps registration from collecting

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        families: dict[str, Any] = {}

        def family(key: str, extra: tuple[str, ...]) -> Any:
            if key not in families:
                kind = CounterMetricFamily if key in COUNTERS else GaugeMetricFamily
                families[key] = kind(f"vindex_{key}", f"Index.metrics()[{key!r}] per collection",
                                     labels=("collection", *extra))
            return families[key]

        for name, index in self.indexes():
            try:
                values = index.metrics()
            except Exception:  # closed or dropped between listing and reading
                continue
            for key, value in values.items():
                if isinstance(value, dict):
                    for sub, v in value.items():
                        family(key, ("io_class",)).add_metric((name, str(sub)), float(v))
                elif value is not None and not isinstance(value, str):
                    family(key, ()).add_metric((name,), float(value))
        yield from families.values()
        if self.refused is not None:
            refused = CounterMetricFamily("vindex_admission_refused", "Calls admission refused, by reason",
                                          labels=("reason",))
            for reason, n in self.refused().items():
                refused.add_metric((reason,), float(n))
            yield refused


def serve_http(port: int, host: str, registry: Any) -> Any:
    """Serve ``registry`` on ``host:port`` with prometheus_client's HTTP server (a thread of
    its own); returns the server (``shutdown()`` stops it, ``server_port`` is the port)."""
    httpd, _ = require().start_http_server(port, addr=host, registry=registry)
    return httpd
