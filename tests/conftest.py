"""Shared fixtures: bundled data sets, brute-force oracles, compiled kernels, threads run for a while,
waiting for another thread to get somewhere."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


def load_npz(name: str) -> dict:
    with np.load(os.path.join(DATA, name)) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="session", autouse=True)
def _kernels_compiled():
    """Compile (or load) every kernel once, so tests time nothing but themselves."""
    import vindex

    vindex.warmup()


@pytest.fixture(scope="session")
def bigann():
    return load_npz("bigann-10k-u8-l2.npz")


@pytest.fixture(scope="session")
def wiki():
    return load_npz("wiki-minilm-15k-cos.npz")


def brute_force(base: np.ndarray, queries: np.ndarray, k: int, metric: str = "l2",
                ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k as vindex defines it: ascending distance, ties broken by the smaller id."""
    base = base.astype(np.float64)
    queries = queries.astype(np.float64)
    if metric == "cosine":
        base = base / np.linalg.norm(base, axis=1, keepdims=True)
        queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
        d = (1.0 - queries @ base.T)
    elif metric == "ip":
        d = -(queries @ base.T)
    else:
        # float64 expansion: exact for integer-valued data such as bigann's uint8
        d = (queries ** 2).sum(1)[:, None] - 2 * queries @ base.T + (base ** 2).sum(1)[None, :]
    ids = np.arange(base.shape[0]) if ids is None else np.asarray(ids)
    order = np.lexsort((np.broadcast_to(ids, d.shape), d), axis=1)[:, :k]
    return ids[order], np.take_along_axis(d, order, axis=1)


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int = 10) -> float:
    hits = [len(set(f[:k][f[:k] >= 0].tolist()) & set(t[:k].tolist())) for f, t in zip(found, truth)]
    return float(np.mean(hits)) / k


def run_for(threads: list[threading.Thread], seconds: float, stop: threading.Event) -> None:
    """Start ``threads``, let them run ``seconds``, then set ``stop`` and wait for them."""
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()


def wait_until(cond, what: str = "the condition", timeout: float = 10.0) -> None:
    """Synchronise with another thread (not an assertion on timing): poll ``cond`` until it
    holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray of 2 CPUs for the whole session (tests/test_cluster*.py), started on first use."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
