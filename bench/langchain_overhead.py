"""What LangChain costs on top of vindex: ``VindexVectorStore.similarity_search(k=4)`` against
``Index.search(k=4, include=["documents", "metadata"])`` on the same open index, in one process.

The store's embedding is a mock that returns precomputed query vectors (as lists of floats, as a
real model's client does), so the difference is the store itself: the list-to-array conversion,
the search call and building LangChain ``Document``s. One query per call on one thread;
``--passes`` interleaved passes over the same queries (the order of the two alternates), each
pass giving both methods' median per-call latency; the figures are medians over passes and the
overhead is the median of the passes' ratios, minus 1. ``--max-postings`` gives the search
settings (the default 64, and 16, where searches are shorter and the store's share larger).

Data sets: the cached ``synthetic-1m`` index (int ids, no documents or metadata: the store
returns page_content "" and ``Document.id`` as the int's str) and the bundled wiki titles
(15,422 chunks with their titles as documents and topics as metadata, str ids).

    python -m bench.langchain_overhead            # both; --datasets synthetic-1m, wiki
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from langchain_core.embeddings import Embeddings

import vindex
from bench import datasets, measure
from vindex.integrations.langchain import VindexVectorStore
from vindex.service import sample

K = 4
INCLUDE = ["documents", "metadata"]


class PrecomputedEmbeddings(Embeddings):
    """Query ``"q<i>"`` is row ``i`` of the given queries; documents are never embedded here."""

    def __init__(self, queries: np.ndarray):
        self.vectors = {f"q{i}": row for i, row in enumerate(queries.tolist())}

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise NotImplementedError("the benchmark only searches")

    def embed_query(self, text: str) -> list[float]:
        return self.vectors[text]


def _latencies(call, n: int) -> np.ndarray:
    out = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter()
        call(i)
        out[i] = time.perf_counter() - t0
    return out


def compare(store: VindexVectorStore, queries: np.ndarray, passes: int, params: dict) -> dict:
    """Interleaved passes of the store and the index over ``queries``; medians in microseconds."""
    index = store.index
    names = [f"q{i}" for i in range(queries.shape[0])]
    methods = {
        "index_search": lambda i: index.search(queries[i], K, include=INCLUDE, **params),
        "store_similarity_search": lambda i: store.similarity_search(names[i], k=K, **params),
    }
    first = store.similarity_search_with_score(names[0], k=K, **params)
    res = index.search(queries[0], K, **params)
    # the same answer both ways
    assert [d.id for d, _ in first] == [str(i) for i in res.ids[0] if i is not None and i != -1]
    for call in methods.values():  # warm caches and code paths
        _latencies(call, min(200, len(names)))
    per_pass: dict[str, list[float]] = {m: [] for m in methods}
    order = list(methods)
    for p in range(passes):
        for m in (order if p % 2 == 0 else order[::-1]):
            per_pass[m].append(float(np.median(_latencies(methods[m], len(names)))))
    ratios = np.array(per_pass["store_similarity_search"]) / np.array(per_pass["index_search"])
    return {"index_search_us": float(np.median(per_pass["index_search"]) * 1e6),
            "store_similarity_search_us": float(np.median(per_pass["store_similarity_search"]) * 1e6),
            "overhead": float(np.median(ratios) - 1.0),
            "overhead_per_pass": [round(float(r - 1.0), 4) for r in ratios],
            "queries": int(queries.shape[0]), "passes": passes, "k": K, "search_params": params}


def _sweep(path: str, queries: np.ndarray, args) -> dict:
    """``compare`` at each ``--max-postings``, keyed ``max_postings=N``."""
    out: dict = {}
    with VindexVectorStore(PrecomputedEmbeddings(queries), path=path, rebalance=False) as store:
        out["records"] = len(store.index)
        for m in args.max_postings:
            out[f"max_postings={m}"] = compare(store, queries, args.passes, {"max_postings": m})
    return out


def synthetic_1m(args, root: str) -> dict:
    ds = datasets.load("synthetic-1m")
    cached = os.path.join(args.index_cache, ds.name)
    if not os.path.exists(os.path.join(cached, "vindex.json")):
        print(f"building {ds.name} index into {cached} ...", file=sys.stderr, flush=True)
        shutil.rmtree(cached, ignore_errors=True)
        vindex.Index.build(cached, ds.base, metric=ds.metric).close()
    path = os.path.join(root, ds.name)
    shutil.copytree(cached, path)  # a copy: nothing here may touch the shared cache
    queries = np.ascontiguousarray(ds.queries[:args.queries], dtype=np.float32)
    return _sweep(path, queries, args)


def wiki(args, root: str) -> dict:
    data = sample.load_npz("wiki")
    ids = [f"{t}#{c}" for t, c in zip(data["base_title"].tolist(), data["base_chunk"].tolist())]
    docs = [f"{t} (part {c + 1})" for t, c in zip(data["base_title"].tolist(), data["base_chunk"].tolist())]
    meta = [{"topic": str(data["topic_names"][t]), "chunk": int(c)} for t, c in zip(data["base_topic"], data["base_chunk"])]
    path = os.path.join(root, "wiki")
    vindex.Index.build(path, data["base"].astype(np.float32), ids, metadata=meta, documents=docs,
                       metric="cosine").close()
    queries = np.ascontiguousarray(data["queries"][:args.queries], dtype=np.float32)
    return _sweep(path, queries, args)


RUNS = {"synthetic-1m": synthetic_1m, "wiki": wiki}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="synthetic-1m,wiki", help=f"comma-separated, of {sorted(RUNS)}")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--passes", type=int, default=9)
    ap.add_argument("--max-postings", default="64,16", type=lambda v: [int(m) for m in v.split(",")],
                    help="comma-separated search settings (64 is the indexes' default)")
    ap.add_argument("--index-cache", default=os.path.expanduser("~/.cache/vindex-bench/indexes"))
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        ap.error(f"--datasets: unknown {unknown}; expected some of {sorted(RUNS)}")
    measure.limit_threads(1)
    vindex.warmup()
    result: dict = {"meta": {"k": K, "index_include": INCLUDE, "queries": args.queries, "passes": args.passes,
                             "max_postings": args.max_postings,
                             "cores": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}}
    root = tempfile.mkdtemp(prefix="vindex-langchain-overhead-")
    try:
        for name in names:
            result[name] = RUNS[name](args, root)
            print(f"[{name}] {json.dumps(result[name])}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "langchain_overhead.json"), "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
