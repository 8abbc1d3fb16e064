"""A LlamaIndex vector store over vindex: ``VindexVectorStore``.

Records are LlamaIndex nodes: the node id is the vindex (str) id, the node's text the vindex
document, and its metadata the node metadata plus what LlamaIndex needs to rebuild the node
(``_node_content``, ``_node_type``, ``ref_doc_id``/``doc_id``/``document_id``) and ``_node_id``,
so that queries restricted to node ids are filters too. Needs ``vindex[llamaindex]``.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, List, Optional, Sequence

import numpy as np
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.schema import BaseNode, MetadataMode, TextNode
from llama_index.core.vector_stores.types import (BasePydanticVectorStore, MetadataFilters, VectorStoreQuery,
                                                  VectorStoreQueryMode, VectorStoreQueryResult)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict

from vindex.config import check_metric
from vindex.errors import InvalidConfigError, InvalidInputError

from .backing import Backing
from .llama_index_query import all_of, mmr_select, similarities, to_vindex_filter

__all__ = ["VindexVectorStore", "NODE_ID_KEY"]

NODE_ID_KEY = "_node_id"
_PAYLOAD = ["metadata", "documents"]
_MODES = (VectorStoreQueryMode.DEFAULT, VectorStoreQueryMode.MMR)


class VindexVectorStore(BasePydanticVectorStore):
    """LlamaIndex vector store over an embedded :class:`vindex.Index` or a remote
    :class:`vindex.Collection`.

    ``VindexVectorStore(path)`` opens the index at ``path``, or creates it (``id_type="str"``,
    ``metric``, ``index_config`` as :class:`vindex.IndexConfig` fields) on the first ``add``
    with the nodes' embedding dimension; without ``path`` the index lives in a temporary
    directory removed by :meth:`close`. ``collection=`` (a ``vindex.Client`` collection of str
    ids or still empty) serves the store from a server instead. Similarity scores: ``cos``
    (cosine), ``<q, x>`` (ip), ``1 / (1 + squared L2)`` (l2); MMR mode scores as llama-index's
    ``get_top_k_mmr_embeddings`` does.
    """

    stores_text: bool = True
    flat_metadata: bool = False
    path: Optional[str] = None
    metric: Optional[str] = None
    batch_size: int = 1000

    _backing: Any = PrivateAttr(default=None)

    def __init__(self, path: str | os.PathLike | None = None, *, collection: Any = None,
                 metric: str | None = None, batch_size: int = 1000, flat_metadata: bool = False,
                 **index_config: Any) -> None:
        if metric is not None:
            check_metric(metric)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInputError(f"batch_size: expected a positive int, got {batch_size!r}")
        super().__init__(path=None if path is None else os.fspath(path), metric=metric, batch_size=batch_size,
                         flat_metadata=flat_metadata)
        self._backing = Backing(self, path=path, collection=collection, metric=metric or "cosine",
                                index_config=index_config, check=self._check)

    # --- the index behind the store ----------------------------------------------------------------
    @classmethod
    def class_name(cls) -> str:
        return "VindexVectorStore"

    @property
    def client(self) -> Any:
        """The :class:`vindex.Index` or :class:`vindex.Collection` the store reads and writes
        (None for an embedded index not created yet)."""
        return self._backing.records

    def _check(self, records: Any) -> None:
        """Refuse an index or collection of int ids, or of another metric than the one asked for."""
        if records.id_type not in (None, "str"):
            raise InvalidInputError(f"{records!r} holds {records.id_type} ids; a LlamaIndex store needs str ids "
                                    "(node ids)")
        if self.metric is not None and records.metric != self.metric:
            raise InvalidConfigError(f"metric: {records!r} uses {records.metric!r}, not {self.metric!r}")

    def close(self) -> None:
        """Close the embedded index (removing it when temporary); a collection stays open."""
        self._backing.close()

    def __enter__(self) -> "VindexVectorStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- writes ------------------------------------------------------------------------------------
    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> List[str]:
        """Store ``nodes`` (with their embeddings) under their node ids, replacing records of
        the same ids; returns the ids. Durable and searchable on return."""
        if not nodes:
            return []
        for i, node in enumerate(nodes):
            if node.embedding is None:
                raise InvalidInputError(f"nodes[{i}] ({node.node_id!r}) has no embedding; embed nodes before "
                                        "adding them (VectorStoreIndex does)")
            if len(node.embedding) != len(nodes[0].embedding):
                raise InvalidInputError(f"nodes[{i}] ({node.node_id!r}): embedding of length {len(node.embedding)}, "
                                        f"but nodes[0] has {len(nodes[0].embedding)}")
        ids = [node.node_id for node in nodes]
        vectors = np.asarray([node.embedding for node in nodes], dtype=np.float32)
        metadata = [self._metadata_of(node) for node in nodes]
        documents = [node.get_content(metadata_mode=MetadataMode.NONE) for node in nodes]
        target = self._backing.for_writing(int(vectors.shape[1]))
        for lo in range(0, len(ids), self.batch_size):
            part = slice(lo, lo + self.batch_size)
            target.upsert(ids[part], vectors[part], metadata=metadata[part], documents=documents[part])
        return ids

    def _metadata_of(self, node: BaseNode) -> dict:
        meta = node_to_metadata_dict(node, remove_text=True, flat_metadata=self.flat_metadata)
        meta[NODE_ID_KEY] = node.node_id
        return meta

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node of the source document ``ref_doc_id``."""
        if self.client is not None:
            self.client.delete(filter={"ref_doc_id": ref_doc_id})

    def delete_nodes(self, node_ids: Optional[List[str]] = None, filters: Optional[MetadataFilters] = None,
                     **delete_kwargs: Any) -> None:
        """Delete the nodes among ``node_ids`` that match ``filters`` (either may be None: no
        restriction; both None deletes every node, as llama-index's SimpleVectorStore does)."""
        where = to_vindex_filter(filters)
        if self.client is None:
            return
        if where is None and node_ids is not None:
            self.client.delete(list(node_ids))
        else:
            self.client.delete(filter=all_of(_ids_filter(node_ids), where) or {})

    def clear(self) -> None:
        """Delete every node."""
        if self.client is not None:
            self.client.delete(filter={})

    # --- reads -------------------------------------------------------------------------------------
    def get_nodes(self, node_ids: Optional[List[str]] = None,
                  filters: Optional[MetadataFilters] = None) -> List[BaseNode]:
        """The stored nodes among ``node_ids`` (in that order, missing ones skipped) that match
        ``filters``; every node when both are None."""
        where = to_vindex_filter(filters)
        if self.client is None:
            return []
        if where is None and node_ids is not None:
            got = self.client.get(list(node_ids), include=_PAYLOAD)
            return [_node(i, m, d) for i, ok, m, d in zip(node_ids, got.found, got.metadata, got.documents) if ok]
        nodes: list[BaseNode] = []
        for page in self.client.scroll(all_of(_ids_filter(node_ids), where), include=_PAYLOAD):
            nodes.extend(_node(i, m, d) for i, m, d in zip(page.ids, page.metadata, page.documents))
        return nodes

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The ``similarity_top_k`` nearest nodes matching ``query.filters`` (and ``doc_ids``,
        ``node_ids`` unless empty), best first. MMR mode fetches ``mmr_prefetch_k`` candidates (default
        ``mmr_prefetch_factor`` (4) x top_k) and re-ranks them with ``mmr_threshold`` (the
        query's, else the keyword argument, else 0.5)."""
        if query.mode not in _MODES:
            raise InvalidInputError(f"query mode {query.mode.value!r} is not supported; VindexVectorStore "
                                    "answers 'default' and 'mmr'")
        if query.query_embedding is None:
            raise InvalidInputError("query: query_embedding is required (VindexVectorStore searches by vector)")
        # empty node_ids / doc_ids restrict nothing: VectorStoreIndex's retriever sends node_ids=[]
        # for stores that keep the text (as Chroma and Qdrant read it too)
        where = all_of(to_vindex_filter(query.filters), _ids_filter(query.node_ids or None),
                       {"ref_doc_id": {"$in": list(query.doc_ids)}} if query.doc_ids else None)
        if self.client is None:
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        k = query.similarity_top_k
        mmr = query.mode == VectorStoreQueryMode.MMR
        fetch = _prefetch(k, kwargs) if mmr else k
        res = self.client.search(np.asarray(query.query_embedding, dtype=np.float32), fetch, filter=where,
                                  include=_PAYLOAD + ["vectors"] if mmr else _PAYLOAD)
        hits = [j for j, i in enumerate(res.ids[0]) if isinstance(i, str)]  # padding: None (or -1 while empty)
        if mmr:
            threshold = query.mmr_threshold if query.mmr_threshold is not None else kwargs.get("mmr_threshold")
            picks, scores = mmr_select(query.query_embedding, res.vectors[0][hits], k, threshold)
            hits = [hits[p] for p in picks]
        else:
            scores = similarities(self.client.metric, res.distances[0][hits])
        ids = [str(res.ids[0][j]) for j in hits]
        nodes = [_node(ids[n], res.metadata[0][j], res.documents[0][j]) for n, j in enumerate(hits)]
        return VectorStoreQueryResult(nodes=nodes, similarities=scores, ids=ids)

    # --- async: the sync call on a worker thread, so the event loop goes on meanwhile ----------------
    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> List[str]:
        return await asyncio.to_thread(self.add, nodes, **kwargs)

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        await asyncio.to_thread(self.delete, ref_doc_id, **delete_kwargs)

    async def adelete_nodes(self, node_ids: Optional[List[str]] = None, filters: Optional[MetadataFilters] = None,
                            **delete_kwargs: Any) -> None:
        await asyncio.to_thread(self.delete_nodes, node_ids, filters, **delete_kwargs)

    async def aclear(self) -> None:
        await asyncio.to_thread(self.clear)

    async def aget_nodes(self, node_ids: Optional[List[str]] = None,
                         filters: Optional[MetadataFilters] = None) -> List[BaseNode]:
        return await asyncio.to_thread(self.get_nodes, node_ids, filters)

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        return await asyncio.to_thread(self.query, query, **kwargs)


def _ids_filter(node_ids: Optional[Sequence[str]]) -> dict | None:
    return None if node_ids is None else {NODE_ID_KEY: {"$in": list(node_ids)}}


def _prefetch(k: int, kwargs: dict) -> int:
    """Candidates an MMR query fetches: ``mmr_prefetch_k``, else ``mmr_prefetch_factor`` x k."""
    if kwargs.get("mmr_prefetch_k") is not None:
        fetch = kwargs["mmr_prefetch_k"]
    else:
        fetch = int(kwargs.get("mmr_prefetch_factor", 4.0) * k)
    if isinstance(fetch, bool) or not isinstance(fetch, int) or fetch < k:
        raise InvalidInputError(f"mmr_prefetch_k: expected an int >= similarity_top_k ({k}), got {fetch!r}")
    return fetch


def _node(node_id: str, metadata: dict | None, document: str | None) -> BaseNode:
    """The node a record holds; records written by other means than this store become
    TextNodes of their document and metadata."""
    if metadata is not None and "_node_content" in metadata:
        return metadata_dict_to_node(metadata, text=document)
    return TextNode(id_=node_id, text=document or "", metadata=metadata or {})
