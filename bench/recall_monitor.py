"""The live recall monitor under churn: its estimate against the true recall@10, each round.

    python -m bench.recall_monitor --n 100k --rounds 5
    python -m bench.recall_monitor --n 100k --rounds 5 --rebalance off

Builds vindex over the synthetic set (seed 0) with the monitor running in the background at
``--cpu`` of a core (the default 1%), then runs ``--rounds`` rounds as ``bench.churn`` does
(each deletes ``--fraction`` of the live vectors and inserts as many from new clusters),
waiting for the background to drain. After each round it searches ``--queries`` queries in
calls of 16 (as served traffic arrives) with the index's defaults (``--max-postings``),
computes their true recall@10 against exact ground truth over the live set, waits for the
monitor's next pass (paced to its CPU share: nothing makes it hurry) and records its estimate
and interval. The monitor's share is its passes' wall time over the time the index was open
(an upper bound of the CPU it used), and its own thread's CPU time over the same.
Writes ``<out>/recall_monitor-<n>-<rebalance>.json``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import shutil
import time

import numpy as np

import vindex

from . import churn, datasets, measure, report

SEARCH_CALL = 16


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="100k", help="initial size, e.g. 100k or 1m")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=10_000, help="vectors per upsert/delete call")
    ap.add_argument("--max-postings", type=int, default=16, help="the index's default, what searches use")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--cpu", type=float, default=0.01, help="recall_monitor_cpu: the monitor's share of a core")
    ap.add_argument("--rebalance", choices=["on", "off"], default="on")
    ap.add_argument("--build-threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    n = datasets.parse_count(args.n)
    k = 10
    per_round = int(n * args.fraction)
    base, queries, vectors = churn.drifting_data(n, args.dim, args.rounds, per_round, args.queries)
    rng = np.random.default_rng(0)
    work = tempfile.mkdtemp(prefix="vindex-recall-monitor-")
    rounds = []
    try:
        measure.limit_threads(args.build_threads)
        vindex.Index.build(f"{work}/i", base, build_threads=args.build_threads, progress=False,
                           max_postings=args.max_postings).close()
        measure.limit_threads(1)
        index = vindex.Index.open(f"{work}/i", rebalance=args.rebalance == "on", recall_monitor_cpu=args.cpu)
        monitor = index._monitor
        opened = time.perf_counter()
        live = np.arange(n, dtype=np.int64)
        for r in range(args.rounds + 1):
            if r:
                new_ids = n + (r - 1) * per_round + np.arange(per_round, dtype=np.int64)
                live = churn.churn_round(index, live, new_ids, vectors, rng, args.batch)
            gt, _ = datasets.ground_truth(vectors[live], queries, k, "l2")
            # the round's queries: a random draw of at most the ring's size, so a pass samples them all alike
            asked = rng.choice(queries.shape[0], size=min(queries.shape[0], 1024), replace=False)
            served = np.concatenate([index.search(queries[asked[lo:lo + SEARCH_CALL]], k).ids
                                     for lo in range(0, asked.shape[0], SEARCH_CALL)])
            true = datasets.recall_at_k(served, live[gt][asked], k)
            waited = time.perf_counter()
            monitor.wait_for_pass(monitor.began + 1)  # the first pass to start after this round's queries
            est = monitor.estimate()
            elapsed = time.perf_counter() - opened
            row = {"round": r, "live": int(live.size), "true_recall": true, "estimate": est["recall"],
                   "low": est["low"], "high": est["high"], "samples": est["samples"], "source": est["source"],
                   "error": est["recall"] - true, "waited_for_pass_s": time.perf_counter() - waited,
                   "monitor_busy_share": monitor.busy_s / elapsed, "monitor_cpu_share": monitor.cpu_s / elapsed,
                   "last_pass_s": monitor.last_pass_s}
            rounds.append(row)
            print(f"round {r}: true {true:.4f} estimate {est['recall']:.4f} [{est['low']:.4f}, {est['high']:.4f}] "
                  f"error {row['error']:+.4f}; monitor busy {row['monitor_busy_share']:.2%} of a core "
                  f"(own thread CPU {row['monitor_cpu_share']:.2%}), pass {monitor.last_pass_s:.2f} s",
                  file=sys.stderr, flush=True)
        index.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    worst = max(abs(r["error"]) for r in rounds)
    print(report.table(rounds, [("round", "round", "d"), ("true_recall", "true recall@10", ".4f"),
                                ("estimate", "estimate", ".4f"), ("low", "95% low", ".4f"), ("high", "95% high", ".4f"),
                                ("error", "error", "+.4f"), ("monitor_busy_share", "busy share", ".4f"),
                                ("monitor_cpu_share", "cpu share", ".4f")]))
    print(f"\nworst |estimate - true|: {worst:.4f}; monitor busy {rounds[-1]['monitor_busy_share']:.2%} of a core")
    out = os.path.join(args.out, f"recall_monitor-{args.n}-{args.rebalance}")
    report.write_json(out + ".json", {"meta": {"n": n, "dim": args.dim, "rounds": args.rounds,
                                               "fraction": args.fraction, "max_postings": args.max_postings,
                                               "cpu": args.cpu, "rebalance": args.rebalance,
                                               "queries_per_round": int(min(queries.shape[0], 1024)),
                                               "time": time.strftime("%Y-%m-%d %H:%M:%S")},
                                      "rounds": rounds, "worst_error": worst})
    print(f"wrote {out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
