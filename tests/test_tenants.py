"""Tenants over real gRPC: API keys, RPC classes, quotas and TLS (``service/tenants.py``).

One in-process server with a tenants file (``InProcessServer`` from test_service) answers: a
missing or unknown key UNAUTHENTICATED, an RPC outside the tenant's classes PERMISSION_DENIED,
and a tenant over its quota RESOURCE_EXHAUSTED while the others carry on. Quotas are made
deterministic with rates of one token per 1,000 s: after the burst nothing refills during the
test, so refusals are counted exactly, without sleeping. Health and reflection stay open. TLS
servers use certificates made at test time with the ``openssl`` command line.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import vindex
from vindex.errors import ResourceExhaustedError
from vindex.service import cli
from vindex.service import vindex_pb2 as pb
from vindex.service import vindex_pb2_grpc as pb_grpc
from vindex.service.client import Collection
from vindex.service.server import ServerConfig
from vindex.service.tls import server_credentials
from vindex.service.status import ERROR_KEY, QuotaExceededError, ServiceError
from vindex.service.grants import COLLECTION_FIELD
from vindex.service.tenants import RPC_CLASS, TenantConfigError, Tenants, load_tenants, parse_tenants
from conftest import wait_until
from test_service import SERVICE, Gate, InProcessServer, f32, health

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVING = health_pb2.HealthCheckResponse.SERVING
SLOW = 0.001  # tokens per second: nothing refills while a test runs
TENANTS = {"tenants": [
    {"name": "app", "api_keys": ["app-key-1", "app-key-2"], "classes": ["interactive"]},
    {"name": "metered", "api_keys": ["metered-key"], "classes": ["interactive"],
     "quota": {"queries_per_s": SLOW, "burst": 3}},
    {"name": "writer", "api_keys": ["writer-key"], "classes": ["update", "interactive"],
     "quota": {"rows_per_s": SLOW, "burst_rows": 10}},
    {"name": "streamer", "api_keys": ["streamer-key"], "classes": ["update"],
     "quota": {"rows_per_s": SLOW, "burst_rows": 10}},
    {"name": "single", "api_keys": ["single-key"], "classes": ["interactive"], "quota": {"max_in_flight": 1}},
    {"name": "reader", "api_keys": ["reader-key"], "classes": ["interactive"],
     "quota": {"postings_per_s": SLOW, "burst_postings": 2}},
    {"name": "admin", "api_key_sha256": [hashlib.sha256(b"admin-key").hexdigest()],  # the key itself is not in the file
     "classes": ["interactive", "update", "admin"]},
    {"name": "team-a", "api_keys": ["team-a-key"], "classes": ["interactive", "update", "admin"],
     "collections": ["docs", "team-a.*"]},
]}
Q = np.eye(4, dtype=np.float32)


def md(key: str) -> tuple[tuple[str, str], ...]:
    return (("x-api-key", key),)


def fails(call, request, code, metadata=(), timeout=30.0) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        call(request, timeout=timeout, metadata=metadata)
    assert ei.value.code() == code, (ei.value.code(), ei.value.details())
    return ei.value


def search(col, n: int = 1):
    return col.search(Q[:n], k=2)


# --- the shared server ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("tenants")
    path = root / "tenants.json"
    path.write_text(json.dumps(TENANTS))
    srv = InProcessServer(root / "data", tenants=str(path))
    assert srv.ready.wait(60), srv.error
    with vindex.Client(srv.target, api_key="admin-key", timeout=30) as admin:
        admin.create_collection("docs", dim=4).upsert([1, 2, 3, 4], Q)
        admin.create_collection("rows", dim=4)
        admin.create_collection("stream", dim=4)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def channel(server):
    ch = grpc.insecure_channel(server.target)
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def stub(channel):
    return pb_grpc.VectorIndexStub(channel)


def client(server, key: str | None) -> vindex.Client:
    return vindex.Client(server.target, api_key=key, timeout=30)


# --- authentication ------------------------------------------------------------------------------
def test_every_rpc_has_a_class():
    rpcs = {m.name for m in pb.DESCRIPTOR.services_by_name["VectorIndex"].methods}
    assert set(RPC_CLASS) == rpcs


def test_no_key_is_unauthenticated(server, stub):
    err = fails(stub.ListCollections, pb.ListCollectionsRequest(), grpc.StatusCode.UNAUTHENTICATED)
    assert "x-api-key" in err.details()
    fails(stub.Search, pb.SearchRequest(collection="docs", queries=f32(Q[:1]), dim=4, k=1),
          grpc.StatusCode.UNAUTHENTICATED)
    with pytest.raises(grpc.RpcError) as ei:  # a stream is refused before its first message is read
        list(stub.UpsertStream(iter([pb.UpsertRequest(collection="docs", ids=[9], vectors=f32(Q[:1]), dim=4)]),
                               timeout=30))
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with client(server, None) as c, pytest.raises(ServiceError) as ei:
        c.list_collections()
    assert ei.value.code == grpc.StatusCode.UNAUTHENTICATED
    with client(server, "admin-key") as c:
        assert len(c.collection("docs")) == 4  # nothing was written


def test_wrong_key_is_unauthenticated(stub):
    for metadata in (md("app-key-3"), md(""), (("authorization", "Bearer nope"),), (("authorization", "app-key-1"),)):
        err = fails(stub.ListCollections, pb.ListCollectionsRequest(), grpc.StatusCode.UNAUTHENTICATED, metadata)
        assert "nope" not in err.details() and "app-key" not in err.details()  # keys are never echoed


def test_good_key_works(server, stub):
    with client(server, "app-key-1") as c:
        assert set(c.list_collections()) >= {"docs", "rows"}
        assert list(search(c.collection("docs")).ids[0]) == [1, 2]
    with client(server, "app-key-2") as c:  # a tenant's second key
        assert len(c.collection("docs")) == 4
    res = stub.ListCollections(pb.ListCollectionsRequest(), timeout=30,
                               metadata=(("authorization", "Bearer app-key-2"),))
    assert "docs" in {col.name for col in res.collections}
    # the admin key, given in the file only as its SHA-256 digest
    assert stub.ListCollections(pb.ListCollectionsRequest(), timeout=30, metadata=md("admin-key")).collections


def test_health_and_reflection_need_no_key(channel):
    assert health(channel) == SERVING and health(channel, SERVICE) == SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    [listing] = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                               timeout=10))
    assert SERVICE in {s.name for s in listing.list_services_response.service}


# --- classes -------------------------------------------------------------------------------------
def test_class_not_allowed_is_permission_denied(server, stub):
    up = pb.UpsertRequest(collection="docs", ids=[9], vectors=f32(Q[:1]), dim=4)
    err = fails(stub.Upsert, up, grpc.StatusCode.PERMISSION_DENIED, md("app-key-1"))
    assert "'app'" in err.details() and "'update'" in err.details()
    fails(stub.Delete, pb.DeleteRequest(collection="docs", ids=[1]), grpc.StatusCode.PERMISSION_DENIED,
          md("app-key-1"))
    fails(stub.CreateCollection, pb.CreateCollectionRequest(name="nope", dim=4), grpc.StatusCode.PERMISSION_DENIED,
          md("writer-key"))
    fails(stub.DropCollection, pb.DropCollectionRequest(name="docs"), grpc.StatusCode.PERMISSION_DENIED,
          md("writer-key"))
    fails(stub.Search, pb.SearchRequest(collection="docs", queries=f32(Q[:1]), dim=4, k=1),
          grpc.StatusCode.PERMISSION_DENIED, md("streamer-key"))
    with client(server, "app-key-1") as c:
        with pytest.raises(ServiceError) as ei:
            c.collection("docs").upsert([9], Q[:1])
        assert ei.value.code == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(ServiceError) as ei:
            c.drop_collection("docs")
        assert ei.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert len(c.collection("docs")) == 4 and "nope" not in c.list_collections()


# --- collection grants ---------------------------------------------------------------------------
def test_every_rpc_naming_a_collection_is_checked():
    for m in pb.DESCRIPTOR.services_by_name["VectorIndex"].methods:
        fields = m.input_type.fields_by_name
        named = "collection" if "collection" in fields else "name" if "name" in fields else None
        assert COLLECTION_FIELD.get(m.name) == named, m.name


def test_grants_allow_their_collections(server, stub):
    with client(server, "team-a-key") as c:
        assert list(search(c.collection("docs")).ids[0]) == [1, 2]  # an exact name
        col = c.create_collection("team-a.notes", dim=4)  # a prefix
        col.upsert([1, 2], Q[:2])
        assert len(col) == 2 and col.get([1])[1].all() and col.stats()["live"] == 2
        assert col.delete([2]) == 1 and list(search(col).ids[0]) == [1, -1]
        col.checkpoint()
        assert sorted(c.list_collections()) == ["docs", "team-a.notes"]  # not rows, stream, ...
        assert c.drop_collection("team-a.notes")
    with client(server, "app-key-1") as c:  # no "collections" in the file: every collection
        assert {"docs", "rows", "stream"} <= set(c.list_collections())


def _denied(stub, rpc: str, request) -> str:
    err = fails(getattr(stub, rpc), request, grpc.StatusCode.PERMISSION_DENIED, md("team-a-key"))
    assert "'team-a'" in err.details()
    return err.details()


@pytest.mark.parametrize("rpc, make", [
    ("Search", lambda n: pb.SearchRequest(collection=n, queries=f32(Q[:1]), dim=4, k=1)),
    ("Get", lambda n: pb.GetRequest(collection=n, ids=[1])),
    ("Upsert", lambda n: pb.UpsertRequest(collection=n, ids=[9], vectors=f32(Q[:1]), dim=4)),
    ("Delete", lambda n: pb.DeleteRequest(collection=n, ids=[1])),
    ("Flush", lambda n: pb.FlushRequest(collection=n)),
    ("Stats", lambda n: pb.StatsRequest(collection=n)),
    ("DescribeCollection", lambda n: pb.DescribeCollectionRequest(name=n)),
    ("CreateCollection", lambda n: pb.CreateCollectionRequest(name=n, dim=4)),
    ("DropCollection", lambda n: pb.DropCollectionRequest(name=n)),
])
def test_grants_deny_other_collections(server, stub, rpc, make):
    """Outside its grants a tenant gets PERMISSION_DENIED with the same message whether the
    collection exists or not (nor does Create answer ALREADY_EXISTS)."""
    existing = _denied(stub, rpc, make("rows"))
    assert "collection 'rows'" in existing and "team-a.*" in existing
    assert _denied(stub, rpc, make("team-b.x")) == existing.replace("'rows'", "'team-b.x'")
    with client(server, "admin-key") as admin:
        assert len(admin.collection("rows")) == 0 and "team-b.x" not in admin.list_collections()


def test_grants_checked_on_every_stream_message(server, stub):
    with client(server, "admin-key") as admin:
        admin.create_collection("team-a.stream", dim=4)
        before = len(admin.collection("stream"))
    chunks = [pb.UpsertRequest(collection="team-a.stream", ids=[1], vectors=f32(Q[:1]), dim=4),
              pb.UpsertRequest(ids=[2], vectors=f32(Q[1:2]), dim=4),  # no name: the stream's collection
              pb.UpsertRequest(collection="stream", ids=[3], vectors=f32(Q[2:3]), dim=4),
              pb.UpsertRequest(collection="team-a.stream", ids=[4], vectors=f32(Q[3:4]), dim=4)]
    acks = []
    with pytest.raises(grpc.RpcError) as ei:
        for ack in stub.UpsertStream(iter(chunks), timeout=30, metadata=md("team-a-key")):
            acks.append(ack.total)
    assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED, ei.value.details()
    assert "'team-a'" in ei.value.details() and "collection 'stream'" in ei.value.details()
    assert acks == [1, 2]  # the chunks before the forbidden one stay acknowledged
    with client(server, "admin-key") as admin:
        assert len(admin.collection("team-a.stream")) == 2 and len(admin.collection("stream")) == before
        assert server.server.tenants.states["team-a"].refused["collection"] >= 1


def test_fuzzing_as_a_granted_tenant(tmp_path):
    """bench.fuzz --tenants: hostile requests from a tenant with grants never reach another
    collection (every call naming one is PERMISSION_DENIED, List hides it, its data is intact)."""
    from bench import fuzz

    assert fuzz.main(["--requests", "400", "--tenants", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "fuzz-tenants.json").read_text())
    assert result["verdict"]["grants_held"] and result["after"]["data"]["forbidden"]["ok"]
    assert result["fuzz"]["by_status"]["PERMISSION_DENIED"] > 10 and result["fuzz"]["grants"]["checked"] > 300


def test_grant_patterns():
    [t] = parse_tenants({"tenants": [_tenant(collections=["docs", "team-a.*"])]})
    assert [t.grants.allows(n) for n in ("docs", "docs2", "team-a.x", "team-a.", "team-a", "team-b.x")] == \
        [True, False, True, True, False, False]
    [t] = parse_tenants({"tenants": [_tenant(collections=["*"])]})
    assert t.grants.allows("anything")
    [t] = parse_tenants({"tenants": [_tenant()]})  # left out: every collection
    assert t.grants.allows("anything")


# --- quotas --------------------------------------------------------------------------------------
def test_query_quota_refuses_one_tenant_only(server, stub):
    with client(server, "metered-key") as metered, client(server, "app-key-1") as app:
        m_docs, a_docs = metered.collection("docs"), app.collection("docs")
        for _ in range(3):  # the burst
            search(m_docs)
        refused = 0
        for _ in range(10):
            try:
                search(m_docs)
            except QuotaExceededError as e:
                assert "'metered'" in str(e) and "queries_per_s" in str(e) and "retry in" in str(e)
                refused += 1
            assert list(search(a_docs).ids[0]) == [1, 2]  # the other tenant is unaffected
        assert refused == 10  # 1 token per 1,000 s: none came back
        with pytest.raises(QuotaExceededError, match="at most 3 per call"):
            search(m_docs, 4)  # more queries than the burst can never pass
        err = fails(stub.Search, pb.SearchRequest(collection="docs", queries=f32(Q[:1]), dim=4, k=1),
                    grpc.StatusCode.RESOURCE_EXHAUSTED, md("metered-key"))
        trailer = dict(err.trailing_metadata())
        assert trailer[ERROR_KEY] == "QuotaExceededError" and int(trailer["grpc-retry-pushback-ms"]) > 1000
        # only searches spend queries: the tenant's other calls go on; its Stats shows the count
        stats = m_docs.stats()
        assert stats["live"] == 4
        assert stats["tenant"]["name"] == "metered"
        assert stats["tenant"]["queries"] == 3 and stats["tenant"]["refused"]["queries"] == 12


def test_row_quota(server):
    with client(server, "writer-key") as writer, client(server, "admin-key") as admin:
        rows = writer.collection("rows")
        rows.upsert(np.arange(6), np.ones((6, 4)))  # 6 of 10
        with pytest.raises(QuotaExceededError, match="'writer'.*rows_per_s"):
            rows.upsert(np.arange(6, 12), np.ones((6, 4)))  # 6 > 4 left: refused, nothing written
        assert rows.delete([0, 1, 2, 3]) == 4  # deletes spend rows too: 0 left
        with pytest.raises(QuotaExceededError):
            rows.delete([4])
        with pytest.raises(QuotaExceededError, match="at most 10 per call"):
            rows.upsert(np.arange(11), np.ones((11, 4)))
        assert rows.get([4, 5])[1].all()  # reads spend no rows
        assert len(admin.collection("rows")) == 2
        admin.collection("rows").upsert(np.arange(6, 12), np.ones((6, 4)))  # the admin tenant is unmetered
        assert len(admin.collection("rows")) == 8


def test_row_quota_in_a_stream(server):
    """Each chunk is charged as it is read: the chunks before the refusal stay acknowledged."""
    with client(server, "streamer-key") as streamer, client(server, "admin-key") as admin:
        col = Collection(streamer, "stream", pb.CollectionInfo(name="stream", dim=4))  # not Describe: not its class
        acks = []
        with pytest.raises(QuotaExceededError, match="'streamer'"):
            for ack in col.upsert_stream((np.arange(i, i + 4), np.ones((4, 4))) for i in (0, 4, 8)):
                acks.append(ack.total)
        assert acks == [4, 8]
        assert len(admin.collection("stream")) == 8


def test_max_in_flight(server, stub):
    gate = Gate()
    with server.server.collections.use("docs") as index:
        index.search = gate.wrap(index.search)  # blocks on the pool
    try:
        running = stub.Search.future(pb.SearchRequest(collection="docs", queries=f32(Q[:1]), dim=4, k=2),
                                     timeout=60, metadata=md("single-key"))
        assert gate.entered.wait(30)
        err = fails(stub.ListCollections, pb.ListCollectionsRequest(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                    md("single-key"))
        assert "'single'" in err.details() and "max_in_flight" in err.details()
        stub.ListCollections(pb.ListCollectionsRequest(), timeout=30, metadata=md("app-key-1"))  # others go on
        gate.opened.set()
        assert list(running.result(30).ids) == [1, 2]
        wait_until(lambda: server.server.tenants.states["single"].in_flight == 0, "the call to be counted out",
                   timeout=30)
        stub.ListCollections(pb.ListCollectionsRequest(), timeout=30, metadata=md("single-key"))
    finally:
        gate.opened.set()
        del index.search


def test_tenant_reaches_the_index(server, monkeypatch):
    seen = []
    search_, get_ = vindex.Index.search, vindex.Index.get

    def recording_search(self, *args, tenant="default", **kwargs):
        seen.append(("search", tenant))
        return search_(self, *args, tenant=tenant, **kwargs)

    def recording_get(self, *args, tenant="default", **kwargs):
        seen.append(("get", tenant))
        return get_(self, *args, tenant=tenant, **kwargs)

    monkeypatch.setattr(vindex.Index, "search", recording_search)
    monkeypatch.setattr(vindex.Index, "get", recording_get)
    with client(server, "app-key-1") as app, client(server, "admin-key") as admin:
        search(app.collection("docs"))
        admin.collection("docs").get([1])
        big = np.tile(Q, (20, 1))  # a batch (not coalesced) takes the other path
        app.collection("docs").search(big, k=1)
    assert seen == [("search", "app"), ("get", "admin"), ("search", "app")]


# --- files and settings --------------------------------------------------------------------------
def test_io_quota_is_enforced_by_the_index(server):
    """postings_per_s reaches each collection's I/O scheduler: the tenant's searches stop once
    they have read their burst of postings (here one posting a search), the others go on."""
    with client(server, "reader-key") as reader, client(server, "app-key-1") as app:
        r_docs = reader.collection("docs")
        work = [search(r_docs) for _ in range(2)]
        assert [w.stats["postings"] for w in work] == [1, 1]
        with pytest.raises(ResourceExhaustedError, match="tenant 'reader' is over its I/O quota of 0.001 postings/s"):
            search(r_docs)
        assert list(search(app.collection("docs")).ids[0]) == [1, 2]


def _tenant(**over):
    t = {"name": "t", "api_keys": ["key"], "classes": ["interactive"]}
    t.update(over)
    return t


@pytest.mark.parametrize("doc, match", [
    ([], "expected an object"),
    ({"tenants": []}, "non-empty list"),
    ({"tenants": [_tenant()], "extra": 1}, r"unknown key\(s\) \['extra'\]"),
    ({"tenants": [_tenant(colour="red")]}, r"tenants\[0\] \(t\): unknown key\(s\) \['colour'\]"),
    ({"tenants": [_tenant(name="bad name")]}, r"tenants\[0\]\.name"),
    ({"tenants": [_tenant(api_keys=[])]}, "at least one key"),
    ({"tenants": [_tenant(api_keys=["has space"])]}, r"api_keys\[0\]: expected printable ASCII"),
    ({"tenants": [_tenant(api_keys="has space")]}, r"api_keys: expected a list of strings, got str"),
    ({"tenants": [_tenant(api_key_sha256=["has space"])]}, r"api_key_sha256\[0\]: expected 64 hex digits"),
    ({"tenants": {"name": "t", "api_keys": ["has space"]}}, r"tenants: expected a non-empty list of tenants, got dict"),
    ({"tenants": [_tenant(classes=["interactive", "root"])]}, r"classes: expected distinct names"),
    ({"tenants": [_tenant(classes=[])]}, r"classes: expected distinct names"),
    ({"tenants": [{"name": "t", "api_keys": ["k"]}]}, r"classes: missing"),
    ({"tenants": [_tenant(quota={"queries_per_s": 0})]}, r"quota\.queries_per_s: expected a number > 0"),
    ({"tenants": [_tenant(quota={"queries_per_s": -5})]}, r"quota\.queries_per_s"),
    ({"tenants": [_tenant(quota={"queries_per_s": "fast"})]}, r"quota\.queries_per_s"),
    ({"tenants": [_tenant(quota={"rows_per_s": float("nan")})]}, r"quota\.rows_per_s"),
    ({"tenants": [_tenant(quota={"rows_per_s": float("inf")})]}, r"quota\.rows_per_s"),
    ({"tenants": [_tenant(quota={"queries_per_s": True})]}, r"quota\.queries_per_s"),
    ({"tenants": [_tenant(quota={"queries_per_s": 5, "burst": 0.5})]}, r"quota\.burst: expected a number >= 1"),
    ({"tenants": [_tenant(quota={"burst": 5})]}, r"quota\.burst: set only with queries_per_s"),
    ({"tenants": [_tenant(quota={"burst_postings": 5})]}, r"quota\.burst_postings: set only with postings_per_s"),
    ({"tenants": [_tenant(quota={"postings_per_s": 0})]}, r"quota\.postings_per_s: expected a number > 0"),
    ({"tenants": [_tenant(quota={"max_in_flight": 1.5})]}, r"quota\.max_in_flight: expected an integer"),
    ({"tenants": [_tenant(quota={"qps": 5})]}, r"quota: unknown key\(s\) \['qps'\]"),
    ({"tenants": [_tenant(collections="docs")]}, r"\(t\)\.collections: expected a list of strings, got 'docs'"),
    ({"tenants": [_tenant(collections=[])]}, r"\(t\)\.collections: expected at least one collection name or prefix"),
    ({"tenants": [_tenant(collections=["a/b"])]},
     r"\(t\)\.collections\[0\]: expected a collection name or a prefix ending in '\*', got 'a/b'"),
    ({"tenants": [_tenant(collections=["docs", "team-*.x"])]}, r"\(t\)\.collections\[1\]: expected a collection name"),
    ({"tenants": [_tenant(collections=["**"])]}, r"\(t\)\.collections\[0\]: expected a collection name"),
    ({"tenants": [_tenant(collections=["docs", "docs"])]}, r"\(t\)\.collections\[1\]: 'docs' is also collections\[0\]"),
    ({"tenants": [_tenant(), _tenant(api_keys=["other"])]}, r"tenants\[1\]\.name: 't' is also tenants\[0\]"),
    ({"tenants": [_tenant(), _tenant(name="u")]}, r"tenants\[1\] \(u\): an API key is also one of 't'"),
])
def test_config_validation(doc, match):
    with pytest.raises(TenantConfigError, match=match) as ei:
        parse_tenants(doc, "tenants.json")
    assert str(ei.value).startswith("tenants.json") and "has space" not in str(ei.value)  # keys are never echoed


def test_config_defaults_and_files(tmp_path):
    [t] = parse_tenants({"tenants": [_tenant(quota={"queries_per_s": 0.5, "rows_per_s": 200})]})
    assert t.quota.burst == 1 and t.quota.burst_rows == 200 and t.quota.max_in_flight is None
    assert "key" not in repr(t).lower().replace("key_digests", "")  # digests are kept out of reprs
    bad = tmp_path / "bad.json"
    bad.write_text('{"tenants": [')
    with pytest.raises(TenantConfigError, match="bad.json: not valid JSON"):
        load_tenants(str(bad))
    with pytest.raises(FileNotFoundError):
        load_tenants(str(tmp_path / "missing.json"))


def test_docs_example_is_valid():
    with open(os.path.join(ROOT, "docs", "service.md")) as f:
        text = f.read()
    section = text[text.index("## Tenants, API keys and TLS"):]
    example = re.search(r"```json\n(.*?)```", section, flags=re.S).group(1)
    assert len(parse_tenants(json.loads(example), "docs/service.md")) >= 2


def test_serve_refuses_a_bad_tenants_file(tmp_path, capsys, monkeypatch):
    for var in cli._SERVE_ENV:  # serve sets these for its process: restore them afterwards
        monkeypatch.setenv(var, os.environ.get(var, "1"))
    bad = tmp_path / "tenants.json"
    bad.write_text(json.dumps({"tenants": [_tenant(classes=["everything"])]}))
    assert cli.main(["serve", "--data", str(tmp_path / "data"), "--port", "0", "--tenants", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "TenantConfigError" in err and "classes" in err
    assert not os.path.exists(tmp_path / "data" / "server.lock")  # refused before the data directory


def test_cli_sends_the_api_key(server, capsys, monkeypatch):
    monkeypatch.delenv("VINDEX_API_KEY", raising=False)
    capsys.readouterr()
    assert cli.main(["list", "--server", server.target, "--api-key", "app-key-1"]) == 0
    assert "docs\tdim 4" in capsys.readouterr().out
    assert cli.main(["list", "--server", server.target]) == 2
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    monkeypatch.setenv("VINDEX_API_KEY", "app-key-2")
    assert cli.main(["stats", "docs", "--server", server.target]) == 0
    assert json.loads(capsys.readouterr().out)["tenant"]["name"] == "app"


def test_client_argument_checks():
    with pytest.raises(ValueError, match="api_key"):
        vindex.Client("127.0.0.1:1", api_key="two words")
    with pytest.raises(ValueError, match="tls_client_cert and tls_client_key"):
        vindex.Client("127.0.0.1:1", tls_client_cert=b"x")
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        server_credentials(ServerConfig(tls_cert="cert.pem"))
    with pytest.raises(ValueError, match="tls_client_ca"):
        server_credentials(ServerConfig(tls_client_ca="ca.pem"))


# --- TLS -----------------------------------------------------------------------------------------
def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA, a server certificate for localhost / 127.0.0.1 and a client certificate (EC P-256,
    valid one day), written to a temporary directory and never kept."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line is needed to make test certificates")
    d = tmp_path_factory.mktemp("certs")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=vindex test CA",
             cwd=d)
    for name, ext in (("server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        (d / f"{name}.ext").write_text(ext)
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=vindex test {name}",
                 cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial",
                 "2" if name == "server" else "3", "-days", "1", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
                 cwd=d)
    return d


def test_tls_round_trip(certs, tmp_path):
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": [_tenant(name="app", api_keys=["tls-key"],
                                                       classes=["interactive", "update", "admin"])]}))
    srv = InProcessServer(tmp_path / "data", tenants=str(tenants), tls_cert=str(certs / "server.pem"),
                          tls_key=str(certs / "server.key"))
    try:
        assert srv.ready.wait(60), srv.error
        with vindex.Client(srv.target, api_key="tls-key", tls_root_cert=str(certs / "ca.pem"), timeout=30) as c:
            col = c.create_collection("secret", dim=4)
            col.upsert([1, 2], Q[:2])
            assert list(col.search(Q[:1], k=2).ids[0]) == [1, 2]
        ca = (certs / "ca.pem").read_bytes()  # PEM bytes work as well as a path
        with vindex.Client(srv.target, tls_root_cert=ca, timeout=30) as c, pytest.raises(ServiceError) as ei:
            c.list_collections()
        assert ei.value.code == grpc.StatusCode.UNAUTHENTICATED  # TLS is no substitute for a key
        for plain in (vindex.Client(srv.target, api_key="tls-key", timeout=5),  # plaintext to a TLS port
                      vindex.Client(srv.target, api_key="tls-key", tls_root_cert=str(certs / "client.pem"),
                                    timeout=5)):  # a CA that did not sign the server's certificate
            with plain, pytest.raises(ServiceError) as ei:
                plain.list_collections()
            assert ei.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        srv.stop()


def test_mutual_tls(certs, tmp_path):
    srv = InProcessServer(tmp_path / "data", tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.key"),
                          tls_client_ca=str(certs / "ca.pem"))
    try:
        assert srv.ready.wait(60), srv.error
        with vindex.Client(srv.target, tls_root_cert=str(certs / "ca.pem"), tls_client_cert=str(certs / "client.pem"),
                           tls_client_key=str(certs / "client.key"), timeout=30) as c:
            assert c.list_collections() == []  # no tenants file: the one default tenant
        with vindex.Client(srv.target, tls_root_cert=str(certs / "ca.pem"), timeout=5) as c, \
                pytest.raises(ServiceError) as ei:
            c.list_collections()
        assert ei.value.code == grpc.StatusCode.UNAVAILABLE  # no client certificate: no handshake
    finally:
        srv.stop()


def test_tls_files_are_checked(certs):
    with pytest.raises(ValueError, match="not a certificate and its private key"):
        server_credentials(ServerConfig(tls_cert=str(certs / "server.pem"), tls_key=str(certs / "client.key")))
    with pytest.raises(ValueError, match="tls_key: expected a PEM file holding a private key"):
        server_credentials(ServerConfig(tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.pem")))
    assert server_credentials(ServerConfig(tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.key")))


def test_buckets_refill_with_the_clock():
    """The quota policy alone, on a hand-driven clock: refills, retry advice, in-flight cap."""
    now = [100.0]
    [t] = parse_tenants({"tenants": [_tenant(quota={"queries_per_s": 2, "burst": 2, "max_in_flight": 1})]})
    state = Tenants([t], clock=lambda: now[0]).states["t"]
    state.charge("queries", 2)
    with pytest.raises(QuotaExceededError) as ei:
        state.charge("queries", 1)
    assert ei.value.retry_after_s == pytest.approx(0.5)  # 1 token at 2 per second
    now[0] += 0.5
    state.charge("queries", 1)
    state.charge("rows", 10**6)  # no rows quota: unlimited
    state.enter()
    with pytest.raises(QuotaExceededError, match="max_in_flight"):
        state.enter()
    state.leave()
    state.enter()
    assert state.snapshot() == {"name": "t", "calls": 2, "in_flight": 1, "queries": 3, "rows": 10**6,
                                "refused": {"class": 0, "collection": 0, "in_flight": 1, "queries": 1, "rows": 0}}
