"""Soak test of the gRPC service: a real server under a bounded mixed load for a long time,
watched for leaks and drift.

    python -m bench.soak --minutes 10

Starts ``vindex serve`` (a subprocess) on a fresh data directory, creates a collection with
small postings (so splits, merges, reassignments and garbage collection run all the time) and
loads it to the live set's steady state, then runs client processes at fixed rates: searches,
upserts and deletes over a bounded id space (so the live set, the id map and the postings stay
bounded), and gets. Every ``--sample`` seconds it reads the server's RSS and thread count
(``/proc/PID/status``) and its open file descriptors (``/proc/PID/fd``); per window it
computes search p50/p99 and counts operations and errors. Writes ``bench/results/soak.json``
and prints a summary; exits 1 if a criterion fails.

Pass criteria (``evaluate``), with the first ``warmup`` of the run excluded (kernels, block
cache, memtables and pools fill up then):

* **errors**: no client call failed, the server logged no traceback or internal error and
  stopped cleanly on SIGTERM;
* **RSS flat**: the server's RSS less what RocksDB holds by design, its memtables (estimated
  from the write-ahead log's size, see :func:`wal_mb`), block cache and the postings the store
  keeps in memory (``Stats``), must not grow: a least-squares line through the post-warm-up
  samples of that remainder rises by less than ``rss_growth`` of its median (with a floor of
  ``rss_floor_mb``) over the post-warm-up span.
  Why the subtraction: the memtables fill towards 2 x 128 MiB and only then flush, so on a
  fresh store raw RSS climbs by several MiB a minute for the whole of a 10-minute run without
  any leak (both figures are reported). Why a fitted line: the allocator makes RSS saw-tooth by
  a few MiB, and two single samples would measure where in a tooth each fell; a constant load
  does the same work every minute, so a leak is memory proportional to elapsed time, a slope.
  The limit sits at twice the drift glibc's per-thread malloc arenas show with no leak at all:
  the remainder grows 0.9-1.2 MiB a minute over 10 minutes with the default arenas and
  0.02 MiB a minute with ``MALLOC_ARENA_MAX=1`` (``--malloc-arena-max 1``, the setting to
  hunt a small leak with). At the default load (125 calls/s) 10% is about 22 MiB over 8
  post-warm-up minutes, some 370 bytes per call; over the 1-minute run about 4 KiB per call;
* **threads** and **fds not growing**: the largest count in the second half of the
  post-warm-up period exceeds the largest in its first half by at most ``thread_slack`` /
  ``fd_slack``. Thread pools start workers lazily up to a fixed bound and RocksDB opens a table
  file per flush or compaction output, so a small step is allowed once; a leak keeps growing;
* **p99 stable**: the last window's search p99 is at most ``p99_factor`` times the first
  post-warm-up window's plus ``p99_floor_ms``. On two cores shared by the server, five client
  processes and whatever else runs, one window's p99 moves by 2x between neighbours with
  nothing wrong; steady degradation (postings growing without bound, a queue that never
  drains, work leaking into every call) compounds past 3x.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import measure

ROOT = str(measure.REPO_ROOT)
COLLECTION = "soak"
READY_PREFIX = "vindex: serving "


@dataclass(frozen=True)
class SoakConfig:
    minutes: float = 10.0
    warmup: float = 0.2             # fraction of the run excluded from the criteria
    window_s: float = 60.0          # latency / count windows
    sample_s: float = 5.0           # /proc sampling period
    # data
    dim: int = 32
    n_ids: int = 20_000             # ids live in 0..n_ids-1: the live set is bounded
    clusters: int = 64
    posting_limit_bytes: int = 8192  # small postings: steady splits, merges and reassignments
    # load, per second (each operation type has its own client process)
    search_rate: float = 80.0
    search_clients: int = 2         # the search rate is split between them
    k: int = 10
    max_postings: int = 16
    upsert_rate: float = 20.0
    upsert_batch: int = 10
    delete_rate: float = 5.0
    delete_batch: int = 20
    get_rate: float = 20.0
    get_batch: int = 10
    # criteria
    rss_growth: float = 0.10
    rss_floor_mb: float = 12.0
    thread_slack: int = 2
    fd_slack: int = 8
    p99_factor: float = 3.0
    p99_floor_ms: float = 5.0

    @property
    def seconds(self) -> float:
        return 60.0 * self.minutes

    @property
    def initial(self) -> int:
        """Vectors loaded before the clock starts: the live set's steady state. An upserted id
        is new with probability ``1 - live/n_ids`` and a deleted one live with probability
        ``live/n_ids``, so inserts balance deletes at ``live/n_ids = u / (u + d)`` (rows per
        second upserted and deleted)."""
        u = self.upsert_rate * self.upsert_batch
        d = self.delete_rate * self.delete_batch
        return int(round(self.n_ids * u / (u + d)))


# --- the server --------------------------------------------------------------------------------
class ServerProcess:
    """``vindex serve --port 0`` on ``data_dir``; stderr goes to ``log_path``."""

    def __init__(self, data_dir: str, log_path: str, timeout: float = 120.0, env: dict | None = None):
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vindex.service.cli", "serve", "--data", data_dir, "--port", "0",
             "--log-level", "warning"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self._log, text=True, env={**os.environ, **(env or {})})
        self.lines: "queue.Queue[str | None]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.proc.kill()
                raise RuntimeError(f"server did not start:\n{self.log()}")
            if line.startswith(READY_PREFIX):
                self.target = line.split(" on ")[1].split()[0]
                break
        self.pid = self.proc.pid

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self, timeout: float = 120.0) -> int:
        rc = measure.terminate(self.proc, timeout)
        self._log.close()
        return rc


#: RocksDB memtable bytes per byte of write-ahead log under this load: the arena also holds
#: skiplist nodes and internal keys. Taken from ``rocksdb.cur-size-all-mem-tables`` against the
#: log's growth under the default load, so the harness can estimate the memtables from the
#: log files it reads from outside the server.
MEMTABLE_PER_WAL_BYTE = 1.06


def wal_mb(store_dir: str) -> float:
    """Bytes (MiB) in RocksDB's write-ahead log files: the records its memtables hold since
    their last flush.

    The memtables (128 MiB per posting column family, allocated as they fill) are bounded by
    configuration, and until they reach it they grow with every write: over minutes that looks
    exactly like a leak. The log holds the same records, so its size measures them from outside
    (times :data:`MEMTABLE_PER_WAL_BYTE`)."""
    total = 0
    try:
        names = os.listdir(store_dir)
    except FileNotFoundError:
        return 0.0
    for name in names:
        if name.endswith(".log"):
            try:
                total += os.path.getsize(os.path.join(store_dir, name))
            except FileNotFoundError:  # rotated away meanwhile
                pass
    return total / 2**20


def proc_sample(pid: int) -> dict:
    """RSS (MiB), thread count and open file descriptors of process ``pid``."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["rss_mb"] = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


# --- data and clients (spawned processes: no fork after gRPC objects exist) --------------------
def centres(cfg: SoakConfig) -> np.ndarray:
    return np.random.default_rng(12345).normal(0, 1, (cfg.clusters, cfg.dim)).astype(np.float32)


def vectors(rng: np.random.Generator, cents: np.ndarray, n: int) -> np.ndarray:
    return (cents[rng.integers(0, cents.shape[0], n)]
            + 0.25 * rng.normal(0, 1, (n, cents.shape[1]))).astype(np.float32)


def _client(kind: str, target: str, cfg_dict: dict, seed: int, rate: float, start_at: float,
            end_at: float, out) -> None:
    """Calls of one kind at ``rate`` per second from ``start_at`` to ``end_at``; puts
    ``(kind, start times, latencies, ok flags, first error messages, skipped)`` on ``out``."""
    import vindex

    cfg = SoakConfig(**cfg_dict)
    rng = np.random.default_rng(seed)
    cents = centres(cfg)
    col = vindex.Client(target, timeout=60).collection(COLLECTION)

    def op() -> None:
        if kind == "search":
            col.search(vectors(rng, cents, 1), cfg.k, max_postings=cfg.max_postings)
        elif kind == "upsert":
            col.upsert(rng.choice(cfg.n_ids, cfg.upsert_batch, replace=False), vectors(rng, cents, cfg.upsert_batch))
        elif kind == "delete":
            col.delete(rng.choice(cfg.n_ids, cfg.delete_batch, replace=False))
        else:
            col.get(rng.choice(cfg.n_ids, cfg.get_batch, replace=False))

    for _ in range(20):  # warm the channel and this process's imports
        if kind in ("search", "get"):
            op()
    starts, lats, oks, errors = [], [], [], []
    skipped = 0
    interval = 1.0 / rate
    due = start_at
    while True:
        now = time.time()
        if now >= end_at:
            break
        if now < due:
            time.sleep(min(due - now, end_at - now))
            continue
        if now - due > 5 * interval:  # stalled: skip the missed slots instead of bursting
            missed = int((now - due) / interval)
            skipped += missed
            due += missed * interval
        t0 = time.perf_counter()
        ok = True
        try:
            op()
        except Exception as e:  # noqa: BLE001 - every failure is counted and reported
            ok = False
            if len(errors) < 10:
                errors.append(f"{type(e).__name__}: {e}")
        lats.append(time.perf_counter() - t0)
        starts.append(now)
        oks.append(ok)
        due += interval
    out.put((kind, np.asarray(starts), np.asarray(lats), np.asarray(oks, bool), errors, skipped))


# --- the run -------------------------------------------------------------------------------------
def run_soak(cfg: SoakConfig, root: str | None = None, log: Callable[[str], None] = print,
             server_env: dict | None = None) -> dict:
    """Run one soak and return its result (samples, windows, counts); see :func:`evaluate`.
    ``server_env`` adds environment variables for the server process."""
    import vindex

    own_root = root is None
    root = root or tempfile.mkdtemp(prefix="vindex-soak-")
    data_dir = os.path.join(root, "data")
    server = ServerProcess(data_dir, os.path.join(root, "server.log"), env=server_env)
    procs: list = []
    result: dict[str, Any] = {"meta": {"config": dataclasses.asdict(cfg), "cores": os.cpu_count(),
                                       "time": time.strftime("%Y-%m-%d %H:%M:%S"), "server_pid": server.pid,
                                       "server_env": dict(server_env or {})}}
    try:
        client = vindex.Client(server.target, timeout=300)
        col = client.create_collection(COLLECTION, dim=cfg.dim, posting_limit_bytes=cfg.posting_limit_bytes)
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        ids = rng.choice(cfg.n_ids, cfg.initial, replace=False)
        col.upsert_many(ids, vectors(rng, centres(cfg), cfg.initial))
        col.wait_idle(timeout=300)
        result["meta"]["load_s"] = time.perf_counter() - t0
        log(f"soak: server pid {server.pid} at {server.target}; {cfg.initial} vectors loaded in "
            f"{result['meta']['load_s']:.1f} s; running {cfg.minutes:g} min")

        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        start_at = time.time() + 10.0  # spawned interpreters import numpy, grpc and vindex first
        end_at = start_at + cfg.seconds
        cfg_dict = dataclasses.asdict(cfg)
        specs = [("search", cfg.search_rate / cfg.search_clients) for _ in range(cfg.search_clients)]
        specs += [("upsert", cfg.upsert_rate), ("delete", cfg.delete_rate), ("get", cfg.get_rate)]
        for seed, (kind, rate) in enumerate(specs, 1):
            p = ctx.Process(target=_client, args=(kind, server.target, cfg_dict, seed, rate, start_at, end_at, out))
            p.start()
            procs.append(p)

        store_dir = os.path.join(data_dir, "collections", COLLECTION, "store")
        samples, stats = [], []
        next_sample = start_at
        next_log = start_at + cfg.window_s
        while True:
            now = time.time()
            if now >= end_at + 1e-3:
                break
            if now < next_sample:
                time.sleep(min(next_sample, end_at + 1e-3) - now)
                continue
            if server.proc.poll() is not None:
                raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log()}")
            sample = {"t": now - start_at, **proc_sample(server.pid), "wal_mb": wal_mb(store_dir)}
            s = col.stats()
            # the block cache and the postings the store keeps in memory, both capped by design
            sample["cache_mb"] = (s["store"].get("block_cache_usage", 0) + s["store"].get("kept_allocated_bytes", 0)) / 2**20
            sample["sst_mb"] = s["store"].get("sst_bytes", 0) / 2**20
            sample["unaccounted_mb"] = (sample["rss_mb"] - MEMTABLE_PER_WAL_BYTE * sample["wal_mb"]
                                        - sample["cache_mb"])
            samples.append(sample)
            if now >= next_log:
                stats.append({"t": now - start_at, **{k: s[k] for k in (
                    "live", "heads", "splits", "merges", "reassigns", "gc", "background_queue",
                    "background_errors", "log_seq", "checkpoint_seq", "memory_bytes")}})
                next_log += cfg.window_s
                log(f"soak: {now - start_at:5.0f} s  rss {sample['rss_mb']:.1f} MiB (wal {sample['wal_mb']:.1f}, "
                    f"cache {sample['cache_mb']:.1f})  threads {sample['threads']}  fds {sample['fds']}  "
                    f"live {s['live']}  heads {s['heads']}  splits {s['splits']}  queue {s['background_queue']}")
            next_sample += cfg.sample_s
        results = [out.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        final_stats = col.stats()
        client.close()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        rc = server.stop()
        server_log = server.log()
        if own_root:
            shutil.rmtree(root, ignore_errors=True)

    calls: dict[str, dict] = {}
    for kind, starts, lats, oks, errors, skipped in results:
        c = calls.setdefault(kind, {"starts": [], "lats": [], "oks": [], "errors": [], "skipped": 0})
        c["starts"].append(starts - start_at)
        c["lats"].append(lats)
        c["oks"].append(oks)
        c["errors"] += errors
        c["skipped"] += skipped
    for c in calls.values():
        for key in ("starts", "lats", "oks"):
            c[key] = np.concatenate(c[key])
    result["samples"] = samples
    result["stats"] = stats
    result["final_stats"] = {k: final_stats[k] for k in (
        "live", "tombstones", "vids", "heads", "splits", "merges", "reassigns", "gc", "background_errors",
        "posting_max", "postings_over_limit", "replicas_mean", "log_seq", "checkpoint_seq")}
    result["windows"] = windows(cfg, calls, samples)
    result["calls"] = {kind: {"count": int(c["oks"].size), "errors": int((~c["oks"]).sum()),
                              "skipped": int(c["skipped"]), "first_errors": c["errors"][:10],
                              "rate_per_s": float(c["oks"].size / cfg.seconds),
                              "p50_ms": _pct(c["lats"], 50), "p99_ms": _pct(c["lats"], 99)}
                       for kind, c in sorted(calls.items())}
    bad_log = [line for line in server_log.splitlines()
               if "Traceback" in line or "internal error" in line or " ERROR " in line]
    result["server"] = {"exit_code": rc, "log_errors": bad_log[:20], "log_error_lines": len(bad_log)}
    result["criteria"] = evaluate(cfg, result)
    result["passed"] = all(c["ok"] for c in result["criteria"].values())
    return result


def _pct(lats: np.ndarray, q: float) -> float | None:
    return float(np.percentile(lats, q) * 1e3) if lats.size else None


def windows(cfg: SoakConfig, calls: dict, samples: list[dict]) -> list[dict]:
    """Per window: search p50/p99, calls and errors by kind, and the last /proc sample."""
    n = max(1, int(round(cfg.seconds / cfg.window_s)))
    out = []
    for w in range(n):
        lo, hi = w * cfg.window_s, (w + 1) * cfg.window_s
        row: dict[str, Any] = {"window": w, "t0": lo, "t1": hi}
        for kind, c in sorted(calls.items()):
            sel = (c["starts"] >= lo) & (c["starts"] < hi)
            row[f"{kind}_calls"] = int(sel.sum())
            row[f"{kind}_errors"] = int((~c["oks"][sel]).sum())
            if kind == "search":
                row["search_p50_ms"] = _pct(c["lats"][sel], 50)
                row["search_p99_ms"] = _pct(c["lats"][sel], 99)
        inside = [s for s in samples if lo <= s["t"] < hi + 1e-6]
        if inside:
            last = inside[-1]
            row.update(rss_mb=last["rss_mb"], wal_mb=last["wal_mb"], cache_mb=last["cache_mb"],
                       unaccounted_mb=last["unaccounted_mb"], threads=last["threads"], fds=last["fds"],
                       rss_max_mb=max(s["rss_mb"] for s in inside))
        out.append(row)
    return out


def evaluate(cfg: SoakConfig, result: dict) -> dict[str, dict]:
    """The pass criteria (module docstring) over a result: name -> {ok, value, limit, ...}."""
    crit: dict[str, dict] = {}
    errors = sum(c["errors"] for c in result["calls"].values())
    server = result["server"]
    crit["errors"] = {"ok": errors == 0 and server["exit_code"] == 0 and server["log_error_lines"] == 0
                      and result["final_stats"]["background_errors"] == 0,
                      "client_errors": errors, "server_exit_code": server["exit_code"],
                      "server_log_errors": server["log_error_lines"],
                      "background_errors": result["final_stats"]["background_errors"]}
    warm = cfg.warmup * cfg.seconds
    post = [s for s in result["samples"] if s["t"] >= warm]
    if len(post) < 4:
        crit["samples"] = {"ok": False, "value": len(post), "limit": 4}
        return crit
    t = np.array([s["t"] for s in post])
    rss = np.array([s["rss_mb"] for s in post])
    mem = np.array([s["unaccounted_mb"] for s in post])
    span = float(t[-1] - t[0])
    slope = float(np.polyfit(t, mem, 1)[0])          # MiB per second
    rss_slope = float(np.polyfit(t, rss, 1)[0])
    limit = max(cfg.rss_growth * float(np.median(mem)), cfg.rss_floor_mb)
    crit["rss_flat"] = {"ok": slope * span < limit, "value": slope * span, "limit": limit,
                        "slope_mb_per_min": slope * 60, "rss_slope_mb_per_min": rss_slope * 60,
                        "rss_post_warmup_first_mb": float(rss[0]), "rss_last_mb": float(rss[-1]),
                        "wal_first_mb": float(post[0]["wal_mb"]), "wal_last_mb": float(post[-1]["wal_mb"]),
                        "cache_last_mb": float(post[-1]["cache_mb"]),
                        "unaccounted_first_mb": float(mem[0]), "unaccounted_last_mb": float(mem[-1]),
                        # a memtable flush (table files grow) frees memtable memory while the log
                        # files may stay: the remainder then understates memory (reported, not failed)
                        "memtable_flushed": bool(post[-1]["sst_mb"] > post[0]["sst_mb"])}
    half = len(post) // 2
    for key, slack in (("threads", cfg.thread_slack), ("fds", cfg.fd_slack)):
        first = max(s[key] for s in post[:half])
        second = max(s[key] for s in post[half:])
        crit[f"{key}_flat"] = {"ok": second <= first + slack, "value": second, "limit": first + slack,
                               "first_half_max": first, "second_half_max": second}
    wins = [w for w in result["windows"] if w["t0"] >= warm and w.get("search_p99_ms") is not None]
    if len(wins) >= 2:
        base, last = wins[0]["search_p99_ms"], wins[-1]["search_p99_ms"]
        limit = cfg.p99_factor * base + cfg.p99_floor_ms
        crit["p99_stable"] = {"ok": last <= limit, "value": last, "limit": limit, "first_post_warmup_ms": base}
    else:
        crit["p99_stable"] = {"ok": False, "value": None, "limit": None, "note": "fewer than 2 post-warm-up windows"}
    return crit


def summary(cfg: SoakConfig, result: dict) -> str:
    lines = [f"soak: {cfg.minutes:g} min, {result['meta']['cores']} cores, load per s: search {cfg.search_rate:g}, "
             f"upsert {cfg.upsert_rate:g} x {cfg.upsert_batch}, delete {cfg.delete_rate:g} x {cfg.delete_batch}, "
             f"get {cfg.get_rate:g} x {cfg.get_batch}; ids 0..{cfg.n_ids - 1}, dim {cfg.dim}",
             "window  t(s)   search  p50 ms  p99 ms  upserts  deletes  gets  errors  rss MiB  wal MiB  "
             "cache MiB  rest MiB  threads  fds"]
    for w in result["windows"]:
        errs = sum(v for k, v in w.items() if k.endswith("_errors"))
        lines.append(f"{w['window']:>6}  {w['t1']:>4.0f}  {w.get('search_calls', 0):>7}  "
                     f"{w.get('search_p50_ms') or 0:>6.2f}  {w.get('search_p99_ms') or 0:>6.2f}  "
                     f"{w.get('upsert_calls', 0):>7}  {w.get('delete_calls', 0):>7}  {w.get('get_calls', 0):>4}  "
                     f"{errs:>6}  {w.get('rss_mb', 0):>7.1f}  {w.get('wal_mb', 0):>7.1f}  {w.get('cache_mb', 0):>9.1f}  "
                     f"{w.get('unaccounted_mb', 0):>8.1f}  {w.get('threads', 0):>7}  {w.get('fds', 0):>3}")
    for kind, c in result["calls"].items():
        lines.append(f"{kind}: {c['count']} calls ({c['rate_per_s']:.1f}/s), {c['errors']} errors, "
                     f"{c['skipped']} slots skipped, p50 {c['p50_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms"
                     + (f"; first error: {c['first_errors'][0]}" if c["first_errors"] else ""))
    fs = result["final_stats"]
    lines.append(f"index at the end: {fs['live']} live, {fs['heads']} heads, {fs['splits']} splits, "
                 f"{fs['merges']} merges, {fs['reassigns']} reassigns, {fs['gc']} gc, "
                 f"{fs['background_errors']} background errors")
    for name, c in result["criteria"].items():
        detail = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in c.items() if k != "ok")
        lines.append(f"{'PASS' if c['ok'] else 'FAIL'} {name}: {detail}")
    lines.append("soak: PASSED" if result["passed"] else "soak: FAILED")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--window", type=float, default=None, help="seconds per window (default: minutes * 6)")
    ap.add_argument("--sample", type=float, default=5.0, help="seconds between /proc samples")
    ap.add_argument("--malloc-arena-max", type=int, default=None,
                    help="MALLOC_ARENA_MAX for the server (1 removes glibc's arena drift: leak hunting)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "soak.json"))
    args = ap.parse_args(argv)
    cfg = SoakConfig(minutes=args.minutes, window_s=args.window or max(10.0, args.minutes * 6.0),
                     sample_s=args.sample)
    env = None if args.malloc_arena_max is None else {"MALLOC_ARENA_MAX": str(args.malloc_arena_max)}
    result = run_soak(cfg, log=lambda s: print(s, file=sys.stderr, flush=True), server_env=env)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=float)
    print(summary(cfg, result))
    print(f"wrote {args.out}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
