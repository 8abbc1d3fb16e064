"""String ids, metadata, documents and filters through the gRPC service.

Conversions first (Struct <-> dict, row masks, ids, error trailers), without a server; then an
in-process server: round trips through the client and raw stubs, filters on Search, Count,
Delete and Scroll against the embedded library's answers, and every bad filter or oversized
payload answering INVALID_ARGUMENT while changing nothing.
"""
from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
from google.protobuf import json_format, struct_pb2

import vindex
from test_service import InProcessServer
from vindex import errors
from vindex.service import vindex_pb2 as pb
from vindex.service import vindex_pb2_grpc as pb_grpc
from vindex.service.decoding import decode_request_ids
from vindex.service.payloads import (decode_documents, decode_filter, decode_metadata, decode_rows, encode_rows,
                                     from_struct, to_struct)
from vindex.service.status import (ERROR_KEY, IDS_KEY, MAX_IDS_CHARS, STR_IDS_KEY, CollectionExistsError,
                                   to_exception, trailers)

NESTED = {"source": "a.pdf", "page": 3, "score": 0.25, "ok": True, "none": None, "tags": ["x", 2, None, 1.5],
          "deep": {"a": {"b": [1, {"c": "d"}]}}, "big": 2 ** 53, "neg": -7, "empty": {}, "list": []}


# --- conversions ---------------------------------------------------------------------------------
def test_struct_round_trip_keeps_ints_ints():
    back = from_struct(to_struct(NESTED))
    assert back == NESTED
    assert type(back["page"]) is int and type(back["score"]) is float and type(back["ok"]) is bool
    assert type(back["tags"][1]) is int and type(back["tags"][3]) is float
    assert type(back["deep"]["a"]["b"][0]) is int
    # what a JSON client (grpcurl) sends: numbers are doubles on the wire
    parsed = json_format.Parse(json.dumps({"page": 3, "f": 2.5, "huge": 1e300}), struct_pb2.Struct())
    assert from_struct(parsed) == {"page": 3, "f": 2.5, "huge": 1e300}
    assert type(from_struct(parsed)["huge"]) is float  # beyond int64: stays a float


def test_to_struct_refuses_what_json_cannot_hold():
    with pytest.raises(errors.InvalidInputError, match=r"^metadata: not representable as JSON"):
        to_struct({"a": {1, 2}})
    with pytest.raises(errors.InvalidInputError, match=r"^filter: not representable"):
        to_struct({"a": np.float32(1)}, "filter")


def test_rows_and_masks():
    req = pb.UpsertRequest(ids=[1, 2, 3])
    assert decode_metadata(req, 3, 10) is None and decode_documents(req, 3, 10) is None
    encode_rows(req, [{"a": 1}, None, {}], ["x", "", None])
    assert list(req.no_metadata) == [False, True, False]
    assert list(req.no_document) == [False, False, True]
    assert decode_metadata(req, 3, 10) == [{"a": 1}, None, {}]  # {} and None stay apart
    assert decode_documents(req, 3, 10) == ["x", "", None]      # so do "" and None
    full = pb.UpsertRequest()
    encode_rows(full, [{"a": 1}], ["x"])
    assert not full.no_metadata and not full.no_document  # masks only when some row has none
    assert decode_rows(pb.GetResponse(), 2) == ([None, None], [None, None])


@pytest.mark.parametrize("fill,error,match", [
    (dict(metadata=[{}, {}]), errors.LengthMismatchError, r"^metadata: 2 for 3 ids; expected one per row"),
    (dict(documents=["a"]), errors.LengthMismatchError, r"^documents: 1 for 3 ids"),
    (dict(metadata=[{}] * 3, no_metadata=[True]), errors.LengthMismatchError, r"^no_metadata: 1 flags for 3 ids"),
    (dict(no_document=[True, False, True]), errors.LengthMismatchError,
     r"^no_document: says row 1 has one, but no documents were sent"),
])
def test_bad_rows(fill, error, match):
    req = pb.UpsertRequest(ids=[1, 2, 3])
    for field, values in fill.items():
        getattr(req, field).extend(struct_pb2.Struct() if field == "metadata" else v for v in values)
    with pytest.raises(error, match=match):
        decode_metadata(req, 3, 10)
        decode_documents(req, 3, 10)


def test_too_many_rows_is_request_too_large():
    req = pb.UpsertRequest(documents=["a"] * 11)
    with pytest.raises(errors.InvalidInputError, match=r"^documents: at most 10 per request, got 11"):
        decode_documents(req, 11, 10)


def test_filter_presence():
    assert decode_filter(pb.CountRequest()) is None
    req = pb.CountRequest()
    req.filter.CopyFrom(struct_pb2.Struct())
    assert decode_filter(req) == {}  # set but empty is not "no filter"
    req.filter.update({"page": {"$gte": 3}})
    assert decode_filter(req) == {"page": {"$gte": 3}}


def test_request_ids_of_either_kind():
    ids = decode_request_ids(pb.DeleteRequest(ids=[1, 2]), 10)
    assert ids.dtype == np.int64 and ids.tolist() == [1, 2]
    assert decode_request_ids(pb.DeleteRequest(str_ids=["doc-1#0", "é"]), 10) == ["doc-1#0", "é"]
    assert decode_request_ids(pb.DeleteRequest(), 10).size == 0
    with pytest.raises(errors.InvalidIdError, match=r"^ids and str_ids: set one of them, not both"):
        decode_request_ids(pb.DeleteRequest(ids=[1], str_ids=["a"]), 10)
    with pytest.raises(errors.InvalidInputError, match=r"^str_ids: at most 2 per request, got 3"):
        decode_request_ids(pb.DeleteRequest(str_ids=["a", "b", "c"]), 2)


class _Failed(grpc.RpcError):
    def __init__(self, exc):
        self._md = trailers(exc)
        self._text = str(exc)

    def code(self):
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self):
        return self._text

    def trailing_metadata(self):
        return self._md


@pytest.mark.parametrize("exc", [
    errors.FilterError("filter: $and[1].page: unknown operator '$regex'"),
    errors.PayloadTooLargeError("metadata[0]: 70000 bytes, over max_metadata_bytes 65536"),
    errors.InvalidIdError("ids: expected str ids"),
])
def test_payload_errors_rebuilt_client_side(exc):
    back = to_exception(_Failed(exc))
    assert type(back) is type(exc) and str(back) == str(exc) and isinstance(back, ValueError)


def test_string_ids_in_error_trailers():
    ids = ["doc-1#0", "naïve,id", "x" * 100]
    exc = errors.UnknownIdError("set_metadata: ids not stored: ...", ids)
    md = dict(trailers(exc))
    assert IDS_KEY not in md and isinstance(md[STR_IDS_KEY], bytes)  # a -bin key: any UTF-8
    back = to_exception(_Failed(exc))
    assert type(back) is errors.UnknownIdError and back.ids == ids and isinstance(back, KeyError)
    dup = errors.DuplicateIdError("ids: repeated", [])
    dup.ids = ["a", "a"]
    back = to_exception(_Failed(dup))
    assert type(back) is errors.DuplicateIdError and back.ids == ["a", "a"]
    many = errors.UnknownIdError("many", [f"id-{i:06d}" for i in range(5000)])
    sent = dict(trailers(many))[STR_IDS_KEY]
    assert len(sent) <= MAX_IDS_CHARS + 2
    assert to_exception(_Failed(many)).ids == many.ids[:len(json.loads(sent))]
    # int ids keep their compact form
    assert dict(trailers(errors.UnknownIdError("x", [5, 99])))[IDS_KEY] == "5,99"
    assert to_exception(_Failed(errors.UnknownIdError("x", [5, 99]))).ids == [5, 99]


# --- through a server ----------------------------------------------------------------------------
DIM = 16
N = 600
#: Search parameters that visit every posting: results are the exact top-k.
EXACT = dict(max_postings=4096, eps=float("inf"))
CONFIG = dict(posting_limit_bytes=4096)
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def chunk_records(n: int = N, seed: int = 0):
    """ids like "doc-17#3", vectors, metadata of every kind (some rows without), documents."""
    rng = np.random.default_rng(seed)
    ids = [f"doc-{r // 4}#{r % 4}" for r in range(n)]
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    meta = [None if r % 11 == 0 else
            {"source": f"s{r % 5}.pdf", "page": r % 40, "score": r / 8, "draft": r % 3 == 0,
             "tags": [f"t{r % 4}", f"t{(r + 1) % 4}"], "author": {"name": f"a{r % 3}", "id": r % 3},
             **({"note": None} if r % 7 == 0 else {})}
            for r in range(n)]
    docs = [None if r % 13 == 0 else f"chunk {r} of doc {r // 4}" for r in range(n)]
    return ids, x, meta, docs


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    srv = InProcessServer(tmp_path_factory.mktemp("payload") / "data")
    assert srv.ready.wait(120)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(served):
    with vindex.Client(served.target, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def stub(served):
    channel = grpc.insecure_channel(served.target)
    yield pb_grpc.VectorIndexStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def twins(client, tmp_path_factory):
    """The same records in a served collection and in an embedded index."""
    ids, x, meta, docs = chunk_records()
    col = client.create_collection("chunks", dim=DIM, id_type="str", **CONFIG)
    col.upsert(ids, x, metadata=meta, documents=docs)
    idx = vindex.Index.create(tmp_path_factory.mktemp("local") / "idx", dim=DIM, id_type="str", **CONFIG)
    idx.upsert(ids, x, metadata=meta, documents=docs)
    yield col, idx
    idx.close()


FILTERS = [
    {"source": "s1.pdf"},
    {"page": {"$gte": 10, "$lt": 14}},
    {"$or": [{"source": "s2.pdf"}, {"author.name": "a1"}]},
    {"tags": {"$in": ["t3"]}, "draft": True},
    {"note": {"$exists": True}},
    {"$not": {"source": {"$in": ["s0.pdf", "s1.pdf"]}}},
    {"score": {"$gt": 70.0}},
    {"source": "nowhere.pdf"},
]


def test_string_ids_metadata_documents_round_trip(twins):
    col, idx = twins
    ids, x, meta, docs = chunk_records()
    assert col.id_type == "str"
    got = col.get(ids, include=["metadata", "documents"])
    vecs, found = got
    assert found.all()
    np.testing.assert_array_equal(vecs, x)
    assert got.metadata == meta and got.documents == docs
    assert type(got.metadata[1]["page"]) is int and type(got.metadata[1]["score"]) is float
    assert got.metadata[7]["note"] is None and "note" not in got.metadata[1]
    res = col.search(x[:5], 4, include=["metadata", "documents", "vectors"], **EXACT)
    local = idx.search(x[:5], 4, include=["metadata", "documents", "vectors"], **EXACT)
    assert res.ids.dtype == object and res.ids.tolist() == local.ids.tolist()
    assert res.ids[0][0] == ids[0]
    np.testing.assert_array_equal(res.distances, local.distances)
    assert [list(m) for m in res.metadata] == [list(m) for m in local.metadata]
    assert [list(d) for d in res.documents] == [list(d) for d in local.documents]
    np.testing.assert_array_equal(np.asarray(res.vectors), np.asarray(local.vectors))
    with pytest.raises(AttributeError, match="include"):
        col.search(x[:1], 2).metadata


def test_padding_with_string_ids(client):
    col = client.create_collection("pad", dim=DIM, id_type="str")
    col.upsert(["only"], np.ones((1, DIM)), metadata=[{"a": 1}], documents=["d"])
    res = col.search(np.ones((2, DIM)), 3, include=["metadata", "documents", "vectors"])
    assert res.ids.tolist() == [["only", None, None]] * 2
    assert res.metadata[0] == [{"a": 1}, None, None] and res.documents[1] == ["d", None, None]
    assert np.asarray(res.vectors).shape == (2, 3, DIM) and not np.asarray(res.vectors)[:, 1:].any()


def test_id_kind_is_fixed(client, stub):
    col = client.create_collection("kinds", dim=DIM)
    assert col.id_type is None
    col.upsert([1, 2], np.ones((2, DIM)))
    assert client.collection("kinds").id_type == "int"
    with pytest.raises(vindex.InvalidIdError):
        col.upsert(["a"], np.ones((1, DIM)))
    _fails(stub.Upsert, pb.UpsertRequest(collection="kinds", str_ids=["a"], vectors=bytes(4 * DIM), dim=DIM),
           "InvalidIdError")
    _fails(stub.Get, pb.GetRequest(collection="kinds", ids=[1], str_ids=["a"]), "InvalidIdError")
    assert len(col) == 2


@pytest.mark.parametrize("where", FILTERS)
def test_filters_match_the_library(twins, where):
    col, idx = twins
    _, x, _, _ = chunk_records()
    res = col.search(x[:6], 8, filter=where, include=["metadata"], **EXACT)
    local = idx.search(x[:6], 8, filter=where, include=["metadata"], **EXACT)
    assert res.ids.tolist() == local.ids.tolist()
    np.testing.assert_array_equal(res.distances, local.distances)
    assert col.count(where) == idx.count(where)
    pages = list(col.scroll(where, batch=37, include=["metadata"]))
    want = [i for p in idx.scroll(where, batch=37) for i in p.ids]
    assert [i for p in pages for i in p.ids] == want
    assert all(len(p.ids) == 37 for p in pages[:-1])
    assert [m for p in pages for m in p.metadata] == [m for p in idx.scroll(where, batch=1000, include=["metadata"])
                                                      for m in p.metadata]


def test_scroll_resumes_from_a_cursor(twins):
    col, idx = twins
    pages = col.scroll(batch=100, include=["documents", "vectors"])
    first = next(pages)
    rest = list(col.scroll(batch=100, cursor=first.cursor))
    all_ids = [i for p in idx.scroll(batch=1000) for i in p.ids]
    assert list(first.ids) + [i for p in rest for i in p.ids] == all_ids
    assert rest[-1].cursor is None and len(all_ids) == N
    assert first.vectors.shape == (100, DIM) and len(first.documents) == 100


def test_concurrent_searches_with_different_filters(twins, stub):
    col, idx = twins
    _, x, _, _ = chunk_records()
    futures = []
    for q in range(12):
        req = pb.SearchRequest(collection="chunks", queries=x[q].tobytes(), dim=DIM, k=5, max_postings=4096,
                               eps=float("inf"), include=["metadata"])
        req.filter.update(FILTERS[q % 3])
        futures.append((q, stub.Search.future(req, timeout=60)))
    for q, f in futures:
        res = f.result()
        local = idx.search(x[q:q + 1], 5, filter=FILTERS[q % 3], **EXACT)
        assert list(res.str_ids) == ["" if i is None else i for i in local.ids[0].tolist()]


def test_delete_by_filter_and_set_metadata(client):
    ids, x, meta, docs = chunk_records(120, seed=3)
    col = client.create_collection("edits", dim=DIM, id_type="str")
    col.upsert(ids, x, metadata=meta, documents=docs)
    where = {"source": "s2.pdf"}
    n = col.count(where)
    assert n > 0 and col.delete(filter=where) == n and col.count(where) == 0 and len(col) == 120 - n
    assert col.delete(filter=where) == 0
    col.set_metadata([ids[1], ids[3]], {"topic": "rag", "page": None})
    got = col.get([ids[1], ids[3]], include=["metadata"]).metadata
    assert got == [{**meta[1], "topic": "rag", "page": None}, {**meta[3], "topic": "rag", "page": None}]
    col.set_metadata([ids[1]], [{"only": 1}], merge=False)
    assert col.get([ids[1]], include=["metadata"]).metadata == [{"only": 1}]
    assert col.count({"topic": "rag"}) == 1  # ids[3]
    with pytest.raises(vindex.UnknownIdError) as ei:
        col.set_metadata([ids[1], "missing#1"], {"topic": "x"})
    assert ei.value.ids == ["missing#1"]
    assert col.count({"topic": "x"}) == 0  # nothing changed
    with pytest.raises(vindex.DuplicateIdError) as ei:
        col.upsert(["dup", "dup"], np.ones((2, DIM)))
    assert ei.value.ids == ["dup"]


BAD_FILTERS = [
    {"page": {"$regex": "x"}},
    {"$and": []},
    {"page": {"$in": 3}},
    {"page": {"$gt": [1]}},
    {"": 1},
    {"$or": {"a": 1}},
    {"page": {"$eq": {"a": 1}}},
]


def _fails(call, request, error, code=INVALID):
    with pytest.raises(grpc.RpcError) as ei:
        call(request, timeout=30)
    err = ei.value
    assert err.code() == code, (err.code(), err.details())
    if error is not None:
        assert dict(err.trailing_metadata() or ()).get(ERROR_KEY) == error, err.trailing_metadata()
    return err


@pytest.mark.parametrize("where", BAD_FILTERS)
def test_bad_filters_are_invalid_argument_and_change_nothing(twins, stub, where):
    col, _ = twins
    reqs = [pb.SearchRequest(collection="chunks", queries=bytes(4 * DIM), dim=DIM, k=3),
            pb.CountRequest(collection="chunks"), pb.DeleteRequest(collection="chunks"),
            pb.ScrollRequest(collection="chunks")]
    for req in reqs:
        req.filter.update(where)
        err = _fails(getattr(stub, type(req).__name__[:-len("Request")]), req, "FilterError")
        assert err.details().startswith("filter")
    with pytest.raises(vindex.FilterError):
        col.search(np.zeros(DIM), 3, filter=where)
    with pytest.raises(vindex.FilterError):
        col.delete(filter=where)
    assert len(col) == N


def test_filters_that_cannot_travel_fail_in_the_client(twins):
    col, _ = twins
    for where in ["source", ["a"], {"a": {1, 2}}, {1: "a"}]:
        with pytest.raises(vindex.FilterError, match=r"^filter"):
            col.count(where)


def test_oversized_and_mismatched_payloads_write_nothing(client, stub):
    col = client.create_collection("limits", dim=DIM, id_type="str")
    col.upsert(["keep"], np.ones((1, DIM)), metadata=[{"a": 1}], documents=["d"])
    one = np.ones((2, DIM), np.float32)
    big_meta = {"blob": "x" * (64 * 1024)}
    with pytest.raises(vindex.PayloadTooLargeError, match="metadata"):
        col.upsert(["a", "b"], one, metadata=[{"a": 1}, big_meta])
    with pytest.raises(vindex.PayloadTooLargeError, match="document"):
        col.upsert(["a", "b"], one, documents=["ok", "y" * (1024 * 1024 + 1)])
    with pytest.raises(vindex.PayloadTooLargeError):
        col.set_metadata(["keep"], big_meta)
    req = pb.UpsertRequest(collection="limits", str_ids=["a", "b"], vectors=one.tobytes(), dim=DIM)
    req.metadata.add().update({"a": 1})
    err = _fails(stub.Upsert, req, "LengthMismatchError")
    assert "metadata: 1 for 2 ids" in err.details()
    req = pb.UpsertRequest(collection="limits", str_ids=["a", "b"], vectors=one.tobytes(), dim=DIM,
                           documents=["a", "b"], no_document=[True])
    _fails(stub.Upsert, req, "LengthMismatchError")
    _fails(stub.Scroll, pb.ScrollRequest(collection="limits", page_token="nope"), "InvalidInputError")
    _fails(stub.Delete, pb.DeleteRequest(collection="limits", str_ids=["keep"], filter={"a": 1}), "InvalidInputError")
    assert len(col) == 1
    assert col.get(["keep"], include=["metadata", "documents"]).metadata == [{"a": 1}]
    assert not col.get(["a", "b"])[1].any()


def test_create_with_id_type(client, stub):
    col = client.create_collection("typed", dim=DIM, id_type="str")
    assert col.id_type == "str" and client.collection("typed").id_type == "str"
    assert client.create_collection("typed", dim=DIM, id_type="str", exist_ok=True).id_type == "str"
    with pytest.raises(CollectionExistsError, match="with str ids, not int"):
        client.create_collection("typed", dim=DIM, id_type="int", exist_ok=True)
    _fails(stub.CreateCollection, pb.CreateCollectionRequest(name="typed2", dim=DIM, id_type="uuid"), None)
