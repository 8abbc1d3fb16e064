"""Filtered search: recall@10 against exact filtered truth and QPS, vindex beside faiss IVFFlat with
an IDSelectorBitmap, hnswlib with a filter function and exact filtered brute force, in one run;
and the upsert rate with metadata against without.

    python -m bench.filtered                       # wiki-minilm-15k and glove-100k, all engines
    python -m bench.filtered --quick               # a small smoke run
    python -m bench.filtered --mode upsert
    python -m bench.filtered --markdown bench/results/filtered.json   # the docs tables again

Filters (bench.filter_workload): uniform labels at 50%, 10%, 1%, 0.1%, 0.01%, a numeric range
(~5%), on wiki the real topic, and a k-means cluster far from each query. Every engine is searched
one query per call on one thread (the RAG case); a setting's QPS is the median over ``--repeats``
passes over the queries (fewer once ``--budget`` seconds of passes are spent). Sweeps stop once
recall reaches ``--max-recall``, but never before the setting that gives recall 0.95 unfiltered.
The summary takes, per filter, vindex at the setting that gives 0.95 unfiltered: its recall and
QPS, faiss's and hnswlib's QPS at that same recall (interpolated on their curves), the ratios and
brute force's QPS. Writes ``<out>/filtered.json``; prints the tables docs/benchmarks.md quotes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from bench import datasets, filter_workload, filtered_truth, measure, report
from bench.filtered_engines import ENGINES, Unsupported
from bench import filtered_upsert
from bench.peers import _prepare

UNFILTERED_TARGET = 0.95
ROW_COLUMNS = [("engine", "engine", "s"), ("case", "filter", "s"), ("params", "params", "s"),
               ("recall", "recall@10", ".4f"), ("qps", "QPS", ".0f")]


@dataclass
class Loaded:
    """One data set as the benchmark uses it: vectors prepared for the metric, and its workload."""

    name: str
    base: np.ndarray
    queries: np.ndarray
    metric: str
    work: filter_workload.Workload


def load_workload(name: str, args) -> Loaded:
    """Data set ``name`` (``--base-rows``, ``--queries`` of it) with its metadata and filters."""
    ds = datasets.load(name)
    n = min(args.base_rows or ds.n, ds.n)
    base, queries = _prepare(ds.base[:n], ds.metric), _prepare(ds.queries[:args.queries], ds.metric)
    extra = {}
    if name.startswith("wiki"):
        with np.load(datasets.DATA_DIR / "wiki-minilm-15k-cos.npz") as z:
            extra = {"topics": z["base_topic"][:n].astype(np.int64), "topic_names": z["topic_names"].tolist(),
                     "chunks": z["base_chunk"][:n], "titles": z["base_title"][:n].tolist()}
    work = filter_workload.make(base, queries, ds.metric, n_clusters=args.clusters, seed=args.seed, **extra)
    return Loaded(name, base, queries, ds.metric, work)


def time_passes(engine, queries: np.ndarray, k: int, repeats: int, budget: float) -> float:
    """Median QPS over up to ``repeats`` one-query-per-call passes, stopping once ``budget``
    seconds of passes are spent (at least one pass)."""
    rates, spent = [], 0.0
    clock = time.perf_counter
    while len(rates) < max(1, repeats) and (not rates or spent < budget):
        t0 = clock()
        for i in range(len(queries)):
            engine.search_one(queries[i], i, k)
        dt = clock() - t0
        spent += dt
        rates.append(len(queries) / dt)
    return statistics.median(rates)


def sweep_case(engine, case, queries, truth, args, floor: int) -> list[dict]:
    """The engine's rows (params, recall, qps) over its sweep for one filter case."""
    engine.prepare(case)
    rows = []
    for si, params in enumerate(engine.sweep()):
        engine.set_params(params)
        found = np.stack([engine.search_one(queries[i], i, args.k) for i in range(len(queries))])
        rec = filtered_truth.recall(found, truth)
        qps = time_passes(engine, queries, args.k, args.repeats, args.budget)
        row = {"engine": engine.name, "case": case.name, "setting": si,
               "params": ",".join(f"{k}={v}" for k, v in params.items()), "recall": rec, "qps": qps}
        rows.append(row)
        print(report.table([row], ROW_COLUMNS).splitlines()[-1], file=sys.stderr, flush=True)
        if rec >= args.max_recall and si >= floor:
            break
    return rows


def run_engine(name: str, base, queries, metric, work, truths, args, workdir) -> dict:
    """Build engine ``name`` and sweep it over every filter case; ``{"skipped": why}`` if it cannot run."""
    engine = ENGINES[name](args.build_threads, os.path.join(workdir, "vindex"), args.config, args.include)
    print(f"[{name}] building on {args.build_threads} thread(s) ...", file=sys.stderr, flush=True)
    measure.limit_threads(args.build_threads)
    t0 = time.perf_counter()
    try:
        engine.build(base, metric, work)
    except Unsupported as e:
        print(f"[{name}] skipped: {e}", file=sys.stderr, flush=True)
        return {"skipped": str(e)}
    finally:
        measure.limit_threads(1)
    out = {"build_s": time.perf_counter() - t0, "cases": {}}
    if hasattr(engine, "warm"):
        engine.warm(queries)
    floor = 0
    try:
        for case, truth in zip(work.cases, truths):
            rows = sweep_case(engine, case, queries, truth, args, floor)
            out["cases"][case.name] = rows
            if case.kind == "none":  # later cases sweep at least up to the 0.95-unfiltered setting
                floor = next((r["setting"] for r in rows if r["recall"] >= UNFILTERED_TARGET), len(rows))
    finally:
        engine.close()
    out["setting_at_0.95_unfiltered"] = floor
    return out


def summarize(cases, engines: dict) -> list[dict]:
    """Per filter case: vindex at its 0.95-unfiltered setting; the peers' QPS at the same recall."""
    rows = []
    vx = engines.get("vindex", {})
    for case in cases:
        row = {"case": case.name, "selectivity": case.selectivity, "min_matches": int(case.matches().min())}
        target = UNFILTERED_TARGET
        if "cases" in vx:
            at = next((r for r in vx["cases"][case.name] if r["setting"] == vx["setting_at_0.95_unfiltered"]), None)
            if at is not None:
                row.update(vindex_params=at["params"], vindex_recall=at["recall"], vindex_qps=at["qps"])
                target = at["recall"]
        row["target_recall"] = target
        for name, key in (("faiss-ivfflat", "faiss"), ("hnswlib", "hnswlib")):
            res = engines.get(name, {})
            if "cases" in res:
                pts = res["cases"][case.name]
                row[f"{key}_qps"] = report.at_recall(pts, target)
                row[f"{key}_max_recall"] = max(p["recall"] for p in pts)
                if row.get("vindex_qps") and row[f"{key}_qps"]:
                    row[f"x_{key}"] = row["vindex_qps"] / row[f"{key}_qps"]
        bf = engines.get("brute-force", {})
        if "cases" in bf:
            row["brute_qps"] = bf["cases"][case.name][0]["qps"]
            if row.get("vindex_qps"):
                row["x_brute"] = row["vindex_qps"] / row["brute_qps"]
        rows.append(row)
    return rows


SUMMARY_COLUMNS = [("case", "filter", "s"), ("selectivity", "share", ".4%"), ("min_matches", "min rows", "d"),
                   ("vindex_params", "vindex at 0.95 unfiltered", "s"), ("vindex_recall", "vindex recall", ".3f"),
                   ("vindex_qps", "vindex QPS", ".0f"), ("target_recall", "at recall", ".3f"),
                   ("faiss_qps", "faiss QPS", ".0f"), ("x_faiss", "x faiss", ".2f"),
                   ("faiss_max_recall", "faiss best recall", ".3f"), ("hnswlib_qps", "hnswlib QPS", ".0f"),
                   ("hnswlib_max_recall", "hnswlib best recall", ".3f"), ("brute_qps", "brute QPS", ".0f"),
                   ("x_brute", "x brute", ".2f")]


def markdown(summary: list[dict], columns=SUMMARY_COLUMNS) -> str:
    """The summary as a markdown table (n/a where an engine did not run or never got there)."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |",
             "|" + "|".join("---" if f == "s" else "---:" for _, _, f in columns) + "|"]
    for r in summary:
        lines.append("| " + " | ".join("n/a" if r.get(k) is None else format(r[k], f) for k, _, f in columns) + " |")
    return "\n".join(lines)


def docs_markdown(result: dict) -> str:
    """The tables docs/benchmarks.md quotes: each data set's summary, then the upsert rates."""
    parts, upserts = [], []
    for name, ds in result["datasets"].items():
        if "search" in ds:
            parts.append(f"{name} ({ds['n']:,} x {ds['dim']}, {ds['metric']}, {ds['queries']} queries):\n\n"
                         + markdown(ds["search"]["summary"]))
        if "upsert" in ds:
            upserts.append({"dataset": name, **ds["upsert"]})
    if upserts:
        cols = [("dataset", "data set", "s"), ("rows", "rows", "d"), ("batch", "batch", "d"),
                ("plain_rows_s", "rows/s without metadata", ".0f"),
                ("metadata_rows_s", "rows/s with 5 keys + 500-byte document", ".0f"), ("ratio", "ratio", ".2f"),
                ("columns_rows_s", "rows/s, the same as columns", ".0f"), ("columns_ratio", "ratio", ".2f"),
                ("plain_cpu_us_row", "CPU µs/row without", ".1f"), ("metadata_cpu_us_row", "with", ".1f"),
                ("columns_cpu_us_row", "as columns", ".1f")]
        parts.append(markdown([_floored(r, cols) for r in upserts], cols))
    return "\n\n".join(parts)


def _floored(row: dict, columns: list[tuple[str, str, str]]) -> dict:
    """``row`` with its floats cut (never rounded up) to the decimals their column shows."""
    out = dict(row)
    for key, _, fmt in columns:
        if isinstance(out.get(key), float) and fmt.startswith("."):
            scale = 10 ** int(fmt[1:-1])
            out[key] = math.floor(out[key] * scale) / scale
    return out


def run_search(ds: Loaded, args) -> dict:
    """Every engine over every filter case of ``ds``: rows, summary and the cases' description."""
    base, queries, metric, work = ds.base, ds.queries, ds.metric, ds.work
    measure.limit_threads(args.build_threads)
    truths = [filtered_truth.exact(base, queries, metric, c, args.k) for c in work.cases]
    measure.limit_threads(1)
    engines = {}
    with tempfile.TemporaryDirectory(prefix="vindex-filtered-") as workdir:
        for e in args.engines:
            engines[e] = run_engine(e, base, queries, metric, work, truths, args, workdir)
    summary = summarize(work.cases, engines)
    print(f"\n{ds.name}\n" + markdown(summary), flush=True)
    return {"cases": [{"name": c.name, "kind": c.kind, "selectivity": c.selectivity,
                       "filter_example": c.filters[int(c.which[0])],
                       "min_matches": int(c.matches().min())} for c in work.cases],
            "engines": engines, "summary": summary}


QUICK = {"datasets": ["wiki-minilm-15k"], "base_rows": 2000, "queries": 12, "repeats": 1, "budget": 0.2,
         "clusters": 20, "upsert_rows": 1000, "upsert_repeats": 1}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("all", "search", "upsert"), default="all")
    ap.add_argument("--datasets", default="wiki-minilm-15k,glove-100k", help="comma-separated")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--queries", type=int, default=200, help="the first N queries of each data set")
    ap.add_argument("--base-rows", type=int, default=0, help="only the first N base rows (0: all)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per setting (median)")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timed passes after which a setting stops repeating")
    ap.add_argument("--max-recall", type=float, default=0.995, help="stop a sweep once reached")
    ap.add_argument("--clusters", type=int, default=100, help="k-means clusters for the far-cluster filter")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--build-threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--config", default="", help="vindex config as key=value,key=value")
    ap.add_argument("--include", default="", help="vindex search include=, e.g. documents,metadata "
                    "(the peers return ids only)")
    ap.add_argument("--upsert-rows", type=int, default=100_000,
                    help="rows upserted per timed run (at most the data set's)")
    ap.add_argument("--upsert-batch", type=int, default=1000)
    ap.add_argument("--upsert-repeats", type=int, default=3, help="fresh-index runs per variant (median)")
    ap.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK}")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--markdown", metavar="JSON", help="only print the docs tables of a result file")
    args = ap.parse_args(argv)
    args.datasets = [d for d in args.datasets.split(",") if d]
    args.engines = [e for e in args.engines.split(",") if e]
    args.include = tuple(f for f in args.include.split(",") if f)
    unknown = [e for e in args.engines if e not in ENGINES]
    if unknown:
        ap.error(f"unknown engine(s) {', '.join(unknown)}; valid: {', '.join(ENGINES)}")
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    from bench.recall_qps import _parse_kv

    args.config = dict(_parse_kv(kv) for kv in args.config.split(",") if kv)
    return args


def keep_other_mode(path: str, result: dict) -> None:
    """Carry over from the result file at ``path`` what this run did not measure: the other
    mode's results (a search run keeps the last upsert rates, and the reverse) and the data
    sets it did not run."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        old = json.load(f).get("datasets", {})
    for name, was in old.items():
        ds = result["datasets"].setdefault(name, was)
        for mode in ("search", "upsert"):
            if mode not in ds and mode in was:
                ds[mode] = was[mode]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            print(docs_markdown(json.load(f)))
        return 0
    result = {"meta": {"k": args.k, "queries": args.queries, "repeats": args.repeats, "budget_s": args.budget,
                       "search_threads": 1, "build_threads": args.build_threads, "quick": args.quick,
                       "vindex_config": args.config,
                       "vindex_include": list(args.include), "time": time.strftime("%Y-%m-%d %H:%M:%S")}}
    result["datasets"] = {}
    for name in args.datasets:
        ds = load_workload(name, args)
        print(f"\n{name}: n={ds.base.shape[0]} d={ds.base.shape[1]} metric={ds.metric} "
              f"queries={len(ds.queries)}", file=sys.stderr, flush=True)
        out = result["datasets"][name] = {"n": int(ds.base.shape[0]), "dim": int(ds.base.shape[1]),
                                          "metric": ds.metric, "queries": int(len(ds.queries))}
        if args.mode in ("all", "search"):
            out["search"] = run_search(ds, args)
        if args.mode in ("all", "upsert"):
            out["upsert"] = filtered_upsert.run(ds.base, ds.metric, ds.work.metadata, ds.work.documents,
                                                rows=args.upsert_rows, batch=args.upsert_batch,
                                                repeats=args.upsert_repeats)
    path = os.path.join(args.out, "filtered-quick.json" if args.quick else "filtered.json")
    keep_other_mode(path, result)
    report.write_json(path, result)
    print("\n" + docs_markdown(result))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
