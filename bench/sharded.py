"""Sharded collections on Ray against one Index, in the same run.

    python -m bench.sharded --dataset synthetic-1m

1. Ingest: the same rows upserted in batches of ``--batch`` by ``--writers`` threads into one
   ``vindex.Index`` and into a ``ShardedIndex`` of ``--shards`` shards (1 replica), in turns
   of ``--chunk`` rows (the shared machine's load falls on both alike), each settling its
   background rebalancing in its own turn: rows/s of the upserts, and with the settling.
2. Batch search QPS (all queries in one call) over a sweep of ``max_postings``, recall@10,
   and the QPS of each at recall ``--target`` (interpolated on the frontier).
3. Batch-size-1 p50/p99 of the sharded collection idle, then while another thread upserts
   flat out (one Index's too, for reference).
4. Congruence: a collection of ``--congruence-n`` rows sharded and as one Index, every
   posting read: identical ids, and distances (to the last few bits: see ``congruence``).
5. Faults: ``--kills`` random actor kills (Ray restarts them) while ``--kill-rows`` rows are
   ingested into ``--shards`` x 2 replicas: acknowledged writes lost (must be 0).
``--parts`` runs some of these (``ingest,search,latency,congruence,faults``; search and
latency need ingest). Writes ``<out>/sharded.json``.
"""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import vindex

from . import datasets, measure, report
from .ingest import latencies


def log(msg: str) -> None:
    print(f"[sharded] {msg}", file=sys.stderr, flush=True)


def ingest(index, x: np.ndarray, first: int, batch: int, writers: int) -> tuple[float, float]:
    """Seconds to upsert ``x`` (ids ``first``, ``first + 1``, ...) in batches, ``writers``
    calls at a time, and the CPU seconds this process spent meanwhile (all of an in-process
    ``Index``'s work; only the coordinator's for a sharded collection)."""
    starts = range(0, x.shape[0], batch)
    t0, c0 = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(lambda lo: index.upsert(first + np.arange(lo, min(lo + batch, x.shape[0])), x[lo:lo + batch]),
                      starts))
    return time.perf_counter() - t0, time.process_time() - c0


def ingest_both(indexes: list, x: np.ndarray, chunk: int, batch: int, writers: int) -> tuple[list, list, list, list]:
    """Rows/s of each index ingesting ``x``, in turns of ``chunk`` rows, so that the load
    other processes put on the machine meanwhile falls on all of them alike. After its turn
    each index settles (``wait_idle``): its background rebalancing runs in its own turn and
    not in the next index's. Returns the rates of the upsert calls alone and with the
    settling included, and the cores this process kept busy during the calls and with the
    settling included."""
    seconds = [0.0] * len(indexes)
    cpu = [0.0] * len(indexes)
    settling = [0.0] * len(indexes)
    settling_cpu = [0.0] * len(indexes)
    for lo in range(0, x.shape[0], chunk):
        for i, index in enumerate(indexes):
            wall, used = ingest(index, x[lo:lo + chunk], lo, batch, writers)
            seconds[i] += wall
            cpu[i] += used
            t0, c0 = time.perf_counter(), time.process_time()
            index.wait_idle()
            settling[i] += time.perf_counter() - t0
            settling_cpu[i] += time.process_time() - c0
    return ([x.shape[0] / s for s in seconds], [x.shape[0] / (s + w) for s, w in zip(seconds, settling)],
            [c / s for c, s in zip(cpu, seconds)],
            [(c + sc) / (s + w) for c, sc, s, w in zip(cpu, settling_cpu, seconds, settling)])


def sweep(index, queries: np.ndarray, gt: np.ndarray, settings: list[int], repeat: int) -> list[dict]:
    points = []
    for m in settings:
        times, res = [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            res = index.search(queries, 10, max_postings=m)
            times.append(time.perf_counter() - t0)
        points.append({"max_postings": m, "recall": datasets.recall_at_k(res.ids, gt, 10),
                       "qps": queries.shape[0] / float(np.median(times))})
        log(f"  max_postings {m}: recall {points[-1]['recall']:.4f}, {points[-1]['qps']:.0f} QPS")
    return points


def latency_idle_and_busy(index, queries: np.ndarray, m: int, x: np.ndarray, batch: int) -> dict:
    idle = measure.percentiles(latencies(index, queries, m))
    stop, started = threading.Event(), threading.Event()
    rows = [0]

    def writer() -> None:
        lo = 0
        while not stop.is_set():
            ids = np.arange(lo, lo + batch) % x.shape[0]
            index.upsert(ids, x[ids])  # replaces existing rows: the collection keeps its size
            rows[0] += batch
            lo += batch
            started.set()

    thread = threading.Thread(target=writer)
    thread.start()
    started.wait()
    t0 = time.perf_counter()
    busy = measure.percentiles(latencies(index, queries, m))
    seconds = time.perf_counter() - t0
    stop.set()
    thread.join()
    return {"idle": idle, "under_ingest": busy, "p99_ratio": busy["p99"] / idle["p99"],
            "ingest_per_s_meanwhile": rows[0] / seconds}


def congruence(ShardedIndex, x: np.ndarray, queries: np.ndarray, shards: int, root: str) -> dict:
    one = vindex.Index.build(f"{root}/cong-one", x)
    sharded = ShardedIndex.create("congruence", x.shape[1], one.metric, shards=shards, path=f"{root}/cong-sharded")
    try:
        for lo in range(0, x.shape[0], 5000):
            sharded.upsert(np.arange(lo, min(lo + 5000, x.shape[0])), x[lo:lo + 5000])
        heads = max(one.stats()["heads"], max(r["heads"] for s in sharded.stats()["shards"] for r in s["replicas"]))
        m = 4096
        assert heads <= m, f"{heads} heads: max_postings {m} would not read every posting"
        a, b = sharded.search(queries, 10, max_postings=m), one.search(queries, 10, max_postings=m)
        return {"rows": int(x.shape[0]), "queries": int(queries.shape[0]),
                "identical_ids": bool((a.ids == b.ids).all()),
                "identical_distances": bool((a.distances == b.distances).all()),
                # a batch scans a posting for its queries four at a time, summed in another
                # order than one at a time: which queries share a posting differs by shard
                "distances_max_relative_difference": float(np.max(np.abs(a.distances - b.distances)
                                                                  / np.maximum(np.abs(b.distances), 1e-30)))}
    finally:
        sharded.close()
        one.close()


def kills_during_ingest(ShardedIndex, x: np.ndarray, shards: int, kills: int, batch: int, root: str,
                        seed: int) -> dict:
    import ray

    index = ShardedIndex.create("kills", x.shape[1], shards=shards, replicas=2, path=f"{root}/kills")
    actors = [a for s in index._shards for a in s.actors]
    rng = random.Random(seed)
    acked: list[np.ndarray] = []
    done, stop = [0], threading.Event()
    gap = [0.0]

    def killer() -> None:
        while done[0] < kills and not stop.is_set():
            ray.kill(rng.choice(actors), no_restart=False)
            done[0] += 1
            stop.wait(gap[0])

    try:
        t0 = time.perf_counter()
        first = x.shape[0] // 10
        index.upsert(np.arange(first), x[:first])
        gap[0] = max(0.2, (time.perf_counter() - t0) * 9 / kills)  # spread the kills over the ingest
        acked.append(np.arange(first))
        thread = threading.Thread(target=killer)
        thread.start()
        for lo in range(first, x.shape[0], batch):
            ids = np.arange(lo, min(lo + batch, x.shape[0]))
            index.upsert(ids, x[ids])
            acked.append(ids)
        stop.set()
        thread.join()
        ids = np.concatenate(acked)
        got = index.get(ids)
        lost = int((~got.found).sum()) + int((got.vectors[got.found] != x[ids][got.found]).any(axis=1).sum())
        return {"rows": int(x.shape[0]), "kills": done[0], "acknowledged": int(ids.shape[0]), "lost": lost,
                "replicas_restored": sum(s.restored for s in index._shards),
                "snapshot_copies": sum(s.snapshots for s in index._shards),
                "writes_during_catch_up": sum(s.writes_during_catch_up for s in index._shards),
                "seconds": time.perf_counter() - t0}
    finally:
        index.close()


def ingest_search_latency(one, sharded, base: np.ndarray, queries: np.ndarray, gt: np.ndarray,
                          args: argparse.Namespace, parts: set[str]) -> dict:
    """The ingest figures, then (in ``parts``) the search and latency ones, of ``one`` Index
    and the ``sharded`` collection filled with ``base``."""
    out: dict = {}
    (rate_one, rate_sharded), (settled_one, settled_sharded), (cores_one, _), (cores_settled, _) = ingest_both(
        [one, sharded], base, datasets.parse_count(args.chunk), args.batch, args.writers)
    log(f"ingest: one Index {rate_one:.0f} rows/s on {cores_one:.2f} cores, {args.shards} shards "
        f"{rate_sharded:.0f} rows/s (x{rate_sharded / rate_one:.2f}); settled included {settled_one:.0f} "
        f"(one Index on {cores_settled:.2f} cores) and {settled_sharded:.0f} (x{settled_sharded / settled_one:.2f})")
    out["ingest"] = {"one_rows_per_s": rate_one, "sharded_rows_per_s": rate_sharded,
                     "ratio": rate_sharded / rate_one, "one_settled_rows_per_s": settled_one,
                     "sharded_settled_rows_per_s": settled_sharded,
                     "settled_ratio": settled_sharded / settled_one,
                     # the one Index's CPU seconds per wall second of its upsert calls: what
                     # the shards, on the same machine, have left to add
                     "one_cpu_cores": cores_one, "one_settled_cpu_cores": cores_settled}
    settings = [int(s) for s in args.settings.split(",")]
    m = settings[-1]
    if "search" in parts:
        log("batch search, one Index")
        p_one = sweep(one, queries, gt, settings, args.repeat)
        log(f"batch search, {args.shards} shards")
        p_sharded = sweep(sharded, queries, gt, settings, args.repeat)
        q_one, q_sh = report.at_recall(p_one, args.target), report.at_recall(p_sharded, args.target)
        out["search"] = {"one": p_one, "sharded": p_sharded, "target_recall": args.target,
                         "one_qps_at_target": q_one, "sharded_qps_at_target": q_sh,
                         "ratio": None if not (q_one and q_sh) else q_sh / q_one}
        log(f"QPS at recall {args.target}: one {q_one}, sharded {q_sh}")
        reach = [p["max_postings"] for p in p_sharded if p["recall"] >= args.target]
        m = reach[0] if reach else m
    if "latency" in parts:
        lq = queries[:args.latency_queries]
        out["latency"] = {"max_postings": m,
                          "sharded": latency_idle_and_busy(sharded, lq, m, base, args.batch),
                          "one": latency_idle_and_busy(one, lq, m, base, args.batch)}
        for name in ("sharded", "one"):
            r = out["latency"][name]
            log(f"batch-1 {name}: p99 idle {r['idle']['p99']:.2f} ms, under ingest {r['under_ingest']['p99']:.2f} ms "
                f"(x{r['p99_ratio']:.2f}; {r['ingest_per_s_meanwhile']:.0f} rows/s meanwhile)")
    return out


PARTS = ("ingest", "search", "latency", "congruence", "faults")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synthetic-1m")
    ap.add_argument("--limit", default=None, help="use the first LIMIT rows (ground truth recomputed)")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--chunk", default="100k", help="rows each ingests in turn")
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--settings", default="8,12,16,24,32,48,64")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--latency-queries", type=int, default=1000)
    ap.add_argument("--congruence-n", default="20k")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--kill-rows", default="100k")
    ap.add_argument("--parts", default=",".join(PARTS), help="which of %(default)s to run")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        ap.error(f"--parts: unknown {sorted(parts - set(PARTS))}; choose from {','.join(PARTS)}")
    if parts & {"search", "latency"} and "ingest" not in parts:
        ap.error("--parts: search and latency run on the ingested collections: add ingest")

    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    from vindex.cluster import ShardedIndex

    vindex.warmup()
    ds = datasets.load(args.dataset)
    base, queries, gt = ds.base, ds.queries[:args.queries], ds.gt_ids[:args.queries]
    if args.limit:
        base = base[:datasets.parse_count(args.limit)]
        if "search" in parts:
            gt = datasets.ground_truth(base, queries, 10, ds.metric)[0]
    root = tempfile.mkdtemp(prefix="vindex-sharded-")
    out: dict = {"dataset": args.dataset, "rows": int(base.shape[0]), "dim": int(base.shape[1]),
                 "shards": args.shards, "batch": args.batch, "writers": args.writers, "chunk": args.chunk,
                 "cpus": ray.cluster_resources().get("CPU")}
    try:
        log(f"{base.shape[0]} rows, {queries.shape[0]} queries, {args.shards} shards, parts {sorted(parts)}")
        if "ingest" in parts:
            one = vindex.Index.create(f"{root}/one", dim=base.shape[1], metric=ds.metric)
            sharded = ShardedIndex.create("bench", base.shape[1], ds.metric, shards=args.shards,
                                          path=f"{root}/sharded")
            try:
                out.update(ingest_search_latency(one, sharded, base, queries, gt, args, parts))
            finally:
                one.close()
                sharded.close()
        if "congruence" in parts:
            n_cong = datasets.parse_count(args.congruence_n)
            out["congruence"] = congruence(ShardedIndex, base[:n_cong], queries[:200], args.shards, root)
            log(f"congruence: {out['congruence']}")
        if "faults" in parts:
            n_kill = datasets.parse_count(args.kill_rows)
            out["faults"] = kills_during_ingest(ShardedIndex, base[:n_kill], args.shards, args.kills, args.batch,
                                                root, seed=0)
            log(f"faults: {out['faults']}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.write_json(f"{args.out}/sharded.json", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
