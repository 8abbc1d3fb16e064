"""The gRPC service against real servers on port 0.

A server subprocess (``vindex serve --port 0``) shared by the module answers: client results
equal the embedded library's on the same data (congruence); every error path returns its status
code, never UNKNOWN or INTERNAL, and the client re-raises the library's exception; concurrent
clients see consistent results. Servers of their own cover restarts (SIGTERM and kill -9) and
the data directory's lock. In-process servers (``Server`` on a loop in a background thread) with
a hook that blocks a call cover, without timing assumptions, health before ready and while
draining, a stop during start-up, drops waiting for running calls, racing creates and
admission control. The ``vindex`` command line runs against the shared server.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import vindex
from conftest import brute_force, wait_until
from vindex.service import cli
from vindex.service import vindex_pb2 as pb
from vindex.service import vindex_pb2_grpc as pb_grpc
from vindex.service.ingest import progress_path
from vindex.service.server import Limits, Server, ServerConfig
from vindex.service.status import (ERROR_KEY, IDS_KEY, CollectionExistsError, CollectionNotFoundError,
                            RequestTooLargeError, ServiceError)
from vindex.storage import IOClass
from vindex.storage.faults import FaultyStore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIM = 32
#: 4 KiB postings hold 30 records of dimension 32, so 2000 vectors fill dozens of postings.
CONFIG = dict(posting_limit_bytes=4096)
#: Search parameters that visit every posting: results are the exact top-k.
EXACT = dict(max_postings=4096, eps=float("inf"))
MAX_ROWS, MAX_QUERIES, MAX_K, MAX_RESULTS = 5000, 500, 1024, 100_000
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE = "vindex.v1.VectorIndex"
START_TIMEOUT = 120.0  # seconds for a server to print its ready line (kernels load from cache)


def data(n: int = 2000, seed: int = 0, dim: int = DIM) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def f32(rows: np.ndarray) -> bytes:
    return np.ascontiguousarray(rows, dtype="<f4").tobytes()


# --- servers -------------------------------------------------------------------------------------
class ServerProcess:
    """``vindex serve --port 0`` in a subprocess; the port comes from its ready line."""

    READY = re.compile(r"^vindex: serving \d+ collection\(s\) .* on (\S+):(\d+) \(data ")

    def __init__(self, data_dir, *extra: str):
        self.data_dir = str(data_dir)
        self.stderr_path = os.path.join(os.path.dirname(self.data_dir),
                                        f"{os.path.basename(self.data_dir)}-{time.monotonic_ns()}.log")
        self._stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vindex.service.cli", "serve", "--data", self.data_dir, "--port", "0",
             "--workers", "4", *extra],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self.lines: list[str] = []
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.target = self._wait_ready()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _next_line(self, timeout: float) -> str | None:
        line = self._lines.get(timeout=timeout)
        if line is not None:
            self.lines.append(line)
        return line

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            line = self._next_line(max(0.1, deadline - time.monotonic()))
            if line is None:
                raise RuntimeError(f"server exited with {self.proc.wait()} before it was ready:\n{self.log()}")
            m = self.READY.match(line)
            if m:
                return f"{m.group(1)}:{m.group(2)}"

    def log(self) -> str:
        with open(self.stderr_path) as f:
            return f.read()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the server, wait for it to exit and read the rest of its stdout."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        while self._next_line(timeout=10) is not None:
            pass
        self._stderr.close()
        return rc


def stopped_cleanly(server: ServerProcess) -> None:
    rc = server.stop(signal.SIGTERM)
    assert rc == 0, server.log()
    assert server.lines[-1] == "vindex: stopped", server.lines
    assert "Traceback" not in server.log()
    assert "internal error" not in server.log()


class InProcessServer:
    """A :class:`Server` on its own event loop in a background thread.

    ``prepare(server)`` runs after construction and before ``start()`` (to install hooks)."""

    def __init__(self, data_dir, prepare=None, **config):
        self.config = ServerConfig(data_dir=str(data_dir), port=0, workers=4, **config)
        self.ready = threading.Event()
        self.constructed = threading.Event()
        self.error: BaseException | None = None
        self._prepare = prepare
        self._stopping = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.constructed.wait(30)

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self.server = Server(self.config, on_ready=lambda s: self.ready.set())
            if self._prepare:
                self._prepare(self.server)
            self.constructed.set()
            await self.server.start()
            await self.server.wait()

        try:
            asyncio.run(main())
        except BaseException as e:  # reported by stop()
            self.error = e
            self.constructed.set()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def begin_stop(self):
        if self._stopping is None:
            self._stopping = asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop)
        return self._stopping

    def stop(self, timeout: float = 60.0) -> None:
        if self.thread.is_alive():
            self.begin_stop().result(timeout)
            self.thread.join(timeout)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


def health(channel, service: str = "") -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                     timeout=10).status


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("served") / "data", "--max-rows", str(MAX_ROWS),
                        "--max-queries", str(MAX_QUERIES), "--max-k", str(MAX_K),
                        "--max-results", str(MAX_RESULTS), "--max-search-threads", "2")
    try:
        yield srv
    finally:
        stopped_cleanly(srv)


@pytest.fixture(scope="module")
def client(server):
    with vindex.Client(server.target, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def channel(server):
    # no send limit of its own, so the server's 64 MiB receive limit is what refuses big messages
    ch = grpc.insecure_channel(server.target, options=[("grpc.max_send_message_length", -1)])
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def stub(channel):
    return pb_grpc.VectorIndexStub(channel)


def test_ready_line_means_serving_and_reflection(server, channel):
    # the ready line is printed after health is set: no polling needed
    assert health(channel) == SERVING
    assert health(channel, SERVICE) == SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    [listing] = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                               timeout=10))
    names = {s.name for s in listing.list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names
    [desc] = list(refl.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)]), timeout=10))
    assert desc.file_descriptor_response.file_descriptor_proto  # the schema is served too


def test_codegen_stubs_up_to_date():
    res = subprocess.run([sys.executable, "-m", "vindex.service.codegen", "--check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


# --- congruence ----------------------------------------------------------------------------------
def _same_result(remote, local, work: bool = True):
    """Equal ids and distances; with ``work``, equal work counters too (same postings)."""
    np.testing.assert_array_equal(remote.ids, local.ids)
    np.testing.assert_array_equal(remote.distances, local.distances)
    assert remote.ids.dtype == local.ids.dtype and remote.distances.dtype == local.distances.dtype
    if work:
        assert remote.stats == local.stats


def _apply_same_updates(col, idx, x: np.ndarray, seed: int) -> None:
    """The same upserts, replacements, adds and deletes on a collection and an index."""
    rng = np.random.default_rng(seed)
    for lo in range(0, 1500, 250):
        ids = np.arange(lo, lo + 250)
        col.upsert(ids, x[lo:lo + 250])
        idx.upsert(ids, x[lo:lo + 250])
    new = np.arange(1500, x.shape[0])
    col.add(new, x[1500:])
    idx.add(new, x[1500:])
    moved = rng.choice(x.shape[0], 300, replace=False)
    moved_to = rng.standard_normal((300, x.shape[1])).astype(np.float32)
    col.upsert(moved, moved_to)
    idx.upsert(moved, moved_to)
    gone = rng.choice(x.shape[0], 400, replace=False)
    assert col.delete(gone) == idx.delete(gone) == 400
    assert col.delete(gone) == idx.delete(gone) == 0  # already deleted: idempotent


@pytest.mark.parametrize("metric", ["l2", "ip", "cosine"])
def test_congruent_with_library(client, tmp_path, metric):
    """rebalance=False makes the structure a function of the updates alone, so every search
    parameter must give bit-identical results on both sides."""
    cfg = dict(CONFIG, rebalance=False)
    x = data(2000, seed=1)
    q = data(40, seed=2)
    col = client.create_collection(f"congruent-{metric}", dim=DIM, metric=metric, **cfg)
    idx = vindex.Index.create(tmp_path / "local", dim=DIM, metric=metric, **cfg)
    try:
        assert (col.dim, col.metric) == (idx.dim, idx.metric)
        assert col.config == dataclasses.asdict(idx.config)
        _apply_same_updates(col, idx, x, seed=3)
        assert len(col) == len(idx) == 1600
        for params in [{}, dict(max_postings=2), dict(max_postings=3, eps=0.2), dict(max_postings=2, ef=4), EXACT]:
            _same_result(col.search(q, 10, **params), idx.search(q, 10, **params))
        _same_result(col.search(q[0], 1), idx.search(q[0], 1))  # one (dim,) query
        if metric != "ip":  # the target reaches the server (its calibration is the server's own)
            low, high = (col.search(q, 10, recall_target=t).stats["records_scanned"] for t in (0.2, 0.99))
            assert 0 < low < high
        _same_result(col.search(q[:0], 5), idx.search(q[:0], 5))  # no queries
        _same_result(col.search(q[:3], MAX_K, **EXACT), idx.search(q[:3], MAX_K, **EXACT))
        probe = np.arange(0, 2100, 7)  # live, deleted and never-stored ids
        (xr, fr), (xl, fl) = col.get(probe), idx.get(probe)
        np.testing.assert_array_equal(fr, fl)
        np.testing.assert_array_equal(xr, xl)
        assert xr.dtype == xl.dtype == np.float32
        remote, local = col.stats(), idx.stats()
        for key in ("live", "tombstones", "heads", "postings", "posting_entries", "posting_limit", "log_seq"):
            assert remote[key] == local[key], key
        assert remote["heads"] >= 8, remote["heads"]  # several postings (measured: 19-24)
    finally:
        idx.close()


def test_congruent_with_rebalancing(client, tmp_path):
    """With background rebalancing the postings depend on timing, but a search that visits
    every posting is exact: both sides equal each other and the brute-force oracle."""
    x = data(2000, seed=4)
    q = data(30, seed=5)
    col = client.create_collection("congruent-rebalanced", dim=DIM, **CONFIG)
    idx = vindex.Index.create(tmp_path / "local", dim=DIM, **CONFIG)
    try:
        _apply_same_updates(col, idx, x, seed=6)
        assert col.wait_idle(60) and idx.wait_idle(60)
        remote = col.search(q, 10, **EXACT)
        _same_result(remote, idx.search(q, 10, **EXACT), work=False)  # postings differ by timing
        live_ids = np.flatnonzero(idx.get(np.arange(2000))[1])
        live_x = idx.get(live_ids)[0]
        truth, _ = brute_force(live_x, q, 10)
        np.testing.assert_array_equal(remote.ids, live_ids[truth])
        stats = col.stats()
        # the background really moved things (measured: 47 splits, 113 heads)
        assert stats["splits"] > 0 and stats["heads"] > 20, (stats["splits"], stats["heads"])
    finally:
        idx.close()


def test_padding_and_empty_collection(client, tmp_path):
    col = client.create_collection("tiny", dim=4)
    with vindex.Index.create(tmp_path / "tiny", dim=4) as idx:
        q = data(2, seed=7, dim=4)
        _same_result(col.search(q, 3), idx.search(q, 3))  # empty: all padding
        x = data(2, seed=8, dim=4)
        col.upsert([10, 11], x)
        idx.upsert([10, 11], x)
        remote = col.search(q, 5)
        _same_result(remote, idx.search(q, 5))
        assert (remote.ids[:, 2:] == -1).all() and np.isinf(remote.distances[:, 2:]).all()
        col.upsert([], np.zeros((0, 4), np.float32))  # empty batches are no-ops on both sides
        idx.upsert([], np.zeros((0, 4), np.float32))
        assert col.delete([]) == idx.delete([]) == 0
        assert len(col) == len(idx) == 2


def test_collection_management(client):
    assert client.create_collection("managed", dim=8, metric="cosine", max_postings=7).config["max_postings"] == 7
    again = client.create_collection("managed", dim=8, metric="cosine", exist_ok=True)
    assert (again.metric, again.config["max_postings"]) == ("cosine", 7)
    assert "managed" in client.list_collections()
    col = client.collection("managed")
    col.upsert([1, 2], data(2, seed=9, dim=8))
    col.checkpoint()
    assert len(col) == 2 and col.wait_idle(30) is True
    assert client.drop_collection("managed") is True
    assert client.drop_collection("managed") is False
    assert "managed" not in client.list_collections()
    with pytest.raises(CollectionNotFoundError):
        col.search(np.zeros(8), 1)  # a handle to a dropped collection
    with pytest.raises(CollectionNotFoundError):
        client.collection("managed")
    assert len(client.create_collection("managed", dim=8)) == 0  # the name is free again, empty


def test_upsert_stream_and_many(client):
    col = client.create_collection("streamed", dim=DIM, **CONFIG)
    x = data(MAX_ROWS + 500, seed=10)
    # one stream carries more rows than one request may
    assert col.upsert_many(np.arange(x.shape[0]), x, chunk=2000) == x.shape[0]
    assert len(col) == x.shape[0]
    acks = list(col.upsert_stream([(np.arange(3), x[:3]), (np.arange(3, 10), x[3:10])]))
    assert [(a.chunk, a.upserted, a.total) for a in acks] == [(0, 3, 3), (1, 7, 10)]
    got, found = col.get(np.arange(0, x.shape[0], 97))
    assert found.all()
    np.testing.assert_array_equal(got, x[::97])
    # a bad batch raises the library's exception; the batches before it were acknowledged
    acked = []
    with pytest.raises(vindex.DimensionError, match="expected dimension 32, got 31"):
        for ack in col.upsert_stream([(np.array([10**6]), x[:1]), (np.array([10**6 + 1]), np.zeros((1, 31)))]):
            acked.append(ack.chunk)
    assert acked == [0]
    assert col.get([10**6, 10**6 + 1])[1].tolist() == [True, False]
    with pytest.raises(vindex.NonFiniteError):
        list(col.upsert_stream([(np.array([7]), np.full((1, DIM), np.nan))]))


# --- error paths: raw stubs hit the server's own validation -----------------------------------
@pytest.fixture(scope="module")
def err_col(client):
    col = client.create_collection("errors", dim=DIM, **CONFIG)
    col.upsert(np.arange(100), data(100, seed=11))
    return col


def _fails(call, request, code, error=None, timeout=30.0):
    with pytest.raises(grpc.RpcError) as ei:
        call(request, timeout=timeout)
    err = ei.value
    assert err.code() == code, (err.code(), err.details())
    if error is not None:
        assert dict(err.trailing_metadata() or ()).get(ERROR_KEY) == error, err.trailing_metadata()
    return err


def _unchanged(stub, name="errors", count=100):
    assert stub.DescribeCollection(pb.DescribeCollectionRequest(name=name), timeout=10).count == count


INVALID = grpc.StatusCode.INVALID_ARGUMENT
ROW = f32(np.ones((1, DIM)))
NAN_ROW = f32(np.full((1, DIM), np.nan))
INF_ROW = f32(np.r_[np.zeros(DIM - 1), np.inf][None])


@pytest.mark.parametrize("request_,error", [
    (dict(ids=[500], vectors=f32(np.ones((1, 16))), dim=16), "DimensionError"),
    (dict(ids=[500], vectors=ROW + b"\0\0\0\0", dim=DIM), "DimensionError"),  # not whole rows
    (dict(ids=[500], vectors=ROW, dim=0), "DimensionError"),
    (dict(ids=[500], vectors=NAN_ROW, dim=DIM), "NonFiniteError"),
    (dict(ids=[500], vectors=INF_ROW, dim=DIM), "NonFiniteError"),
    (dict(ids=[500, 501], vectors=ROW * 3, dim=DIM), "LengthMismatchError"),
    (dict(ids=[500], vectors=b"", dim=DIM), "LengthMismatchError"),
    (dict(ids=[500, 501, 500], vectors=ROW * 3, dim=DIM), "DuplicateIdError"),
    (dict(ids=[2**63], vectors=ROW, dim=DIM), "InvalidIdError"),
    (dict(ids=[500, 2**64 - 1], vectors=ROW * 2, dim=DIM), "InvalidIdError"),
    (dict(ids=[500], vectors=ROW, dim=DIM, add_only=True, collection="errors/../errors"), "InvalidInputError"),
    (dict(ids=[500], vectors=ROW, dim=DIM, add_only=True, collection="nope"), "CollectionNotFoundError"),
], ids=["dim", "partial-row", "dim0", "nan", "inf", "length", "no-vectors", "dup", "2^63", "2^64-1", "bad-name",
        "unknown-collection"])
def test_upsert_invalid(stub, err_col, request_, error):
    req = pb.UpsertRequest(**{"collection": "errors", **request_})
    code = grpc.StatusCode.NOT_FOUND if error == "CollectionNotFoundError" else INVALID
    _fails(stub.Upsert, req, code, error)
    _unchanged(stub)


@pytest.mark.parametrize("request_,error", [
    (dict(queries=f32(np.ones((1, 16))), dim=16, k=5), "DimensionError"),
    (dict(queries=ROW[:-4], dim=DIM, k=5), "DimensionError"),
    (dict(queries=ROW, dim=0, k=5), "DimensionError"),
    (dict(queries=NAN_ROW, dim=DIM, k=5), "NonFiniteError"),
    (dict(queries=ROW + INF_ROW, dim=DIM, k=5), "NonFiniteError"),
    (dict(queries=ROW, dim=DIM, k=0), "InvalidKError"),
    (dict(queries=ROW, dim=DIM, k=MAX_K + 1), "InvalidKError"),
    (dict(queries=ROW, dim=DIM, k=5, max_postings=4097), "InvalidKError"),
    (dict(queries=ROW, dim=DIM, k=5, ef=65537), "InvalidKError"),
    (dict(queries=ROW, dim=DIM, k=5, eps=-1.0), "InvalidKError"),
    (dict(queries=ROW, dim=DIM, k=5, eps=float("nan")), "InvalidKError"),
    (dict(queries=ROW, dim=DIM, k=5, threads=3), "InvalidKError"),  # over --max-search-threads
    (dict(queries=ROW, dim=DIM, k=5, recall_target=1.5), "InvalidKError"),
], ids=["dim", "partial-row", "dim0", "nan", "inf", "k0", "k-over-max", "max_postings", "ef", "eps<0", "eps-nan",
        "threads-over-cap", "recall_target"])
def test_search_invalid(stub, err_col, request_, error):
    _fails(stub.Search, pb.SearchRequest(collection="errors", **request_), INVALID, error)


def test_search_threads_through_the_client(client, err_col):
    """``threads`` reaches the server: a batch searched on two threads finds what one finds;
    the client refuses a bad value before sending, the server one above its cap by name."""
    queries = data(40, seed=12)
    one = err_col.search(queries, 5, threads=1)
    two = err_col.search(queries, 5, threads=2)
    np.testing.assert_array_equal(one.ids, two.ids)
    np.testing.assert_array_equal(one.distances, two.distances)
    with pytest.raises(vindex.InvalidKError, match="threads"):
        err_col.search(queries, 5, threads=0)
    with pytest.raises(vindex.InvalidKError, match="max-search-threads"):
        err_col.search(queries, 5, threads=3)


def f64(rows: np.ndarray) -> bytes:
    return np.ascontiguousarray(rows, dtype="<f8").tobytes()


def test_vector_bytes_must_match_the_row_count(stub, err_col):
    """float64 bytes would otherwise read as twice the rows: the length must be exactly
    rows x dim x 4, the rows being len(ids) for an upsert and nq (when set) for a search."""
    err = _fails(stub.Upsert, pb.UpsertRequest(collection="errors", ids=[500, 501], vectors=f64(np.ones((2, DIM))),
                                               dim=DIM), INVALID, "LengthMismatchError")
    assert f"vectors: 512 bytes for 2 ids of dimension {DIM}" in err.details() and "float64" in err.details()
    x = f64(np.ones((1, DIM)))  # 2 rows' worth of bytes
    err = _fails(stub.Search, pb.SearchRequest(collection="errors", queries=x, dim=DIM, nq=1, k=5), INVALID,
                 "LengthMismatchError")
    assert f"queries: 256 bytes for nq 1 of dimension {DIM}" in err.details() and "float64" in err.details()
    _fails(stub.Search, pb.SearchRequest(collection="errors", queries=ROW * 3, dim=DIM, nq=2, k=5), INVALID,
           "LengthMismatchError")
    for nq in (0, 3):  # nq left out: as many queries as whole rows (older clients)
        res = stub.Search(pb.SearchRequest(collection="errors", queries=ROW * 3, dim=DIM, nq=nq, k=5), timeout=30)
        assert res.nq == 3
    _unchanged(stub)


def test_repeated_float_vectors(stub, client):
    """``float_vectors`` / ``float_queries`` (repeated float) work as the bytes fields do."""
    x = data(20, seed=21)
    col = client.create_collection("floats", dim=DIM, **CONFIG)
    try:
        up = pb.UpsertRequest(collection="floats", ids=list(range(20)), float_vectors=x.ravel().tolist(), dim=DIM)
        assert stub.Upsert(up, timeout=30).upserted == 20
        got, found = col.get(np.arange(20))
        assert found.all() and np.array_equal(got, x)
        for nq in (0, 3):
            req = pb.SearchRequest(collection="floats", float_queries=x[:3].ravel().tolist(), dim=DIM, nq=nq, k=4,
                                   **EXACT)
            res = stub.Search(req, timeout=30)
            assert res.nq == 3 and list(res.ids) == col.search(x[:3], k=4, **EXACT).ids.ravel().tolist()
        floats = x[:2].ravel().tolist()
        err = _fails(stub.Upsert, pb.UpsertRequest(collection="floats", ids=[1], float_vectors=floats, dim=DIM),
                     INVALID, "LengthMismatchError")
        assert f"float_vectors: {2 * DIM} floats for 1 id" in err.details()
        _fails(stub.Upsert, pb.UpsertRequest(collection="floats", ids=[1], float_vectors=floats[:-1], dim=DIM),
               INVALID, "DimensionError")
        _fails(stub.Search, pb.SearchRequest(collection="floats", float_queries=floats, dim=DIM, nq=1, k=1),
               INVALID, "LengthMismatchError")
        err = _fails(stub.Upsert, pb.UpsertRequest(collection="floats", ids=[1], vectors=f32(x[:1]),
                                                   float_vectors=x[0].tolist(), dim=DIM), INVALID, "InvalidInputError")
        assert "vectors and float_vectors: set one of them, not both" in err.details()
        err = _fails(stub.Search, pb.SearchRequest(collection="floats", queries=f32(x[:1]), float_queries=x[0].tolist(),
                                                   dim=DIM, k=1), INVALID, "InvalidInputError")
        assert "queries and float_queries: set one of them, not both" in err.details()
        assert len(col) == 20
    finally:
        client.drop_collection("floats")


def test_ids_invalid(stub, err_col):
    for call, req in [(stub.Delete, pb.DeleteRequest), (stub.Get, pb.GetRequest)]:
        _fails(call, req(collection="errors", ids=[1, 2**63 + 5]), INVALID, "InvalidIdError")
        _fails(call, req(collection="errors", ids=[1, 2, 1]), INVALID, "DuplicateIdError")
    _unchanged(stub)


def test_add_existing_ids(stub, client, err_col):
    err = _fails(stub.Upsert, pb.UpsertRequest(collection="errors", ids=[99, 100, 5], vectors=ROW * 3, dim=DIM,
                                               add_only=True), grpc.StatusCode.ALREADY_EXISTS, "IdExistsError")
    assert dict(err.trailing_metadata())[IDS_KEY] == "5,99"
    _unchanged(stub)  # nothing written, not even id 100
    with pytest.raises(vindex.IdExistsError, match=r"already in the index: \[5, 99\]") as ei:
        err_col.add([99, 100, 5], np.ones((3, DIM)))
    assert ei.value.ids == [5, 99] and isinstance(ei.value, vindex.DuplicateIdError)


def test_add_many_existing_ids_keeps_its_status(client):
    """Thousands of long ids must not push the trailers over gRPC's 8 KiB metadata limit (the
    call then failed with RESOURCE_EXHAUSTED and lost the exception)."""
    col = client.create_collection("big-ids", dim=4)
    ids = np.arange(10**18, 10**18 + 3000)
    x = data(3000, seed=12, dim=4)
    col.upsert(ids, x)
    with pytest.raises(vindex.IdExistsError, match="already in the index: \\[1000000000000000000, ") as ei:
        col.add(ids, x)
    assert ei.value.ids == ids[:204].tolist()  # the first ids that fit in 4096 characters


@pytest.mark.parametrize("method,request_", [
    ("Upsert", pb.UpsertRequest(collection="nope", ids=[1], vectors=ROW, dim=DIM)),
    ("Delete", pb.DeleteRequest(collection="nope", ids=[1])),
    ("Get", pb.GetRequest(collection="nope", ids=[1])),
    ("Search", pb.SearchRequest(collection="nope", queries=ROW, dim=DIM, k=1)),
    ("Stats", pb.StatsRequest(collection="nope")),
    ("Flush", pb.FlushRequest(collection="nope", wait_idle=True)),
    ("DescribeCollection", pb.DescribeCollectionRequest(name="nope")),
])
def test_unknown_collection(stub, method, request_):
    err = _fails(getattr(stub, method), request_, grpc.StatusCode.NOT_FOUND, "CollectionNotFoundError")
    assert len(err.details()) <= 1024


def test_a_long_collection_name_is_not_echoed_in_full(stub):
    err = _fails(stub.Stats, pb.StatsRequest(collection="x" * 20_000), INVALID, "InvalidInputError")
    assert "(20000 characters)" in err.details() and len(err.details()) <= 1024


def test_unknown_collection_in_stream(stub):
    reqs = iter([pb.UpsertRequest(collection="nope", ids=[1], vectors=ROW, dim=DIM)])
    with pytest.raises(grpc.RpcError) as ei:
        list(stub.UpsertStream(reqs, timeout=30))
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("request_,code,error", [
    (dict(name="errors", dim=DIM), grpc.StatusCode.ALREADY_EXISTS, "CollectionExistsError"),
    (dict(name="", dim=4), INVALID, "InvalidInputError"),
    (dict(name="a/b", dim=4), INVALID, "InvalidInputError"),
    (dict(name="..", dim=4), INVALID, "InvalidInputError"),
    (dict(name=".hidden", dim=4), INVALID, "InvalidInputError"),
    (dict(name="a b", dim=4), INVALID, "InvalidInputError"),
    (dict(name="x" * 65, dim=4), INVALID, "InvalidInputError"),
    (dict(name="y" * 20_000, dim=4), INVALID, "InvalidInputError"),
    (dict(name="new", dim=0), INVALID, "DimensionError"),
    (dict(name="new", dim=65537), INVALID, "DimensionError"),
    (dict(name="new", dim=4, metric="euclid"), INVALID, "InvalidConfigError"),
    (dict(name="new", dim=4, config_json="{"), INVALID, "InvalidConfigError"),
    (dict(name="new", dim=4, config_json="[1, 2]"), INVALID, "InvalidConfigError"),
    (dict(name="new", dim=4, config_json="[" + "1, " * 10_000 + "1]"), INVALID, "InvalidConfigError"),
    (dict(name="new", dim=4, config_json='{"dim": 4}'), INVALID, "InvalidConfigError"),
    (dict(name="new", dim=4, config_json='{"no_such_field": 1}'), INVALID, "InvalidConfigError"),
    (dict(name="new", dim=4, config_json='{"posting_limit_bytes": 10}'), INVALID, "InvalidConfigError"),
    (dict(name="new", dim=4, config_json='{"max_postings": "many"}'), INVALID, "InvalidConfigError"),
    (dict(name="new", dim=4, config_json='{"store": "memory"}'), INVALID, "InvalidConfigError"),
    (dict(name="errors", dim=DIM + 1, if_not_exists=True), grpc.StatusCode.ALREADY_EXISTS, "CollectionExistsError"),
    (dict(name="errors", dim=DIM, metric="ip", if_not_exists=True), grpc.StatusCode.ALREADY_EXISTS,
     "CollectionExistsError"),
], ids=["exists", "empty", "slash", "dotdot", "dot", "space", "65-chars", "20k-chars", "dim0", "dim-big",
        "metric", "json", "json-list", "json-long", "json-dim", "json-field", "json-range", "json-type",
        "memory-store", "exists-other-dim", "exists-other-metric"])
def test_create_invalid(stub, err_col, request_, code, error):
    err = _fails(stub.CreateCollection, pb.CreateCollectionRequest(**request_), code, error)
    assert len(err.details()) <= 1024
    names = [c.name for c in stub.ListCollections(pb.ListCollectionsRequest(), timeout=10).collections]
    assert "new" not in names
    _unchanged(stub)


def test_over_limits_resource_exhausted(stub, err_col):
    over = MAX_ROWS + 1
    ids = list(range(1000, 1000 + over))
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    _fails(stub.Upsert, pb.UpsertRequest(collection="errors", ids=ids, vectors=ROW * over, dim=DIM),
           exhausted, "RequestTooLargeError")
    _fails(stub.Upsert, pb.UpsertRequest(collection="errors", ids=[1], vectors=ROW * over, dim=DIM),
           exhausted, "RequestTooLargeError")
    _fails(stub.Delete, pb.DeleteRequest(collection="errors", ids=ids), exhausted, "RequestTooLargeError")
    _fails(stub.Get, pb.GetRequest(collection="errors", ids=ids), exhausted, "RequestTooLargeError")
    _fails(stub.Search, pb.SearchRequest(collection="errors", queries=ROW * (MAX_QUERIES + 1), dim=DIM, k=1),
           exhausted, "RequestTooLargeError")
    _fails(stub.Search, pb.SearchRequest(collection="errors", queries=ROW * (MAX_RESULTS // MAX_K + 1), dim=DIM,
                                         k=MAX_K), exhausted, "RequestTooLargeError")
    # a message over 64 MiB never reaches the servicer
    err = _fails(stub.Upsert, pb.UpsertRequest(collection="errors", ids=[1], vectors=bytes(64 * 2**20 + 4 * DIM),
                                               dim=DIM), exhausted)
    assert "larger than max" in err.details()
    _unchanged(stub)


def test_get_beyond_the_response_limit(stub, client):
    """4500 rows of dimension 4096 would be a 74 MB response: refused before any work."""
    client.create_collection("wide", dim=4096)
    try:
        err = _fails(stub.Get, pb.GetRequest(collection="wide", ids=list(range(4500))),
                     grpc.StatusCode.RESOURCE_EXHAUSTED, "RequestTooLargeError")
        assert "at most 4032 per request" in err.details()
        assert client.collection("wide").get(np.arange(4032))[1].sum() == 0  # just under the limit: answered
    finally:
        client.drop_collection("wide")


def test_over_limits_through_client(client, err_col):
    with pytest.raises(RequestTooLargeError):
        err_col.upsert(np.arange(1000, 1001 + MAX_ROWS), np.zeros((MAX_ROWS + 1, DIM)))
    with pytest.raises(vindex.InvalidKError, match=f"1..{MAX_K}"):
        err_col.search(np.zeros(DIM), MAX_K + 1)  # the library allows it; this server does not
    with pytest.raises(ServiceError) as ei:  # the client refuses to send over 64 MiB
        err_col.upsert(np.arange(530_000), np.zeros((530_000, DIM), np.float32))
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(err_col) == 100


# a timeout of exactly 0 is a race in grpc (measured: 174 of 300 such calls succeeded)
@pytest.mark.parametrize("timeout", [-0.001, -1.0])
def test_expired_deadline(stub, client, err_col, timeout):
    _fails(stub.Search, pb.SearchRequest(collection="errors", queries=ROW, dim=DIM, k=1),
           grpc.StatusCode.DEADLINE_EXCEEDED, timeout=timeout)
    with vindex.Client(client.target, timeout=timeout) as hurried:
        with pytest.raises(ServiceError) as ei:
            hurried.list_collections()
    assert ei.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


# --- the client raises what the embedded library raises ---------------------------------------
CASES = {
    "query-dim": lambda t: t.search(np.zeros((2, DIM - 1)), 5),
    "query-nan": lambda t: t.search(np.full(DIM, np.nan), 5),
    "query-overflow": lambda t: t.search(np.full(DIM, 1e39), 5),
    "query-strings": lambda t: t.search([["a"] * DIM], 5),
    "k0": lambda t: t.search(np.zeros(DIM), 0),
    "k-float": lambda t: t.search(np.zeros(DIM), 1.5),
    "max_postings": lambda t: t.search(np.zeros(DIM), 5, max_postings=0),
    "eps": lambda t: t.search(np.zeros(DIM), 5, eps=-1.0),
    "eps-str": lambda t: t.search(np.zeros(DIM), 5, eps="wide"),
    "ef": lambda t: t.search(np.zeros(DIM), 5, ef=0),
    "vector-dim": lambda t: t.upsert([1000, 1001], np.zeros((2, 8))),
    "vector-nan": lambda t: t.upsert([1000], np.full((1, DIM), np.nan)),
    "float-ids": lambda t: t.upsert([1000.5], np.zeros((1, DIM))),
    "negative-ids": lambda t: t.add([-4, 1000], np.zeros((2, DIM))),
    "dup-ids": lambda t: t.upsert([1000, 1001, 1000], np.zeros((3, DIM))),
    "length": lambda t: t.upsert([1000, 1001], np.zeros((3, DIM))),
    "2^63": lambda t: t.upsert(np.array([2**63], np.uint64), np.zeros((1, DIM))),
    "exists": lambda t: t.add([7, 1000, 3], np.zeros((3, DIM))),
    "get-dup": lambda t: t.get([1, 1]),
    "delete-2d": lambda t: t.delete([[1, 2]]),
}


@pytest.fixture(scope="module")
def twins(client, err_col, tmp_path_factory):
    """The shared error collection and an embedded index holding the same 100 vectors."""
    idx = vindex.Index.create(tmp_path_factory.mktemp("twin") / "i", dim=DIM, **CONFIG)
    idx.upsert(np.arange(100), data(100, seed=11))
    yield err_col, idx
    idx.close()


@pytest.mark.parametrize("case", list(CASES))
def test_client_raises_library_exceptions(twins, case):
    col, idx = twins
    with pytest.raises(vindex.VindexError) as local:
        CASES[case](idx)
    with pytest.raises(type(local.value)) as remote:
        CASES[case](col)
    assert type(remote.value) is type(local.value)
    assert str(remote.value) == str(local.value)
    assert getattr(remote.value, "ids", None) == getattr(local.value, "ids", None)
    assert len(col) == len(idx) == 100


def test_client_raises_library_exceptions_from_server(client, tmp_path):
    """Errors only the server can detect come back as the library's classes."""
    col = client.create_collection("cosine-errors", dim=4, metric="cosine")
    with vindex.Index.create(tmp_path / "c", dim=4, metric="cosine") as idx:
        for target in (col, idx):
            with pytest.raises(vindex.InvalidInputError, match=r"non-zero vectors, got zero vectors in rows \[1\]"):
                target.upsert([1, 2], np.array([[1.0, 0, 0, 0], [0, 0, 0, 0]]))
    with pytest.raises(CollectionExistsError) as ei:
        client.create_collection("cosine-errors", dim=4)
    assert isinstance(ei.value, vindex.IndexExistsError)
    with pytest.raises(CollectionNotFoundError) as ei:
        client.collection("no-such-collection")
    assert isinstance(ei.value, vindex.IndexNotFoundError) and isinstance(ei.value, FileNotFoundError)
    with pytest.raises(vindex.InvalidConfigError, match="unknown config parameter"):
        client.create_collection("bad-config", dim=4, no_such_field=3)
    with pytest.raises(vindex.InvalidConfigError, match="metric"):
        client.create_collection("bad-config", dim=4, metric="hamming")
    with pytest.raises(vindex.InvalidInputError, match="collection name"):
        client.create_collection("bad/name", dim=4)
    with pytest.raises(vindex.DimensionError):
        client.create_collection("bad-dim", dim=0)
    assert not {"bad-config", "bad/name", "bad-dim"} & set(client.list_collections())


# --- concurrent clients --------------------------------------------------------------------------
def test_concurrent_clients(server, client):
    """Searchers, a replacer and a deleter on their own channels at once: no search started
    after an acknowledged delete returns the id, no result holds an id twice, and every
    replacement is visible once acknowledged."""
    x = data(2000, seed=13)
    col = client.create_collection("concurrent", dim=DIM, **CONFIG)
    col.upsert(np.arange(2000), x)
    lock = threading.Lock()
    deleted: set[int] = set()
    failures: list[str] = []
    writers_done = threading.Event()
    searches = [0]

    def deleter():
        with vindex.Client(server.target, timeout=60) as c:
            me = c.collection("concurrent")
            for lo in range(1000, 2000, 50):
                ids = np.arange(lo, lo + 50)
                assert me.delete(ids) == 50
                with lock:
                    deleted.update(ids.tolist())

    def replacer():
        with vindex.Client(server.target, timeout=60) as c:
            me = c.collection("concurrent")
            for lo in range(0, 1000, 100):
                ids = np.arange(lo, lo + 100)
                new = x[ids] + 100.0  # far from every original vector
                me.upsert(ids, new)
                got, found = me.get(ids)
                if not found.all() or not np.array_equal(got, new):
                    failures.append(f"replacement of {lo}..{lo + 99} not visible after its acknowledgement")
                hit = me.search(new[:5], 1, **EXACT)
                if hit.ids[:, 0].tolist() != ids[:5].tolist():
                    failures.append(f"replaced vectors not found: {hit.ids[:, 0]} vs {ids[:5]}")

    def searcher(seed):
        rng = np.random.default_rng(seed)
        with vindex.Client(server.target, timeout=60) as c:
            me = c.collection("concurrent")
            n = 0
            while not writers_done.is_set() or n < 5:
                with lock:
                    gone = set(deleted)
                q = x[rng.integers(1000, 2000, 8)]
                res = me.search(q, 20, **(EXACT if n % 2 else {}))
                for row in res.ids:
                    row = row[row >= 0]
                    if len(set(row.tolist())) != row.size:
                        failures.append(f"duplicate ids in one result: {row}")
                    if gone & set(row.tolist()):
                        failures.append(f"acknowledged deletes returned: {sorted(gone & set(row.tolist()))}")
                n += 1
            with lock:
                searches[0] += n

    def guard(fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # surfaced below
            failures.append(f"{fn.__name__}: {type(e).__name__}: {e}")

    writers = [threading.Thread(target=guard, args=(f,)) for f in (deleter, replacer)]
    readers = [threading.Thread(target=guard, args=(searcher, s)) for s in range(3)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join(120)
    writers_done.set()
    for t in readers:
        t.join(120)
    assert not failures, failures[:5]
    assert searches[0] >= 15  # at least 5 per searcher (measured: 100 in all)
    assert len(col) == 1000
    res = col.search(x[1000:1100], 10, **EXACT)
    assert not set(res.ids.ravel().tolist()) & set(range(1000, 2000))


# --- restarts ------------------------------------------------------------------------------------
#: 1500 stored, minus ids 0 mod 5 below 1200 (240), plus the 20 of them re-upserted below
#: 100, minus ids 1 mod 5 below 1200 (240).
LIVE_AFTER = 1500 - 240 + 20 - 240


def _same_after_restart(remote, local):
    """Equal ids, distances and postings visited. A clean close saves the copies waiting to
    be cut and the reopened index queues them again, so the background may have cut some by
    the time of the search: as many records scanned or fewer, never more."""
    _same_result(remote, local, work=False)
    assert remote.stats["postings"] == local.stats["postings"]
    assert remote.stats["records_scanned"] <= local.stats["records_scanned"]


def test_restart_keeps_data(tmp_path):
    x = data(1500, seed=14)
    q = data(20, seed=15)
    srv = ServerProcess(tmp_path / "data")
    try:
        with vindex.Client(srv.target, timeout=60) as c:
            col = c.create_collection("kept", dim=DIM, metric="cosine", **CONFIG)
            col.upsert_many(np.arange(1200), x[:1200], chunk=400)
            col.delete(np.arange(0, 1200, 5))
            assert col.wait_idle(60)
            before = (col.search(q, 10, **EXACT), col.search(q, 10), col.get(np.arange(1200)), col.config, len(col))
        stopped_cleanly(srv)

        srv = ServerProcess(tmp_path / "data")
        assert srv.lines[-1].startswith("vindex: serving 1 collection(s) ['kept']")
        with vindex.Client(srv.target, timeout=60) as c:
            col = c.collection("kept")
            assert (col.metric, col.config, len(col)) == ("cosine", before[3], before[4])
            _same_after_restart(col.search(q, 10, **EXACT), before[0])
            _same_after_restart(col.search(q, 10), before[1])
            (xa, fa), (xb, fb) = col.get(np.arange(1200)), before[2]
            np.testing.assert_array_equal(fa, fb)
            np.testing.assert_array_equal(xa, xb)
            # acknowledged writes survive kill -9 (no checkpoint, no clean close)
            col.upsert(np.arange(1200, 1500), x[1200:])
            col.upsert(np.arange(0, 100), x[:100] * 2.0)
            col.delete(np.arange(1, 1200, 5))
            expect_x, expect_found = col.get(np.arange(1500))
            assert expect_found.sum() == LIVE_AFTER
        assert srv.stop(signal.SIGKILL) == -signal.SIGKILL

        srv = ServerProcess(tmp_path / "data")
        with vindex.Client(srv.target, timeout=60) as c:
            col = c.collection("kept")
            got, found = col.get(np.arange(1500))
            np.testing.assert_array_equal(found, expect_found)
            np.testing.assert_array_equal(got, expect_x)
            live = np.flatnonzero(found)
            res = col.search(q, 10, **EXACT)
            truth, _ = brute_force(got[live], q, 10, metric="cosine")
            np.testing.assert_array_equal(res.ids, live[truth])
            # the data directory is locked: a second server refuses it instead of sharing it
            second = subprocess.run([sys.executable, "-m", "vindex.service.cli", "serve", "--data", str(tmp_path / "data"),
                                     "--port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert second.returncode == 2, (second.stdout, second.stderr)
            assert "IndexLockedError" in second.stderr and "in use by another vindex server" in second.stderr
            assert len(col) == LIVE_AFTER
        stopped_cleanly(srv)
    finally:
        if srv.proc.poll() is None:
            srv.stop()


# --- health, draining, admission control (in-process, with blocking hooks) -------------------
class Gate:
    """Blocks the calls it wraps until opened; ``entered`` tells that one is waiting."""

    def __init__(self):
        self.entered, self.opened = threading.Event(), threading.Event()

    def wrap(self, fn):
        def blocked(*args, **kwargs):
            self.entered.set()
            assert self.opened.wait(60)
            return fn(*args, **kwargs)
        return blocked


def test_health_before_and_after_ready(tmp_path):
    with vindex.Index.create(tmp_path / "data" / "collections" / "pre", dim=4) as idx:
        idx.upsert([1], np.ones((1, 4)))
    gate = Gate()
    srv = InProcessServer(tmp_path / "data",
                          prepare=lambda s: setattr(s.collections, "open_all", gate.wrap(s.collections.open_all)))
    try:
        assert gate.entered.wait(60)  # listening, kernels warm, opening collections
        channel = grpc.insecure_channel(srv.target)
        assert health(channel) == NOT_SERVING
        assert health(channel, SERVICE) == NOT_SERVING
        with vindex.Client(srv.target, timeout=10) as c:
            with pytest.raises(ServiceError) as ei:
                c.list_collections()
            assert ei.value.code == grpc.StatusCode.UNAVAILABLE and "starting" in str(ei.value)
            with pytest.raises(TimeoutError, match="not SERVING"):
                c.wait_ready(timeout=0.3)
            gate.opened.set()
            c.wait_ready(timeout=60)
            assert srv.ready.wait(60)
            assert health(channel) == health(channel, SERVICE) == SERVING
            assert c.list_collections() == ["pre"] and len(c.collection("pre")) == 1
        channel.close()
    finally:
        gate.opened.set()
        srv.stop()


def test_drain_on_stop(tmp_path):
    """While a running call drains, health says NOT_SERVING and new calls get UNAVAILABLE;
    the running call completes, then the collections are closed and the directory unlocked."""
    gate = Gate()
    srv = InProcessServer(tmp_path / "data", grace_s=60)
    assert srv.ready.wait(60)
    channel = grpc.insecure_channel(srv.target)
    try:
        with vindex.Client(srv.target, timeout=60) as c:
            col = c.create_collection("drained", dim=4)
            col.upsert([1, 2], np.eye(4)[:2])
            with srv.server.collections.use("drained") as index:
                index.search = gate.wrap(index.search)  # blocks on the pool, collection pinned
            running = pb_grpc.VectorIndexStub(channel).Search.future(
                pb.SearchRequest(collection="drained", queries=f32(np.eye(4)[:1]), dim=4, k=2), timeout=60)
            assert gate.entered.wait(30)
            stopping = srv.begin_stop()
            wait_until(lambda: health(channel) == NOT_SERVING, "NOT_SERVING while draining", timeout=30)
            assert health(channel, SERVICE) == NOT_SERVING
            with pytest.raises(ServiceError) as ei:
                c.list_collections()
            assert ei.value.code == grpc.StatusCode.UNAVAILABLE and "shutting down" in str(ei.value)
            assert not stopping.done() and not running.done()
            gate.opened.set()
            assert list(running.result(30).ids) == [1, 2]  # the running call finished normally
            stopping.result(60)
    finally:
        gate.opened.set()
        channel.close()
        srv.stop()
    with vindex.Index.open(tmp_path / "data" / "collections" / "drained") as idx:  # closed, unlocked
        assert len(idx) == 2


def test_stop_while_starting(tmp_path):
    """SIGTERM during start-up: the collections being opened are still closed, and the server
    never reports SERVING."""
    with vindex.Index.create(tmp_path / "data" / "collections" / "early", dim=4) as idx:
        idx.upsert([1], np.ones((1, 4)))
    gate = Gate()
    srv = InProcessServer(tmp_path / "data",
                          prepare=lambda s: setattr(s.collections, "open_all", gate.wrap(s.collections.open_all)))
    try:
        assert gate.entered.wait(60)
        stopping = srv.begin_stop()
        channel = grpc.insecure_channel(srv.target)
        wait_until(lambda: srv.server.servicer.stopping, "stop() to begin", timeout=30)
        assert health(channel) == NOT_SERVING
        channel.close()
        gate.opened.set()
        stopping.result(60)
        srv.thread.join(60)
        assert not srv.ready.is_set()
    finally:
        gate.opened.set()
        srv.stop()
    with vindex.Index.open(tmp_path / "data" / "collections" / "early") as idx:
        assert len(idx) == 1


def test_drop_waits_for_running_calls(tmp_path):
    """A drop refuses new calls at once but closes the index only after the calls already
    running on it have finished."""
    gate = Gate()
    srv = InProcessServer(tmp_path / "data")
    assert srv.ready.wait(60)
    channel = grpc.insecure_channel(srv.target)
    try:
        stub = pb_grpc.VectorIndexStub(channel)
        stub.CreateCollection(pb.CreateCollectionRequest(name="dropme", dim=4), timeout=30)
        stub.Upsert(pb.UpsertRequest(collection="dropme", ids=[1, 2], vectors=f32(np.eye(4)[:2]), dim=4), timeout=30)
        with srv.server.collections.use("dropme") as index:
            index.search = gate.wrap(index.search)  # blocks with the collection pinned
        running = stub.Search.future(pb.SearchRequest(collection="dropme", queries=f32(np.eye(4)[:1]), dim=4, k=2),
                                     timeout=60)
        assert gate.entered.wait(30)
        dropping = stub.DropCollection.future(pb.DropCollectionRequest(name="dropme"), timeout=60)

        def refused() -> bool:
            try:
                stub.DescribeCollection(pb.DescribeCollectionRequest(name="dropme"), timeout=10)
                return False
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.NOT_FOUND
                return True

        wait_until(refused, "the drop to refuse new calls", timeout=30)
        assert not dropping.done() and not running.done()
        assert os.path.isdir(index.path)
        gate.opened.set()
        assert list(running.result(30).ids) == [1, 2]
        assert dropping.result(30).dropped is True
        assert not os.path.exists(index.path)
    finally:
        gate.opened.set()
        channel.close()
        srv.stop()


def test_concurrent_creates(tmp_path, monkeypatch):
    """Creates of one name racing a slow create: ``exist_ok`` ones get the collection, others
    ALREADY_EXISTS (they used to get FAILED_PRECONDITION "being dropped")."""
    gate = Gate()
    srv = InProcessServer(tmp_path / "data")
    assert srv.ready.wait(60)
    monkeypatch.setattr(vindex.Index, "create", gate.wrap(vindex.Index.create))
    outcomes: dict[str, object] = {}

    def create(label: str, exist_ok: bool) -> None:
        with vindex.Client(srv.target, timeout=60) as c:
            try:
                outcomes[label] = c.create_collection("same", dim=4, exist_ok=exist_ok, max_postings=5).config
            except Exception as e:
                outcomes[label] = e

    try:
        first = threading.Thread(target=create, args=("first", True))
        first.start()
        assert gate.entered.wait(30)
        others = [threading.Thread(target=create, args=(label, label == "exist_ok")) for label in ("exist_ok", "plain")]
        for t in others:
            t.start()
        wait_until(lambda: srv.server.servicer.active == 3 or not any(t.is_alive() for t in others),
                   "three creates running", timeout=30)
        gate.opened.set()
        for t in [first, *others]:
            t.join(60)
        assert outcomes["first"]["max_postings"] == 5 and outcomes["exist_ok"] == outcomes["first"]
        assert isinstance(outcomes["plain"], CollectionExistsError), outcomes["plain"]
    finally:
        gate.opened.set()
        srv.stop()


def test_admission_control(tmp_path):
    gate = Gate()
    srv = InProcessServer(tmp_path / "data", limits=Limits(max_concurrent_rpcs=1))
    assert srv.ready.wait(60)
    channel = grpc.insecure_channel(srv.target)
    try:
        stub = pb_grpc.VectorIndexStub(channel)
        stub.CreateCollection(pb.CreateCollectionRequest(name="busy", dim=4), timeout=30)
        srv.server.collections.use = gate.wrap(srv.server.collections.use)
        running = stub.Stats.future(pb.StatsRequest(collection="busy"), timeout=60)
        assert gate.entered.wait(30)
        _fails(stub.ListCollections, pb.ListCollectionsRequest(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        gate.opened.set()
        assert json.loads(running.result(30).stats_json)["live"] == 0
        stub.ListCollections(pb.ListCollectionsRequest(), timeout=30)  # admitted again
    finally:
        gate.opened.set()
        channel.close()
        srv.stop()


def test_a_full_disk_answers_resource_exhausted_and_writes_resume(tmp_path, monkeypatch, caplog):
    """Out of space is RESOURCE_EXHAUSTED (saying so, and that writes resume), other storage
    failures UNAVAILABLE; neither logs a traceback, and the next write after the cause is
    gone succeeds. A CreateCollection that runs out of space leaves no directory behind."""
    srv = InProcessServer(tmp_path / "data")
    assert srv.ready.wait(60)
    channel = grpc.insecure_channel(srv.target)
    try:
        stub = pb_grpc.VectorIndexStub(channel)
        with vindex.Client(srv.target, timeout=60) as c, caplog.at_level(logging.INFO, logger="vindex.service"):
            col = c.create_collection("full", dim=4)
            col.upsert([1], np.ones((1, 4)))
            with srv.server.collections.use("full") as index:
                faults = FaultyStore.install(index)
            faults.arm(commit_after=0, classes=(IOClass.UPDATE,))
            upsert = pb.UpsertRequest(collection="full", ids=[2], vectors=f32(np.ones((1, 4))), dim=4)
            err = _fails(stub.Upsert, upsert, grpc.StatusCode.RESOURCE_EXHAUSTED)
            assert "disk is full" in err.details() and "writes resume once space is freed" in err.details()
            with pytest.raises(vindex.StorageError) as raised:
                col.upsert([2], np.ones((1, 4)))
            assert raised.value.errno == errno.ENOSPC
            faults.arm(commit_after=0, classes=(IOClass.UPDATE,), err=errno.EIO)
            _fails(stub.Upsert, upsert, grpc.StatusCode.UNAVAILABLE)
            faults.clear()
            col.upsert([2], np.ones((1, 4)))
            assert len(col) == 2

            def no_space(*args, **kwargs):
                raise OSError(errno.ENOSPC, "No space left on device", "checkpoint/manifest.json")
            monkeypatch.setattr(vindex.checkpoint, "save", no_space)  # the new collection's first checkpoint
            err = _fails(stub.CreateCollection, pb.CreateCollectionRequest(name="new", dim=4),
                         grpc.StatusCode.RESOURCE_EXHAUSTED)
            assert "disk is full" in err.details()
            assert not os.path.exists(tmp_path / "data" / "collections" / "new")
            assert c.list_collections() == ["full"]
        assert not [r for r in caplog.records if "internal error" in r.getMessage() or r.exc_info]
    finally:
        channel.close()
        srv.stop()


# --- the command line ----------------------------------------------------------------------------
def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def write_fvecs(path, x: np.ndarray) -> None:
    n, d = x.shape
    rec = np.empty((n, d + 1), dtype="<f4")
    rec[:, 0] = np.array([d], dtype="<i4").view("<f4")[0]
    rec[:, 1:] = x
    rec.tofile(path)


def test_cli(server, client, tmp_path, capsys):
    s = ("--server", server.target)
    rc, out, _ = run_cli(capsys, "create", "cli", "--dim", str(DIM), "--set", "posting_limit_bytes=4096", *s)
    assert rc == 0 and "dim 32, metric l2, 0 vectors" in out
    assert client.collection("cli").config["posting_limit_bytes"] == 4096
    rc, _, err = run_cli(capsys, "create", "cli", "--dim", str(DIM), *s)
    assert rc == 2 and "CollectionExistsError" in err
    assert run_cli(capsys, "create", "cli", "--dim", str(DIM), "--exist-ok", *s)[0] == 0

    # .npy ingest, interrupted after 600 rows (--limit stands in for Ctrl-C), then resumed
    x = data(1000, seed=16)
    npy = str(tmp_path / "vectors.npy")
    np.save(npy, x)
    prog = progress_path(npy, "cli")
    assert prog == npy + ".cli.vindex-progress"
    rc, _, err = run_cli(capsys, "ingest", "cli", npy, "--batch", "256", "--limit", "600", "--quiet", *s)
    assert rc == 0 and "ingested rows 0..600" in err
    assert json.load(open(prog))["rows_done"] == 600
    col = client.collection("cli")
    assert len(col) == 600
    rc, _, err = run_cli(capsys, "ingest", "cli", npy, "--batch", "256", "--quiet", *s)
    assert rc == 0 and "resuming at row 600 of 1000" in err and "ingested rows 600..1000" in err
    assert json.load(open(prog))["rows_done"] == 1000 and len(col) == 1000
    assert col.wait_idle(60)
    seq = col.stats()["log_seq"]
    rc, _, err = run_cli(capsys, "ingest", "cli", npy, "--quiet", *s)  # nothing left to send
    assert rc == 0 and "ingested rows 1000..1000" in err
    assert col.stats()["log_seq"] == seq  # not one write
    rc, _, err = run_cli(capsys, "ingest", "cli", npy, "--batch", "500", "--restart", "--quiet", *s)
    assert rc == 0 and "resuming" not in err and "ingested rows 0..1000" in err
    assert col.stats()["log_seq"] > seq  # sent again (idempotent upserts)
    got, found = col.get(np.arange(1000))
    assert found.all()
    np.testing.assert_array_equal(got, x)

    # .fvecs ingest into a collection the command creates, with an id offset
    fv = str(tmp_path / "more.fvecs")
    y = data(300, seed=17, dim=16)
    write_fvecs(fv, y)
    rc, _, err = run_cli(capsys, "ingest", "cli16", fv, "--id-offset", "5000", "--metric", "ip", "--quiet", *s)
    assert rc == 0 and "created collection 'cli16' (dim 16, ip)" in err
    col16 = client.collection("cli16")
    assert (col16.metric, len(col16)) == ("ip", 300)
    np.testing.assert_array_equal(col16.get(np.arange(5000, 5300))[0], y)
    rc, _, err = run_cli(capsys, "ingest", "cli", fv, "--quiet", *s)  # wrong dimension for "cli"
    assert rc == 2 and "dimension 16" in err

    rc, out, _ = run_cli(capsys, "query", "cli", "--id", "5", "-k", "3", *s)
    assert rc == 0
    first = out.splitlines()[1].split()
    assert first[:3] == ["1", "id", "5"] and float(first[-1]) == 0.0
    assert run_cli(capsys, "query", "cli", "--id", "123456", *s)[0] == 1
    rc, out, _ = run_cli(capsys, "query", "cli", "--file", npy, "--rows", "3:5", "-k", "2", "--max-postings", "4", *s)
    assert rc == 0 and "row 3:" in out and "row 4:" in out and "(2 queries, k=2" in out
    rc, threaded, _ = run_cli(capsys, "query", "cli", "--file", npy, "--rows", "3:5", "-k", "2", "--max-postings", "4",
                              "--threads", "2", *s)
    assert rc == 0 and threaded.split("(")[0] == out.split("(")[0]  # the same results

    rc, out, _ = run_cli(capsys, "stats", "cli", *s)
    assert rc == 0 and json.loads(out)["live"] == 1000
    rc, out, _ = run_cli(capsys, "list", *s)
    assert rc == 0
    rows = {line.split("\t")[0]: line for line in out.splitlines()}
    assert rows["cli"] == "cli\tdim 32\tl2\t1000 vectors" and rows["cli16"] == "cli16\tdim 16\tip\t300 vectors"

    assert run_cli(capsys, "drop", "cli16", *s)[:2] == (0, "dropped 'cli16'\n")
    assert run_cli(capsys, "drop", "cli16", *s)[0] == 1
    rc, _, err = run_cli(capsys, "query", "cli16", "--id", "5000", *s)
    assert rc == 2 and "CollectionNotFoundError" in err


def test_cli_query_str_ids_filter_and_documents(server, client, capsys):
    """``vindex query`` takes a str id, a JSON filter, and prints each result's document."""
    s = ("--server", server.target)
    col = client.create_collection("cli-docs", dim=4, metric="cosine", id_type="str")
    col.upsert(["a", "b", "c"], np.eye(4)[:3] + 0.1, metadata=[{"t": "x"}, {"t": "y"}, {"t": "x"}],
               documents=["alpha text", "beta\ntext", "gamma"])
    rc, out, _ = run_cli(capsys, "query", "cli-docs", "--id", "a", "-k", "3", *s)
    assert rc == 0 and "id a " in out and "alpha text" in out and "beta text" in out  # one line each
    rc, out, _ = run_cli(capsys, "query", "cli-docs", "--id", "a", "--filter", '{"t": "y"}', *s)
    assert rc == 0 and "id b " in out and "id a " not in out and "id c " not in out
    rc, _, err = run_cli(capsys, "query", "cli-docs", "--id", "a", "--filter", "{t:", *s)
    assert rc == 2 and "--filter is not JSON" in err
    rc, _, err = run_cli(capsys, "query", "cli-docs", "--id", "a", "--filter", '{"t": {"$bad": 1}}', *s)
    assert rc == 2 and "FilterError" in err
    assert run_cli(capsys, "query", "cli-docs", "--id", "zz", *s)[0] == 1
    client.create_collection("cli-ints", dim=4).upsert([7], np.ones((1, 4)))
    rc, _, err = run_cli(capsys, "query", "cli-ints", "--id", "seven", *s)
    assert rc == 2 and "integer ids" in err


def test_wiki_sample_payload():
    """The wiki sample carries each row's title as its document and its topic as metadata."""
    from vindex.service.sample import load_npz, sample_payload

    data = load_npz("wiki")
    metadata, documents = sample_payload(data)
    assert len(metadata) == len(documents) == data["base"].shape[0]
    assert documents[0] == str(data["base_title"][0]) and isinstance(documents[0], str)
    assert metadata[0] == {"topic": str(data["topic_names"][data["base_topic"][0]]), "chunk": int(data["base_chunk"][0])}
    assert {m["topic"] for m in metadata} <= set(map(str, data["topic_names"]))
    assert sample_payload(load_npz("bigann")) == (None, None)


def test_cli_console_script(server, client):
    """The installed ``vindex`` script, and a clear error when no server answers."""
    client.create_collection("script", dim=3)
    exe = shutil.which("vindex", path=os.path.dirname(sys.executable))
    cmd = [exe] if exe else [sys.executable, "-m", "vindex.service.cli"]
    res = subprocess.run([*cmd, "list", "--server", server.target], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "script\tdim 3\tl2\t0 vectors" in res.stdout.splitlines()
    with refused_port() as port:  # a port nobody listens on
        res = subprocess.run([*cmd, "stats", "x", "--server", f"127.0.0.1:{port}", "--timeout", "5"],
                             capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "ServiceError: UNAVAILABLE" in res.stderr, res.stderr
    # a reader that goes away (``| head``) stops the command quietly
    proc = subprocess.Popen([*cmd, "list", "--server", server.target], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and not err, err.decode(errors="replace")


@contextlib.contextmanager
def refused_port():
    """A local port bound but not listening, so connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_concurrent_small_searches_are_coalesced(tmp_path):
    """Searches that queue while others run go to the index as one batch call, and each
    caller still gets exactly the result it would get alone."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(500, 8)).astype(np.float32)
    queries = rng.normal(size=(12, 8)).astype(np.float32)
    gate = Gate()
    srv = InProcessServer(tmp_path / "data")
    assert srv.ready.wait(60)
    channel = grpc.insecure_channel(srv.target)
    try:
        stub = pb_grpc.VectorIndexStub(channel)
        stub.CreateCollection(pb.CreateCollectionRequest(name="co", dim=8), timeout=30)
        stub.Upsert(pb.UpsertRequest(collection="co", ids=list(range(500)), vectors=f32(x), dim=8), timeout=30)
        with srv.server.collections.use("co") as index:
            expected = index.search(queries, 5)
            calls, interactive = [], []
            search = index.search

            def counted(q, *a, **kw):
                calls.append(q.shape[0])
                interactive.append(kw.get("interactive"))
                return search(q, *a, **kw)
            index.search = gate.wrap(counted)
        batcher = srv.server.servicer.batcher
        arrived = []
        submit = batcher.search

        async def counted_submit(*a, **kw):  # runs on the server's event loop
            arrived.append(1)
            return await submit(*a, **kw)
        batcher.search = counted_submit
        futures = [stub.Search.future(pb.SearchRequest(collection="co", queries=f32(q), dim=8, k=5), timeout=60)
                   for q in queries]
        assert gate.entered.wait(30)
        wait_until(lambda: len(arrived) == len(queries), "every search to reach the batcher", timeout=30)
        gate.opened.set()
        got = [f.result(30) for f in futures]
        for i, r in enumerate(got):
            assert list(r.ids) == expected.ids[i].tolist()
            np.testing.assert_array_equal(np.array(r.distances, np.float32), expected.distances[i])
        assert sum(calls) == len(queries)
        assert len(calls) < len(queries), calls  # measured: [1, 1, 10] on 2 cores (arrival timing decides)
        assert interactive == [True] * len(calls)  # writers yield to a coalesced batch at any size
    finally:
        gate.opened.set()
        channel.close()
        srv.stop()
