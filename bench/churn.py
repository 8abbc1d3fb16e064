"""Churn benchmark: recall under heavy, drifting updates, with rebalancing on and off.

    python -m bench.churn --n 1m
    python -m bench.churn --n 100k --rounds 5     # a quicker look

Builds vindex over the synthetic set (seed 0), then runs ``--rounds`` rounds; each deletes
``--fraction`` of the live vectors at random and upserts as many new ones drawn from a
synthetic distribution with another seed (new clusters: the data drifts). After every round,
with the background drained, it measures recall@10 at fixed search parameters against exact
ground truth over the live set, for an index with rebalancing on and a copy with it off,
and finally for a fresh build over the final live set. Queries mix the original
distribution with every new one. Writes ``<out>/churn-<n>.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

import vindex

from . import datasets, measure, report, synthetic


def evaluate(index: vindex.Index, queries: np.ndarray, truth: np.ndarray, settings: list[int], k: int) -> list[dict]:
    out = []
    for m in settings:
        index.search(queries[:100], k, max_postings=m)
        t0 = time.perf_counter()
        res = index.search(queries, k, max_postings=m)
        dt = time.perf_counter() - t0
        out.append({"max_postings": m, "recall": datasets.recall_at_k(res.ids, truth, k),
                    "qps": queries.shape[0] / dt,
                    "distances": res.stats["records_scanned"] / queries.shape[0]})
    return out


def drifting_data(n: int, dim: int, rounds: int, per_round: int, n_queries: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(base, queries, vectors)``: the synthetic set (seed 0), then ``per_round`` vectors of
    new clusters per round (row ``i`` of ``vectors`` holds id ``i``); queries mix the original
    distribution with every new one."""
    base, q0, _ = synthetic.load_cached(n, dim, 0)
    base = np.asarray(base)
    news = [synthetic.make(per_round, dim, n_queries=max(1, n_queries // 10), seed=101 + r) for r in range(rounds)]
    queries = np.concatenate([q0[:n_queries]] + [q for _, q in news]).astype(np.float32)
    return base, queries, np.concatenate([base] + [x for x, _ in news])


def churn_round(index: vindex.Index, live: np.ndarray, new_ids: np.ndarray, vectors: np.ndarray,
                rng: np.random.Generator, batch: int) -> np.ndarray:
    """Delete as many random live ids as ``new_ids``, upsert those, drain; the new live ids."""
    kill = rng.choice(live, new_ids.size, replace=False)
    for lo in range(0, kill.size, batch):
        index.delete(kill[lo:lo + batch])
    for lo in range(0, new_ids.size, batch):
        index.upsert(new_ids[lo:lo + batch], vectors[new_ids[lo:lo + batch]])
    index.wait_idle()
    return np.union1d(np.setdiff1d(live, kill), new_ids)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1m", help="initial size, e.g. 1m or 100k")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=10_000, help="vectors per upsert/delete call")
    ap.add_argument("--max-postings", default="16,32,64")
    ap.add_argument("--queries", type=int, default=1000, help="queries from the original distribution")
    ap.add_argument("--build-threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    settings = [int(x) for x in args.max_postings.split(",")]
    n = datasets.parse_count(args.n)
    k = 10
    per_round = int(n * args.fraction)

    base, queries, vectors = drifting_data(n, args.dim, args.rounds, per_round, args.queries)
    work = tempfile.mkdtemp(prefix="vindex-churn-")
    try:
        measure.limit_threads(args.build_threads)
        t0 = time.perf_counter()
        vindex.Index.build(f"{work}/on", base, build_threads=args.build_threads, progress=False).close()
        build_s = time.perf_counter() - t0
        shutil.copytree(f"{work}/on", f"{work}/off")
        measure.limit_threads(1)
        idx = {"on": vindex.Index.open(f"{work}/on"), "off": vindex.Index.open(f"{work}/off", rebalance=False)}
        live = np.arange(n, dtype=np.int64)
        rng = np.random.default_rng(0)
        rounds = []
        for r in range(args.rounds + 1):
            if r:
                kill = rng.choice(live, per_round, replace=False)
                new_ids = n + (r - 1) * per_round + np.arange(per_round, dtype=np.int64)
                timing = {}
                for name, index in idx.items():
                    t0 = time.perf_counter()
                    for lo in range(0, per_round, args.batch):
                        index.delete(kill[lo:lo + args.batch])
                    t1 = time.perf_counter()
                    for lo in range(0, per_round, args.batch):
                        ids = new_ids[lo:lo + args.batch]
                        index.upsert(ids, vectors[ids])
                    t2 = time.perf_counter()
                    index.wait_idle()
                    timing[name] = {"delete_per_s": per_round / (t1 - t0), "upsert_per_s": per_round / (t2 - t1),
                                    "drain_s": time.perf_counter() - t2}
                live = np.union1d(np.setdiff1d(live, kill), new_ids)
            else:
                timing = {}
            gt, _ = datasets.ground_truth(vectors[live], queries, k, "l2")
            truth = live[gt]
            row = {"round": r, "live": int(live.size), "timing": timing}
            for name, index in idx.items():
                row[name] = evaluate(index, queries, truth, settings, k)
                s = index.stats()
                row[name + "_stats"] = {key: s[key] for key in ("heads", "posting_mean", "posting_max",
                                                                 "postings_over_limit", "splits", "merges",
                                                                 "reassigns", "gc", "drops",
                                                                 "replicas_mean")}
            rounds.append(row)
            print(f"round {r}: live {live.size}; " + "; ".join(
                f"{name}: " + ", ".join(f"m={e['max_postings']} {e['recall']:.4f}" for e in row[name])
                for name in idx), file=sys.stderr, flush=True)
        for index in idx.values():
            index.close()
        measure.limit_threads(args.build_threads)
        fresh = vindex.Index.build(f"{work}/fresh", vectors[live], live, build_threads=args.build_threads,
                                   progress=False)
        measure.limit_threads(1)
        final = evaluate(fresh, queries, truth, settings, k)
        fresh_stats = {key: fresh.stats()[key] for key in ("heads", "posting_mean", "posting_max", "replicas_mean")}
        fresh.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    last = rounds[-1]
    table = []
    for j, m in enumerate(settings):
        table.append({"m": m, "on": last["on"][j]["recall"], "off": last["off"][j]["recall"],
                      "fresh": final[j]["recall"], "gap_on": final[j]["recall"] - last["on"][j]["recall"],
                      "gap_off": final[j]["recall"] - last["off"][j]["recall"],
                      "d_on": last["on"][j]["distances"], "d_off": last["off"][j]["distances"],
                      "d_fresh": final[j]["distances"]})
    print(f"\nchurn: synthetic {n} x {args.dim}, {args.rounds} rounds of {args.fraction:.0%} deleted + "
          f"as many inserted from new clusters; build {build_s:.1f} s\n")
    print(report.table(table, [("m", "max_postings", "d"), ("on", "recall on", ".4f"), ("off", "recall off", ".4f"),
                               ("fresh", "fresh build", ".4f"), ("gap_on", "fresh - on", "+.4f"),
                               ("gap_off", "fresh - off", "+.4f"), ("d_on", "dist/q on", ".0f"),
                               ("d_off", "dist/q off", ".0f"), ("d_fresh", "dist/q fresh", ".0f")]))
    out = os.path.join(args.out, f"churn-{args.n}")
    report.write_json(out + ".json", {"meta": {"n": n, "dim": args.dim, "rounds": args.rounds,
                                               "fraction": args.fraction, "build_s": build_s,
                                               "queries": int(queries.shape[0]),
                                               "time": time.strftime("%Y-%m-%d %H:%M:%S")},
                                      "rounds": rounds, "fresh": final, "fresh_stats": fresh_stats,
                                      "summary": table})
    plot(out + ".png", rounds, final, settings)
    print(f"\nwrote {out}.json and {out}.png")
    return 0


def plot(path: str, rounds: list[dict], final: list[dict], settings: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["round"] for r in rounds]
    for j, m in enumerate(settings):
        line, = ax.plot(xs, [r["on"][j]["recall"] for r in rounds], marker="o", ms=3, label=f"rebalancing on, m={m}")
        ax.plot(xs, [r["off"][j]["recall"] for r in rounds], ls="--", marker="x", ms=3, color=line.get_color(),
                label=f"rebalancing off, m={m}")
        ax.axhline(final[j]["recall"], ls=":", color=line.get_color(), lw=1)
    ax.set_xlabel("churn round (10% deleted + 10% new clusters)")
    ax.set_ylabel("recall@10")
    ax.set_title("recall under churn (dotted: fresh build on the final live set)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    report.save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
