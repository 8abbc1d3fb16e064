"""The ``vindex`` command line.

``vindex demo`` builds an index over a bundled data set (or opens the one built before), runs
its query set, and prints recall@10 against the exact ground truth and per-query latency.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

DEMO_SETS = {
    "wiki": "wiki-minilm-15k-cos.npz",
    "bigann": "bigann-10k-u8-l2.npz",
    "glove": "glove-6b-50d-100k-angular.npz",
}


def _data_dir() -> str:
    return os.environ.get("VINDEX_DATA_DIR") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


def demo(args: argparse.Namespace) -> int:
    import vindex

    path = os.path.join(_data_dir(), DEMO_SETS[args.dataset])
    if not os.path.exists(path):
        print(f"vindex demo: bundled data set not found at {path} (set VINDEX_DATA_DIR)", file=sys.stderr)
        return 2
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    metric = "l2" if str(data["metric"]).startswith("l2") else "cosine"
    base, queries, gt = data["base"], data["queries"], data["gt_ids"][:, :10]
    index_dir = os.path.join(args.data, f"demo-{args.dataset}")
    t0 = time.perf_counter()
    vindex.warmup()
    print(f"kernels ready in {time.perf_counter() - t0:.1f} s")
    if os.path.exists(os.path.join(index_dir, "vindex.json")):
        index = vindex.Index.open(index_dir)
        print(f"opened {index_dir}: {len(index)} vectors")
    else:
        t0 = time.perf_counter()
        index = vindex.Index.build(index_dir, base, metric=metric)
        print(f"built {index_dir}: {len(index)} x {index.dim} {metric} vectors in "
              f"{time.perf_counter() - t0:.1f} s")
    with index:
        st = index.stats()
        print(f"{st['heads']} heads, mean posting {st['posting_mean']:.1f} vectors, "
              f"{st['replicas_mean']:.2f} replicas per vector")
        print(f"\n{'max_postings':>12} {'recall@10':>10} {'batch QPS':>10} {'p50 ms':>8} {'p99 ms':>8}")
        for m in (4, 8, 16, 32, 64):
            t0 = time.perf_counter()
            ids, _ = index.search(queries, 10, max_postings=m)
            batch = len(queries) / (time.perf_counter() - t0)
            lat = []
            for q in queries[:300]:
                t0 = time.perf_counter()
                index.search(q, 10, max_postings=m)
                lat.append(time.perf_counter() - t0)
            hits = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(ids, gt)]
            print(f"{m:>12} {np.mean(hits) / 10:>10.4f} {batch:>10.0f} "
                  f"{np.percentile(lat, 50) * 1e3:>8.3f} {np.percentile(lat, 99) * 1e3:>8.3f}")
        if "base_title" in data:
            q = 0
            ids, dists = index.search(queries[q], 5)
            print(f"\nquery: {str(data['query_title'][q])!r}")
            for i, d in zip(ids[0], dists[0]):
                print(f"  {d:.3f}  {data['base_title'][i]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vindex", description="vindex: updatable disk-resident ANN index")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="build an index on a bundled data set and query it")
    d.add_argument("--dataset", choices=sorted(DEMO_SETS), default="wiki")
    d.add_argument("--data", default="./vindex-data", help="directory for index data (default ./vindex-data)")
    d.set_defaults(func=demo)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
