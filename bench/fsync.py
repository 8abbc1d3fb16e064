"""The cost of ``durability="fsync"``: upsert throughput against the default (``process``).

One index (synthetic 100k x 128) is reopened with each durability setting in turn; writers
upsert new vectors for a fixed time at batch sizes 1 and 100 with 1 and 8 threads. Settings
alternate within each repeat so machine noise hits both alike; medians over repeats.

    python -m bench.fsync            # writes bench/results/fsync.json
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time

import numpy as np

from . import datasets, measure
from .report import table, write_json


def _throughput(index, x: np.ndarray, first_id: int, batch: int, threads: int, seconds: float) -> tuple[float, int]:
    """Rows upserted per second, and rows written."""
    stop = time.perf_counter() + seconds
    counts = [0] * threads

    def writer(t: int) -> None:
        i = first_id + t * 10_000_000
        rows = 0
        while time.perf_counter() < stop:
            lo = (rows + t * 7919) % (x.shape[0] - batch)
            index.upsert(np.arange(i, i + batch), x[lo:lo + batch])
            i += batch
            rows += batch
        counts[t] = rows

    t0 = time.perf_counter()
    ts = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - t0), sum(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synthetic-100k")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/fsync.json")
    args = ap.parse_args()
    import vindex

    measure.limit_threads(1)
    ds = datasets.load(args.dataset)
    x = np.ascontiguousarray(ds.base[:50_000], dtype=np.float32)
    root = tempfile.mkdtemp(prefix="vindex-fsync-")
    rows = []
    try:
        path = os.path.join(root, "idx")
        vindex.Index.build(path, ds.base, metric=ds.metric).close()
        vindex.warmup()
        next_id = 10 * ds.n
        runs: dict[tuple, list[float]] = {}
        syncs: dict[tuple, list[float]] = {}
        for rep in range(args.repeats):
            for batch in (1, 100):
                for threads in (1, 8):
                    for mode in ("process", "fsync"):
                        with vindex.Index.open(path, durability=mode) as index:
                            qps, n = _throughput(index, x, next_id, batch, threads, args.seconds)
                            next_id += 100_000_000
                            runs.setdefault((batch, threads, mode), []).append(qps)
                            writes = n // batch
                            syncs.setdefault((batch, threads, mode), []).append(
                                index.stats()["fsyncs"] / max(writes, 1))
                        print(f"repeat {rep + 1} batch {batch} threads {threads} {mode}: {qps:,.0f} rows/s",
                              flush=True)
        for batch in (1, 100):
            for threads in (1, 8):
                p = float(np.median(runs[(batch, threads, "process")]))
                f = float(np.median(runs[(batch, threads, "fsync")]))
                rows.append({"batch": batch, "threads": threads, "process_rows_s": round(p),
                             "fsync_rows_s": round(f), "ratio": round(f / p, 3),
                             "fsyncs_per_write": round(float(np.median(syncs[(batch, threads, "fsync")])), 3)})
        print(table(rows, [("batch", "batch", "d"), ("threads", "threads", "d"),
                           ("process_rows_s", "process rows/s", ",d"), ("fsync_rows_s", "fsync rows/s", ",d"),
                           ("ratio", "fsync / process", ".3f"), ("fsyncs_per_write", "fsyncs per write", ".3f")]))
        write_json(args.out, {"dataset": ds.name, "seconds": args.seconds, "repeats": args.repeats,
                              "rows": rows, "runs": {str(k): v for k, v in runs.items()},
                              "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
