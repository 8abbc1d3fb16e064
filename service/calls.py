"""One client method, two ways to run it: blocking for ``Client``, as a coroutine for ``AsyncClient``.

Each method of the clients is written once (``service/methods.py``) as a function that checks
its arguments and returns what to send: a :class:`Call` (one unary RPC and how its response
reads as the result), :class:`Pages` (a ``Scroll`` call per page) or :class:`UpsertStream`.
Each of those runs on a :class:`Connection` either way: ``run`` blocks, ``run_async`` awaits.
Such functions are marked :class:`client_method` in a :class:`MethodsBase` class, and each
client class turns them into methods with :func:`blocking` or :func:`asynchronous`, so both
clients share every signature, docstring, check, message and result type.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import (Any, AsyncIterable, AsyncIterator, Callable, Concatenate, Generic, Iterable, Iterator, ParamSpec,
                    TypeVar)

import grpc

from vindex.results import ScrollPage

from . import vindex_pb2 as pb
from .channels import Connection
from .remote_results import scroll_page
from .status import to_exception

T = TypeVar("T")


def _unchanged(response: Any) -> Any:
    return response


@dataclass(frozen=True)
class Call(Generic[T]):
    """The unary RPC ``method`` with ``request``; ``decode`` makes the method's result of its
    response; ``timeout`` None is the connection's deadline."""

    method: str
    request: Any
    decode: Callable[[Any], T] = _unchanged
    timeout: float | None = None

    def run(self, conn: Connection) -> T:
        try:
            response = conn.unary(self.method, self.request, self.timeout)
        except grpc.RpcError as e:
            raise to_exception(e) from None
        return self.decode(response)

    async def run_async(self, conn: Connection) -> T:
        try:
            response = await conn.unary(self.method, self.request, self.timeout)
        except grpc.RpcError as e:
            raise to_exception(e) from None
        return self.decode(response)


@dataclass(frozen=True)
class Pages:
    """A scroll: one ``Scroll`` call per page, from ``token`` ("": the first page) until a
    page has no next page token."""

    request: pb.ScrollRequest
    include: list[str]
    token: str = ""

    def _page(self, token: str) -> Call[tuple[ScrollPage | None, str | None]]:
        req = pb.ScrollRequest()
        req.CopyFrom(self.request)
        req.page_token = token
        return Call("Scroll", req, functools.partial(scroll_page, include=self.include))

    def run(self, conn: Connection) -> Iterator[ScrollPage]:
        token: str | None = self.token
        while token is not None:
            page, token = self._page(token).run(conn)
            if page is not None:
                yield page

    async def run_async(self, conn: Connection) -> AsyncIterator[ScrollPage]:
        token: str | None = self.token
        while token is not None:
            page, token = await self._page(token).run_async(conn)
            if page is not None:
                yield page


class UpsertStream:
    """An ``UpsertStream`` call sending one request per batch, built as it is sent by
    ``request(batch)``. An exception building one ends the stream (gRPC would report it as
    UNKNOWN "Exception iterating requests!") and is raised once the acknowledged batches are
    read, or in place of the call's error."""

    def __init__(self, batches: Iterable[Any] | AsyncIterable[Any], request: Callable[[Any], pb.UpsertRequest]):
        self._batches, self._request = batches, request
        self._failed: list[Exception] = []

    def _requests(self) -> Iterator[pb.UpsertRequest]:
        try:
            for batch in self._batches:  # type: ignore[union-attr]
                yield self._request(batch)
        except Exception as e:
            self._failed.append(e)

    async def _requests_async(self) -> AsyncIterator[pb.UpsertRequest]:
        if not isinstance(self._batches, AsyncIterable):
            for req in self._requests():
                yield req
            return
        try:
            async for batch in self._batches:
                yield self._request(batch)
        except Exception as e:
            self._failed.append(e)

    def _error(self, e: grpc.RpcError) -> Exception:
        """What a failed call raises: the batch that failed to build, else the call's error."""
        return self._failed[0] if self._failed else to_exception(e)

    def run(self, conn: Connection) -> Iterator[pb.UpsertAck]:
        try:
            yield from conn.stream("UpsertStream", self._requests())
        except grpc.RpcError as e:
            raise self._error(e) from None
        if self._failed:
            raise self._failed[0]

    async def run_async(self, conn: Connection) -> AsyncIterator[pb.UpsertAck]:
        try:
            async for ack in conn.stream("UpsertStream", self._requests_async()):
                yield ack
        except grpc.RpcError as e:
            raise self._error(e) from None
        if self._failed:
            raise self._failed[0]


@dataclass(frozen=True)
class StreamTotal:
    """An :class:`UpsertStream` read to its end: the result is the rows stored."""

    stream: UpsertStream

    def run(self, conn: Connection) -> int:
        total = 0
        for ack in self.stream.run(conn):
            total = ack.total
        return int(total)

    async def run_async(self, conn: Connection) -> int:
        total = 0
        async for ack in self.stream.run_async(conn):
            total = ack.total
        return int(total)


#: What a method returns, by what its function returns (``Call[X]`` returns ``X``): blocking, async.
_RESULTS = {"Pages": ("Iterator[ScrollPage]", "AsyncIterator[ScrollPage]"),
            "UpsertStream": ("Iterator[pb.UpsertAck]", "AsyncIterator[pb.UpsertAck]"),
            "StreamTotal": ("int", "int")}


def _as_method(method: Callable, build: Callable, asynchronous: bool) -> Callable:
    """``method`` with ``build``'s name, docstring and signature, returning what the call gives."""
    functools.update_wrapper(method, build)
    sig = inspect.signature(build)
    made = str(sig.return_annotation)
    result = made[5:-1] if made.startswith("Call[") else _RESULTS[made][asynchronous]
    method.__signature__ = sig.replace(return_annotation=result)  # type: ignore[attr-defined]
    method.__annotations__ = {**build.__annotations__, "return": result}
    return method


def blocking(build: Callable[..., Any]) -> Callable[..., Any]:
    """A ``Client`` method: runs ``build``'s call on ``self._connection`` and returns its result."""
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return build(self, *args, **kwargs).run(self._connection)
    return _as_method(method, build, False)


def _awaiting(build: Callable[..., Any]) -> Callable[..., Any]:
    """An ``AsyncClient`` coroutine method: awaits ``build``'s call and returns its result."""
    async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await build(self, *args, **kwargs).run_async(self._connection)
    return _as_method(method, build, True)


def _iterating(build: Callable[..., Any]) -> Callable[..., Any]:
    """An ``AsyncClient`` method returning an async iterator over ``build``'s call (scroll pages,
    stream acknowledgements)."""
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return build(self, *args, **kwargs).run_async(self._connection)
    return _as_method(method, build, True)


def asynchronous(build: Callable[..., Any]) -> Callable[..., Any]:
    """An ``AsyncClient`` method: a coroutine, or for a call of many responses (scroll pages,
    stream acknowledgements) a method returning an async iterator over them."""
    many = str(inspect.signature(build).return_annotation) in ("Pages", "UpsertStream")
    return (_iterating if many else _awaiting)(build)


P = ParamSpec("P")


class client_method(Generic[P, T]):  # noqa: N801 (used as a decorator, like property)
    """Marks a function of a :class:`MethodsBase` class that checks its arguments and returns
    the call to make: each subclass replaces it with a method running that call its way."""

    def __init__(self, build: Callable[Concatenate[Any, P], T]):
        self.build = build
        functools.update_wrapper(self, build)  # type: ignore[arg-type]

    def __get__(self, obj: Any, owner: type | None = None) -> Callable[P, Any]:
        # reached only on the shared base classes (client classes hold the methods): the
        # function itself, returning its call
        return self.build.__get__(obj, owner)


class MethodsBase:
    """A class whose :class:`client_method` functions become, in each subclass that sets
    ``_method`` (:func:`blocking` or :func:`asynchronous`), methods that run their calls."""

    _method: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        make = vars(cls).get("_method")
        if make is None:
            return
        make = make.__func__ if isinstance(make, staticmethod) else make
        for name in dir(cls):
            attr = inspect.getattr_static(cls, name)
            if isinstance(attr, client_method):
                setattr(cls, name, make(attr.build))
