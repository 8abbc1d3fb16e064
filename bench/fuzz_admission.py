"""The fuzz harness's hostile-client modes (``python -m bench.fuzz --mode idle-streams|slow-client``).

One server (``vindex serve --host localhost``, default admission caps unless given) and two
peers of this machine: the hostile one (``127.0.0.1``) opens ``--streams`` UpsertStreams at once,
the normal one (``[::1]``) searches. Every ``CHECK_EVERY_S`` while the streams are open, the
hostile peer's own health check must answer SERVING and the normal client's Search must succeed.
The machine needs IPv6 loopback (``::1``) for the second peer.

* ``idle-streams``: the streams never send. Each must end, within the idle timeout plus a
  margin, either DEADLINE_EXCEEDED saying it was idle (it was admitted) or RESOURCE_EXHAUSTED
  naming the cap (it was not); afterwards the hostile peer is admitted again.
* ``slow-client``: each stream sends a one-row chunk every third of the idle timeout for
  ``--duration`` seconds, then closes. Streams within the caps must end OK with every chunk
  acknowledged and stored; the others must be refused RESOURCE_EXHAUSTED.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

SERVICE = "vindex.v1.VectorIndex"
COLLECTION = "hostile"
DIM = 4
CHECK_EVERY_S = 0.25
#: How long past the idle timeout an idle stream may take to be ended before it counts as a hang.
END_MARGIN_S = 10.0


def server_args(args: Any) -> list[str]:
    """``vindex serve`` arguments for a mode run."""
    out = ["--host", "localhost", "--stream-idle-timeout", str(args.idle_timeout)]
    if args.max_client_rpcs:
        out += ["--max-client-rpcs", str(args.max_client_rpcs)]
    return out


def run_mode(mode: str, port: int, args: Any) -> dict:
    """Run ``mode`` against the server on ``port``; the counts, checks and verdict."""
    return asyncio.run(_Run(mode, port, args).main())


class _Run:
    def __init__(self, mode: str, port: int, args: Any):
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from vindex.service import vindex_pb2 as pb
        from vindex.service import vindex_pb2_grpc as pb_grpc

        self.grpc, self.pb, self.pb_grpc, self.health_pb2, self.health_grpc = grpc, pb, pb_grpc, health_pb2, health_pb2_grpc
        self.mode, self.port, self.args = mode, port, args
        self.checks = {"health": 0, "health_not_serving": [], "searches": 0, "search_failed": []}
        self.streams: list[dict] = []

    async def main(self) -> dict:
        grpc = self.grpc
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as hostile, \
                grpc.aio.insecure_channel(f"[::1]:{self.port}") as normal:
            hostile_stub, normal_stub = self.pb_grpc.VectorIndexStub(hostile), self.pb_grpc.VectorIndexStub(normal)
            await normal_stub.CreateCollection(self.pb.CreateCollectionRequest(name=COLLECTION, dim=DIM,
                                                                               if_not_exists=True), timeout=30)
            t0 = time.monotonic()
            streams = [asyncio.ensure_future(self.stream(hostile_stub, i)) for i in range(self.args.streams)]
            checking = asyncio.ensure_future(self.check_until_done(hostile, normal_stub, streams))
            limit = self.args.duration + self.args.idle_timeout + END_MARGIN_S
            done, pending = await asyncio.wait(streams, timeout=limit)
            for task in pending:
                task.cancel()
            await checking
            seconds = time.monotonic() - t0
            readmitted = await self.readmitted(hostile_stub)
            stored = await self.stored(normal_stub)
        return self.verdict(len(pending), seconds, readmitted, stored)

    # --- the hostile streams ---------------------------------------------------------------------
    async def stream(self, stub: Any, i: int) -> None:
        call = stub.UpsertStream(timeout=self.args.duration + self.args.idle_timeout + 2 * END_MARGIN_S)
        record = {"sent": [], "acked": 0}
        self.streams.append(record)
        if self.mode == "slow-client":
            await self.send_slowly(call, i, record)
        else:
            await self.count_acks(call, record)
        record["code"], record["details"] = (await call.code()).name, await call.details()

    async def send_slowly(self, call: Any, i: int, record: dict) -> None:
        interval = self.args.idle_timeout / 3
        end = time.monotonic() + self.args.duration
        reader = asyncio.ensure_future(self.count_acks(call, record))
        try:
            while time.monotonic() < end and not call.done():
                row = 1_000_000 * (i + 1) + len(record["sent"])
                x = np.full((1, DIM), float(row % 997), dtype="<f4")
                await call.write(self.pb.UpsertRequest(collection=COLLECTION, ids=[row], vectors=x.tobytes(), dim=DIM))
                record["sent"].append(row)
                await asyncio.sleep(interval)
            await call.done_writing()
        except (self.grpc.RpcError, asyncio.InvalidStateError):
            pass  # refused or ended by the server: its status says which
        await reader

    async def count_acks(self, call: Any, record: dict) -> None:
        try:
            async for _ in call:
                record["acked"] += 1
        except self.grpc.RpcError:
            pass

    # --- the checks ------------------------------------------------------------------------------
    async def check_until_done(self, hostile: Any, normal_stub: Any, streams: list) -> None:
        health = self.health_grpc.HealthStub(hostile)
        query = np.ones((1, DIM), dtype="<f4").tobytes()
        while not all(s.done() for s in streams):
            try:
                res = await health.Check(self.health_pb2.HealthCheckRequest(), timeout=10)
                if res.status != self.health_pb2.HealthCheckResponse.SERVING:
                    self.checks["health_not_serving"].append(self.health_pb2.HealthCheckResponse.ServingStatus.Name(res.status))
            except self.grpc.RpcError as e:
                self.checks["health_not_serving"].append(f"{e.code().name}: {e.details()}")
            self.checks["health"] += 1
            try:
                await normal_stub.Search(self.pb.SearchRequest(collection=COLLECTION, queries=query, dim=DIM, k=1),
                                         timeout=10)
            except self.grpc.RpcError as e:
                self.checks["search_failed"].append(f"{e.code().name}: {e.details()}")
            self.checks["searches"] += 1
            await asyncio.sleep(CHECK_EVERY_S)

    async def readmitted(self, stub: Any) -> str:
        """The hostile peer's next stream, once its streams ended: its status."""
        x = np.zeros((1, DIM), dtype="<f4").tobytes()
        call = stub.UpsertStream(iter([self.pb.UpsertRequest(collection=COLLECTION, ids=[1], vectors=x, dim=DIM)]),
                                 timeout=30)
        try:
            async for _ in call:
                pass
        except self.grpc.RpcError:
            pass
        return (await call.code()).name

    async def stored(self, stub: Any) -> dict:
        """Of the rows slow streams had acknowledged, how many Get finds."""
        acked = [row for s in self.streams for row in s["sent"][:s["acked"]]]
        found = 0
        for lo in range(0, len(acked), 1000):
            res = await stub.Get(self.pb.GetRequest(collection=COLLECTION, ids=acked[lo:lo + 1000]), timeout=30)
            found += sum(res.found)
        return {"acknowledged": len(acked), "found": found}

    def verdict(self, hung: int, seconds: float, readmitted: str, stored: dict) -> dict:
        codes: dict[str, int] = {}
        for s in self.streams:
            codes[s.get("code", "HUNG")] = codes.get(s.get("code", "HUNG"), 0) + 1
        admitted_ok = "DEADLINE_EXCEEDED" if self.mode == "idle-streams" else "OK"
        unexpected = [s for s in self.streams if s.get("code") not in (admitted_ok, "RESOURCE_EXHAUSTED")
                      or (s["code"] == "DEADLINE_EXCEEDED" and "idle" not in s["details"])
                      or (s["code"] == "RESOURCE_EXHAUSTED" and "cap" not in s["details"])]
        cap = self.args.max_client_rpcs
        admitted = codes.get(admitted_ok, 0)
        result = {
            "mode": self.mode, "streams": self.args.streams, "seconds": round(seconds, 1),
            "stream_codes": codes, "unexpected_examples": [{k: s.get(k) for k in ("code", "details")}
                                                           for s in unexpected[:5]],
            "checks": {"health": self.checks["health"], "health_not_serving": self.checks["health_not_serving"][:5],
                       "searches": self.checks["searches"], "search_failed": self.checks["search_failed"][:5]},
            "readmitted": readmitted, "stored": stored,
        }
        result["verdict"] = {
            "health_always_serving": self.checks["health"] > 0 and not self.checks["health_not_serving"],
            "other_client_served": self.checks["searches"] > 0 and not self.checks["search_failed"],
            "streams_ended_as_documented": hung == 0 and not unexpected and admitted > 0,
            "per_client_cap_held": not cap or admitted <= cap,
            "readmitted_after": readmitted == "OK",
            "acknowledged_rows_stored": stored["found"] == stored["acknowledged"],
        }
        return result


def summary(result: dict) -> str:
    c = result["checks"]
    return "\n".join([
        f"{result['mode']}: {result['streams']} streams in {result['seconds']} s, ended {result['stream_codes']}",
        f"  health checks {c['health']} (not SERVING: {len(c['health_not_serving'])}), other client's searches "
        f"{c['searches']} (failed: {len(c['search_failed'])}); hostile peer re-admitted: {result['readmitted']}; "
        f"acknowledged rows stored {result['stored']['found']}/{result['stored']['acknowledged']}",
        "  verdict: " + ", ".join(f"{k}={v}" for k, v in result["verdict"].items())])
