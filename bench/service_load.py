"""Load benchmark for the gRPC service: N client processes over loopback against one server.

    python -m bench.service_load --dataset synthetic-1m --clients 8

In one run, on copies of one index built over the data set:

1. **library**: the index opened in this process; batch-size-1 searches on one thread
   (QPS, p50/p99/p99.9), then ``upsert`` of ``--ingest`` new vectors in ``--batch``-row calls.
2. **search**: the server (``vindex serve``, a subprocess) and ``--clients`` client processes,
   each sending batch-size-1 searches back to back for ``--duration`` seconds.
3. **upsert**: one client streams the same ``--ingest`` new vectors through ``UpsertStream`` in
   ``--batch``-row chunks (a fresh copy of the index, so both start equal).
4. **mixed**: ``--clients - 1`` search clients while one client upserts flat out.

Beside the search phase it measures the same clients sending health checks, the cheapest call
the server answers: the ceiling gRPC itself puts on QPS and latency on this machine.

``--metrics-ab PASSES`` runs only a comparison instead: search QPS of a server with
``--metrics-port`` (scraped every ``--scrape-interval`` s) against one without, alternated passes.

Every search uses the same parameters (``--max-postings``, k=10). Writes
``<out>/service-<dataset>.json``.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

from . import datasets, measure, report

COLLECTION = "bench"


# --- the server ------------------------------------------------------------------------------------
def start_server(data_dir: str, switch_interval_ms: float | None = None, *options: str
                 ) -> tuple[subprocess.Popen, str]:
    extra = [] if switch_interval_ms is None else ["--switch-interval-ms", str(switch_interval_ms)]
    proc = subprocess.Popen([sys.executable, "-m", "vindex.service.cli", "serve", "--data", data_dir, "--port", "0",
                             "--log-level", "warning", *extra, *options], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if " on " not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    addr = line.split(" on ")[1].split()[0]
    return proc, addr


def stop_server(proc: subprocess.Popen) -> None:
    measure.terminate(proc)


def copy_index(src: str, root: str) -> str:
    """A data directory holding a copy of the index at ``src`` as collection ``bench``."""
    data = tempfile.mkdtemp(dir=root)
    shutil.copytree(src, os.path.join(data, "collections", COLLECTION))
    return data


# --- client processes (spawned: no fork after gRPC objects exist) ----------------------------------
def _timed_calls(call, duration: float, start_at: float) -> np.ndarray:
    """Latencies of ``call(i)`` back to back for ``duration`` seconds, after 50 warm-up calls
    and a wait until the common start time."""
    for i in range(50):
        call(i)
    while time.time() < start_at:
        time.sleep(0.001)
    lat, i = [], 0
    end = time.perf_counter() + duration
    while True:
        t0 = time.perf_counter()
        if t0 >= end:
            break
        call(i)
        lat.append(time.perf_counter() - t0)
        i += 1
    return np.asarray(lat)


def _search_client(addr: str, queries: np.ndarray, k: int, m: int, duration: float, start_at: float, out) -> None:
    import vindex

    col = vindex.Client(addr).collection(COLLECTION)
    out.put(_timed_calls(lambda i: col.search(queries[i % queries.shape[0]], k, max_postings=m), duration, start_at))


def _health_client(addr: str, duration: float, start_at: float, out) -> None:
    """The cheapest call the server answers (a health check): the gRPC ceiling on this machine."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(addr))
    out.put(_timed_calls(lambda i: stub.Check(health_pb2.HealthCheckRequest()), duration, start_at))


def _upsert_client(addr: str, ids: np.ndarray, x: np.ndarray, batch: int, duration: float | None,
                   start_at: float, out) -> None:
    import vindex

    col = vindex.Client(addr, timeout=None).collection(COLLECTION)
    while time.time() < start_at:
        time.sleep(0.001)
    t0 = time.perf_counter()
    done = 0
    chunks = ((ids[lo:lo + batch], x[lo:lo + batch]) for lo in range(0, ids.size, batch))
    for ack in col.upsert_stream(chunks):
        done = int(ack.total)
        if duration is not None and time.perf_counter() - t0 > duration:
            break
    out.put((done, time.perf_counter() - t0))


def run_clients(specs: list[tuple], duration: float) -> list:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 8.0  # spawned interpreters need a few seconds to import
    procs = [ctx.Process(target=fn, args=(*args, start_at, out)) for fn, args in specs]
    for p in procs:
        p.start()
    results = [out.get(timeout=duration + 300) for _ in procs]
    for p in procs:
        p.join()
    return results


def latency_summary(lats: list[np.ndarray], duration: float) -> dict:
    allv = np.concatenate(lats)
    return {"qps": allv.size / duration, "p50_ms": float(np.percentile(allv, 50) * 1e3),
            "p99_ms": float(np.percentile(allv, 99) * 1e3), "p999_ms": float(np.percentile(allv, 99.9) * 1e3),
            "queries": int(allv.size)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape_every(url: str, interval: float, stop: threading.Event, counts: list[int]) -> None:
    """Scrape ``url`` every ``interval`` seconds (a Prometheus server, but more often)."""
    while not stop.wait(interval):
        urllib.request.urlopen(url, timeout=10).read()
        counts[0] += 1


def metrics_ab(args: argparse.Namespace, cached: str, root: str, queries: np.ndarray) -> dict:
    """Search QPS of two servers over copies of one index, one without metrics and one with
    ``--metrics-port`` scraped every ``--scrape-interval`` s, in ``--metrics-ab`` alternated
    passes of ``--duration`` s each (the one that goes first alternates too); medians."""
    port = free_port()
    plain = start_server(copy_index(cached, root), args.switch_interval_ms)
    metered = start_server(copy_index(cached, root), args.switch_interval_ms, "--metrics-port", str(port))
    stop, scrapes = threading.Event(), [0]
    scraper = threading.Thread(target=_scrape_every, daemon=True,
                               args=(f"http://127.0.0.1:{port}/metrics", args.scrape_interval, stop, scrapes))
    scraper.start()
    passes: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for p in range(args.metrics_ab):
            for mode in (("off", "on") if p % 2 == 0 else ("on", "off")):
                addr = (plain if mode == "off" else metered)[1]
                lats = run_clients([(_search_client, (addr, queries[c::args.clients], 10, args.max_postings,
                                                      args.duration)) for c in range(args.clients)], args.duration)
                passes[mode].append(latency_summary(lats, args.duration)["qps"])
                print(f"[metrics {mode}] pass {p}: {passes[mode][-1]:.0f} QPS", file=sys.stderr, flush=True)
    finally:
        stop.set()
        scraper.join()
        stop_server(plain[0])
        stop_server(metered[0])
    off, on = float(np.median(passes["off"])), float(np.median(passes["on"]))
    return {"passes": passes, "qps_off": off, "qps_on": on, "ratio": on / off, "scrapes": scrapes[0],
            "scrape_interval_s": args.scrape_interval}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synthetic-1m")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per search phase")
    ap.add_argument("--max-postings", type=int, default=32)
    ap.add_argument("--ingest", default="100k", help="new vectors upserted in the upsert phases")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--index-cache", default=os.path.expanduser("~/.cache/vindex-bench/indexes"))
    ap.add_argument("--switch-interval-ms", type=float, default=None,
                    help="the server's GIL switch interval (default: what `vindex serve` sets)")
    ap.add_argument("--metrics-ab", type=int, default=0, metavar="PASSES",
                    help="instead of the phases: search QPS with --metrics-port on against off, PASSES "
                         "alternated passes each (writes service-metrics-<dataset>.json)")
    ap.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes in --metrics-ab")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)

    import vindex

    ds = datasets.load(args.dataset)
    n_ingest = datasets.parse_count(args.ingest)
    queries = np.ascontiguousarray(ds.queries[:2000], dtype=np.float32)
    rng = np.random.default_rng(7)
    # new vectors: base rows with small noise, under fresh ids
    src = rng.integers(0, ds.n, n_ingest)
    new_x = (np.asarray(ds.base)[src] + rng.normal(0, 0.01 * float(np.std(ds.base[:1000])), (n_ingest, ds.d))).astype(np.float32)
    new_ids = np.arange(ds.n, ds.n + n_ingest, dtype=np.int64)

    cached = os.path.join(args.index_cache, ds.name)
    if not os.path.exists(os.path.join(cached, "vindex.json")):
        print(f"building {ds.name} index into {cached} ...", file=sys.stderr, flush=True)
        shutil.rmtree(cached, ignore_errors=True)
        vindex.Index.build(cached, ds.base, metric=ds.metric).close()
    root = tempfile.mkdtemp(prefix="vindex-service-load-")
    result: dict = {"meta": {"dataset": ds.name, "clients": args.clients, "duration_s": args.duration,
                             "max_postings": args.max_postings, "k": 10, "ingest": n_ingest, "batch": args.batch,
                             "cores": os.cpu_count(), "switch_interval_ms": args.switch_interval_ms,
                             "time": time.strftime("%Y-%m-%d %H:%M:%S")}}
    k, m = 10, args.max_postings
    if args.metrics_ab:
        try:
            result["metrics_ab"] = metrics_ab(args, cached, root, queries)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        ab = result["metrics_ab"]
        print(f"search QPS: metrics off {ab['qps_off']:.0f}, on {ab['qps_on']:.0f} (x{ab['ratio']:.3f}, "
              f"medians of {args.metrics_ab}; {ab['scrapes']} scrapes)")
        out = os.path.join(args.out, f"service-metrics-{ds.name}")
        report.write_json(out + ".json", result)
        print(f"wrote {out}.json")
        return 0
    try:
        # 1. library, in process, one thread
        measure.limit_threads(1)
        data = copy_index(cached, root)
        index = vindex.Index.open(os.path.join(data, "collections", COLLECTION))
        vindex.warmup()
        for q in queries[:200]:
            index.search(q, k, max_postings=m)
        lat = []
        end = time.perf_counter() + args.duration
        i = 0
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            index.search(queries[i % queries.shape[0]], k, max_postings=m)
            lat.append(time.perf_counter() - t0)
            i += 1
        result["library_search"] = latency_summary([np.asarray(lat)], args.duration)
        t0 = time.perf_counter()
        for lo in range(0, n_ingest, args.batch):
            index.upsert(new_ids[lo:lo + args.batch], new_x[lo:lo + args.batch])
        secs = time.perf_counter() - t0
        result["library_upsert"] = {"per_s": n_ingest / secs, "seconds": secs}
        index.close()
        shutil.rmtree(data)
        print(f"[library] search {result['library_search']}; upsert {n_ingest / secs:.0f}/s",
              file=sys.stderr, flush=True)

        # 2. search through the server
        data = copy_index(cached, root)
        proc, addr = start_server(data, args.switch_interval_ms)
        try:
            lats = run_clients([(_search_client, (addr, queries[c::args.clients], k, m, args.duration))
                                for c in range(args.clients)], args.duration)
            result["grpc_search"] = latency_summary(lats, args.duration)
            result["grpc_search"]["ratio_vs_library"] = result["grpc_search"]["qps"] / result["library_search"]["qps"]
            print(f"[grpc search] {result['grpc_search']}", file=sys.stderr, flush=True)
            lats = run_clients([(_health_client, (addr, args.duration)) for _ in range(args.clients)], args.duration)
            result["grpc_noop_ceiling"] = latency_summary(lats, args.duration)
            print(f"[grpc no-op ceiling] {result['grpc_noop_ceiling']}", file=sys.stderr, flush=True)
        finally:
            stop_server(proc)
        shutil.rmtree(data)

        # 3. bulk ingest through UpsertStream
        data = copy_index(cached, root)
        proc, addr = start_server(data, args.switch_interval_ms)
        try:
            (done, secs), = run_clients([(_upsert_client, (addr, new_ids, new_x, args.batch, None))], 0)
            result["grpc_upsert"] = {"per_s": done / secs, "seconds": secs, "rows": done,
                                     "ratio_vs_library": done / secs / result["library_upsert"]["per_s"]}
            print(f"[grpc upsert] {result['grpc_upsert']}", file=sys.stderr, flush=True)

            # 4. mixed: searches while one client upserts (replacing the vectors just added)
            specs = [(_search_client, (addr, queries[c::args.clients], k, m, args.duration))
                     for c in range(args.clients - 1)]
            specs.append((_upsert_client, (addr, new_ids, new_x[::-1].copy(), args.batch, args.duration)))
            res = run_clients(specs, args.duration)
            lats = [r for r in res if isinstance(r, np.ndarray)]
            (done, secs), = [r for r in res if isinstance(r, tuple)]
            result["grpc_mixed"] = {**latency_summary(lats, args.duration), "upsert_per_s": done / secs}
            print(f"[grpc mixed] {result['grpc_mixed']}", file=sys.stderr, flush=True)
        finally:
            stop_server(proc)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = os.path.join(args.out, f"service-{ds.name}")
    report.write_json(out + ".json", result)
    print(f"wrote {out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
