"""Admission control (``service/admission.py``): no client can exhaust the server.

In-process servers with small limits: streams that open and never send fill their client's
share (or the whole server) while health checking still answers SERVING and another client
(the IPv6 loopback address is another peer; with tenants, another API key) is served; an idle
stream is ended after the idle timeout with its acknowledged chunk stored; request bytes in
flight are bounded by a budget that queues and then refuses. ``Admission`` itself is checked
on its own event loop; the fuzz harness's idle-stream and slow-client modes run briefly.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading

import grpc
import numpy as np
import pytest

import vindex
from conftest import wait_until
from test_service import ROOT, SERVING, Gate, InProcessServer, f32, health
from vindex.errors import ResourceExhaustedError
from vindex.service import vindex_pb2 as pb
from vindex.service import vindex_pb2_grpc as pb_grpc
from vindex.service.admission import Admission, client_of_peer
from vindex.service.server import Limits

DIM = 4
V4, V6 = "127.0.0.1", "[::1]"  # two peers of one machine: a server on "localhost" listens on both


def _served(tmp_path, **limits) -> InProcessServer:
    srv = InProcessServer(tmp_path / "data", host="localhost", limits=Limits(**limits))
    assert srv.ready.wait(60)
    with grpc.insecure_channel(f"{V4}:{srv.server.port}") as ch:
        pb_grpc.VectorIndexStub(ch).CreateCollection(pb.CreateCollectionRequest(name="c", dim=DIM), timeout=30)
    return srv


def _stub(srv: InProcessServer, host: str = V4, metadata: tuple = ()) -> tuple[grpc.Channel, pb_grpc.VectorIndexStub]:
    channel = grpc.insecure_channel(f"{host}:{srv.server.port}")
    return channel, pb_grpc.VectorIndexStub(channel)


def _upsert(ids, dim: int = DIM, collection: str = "c") -> pb.UpsertRequest:
    ids = np.asarray(ids)
    x = np.random.default_rng(int(ids[0])).standard_normal((ids.size, dim)).astype(np.float32)
    return pb.UpsertRequest(collection=collection, ids=ids.tolist(), vectors=f32(x), dim=dim)


def _search(stub, metadata: tuple = ()) -> pb.SearchResponse:
    return stub.Search(pb.SearchRequest(collection="c", queries=f32(np.ones((1, DIM))), dim=DIM, k=1),
                       timeout=30, metadata=metadata)


class IdleStreams:
    """``n`` UpsertStreams that send ``first`` (if given) and then nothing until closed."""

    def __init__(self, stub, n: int, first: pb.UpsertRequest | None = None, metadata: tuple = ()):
        self.release = threading.Event()

        def requests():
            if first is not None:
                yield first
            self.release.wait(60)

        self.calls = [stub.UpsertStream(requests(), timeout=60, metadata=metadata) for _ in range(n)]

    def close(self) -> None:
        self.release.set()
        for call in self.calls:
            call.cancel()


def _refused(fn, *pieces: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        fn()
    err = ei.value
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (err.code(), err.details())
    for piece in pieces:
        assert piece in err.details(), err.details()
    return err


# --- calls in flight --------------------------------------------------------------------------------
def test_idle_streams_filling_the_server_leave_health_serving(tmp_path):
    srv = _served(tmp_path, max_concurrent_rpcs=4)
    channel, stub = _stub(srv)
    streams = IdleStreams(stub, 4)
    try:
        wait_until(lambda: srv.server.admission.calls == 4, "four streams admitted")
        assert health(channel) == SERVING
        assert health(channel, "vindex.v1.VectorIndex") == SERVING
        _refused(lambda: _search(stub), "--max-concurrent-rpcs 4")
    finally:
        streams.close()
        channel.close()
    wait_until(lambda: srv.server.admission.calls == 0, "the closed streams counted out")
    srv.stop()


def test_a_client_at_its_cap_does_not_starve_another(tmp_path):
    srv = _served(tmp_path, max_concurrent_rpcs=16, max_client_rpcs=4)
    channel, stub = _stub(srv, V4)
    other, other_stub = _stub(srv, V6)
    streams = IdleStreams(stub, 4)
    try:
        wait_until(lambda: srv.server.admission.by_client.get("127.0.0.1") == 4, "four streams admitted")
        _refused(lambda: _search(stub), "client 127.0.0.1", "--max-client-rpcs 4")
        refused = stub.UpsertStream(iter([_upsert([1])]), timeout=30)
        _refused(lambda: list(refused), "client 127.0.0.1")
        with vindex.Client(f"{V4}:{srv.server.port}", timeout=30) as client:
            with pytest.raises(ResourceExhaustedError, match="--max-client-rpcs 4"):
                client.list_collections()
        assert health(channel) == SERVING
        assert _search(other_stub).nq == 1   # another peer: its own share
    finally:
        streams.close()
        channel.close()
        other.close()
        srv.stop()


def test_the_tenant_is_the_client(tmp_path):
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": [
        {"name": "greedy", "api_keys": ["greedy-key"], "classes": ["interactive", "update", "admin"]},
        {"name": "polite", "api_keys": ["polite-key"], "classes": ["interactive"]}]}))
    srv = InProcessServer(tmp_path / "data", tenants=str(path), limits=Limits(max_client_rpcs=2))
    assert srv.ready.wait(60)
    greedy, polite = (("x-api-key", "greedy-key"),), (("x-api-key", "polite-key"),)
    channel, stub = _stub(srv)   # one peer address for both tenants
    stub.CreateCollection(pb.CreateCollectionRequest(name="c", dim=DIM), timeout=30, metadata=greedy)
    streams = IdleStreams(stub, 2, metadata=greedy)
    try:
        wait_until(lambda: srv.server.admission.by_client.get("tenant 'greedy'") == 2, "two streams admitted")
        _refused(lambda: _search(stub, greedy), "tenant 'greedy'", "--max-client-rpcs 2")
        assert _search(stub, polite).nq == 1
        assert health(channel) == SERVING   # no key needed, never refused
    finally:
        streams.close()
        channel.close()
        srv.stop()


# --- idle streams -----------------------------------------------------------------------------------
def test_an_idle_stream_is_ended_and_its_acknowledged_chunk_kept(tmp_path):
    srv = _served(tmp_path, stream_idle_timeout_s=0.3)
    channel, stub = _stub(srv)
    streams = IdleStreams(stub, 1, first=_upsert([7, 8]))
    try:
        [call] = streams.calls
        ack = next(call)
        assert (ack.chunk, ack.upserted) == (0, 2)
        with pytest.raises(grpc.RpcError) as ei:
            next(call)
        assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "idle, no message for 0.3 s" in ei.value.details() and "acknowledged" in ei.value.details()
        wait_until(lambda: srv.server.admission.calls == 0, "the idle stream's slot freed")
        got = stub.Get(pb.GetRequest(collection="c", ids=[7, 8]), timeout=30)
        assert list(got.found) == [True, True]
        assert srv.server.admission.refused["idle"] == 1
    finally:
        streams.close()
        channel.close()
        srv.stop()


# --- request bytes in flight ------------------------------------------------------------------------
def test_request_bytes_in_flight_are_bounded(tmp_path):
    dim, rows = 64, 2400                          # about 620 KB a request
    srv = _served(tmp_path, max_inflight_bytes=1 << 20, inflight_wait_s=0.2)
    channel, stub = _stub(srv)
    stub.CreateCollection(pb.CreateCollectionRequest(name="big", dim=dim), timeout=30)
    gate, use = Gate(), srv.server.collections.use
    first = threading.Event()

    def use_once_blocked(name):  # only the first call waits at the gate
        if not first.is_set():
            first.set()
            return gate.wrap(use)(name)
        return use(name)

    srv.server.collections.use = use_once_blocked
    held = stub.Upsert.future(_upsert(np.arange(rows), dim, "big"), timeout=60)
    try:
        assert gate.entered.wait(30)
        size = _upsert(np.arange(rows), dim, "big").ByteSize()
        assert srv.server.admission.bytes == size
        _refused(lambda: stub.Upsert(_upsert(np.arange(rows, 2 * rows), dim, "big"), timeout=30),
                 "client 127.0.0.1", "--max-inflight-bytes 1048576", "refused at once")
        # a stream's chunk waits for room, then is refused; the chunk before it stays acknowledged
        stream = stub.UpsertStream(iter([_upsert([5]), _upsert(np.arange(rows, 2 * rows), dim, "big")]), timeout=30)
        assert next(stream).upserted == 1
        _refused(lambda: next(stream), "client 127.0.0.1", "waited 0.2 s")
        _refused(lambda: stub.Upsert(_upsert(np.arange(3 * rows), dim, "big"), timeout=30),
                 "larger than the server's whole budget")
        assert _search(stub).nq == 1              # a small request still fits beside it
        gate.opened.set()
        assert held.result(30).upserted == rows
        wait_until(lambda: srv.server.admission.bytes == 0, "the bytes released")
    finally:
        gate.opened.set()
        channel.close()
        srv.stop()


def _limits(**kw) -> Limits:
    return Limits(**{"max_inflight_bytes": 100, "inflight_wait_s": 5.0, **kw})


def test_admission_queues_bytes_first_come_first_served():
    async def main():
        adm = Admission(_limits())
        await adm.charge("a", 80)
        big = asyncio.ensure_future(adm.charge("b", 60))
        small = asyncio.ensure_future(adm.charge("c", 10))   # would fit, but waits behind b
        await asyncio.sleep(0)
        assert not big.done() and not small.done() and adm.snapshot()["waiting"] == 2
        adm.release(80)
        await asyncio.gather(big, small)
        assert adm.bytes == 70
        with pytest.raises(ResourceExhaustedError, match="waited 0.01 s"):
            await adm.charge("d", 40, wait_s=0.01)
        assert adm.bytes == 70 and adm.snapshot()["waiting"] == 0   # a refused wait leaks nothing
        adm.release(60)
        adm.release(10)
        assert adm.bytes == 0
    asyncio.run(main())


def test_admission_caps_calls_per_client_and_overall():
    adm = Admission(_limits(max_concurrent_rpcs=3, max_client_rpcs=2))
    adm.enter("a")
    adm.enter("a")
    with pytest.raises(ResourceExhaustedError, match=r"client a has 2 calls in flight.*--max-client-rpcs 2"):
        adm.enter("a")
    adm.enter("b")
    with pytest.raises(ResourceExhaustedError, match=r"server has 3 calls in flight.*--max-concurrent-rpcs 3"):
        adm.enter("c")
    adm.leave("a")
    adm.enter("c")
    assert adm.by_client == {"a": 1, "b": 1, "c": 1}


@pytest.mark.parametrize("peer, client", [
    ("ipv4:10.0.0.7:5123", "10.0.0.7"), ("ipv6:%5B::1%5D:40000", "::1"),
    ("ipv6:[fe80::1]:1", "fe80::1"), ("unix:/tmp/sock", "unix:/tmp/sock")])
def test_client_of_peer(peer, client):
    assert client_of_peer(peer) == client


# --- the fuzz harness's modes -----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["idle-streams", "slow-client"])
def test_fuzz_admission_modes(tmp_path, mode):
    res = subprocess.run([sys.executable, "-m", "bench.fuzz", "--mode", mode, "--streams", "24",
                          "--duration", "3", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads((tmp_path / f"fuzz-{mode}.json").read_text())
    assert all(result["verdict"].values()), result
