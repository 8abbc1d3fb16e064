"""Where the time of a batch-size-1 search goes: per-stage timers and a profile.

    python -m bench.search_path --dataset wiki-minilm-15k --max-postings 32
    python -m bench.search_path --dataset synthetic-1m --index-dir ~/.cache/vindex-bench/indexes/synthetic-1m

Times ``--queries`` searches of one query each (after a warm pass over every query, as
``bench.recall_qps`` does) three ways: plain (the p50 a caller sees); with a timer wrapped
around each stage's function (the stages' share of a search; the wrappers add about a
microsecond each); and under ``cProfile`` (the functions the stages are made of). One thread.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from typing import Callable, Iterator

import numpy as np

import vindex
from vindex import heads, index as index_module, native, search as search_module
from vindex.readers import Readers
from vindex.storage import rocks

from . import datasets, measure

#: (stage, object, attribute) of the functions timed, outermost first. A stage's time excludes
#: the stages timed inside it.
STAGES = (
    ("validation", index_module.Index, "_search_args"),
    ("read section / ticket", Readers, "reading"),
    ("head search", heads.HeadGraph, "search"),
    ("fused kernel: head search + resident scan (grouping, lookup, live ids, scan, top-k, sort)",
     native.held, "search_resident"),
    ("fast path: resident scan", native.held, "scan_resident"),
    ("grouping by posting", native.held, "group_by_posting"),
    ("store read (kept lookup, multi-get, gather)", rocks.RocksStore, "read"),
    ("live-id mapping", search_module, "_parts"),
    ("scan + top-k", native.held, "scan_grouped"),
    ("sort top-k", native.held, "finish"),
    ("result object", index_module, "SearchResult"),
)


class StageTimer:
    """Wraps each stage's function with a timer; nested stages are subtracted."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.per_query: list[dict[str, float]] = []  # each query's seconds per stage
        self._stack: list[float] = []  # time spent in nested stages, per open stage
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        for stage, owner, name in STAGES:
            if not hasattr(owner, name):
                continue
            original = getattr(owner, name)
            is_cm = name == "reading"
            wrapper = self._wrap_cm(stage, original) if is_cm else self._wrap(stage, original)
            setattr(owner, name, wrapper)
            self._undo.append(lambda o=owner, n=name, f=original: setattr(o, n, f))

    def remove(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _enter(self) -> float:
        self._stack.append(0.0)
        return time.perf_counter()

    def _leave(self, stage: str, t0: float) -> None:
        spent = time.perf_counter() - t0
        inner = self._stack.pop()
        self.totals[stage] += spent - inner
        if self._stack:
            self._stack[-1] += spent

    def _wrap(self, stage: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            t0 = self._enter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._leave(stage, t0)
        return timed

    def _wrap_cm(self, stage: str, fn: Callable) -> Callable:
        """A context manager's entry and exit count, not what runs inside it."""
        timer = self

        @contextlib.contextmanager
        def timed(*args, **kwargs) -> Iterator[None]:
            t0 = timer._enter()
            cm = fn(*args, **kwargs)
            cm.__enter__()
            timer._leave(stage, t0)
            try:
                yield
            finally:
                t1 = timer._enter()
                cm.__exit__(None, None, None)
                timer._leave(stage, t1)
        return timed


def one_by_one(index: vindex.Index, queries: np.ndarray, k: int, params: dict,
               timer: "StageTimer | None" = None) -> np.ndarray:
    """Each query's latency; with ``timer``, its stages' times per query are kept too."""
    lat = np.empty(queries.shape[0])
    for i in range(queries.shape[0]):
        before = dict(timer.totals) if timer is not None else None
        t0 = time.perf_counter()
        index.search(queries[i], k, **params)
        lat[i] = time.perf_counter() - t0
        if timer is not None:
            timer.per_query.append({s: v - before.get(s, 0.0) for s, v in timer.totals.items()} | {"_total": lat[i]})
    return lat


def run(index: vindex.Index, queries: np.ndarray, k: int, params: dict, top: int) -> dict:
    index.search(queries, k, max_postings=128)  # warm: touch every posting once
    one_by_one(index, queries, k, params)
    lat = one_by_one(index, queries, k, params)
    timer = StageTimer()
    timer.install()
    try:
        t0 = time.perf_counter()
        one_by_one(index, queries, k, params, timer)
        timed_total = time.perf_counter() - t0
    finally:
        timer.remove()
    n = queries.shape[0]
    stages = {s: v / n * 1e6 for s, v in timer.totals.items()}
    other = "other Python (Index.search, search.py, the wrappers)"
    stages[other] = timed_total / n * 1e6 - sum(stages.values())
    # medians per query: on a shared machine a few preempted queries move the means a lot
    rows = [{s: q.get(s, 0.0) for s in timer.totals} for q in timer.per_query]
    for row, q in zip(rows, timer.per_query):
        row[other] = q["_total"] - sum(row.values())
    medians = {s: float(np.median([r[s] for r in rows]) * 1e6) for s in rows[0]} if rows else {}
    prof = cProfile.Profile()
    prof.enable()
    one_by_one(index, queries, k, params)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    works = [index.search(q, k, **params).stats for q in queries[:200]]
    per_query = {key: sum(w[key] for w in works) / len(works) for key in ("postings", "records_scanned")}
    return {"p50_us": float(np.median(lat) * 1e6), "mean_us": float(lat.mean() * 1e6),
            "timed_mean_us": timed_total / n * 1e6, "stages_us": stages, "stages_median_us": medians,
            "profile": out.getvalue(),
            "postings_per_query": per_query["postings"], "records_per_query": per_query["records_scanned"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--index-dir", default=None, help="open this built index instead of building one")
    ap.add_argument("--max-postings", type=int, default=32)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--top", type=int, default=25, help="profile rows shown")
    ap.add_argument("--config", default="", help="runtime options to open with, key=value,...")
    args = ap.parse_args(argv)
    measure.limit_threads(1)
    ds = datasets.load(args.dataset)
    queries = ds.queries[:args.queries]
    runtime = {k: int(v) for k, _, v in (kv.partition("=") for kv in args.config.split(",") if kv)}
    with tempfile.TemporaryDirectory(prefix="vindex-path-") as tmp:
        path = args.index_dir or os.path.join(tmp, "index")
        if args.index_dir is None:
            vindex.Index.build(path, ds.base, metric=ds.metric, progress=False).close()
        runtime.setdefault("cache_bytes", 1 << 30)
        with vindex.Index.open(path, **runtime) as index:
            res = run(index, queries, args.k, {"max_postings": args.max_postings}, args.top)
            stats = index.stats()
    print(f"{args.dataset}, max_postings {args.max_postings}, {queries.shape[0]} queries one by one: "
          f"p50 {res['p50_us']:.0f} us, mean {res['mean_us']:.0f} us ({res['postings_per_query']:.1f} postings, "
          f"{res['records_per_query']:.0f} records a query); kept postings "
          f"{stats['store'].get('kept_bytes', 0) / 2**20:.0f} MiB")
    print(f"\nper stage, us a query, mean and median (timed run: mean {res['timed_mean_us']:.0f} us):")
    for stage, us in sorted(res["stages_us"].items(), key=lambda kv: -kv[1]):
        print(f"  {us:7.1f}  {res['stages_median_us'].get(stage, float('nan')):7.1f}  {stage}")
    print("\n" + res["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
