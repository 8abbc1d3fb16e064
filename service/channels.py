"""A client's connection: channel options, TLS credentials, API key and default deadline.

:class:`vindex.Client` opens its channel with ``grpc``, :class:`vindex.AsyncClient` with
``grpc.aio``; both modules have the same channel constructors, so one function checks the
options and opens either kind.
"""
from __future__ import annotations

import os
import re
from types import ModuleType
from typing import Any

import grpc

from . import vindex_pb2_grpc as pb_grpc
from .server import grpc_options

PemSource = str | bytes | os.PathLike


def _pem(value: PemSource | None, what: str) -> bytes | None:
    """PEM bytes as given, or read from a path."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (str, os.PathLike)):
        with open(value, "rb") as f:
            return f.read()
    raise TypeError(f"{what}: expected a path or PEM bytes, got {type(value).__name__}")


class Connection:
    """A channel, the ``VectorIndex`` stub on it, the deadline of calls that set none, and the
    metadata every call sends (the API key). The stub's methods block on a ``grpc`` channel
    and return awaitables on a ``grpc.aio`` one; the calls are made the same way."""

    def __init__(self, grpc_module: ModuleType, target: str, *, timeout: float | None, api_key: str | None,
                 tls_root_cert: PemSource | None, tls_client_cert: PemSource | None,
                 tls_client_key: PemSource | None, credentials: grpc.ChannelCredentials | None):
        if api_key is not None and (not isinstance(api_key, str) or not re.fullmatch(r"[\x21-\x7e]+", api_key)):
            raise ValueError("api_key: expected a non-empty string of printable ASCII without spaces")
        if any(v is not None for v in (tls_root_cert, tls_client_cert, tls_client_key)):
            if credentials is not None:
                raise ValueError("credentials: give either credentials or tls_* arguments, not both")
            if (tls_client_cert is None) != (tls_client_key is None):
                raise ValueError("tls_client_cert and tls_client_key: expected both or neither")
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_pem(tls_root_cert, "tls_root_cert"),
                private_key=_pem(tls_client_key, "tls_client_key"),
                certificate_chain=_pem(tls_client_cert, "tls_client_cert"))
        opts = grpc_options()
        self.channel = (grpc_module.secure_channel(target, credentials, options=opts) if credentials
                        else grpc_module.insecure_channel(target, options=opts))
        self.stub = pb_grpc.VectorIndexStub(self.channel)
        self.target, self.timeout = target, timeout
        self.metadata = None if api_key is None else (("x-api-key", api_key),)

    def unary(self, method: str, request: Any, timeout: float | None = None) -> Any:
        """Start the unary call ``method`` (``timeout`` None: the connection's)."""
        return getattr(self.stub, method)(request, timeout=self.timeout if timeout is None else timeout,
                                          metadata=self.metadata)

    def stream(self, method: str, requests: Any) -> Any:
        """Start the streaming call ``method`` sending ``requests`` (an iterator, or an async
        one on ``grpc.aio``); iterating the result reads the responses."""
        return getattr(self.stub, method)(requests, timeout=self.timeout, metadata=self.metadata)


class ClientBase:
    """The options and connection both clients share; ``_grpc`` is the module the channel
    comes from (``grpc`` or ``grpc.aio``)."""

    _grpc: ModuleType

    def __init__(self, target: str = "127.0.0.1:50051", *, timeout: float | None = 60.0,
                 api_key: str | None = None, tls_root_cert: PemSource | None = None,
                 tls_client_cert: PemSource | None = None, tls_client_key: PemSource | None = None,
                 credentials: grpc.ChannelCredentials | None = None):
        self._connection = Connection(self._grpc, target, timeout=timeout, api_key=api_key,
                                      tls_root_cert=tls_root_cert, tls_client_cert=tls_client_cert,
                                      tls_client_key=tls_client_key, credentials=credentials)

    @property
    def target(self) -> str:
        return self._connection.target

    @property
    def timeout(self) -> float | None:
        """The deadline (seconds) of calls that set none; None waits as long as needed."""
        return self._connection.timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._connection.timeout = value
