"""The Python client: the library's ``Index`` API over gRPC.

::

    client = vindex.Client("127.0.0.1:50051")
    col = client.create_collection("docs", dim=384, metric="cosine")
    col.upsert(ids, vectors, metadata=[{"source": "a.pdf", "page": 3}, ...], documents=texts)
    ids, dists = col.search(queries, k=10)
    res = col.search(queries, k=10, filter={"source": "a.pdf"}, include=["metadata", "documents"])

A :class:`Collection` has the names, arguments, return types and exceptions of
:class:`vindex.Index`, so a pipeline moves between embedded and remote by changing the line that
opens it. Failed calls raise the library's exceptions (``DimensionError``, ``IdExistsError``,
...); transport failures raise :class:`ServiceError` carrying the gRPC status code. The methods are
written once in ``service/methods.py``; :class:`vindex.AsyncClient` runs the same ones as
coroutines.
"""
from __future__ import annotations

import time
from typing import Any

import grpc

from .calls import blocking
from .methods import ClientMethods, CollectionMethods


class Collection(CollectionMethods):
    """One collection on the server, with the :class:`vindex.Index` API: the methods of
    ``CollectionMethods`` (search, upsert, add, get, count, scroll, delete, ...)."""

    _method = staticmethod(blocking)

    @property
    def id_type(self) -> str | None:
        """"int" or "str"; None while the collection is empty and its first write has not fixed it."""
        if self._id_type is None:
            self._id_type = self._client._describe(self.name).id_type or None
        return self._id_type

    def __len__(self) -> int:
        return int(self._client._describe(self.name).count)


class Client(ClientMethods):
    """A connection to a vindex server at ``target`` (``host:port``).

    ``timeout`` (seconds) is the deadline of every call; ``None`` waits as long as needed.
    ``api_key`` is sent as ``x-api-key`` with every call (servers started with ``--tenants``
    require one). ``tls_root_cert`` (a path or PEM bytes) turns on TLS and trusts the CA that
    signed the server's certificate; ``tls_client_cert`` and ``tls_client_key`` present a client
    certificate to a server that requires one. ``credentials`` gives full control instead.
    """

    _grpc = grpc
    _method = staticmethod(blocking)
    _collection_type = Collection

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the server's health check reports SERVING."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._connection.channel)
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server at {self.target} not SERVING after {timeout} s")
            time.sleep(0.1)

    def close(self) -> None:
        """Close the channel; calls still running are cancelled."""
        self._connection.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
