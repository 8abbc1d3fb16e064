"""Measurement helpers shared by the bench scripts: threads, timing, QPS, latency, RSS.

Timings use ``time.perf_counter`` and report medians, because this machine is shared and
noisy: a median of a few repeats ignores the odd descheduled run without hiding a real trend.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = [
    "batch_qps",
    "current_rss",
    "latencies",
    "limit_threads",
    "peak_rss",
    "percentiles",
    "rss_of_subprocess",
    "timed",
]

_THREAD_ENV = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
#: The repository's root: where ``python -m bench.X`` runs from.
REPO_ROOT = Path(__file__).resolve().parent.parent


def limit_threads(n: int = 1) -> None:
    """Limit numba, faiss/OpenMP and BLAS to ``n`` threads, now and for later imports.

    Env vars cover OpenMP/BLAS users not loaded yet (they read them at load time) and child
    processes; faiss, if loaded, is told directly. numba is imported here if needed and
    resized with ``set_num_threads`` rather than NUMBA_NUM_THREADS, because that env var
    would fix its pool size for good and a later ``limit_threads(2)`` could not raise it.
    """
    n = max(1, int(n))
    for var in _THREAD_ENV:
        os.environ[var] = str(n)
    try:
        import numba
    except ImportError:
        pass
    else:
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    if "faiss" in sys.modules:
        import faiss

        faiss.omp_set_num_threads(n)
    try:  # numpy's BLAS is loaded already; threadpoolctl (optional) can still resize it
        import threadpoolctl

        threadpoolctl.threadpool_limits(n)
    except ImportError:
        pass


def timed(fn: Callable[[], object], repeats: int = 3, min_seconds: float = 0.0, max_calls: int = 50) -> float:
    """Median wall-clock seconds of calls of ``fn()``: at least ``repeats`` of them, more
    until they add up to ``min_seconds`` (at most ``max_calls``), so that short calls are
    timed often enough for a descheduled one to fall out of the median."""
    times: list[float] = []
    while len(times) < max(1, repeats) or (sum(times) < min_seconds and len(times) < max_calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def batch_qps(
    search_fn: Callable[[np.ndarray], object], queries: np.ndarray, repeats: int = 3, warmup: int = 0,
    min_seconds: float = 0.0,
) -> float:
    """Median over the timed calls (see ``timed``) of ``nq / elapsed`` for one
    ``search_fn(queries)`` call.

    ``warmup`` untimed calls first (e.g. to trigger JIT compilation or fill caches).
    """
    for _ in range(warmup):
        search_fn(queries)
    return len(queries) / timed(lambda: search_fn(queries), repeats, min_seconds)


def paired_qps(
    search_a: Callable[[np.ndarray], object], search_b: Callable[[np.ndarray], object], queries: np.ndarray,
    repeats: int = 3, min_seconds: float = 0.0, max_pairs: int = 50,
) -> tuple[float, float, float]:
    """``(QPS of a, QPS of b, b's speed over a's)`` for one call over all ``queries`` each,
    the two taking turns (which goes first alternates), so a change in the machine's load
    hits both: medians over at least ``repeats`` pairs, more until ``a``'s calls add up to
    ``min_seconds`` (at most ``max_pairs``); the ratio is the median of the pairs' ratios."""
    ta: list[float] = []
    tb: list[float] = []
    while len(ta) < max(1, repeats) or (sum(ta) < min_seconds and len(ta) < max_pairs):
        for fn, out in ((search_a, ta), (search_b, tb))[:: 1 if len(ta) % 2 == 0 else -1]:
            t0 = time.perf_counter()
            fn(queries)
            out.append(time.perf_counter() - t0)
    nq = len(queries)
    ratio = statistics.median(a / b for a, b in zip(ta, tb))
    return nq / statistics.median(ta), nq / statistics.median(tb), ratio


def latencies(
    search_one_fn: Callable[[np.ndarray], object], queries: np.ndarray, n: int | None = None
) -> np.ndarray:
    """Per-query seconds, one ``search_one_fn(queries[i:i+1])`` call each (batch size 1).

    Uses the first ``n`` queries (all by default), after one untimed warm-up call.
    """
    q = queries if n is None else queries[:n]
    if len(q) == 0:
        return np.empty(0)
    search_one_fn(q[0:1])
    out = np.empty(len(q))
    clock = time.perf_counter
    for i in range(len(q)):
        row = q[i : i + 1]  # slice outside the timed region
        t0 = clock()
        search_one_fn(row)
        out[i] = clock() - t0
    return out


def percentiles(lat: np.ndarray) -> dict[str, float]:
    """``{"p50", "p99", "p999"}`` of per-query latencies given in seconds, in milliseconds."""
    lat = np.asarray(lat, dtype=np.float64)
    if lat.size == 0:
        return {"p50": float("nan"), "p99": float("nan"), "p999": float("nan")}
    p50, p99, p999 = np.percentile(lat, [50, 99, 99.9]) * 1e3
    return {"p50": float(p50), "p99": float(p99), "p999": float(p999)}


def _status_kb(field: str, status_path: str = "/proc/self/status") -> int | None:
    try:
        with open(status_path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def current_rss() -> int:
    """This process's resident set size in bytes (VmRSS; peak RSS where /proc is missing)."""
    kb = _status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    return peak_rss()


def peak_rss() -> int:
    """This process's peak resident set size in bytes (VmHWM / ru_maxrss)."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux KiB
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale)


_MARKER = "__VINDEX_RSS__"
# The child execs the caller's code in a namespace that stays alive, so whatever the code
# loaded is still resident when RSS is read; then it prints one marker line. It imports
# nothing heavy itself (importing numpy here would inflate the measurement).
_CHILD = f"""
import sys
_ns = {{"__name__": "__main__"}}
exec(compile(sys.argv[1], "<rss-child>", "exec"), _ns)
def _kb(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)
sys.stdout.flush()
print("\\n{_MARKER}", _kb("VmRSS") * 1024, _kb("VmHWM") * 1024, flush=True)
"""


def rss_of_subprocess(code: str, peak: bool = False, timeout: float | None = None, cwd: str | None = None) -> int:
    """Run ``code`` in a fresh ``sys.executable`` and return its RSS in bytes just before exit.

    The code runs as a script (its own prints are ignored; it must not call ``sys.exit``).
    With ``peak=True`` the child's peak RSS (VmHWM) is returned instead. The repo root is
    put on ``PYTHONPATH`` so the code can import ``bench`` and ``vindex``. Raises
    RuntimeError with the child's stderr if it fails.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd or str(REPO_ROOT),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MARKER)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or "")[-2000:]
        raise RuntimeError(f"RSS child failed (exit {proc.returncode}); stderr tail:\n{tail}")
    _, rss, hwm = lines[-1].split()
    return int(hwm if peak else rss)


def terminate(proc: subprocess.Popen, timeout: float = 120.0) -> int:
    """SIGTERM ``proc`` (if still running), wait up to ``timeout`` s, then SIGKILL; its exit code."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
