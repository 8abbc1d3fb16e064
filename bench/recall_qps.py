"""Recall / QPS / latency / build time / RSS of vindex beside faiss and hnswlib, in one run.

    python -m bench.recall_qps --dataset synthetic-1m
    python -m bench.recall_qps --dataset glove-100k --peers faiss-ivfflat

Searches run on one thread; builds on ``--build-threads`` (all cores by default) for every
method alike. vindex reads postings through its RocksDB store with a block cache large enough
to hold them, warmed before timing; vindex has no decoded-posting cache. For each setting of
each method's sweep it reports recall@10, batch QPS (one call over all queries, median of
at least ``--repeats`` calls and of as many as ``--min-seconds`` takes; vindex's one-thread and
``threads=2`` calls taking turns, their ratio the median of each pair's), batch-size-1 latency
p50/p99, and per method the build time and the RSS of a
fresh process that only opens the saved index. Writes ``<out>/<dataset>.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from . import datasets, measure, report
from .peers import PEERS, make_peer
from .vindex_peer import Vindex

TARGETS = (0.90, 0.95)
COLUMNS = [("method", "method", "s"), ("params", "params", "s"), ("recall", "recall@10", ".4f"),
           ("qps", "QPS batch", ".0f"), ("qps1", "QPS bs=1", ".0f"), ("p50", "p50 ms", ".3f"),
           ("p99", "p99 ms", ".3f"), ("qps_threads2", "QPS batch 2 threads", ".0f")]


def _rss_code(method, path: str) -> str:
    if isinstance(method, Vindex):
        return method.rss_code()
    cls = type(method).__name__
    return f"from bench.peers import {cls}\nindex = {cls}.open_for_rss({path!r})\n"


_BASELINE = {"vindex": "import vindex, rocksdict\n",
             "faiss-ivfflat": "import faiss\n", "faiss-hnsw": "import faiss\n", "hnswlib": "import hnswlib, numpy\n"}


def run_method(method, ds: datasets.Dataset, queries: np.ndarray, gt: np.ndarray, args, workdir: str) -> dict:
    name = method.name
    print(f"[{name}] building on {args.build_threads} thread(s) ...", file=sys.stderr, flush=True)
    measure.limit_threads(args.build_threads)
    t0 = time.perf_counter()
    method.build(ds.base, ds.metric)
    build_s = time.perf_counter() - t0
    measure.limit_threads(1)
    path = os.path.join(workdir, name.replace("/", "_"))
    method.save(path)
    rss = measure.rss_of_subprocess(_rss_code(method, path))
    rss_base = measure.rss_of_subprocess(_BASELINE[name])
    extra = {}
    if isinstance(method, Vindex):  # the kernels (numba, LLVM) load on the first search
        extra["rss_after_search_bytes"] = measure.rss_of_subprocess(method.rss_code(search=True))
    print(f"[{name}] build {build_s:.1f} s, RSS after open {rss / 2**20:.0f} MiB "
          f"(interpreter + libraries alone: {rss_base / 2**20:.0f} MiB"
          + (f"; after one search: {extra['rss_after_search_bytes'] / 2**20:.0f} MiB" if extra else "")
          + ")", file=sys.stderr, flush=True)
    if isinstance(method, Vindex):
        method.reopen()
        method.warm(queries)
    rows = []
    for params in method.sweep():
        method.set_params(params)
        ids = method.search(queries, args.k)  # also warms this setting
        recall = datasets.recall_at_k(ids, gt, args.k)
        one_thread = lambda q: method.search(q, args.k)  # noqa: E731
        if isinstance(method, Vindex):  # the same batch on two cores (``search(threads=2)``), in turns
            qps, qps2, x2 = measure.paired_qps(one_thread, lambda q: method.search(q, args.k, threads=2), queries,
                                               repeats=args.repeats, min_seconds=args.min_seconds)
        else:
            qps = measure.batch_qps(one_thread, queries, repeats=args.repeats, min_seconds=args.min_seconds)
        lat = measure.latencies(one_thread, queries, n=args.latency_queries)
        pct = measure.percentiles(lat)
        row = {"method": name, "params": ",".join(f"{k}={v}" for k, v in params.items()),
               "recall": recall, "qps": qps, "qps1": 1.0 / float(np.mean(lat)), **pct}
        if isinstance(method, Vindex):
            row["qps_threads2"], row["threads2_x"] = qps2, x2
        rows.append(row)
        print(report.table([row], COLUMNS).splitlines()[-1], file=sys.stderr, flush=True)
        if recall >= args.max_recall:
            break
    out = {"build_s": build_s, "rss_bytes": rss, "rss_baseline_bytes": rss_base, **extra, "rows": rows}
    if isinstance(method, Vindex):
        out["build_stats"] = method.build_stats
        out["index_stats"] = {k: v for k, v in method.index.stats().items() if k != "build"}
        out["decoded_posting_cache"] = "none (every posting is read through the RocksDB store)"
        method.close()
    return out


def summarize(results: dict) -> list[dict]:
    rows = []
    ivf = results.get("faiss-ivfflat")
    for name, res in results.items():
        row = {"method": name, "build_s": res["build_s"], "rss_mib": res["rss_bytes"] / 2**20,
               "rss_base_mib": res["rss_baseline_bytes"] / 2**20,
               "rss_search_mib": res.get("rss_after_search_bytes", 0) / 2**20 or None}
        for t in TARGETS:
            q = report.at_recall(res["rows"], t)
            row[f"qps@{t}"] = q
            row[f"p50@{t}"] = _p50_at(res["rows"], t)
            first = next((r for r in res["rows"] if r["recall"] >= t and "threads2_x" in r), None)
            row[f"threads2_x@{t}"] = first["threads2_x"] if first else None
            if ivf is not None and q is not None:
                base = report.at_recall(ivf["rows"], t)
                row[f"vs_ivf@{t}"] = q / base if base else None
        rows.append(row)
    return rows


def _p50_at(rows: list[dict], target: float) -> float | None:
    """p50 latency of the cheapest setting that reaches ``target`` recall."""
    ok = [r for r in rows if r["recall"] >= target]
    return min(r["p50"] for r in ok) if ok else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True, help=f"one of {datasets.available()}")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated peers, or 'none'")
    ap.add_argument("--queries", type=int, default=0, help="use only the first N queries")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--build-threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3, help="batch timings per setting, at least (median)")
    ap.add_argument("--min-seconds", type=float, default=0.5,
                    help="time each setting's batch again until its calls add up to this (at most 50 calls)")
    ap.add_argument("--latency-queries", type=int, default=1000, help="queries timed one by one")
    ap.add_argument("--max-recall", type=float, default=0.995, help="stop a sweep once reached")
    ap.add_argument("--config", default="", help="vindex config as key=value,key=value")
    ap.add_argument("--index-dir", default=None, help="build vindex here (default: a temp dir)")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)

    ds = datasets.load(args.dataset)
    n_q = args.queries or ds.queries.shape[0]
    queries, gt = ds.queries[:n_q], ds.gt_ids[:n_q]
    config = dict(_parse_kv(kv) for kv in args.config.split(",") if kv)
    methods = [Vindex(args.index_dir, build_threads=args.build_threads, config=config)]
    if args.peers != "none":
        methods += [make_peer(p, build_threads=args.build_threads) for p in args.peers.split(",") if p]

    results = {}
    with tempfile.TemporaryDirectory(prefix="vindex-bench-") as workdir:
        while methods:
            m = methods.pop(0)
            results[m.name] = run_method(m, ds, queries, gt, args, workdir)
            del m  # free each index before building the next
    all_rows = [r for res in results.values() for r in res["rows"]]
    summary = summarize(results)
    print(f"\n{args.dataset}: n={ds.base.shape[0]} d={ds.base.shape[1]} metric={ds.metric} "
          f"queries={n_q} k={args.k}; search 1 thread, build {args.build_threads} thread(s)\n")
    print(report.table(all_rows, COLUMNS))
    cols = [("method", "method", "s"), ("build_s", "build s", ".1f"), ("rss_mib", "RSS open MiB", ".0f"),
            ("rss_base_mib", "RSS libs MiB", ".0f"), ("rss_search_mib", "RSS 1st query MiB", ".0f")]
    for t in TARGETS:
        cols += [(f"qps@{t}", f"QPS@{t}", ".0f"), (f"vs_ivf@{t}", f"x IVF@{t}", ".2f"),
                 (f"p50@{t}", f"p50ms@{t}", ".3f"), (f"threads2_x@{t}", f"2 threads x@{t}", ".2f")]
    print()
    print(report.table(summary, cols))
    meta = {"dataset": args.dataset, "n": int(ds.base.shape[0]), "dim": int(ds.base.shape[1]),
            "metric": ds.metric, "queries": n_q, "k": args.k, "build_threads": args.build_threads,
            "search_threads": 1, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "vindex_config": config}
    out = os.path.join(args.out, args.dataset)
    report.write_json(out + ".json", {"meta": meta, "summary": summary, "results": results})
    report.plot_recall_qps(out + ".png", {k: v["rows"] for k, v in results.items()},
                           f"{args.dataset} (k={args.k}, 1 search thread)")
    print(f"\nwrote {out}.json and {out}.png")
    return 0


def _parse_kv(kv: str) -> tuple[str, object]:
    key, _, value = kv.partition("=")
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            pass
    return key, value


if __name__ == "__main__":
    sys.exit(main())
