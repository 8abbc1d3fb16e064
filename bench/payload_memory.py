"""Payload index memory and speed: 1M records with 5 keys (3 keyword, 2 numeric), written in
batches of 1,000 as upserts would; prints one JSON line (bench/results/payload_memory.json).

    python -m bench.payload_memory [--rows 1000000]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from vindex.filters import PayloadIndex, compile_filter


def _rows(rng: np.random.Generator, start: int, count: int) -> list[dict]:
    sources = rng.integers(0, 10_000, count)
    topics = rng.integers(0, 50, count)
    flags = rng.random(count) < 0.3
    pages = rng.integers(0, 500, count)
    scores = rng.random(count)
    return [{"source": f"doc-{s}.pdf", "topic": f"topic-{t}", "public": bool(f), "page": int(p), "score": float(x)}
            for s, t, f, p, x in zip(sources, topics, flags, pages, scores)]


def _best_ms(fn, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return round(best * 1e3, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    index = PayloadIndex()
    set_seconds = []
    for start in range(0, args.rows, args.batch):
        rows = _rows(rng, start, min(args.batch, args.rows - start))
        t = time.perf_counter()
        index.set(np.arange(start, start + len(rows)), rows)
        set_seconds.append(time.perf_counter() - t)
    n = args.rows
    filters = {
        "eq_keyword": {"topic": "topic-7"},
        "eq_bool": {"public": True},
        "range_number": {"page": {"$gte": 100, "$lt": 120}},
        "in_keyword": {"source": {"$in": [f"doc-{i}.pdf" for i in range(20)]}},
        "range_string": {"source": {"$gte": "doc-5", "$lt": "doc-6"}},
        "and_or": {"$and": [{"public": True}, {"$or": [{"topic": "topic-1"}, {"score": {"$gt": 0.9}}]}]},
    }
    mask_ms = {name: _best_ms(lambda f=compile_filter(raw): index.mask(f, n)) for name, raw in filters.items()}
    vids = rng.integers(0, n, 100)
    check_ms = _best_ms(lambda: index.check(compile_filter(filters["and_or"]), vids))
    replace = _rows(rng, 0, args.batch)
    replace_vids = rng.choice(n, args.batch, replace=False)
    replace_ms = _best_ms(lambda: index.set(replace_vids, replace))
    print(json.dumps({
        "rows": n, "keys": 5, "batch": args.batch,
        "bytes_per_record": round(index.nbytes() / n, 2),
        "set_batch_ms_median": round(float(np.median(set_seconds)) * 1e3, 3),
        "set_replace_batch_ms": replace_ms,
        "mask_ms": mask_ms,
        "check_100_vids_ms": check_ms,
    }))


if __name__ == "__main__":
    main()
