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

from vindex import errors
from vindex.service import vindex_pb2 as pb
from vindex.service.decoding import decode_request_ids
from vindex.service.payloads import (decode_documents, decode_filter, decode_metadata, decode_rows, encode_rows,
                                     from_struct, to_struct)
from vindex.service.status import IDS_KEY, STR_IDS_KEY, MAX_IDS_CHARS, to_exception, trailers

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
