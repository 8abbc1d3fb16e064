"""Where a churned index loses recall against a fresh build: the head graph or the placement.

    python -m bench.placement --n 1m
    python -m bench.placement --n 1m --build '{"reassign_neighbors": 128}' --open '{"scrub_ratio": 2.0}'

Runs ``bench.churn``'s rounds (rebalancing on only; same data, same deletes), then builds
fresh over the final live set, and reports for both: recall@10 at ``--max-postings`` with the
default head-graph beam and a near-exact one (``ef`` 1024); how often the graph's nearest
heads are the exact ones; the share of live vectors held by the posting of their exact
nearest head (overall and by the round that inserted them, -1 for the original vectors);
and for those that are not, how much farther their home head is than the nearest, and
whether the home posting is among the ``reassign_neighbors`` heads nearest the nearest head
(where a split of it would have looked). Reads index internals: a diagnostic, not an API
example. Writes ``<out>/placement-<n>.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import faiss
import numpy as np

from vindex import native
import vindex
from vindex.storage import IOClass, records

from . import datasets, measure, report, synthetic
from .churn import churn_round


def held_pairs(index: vindex.Index, pids: np.ndarray, dim: int) -> np.ndarray:
    """Sorted ``pid << 32 | vid`` of every record the postings ``pids`` hold."""
    out = []
    for lo in range(0, pids.size, 2048):
        part = pids[lo:lo + 2048]
        batch = index._engine.store.read(part, IOClass.BACKGROUND)
        _, words = records.view(batch.data, dim)
        out.append(np.repeat(part, np.diff(batch.offsets)) << 32 | words[:batch.offsets[-1], 0].astype(np.int64))
    return np.unique(np.concatenate(out))


def diagnose(index: vindex.Index, vectors: np.ndarray, live: np.ndarray, age: np.ndarray,
             queries: np.ndarray, truth: np.ndarray, m: int, neighbors: int) -> dict:
    out: dict = {}
    for ef in (None, 1024):
        res = index.search(queries, 10, max_postings=m, ef=ef)
        out["recall" if ef is None else "recall_ef1024"] = datasets.recall_at_k(res.ids, truth, 10)
        out["scanned" if ef is None else "scanned_ef1024"] = res.stats["records_scanned"] / queries.shape[0]
    graph = index._engine.state.graph
    alive = np.flatnonzero(graph.alive[:graph.n])
    heads = np.ascontiguousarray(graph.vectors[alive], dtype=np.float32)
    flat = faiss.IndexFlatL2(heads.shape[1])
    flat.add(heads)
    _, exact = flat.search(queries, m)
    found, _, _ = graph.search(queries, native.L2, m, np.inf, max(m, 32))
    out["head_recall"] = float(np.mean([len(set(a) & set(alive[b])) / m for a, b in zip(found, exact)]))
    x = np.ascontiguousarray(vectors[live], dtype=np.float32)
    _, nearest = flat.search(x, 1)
    nearest = alive[nearest[:, 0]]
    vids = index._engine.state.idmap.live_vids(live).astype(np.int64)
    inside = np.isin(nearest << 32 | vids, held_pairs(index, alive, heads.shape[1]))
    out["in_nearest_posting"] = float(inside.mean())
    out["in_nearest_posting_by_round"] = {int(a): float(inside[age == a].mean()) for a in np.unique(age)}
    home = index._engine.state.idmap.home[vids].astype(np.int64)
    off = np.flatnonzero(~inside & (home >= 0))
    if off.size:
        ratio = (np.linalg.norm(x[off] - graph.vectors[home[off]], axis=1)
                 / np.maximum(np.linalg.norm(x[off] - graph.vectors[nearest[off]], axis=1), 1e-12))
        out["outside_home_over_nearest_p10_p50_p90"] = [float(np.percentile(ratio, q)) for q in (10, 50, 90)]
        sample = off[:20_000]
        _, around = flat.search(np.ascontiguousarray(graph.vectors[nearest[sample]], dtype=np.float32), neighbors + 1)
        out["outside_home_near_nearest"] = float(np.mean((alive[around] == home[sample, None]).any(axis=1)))
    s = index.stats()
    out.update({key: s[key] for key in ("heads", "posting_mean", "replicas_mean")})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1m")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--max-postings", type=int, default=16)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--build", default="{}", help="JSON config for the churned index's build")
    ap.add_argument("--open", default="{}", help="JSON runtime config for the churned index")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    n = datasets.parse_count(args.n)
    per_round = int(n * args.fraction)
    base, q0, _ = synthetic.load_cached(n, 128, 0)
    news = [synthetic.make(per_round, 128, n_queries=max(1, args.queries // 10), seed=101 + r)
            for r in range(args.rounds)]
    queries = np.concatenate([q0[: args.queries]] + [q for _, q in news]).astype(np.float32)
    vectors = np.concatenate([np.asarray(base)] + [x for x, _ in news])
    work = tempfile.mkdtemp(prefix="vindex-placement-")
    threads = os.cpu_count() or 1
    try:
        measure.limit_threads(threads)
        vindex.Index.build(f"{work}/on", vectors[:n], build_threads=threads, progress=False,
                           **json.loads(args.build)).close()
        measure.limit_threads(1)
        index = vindex.Index.open(f"{work}/on", **json.loads(args.open))
        neighbors = index.config.reassign_neighbors
        live = np.arange(n, dtype=np.int64)
        rng = np.random.default_rng(0)
        for r in range(args.rounds):  # as bench.churn: delete, then upsert, then drain
            new_ids = n + r * per_round + np.arange(per_round, dtype=np.int64)
            live = churn_round(index, live, new_ids, vectors, rng, args.batch)
            print(f"round {r + 1} done", file=sys.stderr, flush=True)
        gt, _ = datasets.ground_truth(vectors[live], queries, 10, "l2")
        truth = live[gt]
        age = np.where(live < n, -1, (live - n) // per_round)
        result = {"meta": {"n": n, "rounds": args.rounds, "max_postings": args.max_postings,
                           "build": json.loads(args.build), "open": json.loads(args.open)}}
        result["churned"] = diagnose(index, vectors, live, age, queries, truth, args.max_postings, neighbors)
        index.close()
        measure.limit_threads(threads)
        fresh = vindex.Index.build(f"{work}/fresh", vectors[live], live, build_threads=threads, progress=False)
        measure.limit_threads(1)
        result["fresh"] = diagnose(fresh, vectors, live, age, queries, truth, args.max_postings, neighbors)
        fresh.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name in ("churned", "fresh"):
        d = result[name]
        print(f"{name}: recall {d['recall']:.4f} (ef 1024: {d['recall_ef1024']:.4f}), head recall "
              f"{d['head_recall']:.4f}, in nearest posting {d['in_nearest_posting']:.4f}", flush=True)
    report.write_json(os.path.join(args.out, f"placement-{args.n}.json"), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
