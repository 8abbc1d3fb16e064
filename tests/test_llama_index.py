"""vindex.integrations.llama_index: the LlamaIndex vector store.

The MetadataFilters translation against llama-index's own filter semantics (both evaluated on
the same records), MMR against llama-index's get_top_k_mmr_embeddings, every store method over
an embedded index and over a collection of an in-process server, and VectorStoreIndex end to
end with a deterministic embedding and MockLLM. Nothing may reach the network: a fixture
refuses every non-loopback connection made from Python (tiktoken, nltk, HF downloads).
"""
from __future__ import annotations

import asyncio
import gc
import hashlib
import itertools
import os
import re
import socket

import numpy as np
import pytest
from llama_index.core import Settings, StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.indices.query.embedding_utils import get_top_k_mmr_embeddings
from llama_index.core.llms import MockLLM
from llama_index.core.schema import Document, NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.types import (FilterCondition, MetadataFilter, MetadataFilters,
                                                  VectorStoreQuery, VectorStoreQueryMode)
from llama_index.core.vector_stores.utils import build_metadata_filter_fn

import vindex
from test_service_payload import client, served  # noqa: F401  (fixtures: an in-process server)
from vindex.filters import compile_filter, matches
from vindex.integrations.llama_index import VindexVectorStore
from vindex.integrations.llama_index_query import mmr_select, similarities, to_vindex_filter

DIM = 8


# --- no downloads ------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Python-level connections anywhere but loopback fail (gRPC's own sockets are C-level)."""
    real = socket.socket.connect

    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if self.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"a test tried to reach the network: {address!r}")
        return real(self, address)
    monkeypatch.setattr(socket.socket, "connect", connect)


def test_the_network_is_refused():
    with pytest.raises(AssertionError, match="tried to reach the network"):
        socket.create_connection(("192.0.2.1", 443), timeout=1)


# --- filter translation ------------------------------------------------------------------------------
def F(key, value, op="=="):
    return MetadataFilter(key=key, value=value, operator=op)


def test_translation_shapes():
    assert to_vindex_filter(None) is None
    assert to_vindex_filter(MetadataFilters(filters=[])) is None
    assert to_vindex_filter(MetadataFilters(filters=[F("a", 1)])) == {"a": {"$eq": 1}}
    both = MetadataFilters(filters=[F("a", 1, ">="), F("b", ["x", "y"], "nin")], condition="or")
    assert to_vindex_filter(both) == {"$or": [{"a": {"$gte": 1}}, {"b": {"$nin": ["x", "y"]}}]}
    nested = MetadataFilters(filters=[F("a", "x", "!="), MetadataFilters(filters=[F("p", 3, "<"), F("p", 9, ">")],
                                                                          condition="or")])
    assert to_vindex_filter(nested) == {"$and": [{"a": {"$ne": "x"}}, {"$or": [{"p": {"$lt": 3}}, {"p": {"$gt": 9}}]}]}
    assert to_vindex_filter(MetadataFilters(filters=[F("a", 1), F("b", 2)], condition="not")) == \
        {"$not": {"$or": [{"a": {"$eq": 1}}, {"b": {"$eq": 2}}]}}
    assert to_vindex_filter(MetadataFilters(filters=[F("t", ["x", "y"], "all")])) == \
        {"$and": [{"t": {"$eq": "x"}}, {"t": {"$eq": "y"}}]}
    assert to_vindex_filter(MetadataFilters(filters=[F("t", "x", "contains")])) == {"t": {"$eq": "x"}}


@pytest.mark.parametrize("filters,message", [
    (MetadataFilters(filters=[F("title", "rag", "text_match")]),
     r"^filters\[0\]: operator 'text_match' on key 'title' has no vindex equivalent \(supported: ==, !="),
    (MetadataFilters(filters=[F("a", 1), MetadataFilters(filters=[F("t", None, "is_empty")])]),
     r"^filters\[1\]\[0\]: operator 'is_empty' on key 't' has no vindex equivalent"),
    (MetadataFilters(filters=[F("p", [1, 2], ">")]),
     r"^filters\[0\]: operator '>' on key 'p' expects one value, got a list \[1, 2\]; use 'in'"),
    (MetadataFilters(filters=[F("p", 3, "in")]), r"^filters\[0\]: operator 'in' on key 'p' expects a list of values, got 3"),
])
def test_untranslatable_filters_name_the_problem(filters, message):
    with pytest.raises(vindex.FilterError, match=message):
        to_vindex_filter(filters)


def _records(n: int = 300) -> list[dict]:
    rng = np.random.default_rng(7)
    out = []
    for r in range(n):
        meta = {"page": int(rng.integers(0, 20)), "score": float(rng.normal()), "src": f"f{rng.integers(0, 5)}",
                "tags": [f"t{t}" for t in rng.choice(6, size=int(rng.integers(0, 4)), replace=False)]}
        for key in ("page", "src", "tags"):
            if rng.random() < 0.15:
                del meta[key]
        if rng.random() < 0.1:
            meta["src"] = None
        out.append(meta)
    return out


def _leaves(rng: np.random.Generator) -> MetadataFilter:
    """A random leaf filter of a kind whose llama-index evaluation is well defined on _records
    (scalar operators on scalar keys, list operators on the tags list)."""
    kind = rng.integers(0, 4)
    if kind == 0:
        return F("page", int(rng.integers(0, 20)), str(rng.choice(["==", "!=", ">", ">=", "<", "<="])))
    if kind == 1:
        return F("score", float(rng.normal()), str(rng.choice([">", ">=", "<", "<="])))
    if kind == 2:
        values = [f"f{v}" for v in rng.choice(5, size=int(rng.integers(1, 4)), replace=False)]
        return F("src", values, str(rng.choice(["in", "nin"]))) if rng.random() < 0.6 else \
            F("src", values[0], str(rng.choice(["==", "!="])))
    values = [f"t{v}" for v in rng.choice(6, size=int(rng.integers(1, 3)), replace=False)]
    op = str(rng.choice(["any", "all", "contains"]))
    return F("tags", values[0] if op == "contains" else values, op)


def _group(rng: np.random.Generator, depth: int) -> MetadataFilters:
    children = [(_group(rng, depth - 1) if depth and rng.random() < 0.3 else _leaves(rng))
                for _ in range(int(rng.integers(1, 4)))]
    return MetadataFilters(filters=children, condition=str(rng.choice(["and", "or", "not"])))


def _llama_matches(filters: MetadataFilters, meta: dict) -> bool:
    """llama-index's evaluation (build_metadata_filter_fn), extended to nested groups, which it
    refuses, by combining each child's answer under the group's condition."""
    hits = [(_llama_matches(f, meta) if isinstance(f, MetadataFilters)
             else build_metadata_filter_fn(lambda _: meta, MetadataFilters(filters=[f]))("x")) for f in filters.filters]
    if filters.condition == FilterCondition.AND:
        return all(hits)
    if filters.condition == FilterCondition.OR:
        return any(hits)
    return not any(hits)


def test_translation_matches_llama_index_semantics():
    rng = np.random.default_rng(3)
    records = _records()
    selective = 0
    for _ in range(150):
        filters = _group(rng, depth=2)
        compiled = compile_filter(to_vindex_filter(filters))
        want = [_llama_matches(filters, meta) for meta in records]
        got = [matches(compiled, meta) for meta in records]
        assert got == want, filters
        selective += 0 < sum(want) < len(records)
    assert selective > 75  # most filters select some records, not none or all


# --- scores and MMR ----------------------------------------------------------------------------------
def test_similarities_are_higher_for_nearer():
    d = np.array([0.0, 0.5, 2.0], np.float32)
    assert similarities("cosine", d) == [1.0, 0.5, -1.0]
    assert similarities("ip", d) == [-0.0, -0.5, -2.0]
    assert similarities("l2", d) == pytest.approx([1.0, 2 / 3, 1 / 3])


@pytest.mark.parametrize("threshold", [None, 0.0, 0.3, 0.9, 1.0])
def test_mmr_picks_what_llama_index_picks(threshold):
    rng = np.random.default_rng(11)
    for _ in range(5):
        cands = rng.normal(size=(30, DIM))
        q = rng.normal(size=DIM).tolist()
        scores, ids = get_top_k_mmr_embeddings(q, cands.tolist(), similarity_top_k=6, embedding_ids=list(range(30)),
                                               mmr_threshold=threshold)
        picked, mine = mmr_select(q, cands, 6, threshold)
        assert picked == ids
        assert mine == pytest.approx(scores)
    assert sorted(mmr_select(q, cands[:3], 6)[0]) == [0, 1, 2]  # fewer candidates than k: all of them
    with pytest.raises(ValueError, match=r"mmr_threshold: expected a number in \[0, 1\], got 2"):
        mmr_select(q, cands, 3, 2)


# --- the store, embedded and remote ------------------------------------------------------------------
_names = itertools.count()


@pytest.fixture(params=["embedded", "remote"])
def store(request, tmp_path):
    if request.param == "embedded":
        s = VindexVectorStore(tmp_path / "index")
        yield s
        s.close()
    else:
        c = request.getfixturevalue("client")
        name = f"llama{next(_names)}"
        s = VindexVectorStore(collection=c.create_collection(name, dim=DIM, metric="cosine", id_type="str"))
        yield s
        c.drop_collection(name)


def _nodes(n: int = 60, seed: int = 0) -> list[TextNode]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        meta = {"page": i % 10, "src": f"f{i % 3}.pdf", "tags": ["even" if i % 2 == 0 else "odd", f"m{i % 5}"]}
        out.append(TextNode(id_=f"node-{i}", text=f"chunk {i} text", metadata=meta,
                            embedding=rng.normal(size=DIM).tolist(),
                            relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=f"doc-{i % 6}")}))
    return out


def _brute(nodes: list[TextNode], q: list[float], k: int, keep=lambda n: True) -> list[str]:
    x = np.array([n.embedding for n in nodes])
    cos = x @ np.asarray(q) / np.linalg.norm(x, axis=1) / np.linalg.norm(q)
    order = [j for j in np.argsort(-cos, kind="stable") if keep(nodes[j])]
    return [nodes[j].node_id for j in order[:k]]


def _same_node(a: TextNode, b: TextNode) -> None:
    assert (a.node_id, a.text, a.metadata, a.ref_doc_id) == (b.node_id, b.text, b.metadata, b.ref_doc_id)
    assert a.relationships == b.relationships


def test_add_query_and_rebuilt_nodes(store):
    nodes = _nodes()
    assert store.add(nodes) == [n.node_id for n in nodes]
    q = nodes[4].embedding
    res = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=5))
    assert res.ids == _brute(nodes, q, 5)
    assert res.similarities[0] == pytest.approx(1.0, abs=1e-5)
    assert res.similarities == sorted(res.similarities, reverse=True)
    _same_node(res.nodes[0], nodes[4])
    assert res.nodes[0].embedding is None
    store.add([TextNode(id_="node-4", text="replaced", embedding=q, metadata={"page": 99})])  # same id: replaced
    got = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=1)).nodes[0]
    assert (got.text, got.metadata) == ("replaced", {"page": 99})


def test_query_filters_doc_ids_and_node_ids(store):
    nodes = _nodes()
    store.add(nodes)
    q = nodes[0].embedding
    filters = MetadataFilters(filters=[F("page", 3, ">="), MetadataFilters(
        filters=[F("src", "f1.pdf"), F("tags", ["m0", "m1"], "any")], condition="or")])
    res = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=6, filters=filters))

    def keep(n):
        return n.metadata["page"] >= 3 and (n.metadata["src"] == "f1.pdf" or n.metadata["tags"][1] in ("m0", "m1"))
    assert res.ids == _brute(nodes, q, 6, keep)
    res = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=4, doc_ids=["doc-2", "doc-5"]))
    assert res.ids == _brute(nodes, q, 4, lambda n: n.ref_doc_id in ("doc-2", "doc-5"))
    wanted = ["node-7", "node-30", "node-59", "missing"]
    res = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=10, node_ids=wanted,
                                       filters=MetadataFilters(filters=[F("page", 9, "!=")])))
    assert res.ids == _brute(nodes, q, 10, lambda n: n.node_id in ("node-7", "node-30"))
    by_doc = MetadataFilters(filters=[F("ref_doc_id", "doc-3")])  # the source document stays a filterable key
    res = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=20, filters=by_doc))
    assert res.ids == _brute(nodes, q, 20, lambda n: n.ref_doc_id == "doc-3") and len(res.ids) == 10
    nothing = MetadataFilters(filters=[F("src", "nowhere.pdf")])
    assert store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=3, filters=nothing)).ids == []


def test_mmr_query(store):
    nodes = _nodes()
    store.add(nodes)
    q = nodes[10].embedding
    res = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=5, mode=VectorStoreQueryMode.MMR,
                                       mmr_threshold=0.4), mmr_prefetch_k=len(nodes))
    ranked = _brute(nodes, q, len(nodes))
    by_id = {n.node_id: n.embedding for n in nodes}
    scores, ids = get_top_k_mmr_embeddings(q, [by_id[i] for i in ranked], similarity_top_k=5, embedding_ids=ranked,
                                           mmr_threshold=0.4)
    assert res.ids == ids and res.similarities == pytest.approx(scores, abs=1e-5)
    assert [n.node_id for n in res.nodes] == ids
    plain = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=5)).ids
    assert res.ids != plain  # diversity changed the answer
    # the threshold also comes as a retriever keyword (vector_store_kwargs)
    again = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=5, mode="mmr"),
                        mmr_threshold=0.4, mmr_prefetch_k=len(nodes))
    assert again.ids == ids
    with pytest.raises(vindex.InvalidInputError, match=r"mmr_prefetch_k: expected an int >= similarity_top_k \(5\)"):
        store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=5, mode="mmr"), mmr_prefetch_k=2)


def test_get_nodes(store):
    nodes = _nodes(30)
    store.add(nodes)
    got = store.get_nodes(["node-3", "nope", "node-1"])
    assert [n.node_id for n in got] == ["node-3", "node-1"]
    _same_node(got[0], nodes[3])
    even = MetadataFilters(filters=[F("tags", "even", "contains"), F("page", 4, "<")])
    assert sorted(n.node_id for n in store.get_nodes(filters=even)) == \
        sorted(n.node_id for n in nodes if n.metadata["page"] < 4 and n.metadata["page"] % 2 == 0)
    assert [n.node_id for n in store.get_nodes(["node-2", "node-3"], filters=even)] == ["node-2"]
    assert sorted(n.node_id for n in store.get_nodes()) == sorted(n.node_id for n in nodes)


def test_deletes_and_clear(store):
    nodes = _nodes(36)
    store.add(nodes)
    left = {n.node_id: n for n in nodes}

    def remaining():
        return sorted(n.node_id for n in store.get_nodes())
    store.delete("doc-1")
    left = {i: n for i, n in left.items() if n.ref_doc_id != "doc-1"}
    assert remaining() == sorted(left)
    store.delete_nodes(["node-0", "node-2", "nope"])
    left = {i: n for i, n in left.items() if i not in ("node-0", "node-2")}
    assert remaining() == sorted(left)
    store.delete_nodes(filters=MetadataFilters(filters=[F("src", "f2.pdf")]))
    left = {i: n for i, n in left.items() if n.metadata["src"] != "f2.pdf"}
    assert remaining() == sorted(left)
    store.delete_nodes(["node-3", "node-4", "node-6"], filters=MetadataFilters(filters=[F("page", 4, "<=")]))
    left = {i: n for i, n in left.items() if i not in ("node-3", "node-4")}
    assert remaining() == sorted(left)
    assert len(store.client) == len(left)
    store.clear()
    assert remaining() == [] and len(store.client) == 0
    store.add(nodes[:2])  # usable after clear
    assert remaining() == ["node-0", "node-1"]


def test_async_variants(store):
    nodes = _nodes(20)

    async def run():
        assert await store.async_add(nodes) == [n.node_id for n in nodes]
        q = VectorStoreQuery(query_embedding=nodes[5].embedding, similarity_top_k=2)
        assert (await store.aquery(q)).ids[0] == "node-5"
        assert [n.node_id for n in await store.aget_nodes(["node-1"])] == ["node-1"]
        await store.adelete("doc-0")
        await store.adelete_nodes(["node-1"])
        assert len(await store.aget_nodes()) == 20 - 4 - 1
        await store.aclear()
        assert await store.aget_nodes() == []
    asyncio.run(run())


def test_bad_input(store):
    with pytest.raises(vindex.InvalidInputError, match=r"nodes\[1\] \('b'\) has no embedding; embed nodes"):
        store.add([TextNode(id_="a", text="x", embedding=[0.1] * DIM), TextNode(id_="b", text="y")])
    with pytest.raises(vindex.InvalidInputError, match=r"nodes\[1\] \('b'\): embedding of length 3, but nodes\[0\] has 8"):
        store.add([TextNode(id_="a", text="x", embedding=[0.1] * DIM), TextNode(id_="b", text="y", embedding=[1, 2, 3])])
    store.add([TextNode(id_="ok", text="x", embedding=[0.1] * DIM)])  # creates the embedded index
    with pytest.raises(vindex.DimensionError):
        store.add([TextNode(id_="a", text="x", embedding=[0.1] * (DIM + 1))])
    q = [0.1] * DIM
    with pytest.raises(vindex.InvalidInputError, match=r"query mode 'hybrid' is not supported; .* 'default' and 'mmr'"):
        store.query(VectorStoreQuery(query_embedding=q, mode=VectorStoreQueryMode.HYBRID))
    with pytest.raises(vindex.InvalidInputError, match=r"query_embedding is required"):
        store.query(VectorStoreQuery(query_str="hello"))
    with pytest.raises(vindex.FilterError, match=r"operator 'text_match'"):
        store.query(VectorStoreQuery(query_embedding=q, filters=MetadataFilters(filters=[F("a", "b", "text_match")])))
    assert [n.node_id for n in store.get_nodes()] == ["ok"]  # nothing else was written


# --- embedded only: lifecycle -------------------------------------------------------------------------
def test_embedded_lifecycle(tmp_path):
    path = tmp_path / "idx"
    empty = VindexVectorStore(path, metric="l2", max_postings=8)
    q = VectorStoreQuery(query_embedding=[0.1] * DIM, similarity_top_k=3)
    assert empty.client is None and not path.exists()  # created by the first add
    assert empty.query(q).ids == [] and empty.get_nodes() == []
    empty.delete("x")
    empty.delete_nodes(["x"])
    nodes = _nodes(10)
    empty.add(nodes)
    assert (empty.client.dim, empty.client.metric, empty.client.id_type) == (DIM, "l2", "str")
    assert empty.client.config.max_postings == 8
    res = empty.query(VectorStoreQuery(query_embedding=nodes[2].embedding, similarity_top_k=2))
    assert res.ids[0] == "node-2" and res.similarities[0] == pytest.approx(1.0) and 0 < res.similarities[1] < 1
    empty.close()
    with VindexVectorStore(path) as again:  # reopened: same records
        assert again.query(VectorStoreQuery(query_embedding=nodes[2].embedding, similarity_top_k=2)).ids == res.ids
    with pytest.raises(vindex.InvalidConfigError, match=r"metric: .* uses 'l2', not 'cosine'"):
        VindexVectorStore(path, metric="cosine")
    with pytest.raises(vindex.InvalidConfigError, match=r"cannot change \['max_postings'\] when opening"):
        VindexVectorStore(path, max_postings=4)
    with VindexVectorStore(path, metric="l2", filter_widen=2) as again:  # the refused opens left it unlocked
        assert again.client.config.filter_widen == 2 and len(again.get_nodes()) == 10

    batched = VindexVectorStore(batch_size=7)  # several upserts per add
    assert batched.add(_nodes(20)) == [f"node-{i}" for i in range(20)] and len(batched.client) == 20
    batched.close()

    temporary = VindexVectorStore()
    temporary.add(nodes)
    where = temporary.client.path
    assert os.path.isdir(where)
    temporary.close()
    assert not os.path.exists(where)
    collected = VindexVectorStore()
    collected.add(nodes)
    where = collected.client.path
    del collected
    gc.collect()
    assert not os.path.exists(where)  # a store never closed: its temporary index goes with it


def test_constructor_errors(tmp_path, request):
    remote = request.getfixturevalue("client")
    with pytest.raises(vindex.InvalidConfigError, match=r"give path \(an embedded index\) or collection .* not both"):
        VindexVectorStore(tmp_path / "a", collection=object())
    with pytest.raises(vindex.InvalidInputError, match=r"batch_size: expected a positive int, got 0"):
        VindexVectorStore(batch_size=0)
    with pytest.raises(vindex.InvalidConfigError, match=r"metric: expected one of"):
        VindexVectorStore(metric="manhattan")
    with pytest.raises(vindex.InvalidConfigError, match=r"unknown config parameter\(s\) \['bogus'\]"):
        VindexVectorStore(tmp_path / "b", bogus=1)
    ints = remote.create_collection("llama-ints", dim=DIM, id_type="int")
    with pytest.raises(vindex.InvalidInputError, match=r"holds int ids; a LlamaIndex store needs str ids"):
        VindexVectorStore(collection=ints)
    with pytest.raises(vindex.InvalidConfigError, match=r"index settings \['max_postings'\] do not apply to a collection"):
        VindexVectorStore(collection=remote.create_collection("llama-str", dim=DIM, id_type="str"), max_postings=4)


# --- end to end with VectorStoreIndex ------------------------------------------------------------------
class WordEmbedding(BaseEmbedding):
    """Deterministic bag-of-words embedding: each word adds a fixed pseudo-random unit vector."""

    def _vector(self, text: str) -> list[float]:
        out = np.zeros(32)
        for word in text.lower().replace(".", " ").replace("?", " ").split():
            seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
            out += np.random.default_rng(seed).normal(size=32)
        return (out / max(np.linalg.norm(out), 1e-9)).tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._vector(text)

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._vector(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._vector(query)


TOPICS = {"cats": "cats purr and sleep on warm windows", "rockets": "rockets burn fuel to reach orbit",
          "bread": "bread rises when yeast ferments dough", "rivers": "rivers carry water to the sea"}


@pytest.fixture
def llama_settings():
    old = (Settings._embed_model, Settings._llm)
    Settings.embed_model = WordEmbedding()
    Settings.llm = MockLLM(max_tokens=16)
    yield
    Settings._embed_model, Settings._llm = old


@pytest.mark.parametrize("kind", ["embedded", "remote"])
def test_vector_store_index_end_to_end(kind, tmp_path, llama_settings, request):
    if kind == "embedded":
        store = VindexVectorStore(tmp_path / "rag")
    else:
        store = VindexVectorStore(collection=request.getfixturevalue("client").create_collection(
            "llama-e2e", dim=32, metric="cosine"))
    docs = [Document(text=f"{text}. Part {p}.", doc_id=f"{topic}-{p}", metadata={"topic": topic, "part": p})
            for topic, text in TOPICS.items() for p in range(3)]
    index = VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(vector_store=store))
    assert len(store.client) == len(docs)  # the splitter kept each short document one node

    hits = index.as_retriever(similarity_top_k=3).retrieve("why do rockets burn fuel")
    assert [h.node.metadata["topic"] for h in hits] == ["rockets"] * 3
    assert hits[0].score > 0.5 and hits[0].node.get_content().startswith("rockets burn fuel")

    only_bread = MetadataFilters(filters=[F("topic", "bread"), F("part", 1, ">=")])
    hits = index.as_retriever(similarity_top_k=5, filters=only_bread).retrieve("why do rockets burn fuel")
    assert sorted(h.node.ref_doc_id for h in hits) == ["bread-1", "bread-2"]

    mmr = index.as_retriever(similarity_top_k=2, vector_store_query_mode="mmr",
                             vector_store_kwargs={"mmr_threshold": 0.2}).retrieve("cats purr")
    assert len(mmr) == 2 and mmr[0].node.metadata["topic"] == "cats"

    response = index.as_query_engine(similarity_top_k=2).query("where do rivers go")
    assert [n.node.metadata["topic"] for n in response.source_nodes] == ["rivers", "rivers"]
    assert isinstance(response.response, str) and response.response

    index.delete_ref_doc("rivers-0")
    assert "rivers-0" not in {n.ref_doc_id for n in store.get_nodes()}
    index.insert_nodes([TextNode(text="volcanoes erupt molten rock", id_="v1", metadata={"topic": "volcanoes"})])
    assert index.as_retriever(similarity_top_k=1).retrieve("molten rock volcanoes")[0].node.node_id == "v1"
    store.close()


def test_docs_example_runs(capsys):
    """docs/integrations.md's LlamaIndex example runs as written."""
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "integrations.md")) as f:
        section = f.read().split("## LlamaIndex", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/integrations.md", "exec"), {})
    assert "wiki-" in capsys.readouterr().out
