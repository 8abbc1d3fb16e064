"""The methods of the clients and their collections, each written once.

Every ``client_method`` here checks its arguments as the library does and returns the call to
make (``service/calls.py``); ``Client`` / ``Collection`` run it blocking and ``AsyncClient`` /
``AsyncCollection`` as a coroutine, so both have one signature, docstring and result per method.
"""
from __future__ import annotations

import functools
import json
from typing import Any, Iterable

import numpy as np

from vindex import errors, validation
from vindex.config import MAX_SEARCH_THREADS
from vindex.results import GetResult, SearchResult
from vindex.aps import check_target
from vindex.validation import check_eps

from . import vindex_pb2 as pb
from .arguments import id_fields, include_names, rows_of, set_filter
from .calls import Call, MethodsBase, Pages, StreamTotal, UpsertStream, client_method
from .channels import ClientBase, Connection
from .payloads import arrow_bytes, encode_rows, is_arrow_table, to_struct
from .remote_results import get_result, search_result

#: Rows per message when ``upsert_many`` splits an array.
STREAM_CHUNK = 2048


class CollectionMethods(MethodsBase):
    """A collection handle: what it knows of its collection (name, dim, metric, config, id
    type once known), the checks its methods share, and its methods; ``Collection`` runs
    their calls blocking, ``AsyncCollection`` as coroutines."""

    def __init__(self, client: Any, name: str, info: pb.CollectionInfo):
        self._client, self.name = client, name
        self._dim, self._metric = int(info.dim), info.metric
        self._config = json.loads(info.config_json) if info.config_json else {}
        self._id_type = info.id_type or None

    @property
    def _connection(self) -> Connection:
        return self._client._connection

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

    def __repr__(self) -> str:
        return (f"vindex.{type(self).__name__}({self.name!r}, dim={self._dim}, metric={self._metric!r} "
                f"@ {self._client.target})")

    def _rows(self, x: Any, what: str) -> np.ndarray:
        """``x`` checked as the library checks it, as little-endian float32 rows."""
        return np.ascontiguousarray(validation.vectors(x, self._dim, what=what), dtype="<f4")

    def _records(self, ids: Any, vectors: Any) -> tuple[dict, list, np.ndarray]:
        """Request id fields, the ids as a list, and the vectors, checked as the library checks them."""
        fields, x = id_fields(ids), self._rows(vectors, "vectors")
        i = next(iter(fields.values()))
        validation.same_length(np.empty(len(i)), x)
        return fields, i, x

    def _request(self, ids: Any, vectors: Any, add_only: bool = False, metadata: Any = None,
                 documents: Any = None) -> pb.UpsertRequest:
        fields, i, x = self._records(ids, vectors)
        n = len(i)
        req = pb.UpsertRequest(collection=self.name, vectors=x.tobytes(), dim=x.shape[1], add_only=add_only,
                               **fields)
        if is_arrow_table(metadata):  # columns: the server hands them to Index.upsert as they are
            if metadata.num_rows != n:
                raise errors.LengthMismatchError(f"metadata: {metadata.num_rows} rows for {n} ids; expected one per row")
            req.metadata_arrow = arrow_bytes(metadata)
            metadata = None
        encode_rows(req, rows_of(metadata, n, "metadata", dict), rows_of(documents, n, "documents", str))
        return req

    def _write(self, ids: Any, vectors: Any, add_only: bool, metadata: Any, documents: Any) -> Call[None]:
        req = self._request(ids, vectors, add_only, metadata, documents)
        # a stored write fixes an empty collection's id type to the kind it sent
        kind = "str" if len(req.str_ids) else "int" if len(req.ids) else None
        return Call("Upsert", req, lambda _: self._learn_id_type(kind))

    def _learn_id_type(self, kind: str | None) -> None:
        if self._id_type is None:
            self._id_type = kind

    def _stream(self, batches: Any) -> UpsertStream:
        """An UpsertStream of ``(ids, vectors[, metadata, documents])`` batches."""
        return UpsertStream(batches, lambda batch: self._request(batch[0], batch[1], False, *batch[2:]))

    @client_method
    def search(self, queries: Any, k: int = 10, *, filter: dict | None = None, include: Any = (),
               max_postings: int | None = None, eps: float | None = None, ef: int | None = None,
               timeout: float | None = None, threads: int | None = None,
               recall_target: float | None = None) -> Call[SearchResult]:
        """The ``k`` nearest stored vectors of each query (among the records matching
        ``filter``), with the ``include``d fields; see :meth:`vindex.Index.search`
        (``recall_target``: stop reading postings once the estimated recall reaches it).
        ``timeout`` is the call's gRPC deadline (default: the client's); reads the server
        still has queued just before it are dropped and the result is ``partial``.
        ``threads``: cores the server searches the batch with (default: the collection's
        ``search_threads``; the server refuses more than its ``--max-search-threads``)."""
        k = validation.k(k)
        timeout = None if timeout is None else validation.seconds(timeout, "timeout")
        q = self._rows(queries, "queries")
        include = include_names(include)
        req = pb.SearchRequest(collection=self.name, queries=q.tobytes(), dim=q.shape[1], nq=q.shape[0], k=k,
                               max_postings=0 if max_postings is None else validation.positive_int(
                                   max_postings, "max_postings", upper=4096),
                               ef=0 if ef is None else validation.positive_int(ef, "ef", upper=65536),
                               threads=0 if threads is None else validation.positive_int(
                                   threads, "threads", upper=MAX_SEARCH_THREADS),
                               include=include)
        if eps is not None:
            req.eps = check_eps(eps)
        if recall_target is not None:
            req.recall_target = check_target(recall_target)
        set_filter(req, filter)
        return Call("Search", req, functools.partial(search_result, include=include), timeout)

    @client_method
    def upsert(self, ids: Any, vectors: Any, *, metadata: Any = None, documents: Any = None) -> Call[None]:
        """Insert ``ids`` or replace their records (vector, and ``metadata`` / ``documents``:
        one dict / str or None per row; ``metadata`` also as columns, a pyarrow Table or
        RecordBatch); returns once durable and visible."""
        return self._write(ids, vectors, False, metadata, documents)

    @client_method
    def add(self, ids: Any, vectors: Any, *, metadata: Any = None, documents: Any = None) -> Call[None]:
        """Insert new ids; raises :class:`vindex.IdExistsError` (a ``DuplicateIdError``) naming
        ids already stored, writing nothing."""
        return self._write(ids, vectors, True, metadata, documents)

    @client_method
    def upsert_stream(self, batches: Iterable[tuple]) -> UpsertStream:
        """Stream ``(ids, vectors)`` or ``(ids, vectors, metadata, documents)`` batches in one
        call; yields each batch's acknowledgement (``chunk``, ``upserted``, ``total``) once that
        batch is durable. ``AsyncCollection`` also takes an async iterable of batches."""
        return self._stream(batches)

    @client_method
    def upsert_many(self, ids: Any, vectors: Any, chunk: int = STREAM_CHUNK, *, metadata: Any = None,
                    documents: Any = None) -> StreamTotal:
        """Upsert a large array through one stream in ``chunk``-row messages; returns rows stored."""
        _, i, x = self._records(ids, vectors)
        meta, docs = rows_of(metadata, len(i), "metadata", dict), rows_of(documents, len(i), "documents", str)

        def part(rows: list | None, lo: int) -> list | None:
            return None if rows is None else rows[lo:lo + chunk]
        return StreamTotal(self._stream((i[lo:lo + chunk], x[lo:lo + chunk], part(meta, lo), part(docs, lo))
                                        for lo in range(0, len(i), chunk)))

    @client_method
    def delete(self, ids: Any = None, *, filter: dict | None = None) -> Call[int]:
        """Delete ``ids``, or every record matching ``filter`` (exactly one of them); returns
        how many were live (unknown ids are ignored)."""
        if (ids is None) == (filter is None):
            raise errors.InvalidInputError("delete: pass either ids or filter=, exactly one of them")
        req = pb.DeleteRequest(collection=self.name, **({} if ids is None else id_fields(ids)))
        set_filter(req, filter)
        return Call("Delete", req, lambda res: int(res.deleted))

    @client_method
    def get(self, ids: Any, *, include: Any = ()) -> Call[GetResult]:
        """Stored vectors of ``ids`` and a found mask, as :meth:`vindex.Index.get`; unpacks as
        ``(vectors, found)`` and carries ``.metadata`` / ``.documents`` when included."""
        include = include_names(include)
        req = pb.GetRequest(collection=self.name, include=include, **id_fields(ids))
        return Call("Get", req, functools.partial(get_result, include=include))

    @client_method
    def count(self, filter: dict | None = None) -> Call[int]:
        """Live records (matching ``filter``)."""
        req = pb.CountRequest(collection=self.name)
        set_filter(req, filter)
        return Call("Count", req, lambda res: int(res.count))

    @client_method
    def scroll(self, filter: dict | None = None, *, batch: int = 1000, include: Any = (),
               cursor: int | None = None) -> Pages:
        """Every live record (matching ``filter``) in a stable order, ``batch`` per page, as
        :meth:`vindex.Index.scroll`: pages with ``.ids``, ``.cursor`` (pass it as ``cursor=`` to
        resume after that page) and the ``include``d fields. One call per page."""
        req = pb.ScrollRequest(collection=self.name, batch=validation.positive_int(batch, "batch", upper=2**31),
                               include=include_names(include))
        set_filter(req, filter)
        return Pages(req, list(req.include), "" if cursor is None else str(int(cursor)))

    @client_method
    def set_metadata(self, ids: Any, metadata: Any, *, merge: bool = True) -> Call[None]:
        """Change the metadata of stored ``ids`` (one dict per id, or one dict for all) without
        re-sending vectors: ``merge`` updates top-level keys, else replaces. Ids not stored
        raise :class:`vindex.UnknownIdError`, changing nothing."""
        fields = id_fields(ids)
        n = len(next(iter(fields.values())))
        rows = [metadata] if isinstance(metadata, dict) else rows_of(metadata, n, "metadata", dict)
        if rows is None or any(m is None for m in rows):
            raise errors.InvalidInputError("metadata: expected a dict, or one dict per id")
        req = pb.SetMetadataRequest(collection=self.name, metadata=[to_struct(m) for m in rows], replace=not merge,
                                    **fields)
        return Call("SetMetadata", req, lambda _: None)

    @client_method
    def stats(self) -> Call[dict]:
        """The collection's statistics, as :meth:`vindex.Index.stats`."""
        return Call("Stats", pb.StatsRequest(collection=self.name), lambda res: json.loads(res.stats_json))

    @client_method
    def wait_idle(self, timeout: float | None = None) -> Call[bool]:
        """Wait for the collection's background rebalancing (and checkpoint it); False if
        ``timeout`` seconds pass first."""
        return Call("Flush", pb.FlushRequest(collection=self.name, wait_idle=True), lambda res: bool(res.idle),
                    None if timeout is None else timeout + 1.0)

    @client_method
    def checkpoint(self) -> Call[None]:
        """Checkpoint the collection so a restart replays no log."""
        return Call("Flush", pb.FlushRequest(collection=self.name), lambda _: None)


class ClientMethods(ClientBase, MethodsBase):
    """The methods of a client: each subclass runs their calls its own way (``_method``)."""

    _collection_type: type

    @client_method
    def _describe(self, name: str) -> Call[pb.CollectionInfo]:
        """The collection's dimension, metric, config, id type and count."""
        return Call("DescribeCollection", pb.DescribeCollectionRequest(name=name))

    @client_method
    def create_collection(self, name: str, *, dim: int, metric: str = "l2", exist_ok: bool = False,
                          id_type: str | None = None, **config: Any) -> Call[Any]:
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
        return Call("CreateCollection", req, lambda info: self._collection_type(self, name, info))

    @client_method
    def collection(self, name: str) -> Call[Any]:
        """Open an existing collection; raises :class:`CollectionNotFoundError` if there is none."""
        return Call("DescribeCollection", pb.DescribeCollectionRequest(name=name),
                    lambda info: self._collection_type(self, name, info))

    @client_method
    def list_collections(self) -> Call[list[str]]:
        """The names of the collections on the server."""
        return Call("ListCollections", pb.ListCollectionsRequest(), lambda res: [c.name for c in res.collections])

    @client_method
    def drop_collection(self, name: str) -> Call[bool]:
        """Drop a collection and its data; False if there was none of that name."""
        return Call("DropCollection", pb.DropCollectionRequest(name=name), lambda res: bool(res.dropped))
