"""SLA benchmark: a latency-critical tenant's searches beside another tenant's bulk ingest.

    python -m bench.sla --n 200k --seconds 20 --rate 100

Tenant A sends batch-size-1 searches at a fixed rate (open loop: each query's latency runs
from its scheduled send time, so a stalled server is charged for the queries that pile up
behind the stall). Tenant B upserts new vectors flat out in batches, so postings split and
rebalancing runs. For each store (``rocksdb``, ``blocks``) one index is built, copied, and
each copy runs one of:

* ``alone``: A only (``io_scheduler="sla"``);
* ``fifo``: A and B, one shared I/O queue, background unpaced;
* ``sla``: A and B, a queue per class, background paced to A's p99 target;
* ``burner`` (with ``--burner``): A only, while another process keeps every core busy with
  matrix products at B's CPU priority (``--burner-nice``, nice 10): how much of the ``sla``
  slowdown is the cores alone, with no GIL shared;
* ``disk`` (with ``--disk-load``): A only, while another process (``bench.diskload``) replays
  B's disk traffic as measured in the same round's ``sla`` run (its reads and writes a
  second, less A's own reads alone): how much of the slowdown is the disk alone;
* ``apart`` and ``apart_idle`` (with ``--apart``): A only, while B's whole workload runs in
  a process of its own on its own copy of the index (``bench.apart``), at nice 10 or under
  ``SCHED_IDLE``: the floor for a design with the writer out of the search process.
  ``--apart-modes`` picks among those and, under ``SCHED_IDLE`` too, ``apart_io`` (every
  read and write of B's process in the kernel's idle I/O class), ``apart_paced`` (B paced to
  ``--apart-pace`` of the round's ``fifo`` rate, 0.7 by default) and ``apart_io_paced``.

Reported per mode, as medians over ``--repeat`` runs taken round robin: A's p50/p99/p99.9
and its p99 over the store's ``alone`` p99, B's rows/s and its ratio to ``fifo``, and the
disk's reads and writes a second over each measured window (``/proc/diskstats``). Then, per
store with its caches off (the block store reads with O_DIRECT; RocksDB gets a 1 MiB block
cache and keeps no postings in memory, the OS page cache stays), the fewest postings per
query reaching recall@10 >= 0.90 and batch-size-1 p50/p99 and QPS there.
Writes ``<out>/sla-<n>.json`` and a PNG of A's latency CDFs.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import vindex
from vindex.iosched import LOW_PRIORITY_NICE, lower_thread_priority

from . import datasets, measure, report, synthetic

MODES = ("alone", "fifo", "sla")
#: The burner: a CPU-bound process (NumPy's BLAS on every core).
#: Its argument is the pid of the process that starts it; it ends with that process, even one
#: killed without cleaning up.
BURNER = ("import os, sys\nimport numpy as np\n"
          "parent = int(sys.argv[1])\n"
          "a = np.random.default_rng(0).standard_normal((400, 400))\n"
          "while os.getppid() == parent:\n    a = np.tanh(a @ a)\n")
#: Caches off: RocksDB's block cache at the store's floor (1 MiB), no postings kept in memory.
COLD_CACHE = 0


def disk_counters(path: str) -> np.ndarray | None:
    """``/proc/diskstats``' (reads, sectors read, writes, sectors written) for the device
    holding ``path``; None where there is no such file (not Linux)."""
    dev = os.stat(path).st_dev
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                x = line.split()
                if (int(x[0]), int(x[1])) == (os.major(dev), os.minor(dev)):
                    return np.array([int(x[3]), int(x[5]), int(x[7]), int(x[9])], dtype=np.float64)
    except OSError:
        return None
    return None


def disk_rates(before: np.ndarray | None, after: np.ndarray | None, seconds: float) -> dict | None:
    """Requests and MiB a second, and mean request sizes in KiB, between two samples."""
    if before is None or after is None:
        return None
    reads, rsec, writes, wsec = (after - before).tolist()
    return {"reads_per_s": reads / seconds, "read_mib_per_s": rsec * 512 / 2**20 / seconds,
            "read_kib": rsec * 512 / 1024 / max(reads, 1),
            "writes_per_s": writes / seconds, "write_mib_per_s": wsec * 512 / 2**20 / seconds,
            "write_kib": wsec * 512 / 1024 / max(writes, 1)}


def b_traffic(sla: dict, alone: dict) -> dict | None:
    """B's disk traffic: the ``sla`` run's less what A alone read."""
    if sla.get("disk") is None or alone.get("disk") is None:
        return None
    d, a = sla["disk"], alone["disk"]
    return {"reads_per_s": max(0.0, d["reads_per_s"] - a["reads_per_s"]), "read_kib": d["read_kib"],
            "write_mib_per_s": d["write_mib_per_s"], "write_kib": d["write_kib"]}


def start_disk_load(work: str, traffic: dict) -> subprocess.Popen:
    """``bench.diskload`` replaying ``traffic``, once it has filled its file."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.diskload", "--file", os.path.join(work, "diskload.bin"),
         "--write-mb-s", f"{traffic['write_mib_per_s']:.3f}", "--write-kib", f"{traffic['write_kib']:.1f}",
         "--reads-s", f"{traffic['reads_per_s']:.1f}", "--read-kib", f"{traffic['read_kib']:.1f}"],
        stdout=subprocess.PIPE, cwd=measure.REPO_ROOT)
    if proc.stdout.readline().strip() != b"ready":
        proc.kill()
        raise RuntimeError(f"bench.diskload exited with {proc.wait()} before it was ready")
    return proc


def open_loop(index: vindex.Index, queries: np.ndarray, rate: float, seconds: float, m: int,
              threads: int = 4) -> np.ndarray:
    """Tenant A: one query every ``1 / rate`` s for ``seconds``; per query the seconds from its
    scheduled send time to its result."""
    n = int(rate * seconds)
    lat = np.full(n, np.nan)
    t0 = time.perf_counter() + 0.05

    def one(i: int) -> None:
        index.search(queries[i % queries.shape[0]], 10, max_postings=m, tenant="A")
        lat[i] = time.perf_counter() - (t0 + i / rate)

    with ThreadPoolExecutor(threads) as pool:
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, i)
    return lat


class Ingest(threading.Thread):
    """Tenant B: upserts new ids until stopped, flat out or at ``rows_per_s``."""

    def __init__(self, index: vindex.Index, x: np.ndarray, first_id: int, batch: int, low_priority: bool,
                 rows_per_s: float | None = None):
        super().__init__(daemon=True)
        self.index, self.x, self.first_id, self.batch = index, x, first_id, batch
        self.low_priority, self.rows_per_s = low_priority, rows_per_s
        self.rows, self.stop_flag = 0, threading.Event()

    def run(self) -> None:
        if self.low_priority:  # as `vindex serve` runs upserts: on its lower-priority pool
            lower_thread_priority()
        lo, t0 = 0, time.perf_counter()
        while not self.stop_flag.is_set() and lo < self.x.shape[0]:
            hi = min(lo + self.batch, self.x.shape[0])
            self.index.upsert(np.arange(self.first_id + lo, self.first_id + hi), self.x[lo:hi])
            self.rows += hi - lo
            lo = hi
            if self.rows_per_s:  # paced: the next batch waits for its turn (no catching up in a burst)
                ahead = t0 + lo / self.rows_per_s - time.perf_counter()
                if ahead > 0:
                    self.stop_flag.wait(ahead)
                else:
                    t0 -= ahead


def one_run(base_dir: str, work: str, mode: str, queries: np.ndarray, extra: np.ndarray, n: int,
            args: argparse.Namespace, target_ms: float, replay: dict | None = None,
            fifo_rows_per_s: float = 0.0) -> dict:
    path = os.path.join(work, f"run-{mode}")
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(base_dir, path)
    neighbour = None  # the other process beside A: the burner or the disk load
    if mode == "burner":  # before the index opens: no fork while RocksDB is open
        threads = str(os.cpu_count() or 1)
        neighbour = subprocess.Popen(["nice", "-n", str(args.burner_nice), sys.executable, "-c", BURNER,
                                      str(os.getpid())],
                                  env=dict(os.environ, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads))
        time.sleep(args.warmup)
    elif mode == "disk":
        neighbour = start_disk_load(work, replay)
        time.sleep(args.warmup)
    elif mode.startswith("apart"):
        neighbour = start_apart(base_dir, path + "-b", n, args, mode, fifo_rows_per_s)
    try:
        index = vindex.Index.open(path, io_scheduler="fifo" if mode == "fifo" else "sla",
                                  interactive_p99_ms=target_ms)
    except BaseException:
        _stop(neighbour)
        raise
    try:
        for q in queries[:200]:  # warm the kernels and the caches
            index.search(q, 10, max_postings=args.max_postings)
        vindex.freeze_heap()  # as `vindex serve` does once it is ready (vindex/gcpause.py)
        before = index.stats()
        ingest = None
        if mode in ("fifo", "sla"):
            ingest = Ingest(index, extra, n, args.batch, low_priority=mode == "sla")
            ingest.start()
            time.sleep(args.warmup)
        elif mode.startswith("apart"):
            _ask(neighbour, "go")
            time.sleep(args.warmup)
        rows0, t0, disk0 = _rows(ingest, neighbour), time.perf_counter(), disk_counters(path)
        lat = open_loop(index, queries, args.rate, args.seconds, args.max_postings)
        took = time.perf_counter() - t0
        disk = disk_rates(disk0, disk_counters(path), took)
        rows = _rows(ingest, neighbour) - rows0
        if ingest:
            ingest.stop_flag.set()
            ingest.join()
        after = index.stats()
        out = {"a": measure.percentiles(lat[np.isfinite(lat)]), "a_latencies_ms": (np.sort(lat) * 1e3).tolist(),
               "b_rows_per_s": rows / took,
               "splits": after["splits"] - before["splits"], "reassigns": after["reassigns"] - before["reassigns"],
               "store_io": after.get("store", {}).get("io"), "disk": disk, "replayed": replay}
        io = (f"; disk {disk['reads_per_s']:.0f} reads/s ({disk['read_mib_per_s']:.0f} MiB/s), "
              f"{disk['writes_per_s']:.0f} writes/s ({disk['write_mib_per_s']:.0f} MiB/s)") if disk else ""
        print(f"  [{mode}] A p50 {out['a']['p50']:.2f} p99 {out['a']['p99']:.2f} p99.9 {out['a']['p999']:.2f} ms; "
              f"B {out['b_rows_per_s']:.0f} rows/s; splits {out['splits']}{io}", file=sys.stderr, flush=True)
        return out
    finally:
        index.close()
        _stop(neighbour)
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(path + "-b", ignore_errors=True)


#: ``bench.apart``'s options per mode: ``apart`` at nice 10, the others under SCHED_IDLE;
#: ``_io``: in the kernel's idle I/O class; ``_paced``: B at ``--apart-pace`` of the round's
#: ``fifo`` rate (the slowest the goal allows B to be).
APART_MODES = {"apart": [], "apart_idle": ["--idle"], "apart_io": ["--idle", "--io-idle"],
               "apart_paced": ["--idle"], "apart_io_paced": ["--idle", "--io-idle"]}


def start_apart(base_dir: str, path: str, n: int, args: argparse.Namespace, mode: str,
                fifo_rows_per_s: float) -> subprocess.Popen:
    """``bench.apart`` on its own copy of the index, once it is open and warm."""
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(base_dir, path)
    cmd = [sys.executable, "-m", "bench.apart", "--index", path, "--first-id", str(n), "--batch", str(args.batch),
           "--switch-interval-ms", str(args.switch_interval_ms)] + APART_MODES[mode]
    if mode.endswith("_paced"):
        cmd += ["--rows-per-s", f"{args.apart_pace * fifo_rows_per_s:.1f}"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=measure.REPO_ROOT)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"bench.apart exited with {proc.wait()} before it was ready")
    return proc


def _ask(proc: subprocess.Popen, line: str) -> str:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip() if line == "rows" else ""


def _rows(ingest: Ingest | None, apart: subprocess.Popen | None) -> int:
    """B's rows so far: its thread's, or its process's (``bench.apart``), or none."""
    if ingest is not None:
        return ingest.rows
    if apart is not None and apart.stdin is not None:
        return int(_ask(apart, "rows"))
    return 0


def _stop(proc: subprocess.Popen | None) -> None:
    """Kill and reap ``proc`` (if any), closing its output pipe."""
    if proc is None:
        return
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe:
            pipe.close()


def median_run(runs: list[dict]) -> dict:
    """One mode's repeated runs: the median of each figure, every run's p99 and B rate, and
    all runs' latencies pooled and sorted (for the CDF)."""
    out = {"a": {k: float(np.median([r["a"][k] for r in runs])) for k in ("p50", "p99", "p999")},
           "b_rows_per_s": float(np.median([r["b_rows_per_s"] for r in runs])),
           "runs_a_p99": [r["a"]["p99"] for r in runs], "runs_b_rows_per_s": [r["b_rows_per_s"] for r in runs],
           "a_latencies_ms": sorted(x for r in runs for x in r["a_latencies_ms"])}
    for k in ("splits", "reassigns", "store_io"):
        out[k] = runs[-1][k]
    out["runs_disk"] = [r["disk"] for r in runs]
    out["runs_replayed"] = [r["replayed"] for r in runs]
    return out


def cold_search(base_dir: str, queries: np.ndarray, gt: np.ndarray, args: argparse.Namespace) -> dict:
    """Recall@10 >= 0.90 at the fewest postings, then batch-size-1 latency and QPS there."""
    index = vindex.Index.open(base_dir, cache_bytes=COLD_CACHE, rebalance=False)
    try:
        q = queries[: args.recall_queries]
        chosen = None
        for m in (4, 6, 8, 12, 16, 24, 32, 48, 64):
            rec = datasets.recall_at_k(index.search(q, 10, max_postings=m).ids, gt[: q.shape[0]], 10)
            chosen = {"max_postings": m, "recall_at_10": rec}
            if rec >= 0.90:
                break
        lat = measure.latencies(lambda row: index.search(row, 10, max_postings=chosen["max_postings"]),
                                queries, args.latency_queries)
        chosen.update(measure.percentiles(lat), qps=1.0 / float(np.mean(lat)))
        print(f"  [cold] max_postings {chosen['max_postings']} recall@10 {chosen['recall_at_10']:.3f}: "
              f"p50 {chosen['p50']:.2f} p99 {chosen['p99']:.2f} ms, {chosen['qps']:.0f} QPS", file=sys.stderr)
        return chosen
    finally:
        index.close()


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result["stores"]), figsize=(6 * len(result["stores"]), 4), squeeze=False)
    for ax, (store, runs) in zip(axes[0], result["stores"].items()):
        for mode in runs:
            lat = np.asarray(runs[mode]["a_latencies_ms"])
            lat = lat[np.isfinite(lat)]
            ax.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=f"{mode} (p99 {runs[mode]['a']['p99']:.1f} ms)")
        ax.set_xscale("log")
        ax.set_xlabel("tenant A latency (ms, from scheduled send)")
        ax.set_ylabel("fraction of queries")
        ax.set_title(f"{store}: A at {result['meta']['rate']:.0f} QPS, B ingesting")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    report.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="200k", help="vectors in the index before B starts")
    ap.add_argument("--stores", default="rocksdb,blocks")
    ap.add_argument("--rate", type=float, default=100.0, help="tenant A's queries per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per mode, round robin; figures are the medians (the machine is noisy)")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of B alone before A is measured")
    ap.add_argument("--batch", type=int, default=1000, help="tenant B's rows per upsert")
    ap.add_argument("--max-postings", type=int, default=16)
    ap.add_argument("--p99-target-ms", type=float, default=0.0,
                    help="A's p99 target the sla runs pace to (0: 1.5x A's p99 alone, the SLA itself)")
    ap.add_argument("--switch-interval-ms", type=float, default=0.25,
                    help="the GIL switch interval, as `vindex serve` sets it (Python's default is 5)")
    ap.add_argument("--burner", action="store_true",
                    help="also run A beside a CPU-bound process on every core (no GIL shared)")
    ap.add_argument("--burner-nice", type=int, default=LOW_PRIORITY_NICE,
                    help="the burner's nice value (default: the one B's threads run at under sla)")
    ap.add_argument("--disk-load", action="store_true",
                    help="also run A beside another process replaying B's disk traffic (no GIL shared)")
    ap.add_argument("--apart", action="store_true",
                    help="also run A beside B's workload in a process of its own (see --apart-modes)")
    ap.add_argument("--apart-modes", default="apart,apart_idle",
                    help=f"which of {', '.join(APART_MODES)} --apart runs")
    ap.add_argument("--apart-pace", type=float, default=0.7,
                    help="the _paced modes' B rate, as a fraction of the round's fifo rate")
    ap.add_argument("--recall-queries", type=int, default=1000)
    ap.add_argument("--latency-queries", type=int, default=2000)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    apart_modes = args.apart_modes.split(",")
    if unknown := set(apart_modes) - set(APART_MODES):
        ap.error(f"--apart-modes: no mode {', '.join(sorted(unknown))}")
    n = datasets.parse_count(args.n)
    base, queries, _ = synthetic.load_cached(n, 128, 0)
    base, queries = np.asarray(base), np.asarray(queries)
    extra = synthetic.make_rows(n, n + 400_000, 128, 0)
    gt, _ = datasets.ground_truth(base, queries[: args.recall_queries], 10, "l2")
    measure.limit_threads(os.cpu_count() or 1)
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    vindex.warmup()  # as `vindex serve` does before it is ready: no kernel loads inside a run
    result: dict = {"meta": {"n": n, "rate": args.rate, "seconds": args.seconds, "repeat": args.repeat,
                             "batch": args.batch,
                             "max_postings": args.max_postings, "switch_interval_ms": args.switch_interval_ms,
                             "time": time.strftime("%Y-%m-%d %H:%M:%S")}, "stores": {}, "cold": {}}
    work = tempfile.mkdtemp(prefix="vindex-sla-", dir=os.environ.get("VINDEX_BENCH_TMP"))
    if args.disk_load and disk_counters(work) is None:  # before the runs, not after a round of them
        shutil.rmtree(work, ignore_errors=True)
        ap.error(f"--disk-load reads /proc/diskstats, which has no device for {work}")
    try:
        for store in args.stores.split(","):
            print(f"[{store}] building {n} vectors", file=sys.stderr, flush=True)
            base_dir = os.path.join(work, f"base-{store}")
            vindex.Index.build(base_dir, base, store=store, progress=False).close()
            measure.limit_threads(1)
            result["cold"][store] = cold_search(base_dir, queries, gt, args)
            runs = result["stores"][store] = {}
            target = args.p99_target_ms
            modes = (MODES + (("burner",) if args.burner else ()) + (("disk",) if args.disk_load else ())
                     + (tuple(apart_modes) if args.apart else ()))
            reps: dict[str, list[dict]] = {m: [] for m in modes}
            for rep in range(args.repeat):  # round robin, so drift on the machine hits every mode
                for mode in modes:
                    replay = b_traffic(reps["sla"][rep], reps["alone"][rep]) if mode == "disk" else None
                    fifo_rate = reps["fifo"][rep]["b_rows_per_s"] if len(reps["fifo"]) > rep else 0.0
                    reps[mode].append(one_run(base_dir, work, mode, queries, extra, n, args, target or 5.0, replay,
                                              fifo_rate))
                    if mode == "alone" and not target and rep == 0:
                        target = 1.5 * reps["alone"][0]["a"]["p99"]
            for mode in modes:
                runs[mode] = median_run(reps[mode])
            runs["sla"]["p99_target_ms"] = target
            alone = runs["alone"]["a"]["p99"]
            for mode in modes[1:]:
                runs[mode]["a_p99_over_alone"] = runs[mode]["a"]["p99"] / alone
            runs["sla"]["b_over_fifo"] = runs["sla"]["b_rows_per_s"] / max(runs["fifo"]["b_rows_per_s"], 1e-9)
            beside = f", burner {runs['burner']['a_p99_over_alone']:.2f}x" if args.burner else ""
            beside += f", disk {runs['disk']['a_p99_over_alone']:.2f}x" if args.disk_load else ""
            for mode in apart_modes if args.apart else ():
                beside += f", {mode} {runs[mode]['a_p99_over_alone']:.2f}x (B {runs[mode]['b_rows_per_s']:.0f} rows/s)"
            print(f"[{store}] medians of {args.repeat}: A p99 over alone: fifo {runs['fifo']['a_p99_over_alone']:.2f}x, "
                  f"sla {runs['sla']['a_p99_over_alone']:.2f}x{beside}; B sla/fifo {runs['sla']['b_over_fifo']:.2f}x",
                  file=sys.stderr, flush=True)
            measure.limit_threads(os.cpu_count() or 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"sla-{args.n}")
    plot(result, stem + ".png")
    for runs in result["stores"].values():
        for r in runs.values():
            r.pop("a_latencies_ms")
    report.write_json(stem + ".json", result)
    print(f"wrote {stem}.json and {stem}.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
