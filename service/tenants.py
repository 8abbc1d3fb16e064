"""Tenants: who may call the service, which RPCs, on which collections, and how much.

A tenants file (JSON) names each tenant, its API keys, its classes, its collections and its quota::

    {"tenants": [
       {"name": "search-app", "api_keys": ["..."], "classes": ["interactive"], "collections": ["docs", "app.*"],
        "quota": {"queries_per_s": 200, "burst": 50, "postings_per_s": 10000}},
       {"name": "admin", "api_key_sha256": ["<64 hex digits>"], "classes": ["interactive", "update", "admin"]}
    ]}

Every call to ``vindex.v1.VectorIndex`` carries its key in the metadata ``x-api-key`` (or
``authorization: Bearer <key>``); :class:`TenantInterceptor` answers a missing or unknown key
UNAUTHENTICATED and an RPC outside the tenant's classes PERMISSION_DENIED, both before the
request is parsed; once grpc has parsed it, a request (or stream message) naming a collection
outside the tenant's grants (service/grants.py) is PERMISSION_DENIED too, and ListCollections
shows only granted collections. Health checking and reflection stay open. Quotas are token
buckets per tenant (searches spend one token per query, writes one per row) plus an optional
cap on calls in flight; a refusal is RESOURCE_EXHAUSTED naming the tenant and the quota, with
the wait in the ``grpc-retry-pushback-ms`` trailer. Keys are kept only as SHA-256 digests and
compared with ``hmac.compare_digest``. Quota state is touched on the server's event loop only,
so it needs no locks.
"""
from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import hmac
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterable

import grpc

from vindex import errors
from vindex.iosched import TokenBucket

from . import vindex_pb2 as pb
from .collections import NAME_RE
from .decoding import values_sent
from .grants import Grants, collection_named
from .status import QuotaExceededError, message, trailers

#: RPC classes and the ``vindex.v1.VectorIndex`` RPCs each one allows.
CLASSES: dict[str, tuple[str, ...]] = {
    "interactive": ("Search", "Get", "Count", "Scroll", "DescribeCollection", "ListCollections", "Stats"),
    "update": ("Upsert", "UpsertStream", "Delete", "SetMetadata", "Flush"),
    "admin": ("CreateCollection", "DropCollection"),
}
RPC_CLASS: dict[str, str] = {rpc: cls for cls, rpcs in CLASSES.items() for rpc in rpcs}
#: Services callable without a key: health checks (load balancers, grpc_health_probe) and
#: reflection (grpcurl; it shows only the schema).
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
API_KEY_HEADER = "x-api-key"
KEY_RE = re.compile(r"[\x21-\x7e]+")   # printable ASCII, no spaces: what gRPC metadata carries
HEX_RE = re.compile(r"[0-9a-fA-F]{64}")
_TENANT_KEYS = {"name", "api_keys", "api_key_sha256", "classes", "collections", "quota"}
_QUOTA_KEYS = {"queries_per_s", "burst", "rows_per_s", "burst_rows", "postings_per_s", "burst_postings",
               "max_in_flight"}


class TenantConfigError(errors.InvalidConfigError):
    """A tenants file that does not parse or validate; the message names the field."""


@dataclass(frozen=True)
class Quota:
    """Per-tenant limits; ``None`` is unlimited.

    ``queries_per_s`` tokens a second up to ``burst`` pay for searches (one per query, at least
    one per call); ``rows_per_s`` up to ``burst_rows`` pay for Upsert, UpsertStream chunks,
    Delete and SetMetadata (one per id; a delete by filter costs none); ``max_in_flight`` caps the
    tenant's calls running at once (a stream counts for its whole length). Get, Count, Scroll,
    Describe, List, Stats and Flush are limited by
    ``max_in_flight`` only. ``postings_per_s`` up to ``burst_postings`` is an I/O quota,
    enforced by each collection's I/O scheduler: the postings its searches and gets read (a
    search of ``max_postings`` 64 reads up to 64 per query)."""

    queries_per_s: float | None = None
    burst: float | None = None           # default: max(1, queries_per_s)
    rows_per_s: float | None = None
    burst_rows: float | None = None      # default: max(1, rows_per_s)
    postings_per_s: float | None = None
    burst_postings: float | None = None  # default: max(1, postings_per_s)
    max_in_flight: int | None = None


@dataclass(frozen=True)
class Tenant:
    name: str
    classes: frozenset[str]
    quota: Quota
    key_digests: tuple[bytes, ...] = dataclasses.field(repr=False)
    grants: Grants = dataclasses.field(default_factory=Grants.everything)  # "collections" left out: all


# --- loading and validation ----------------------------------------------------------------------
#: Largest quota number accepted (keeps every value a finite float).
MAX_NUMBER = 1e12


def _number(where: str, value: Any, *, least: float, strict: bool = False, integer: bool = False) -> float:
    """``value`` if it is a number (an integer if ``integer``) ``>= least`` (``> least`` if
    ``strict``) and at most ``MAX_NUMBER``."""
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    ok = ok and (value > least if strict else value >= least) and value <= MAX_NUMBER  # NaN fails too
    if not ok:
        what = "an integer" if integer else "a number"
        raise TenantConfigError(f"{where}: expected {what} {'>' if strict else '>='} {least:g} and <= "
                                f"{MAX_NUMBER:g}, got {value!r}")
    return value


def _strings(where: str, value: Any, secret: bool = False) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        got = type(value).__name__ if secret else repr(value)  # never echo a key
        raise TenantConfigError(f"{where}: expected a list of strings, got {got}")
    return value


def _unknown(where: str, obj: dict, allowed: set[str]) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise TenantConfigError(f"{where}: unknown key(s) {extra}; expected some of {sorted(allowed)}")


def _quota(where: str, raw: Any) -> Quota:
    if not isinstance(raw, dict):
        raise TenantConfigError(f"{where}: expected an object, got {type(raw).__name__}")
    _unknown(where, raw, _QUOTA_KEYS)
    q: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("queries_per_s", "rows_per_s", "postings_per_s"):
            q[key] = float(_number(f"{where}.{key}", value, least=0, strict=True))
        elif key in ("burst", "burst_rows", "burst_postings"):  # one call of one query or row must fit
            q[key] = float(_number(f"{where}.{key}", value, least=1))
        else:
            q[key] = int(_number(f"{where}.{key}", value, least=1, integer=True))
    for burst, rate in (("burst", "queries_per_s"), ("burst_rows", "rows_per_s"),
                        ("burst_postings", "postings_per_s")):
        if burst in q and rate not in q:
            raise TenantConfigError(f"{where}.{burst}: set only with {rate}")
        if rate in q and burst not in q:
            q[burst] = max(1.0, float(q[rate]))
    return Quota(**q)


def _tenant(where: str, raw: Any) -> Tenant:
    if not isinstance(raw, dict):
        raise TenantConfigError(f"{where}: expected an object, got {type(raw).__name__}")
    name = raw.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise TenantConfigError(f"{where}.name: expected 1-64 characters from [A-Za-z0-9_.-] starting with a "
                                f"letter or digit, got {name!r}")
    where = f"{where} ({name})"
    _unknown(where, raw, _TENANT_KEYS)
    digests = []
    for i, key in enumerate(_strings(f"{where}.api_keys", raw.get("api_keys", []), secret=True)):
        if not KEY_RE.fullmatch(key):
            raise TenantConfigError(f"{where}.api_keys[{i}]: expected printable ASCII without spaces "
                                    f"(what gRPC metadata can carry)")
        digests.append(hashlib.sha256(key.encode()).digest())
    for i, hexed in enumerate(_strings(f"{where}.api_key_sha256", raw.get("api_key_sha256", []), secret=True)):
        if not HEX_RE.fullmatch(hexed):
            raise TenantConfigError(f"{where}.api_key_sha256[{i}]: expected 64 hex digits (a SHA-256), got "
                                    f"{len(hexed)} characters (not echoed: it may be a key)")
        digests.append(bytes.fromhex(hexed))
    if not digests:
        raise TenantConfigError(f"{where}: expected at least one key in api_keys or api_key_sha256")
    if "classes" not in raw:
        raise TenantConfigError(f"{where}.classes: missing; expected some of {sorted(CLASSES)}")
    classes = _strings(f"{where}.classes", raw["classes"])
    bad = [c for c in classes if c not in CLASSES]
    if bad or not classes or len(set(classes)) != len(classes):
        raise TenantConfigError(f"{where}.classes: expected distinct names from {sorted(CLASSES)}, got {classes!r}")
    quota = _quota(f"{where}.quota", raw["quota"]) if "quota" in raw else Quota()
    grants = Grants.everything()
    if "collections" in raw:
        patterns = _strings(f"{where}.collections", raw["collections"])
        try:
            grants = Grants.parse(patterns)
        except ValueError as e:
            raise TenantConfigError(f"{where}.collections{e}") from None
    return Tenant(name, frozenset(classes), quota, tuple(digests), grants)


def parse_tenants(doc: Any, source: str = "tenants") -> list[Tenant]:
    """Validate a decoded tenants document; ``source`` prefixes every error message."""
    if not isinstance(doc, dict):
        raise TenantConfigError(f"{source}: expected an object with a 'tenants' list, got {type(doc).__name__}")
    _unknown(source, doc, {"tenants"})
    raw = doc.get("tenants")
    if not isinstance(raw, list) or not raw:
        raise TenantConfigError(f"{source}: tenants: expected a non-empty list of tenants, got "
                                f"{'an empty list' if raw == [] else type(raw).__name__}")
    tenants = [_tenant(f"{source}: tenants[{i}]", t) for i, t in enumerate(raw)]
    names: dict[str, int] = {}
    keys: dict[bytes, str] = {}
    for i, t in enumerate(tenants):
        if t.name in names:
            raise TenantConfigError(f"{source}: tenants[{i}].name: {t.name!r} is also tenants[{names[t.name]}]")
        names[t.name] = i
        for d in t.key_digests:
            if d in keys:
                raise TenantConfigError(f"{source}: tenants[{i}] ({t.name}): an API key is also one of "
                                        f"{keys[d]!r}'s (each key names one tenant)")
            keys[d] = t.name
    return tenants


def load_tenants(path: str) -> "Tenants":
    """Read and validate a tenants file (JSON)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise TenantConfigError(f"{path}: not valid JSON ({e})") from None
    return Tenants(parse_tenants(doc, str(path)))


# --- quota state ---------------------------------------------------------------------------------
class TenantState:
    """One tenant's buckets, calls in flight and counters (event loop only)."""

    def __init__(self, tenant: Tenant, clock: Callable[[], float]):
        self.tenant, self.clock = tenant, clock
        q, now = tenant.quota, clock()
        self.buckets: dict[str, tuple[TokenBucket, str]] = {}  # kind -> (bucket, quota as written)
        if q.queries_per_s is not None:
            self.buckets["queries"] = (TokenBucket(q.queries_per_s, q.burst, now),
                                       f"queries_per_s {q.queries_per_s:g} (burst {q.burst:g})")
        if q.rows_per_s is not None:
            self.buckets["rows"] = (TokenBucket(q.rows_per_s, q.burst_rows, now),
                                    f"rows_per_s {q.rows_per_s:g} (burst_rows {q.burst_rows:g})")
        self.in_flight = 0
        self.calls = 0
        self.spent = {"queries": 0, "rows": 0}
        self.refused = {"class": 0, "collection": 0, "in_flight": 0, "queries": 0, "rows": 0}

    @property
    def name(self) -> str:
        return self.tenant.name

    def enter(self) -> None:
        """Count a call in; raises :class:`QuotaExceededError` at ``max_in_flight``."""
        cap = self.tenant.quota.max_in_flight
        if cap is not None and self.in_flight >= cap:
            self.refused["in_flight"] += 1
            raise QuotaExceededError(f"tenant {self.name!r} has {self.in_flight} calls in flight, its max_in_flight "
                                     f"quota; retry once one of them has finished")
        self.in_flight += 1
        self.calls += 1

    def leave(self) -> None:
        self.in_flight -= 1

    def denial(self, collection: str | None) -> str | None:
        """Why this tenant may not name ``collection`` (counted as a refusal), or None if it may.
        A string that is no valid collection name names no collection: it passes, and the
        servicer answers it INVALID_ARGUMENT. The answer is the same whether or not the
        collection exists."""
        grants = self.tenant.grants
        if collection is None or grants.allows(collection) or not NAME_RE.fullmatch(collection):
            return None
        self.refused["collection"] += 1
        return (f"tenant {self.name!r} may not use collection {collection!r}: its grants are "
                f"{list(grants.patterns)}")

    def visible(self, response: pb.ListCollectionsResponse) -> pb.ListCollectionsResponse:
        """``response`` with only the collections this tenant is granted."""
        grants = self.tenant.grants
        if grants.all:
            return response
        return pb.ListCollectionsResponse(collections=[c for c in response.collections if grants.allows(c.name)])

    def charge(self, kind: str, cost: int) -> None:
        """Spend ``cost`` tokens of ``kind`` ("queries" or "rows"), or raise
        :class:`QuotaExceededError` (with ``retry_after_s``) spending nothing."""
        entry = self.buckets.get(kind)
        if entry is not None:
            bucket, quota = entry
            now = self.clock()
            if cost > bucket.burst:
                self.refused[kind] += 1
                raise QuotaExceededError(f"tenant {self.name!r}: this call has {cost} {kind}, more than its quota "
                                         f"{quota} allows at once; send at most {int(bucket.burst)} per call")
            if not bucket.take(cost, now):
                self.refused[kind] += 1
                wait = bucket.wait_time(cost, now)
                raise QuotaExceededError(f"tenant {self.name!r} is over its quota {quota}: this call needs "
                                         f"{cost} {kind}; retry in {wait:.3g} s", retry_after_s=wait)
        self.spent[kind] += cost

    def snapshot(self) -> dict:
        return {"name": self.name, "calls": self.calls, "in_flight": self.in_flight,
                "queries": self.spent["queries"], "rows": self.spent["rows"], "refused": dict(self.refused)}


class Tenants:
    """The loaded tenants: authentication by key digest and per-tenant quota state."""

    def __init__(self, tenants: Iterable[Tenant], clock: Callable[[], float] = time.monotonic):
        self.states = {t.name: TenantState(t, clock) for t in tenants}
        self._digests = [(d, s) for s in self.states.values() for d in s.tenant.key_digests]
        self.unauthenticated = 0

    def __len__(self) -> int:
        return len(self.states)

    def names(self) -> list[str]:
        return list(self.states)

    def apply_io_quotas(self, index: Any) -> None:
        """Give ``index`` (a ``vindex.Index``) each tenant's ``postings_per_s`` I/O quota."""
        for state in self.states.values():
            q = state.tenant.quota
            if q.postings_per_s is not None:
                index.set_tenant_quota(state.name, q.postings_per_s, q.burst_postings)

    def authenticate(self, key: str) -> TenantState | None:
        """The tenant holding ``key``; every digest is compared, so the time taken does not
        depend on which key (if any) matches."""
        digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
        found = None
        for d, state in self._digests:
            if hmac.compare_digest(d, digest):
                found = state
        return found


# --- the interceptor -----------------------------------------------------------------------------
_current: contextvars.ContextVar[TenantState | None] = contextvars.ContextVar("vindex_tenant", default=None)


def current_tenant() -> TenantState | None:
    """The authenticated tenant of the call running in this task (None without tenants)."""
    return _current.get()


def api_key(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The key in ``x-api-key``, else in ``authorization: Bearer <key>``."""
    bearer = None
    for key, value in metadata or ():
        if isinstance(value, bytes):
            continue
        if key == API_KEY_HEADER:
            return value
        if key == "authorization":
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                bearer = token.strip()
    return bearer


def _queries(request: Any) -> int:
    if getattr(request, "nq", 0):
        return request.nq  # the servicer refuses a request whose data does not match it
    dim = getattr(request, "dim", 0)
    sent = values_sent(getattr(request, "queries", b""), getattr(request, "float_queries", ()))
    return max(1, sent // dim) if dim > 0 else 1


def _rows(request: Any) -> int:
    return len(getattr(request, "ids", ())) + len(getattr(request, "str_ids", ()))


#: What a call spends: (bucket, cost of one request message). Undecodable requests cost the
#: minimum; the servicer answers them INVALID_ARGUMENT.
COSTS: dict[str, tuple[str, Callable[[Any], int]]] = {
    "Search": ("queries", _queries),
    "Upsert": ("rows", _rows), "UpsertStream": ("rows", _rows), "Delete": ("rows", _rows),
    "SetMetadata": ("rows", _rows),
}


async def _abort_quota(context: grpc.aio.ServicerContext, exc: QuotaExceededError) -> None:
    md = trailers(exc)
    wait = exc.retry_after_s
    if wait is not None:  # gRFC A6 server pushback: a client retry policy waits this long
        md += (("grpc-retry-pushback-ms", str(max(1, math.ceil(wait * 1000)))),)
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message(exc), trailing_metadata=md)


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, text: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s shape that answers ``code`` without parsing the request."""
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, text)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


class TenantInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates each call of ``service``, checks its class and charges its quota."""

    def __init__(self, tenants: Tenants, service: str):
        self.tenants, self.prefix = tenants, f"/{service}/"

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails
                                ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        method = details.method
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler  # unknown methods answer UNIMPLEMENTED; health and reflection are open
        key = api_key(details.invocation_metadata)
        state = self.tenants.authenticate(key) if key else None
        if state is None:
            self.tenants.unauthenticated += 1
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED,
                            f"unknown API key for {method}" if key else
                            f"{method} needs an API key: send metadata '{API_KEY_HEADER}: <key>' "
                            f"(or 'authorization: Bearer <key>')")
        rpc = method[len(self.prefix):] if method.startswith(self.prefix) else method
        cls = RPC_CLASS.get(rpc)
        if cls not in state.tenant.classes:
            state.refused["class"] += 1
            return _refusal(handler, grpc.StatusCode.PERMISSION_DENIED,
                            f"tenant {state.name!r} may not call {rpc}: it needs class {cls!r}, the tenant has "
                            f"{sorted(state.tenant.classes)}")
        if not handler.request_streaming and not handler.response_streaming:
            return self._unary(handler, state, rpc)
        if handler.request_streaming and handler.response_streaming:
            return self._stream(handler, state, rpc)
        return _refusal(handler, grpc.StatusCode.UNIMPLEMENTED, f"{rpc}: this call shape is not served with tenants")

    @staticmethod
    def _unary(handler: grpc.RpcMethodHandler, state: TenantState, rpc: str) -> grpc.RpcMethodHandler:
        behavior, cost = handler.unary_unary, COSTS.get(rpc)

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            _current.set(state)  # this call's task only
            try:
                state.enter()
            except QuotaExceededError as e:
                await _abort_quota(context, e)
            try:
                denied = state.denial(collection_named(rpc, request))
                if denied is not None:
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, denied)
                if cost is not None:
                    try:
                        state.charge(cost[0], cost[1](request))
                    except QuotaExceededError as e:
                        await _abort_quota(context, e)
                response = await behavior(request, context)
                return state.visible(response) if rpc == "ListCollections" else response
            finally:
                state.leave()

        return grpc.unary_unary_rpc_method_handler(call, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)

    @staticmethod
    def _stream(handler: grpc.RpcMethodHandler, state: TenantState, rpc: str) -> grpc.RpcMethodHandler:
        behavior, cost = handler.stream_stream, COSTS.get(rpc)

        async def call(request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[Any]:
            _current.set(state)
            try:
                state.enter()
            except QuotaExceededError as e:
                await _abort_quota(context, e)

            async def charged() -> AsyncIterator[Any]:
                name = None
                async for request in request_iterator:
                    # a message without a collection continues the stream's (as the servicer reads it)
                    name = collection_named(rpc, request) or name
                    denied = state.denial(name)
                    if denied is not None:
                        await context.abort(grpc.StatusCode.PERMISSION_DENIED, denied)
                    if cost is not None:  # each message as the servicer takes it: earlier
                        try:              # chunks stay acknowledged
                            state.charge(cost[0], cost[1](request))
                        except QuotaExceededError as e:
                            await _abort_quota(context, e)
                    yield request

            try:
                async for response in behavior(charged(), context):
                    yield response
            finally:
                state.leave()

        return grpc.stream_stream_rpc_method_handler(call, request_deserializer=handler.request_deserializer,
                                                     response_serializer=handler.response_serializer)
