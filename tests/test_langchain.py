"""The LangChain vector store: langchain-tests' standard suite against an embedded index and
against a collection on an in-process server, then what the suite does not cover (filters,
relevance per metric, MMR, persistence, temporary indexes, records without documents, errors)."""
from __future__ import annotations

import gc
import inspect
import itertools
import math
import os
import warnings

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_tests.integration_tests import VectorStoreIntegrationTests

import vindex
import test_service_payload
from vindex.integrations.langchain import VindexVectorStore

def _asyncio_marked(cls: type) -> type:
    """Mark the suite's coroutine tests for pytest-asyncio (strict mode). The mark goes on the
    suite's own functions: the suite fails a class that overrides any of its tests."""
    for name in dir(cls):
        fn = getattr(cls, name)
        if (name.startswith("test_") and inspect.iscoroutinefunction(fn)
                and not any(m.name == "asyncio" for m in getattr(fn, "pytestmark", []))):
            pytest.mark.asyncio(fn)
    return cls


@_asyncio_marked
class TestEmbeddedStandard(VectorStoreIntegrationTests):
    @pytest.fixture
    def vectorstore(self):
        store = VindexVectorStore(self.get_embeddings())
        try:
            yield store
        finally:
            store.close()


# an in-process server and a client of it, per module
served, client = test_service_payload.served, test_service_payload.client
_names = itertools.count()


@_asyncio_marked
class TestRemoteStandard(VectorStoreIntegrationTests):
    @pytest.fixture
    def vectorstore(self, client):
        name = f"lc{next(_names)}"
        col = client.create_collection(name, dim=6, metric="cosine", id_type="str")
        try:
            yield VindexVectorStore(self.get_embeddings(), collection=col)
        finally:
            client.drop_collection(name)


# --- beyond the suite ------------------------------------------------------------------------------
class TableEmbedding(Embeddings):
    """Each known text's vector from a table."""

    def __init__(self, table: dict[str, list[float]]):
        self.table = table

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.table[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.table[text]


AXES = {"x": [1.0, 0.0, 0.0], "y": [0.0, 1.0, 0.0], "z": [0.0, 0.0, 1.0], "xy": [0.8, 0.6, 0.0],
        "x2": [2.0, 0.0, 0.0], "-x": [-1.0, 0.0, 0.0], "x+": [0.99, 0.141, 0.0]}


def axes_store(metric: str = "cosine", **kw) -> VindexVectorStore:
    store = VindexVectorStore(TableEmbedding(AXES), metric=metric, **kw)
    store.add_texts(["x", "y", "z", "xy"], [{"axis": "x", "n": 1}, {"axis": "y", "n": 2}, {"axis": "z", "n": 3},
                                            {"axis": "xy", "n": 4}], ids=["a", "b", "c", "d"])
    return store


@pytest.mark.parametrize("metric,query,expected", [
    ("cosine", "x", [("x", 1.0), ("xy", 0.8), ("y", 0.0)]),            # cos
    ("cosine", "-x", [("y", 0.0), ("z", 0.0), ("xy", -0.8)]),          # cos, below 0 for opposite vectors
    ("l2", "x", [("x", 1.0), ("xy", 1 - math.sqrt(0.4) / math.sqrt(2)), ("y", 0.0)]),  # 1 - euclidean / sqrt 2
    ("ip", "x2", [("x", 2.0), ("xy", 1.6), ("y", 0.0)]),               # the inner product
])
def test_relevance_scores_per_metric(metric, query, expected):
    with axes_store(metric) as store, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LangChain warns of scores outside [0, 1], as for every store
        got = store.similarity_search_with_relevance_scores(query, k=3)
        assert [d.page_content for d, _ in got] == [t for t, _ in expected]
        assert [s for _, s in got] == pytest.approx([s for _, s in expected], abs=1e-5)


def test_distances_are_vindex_distances():
    with axes_store("l2") as store:
        (doc, dist), = store.similarity_search_with_score("x2", k=1)
        assert doc.id == "a" and dist == pytest.approx(1.0)  # squared euclidean


def test_filter_in_searches_and_retriever():
    with axes_store() as store:
        assert [d.id for d in store.similarity_search("x", k=4, filter={"n": {"$gte": 3}})] == ["d", "c"]
        assert [d.id for d in store.similarity_search_by_vector([1, 0, 0], k=1, filter={"axis": "y"})] == ["b"]
        scored = store.similarity_search_with_score("x", k=4, filter={"axis": {"$in": ["z", "y"]}})
        assert sorted(d.id for d, _ in scored) == ["b", "c"]
        retriever = store.as_retriever(search_kwargs={"k": 2, "filter": {"axis": {"$ne": "x"}}})
        assert [d.id for d in retriever.invoke("x")] == ["d", "b"]
        threshold = store.as_retriever(search_type="similarity_score_threshold",
                                       search_kwargs={"score_threshold": 0.5, "k": 4})
        assert [d.id for d in threshold.invoke("x")] == ["a", "d"]
        with pytest.raises(vindex.FilterError, match="unknown operator"):
            store.similarity_search("x", filter={"n": {"$regex": "1"}})


def test_mmr_prefers_diverse_results():
    table = dict(AXES)
    with VindexVectorStore(TableEmbedding(table)) as store:
        store.add_texts(["x", "x+", "y", "z"], ids=["x", "x+", "y", "z"])
        assert [d.id for d in store.similarity_search("x", k=2)] == ["x", "x+"]
        assert [d.id for d in store.max_marginal_relevance_search("x", k=2, fetch_k=4, lambda_mult=0.3)] == ["x", "y"]
        assert [d.id for d in store.max_marginal_relevance_search("x", k=2, fetch_k=4, lambda_mult=1.0)] == ["x", "x+"]
        retriever = store.as_retriever(search_type="mmr", search_kwargs={"k": 2, "fetch_k": 4,
                                                                         "lambda_mult": 0.3, "filter": {}})
        assert [d.id for d in retriever.invoke("x")] == ["x", "y"]


async def _async_checks(store: VindexVectorStore) -> None:
    ids = await store.aadd_texts(["x", "y"], [{"n": 1}, {"n": 2}])
    assert [d.id for d in await store.asimilarity_search("x", k=2)] == ids
    assert [d.id for d in await store.asimilarity_search("x", k=2, filter={"n": 2})] == ids[1:]
    assert [d.id for d in await store.amax_marginal_relevance_search("x", k=1)] == ids[:1]
    scored = await store.asimilarity_search_with_relevance_scores("x", k=1)
    assert scored[0][1] == pytest.approx(1.0)


class AsyncOnlyEmbedding(TableEmbedding):
    """Its sync calls fail: the store's async methods must use the async ones."""

    def embed_documents(self, texts):
        raise AssertionError("sync embed_documents called from an async method")

    def embed_query(self, text):
        raise AssertionError("sync embed_query called from an async method")

    async def aembed_documents(self, texts):
        return [self.table[t] for t in texts]

    async def aembed_query(self, text):
        return self.table[text]


@pytest.mark.asyncio
async def test_async_methods_use_the_async_embedding():
    with VindexVectorStore(AsyncOnlyEmbedding(AXES)) as store:
        await _async_checks(store)


def test_get_by_ids_order_duplicates_missing_and_delete():
    with axes_store() as store:
        got = store.get_by_ids(["c", "nope", "a", "c"])
        assert got == [Document(id="c", page_content="z", metadata={"axis": "z", "n": 3}),
                       Document(id="a", page_content="x", metadata={"axis": "x", "n": 1})]
        assert store.delete(["a", "a", "zzz"]) is True
        assert store.get_by_ids(["a", "b"])[0].id == "b"
        assert store.delete([]) is True and len(store.index) == 3
        store.delete(filter={"n": {"$gt": 2}})
        assert [d.id for d in store.similarity_search("x", k=4)] == ["b"]
        store.delete()
        assert store.similarity_search("x", k=4) == [] and len(store.index) == 0


def test_ids_generated_for_missing_ones_and_replaced_on_readd():
    with VindexVectorStore(TableEmbedding(AXES)) as store:
        ids = store.add_documents([Document(page_content="x", id="mine"), Document(page_content="y")])
        assert ids[0] == "mine" and len(ids[1]) == 36 and ids[1].count("-") == 4  # a uuid4
        store.add_documents([Document(page_content="z", metadata={"v": 2})], ids=["mine"])
        assert store.get_by_ids(["mine"]) == [Document(id="mine", page_content="z", metadata={"v": 2})]
        assert len(store.index) == 2
        assert store.add_texts([]) == []


def test_batch_size_splits_writes():
    texts = ["x", "y", "z", "xy", "x2"]
    with VindexVectorStore(TableEmbedding(AXES)) as store:
        assert store.add_texts(texts, ids=texts, batch_size=2) == texts
        assert len(store.index) == 5


def test_from_texts_and_from_documents(tmp_path):
    store = VindexVectorStore.from_texts(["x", "y"], TableEmbedding(AXES), [{"n": 1}, {"n": 2}], ids=["1", "2"],
                                         path=tmp_path / "lc", metric="l2", max_postings=8)
    assert store.index.metric == "l2" and store.index.config.max_postings == 8
    assert [d.id for d in store.similarity_search("y", k=1)] == ["2"]
    store.close()
    docs = [Document(page_content="z", id="z1", metadata={"k": "v"})]
    with VindexVectorStore.from_documents(docs, TableEmbedding(AXES)) as store:
        assert store.get_by_ids(["z1"]) == docs


def test_path_created_on_first_add_then_reopened(tmp_path):
    path = tmp_path / "store"
    store = VindexVectorStore(TableEmbedding(AXES), path=path, metric="ip")
    assert store.index is None and not path.exists()
    assert store.similarity_search("x") == [] and store.get_by_ids(["a"]) == []
    store.add_texts(["x", "y"], ids=["a", "b"])
    assert store.index.id_type == "str" and store.index.dim == 3
    store.close()
    with pytest.raises(vindex.IndexClosedError):
        store.similarity_search("x")
    # an existing index keeps its metric; index_config gives runtime settings
    with VindexVectorStore(TableEmbedding(AXES), path=path, cache_bytes=1 << 20) as again:
        assert again.index.metric == "ip" and again.index.config.cache_bytes == 1 << 20
        assert [d.id for d in again.similarity_search("y", k=2)] == ["b", "a"]
        assert again._select_relevance_score_fn()(-0.5) == 0.5
    with pytest.raises(vindex.InvalidConfigError, match="cannot change"):
        VindexVectorStore(TableEmbedding(AXES), path=path, max_postings=4)


def test_temporary_index_removed_on_close_and_collection():
    store = axes_store()
    folder = os.path.dirname(store.index.path)
    assert os.path.isdir(folder)
    store.close()
    store.close()  # twice is fine
    assert not os.path.exists(folder)
    store = axes_store()
    folder = os.path.dirname(store.index.path)
    del store
    gc.collect()
    assert not os.path.exists(folder)


def test_records_without_documents_or_string_ids(tmp_path):
    """An index built by the library alone: int ids, no documents, no metadata."""
    x = np.eye(3, dtype=np.float32)
    vindex.Index.build(tmp_path / "plain", x, [10, 20, 30], metric="cosine").close()
    with VindexVectorStore(TableEmbedding(AXES), path=tmp_path / "plain") as store:
        assert store.similarity_search("xy", k=2) == [Document(id="10", page_content=""),
                                                      Document(id="20", page_content="")]
        assert [d.id for d in store.max_marginal_relevance_search("x", k=1)] == ["10"]
        # the str ids the documents carry find their records again
        assert store.get_by_ids(["20", "nope", "-1", "99999999999999999999", "10"]) == [
            Document(id="20", page_content=""), Document(id="10", page_content="")]
        store.delete(["10", "nope"])
        assert [d.id for d in store.similarity_search("x", k=3)] == ["20", "30"]


def test_bad_input_is_refused_with_a_clear_message(tmp_path):
    emb = TableEmbedding(AXES)
    with pytest.raises(vindex.InvalidConfigError, match="not both"):
        VindexVectorStore(emb, path=tmp_path / "a", collection=object())
    with pytest.raises(vindex.InvalidConfigError, match="metric"):
        VindexVectorStore(emb, metric="hamming")
    with pytest.raises(vindex.InvalidConfigError, match="unknown config parameter"):
        VindexVectorStore(emb, max_posting=3)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    with pytest.raises(vindex.NotAnIndexError, match="is not a vindex index"):
        VindexVectorStore(emb, path=tmp_path / "notes")
    (tmp_path / "empty").mkdir()
    with VindexVectorStore(emb, path=tmp_path / "empty") as store:  # an empty folder is a new index
        store.add_texts(["x"], ids=["1"])
        assert store.index.path == os.fspath(tmp_path / "empty")
    with VindexVectorStore(emb) as store:
        with pytest.raises(vindex.LengthMismatchError, match="metadatas: expected one per text"):
            store.add_texts(["x", "y"], [{}])
        with pytest.raises(vindex.LengthMismatchError, match="ids: expected one per text"):
            store.add_texts(["x"], ids=["1", "2"])
        with pytest.raises(TypeError, match="unexpected keyword"):
            store.add_texts(["x"], colour="red")
        with pytest.raises(vindex.InvalidInputError, match="metadata"):
            store.add_texts(["x"], [{"bad": float("nan")}])
        with pytest.raises(vindex.InvalidInputError, match="batch_size: expected an integer"):
            store.add_texts(["x"], batch_size=-1)
        with pytest.raises(vindex.DuplicateIdError):
            store.add_texts(["x", "y"], ids=["1", "1"])
        with pytest.raises(TypeError, match="not both"):
            store.delete(["1"], filter={"n": 1})
        assert store.index is None or len(store.index) == 0  # nothing acknowledged, nothing written


def test_remote_store_filters_mmr_and_async(client):
    col = client.create_collection("lc_remote", dim=3, metric="cosine", id_type="str")
    try:
        with pytest.raises(vindex.InvalidConfigError, match="do not apply to a collection"):
            VindexVectorStore(TableEmbedding(AXES), collection=col, max_postings=4)
        store = VindexVectorStore(TableEmbedding(AXES), collection=col)
        store.add_texts(["x", "x+", "y", "z"], [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}], ids=["x", "x+", "y", "z"])
        assert [d.id for d in store.similarity_search("x", k=4, filter={"n": {"$gte": 2}})][:2] == ["x+", "y"]
        assert [d.id for d in store.max_marginal_relevance_search("x", k=2, fetch_k=4, lambda_mult=0.3)] == ["x", "y"]
        assert store.get_by_ids(["z", "q"]) == [Document(id="z", page_content="z", metadata={"n": 4})]
        store.delete()
        assert len(col) == 0
        store.close()
        assert "lc_remote" in client.list_collections()  # closing the store leaves the collection
    finally:
        client.drop_collection("lc_remote")


def test_overhead_benchmark_runs_on_a_small_index(tmp_path):
    from bench.langchain_overhead import PrecomputedEmbeddings, compare

    rng = np.random.default_rng(3)
    x = rng.normal(size=(500, 8)).astype(np.float32)
    vindex.Index.build(tmp_path / "small", x, [f"r{i}" for i in range(500)], documents=[f"d{i}" for i in range(500)],
                       metric="l2").close()
    queries = x[:20] + 0.01
    with VindexVectorStore(PrecomputedEmbeddings(queries), path=tmp_path / "small") as store:
        out = compare(store, queries, passes=2, params={"max_postings": 4})
        assert store.similarity_search("q3", k=1)[0].page_content == "d3"
    assert out["queries"] == 20 and len(out["overhead_per_pass"]) == 2
    assert out["index_search_us"] > 0 and out["store_similarity_search_us"] > 0
