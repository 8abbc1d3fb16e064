"""``recall_target`` against fixed ``max_postings`` on the same open index, in one run.

    python -m bench.aps --dataset wiki-minilm-15k
    python -m bench.aps --dataset synthetic-1m --index-dir ~/.cache/vindex-bench/indexes/synthetic-1m

Mean recall@10 and records scanned per query for each ``max_postings`` of the sweep; for
each recall target, its recall, records, batch QPS (one call over all queries) and
one-query-per-call QPS (``--latency-queries`` queries), timed in turns with the two sweep
settings whose recalls lie around the target's (medians of ``--repeats`` passes), and the
fixed-``max_postings`` figures at the target's recall (linear between those two) with the
ratios. The set's last ``--served`` queries are searched first (the traffic the index
calibrates a target on); the others are measured. One thread. Adds the data set's entry to
``<out>/aps.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from . import datasets, measure, report
from .vindex_peer import Vindex

TARGETS = (0.90, 0.95)
SWEEP = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192)


def recall_of(index, queries: np.ndarray, gt: np.ndarray, k: int, params: dict) -> tuple[float, float]:
    """Mean recall@k and records scanned per query (this call also warms the setting, and
    calibrates the index for a target)."""
    res = index.search(queries, k, **params)
    return (datasets.recall_at_k(np.asarray(res.ids, dtype=np.int64), gt, k),
            res.stats["records_scanned"] / queries.shape[0])


def timed(index, queries: np.ndarray, k: int, settings: list[dict], args) -> list[tuple[float, float]]:
    """Per setting ``(batch QPS, one-query-per-call QPS)``: batches timed in turns (the
    first rotating), medians of ``args.repeats``; one query per call with the settings taking turns on each query
    (load changes hit them alike; which goes first rotates, as the first to see a query
    finds colder caches), total time over ``args.latency_queries`` queries, median of
    ``args.repeats`` passes."""
    batch = [[] for _ in settings]
    one = [[] for _ in settings]
    for r in range(args.repeats):
        for step in range(len(settings)):  # which goes first rotates (after the one-by-one pass)
            j = (r + step) % len(settings)
            batch[j].append(measure.batch_qps(lambda q: index.search(q, k, **settings[j]), queries, repeats=1))
        spent = np.zeros(len(settings))
        for i, q in enumerate(queries[:args.latency_queries]):
            for step in range(len(settings)):  # each setting first in turn: the first pays the cold caches
                j = (i + step) % len(settings)
                t0 = time.perf_counter()
                index.search(q, k, **settings[j])
                spent[j] += time.perf_counter() - t0
        for j in range(len(settings)):
            one[j].append(args.latency_queries / spent[j])
    return [(float(np.median(b)), float(np.median(o))) for b, o in zip(batch, one)]


def bracket(fixed: list[dict], recall: float) -> tuple[dict, dict] | None:
    """The two sweep settings whose recalls lie around ``recall``."""
    rows = sorted(fixed, key=lambda r: r["recall"])
    for lo, hi in zip(rows, rows[1:]):
        if lo["recall"] <= recall <= hi["recall"]:
            return lo, hi
    return None


def at_recall(lo: dict, hi: dict, recall: float, key: str) -> float:
    """``key`` at ``recall``, linear between the two settings around it."""
    f = (recall - lo["recall"]) / (hi["recall"] - lo["recall"]) if hi["recall"] > lo["recall"] else 0.0
    return lo[key] + f * (hi[key] - lo[key])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--queries", type=int, default=0, help="use only the first N queries")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--latency-queries", type=int, default=500)
    ap.add_argument("--served", type=int, default=256,
                    help="the set's last N queries are searched first, as the traffic a calibration samples")
    ap.add_argument("--index-dir", default=None, help="open (or build) the index here")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)

    ds = datasets.load(args.dataset)
    n_q = min(args.queries or ds.queries.shape[0], ds.queries.shape[0] - args.served)
    queries, gt = ds.queries[:n_q], ds.gt_ids[:n_q]
    served = ds.queries[ds.queries.shape[0] - args.served:]
    method = Vindex(args.index_dir, build_threads=os.cpu_count() or 1)
    built = args.index_dir and os.path.exists(os.path.join(args.index_dir, "vindex.json"))
    if not built:
        print(f"[{args.dataset}] building ...", file=sys.stderr, flush=True)
        method.build(ds.base, ds.metric)
    measure.limit_threads(1)
    method.reopen()
    index = method.index
    with index._tap.muted():
        method.warm(queries)
    for lo in range(0, served.shape[0], 16):  # traffic before the measured queries: what calibrates
        index.search(served[lo:lo + 16], args.k)
    with index._tap.muted():  # the measured queries neither calibrate nor trigger a recalibration
        return _measure(args, index, method, queries, gt, n_q)


def _measure(args, index, method, queries: np.ndarray, gt: np.ndarray, n_q: int) -> int:
    fixed = []
    for m in SWEEP:
        recall, records = recall_of(index, queries, gt, args.k, {"max_postings": m})
        fixed.append({"params": {"max_postings": m}, "recall": recall, "records_per_query": records})
        print(f"  max_postings {m}: recall {recall:.4f}, {records:.0f} records/query", file=sys.stderr, flush=True)
    adaptive = []
    started = time.perf_counter()
    index.search(queries[:1], args.k, recall_target=TARGETS[0])  # the index calibrates itself
    calibrate_s = time.perf_counter() - started
    for t in TARGETS:
        recall, records = recall_of(index, queries, gt, args.k, {"recall_target": t})
        row = {"target": t, "recall": recall, "records_per_query": records, "in_band": t - 0.01 <= recall <= t + 0.03}
        around = bracket(fixed, recall)
        settings = [{"recall_target": t}] + ([lo["params"] for lo in around] if around else [])
        speeds = timed(index, queries, args.k, settings, args)
        row["qps"], row["qps1"] = speeds[0]
        if around:
            lo, hi = (dict(r, qps=s[0], qps1=s[1]) for r, s in zip(around, speeds[1:]))
            row["fixed_around"] = [lo, hi]
            for key in ("qps", "qps1", "records_per_query"):
                row[f"fixed_{key}"] = at_recall(lo, hi, recall, key)
                row[f"{key}_x"] = row[key] / row[f"fixed_{key}"]
        adaptive.append(row)
        print(f"  target {t}: recall {recall:.4f} (in band: {row['in_band']}), {records:.0f} records/query, "
              f"batch {row['qps']:.0f} q/s ({row.get('qps_x')}x the fixed max_postings at that recall), "
              f"one by one {row['qps1']:.0f} q/s ({row.get('qps1_x')}x)", file=sys.stderr, flush=True)
    cal = {f"k={key[0]}": summary for key, summary in index._calibrations.summaries().items()}
    method.close()
    path = os.path.join(args.out, "aps.json")
    results = {}
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    results[args.dataset] = {"queries": n_q, "k": args.k, "fixed": fixed, "recall_target": adaptive,
                             "served_queries": args.served, "calibration": cal, "calibrate_s": calibrate_s}
    report.write_json(path, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
