"""``vindex demo``: the library alone, no server. Builds an index over a bundled data set (or
opens the one built before), runs its query set and prints recall@10 against the exact ground
truth with batch QPS and per-query latency at several settings."""
from __future__ import annotations

import os
import time

import numpy as np

from .sample import load_npz


def demo(dataset: str, data_dir: str) -> int:
    """Build (or open) an index over a bundled data set, print recall and latency per setting."""
    import vindex

    data = load_npz(dataset)
    metric = "l2" if str(data["metric"]).startswith("l2") else "cosine"
    base, queries, gt = data["base"], data["queries"], data["gt_ids"][:, :10]
    index_dir = os.path.join(data_dir, f"demo-{dataset}")
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
