"""Ingest benchmark: sustained upsert throughput against hnswlib's add, the time the
background needs to drain afterwards, and search latency while ingest runs flat out.

    python -m bench.ingest --n 1m

1. vindex is built over the first ``--initial`` synthetic vectors, then the rest are upserted
   in batches of ``--batch`` (rebalancing on): throughput, then the seconds until
   ``wait_idle`` returns.
2. hnswlib (M=16, ef_construction=200) is built over the same first vectors, then the same
   batches are added with ``num_threads=--threads``: throughput.
3. On the full vindex index, batch-size-1 searches on one thread measure p50/p99 latency
   idle, then again while another thread upserts (replaces vectors) flat out, per GIL switch
   interval; ``--latency-repeat`` such pairs, reported as medians.
Writes ``<out>/ingest-<n>.json``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

import vindex

from . import datasets, measure, report, synthetic


def drain_times(index: vindex.Index, poll_s: float = 0.25) -> tuple[float, float]:
    """Seconds until ``wait_idle`` returns, and until the background first had nothing more
    urgent than the scrub (its earned re-checks of stored vectors began to be spent: the
    splits the ingest left behind and their reassignment were done). Polls ``stats()`` (~2 ms
    on 1M)."""
    t0 = time.perf_counter()
    scrub = index.stats()["scrub_pending"]
    caught_up = None
    while not index.wait_idle(timeout=poll_s):
        if caught_up is None and index.stats()["scrub_pending"] < scrub:
            caught_up = time.perf_counter() - t0
    drain = time.perf_counter() - t0
    return drain, drain if caught_up is None else caught_up


def upsert_all(index: vindex.Index, ids: np.ndarray, x: np.ndarray, batch: int) -> float:
    t0 = time.perf_counter()
    for lo in range(0, ids.shape[0], batch):
        index.upsert(ids[lo:lo + batch], x[lo:lo + batch])
    return time.perf_counter() - t0


def latencies(index: vindex.Index, queries: np.ndarray, m: int) -> np.ndarray:
    out = np.empty(queries.shape[0])
    for i, q in enumerate(queries):
        t0 = time.perf_counter()
        index.search(q, 10, max_postings=m)
        out[i] = time.perf_counter() - t0
    return out


def latency_under_ingest(index: vindex.Index, q: np.ndarray, extra: np.ndarray, args: argparse.Namespace) -> dict:
    """Batch-size-1 latency idle, then while another thread upserts flat out; ``args.latency_repeat``
    such pairs, the figures being the medians (one p99 is the 30th-slowest of 3,000 queries,
    and the shared machine moves it by 2x from one run to the next)."""
    idles, busies, rates = [], [], []
    for _ in range(args.latency_repeat):
        idles.append(measure.percentiles(latencies(index, q, args.max_postings)))
        stop = threading.Event()
        ingested = [0]

        def ingest():
            lo = 0
            while not stop.is_set():
                rows = np.arange(lo, lo + args.batch) % extra.shape[0]
                index.upsert(rows.astype(np.int64), extra[rows])  # replaces ids 0..199999
                ingested[0] += args.batch
                lo += args.batch

        t = threading.Thread(target=ingest)
        t.start()
        time.sleep(1.0)
        t_busy = time.perf_counter()
        busies.append(measure.percentiles(latencies(index, q, args.max_postings)))
        busy_s = time.perf_counter() - t_busy
        stop.set()
        t.join()
        rates.append(ingested[0] / (busy_s + 1.0))
        index.wait_idle()

    def med(runs: list[dict]) -> dict:
        return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}

    pi, pb = med(idles), med(busies)
    out = {"idle": pi, "under_ingest": pb, "p99_ratio": pb["p99"] / pi["p99"],
           "ingest_per_s_meanwhile": float(np.median(rates)),
           "runs_idle_p99": [r["p99"] for r in idles], "runs_under_ingest_p99": [r["p99"] for r in busies]}
    print(f"[latency, switch interval {sys.getswitchinterval() * 1e3:g} ms, medians of {args.latency_repeat}] "
          f"idle p50 {pi['p50']:.3f} p99 {pi['p99']:.3f} ms; under ingest p50 {pb['p50']:.3f} p99 {pb['p99']:.3f} ms "
          f"(x{pb['p99'] / pi['p99']:.2f}; p99 runs idle {[round(r['p99'], 2) for r in idles]}, "
          f"under ingest {[round(r['p99'], 2) for r in busies]}); ingest meanwhile {out['ingest_per_s_meanwhile']:.0f}/s",
          file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1m")
    ap.add_argument("--initial", default="500k")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="build/add threads")
    ap.add_argument("--max-postings", type=int, default=32)
    ap.add_argument("--latency-queries", type=int, default=3000)
    ap.add_argument("--latency-repeat", type=int, default=3, help="idle / under-ingest pairs per switch interval")
    ap.add_argument("--skip-hnswlib", action="store_true")
    ap.add_argument("--switch-intervals", default="0.005,0.001,0.00025",
                    help="GIL switch intervals (s) to measure latency under ingest with (Python's default is 0.005, `vindex serve` sets 0.00025)")
    ap.add_argument("--io-scheduler", default="sla", choices=["sla", "fifo"],
                    help="sla: background rebalancing paced to --p99-target-ms; fifo: unpaced")
    ap.add_argument("--p99-target-ms", type=float, default=5.0)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    n, n0 = datasets.parse_count(args.n), datasets.parse_count(args.initial)
    base, queries, _ = synthetic.load_cached(n, 128, 0)
    base = np.asarray(base)
    extra = synthetic.make_rows(n, n + 200_000, 128, 0)  # replacement vectors, same distribution
    ids = np.arange(n0, n, dtype=np.int64)
    work = tempfile.mkdtemp(prefix="vindex-ingest-")
    result: dict = {"meta": {"n": n, "initial": n0, "batch": args.batch, "threads": args.threads,
                             "io_scheduler": args.io_scheduler, "p99_target_ms": args.p99_target_ms,
                             "time": time.strftime("%Y-%m-%d %H:%M:%S")}}
    vindex.warmup()  # as `vindex serve` does: no kernel compiles or loads inside a timed phase
    try:
        measure.limit_threads(args.threads)
        t0 = time.perf_counter()
        index = vindex.Index.build(f"{work}/v", base[:n0], build_threads=args.threads, progress=False,
                                   io_scheduler=args.io_scheduler, interactive_p99_ms=args.p99_target_ms)
        result["vindex_build_initial_s"] = time.perf_counter() - t0
        vindex.freeze_heap()  # as `vindex serve` does once it is ready (vindex/gcpause.py)
        secs = upsert_all(index, ids, base[n0:], args.batch)
        drain, caught_up = drain_times(index)
        s = index.stats()
        result["vindex"] = {"upsert_per_s": ids.size / secs, "seconds": secs, "drain_s": drain,
                            "caught_up_s": caught_up,
                            **{k: s[k] for k in ("heads", "posting_mean", "posting_max", "postings_over_limit",
                                                 "splits", "merges", "reassigns", "gc")}}
        print(f"[vindex] {ids.size / secs:.0f} upserts/s ({secs:.1f} s), background drained {drain:.1f} s after"
              f" (splits caught up after {caught_up:.1f} s, then the scrub)", file=sys.stderr, flush=True)

        # search latency idle, then under flat-out ingest, per GIL switch interval
        measure.limit_threads(1)
        q = queries[: args.latency_queries]
        latencies(index, q[:200], args.max_postings)
        result["latency"] = {}
        default_interval = sys.getswitchinterval()
        for interval in (float(v) for v in args.switch_intervals.split(",")):
            sys.setswitchinterval(interval)
            result["latency"][str(interval)] = latency_under_ingest(index, q, extra, args)
        sys.setswitchinterval(default_interval)
        index.close()

        if not args.skip_hnswlib:
            import hnswlib

            h = hnswlib.Index(space="l2", dim=128)
            h.init_index(max_elements=n, M=16, ef_construction=200, random_seed=100)
            t0 = time.perf_counter()
            h.add_items(base[:n0], np.arange(n0), num_threads=args.threads)
            result["hnswlib_build_initial_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            for lo in range(0, ids.size, args.batch):
                h.add_items(base[n0 + lo:n0 + lo + args.batch], ids[lo:lo + args.batch], num_threads=args.threads)
            hs = time.perf_counter() - t0
            result["hnswlib"] = {"add_per_s": ids.size / hs, "seconds": hs}
            result["ratio_vs_hnswlib"] = result["vindex"]["upsert_per_s"] / result["hnswlib"]["add_per_s"]
            print(f"[hnswlib] {ids.size / hs:.0f} adds/s ({hs:.1f} s); vindex/hnswlib = "
                  f"{result['ratio_vs_hnswlib']:.2f}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = os.path.join(args.out, f"ingest-{args.n}")
    report.write_json(out + ".json", result)
    print(f"wrote {out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
