"""The asyncio client: :class:`vindex.Client`'s API as coroutines, on ``grpc.aio``.

::

    async with vindex.AsyncClient("127.0.0.1:50051") as client:
        col = await client.collection("docs")
        results = await asyncio.gather(*(col.search(q, k=10) for q in queries))
        async for page in col.scroll({"source": "a.pdf"}, include=["documents"]):
            ...

Every method of :class:`Client` and :class:`Collection` is here with the same signature,
checks, results and exceptions (both run the functions of ``service/methods.py``); those that
return an iterator there (``scroll``, ``upsert_stream``) return an async iterator here, and
``upsert_stream`` also takes an async iterable of batches. One client serves any number of
concurrent calls on its one channel. Create it inside the event loop that uses it.
"""
from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio

from .calls import asynchronous
from .methods import ClientMethods, CollectionMethods


class AsyncCollection(CollectionMethods):
    """One collection on the server, with the :class:`vindex.Index` API as coroutines: the
    methods of ``CollectionMethods`` (search, upsert, add, get, count, scroll, delete, ...)."""

    _method = staticmethod(asynchronous)

    @property
    def id_type(self) -> str | None:
        """"int" or "str"; None while the collection was empty when opened and no write through
        this handle has fixed it (``await client.collection(name)`` asks the server again)."""
        return self._id_type

    def __len__(self) -> int:
        # len() cannot await the server
        raise TypeError("len() of an AsyncCollection: use await collection.count()")


class AsyncClient(ClientMethods):
    """A ``grpc.aio`` connection to a vindex server at ``target`` (``host:port``), with the
    options of :class:`vindex.Client` (``timeout``, ``api_key``, ``tls_*``, ``credentials``).
    Use it as ``async with AsyncClient(...) as client`` or ``await client.close()``."""

    _grpc = grpc.aio
    _method = staticmethod(asynchronous)
    _collection_type = AsyncCollection

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the server's health check reports SERVING (watching it: no polling)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._connection.channel)

        async def serving() -> None:
            while True:
                try:  # wait_for_ready: a server not listening yet is waited for, not an error
                    async for reply in stub.Watch(health_pb2.HealthCheckRequest(service=""), wait_for_ready=True):
                        if reply.status == health_pb2.HealthCheckResponse.SERVING:
                            return
                except grpc.RpcError:
                    await asyncio.sleep(0.1)  # the server went away mid-watch: back off, watch again
        try:
            await asyncio.wait_for(serving(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"server at {self.target} not SERVING after {timeout} s") from None

    async def close(self) -> None:
        """Close the channel; calls still running are cancelled."""
        await self._connection.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
