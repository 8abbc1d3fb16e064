"""``vindex.AsyncClient`` is ``vindex.Client`` as coroutines: congruent on one real server.

The same table of calls (every public method, good and bad input) runs through ``Client`` on a
fresh collection and then through ``AsyncClient`` on another fresh collection of the same name;
each step's result or exception must be the same. Then: both classes have the same public
methods with the same signatures, many concurrent searches on one ``AsyncClient``, async
batches for ``upsert_stream``, API keys, and the docs/service.md example as written.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import os
import re

import numpy as np
import pytest
from google.protobuf import json_format

import vindex
from test_service import InProcessServer
from test_tenants import certs  # noqa: F401  (the fixture)
from vindex.results import GetResult, ScrollPage, SearchResult
from vindex.service.aio_client import AsyncClient, AsyncCollection
from vindex.service.client import Client, Collection
from vindex.service.calls import client_method
from vindex.service.methods import CollectionMethods
from vindex.service.status import ServiceError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIM, N = 8, 40
X = np.random.default_rng(7).standard_normal((N, DIM)).astype(np.float32)
IDS = [f"doc-{i}" for i in range(N)]
META = [None if i % 5 == 0 else {"topic": "ab"[i % 2], "page": i, "tags": ["x", i % 3]} for i in range(N)]
DOCS = [None if i % 3 == 0 else f"text of chunk {i}" for i in range(N)]
TWIN = "twin"


class Previous:
    """An argument taken from the previous step's result (as the client returned it)."""

    def __init__(self, pick):
        self.pick = pick


def stats_view(stats: dict) -> tuple:
    return sorted(stats), stats["live"], stats["dim"], stats["metric"]


# (method, args, kwargs[, view]) in order, on a fresh str-id collection of dim DIM
COLLECTION_STEPS = [
    ("count", (), {}),
    ("add", (IDS[:30], X[:30]), dict(metadata=META[:30], documents=DOCS[:30])),
    ("add", (IDS[28:32], X[28:32]), {}),                                  # IdExistsError naming 28, 29
    ("upsert", (IDS[30:32], X[30:32]), dict(metadata=META[30:32])),
    ("upsert", (IDS[:1], X[:2]), {}),                                      # LengthMismatchError
    ("upsert", ([1, 2], X[:2]), {}),                                       # int ids in a str collection
    ("upsert", (IDS[:2], X[:2]), dict(documents="one text")),             # not one per row
    ("upsert", (IDS[:1], np.full((1, DIM), np.nan)), {}),                   # NonFiniteError
    ("upsert", (["a", 3], X[:2]), {}),                                     # mixed ids
    ("upsert_many", (IDS[32:], X[32:]), dict(chunk=3, metadata=META[32:], documents=DOCS[32:])),
    ("upsert_many", (IDS[:2], X[:2]), dict(metadata=[{}])),                # LengthMismatchError
    ("upsert_stream", ([(IDS[:2], X[:2] + 1), (IDS[2:4], X[2:4], META[2:4], DOCS[2:4])],), {}),
    ("upsert_stream", ([(IDS[:2], X[:2]), (IDS[2:4], np.ones((2, DIM + 1)))],), {}),  # 2nd batch: DimensionError
    ("search", (X[:3],), dict(k=5)),
    ("search", (X[:3],), dict(k=4, filter={"topic": "a", "page": {"$gte": 5}},
                              include=["metadata", "documents", "vectors"])),
    ("search", (X[0],), dict(k=3, include="documents", ef=32, max_postings=8, eps=0.5, timeout=30)),
    ("search", (X[:1],), dict(k=0)),                                       # InvalidKError
    ("search", (X[:3],), dict(k=5, recall_target=0.9)),
    ("search", (X[:1],), dict(recall_target=1.0)),                         # InvalidKError (client)
    ("search", (np.ones((1, DIM + 1)),), {}),                               # DimensionError
    ("search", (X[:1],), dict(filter={"page": {"$nope": 1}})),            # FilterError (server)
    ("search", (X[:1],), dict(filter=["page"])),                           # FilterError (client)
    ("search", (X[:1],), dict(include=["colour"])),
    ("search", (X[:1],), dict(timeout=-1)),
    ("get", (IDS[:3] + ["missing"],), dict(include=["metadata", "documents"])),
    ("get", (np.array(IDS[5:7]),), {}),
    ("get", ("doc-1",), {}),                                               # one str: InvalidIdError
    ("count", ({"topic": "b"},), {}),
    ("count", ({"page": {"$in": "no"}},), {}),                             # FilterError
    ("scroll", (), dict(batch=7, include=["documents"])),
    ("scroll", ({"topic": "a"},), dict(batch=4, include=["metadata", "vectors"],
                                       cursor=Previous(lambda pages: pages[1].cursor))),
    ("scroll", (), dict(batch=0)),
    ("set_metadata", (IDS[1:4], {"topic": "c"}), {}),
    ("set_metadata", (IDS[4:6], [{"topic": "c"}, {"page": -1}]), dict(merge=False)),
    ("set_metadata", (["missing", IDS[0]], {"a": 1}), {}),                 # UnknownIdError naming "missing"
    ("set_metadata", (IDS[:2], None), {}),
    ("get", (IDS[:6],), dict(include="metadata")),
    ("delete", (), dict(filter={"topic": "c"})),
    ("delete", (IDS[6:9] + ["missing"],), {}),
    ("delete", (), {}),                                                    # neither ids nor filter
    ("delete", (IDS[:1],), dict(filter={"topic": "a"})),                   # both
    ("count", (), {}),
    ("wait_idle", (), dict(timeout=30)),
    ("checkpoint", (), {}),
    ("stats", (), {}, stats_view),
]

# (method, args, kwargs) of the client, in order
CLIENT_STEPS = [
    ("create_collection", ("c1",), dict(dim=4, metric="cosine", id_type="int", posting_limit_bytes=32768)),
    ("create_collection", ("c1",), dict(dim=4)),                           # CollectionExistsError
    ("create_collection", ("c1",), dict(dim=4, metric="cosine", exist_ok=True)),
    ("create_collection", ("c2",), dict(dim=0)),                           # DimensionError
    ("create_collection", ("c2",), dict(dim=4, id_type=5)),
    ("create_collection", ("c2",), dict(dim=4, metric="hamming")),
    ("create_collection", ("c2",), dict(dim=4, no_such_field=1)),
    ("collection", ("c1",), {}),
    ("collection", ("c3",), {}),                                           # CollectionNotFoundError
    ("list_collections", (), {}),
    ("drop_collection", ("c1",), {}),
    ("drop_collection", ("c1",), {}),
    ("wait_ready", (), dict(timeout=30)),
]


# --- comparing what the two clients give ---------------------------------------------------------
def view(value):
    """``value`` as plain data: equal for equal results, whichever client made it."""
    if isinstance(value, BaseException):
        return ("raised", type(value).__name__, str(value), view(getattr(value, "ids", None)),
                getattr(getattr(value, "code", None), "name", None))
    if isinstance(value, (SearchResult, GetResult)):
        # a search's work counts depend on background rebalancing: only which ones it reports
        return (type(value).__name__, [view(v) for v in value], view(value.included),
                sorted(getattr(value, "stats", {})))
    if isinstance(value, ScrollPage):
        return ("page", view(value.ids), value.cursor, view(value.included))
    if isinstance(value, (Collection, AsyncCollection)):
        return ("collection", value.name, value.dim, value.metric, value.config, value.id_type)
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, view(value.tolist()))
    if isinstance(value, (list, tuple)):
        return [view(v) for v in value]
    if isinstance(value, dict):
        return {k: view(v) for k, v in value.items()}
    if hasattr(value, "DESCRIPTOR"):  # a response message (UpsertAck)
        return (type(value).__name__, json_format.MessageToDict(value))
    if isinstance(value, float):
        return round(value, 4)
    return value


def resolve(args: tuple, kwargs: dict, previous):
    def one(v):
        return v.pick(previous) if isinstance(v, Previous) else v
    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def play_sync(target: str, subject: str, steps: list) -> list:
    outcomes, previous = [], None
    with Client(target, timeout=60) as client:
        obj = client if subject == "client" else client.create_collection(TWIN, dim=DIM, id_type="str")
        for name, args, kwargs, *shown in steps:
            args, kwargs = resolve(args, kwargs, previous)
            try:
                value = getattr(obj, name)(*args, **kwargs)
                if inspect.isgenerator(value):
                    value = list(value)
            except Exception as e:
                value = e
            previous = value
            outcomes.append(view(shown[0](value) if shown and not isinstance(value, Exception) else value))
        if subject != "client":
            assert client.drop_collection(TWIN)
    return outcomes


async def play_async(target: str, subject: str, steps: list) -> list:
    outcomes, previous = [], None
    async with AsyncClient(target, timeout=60) as client:
        obj = client if subject == "client" else await client.create_collection(TWIN, dim=DIM, id_type="str")
        for name, args, kwargs, *shown in steps:
            args, kwargs = resolve(args, kwargs, previous)
            try:
                value = getattr(obj, name)(*args, **kwargs)
                value = await value if inspect.isawaitable(value) else [item async for item in value]
            except Exception as e:
                value = e
            previous = value
            outcomes.append(view(shown[0](value) if shown and not isinstance(value, Exception) else value))
        if subject != "client":
            assert await client.drop_collection(TWIN)
    return outcomes


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


# --- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    srv = InProcessServer(tmp_path_factory.mktemp("aio") / "data")
    assert srv.ready.wait(120), srv.error
    yield srv
    srv.stop()


# --- congruence ----------------------------------------------------------------------------------
@pytest.mark.parametrize("subject,steps", [("collection", COLLECTION_STEPS), ("client", CLIENT_STEPS)])
def test_same_results_and_errors(served, subject, steps):
    blocking = play_sync(served.target, subject, steps)
    awaited = asyncio.run(play_async(served.target, subject, steps))
    for (name, args, kwargs, *_), want, got in zip(steps, blocking, awaited):
        assert got == want, f"{name}{args!r:.60} {kwargs!r:.60}"
    # the table exercises what it claims: results, and errors with the library's classes
    raised = {o[1] for o in blocking if isinstance(o, tuple) and o[0] == "raised"}
    if subject == "collection":
        assert raised >= {"IdExistsError", "LengthMismatchError", "InvalidIdError", "DimensionError",
                          "InvalidKError", "FilterError", "UnknownIdError", "InvalidInputError", "NonFiniteError"}
        assert blocking[2][3] == ["doc-28", "doc-29"]               # the ids the IdExistsError names
        assert len(blocking[29]) == 6 and blocking[30][0][1] != blocking[29][0][1]  # pages; resumed elsewhere
        assert blocking[-4] == 40 - 5 - 2                           # deleted by filter and by id
    else:
        assert raised >= {"CollectionExistsError", "CollectionNotFoundError", "DimensionError", "InvalidInputError"}
        assert blocking[9] == ["c1"] and blocking[10:12] == [True, False]


def test_the_tables_cover_every_method():
    collection = {n for n in public(Collection) if callable(getattr(Collection, n))}
    assert collection == {n for n in public(CollectionMethods)
                          if isinstance(inspect.getattr_static(CollectionMethods, n), client_method)}
    assert collection <= {s[0] for s in COLLECTION_STEPS}
    client = {n for n in public(Client) if callable(getattr(Client, n))}
    assert client - {"close"} <= {s[0] for s in CLIENT_STEPS}


def test_every_method_has_an_async_twin():
    assert public(Client) == public(AsyncClient)
    assert public(Collection) == public(AsyncCollection)
    for sync_cls, async_cls in ((Client, AsyncClient), (Collection, AsyncCollection)):
        for name in public(sync_cls):
            blocking, awaited = getattr(sync_cls, name), getattr(async_cls, name)
            if not callable(blocking):  # a property
                assert not callable(awaited), name
                continue
            assert inspect.signature(blocking).parameters == inspect.signature(awaited).parameters, name
            iterates = name in ("scroll", "upsert_stream")
            assert inspect.iscoroutinefunction(awaited) is not iterates, name
            assert not inspect.iscoroutinefunction(blocking), name
    assert vindex.AsyncClient is AsyncClient and vindex.AsyncCollection is AsyncCollection


def test_same_option_errors():
    for kwargs, match in ((dict(api_key="has space"), "^api_key: expected"),
                          (dict(tls_client_cert=b"pem"), "^tls_client_cert and tls_client_key: expected both"),
                          (dict(tls_root_cert=b"pem", credentials=object()), "^credentials: give either")):
        for cls in (Client, AsyncClient):
            with pytest.raises(ValueError, match=match):
                cls("127.0.0.1:1", **kwargs)
    with pytest.raises(TypeError, match="tls_root_cert: expected a path or PEM bytes, got int"):
        AsyncClient("127.0.0.1:1", tls_root_cert=5)


# --- AsyncClient on its own ----------------------------------------------------------------------
def test_fifty_concurrent_searches(served):
    queries = np.random.default_rng(8).standard_normal((50, DIM)).astype(np.float32)
    with Client(served.target) as client:
        col = client.create_collection("many", dim=DIM)
        col.upsert(np.arange(N), X)
        want = col.search(queries, k=5)

    async def searches():
        async with AsyncClient(served.target) as client:
            acol = await client.collection("many")
            return await asyncio.gather(*(acol.search(q, k=5) for q in queries))
    got = asyncio.run(searches())
    assert len(got) == 50
    np.testing.assert_array_equal(np.concatenate([r.ids for r in got]), want.ids)
    np.testing.assert_allclose(np.concatenate([r.distances for r in got]), want.distances, rtol=1e-5)


def test_upsert_stream_takes_async_batches_and_fixes_the_id_type(served):
    async def stream():
        async with AsyncClient(served.target) as client:
            col = await client.create_collection("streamed", dim=DIM)
            assert col.id_type is None
            with pytest.raises(TypeError, match=r"use await collection.count\(\)"):
                len(col)

            async def batches():
                for lo in range(0, N, 16):
                    await asyncio.sleep(0)  # batches made by other coroutines
                    yield IDS[lo:lo + 16], X[lo:lo + 16], META[lo:lo + 16], DOCS[lo:lo + 16]
            totals = [ack.total async for ack in col.upsert_stream(batches())]
            assert col.id_type is None  # a stream does not say which kind it stored ...
            assert (await client.collection("streamed")).id_type == "str"  # ... the server does
            await col.upsert(["x"], X[:1])
            fresh = await client.create_collection("fixed", dim=DIM)
            await fresh.add([5], X[:1])
            return totals, fresh.id_type, (await col.get(IDS[-2:], include=["metadata", "documents"]))
    totals, fixed, got = asyncio.run(stream())
    assert totals == [16, 32, 40] and fixed == "int"
    assert got.found.all() and got.metadata == META[-2:] and got.documents == DOCS[-2:]


def test_api_keys(tmp_path):
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": [
        {"name": "admin", "api_keys": ["admin-key"], "classes": ["interactive", "update", "admin"]},
        {"name": "reader", "api_keys": ["reader-key"], "classes": ["interactive"]}]}))
    srv = InProcessServer(tmp_path / "data", tenants=str(path))
    try:
        assert srv.ready.wait(120), srv.error
        with Client(srv.target, api_key="admin-key") as admin:
            admin.create_collection("docs", dim=DIM).upsert(np.arange(3), X[:3])

        async def calls(key):
            async with AsyncClient(srv.target, api_key=key) as client:
                out = []
                for call in (lambda: client.list_collections(),
                             lambda: client.collection("docs"),
                             lambda: client.create_collection("other", dim=2)):
                    try:
                        out.append(view(await call()))
                    except Exception as e:
                        out.append(view(e))
                return out
        for key in (None, "wrong-key", "reader-key"):
            with Client(srv.target, api_key=key) as client:
                want = []
                for call in (client.list_collections, lambda: client.collection("docs"),
                             lambda: client.create_collection("other", dim=2)):
                    try:
                        want.append(view(call()))
                    except Exception as e:
                        want.append(view(e))
            assert asyncio.run(calls(key)) == want, key
        assert want[0] == ["docs"] and want[1][0] == "collection" and want[2][4] == "PERMISSION_DENIED"
        assert asyncio.run(calls(None))[0][4] == "UNAUTHENTICATED"
    finally:
        srv.stop()


def test_mutual_tls(certs, tmp_path):  # noqa: F811
    srv = InProcessServer(tmp_path / "data", tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.key"),
                          tls_client_ca=str(certs / "ca.pem"))
    options = [dict(tls_root_cert=str(certs / "ca.pem"), tls_client_cert=str(certs / "client.pem"),
                    tls_client_key=(certs / "client.key").read_bytes(), timeout=30),
               dict(tls_root_cert=str(certs / "ca.pem"), timeout=5),    # no client certificate: no handshake
               dict(timeout=5)]                                         # plaintext to a TLS port

    async def listed(kwargs):
        async with AsyncClient(srv.target, **kwargs) as client:
            try:
                return view(await client.list_collections())
            except ServiceError as e:  # the transport's message varies: class and code
                return type(e).__name__, e.code.name
    try:
        assert srv.ready.wait(60), srv.error
        for kwargs in options:
            with Client(srv.target, **kwargs) as client:
                try:
                    want = view(client.list_collections())
                except ServiceError as e:
                    want = type(e).__name__, e.code.name
            assert asyncio.run(listed(kwargs)) == want
        assert asyncio.run(listed(options[0])) == [] and want == ("ServiceError", "UNAVAILABLE")
    finally:
        srv.stop()


def test_closed_client_and_unreachable_server():
    async def closed():
        client = AsyncClient("127.0.0.1:1", timeout=0.5)
        with pytest.raises(ServiceError) as ei:
            await client.list_collections()
        assert ei.value.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
        with pytest.raises(TimeoutError, match="not SERVING after 0.2 s"):
            await client.wait_ready(0.2)
        await client.close()
    asyncio.run(closed())


def test_docs_example_runs_as_written(served):
    with open(os.path.join(ROOT, "docs", "service.md")) as f:
        text = f.read()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "AsyncClient(" in b]
    assert blocks, "docs/service.md shows the AsyncClient"
    for code in blocks:
        assert "127.0.0.1:50051" in code
        exec(compile(code.replace("127.0.0.1:50051", served.target), "service.md", "exec"), {"__name__": "__doc__"})
