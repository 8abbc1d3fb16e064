"""Server memory under concurrent large searches, against ``--max-inflight-bytes``.

    python -m bench.inflight_memory [--searches 8] [--budget-mib 128 512 100000]

For each budget: a fresh ``vindex serve`` with a small collection of dimension ``DIM``, then
``--searches`` concurrent Search calls of ``QUERIES`` queries each (about 61 MB a message), sent
at once from threads. Reports the server's peak RSS (VmHWM) grown over its RSS before the
searches, how many searches succeeded and how many were refused RESOURCE_EXHAUSTED (a search
that does not fit the budget as it arrives). One search alone adds about 4 times its message;
refused searches still add what gRPC buffered of them before admission saw them.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import threading

import numpy as np

from .fuzz import ServerProc

DIM, QUERIES = 1536, 10_000   # 61.4 MB of float32 queries


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def measure(budget_mib: int, searches: int) -> dict:
    import grpc

    from vindex.service import vindex_pb2 as pb
    from vindex.service import vindex_pb2_grpc as pb_grpc

    root = tempfile.mkdtemp(prefix="vindex-inflight-")
    server = ServerProc(f"{root}/data", f"{root}/server.log",
                        ["--max-inflight-bytes", str(budget_mib << 20), "--max-queries", str(QUERIES)])
    try:
        server.start()
        opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        with grpc.insecure_channel(server.target, options=opts) as channel:
            stub = pb_grpc.VectorIndexStub(channel)
            stub.CreateCollection(pb.CreateCollectionRequest(name="m", dim=DIM), timeout=60)
            x = np.random.default_rng(0).standard_normal((200, DIM)).astype("<f4")
            stub.Upsert(pb.UpsertRequest(collection="m", ids=list(range(200)), vectors=x.tobytes(), dim=DIM), timeout=60)
            queries = np.random.default_rng(1).standard_normal((QUERIES, DIM)).astype("<f4").tobytes()
            request = pb.SearchRequest(collection="m", queries=queries, dim=DIM, k=1)
            pid = server.proc.pid
            before = _status_kb(pid, "VmRSS")
            outcomes: list[str] = []
            start = threading.Barrier(searches)

            def search() -> None:
                start.wait()
                try:
                    stub.Search(request, timeout=300)
                    outcomes.append("OK")
                except grpc.RpcError as e:
                    outcomes.append(e.code().name)

            threads = [threading.Thread(target=search) for _ in range(searches)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            peak = _status_kb(pid, "VmHWM")
        server.stop()
    finally:
        if server.alive():
            server.proc.kill()
        shutil.rmtree(root, ignore_errors=True)
    return {"budget_mib": budget_mib, "searches": searches, "rss_before_mib": before >> 10,
            "peak_growth_mib": (peak - before) >> 10, "ok": outcomes.count("OK"),
            "refused": outcomes.count("RESOURCE_EXHAUSTED")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--searches", type=int, default=8)
    ap.add_argument("--budget-mib", type=int, nargs="+", default=[128, 512, 100_000])
    args = ap.parse_args(argv)
    for budget in args.budget_mib:
        r = measure(budget, args.searches)
        print(f"budget {r['budget_mib']:>6} MiB: {r['searches']} searches of {len(range(QUERIES))} x {DIM} "
              f"({QUERIES * DIM * 4 / 1e6:.1f} MB): peak RSS +{r['peak_growth_mib']} MiB over "
              f"{r['rss_before_mib']} MiB; {r['ok']} OK, {r['refused']} RESOURCE_EXHAUSTED", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
