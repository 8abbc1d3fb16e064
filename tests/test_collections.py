"""Collections of a served data directory: damaged collections, bad names and interrupted drops.

In-process servers (``InProcessServer`` from test_service) answer over a real channel; the
damage is done to the files between a stop and a start, as an operator's mistake or a crash
would leave them.
"""
from __future__ import annotations

import concurrent.futures
import os
import shutil

import grpc
import numpy as np
import pytest

import vindex
from test_service import ServerProcess, InProcessServer, f32
from vindex.service import vindex_pb2 as pb
from vindex.service import vindex_pb2_grpc as pb_grpc
from vindex.service.collections import Collections

DIM = 4
ROWS = np.eye(DIM, dtype=np.float32)


def _served(tmp_path, names=("good", "bad")) -> str:
    """A data directory holding collections ``names``, each with four vectors; returns its path."""
    data = tmp_path / "data"
    cols = Collections(str(data))
    for name in names:
        index = cols.create(name, dim=DIM, metric="l2", config={})
        index.upsert(np.arange(DIM), ROWS)
    cols.close()
    return str(data)


def test_create_on_a_damaged_collection_answers_data_loss_and_blocks_nobody(tmp_path):
    """CreateCollection naming a collection that failed to open answers DATA_LOSS at once
    (it used to wait forever for the collection to finish being created, holding a worker
    thread: with as many such calls as workers, every other call stalled and SIGTERM could
    no longer stop the server)."""
    data = _served(tmp_path)
    os.remove(os.path.join(data, "collections", "bad", "store", "CURRENT"))
    srv = InProcessServer(data)  # workers=4
    assert srv.ready.wait(60)
    channel = grpc.insecure_channel(srv.target)
    try:
        stub = pb_grpc.VectorIndexStub(channel)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            creates = [pool.submit(stub.CreateCollection, pb.CreateCollectionRequest(name="bad", dim=DIM,
                                                                                     if_not_exists=bool(i % 2)),
                                   timeout=20) for i in range(8)]
            for f in creates:
                with pytest.raises(grpc.RpcError) as ei:
                    f.result()
                assert ei.value.code() == grpc.StatusCode.DATA_LOSS, ei.value
                assert "'bad' is damaged" in ei.value.details()
        names = [c.name for c in stub.ListCollections(pb.ListCollectionsRequest(), timeout=10).collections]
        assert names == ["good"]
        res = stub.Search(pb.SearchRequest(collection="good", queries=f32(ROWS[:1]), dim=DIM, k=1), timeout=10)
        assert list(res.ids) == [0]
        # dropping the damaged collection frees its name
        assert stub.DropCollection(pb.DropCollectionRequest(name="bad"), timeout=30).dropped
        stub.CreateCollection(pb.CreateCollectionRequest(name="bad", dim=DIM), timeout=30)
    finally:
        channel.close()
        srv.stop(timeout=60)


BAD_NAMES = ["", "a/b", "..", ".hidden", "a b", "x" * 65, "docs\n"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = InProcessServer(tmp_path_factory.mktemp("names") / "data")
    assert srv.ready.wait(60)
    yield srv
    srv.stop()


@pytest.mark.parametrize("name", BAD_NAMES, ids=["empty", "slash", "dotdot", "dot", "space", "65-chars", "newline"])
def test_bad_collection_names_are_invalid_argument_on_every_call(server, name):
    """A name that no collection could have is INVALID_ARGUMENT (not NOT_FOUND) wherever a
    call names a collection, as docs/service.md says."""
    channel = grpc.insecure_channel(server.target)
    stub = pb_grpc.VectorIndexStub(channel)
    calls = [
        (stub.Search, pb.SearchRequest(collection=name, queries=f32(ROWS[:1]), dim=DIM, k=1)),
        (stub.Upsert, pb.UpsertRequest(collection=name, ids=[1], vectors=f32(ROWS[:1]), dim=DIM)),
        (stub.Delete, pb.DeleteRequest(collection=name, ids=[1])),
        (stub.Get, pb.GetRequest(collection=name, ids=[1])),
        (stub.Stats, pb.StatsRequest(collection=name)),
        (stub.Flush, pb.FlushRequest(collection=name)),
        (stub.DescribeCollection, pb.DescribeCollectionRequest(name=name)),
        (stub.DropCollection, pb.DropCollectionRequest(name=name)),
    ]
    try:
        for call, request in calls:
            with pytest.raises(grpc.RpcError) as ei:
                call(request, timeout=30)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (call, ei.value)
            assert "collection name: expected" in ei.value.details()
        with pytest.raises(grpc.RpcError) as ei:
            list(stub.UpsertStream(iter([calls[1][1]]), timeout=30))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        channel.close()


def test_an_interrupted_drop_leaves_no_damaged_collection(tmp_path, monkeypatch):
    """A drop renames the collection out of the served namespace before deleting its files:
    a drop cut short (here: the delete fails half-way, as a crash would stop it) leaves no
    collection behind answering DATA_LOSS, and the next start removes the leftovers."""
    data = _served(tmp_path)
    cols = Collections(data)
    cols.open_all()
    real_rmtree = shutil.rmtree
    calls = []

    def crash_midway(path, *args, **kwargs):
        calls.append(path)
        store = os.path.join(path, "store")
        if os.path.isdir(store):
            real_rmtree(store)  # part of the files are gone ...
        raise KeyboardInterrupt  # ... when the process dies

    monkeypatch.setattr(shutil, "rmtree", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        cols.drop("bad")
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert calls and not os.path.exists(os.path.join(data, "collections", "bad"))
    cols.close()

    cols = Collections(data)
    assert cols.open_all() == ["good"]
    assert os.listdir(os.path.join(data, "collections")) == ["good"]
    cols.close()


def test_a_server_with_an_interrupted_drop_serves(tmp_path):
    """The same through a server process: leftovers of a drop are removed at start, the
    other collections are served and the name can be created again."""
    data = _served(tmp_path)
    root = os.path.join(data, "collections")
    os.rename(os.path.join(root, "bad"), os.path.join(root, ".dropping-bad-1"))
    shutil.rmtree(os.path.join(root, ".dropping-bad-1", "store"))
    srv = ServerProcess(data)
    try:
        with vindex.Client(srv.target, timeout=60) as client:
            assert client.list_collections() == ["good"]
            client.create_collection("bad", dim=DIM)
        assert sorted(os.listdir(root)) == ["bad", "good"]
    finally:
        assert srv.stop() == 0
