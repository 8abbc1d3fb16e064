"""Streaming benchmark: replay a big-ann-benchmarks runbook against several indexes.

    python -m bench.streaming --runbook data/runbooks/big-ann-benchmarks/clustered_runbook.yaml --dataset bigann-10k
    python -m bench.streaming --runbook data/runbooks/big-ann-benchmarks/clustered_runbook.yaml --dataset glove-100k

Each search step's ground truth is an exact search over the points live at that step. For
every method and every search-parameter setting it reports recall@10 per step and on
average, search QPS (one thread; a settled rate, and one pass's), and insert and
delete throughput. Methods: vindex, vindex with rebalancing off, faiss IVFFlat (centroids
trained on the first batch), hnswlib (mark_deleted / replace_deleted), and vindex rebuilt
from scratch before every search step (the ceiling). Runbooks with "clustered" in their
key are played over the data set's rows grouped by k-means cluster (as the runbooks' own
data sets are ordered). Writes ``<out>/streaming-<dataset>-<runbook>.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from . import datasets, measure, report, runbook
from .stream_methods import METHODS, make


def ground_truths(steps, base, queries, metric, k) -> list[np.ndarray]:
    """Exact top-k ids over the live set at every search step."""
    live = runbook.LiveSet()
    out = []
    for st in steps:
        if st.op == "search":
            ids, rows = live.arrays()
            gt, _ = datasets.ground_truth(base[rows], queries, min(k, ids.size), metric)
            out.append(ids[gt])
        else:
            live.apply(st)
    return out


#: Untimed passes before a setting's timed ones: a cheap setting's first passes after a costly
#: one run slow (for vindex and faiss IVFFlat alike), and after four both are within a few
#: percent of the rate where they settle.
WARM_PASSES = 4


def play(method, steps, base, queries, truths, metric, k, repeats: int = 3) -> dict:
    """Run ``steps`` on ``method``. At every search step, after one untimed pass at the
    largest setting, one pass per setting (in an order rotated by one each step) gives its
    recall and its single-pass QPS (``qps_single``). Then, with the method's background paused
    (so the extra passes give it no more time between write steps than that one pass does),
    each setting runs ``WARM_PASSES`` untimed passes and ``repeats`` timed ones back to back:
    ``qps`` is from their median time, the setting's steady rate. A first pass follows some
    other setting, and in the rotation the cheapest always follows the largest: vindex's
    max_postings 1 after 64 (a pass over the whole index) takes over twice its settled time,
    and faiss IVFFlat's nprobe 1 after 16 is slower too. ``repeats`` 0: ``qps`` is the first
    pass's."""
    live = runbook.LiveSet()
    method.setup(base.shape[1], metric, int(max(runbook.max_row_steps(steps), 1)))
    times = {"insert": 0.0, "delete": 0.0, "replace": 0.0}
    counts = {"insert": 0, "delete": 0, "replace": 0}
    per_step, s_i = [], 0
    for st in steps:
        if st.op == "search":
            ids, rows = live.arrays()
            method.prepare_search(ids, base[rows])
            truth = truths[s_i]
            s_i += 1
            # an untimed pass first, at the largest setting: the first search after writes
            # fetches what they wrote (vindex: the appended chunks), which would otherwise be
            # charged to whichever setting happens to run first; its time is kept apart
            sweep = method.sweep()
            t0 = time.perf_counter()
            method.search(queries, k, sweep[-1])
            row = {"step": s_i, "live": int(ids.size), "first_pass_s": time.perf_counter() - t0,
                   "settings": [None] * len(sweep)}
            # the settings in an order rotated by one each step: the background a write step
            # started winds down as the step's searches run, so a fixed order would give the
            # first settings the busiest CPU at every step
            for j in np.roll(np.arange(len(sweep)), -(s_i - 1)).tolist():
                t0 = time.perf_counter()
                found = method.search(queries, k, sweep[j])
                qps = queries.shape[0] / (time.perf_counter() - t0)
                row["settings"][j] = {"params": sweep[j], "recall": datasets.recall_at_k(found, truth, min(k, truth.shape[1])),
                                      "qps": qps, "qps_single": qps,
                                      "distances": getattr(method, "last_distances", None)}
            if repeats > 0:
                with method.paused():
                    for j in range(len(sweep)):
                        for _ in range(WARM_PASSES):
                            method.search(queries, k, sweep[j])
                        dts = []
                        for _ in range(repeats):
                            t0 = time.perf_counter()
                            method.search(queries, k, sweep[j])
                            dts.append(time.perf_counter() - t0)
                        row["settings"][j]["qps"] = queries.shape[0] / float(np.median(dts))
            per_step.append(row)
            continue
        t0 = time.perf_counter()
        getattr(method, st.op)(st.ids, base[st.rows])
        times[st.op] += time.perf_counter() - t0
        counts[st.op] += int(st.ids.size)
        live.apply(st)
    settings = [s["params"] for s in per_step[0]["settings"]] if per_step else []
    summary = []
    for j, params in enumerate(settings):
        dist = [r["settings"][j]["distances"] for r in per_step]
        summary.append({"params": params,
                        "recall": float(np.mean([r["settings"][j]["recall"] for r in per_step])),
                        "qps": float(np.median([r["settings"][j]["qps"] for r in per_step])),
                        "qps_single": float(np.median([r["settings"][j]["qps_single"] for r in per_step])),
                        "distances": float(np.mean(dist)) if None not in dist else None})
    throughput = {op: (counts[op] / times[op] if times[op] > 0 else None) for op in times}
    if per_step:  # the untimed pass's QPS, at the largest setting
        throughput["first_pass_qps"] = float(np.median([queries.shape[0] / r["first_pass_s"] for r in per_step]))
    out = {"per_step": per_step, "summary": summary, "throughput": throughput, "stats": method.stats()}
    method.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runbook", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--key", default=None, help="runbook entry (default: the first)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--search-repeats", type=int, default=3,
                    help="timed passes per setting and step, back to back after untimed ones, "
                         "with the background paused; QPS is from their median time (0: from "
                         "the recall pass alone, which follows another setting)")
    ap.add_argument("--cluster-order", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    if args.search_repeats < 0:
        ap.error("--search-repeats must be 0 or more")
    measure.limit_threads(1)

    ds = datasets.load(args.dataset)
    key, max_pts, raw = runbook.load(args.runbook, args.key)
    n = ds.base.shape[0]
    top = runbook.max_row(raw)
    factor = n / max(top, max_pts) if top > n or n > max_pts else 1.0
    steps = runbook.scaled(raw, factor)
    base = ds.base
    clustered = args.cluster_order == "on" or (args.cluster_order == "auto" and "clustered" in key)
    if clustered:
        inserts = sum(st.op == "insert" for st in steps)
        base = np.ascontiguousarray(base[runbook.cluster_order(base, max(2, inserts))])
    queries = ds.queries
    print(f"{args.dataset} n={n} d={base.shape[1]} {ds.metric}; runbook {os.path.basename(args.runbook)}:{key} "
          f"(max_pts {max_pts}, rows x{factor:g}, {'cluster-ordered rows' if clustered else 'rows as stored'}); "
          f"{len(steps)} steps, {sum(s.op == 'search' for s in steps)} searches, {queries.shape[0]} queries",
          file=sys.stderr, flush=True)
    truths = ground_truths(steps, base, queries, ds.metric, args.k)

    results = {}
    for name in args.methods.split(","):
        t0 = time.perf_counter()
        results[name] = play(make(name), steps, base, queries, truths, ds.metric, args.k, args.search_repeats)
        print(f"[{name}] {time.perf_counter() - t0:.1f} s; " + ", ".join(
            f"{s['params']}: recall {s['recall']:.4f} qps {s['qps']:.0f}" for s in results[name]["summary"]),
            file=sys.stderr, flush=True)

    rows = []
    for name, res in results.items():
        for s in res["summary"]:
            tp = res["throughput"]
            rows.append({"method": name, "params": ",".join(f"{k}={v}" for k, v in s["params"].items()),
                         "recall": s["recall"], "qps": s["qps"], "single": s["qps_single"], "dist": s["distances"], "ins": tp["insert"],
                         "dele": tp["delete"], "rep": tp["replace"], "first": tp.get("first_pass_qps")})
    print()
    print(report.table(rows, [("method", "method", "s"), ("params", "params", "s"),
                              ("recall", "avg recall@10", ".4f"), ("qps", "search QPS", ".0f"),
                              ("single", "QPS, single pass", ".0f"),
                              ("dist", "distances/query", ".0f"),
                              ("ins", "insert/s", ".0f"), ("dele", "delete/s", ".0f"), ("rep", "replace/s", ".0f"),
                              ("first", "first pass QPS", ".0f")]))
    comparison = compare(results)
    for line in comparison["lines"]:
        print(line)
    name = f"streaming-{args.dataset}-{os.path.splitext(os.path.basename(args.runbook))[0]}"
    out = os.path.join(args.out, name)
    meta = {"dataset": args.dataset, "runbook": args.runbook, "key": key, "factor": factor,
            "cluster_order": clustered, "queries": int(queries.shape[0]), "k": args.k,
            "search_repeats": args.search_repeats,
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    report.write_json(out + ".json", {"meta": meta, "results": results, "comparison": comparison["data"]})
    plot_steps(out + ".png", results, f"{args.dataset}: {os.path.basename(args.runbook)} ({key})")
    print(f"\nwrote {out}.json and {out}.png")
    return 0


def compare(results: dict) -> dict:
    """vindex's average recall at IVF's search cost, measured three ways (equal distance
    computations per query; equal steady QPS; equal single-pass QPS; each interpolated on
    vindex's curve), and its gap to the rebuilt ceiling at equal settings."""
    lines, data = [], {}
    v = results.get("vindex")
    ivf = results.get("faiss-ivfflat")
    if v and ivf:
        fmt = (lambda r: "out of range" if r is None else f"{r:.4f}")
        for s in ivf["summary"]:
            by_dist = _recall_at(v["summary"], "distances", s["distances"])
            by_qps = _recall_at(v["summary"], "qps", s["qps"])
            by_single = _recall_at(v["summary"], "qps_single", s.get("qps_single"))
            data[f"ivf nprobe={s['params']['nprobe']}"] = {
                "ivf_recall": s["recall"], "ivf_distances": s["distances"], "ivf_qps": s["qps"],
                "ivf_qps_single": s.get("qps_single"),
                "vindex_recall_at_equal_distances": by_dist, "vindex_recall_at_equal_qps": by_qps,
                "vindex_recall_at_equal_single_pass_qps": by_single}
            lines.append(f"IVF nprobe={s['params']['nprobe']}: recall {s['recall']:.4f} at {s['distances']:.0f} "
                         f"distances/query, {s['qps']:.0f} QPS ({s.get('qps_single') or 0:.0f} single pass); "
                         f"vindex at equal distances {fmt(by_dist)}, at equal QPS {fmt(by_qps)}, "
                         f"at equal single-pass QPS {fmt(by_single)}")
    ceil = results.get("vindex-rebuild")
    if v and ceil:
        for a, b in zip(v["summary"], ceil["summary"]):
            data[f"ceiling {a['params']}"] = {"vindex": a["recall"], "rebuilt": b["recall"]}
            lines.append(f"{a['params']}: vindex {a['recall']:.4f} vs rebuilt every step {b['recall']:.4f} "
                         f"(gap {b['recall'] - a['recall']:+.4f})")
    return {"lines": lines, "data": data}


def _recall_at(summary: list[dict], key: str, value: float | None) -> float | None:
    """Recall where the curve's ``key`` (qps or distances) equals ``value``, interpolated
    linearly between measured settings on the curve's frontier (a setting that another beats
    on both recall and ``key`` is one nobody would pick); None outside the measured range."""
    faster = key != "distances"  # more qps is better; fewer distances are
    pts = [dict(s, thrift=s[key] if faster else -s[key]) for s in summary if s.get(key) is not None]
    if value is None or len(pts) < 1:
        return None
    pts = sorted(report.frontier(pts, "recall", "thrift"), key=lambda s: s[key])
    for a, b in zip(pts, pts[1:]):
        if a[key] <= value <= b[key]:
            t = (value - a[key]) / (b[key] - a[key]) if b[key] != a[key] else 0.0
            return a["recall"] + t * (b["recall"] - a["recall"])
    if len(pts) == 1 and pts[0][key] == value:
        return pts[0]["recall"]
    if not faster and value > pts[-1][key]:
        return pts[-1]["recall"]  # more work than vindex's largest setting needs
    if faster and value < pts[0][key]:
        return pts[0]["recall"]   # slower than vindex's slowest setting
    return None


def plot_steps(path: str, results: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, res in results.items():
        if not res["per_step"]:
            continue
        j = len(res["per_step"][0]["settings"]) // 2
        p = res["per_step"][0]["settings"][j]["params"]
        ax.plot([r["step"] for r in res["per_step"]], [r["settings"][j]["recall"] for r in res["per_step"]],
                marker="o", ms=3, label=f"{name} ({', '.join(f'{k}={v}' for k, v in p.items())})")
    ax.set_xlabel("search step")
    ax.set_ylabel("recall@10")
    ax.grid(True, alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=8)
    report.save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
