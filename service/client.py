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
...); transport failures raise :class:`ServiceError` carrying the gRPC status code.
"""
from __future__ import annotations

import collections
import json
import os
import re
import time
from typing import Any, Iterable, Iterator

import grpc
import numpy as np

from vindex import errors, validation
from vindex.results import SearchResult
from vindex.validation import check_eps

from . import vindex_pb2 as pb
from . import vindex_pb2_grpc as pb_grpc
from .payloads import encode_rows, to_struct
from .remote_results import get_result, scroll_pages, search_result
from .server import grpc_options
from .status import to_exception

#: Rows per message when :meth:`Collection.upsert_stream` splits an array.
STREAM_CHUNK = 2048


def _call(fn: Any, request: Any, timeout: float | None) -> Any:
    try:
        return fn(request, timeout=timeout)
    except grpc.RpcError as e:
        raise to_exception(e) from None


def id_fields(ids: Any, what: str = "ids") -> dict:
    """``ids`` as request fields: ``{"str_ids": [...]}`` for str ids, else ``{"ids": [...]}``."""
    if isinstance(ids, str):
        raise errors.InvalidIdError(f"{what}: expected a sequence of ids, got one str {ids[:64]!r}; "
                                    f"pass [{ids[:64]!r}]")
    items = ids.tolist() if isinstance(ids, np.ndarray) and ids.dtype.kind in "UO" else \
        ids if isinstance(ids, (list, tuple)) else None
    if items and any(isinstance(i, str) for i in items):
        if not all(isinstance(i, str) for i in items):
            raise errors.InvalidIdError(f"{what}: mixes str and other ids; a collection holds one kind")
        return {"str_ids": list(items)}
    return {"ids": validation.ids(ids, what=what).tolist()}


def filter_struct(where: Any) -> Any:
    """A filter dict as a ``Struct``; a filter that is not a JSON object raises ``FilterError``."""
    if not isinstance(where, dict):
        raise errors.FilterError(f"filter: expected a dict, got {type(where).__name__}")
    try:
        return to_struct(where, "filter")
    except errors.InvalidInputError as e:
        raise errors.FilterError(str(e)) from None


def include_names(include: Any) -> list[str]:
    """``include`` as a list of names (one str is one name)."""
    return [include] if isinstance(include, str) else list(include)


def _rows_of(values: Any, n: int, what: str, kind: type) -> list | None:
    """Per-row ``values`` (None: no row has one), checked: one ``kind`` or None per row."""
    if values is None:
        return None
    if isinstance(values, (str, dict)) or not isinstance(values, (list, tuple)):
        raise errors.InvalidInputError(f"{what}: expected a list with one {kind.__name__} (or None) per row, "
                                       f"got {type(values).__name__}")
    if len(values) != n:
        raise errors.LengthMismatchError(f"{what}: {len(values)} entries for {n} ids; expected one per row")
    for i, v in enumerate(values):
        if v is not None and not isinstance(v, kind):
            raise errors.InvalidInputError(f"{what}[{i}]: expected a {kind.__name__} or None, got {type(v).__name__}")
    return list(values)


class Collection:
    """One collection on the server, with the :class:`vindex.Index` API."""

    def __init__(self, client: "Client", name: str, info: pb.CollectionInfo):
        self._client, self.name = client, name
        self._dim, self._metric = int(info.dim), info.metric
        self._config = json.loads(info.config_json) if info.config_json else {}
        self._id_type = info.id_type or None

    @property
    def id_type(self) -> str | None:
        """"int" or "str"; None while the collection is empty and its first write has not fixed it."""
        if self._id_type is None:
            self._id_type = self._client._describe(self.name).id_type or None
        return self._id_type

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def metric(self) -> str:
        return self._metric

    @property
    def config(self) -> dict:
        """The collection's :class:`vindex.IndexConfig` fields, as a dict."""
        return dict(self._config)

    def __len__(self) -> int:
        return int(self._client._describe(self.name).count)

    def __repr__(self) -> str:
        return f"vindex.Collection({self.name!r}, dim={self._dim}, metric={self._metric!r} @ {self._client.target})"

    def _rows(self, x: Any, what: str) -> np.ndarray:
        """``x`` checked as the library checks it, as little-endian float32 rows."""
        return np.ascontiguousarray(validation.vectors(x, self._dim, what=what), dtype="<f4")

    def _stub_call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        return _call(getattr(self._client._stub, method), request, timeout if timeout is not None else self._client.timeout)

    # --- search ---------------------------------------------------------------------------
    def search(self, queries: Any, k: int = 10, *, filter: dict | None = None, include: Any = (),
               max_postings: int | None = None, eps: float | None = None, ef: int | None = None,
               timeout: float | None = None) -> SearchResult:
        """The ``k`` nearest stored vectors of each query (among the records matching
        ``filter``), with the ``include``d fields; see :meth:`vindex.Index.search`.
        ``timeout`` is the call's gRPC deadline (default: the client's); reads the server
        still has queued just before it are dropped and the result is ``partial``."""
        k = validation.k(k)
        timeout = None if timeout is None else validation.seconds(timeout, "timeout")
        q = self._rows(queries, "queries")
        include = include_names(include)
        req = pb.SearchRequest(collection=self.name, queries=q.tobytes(), dim=q.shape[1], nq=q.shape[0], k=k,
                               max_postings=0 if max_postings is None else validation.positive_int(
                                   max_postings, "max_postings", upper=4096),
                               ef=0 if ef is None else validation.positive_int(ef, "ef", upper=65536),
                               include=include)
        if eps is not None:
            req.eps = check_eps(eps)
        if filter is not None:
            req.filter.CopyFrom(filter_struct(filter))
        return search_result(self._stub_call("Search", req, timeout), include)

    # --- updates --------------------------------------------------------------------------
    def _records(self, ids: Any, vectors: Any) -> tuple[dict, list, np.ndarray]:
        """Request id fields, the ids as a list, and the vectors, checked as the library checks them."""
        fields, x = id_fields(ids), self._rows(vectors, "vectors")
        i = next(iter(fields.values()))
        validation.same_length(np.empty(len(i)), x)
        return fields, i, x

    def _request(self, ids: Any, vectors: Any, add_only: bool, metadata: Any = None,
                 documents: Any = None) -> pb.UpsertRequest:
        fields, i, x = self._records(ids, vectors)
        n = len(i)
        req = pb.UpsertRequest(collection=self.name, vectors=x.tobytes(), dim=x.shape[1], add_only=add_only,
                               **fields)
        encode_rows(req, _rows_of(metadata, n, "metadata", dict), _rows_of(documents, n, "documents", str))
        return req

    def upsert(self, ids: Any, vectors: Any, *, metadata: Any = None, documents: Any = None) -> None:
        """Insert ``ids`` or replace their records (vector, and ``metadata`` / ``documents``:
        one dict / str or None per row); returns once durable and visible."""
        self._stub_call("Upsert", self._request(ids, vectors, False, metadata, documents))

    def add(self, ids: Any, vectors: Any, *, metadata: Any = None, documents: Any = None) -> None:
        """Insert new ids; raises :class:`vindex.IdExistsError` (a ``DuplicateIdError``) naming
        ids already stored, writing nothing."""
        self._stub_call("Upsert", self._request(ids, vectors, True, metadata, documents))

    def upsert_stream(self, batches: Iterable[tuple]) -> Iterator[pb.UpsertAck]:
        """Stream ``(ids, vectors)`` or ``(ids, vectors, metadata, documents)`` batches in one
        call; yields each batch's acknowledgement (``chunk``, ``upserted``, ``total``) once that
        batch is durable."""
        failed: list[BaseException] = []

        def requests() -> Iterator[pb.UpsertRequest]:
            # runs on a gRPC thread, which would turn any exception into UNKNOWN "Exception
            # iterating requests!": end the stream instead and re-raise it here
            try:
                for batch in batches:
                    yield self._request(batch[0], batch[1], False, *batch[2:])
            except Exception as e:
                failed.append(e)

        try:
            yield from self._client._stub.UpsertStream(requests(), timeout=self._client.timeout)
        except grpc.RpcError as e:
            if failed:
                raise failed[0] from None
            raise to_exception(e) from None
        if failed:
            raise failed[0]

    def upsert_many(self, ids: Any, vectors: Any, chunk: int = STREAM_CHUNK, *, metadata: Any = None,
                    documents: Any = None) -> int:
        """Upsert a large array through one stream in ``chunk``-row messages; returns rows stored."""
        _, i, x = self._records(ids, vectors)
        meta, docs = _rows_of(metadata, len(i), "metadata", dict), _rows_of(documents, len(i), "documents", str)

        def part(rows: list | None, lo: int) -> list | None:
            return None if rows is None else rows[lo:lo + chunk]
        total = 0
        for ack in self.upsert_stream((i[lo:lo + chunk], x[lo:lo + chunk], part(meta, lo), part(docs, lo))
                                      for lo in range(0, len(i), chunk)):
            total = ack.total
        return int(total)

    def delete(self, ids: Any = None, *, filter: dict | None = None) -> int:
        """Delete ``ids``, or every record matching ``filter`` (exactly one of them); returns
        how many were live (unknown ids are ignored)."""
        if (ids is None) == (filter is None):
            raise errors.InvalidInputError("delete: pass either ids or filter=, exactly one of them")
        req = pb.DeleteRequest(collection=self.name, **({} if ids is None else id_fields(ids)))
        if filter is not None:
            req.filter.CopyFrom(filter_struct(filter))
        return int(self._stub_call("Delete", req).deleted)

    def get(self, ids: Any, *, include: Any = ()) -> Any:
        """Stored vectors of ``ids`` and a found mask, as :meth:`vindex.Index.get`; unpacks as
        ``(vectors, found)`` and carries ``.metadata`` / ``.documents`` when included."""
        include = include_names(include)
        res = self._stub_call("Get", pb.GetRequest(collection=self.name, include=include, **id_fields(ids)))
        return get_result(res, include)

    def count(self, filter: dict | None = None) -> int:
        """Live records (matching ``filter``)."""
        req = pb.CountRequest(collection=self.name)
        if filter is not None:
            req.filter.CopyFrom(filter_struct(filter))
        return int(self._stub_call("Count", req).count)

    def scroll(self, filter: dict | None = None, *, batch: int = 1000, include: Any = (),
               cursor: int | None = None) -> Iterator[Any]:
        """Every live record (matching ``filter``) in a stable order, ``batch`` per page, as
        :meth:`vindex.Index.scroll`: pages with ``.ids``, ``.cursor`` (pass it as ``cursor=`` to
        resume after that page) and the ``include``d fields. One call per page."""
        req = pb.ScrollRequest(collection=self.name, batch=validation.positive_int(batch, "batch", upper=2**31),
                               include=include_names(include))
        if filter is not None:
            req.filter.CopyFrom(filter_struct(filter))
        return scroll_pages(lambda token: self._stub_call("Scroll", _with_token(req, token)), req.include,
                            "" if cursor is None else str(int(cursor)))

    def set_metadata(self, ids: Any, metadata: Any, *, merge: bool = True) -> None:
        """Change the metadata of stored ``ids`` (one dict per id, or one dict for all) without
        re-sending vectors: ``merge`` updates top-level keys, else replaces. Ids not stored
        raise :class:`vindex.UnknownIdError`, changing nothing."""
        fields = id_fields(ids)
        n = len(next(iter(fields.values())))
        rows = [metadata] if isinstance(metadata, dict) else _rows_of(metadata, n, "metadata", dict)
        if rows is None or any(m is None for m in rows):
            raise errors.InvalidInputError("metadata: expected a dict, or one dict per id")
        req = pb.SetMetadataRequest(collection=self.name, metadata=[to_struct(m) for m in rows], replace=not merge,
                                    **fields)
        self._stub_call("SetMetadata", req)

    # --- maintenance ----------------------------------------------------------------------
    def stats(self) -> dict:
        return json.loads(self._stub_call("Stats", pb.StatsRequest(collection=self.name)).stats_json)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for the collection's background rebalancing (and checkpoint it); False if
        ``timeout`` seconds pass first."""
        return bool(self._stub_call("Flush", pb.FlushRequest(collection=self.name, wait_idle=True),
                                    timeout=None if timeout is None else timeout + 1.0).idle)

    def checkpoint(self) -> None:
        """Checkpoint the collection so a restart replays no log."""
        self._stub_call("Flush", pb.FlushRequest(collection=self.name))


def _with_token(req: pb.ScrollRequest, token: str) -> pb.ScrollRequest:
    out = pb.ScrollRequest()
    out.CopyFrom(req)
    out.page_token = token
    return out


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                             "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class _ApiKey(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Sends ``x-api-key`` with every call."""

    def __init__(self, key: str):
        self._md = (("x-api-key", key),)

    def _details(self, d: grpc.ClientCallDetails) -> _CallDetails:
        return _CallDetails(d.method, d.timeout, tuple(d.metadata or ()) + self._md, d.credentials,
                            d.wait_for_ready, getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_stream(self, continuation: Any, details: grpc.ClientCallDetails, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def _pem(value: str | bytes | os.PathLike | None, what: str) -> bytes | None:
    """PEM bytes as given, or read from a path."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (str, os.PathLike)):
        with open(value, "rb") as f:
            return f.read()
    raise TypeError(f"{what}: expected a path or PEM bytes, got {type(value).__name__}")


class Client:
    """A connection to a vindex server at ``target`` (``host:port``).

    ``timeout`` (seconds) is the deadline of every call; ``None`` waits as long as needed.
    ``api_key`` is sent as ``x-api-key`` with every call (servers started with ``--tenants``
    require one). ``tls_root_cert`` (a path or PEM bytes) turns on TLS and trusts the CA that
    signed the server's certificate; ``tls_client_cert`` and ``tls_client_key`` present a client
    certificate to a server that requires one. ``credentials`` gives full control instead.
    """

    def __init__(self, target: str = "127.0.0.1:50051", *, timeout: float | None = 60.0,
                 api_key: str | None = None, tls_root_cert: str | bytes | os.PathLike | None = None,
                 tls_client_cert: str | bytes | os.PathLike | None = None,
                 tls_client_key: str | bytes | os.PathLike | None = None,
                 credentials: grpc.ChannelCredentials | None = None):
        self.target, self.timeout = target, timeout
        if api_key is not None and (not isinstance(api_key, str) or not re.fullmatch(r"[\x21-\x7e]+", api_key)):
            raise ValueError("api_key: expected a non-empty string of printable ASCII without spaces")
        tls = (tls_root_cert, tls_client_cert, tls_client_key)
        if any(v is not None for v in tls):
            if credentials is not None:
                raise ValueError("credentials: give either credentials or tls_* arguments, not both")
            if (tls_client_cert is None) != (tls_client_key is None):
                raise ValueError("tls_client_cert and tls_client_key: expected both or neither")
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_pem(tls_root_cert, "tls_root_cert"),
                private_key=_pem(tls_client_key, "tls_client_key"),
                certificate_chain=_pem(tls_client_cert, "tls_client_cert"))
        opts = grpc_options()
        self._channel = (grpc.secure_channel(target, credentials, options=opts) if credentials
                         else grpc.insecure_channel(target, options=opts))
        calls = self._channel if api_key is None else grpc.intercept_channel(self._channel, _ApiKey(api_key))
        self._stub = pb_grpc.VectorIndexStub(calls)

    def _describe(self, name: str) -> pb.CollectionInfo:
        return _call(self._stub.DescribeCollection, pb.DescribeCollectionRequest(name=name), self.timeout)

    def create_collection(self, name: str, *, dim: int, metric: str = "l2", exist_ok: bool = False,
                          id_type: str | None = None, **config: Any) -> Collection:
        """Create an empty collection of ``id_type`` ("int" or "str"; None: its first write
        fixes it); ``config`` sets :class:`vindex.IndexConfig` fields. Raises
        :class:`CollectionExistsError` unless ``exist_ok``."""
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 1 <= dim <= 65536:
            raise validation.DimensionError(f"dim: expected an integer in 1..65536, got {dim!r}")
        if id_type is not None and not isinstance(id_type, str):
            raise errors.InvalidInputError(f"id_type: expected 'int', 'str' or None, got {id_type!r}")
        req = pb.CreateCollectionRequest(name=name, dim=int(dim), metric=metric,
                                         config_json=json.dumps(config) if config else "", if_not_exists=exist_ok,
                                         id_type=id_type or "")
        return Collection(self, name, _call(self._stub.CreateCollection, req, self.timeout))

    def collection(self, name: str) -> Collection:
        """Open an existing collection; raises :class:`CollectionNotFoundError` if there is none."""
        return Collection(self, name, self._describe(name))

    def list_collections(self) -> list[str]:
        res = _call(self._stub.ListCollections, pb.ListCollectionsRequest(), self.timeout)
        return [c.name for c in res.collections]

    def drop_collection(self, name: str) -> bool:
        """Drop a collection and its data; False if there was none of that name."""
        return bool(_call(self._stub.DropCollection, pb.DropCollectionRequest(name=name), self.timeout).dropped)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the server's health check reports SERVING."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
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
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
