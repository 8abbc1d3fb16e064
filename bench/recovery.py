"""Recovery time: reopen a 1M-vector index after kill -9 with 100k operations logged since its
last checkpoint.

A child process opens a copy of the cached 1M x 128 index with automatic checkpoints off and
applies single-vector operations (upserts of new and existing ids, deletes) with rebalancing
running, so the log holds both user writes and background records. The parent SIGKILLs it
and times ``Index.open`` (checkpoint load + log replay) and the first search.

    python -m bench.recovery --ops 100k      # writes bench/results/recovery-synthetic-1m.json
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from . import datasets
from .report import write_json


def child(path: str, n_ops: int, seed: int) -> None:
    import vindex

    ds = datasets.load("synthetic-1m")
    index = vindex.Index.open(path, checkpoint_every=10**12)
    rng = np.random.default_rng(seed)
    base = np.asarray(ds.base)
    scale = 0.01 * float(np.std(base[:1000]))
    t0 = time.perf_counter()
    for i in range(n_ops):
        r = rng.random()
        if r < 0.2:
            index.delete([int(rng.integers(0, ds.n))])
        else:
            # 40%: replace an existing vector; 40%: a new id near a base vector
            ext = int(rng.integers(0, ds.n)) if r < 0.6 else ds.n + i
            x = base[int(rng.integers(0, ds.n))] + rng.normal(0, scale, ds.d)
            index.upsert([ext], x[None].astype(np.float32))
        if (i + 1) % 10_000 == 0:
            print(f"{i + 1} ops in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    s = index.stats()
    print(f"DONE {s['log_seq']} {s['checkpoint_seq']} {time.perf_counter() - t0:.1f}", flush=True)
    time.sleep(3600)  # killed here, with whatever rebalancing is still running


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--ops", default="100k")
    ap.add_argument("--repeats", type=int, default=3, help="timed reopens (each after a kill)")
    ap.add_argument("--index-cache", default=os.path.expanduser("~/.cache/vindex-bench/indexes"))
    ap.add_argument("--out", default="bench/results/recovery-synthetic-1m.json")
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    import vindex

    n_ops = datasets.parse_count(args.ops)
    cached = os.path.join(args.index_cache, "synthetic-1m")
    if not os.path.exists(os.path.join(cached, "vindex.json")):
        ds = datasets.load("synthetic-1m")
        vindex.Index.build(cached, ds.base, metric=ds.metric).close()
    root = tempfile.mkdtemp(prefix="vindex-recovery-")
    try:
        path = os.path.join(root, "idx")
        shutil.copytree(cached, path)
        proc = subprocess.Popen([sys.executable, "-m", "bench.recovery", "--child", path, str(n_ops), "0"],
                                stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if not line.startswith("DONE"):
            raise RuntimeError(f"child failed: {line!r}")
        _, log_seq, ckpt_seq, write_s = line.split()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        records = int(log_seq) - int(ckpt_seq)
        print(f"child wrote {n_ops} ops ({records} log records) in {write_s} s; killed", flush=True)
        opens, firsts = [], []
        q = np.asarray(datasets.load("synthetic-1m").queries[:1], dtype=np.float32)
        for r in range(args.repeats):
            t0 = time.perf_counter()
            index = vindex.Index.open(path, rebalance=False)
            opens.append(time.perf_counter() - t0)
            index.search(q, 10)
            firsts.append(time.perf_counter() - t0)
            replayed = index.stats()["log_seq"] - index.stats()["checkpoint_seq"]
            # leave without a checkpoint, as a crash would, so the next open replays again
            index._closed = True
            index._finalizer()
            print(f"open {r + 1}: {opens[-1]:.2f} s ({replayed} records replayed), "
                  f"first search done at {firsts[-1]:.2f} s", flush=True)
        t0 = time.perf_counter()
        with vindex.Index.open(path, rebalance=False) as index:
            report = index.verify()
            verify_s = time.perf_counter() - t0
            live = len(index)
        result = {"dataset": "synthetic-1m", "ops": n_ops, "log_records": records, "live": live,
                  "write_s": float(write_s), "open_s": opens, "open_s_median": float(np.median(opens)),
                  "first_search_s_median": float(np.median(firsts)), "target_s": 30,
                  "verify_ok": report.ok, "verify_s": verify_s, "violations": report.violations,
                  "time": time.strftime("%Y-%m-%d %H:%M:%S")}
        write_json(args.out, result)
        print({k: v for k, v in result.items() if k != "violations"})
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
