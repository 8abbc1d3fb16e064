"""Admission control: how many calls, and how many request bytes, the server takes at once.

:class:`AdmissionInterceptor` wraps every ``vindex.v1.VectorIndex`` call; health checking and
reflection pass through untouched, so a load balancer's probe is never refused. A call counts
against a cap per client (the tenant its API key names when a tenants file is loaded, else the
peer address without its port) and a global cap, from its start to its end (a stream for its
whole length); a client at its cap is refused without touching anyone else's share.

Request bytes in flight are bounded by a global budget. A unary request is charged its size by
its deserializer, before it is parsed, and released when the call ends; one that does not fit
is refused at once and never parsed (grpc.aio has already received it, so waiting would hold
its bytes, which is what the budget bounds). A stream's chunk is charged when it arrives, until
the servicer asks for the next one; one that does not fit waits up to ``inflight_wait_s``,
first come first served, and is then refused (a stream holds one chunk at a time). A stream
that sends no message for ``stream_idle_timeout_s`` is ended with DEADLINE_EXCEEDED; the chunks
acknowledged before stay stored. Every other refusal is RESOURCE_EXHAUSTED naming the client
and the cap. State is touched on the server's event loop only, so it needs no locks.
"""
from __future__ import annotations

import asyncio
import collections
import inspect
import urllib.parse
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, NamedTuple

import grpc

from vindex.errors import ResourceExhaustedError

from .status import message, trailers
from .tenants import Tenants, api_key

if TYPE_CHECKING:
    from .server import Limits


def client_of_peer(peer: str) -> str:
    """The address in ``context.peer()`` without scheme and port: ``ipv4:10.0.0.7:5123`` ->
    ``10.0.0.7``, ``ipv6:%5B::1%5D:5123`` -> ``::1``; anything else (``unix:...``) as given."""
    peer = urllib.parse.unquote(peer)
    scheme, sep, rest = peer.partition(":")
    if not sep or scheme not in ("ipv4", "ipv6"):
        return peer
    host, _, _ = rest.rpartition(":")
    return host.strip("[]") or rest


class Admission:
    """Calls in flight per client and overall, and request bytes in flight (event loop only)."""

    def __init__(self, limits: "Limits"):
        self.limits = limits
        self.calls = 0
        self.by_client: collections.Counter[str] = collections.Counter()
        self.bytes = 0
        self.refused = collections.Counter()    # reason -> calls refused
        self._waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    # --- calls -----------------------------------------------------------------------------------
    def enter(self, client: str) -> None:
        """Count a call of ``client`` in, or raise :class:`ResourceExhaustedError` naming the cap."""
        cap, mine = self.limits.max_client_rpcs, self.by_client[client]
        if mine >= cap:
            self.refused["client_calls"] += 1
            raise ResourceExhaustedError(
                f"client {client} has {mine} calls in flight, the per-client cap (--max-client-rpcs {cap}); "
                f"retry once one of them has finished")
        if self.calls >= self.limits.max_concurrent_rpcs:
            self.refused["calls"] += 1
            raise ResourceExhaustedError(
                f"the server has {self.calls} calls in flight, its cap (--max-concurrent-rpcs "
                f"{self.limits.max_concurrent_rpcs}); client {client} has {mine}; retry shortly")
        self.calls += 1
        self.by_client[client] += 1

    def leave(self, client: str) -> None:
        self.calls -= 1
        self.by_client[client] -= 1
        if not self.by_client[client]:
            del self.by_client[client]

    # --- bytes -----------------------------------------------------------------------------------
    def try_charge(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` of the budget if they fit now and no request is queued for room."""
        if self._waiting or self.bytes + nbytes > self.limits.max_inflight_bytes:
            return False
        self.bytes += nbytes
        return True

    def over_budget(self, client: str, nbytes: int, waited_s: float = 0.0) -> ResourceExhaustedError:
        """The refusal of a request of ``nbytes`` that did not fit (after waiting ``waited_s``)."""
        self.refused["bytes"] += 1
        budget = self.limits.max_inflight_bytes
        if nbytes > budget:
            return ResourceExhaustedError(
                f"client {client}: a request of {nbytes} bytes is larger than the server's whole budget of "
                f"request bytes in flight (--max-inflight-bytes {budget}); send smaller requests")
        waited = f"waited {waited_s:g} s for room" if waited_s else "was refused at once"
        return ResourceExhaustedError(
            f"client {client}: {self.bytes} request bytes are in flight, the server's budget is "
            f"--max-inflight-bytes {budget}; this request of {nbytes} bytes {waited}; retry shortly")

    async def charge(self, client: str, nbytes: int, wait_s: float | None = None) -> None:
        """Reserve ``nbytes`` of the budget, waiting up to ``wait_s`` (default ``inflight_wait_s``)
        behind earlier requests; raise :class:`ResourceExhaustedError` if they do not fit by then."""
        if nbytes > self.limits.max_inflight_bytes:
            raise self.over_budget(client, nbytes)
        if self.try_charge(nbytes):
            return
        granted = asyncio.get_running_loop().create_future()
        self._waiting.append((nbytes, granted))
        wait = self.limits.inflight_wait_s if wait_s is None else wait_s
        try:
            await asyncio.wait_for(asyncio.shield(granted), max(0.0, wait))
        except (asyncio.TimeoutError, asyncio.CancelledError) as e:
            if granted.done():  # granted just as the wait ended: give the bytes back
                self.release(nbytes)
            else:
                granted.cancel()
                self._grant()   # requests queued behind this one may fit now
            if isinstance(e, asyncio.CancelledError):
                raise
            raise self.over_budget(client, nbytes, wait) from None

    def release(self, nbytes: int) -> None:
        self.bytes -= nbytes
        self._grant()

    def _grant(self) -> None:
        """Admit queued requests in order while the head of the queue fits."""
        while self._waiting:
            nbytes, granted = self._waiting[0]
            if granted.done():  # gave up waiting
                self._waiting.popleft()
                continue
            if self.bytes + nbytes > self.limits.max_inflight_bytes:
                return
            self._waiting.popleft()
            self.bytes += nbytes
            granted.set_result(None)

    def snapshot(self) -> dict:
        return {"calls": self.calls, "by_client": dict(self.by_client), "bytes": self.bytes,
                "waiting": sum(1 for _, f in self._waiting if not f.done()), "refused": dict(self.refused)}


# --- the interceptor -----------------------------------------------------------------------------
async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, exc: BaseException) -> None:
    await context.abort(code, message(exc), trailing_metadata=trailers(exc))


def _sized(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], tuple[int, Any]]:
    """``deserializer`` returning ``(size of the raw message, parsed message)``: the size is
    known here without serialising the message again."""
    def parse(raw: bytes) -> tuple[int, Any]:
        return len(raw), raw if deserializer is None else deserializer(raw)
    return parse


class _Arrived(NamedTuple):
    """A unary request as its deserializer left it: ``request`` is None when its bytes did not
    fit the budget (it was not parsed); ``charged`` bytes are the handler's to release."""

    nbytes: int
    request: Any
    charged: bool


def _charged_on_arrival(admission: Admission, deserializer: Callable[[bytes], Any] | None
                        ) -> Callable[[bytes], _Arrived]:
    """A deserializer that charges the raw message's size before parsing it, and does not parse
    a message that does not fit: a refused request never gets its parsed copy. The handler
    starts right after it (grpc.aio awaits nothing in between), so it always releases."""
    def parse(raw: bytes) -> _Arrived:
        if not admission.try_charge(len(raw)):
            return _Arrived(len(raw), None, False)
        try:
            return _Arrived(len(raw), raw if deserializer is None else deserializer(raw), True)
        except BaseException:
            admission.release(len(raw))
            raise
    return parse


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    """Admits each call of ``service`` through ``admission``; other services pass untouched.

    It must be the outermost interceptor: the sizes its deserializer attaches are removed before
    the inner handlers see a request."""

    def __init__(self, admission: Admission, service: str, tenants: Tenants | None = None):
        self.admission, self.prefix, self.tenants = admission, f"/{service}/", tenants

    def client(self, details: grpc.HandlerCallDetails, context: grpc.aio.ServicerContext) -> str:
        """The tenant named by the call's API key, else the peer address without its port."""
        if self.tenants is not None:
            key = api_key(details.invocation_metadata)
            state = self.tenants.authenticate(key) if key else None
            if state is not None:
                return f"tenant {state.name!r}"
        return client_of_peer(context.peer())

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails
                                ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self.prefix):
            return handler  # health checking, reflection and unknown methods: never refused here
        if handler.request_streaming and handler.response_streaming:
            return self._stream(handler, details)
        if not handler.request_streaming and not handler.response_streaming:
            return self._unary(handler, details)
        return handler  # no such RPC in the service

    def _unary(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        behavior, admission = handler.unary_unary, self.admission

        async def call(arrived: _Arrived, context: grpc.aio.ServicerContext) -> Any:
            try:
                client = self.client(details, context)
                if not arrived.charged:
                    await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 admission.over_budget(client, arrived.nbytes))
                try:
                    admission.enter(client)
                except ResourceExhaustedError as e:
                    await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, e)
                try:
                    return await behavior(arrived.request, context)
                finally:
                    admission.leave(client)
            finally:
                if arrived.charged:
                    admission.release(arrived.nbytes)

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=_charged_on_arrival(admission, handler.request_deserializer),
            response_serializer=handler.response_serializer)

    def _stream(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        behavior, admission = handler.stream_stream, self.admission
        idle_s = admission.limits.stream_idle_timeout_s
        rpc = details.method[len(self.prefix):]

        async def call(request_iterator: AsyncIterator[tuple[int, Any]], context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[Any]:
            client = self.client(details, context)
            try:
                admission.enter(client)
            except ResourceExhaustedError as e:
                await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, e)
            held = 0  # bytes of the chunk the servicer is working on

            async def requests() -> AsyncIterator[Any]:
                nonlocal held
                messages = request_iterator.__aiter__()
                while True:
                    try:
                        nbytes, request = await asyncio.wait_for(messages.__anext__(), idle_s)
                    except StopAsyncIteration:
                        return
                    except asyncio.TimeoutError:
                        admission.refused["idle"] += 1
                        await context.abort(
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"{rpc} from client {client}: idle, no message for {idle_s:g} s "
                            f"(--stream-idle-timeout); the stream is closed and the chunks acknowledged "
                            f"before stay stored")
                    admission.release(held)  # the servicer is done with the previous chunk
                    held = 0
                    try:
                        await admission.charge(client, nbytes, _wait(admission, context))
                    except ResourceExhaustedError as e:
                        await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, e)
                    held = nbytes
                    yield request

            try:
                responses = behavior(requests(), context)
                if inspect.isawaitable(responses):  # a handler that writes with context.write, or refuses
                    await responses
                    return
                async for response in responses:
                    yield response
            finally:
                admission.release(held)
                admission.leave(client)

        return grpc.stream_stream_rpc_method_handler(call, request_deserializer=_sized(handler.request_deserializer),
                                                     response_serializer=handler.response_serializer)


def _wait(admission: Admission, context: grpc.aio.ServicerContext) -> float:
    """How long a request may wait for bytes: ``inflight_wait_s``, or less if its deadline is nearer."""
    remaining = context.time_remaining()
    wait = admission.limits.inflight_wait_s
    return wait if remaining is None else min(wait, remaining)
