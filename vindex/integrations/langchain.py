"""``VindexVectorStore``: a LangChain ``VectorStore`` over an embedded ``vindex.Index`` or a
``vindex.Client`` collection (extra ``vindex[langchain]``).

Each LangChain document is one vindex record: its id (a str), the embedding of its
``page_content`` as the vector, ``page_content`` as the record's document and its metadata as the
record's metadata. ``filter=`` is vindex's filter dict (docs/filters.md), passed through.
"""
from __future__ import annotations

import math
import os
import uuid
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.runnables.config import run_in_executor
from langchain_core.vectorstores import VectorStore
from langchain_core.vectorstores.utils import maximal_marginal_relevance

from vindex.errors import LengthMismatchError
from vindex.results import SearchResult
from vindex.validation import positive_int

from .backing import Backing

__all__ = ["VindexVectorStore"]

PAYLOAD = ("metadata", "documents")


def _squared_euclidean_relevance(distance: float) -> float:
    """LangChain's euclidean relevance, from vindex's l2 distance (the squared euclidean one)."""
    return VectorStore._euclidean_relevance_score_fn(math.sqrt(max(distance, 0.0)))


#: vindex distances to LangChain relevance: "cosine" is 1 - cos (LangChain's cosine distance),
#: "ip" is -<q, x> (the negated inner product LangChain's inner-product function expects).
RELEVANCE: dict[str, Callable[[float], float]] = {
    "cosine": VectorStore._cosine_relevance_score_fn,
    "l2": _squared_euclidean_relevance,
    "ip": VectorStore._max_inner_product_relevance_score_fn,
}


def _scored_documents(res: SearchResult) -> list[tuple[Document, float]]:
    """The first query's results as (document, distance), padding dropped; records without a
    document get page_content "" and without metadata {}."""
    dists = res.distances[0].tolist()
    n = len(dists) - dists.count(math.inf)  # padding (+inf) comes last
    ids, metas, texts = res.ids[0].tolist(), res.metadata[0], res.documents[0]
    return [(Document(id=str(ids[j]), page_content=texts[j] or "", metadata=metas[j] or {}), dists[j])
            for j in range(n)]


def _stored_ids(records: Any, ids: Sequence[str]) -> list:
    """``ids`` once each, in order, as the records' kind: in an index of int ids (one written
    without LangChain, whose documents carry the int as a str) the decimal strings as ints,
    others dropped since no record can have them."""
    wanted = list(dict.fromkeys(ids))  # vindex refuses repeated ids in one call
    if records.id_type != "int":
        return wanted
    return [int(i) for i in wanted if isinstance(i, str) and i.isascii() and i.isdigit() and int(i) < 1 << 63]


class VindexVectorStore(VectorStore):
    """A LangChain vector store whose records live in vindex.

    ``path``: an embedded index there, opened if it exists, else created on the first add
    (dimension from the embedding, ``metric``, string ids, ``index_config``: any
    ``vindex.IndexConfig`` field). ``collection``: a ``vindex.Client`` collection (created with
    ``id_type="str"`` or empty). Neither: a temporary embedded index, removed on ``close()`` or
    when the store is garbage collected.
    """

    def __init__(self, embedding: Embeddings, *, path: str | os.PathLike | None = None, collection: Any = None,
                 metric: str = "cosine", **index_config: Any):
        self.embedding = embedding
        self._backing = Backing(self, path=path, collection=collection, metric=metric, index_config=index_config)

    @property
    def embeddings(self) -> Embeddings:
        return self.embedding

    @property
    def index(self) -> Any:
        """The ``vindex.Index`` or ``vindex.Collection`` holding the records (None until the
        first add creates an embedded index)."""
        return self._backing.records

    def close(self) -> None:
        """Close an embedded index (removing a temporary one); a collection stays on its server."""
        self._backing.close()

    def __enter__(self) -> "VindexVectorStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- writes ---------------------------------------------------------------------------
    @staticmethod
    def _rows(texts: list[str], metadatas: list[dict] | None, ids: Sequence[str | None] | None,
              kwargs: dict) -> tuple[list[str], list[dict | None], int]:
        """Ids (uuid4 where none is given), metadata (None for empty) and the batch size, checked."""
        batch_size = kwargs.pop("batch_size", None)
        batch_size = max(len(texts), 1) if batch_size is None else positive_int(batch_size, "batch_size",
                                                                                upper=1 << 62)
        if kwargs:
            raise TypeError(f"add_texts: unexpected keyword argument(s) {sorted(kwargs)}")
        for name, rows in (("metadatas", metadatas), ("ids", ids)):
            if rows is not None and len(rows) != len(texts):
                raise LengthMismatchError(f"{name}: expected one per text ({len(texts)}), got {len(rows)}")
        given = ids if ids is not None else [None] * len(texts)
        metas = [m or None for m in metadatas] if metadatas is not None else [None] * len(texts)
        return [i if i is not None else str(uuid.uuid4()) for i in given], metas, batch_size

    def _upsert(self, ids: list[str], vectors: Any, texts: list[str], metas: list[dict | None],
                batch_size: int) -> list[str]:
        x = np.asarray(vectors, dtype=np.float32)
        records = self._backing.for_writing(x.shape[1])
        for lo in range(0, len(ids), batch_size):
            hi = lo + batch_size
            records.upsert(ids[lo:hi], x[lo:hi], metadata=metas[lo:hi], documents=texts[lo:hi])
        return ids

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *,
                  ids: Sequence[str | None] | None = None, **kwargs: Any) -> list[str]:
        """Embed and store ``texts``; an id already stored is replaced. Returns the ids, uuid4
        strings where ``ids`` gives none. ``batch_size``: texts per write (default all)."""
        texts = list(texts)
        ids_, metas, batch = self._rows(texts, metadatas, ids, kwargs)
        if not texts:
            return []
        return self._upsert(ids_, self.embedding.embed_documents(texts), texts, metas, batch)

    async def aadd_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *,
                         ids: Sequence[str | None] | None = None, **kwargs: Any) -> list[str]:
        texts = list(texts)
        ids_, metas, batch = self._rows(texts, metadatas, ids, kwargs)
        if not texts:
            return []
        vectors = await self.embedding.aembed_documents(texts)
        return await run_in_executor(None, self._upsert, ids_, vectors, texts, metas, batch)

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings, metadatas: list[dict] | None = None, *,
                   ids: list[str] | None = None, **kwargs: Any) -> "VindexVectorStore":
        """A new store (``kwargs``: the constructor's) holding ``texts``."""
        store = cls(embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    def delete(self, ids: list[str] | None = None, *, filter: dict | None = None, **kwargs: Any) -> bool:
        """Delete ``ids`` (unknown ones are ignored), or the records matching ``filter``;
        neither deletes every record."""
        if kwargs:
            raise TypeError(f"delete: unexpected keyword argument(s) {sorted(kwargs)}")
        if ids is not None and filter is not None:
            raise TypeError("delete: give ids or filter, not both")
        records = self._backing.records
        if records is None or (ids is not None and len(ids) == 0):
            return True
        if ids is None:
            records.delete(filter={} if filter is None else filter)
        else:
            records.delete(_stored_ids(records, ids))
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The stored documents of ``ids``, in that order; ids not stored are skipped."""
        records = self._backing.records
        wanted = [] if records is None else _stored_ids(records, ids)
        if not wanted:
            return []
        got = records.get(wanted, include=PAYLOAD)
        return [Document(id=str(i), page_content=got.documents[j] or "", metadata=got.metadata[j] or {})
                for j, i in enumerate(wanted) if got.found[j]]

    # --- searches -------------------------------------------------------------------------
    def _search(self, vector: Any, k: int, filter: dict | None, include: tuple[str, ...],
                params: dict) -> SearchResult | None:
        records = self._backing.records
        if records is None:
            return None
        return records.search(np.asarray(vector, dtype=np.float32), k, filter=filter, include=include, **params)

    def similarity_search_with_score_by_vector(self, embedding: list[float], k: int = 4,
                                               filter: dict | None = None, **kwargs: Any
                                               ) -> list[tuple[Document, float]]:
        """The ``k`` records nearest ``embedding`` (matching ``filter``) with their vindex
        distances, nearest first. ``kwargs``: vindex search parameters (``max_postings``,
        ``eps``, ``ef``)."""
        res = self._search(embedding, k, filter, PAYLOAD, kwargs)
        return [] if res is None else _scored_documents(res)

    def similarity_search_with_score(self, query: str, k: int = 4, filter: dict | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """The ``k`` records nearest the query's embedding, with their vindex distances (lower is
        nearer: ``1 - cos``, squared euclidean or ``-<q, x>`` by metric)."""
        return self.similarity_search_with_score_by_vector(self.embedding.embed_query(query), k, filter, **kwargs)

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, filter: dict | None = None,
                                    **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k, filter, **kwargs)]

    def similarity_search(self, query: str, k: int = 4, filter: dict | None = None,
                          **kwargs: Any) -> list[Document]:
        return self.similarity_search_by_vector(self.embedding.embed_query(query), k, filter, **kwargs)

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return RELEVANCE[self._backing.metric]

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                lambda_mult: float = 0.5, filter: dict | None = None,
                                                **kwargs: Any) -> list[Document]:
        """``k`` of the ``fetch_k`` records nearest ``embedding``, chosen by maximal marginal
        relevance from their stored vectors."""
        res = self._search(embedding, max(fetch_k, k), filter, PAYLOAD + ("vectors",), kwargs)
        if res is None:
            return []
        scored = _scored_documents(res)
        chosen = maximal_marginal_relevance(np.asarray(embedding, dtype=np.float32), res.vectors[0][:len(scored)],
                                            lambda_mult=lambda_mult, k=k)
        return [scored[j][0] for j in chosen]

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      filter: dict | None = None, **kwargs: Any) -> list[Document]:
        return self.max_marginal_relevance_search_by_vector(self.embedding.embed_query(query), k, fetch_k,
                                                            lambda_mult, filter, **kwargs)

    # --- async: the embedding's own async calls, then the search on an executor thread ----
    async def asimilarity_search_with_score(self, query: str, k: int = 4, filter: dict | None = None,
                                            **kwargs: Any) -> list[tuple[Document, float]]:
        vector = await self.embedding.aembed_query(query)
        return await run_in_executor(None, self.similarity_search_with_score_by_vector, vector, k, filter, **kwargs)

    async def asimilarity_search(self, query: str, k: int = 4, filter: dict | None = None,
                                 **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in await self.asimilarity_search_with_score(query, k, filter, **kwargs)]

    async def amax_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20,
                                             lambda_mult: float = 0.5, filter: dict | None = None,
                                             **kwargs: Any) -> list[Document]:
        vector = await self.embedding.aembed_query(query)
        return await run_in_executor(None, self.max_marginal_relevance_search_by_vector, vector, k, fetch_k,
                                     lambda_mult, filter, **kwargs)
