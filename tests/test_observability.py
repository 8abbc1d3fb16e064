"""Index.metrics() and the live recall monitor (vindex.searchtap, vindex.gauges,
vindex.exact_scan, vindex.recall_monitor)."""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest

import vindex
from vindex.exact_scan import exact_topk
from vindex.recall_monitor import RecallMonitor

from conftest import brute_force, recall_at_k, wait_until

DIM = 16


def clusters(n: int, seed: int, n_centres: int = 20) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_centres, DIM)).astype(np.float32)
    return (centres[rng.integers(0, n_centres, n)] + 0.25 * rng.normal(size=(n, DIM))).astype(np.float32)


def small_index(path, x: np.ndarray, **config) -> vindex.Index:
    # max_postings=2 over small postings: recall near 0.6, room to move both ways
    config = {"max_postings": 2, "posting_limit_bytes": 4096, "recall_monitor_cpu": 0.0, **config}
    return vindex.Index.build(path, x, **config)


def search_in_small_calls(index: vindex.Index, q: np.ndarray) -> np.ndarray:
    """Search ``q`` 16 rows a call (each call leaves all its rows for the monitor)."""
    return np.concatenate([index.search(q[lo:lo + 16], 10).ids for lo in range(0, q.shape[0], 16)])


def test_metrics_count_searches_writes_and_sizes(tmp_path):
    x = clusters(3000, 1)
    with small_index(tmp_path / "i", x) as index:
        before = index.metrics()
        assert before["live_vectors"] == 3000 and before["searches"] == 0 and before["rows_written"] == 0
        index.search(x[:5], 10)
        index.search(x[:7], 10)
        index.upsert(np.arange(3000, 3100), x[:100] + 0.01)
        assert index.delete(np.arange(10)) == 10
        index.wait_idle()  # no split between reading metrics and stats
        m = index.metrics()
        assert (m["searches"], m["queries"]) == (2, 12)
        assert (m["rows_written"], m["rows_deleted"]) == (100, 10)
        assert m["live_vectors"] == 3090 and m["tombstones"] >= 10
        assert m["postings"] == index.stats()["postings"] and m["heads"] == index.stats()["heads"]
        assert m["store_bytes"] > 0 and m["rss_bytes"] > 50 << 20 and m["memory_bytes"] > 0
        for key in ("splits_pending", "merges_pending", "reassigns_pending", "scrub_pending", "postings_pending"):
            assert m[key] >= 0
        assert set(m["io_queued"]) == {"interactive", "update", "background"}
        assert m["io_yields"] >= 0
        assert all(isinstance(v, (int, float, dict, type(None))) for v in m.values())


def test_backlog_counts_postings_over_their_budget_while_the_background_is_held(tmp_path):
    x = clusters(3000, 2)
    with small_index(tmp_path / "i", x) as index:
        with index.pause_background():
            index.upsert(np.arange(3000, 6000), clusters(3000, 3))
            m = index.metrics()
            assert m["splits_pending"] > 0 and m["postings_pending"] >= m["splits_pending"]
        index.wait_idle()
        assert index.metrics()["splits_pending"] == 0


def test_exact_scan_matches_brute_force_after_updates(tmp_path):
    x = clusters(3000, 4)
    with small_index(tmp_path / "i", x) as index:
        index.upsert(np.arange(100), x[:100] + 2.0)  # replaced: only the new copies count
        index.delete(np.arange(100, 200))
        index.wait_idle()
        live = np.concatenate([np.arange(100), np.arange(200, 3000)])
        stored = np.concatenate([x[:100] + 2.0, x[200:]])
        q = clusters(40, 5)
        truth, _ = brute_force(stored, q, 10, ids=live)
        found = exact_topk(index._engine, q, 10)
        assert recall_at_k(found, truth) > 0.995  # float32 against float64: a rare tie may differ


def test_estimate_on_a_healthy_index_is_within_002_of_true_recall(tmp_path):
    x = clusters(4000, 1)
    with small_index(tmp_path / "i", x) as index:
        q = clusters(256, 6)
        served = search_in_small_calls(index, q)
        true = recall_at_k(served, brute_force(x, q, 10)[0])
        est = index.check_recall(256)
        assert est["source"] == "queries" and est["samples"] == 256
        assert abs(est["recall"] - true) <= 0.02, (est, true)  # measured: 0.586 against 0.584
        assert est["low"] <= est["recall"] <= est["high"] and est["high"] - est["low"] < 0.1
        assert 0.4 < true < 0.8  # the setting leaves recall room to move
        assert index.stats()["recall"]["recall"] == est["recall"]
        assert index.metrics()["recall_estimate"] == est["recall"]


def test_estimate_falls_with_rebalancing_off_under_deletes(tmp_path):
    """Deleting 60% of the vectors leaves postings sparse; without merges, max_postings=2
    reaches fewer neighbours (measured: 0.586 -> 0.520); the estimate follows every round."""
    x = clusters(4000, 1)
    rng = np.random.default_rng(0)
    q = clusters(256, 6)
    live = np.arange(4000)
    with small_index(tmp_path / "i", x, rebalance=False) as index:
        estimates = []
        for r in range(4):
            if r:
                kill = rng.choice(live, 800, replace=False)
                index.delete(kill)
                live = np.setdiff1d(live, kill)
            served = search_in_small_calls(index, q)
            true = recall_at_k(served, brute_force(x[live], q, 10, ids=live)[0])
            est = index.check_recall(256)["recall"]
            assert abs(est - true) <= 0.02, (r, est, true)
            estimates.append(est)
        assert estimates[-1] < estimates[0] - 0.04, estimates


def test_stored_vectors_stand_in_when_nobody_searched(tmp_path):
    x = clusters(2000, 7)
    with small_index(tmp_path / "i", x) as index:
        est = index.check_recall(32)
        assert est["source"] == "stored" and est["samples"] == 32 and 0 < est["recall"] <= 1
        index.search(x[:3], 10)
        assert index.check_recall(32)["samples"] == 35  # only the 3 new queries: none twice


def test_alert_logs_once_when_the_estimate_is_under_recall_alert(tmp_path, caplog):
    x = clusters(3000, 8)
    with small_index(tmp_path / "i", x, recall_alert=0.95) as index:
        q = clusters(64, 9)
        with caplog.at_level(logging.WARNING, logger="vindex.recall"):
            for _ in range(2):
                search_in_small_calls(index, q)
                index.check_recall(64)
        alerts = [r for r in caplog.records if "under recall_alert" in r.getMessage()]
        assert len(alerts) == 1


def test_background_passes_stay_within_their_cpu_share(tmp_path):
    x = clusters(3000, 10)
    with small_index(tmp_path / "i", x) as index:
        monitor = RecallMonitor(index, k=10, cpu_share=0.2, alert=0.0, first_delay_s=0.0)
        started = time.perf_counter()
        monitor.start()
        try:
            wait_until(lambda: monitor.passes >= 5, "five background passes", timeout=30)
            elapsed = time.perf_counter() - started
        finally:
            monitor.close()
        assert monitor.passes >= 5 and monitor.estimate()["source"] == "stored"
        assert monitor.busy_s <= 0.2 * elapsed * 1.5 + 0.05, (monitor.busy_s, elapsed)


def test_config_rejects_a_share_over_one_core(tmp_path):
    with pytest.raises(vindex.InvalidConfigError, match="recall_monitor_cpu"):
        vindex.Index.create(tmp_path / "i", dim=4, recall_monitor_cpu=2.0)


def test_progress_of_replay_verify_and_wait_idle(tmp_path, caplog, capsys):
    x = clusters(3000, 11)
    path = tmp_path / "i"
    index = small_index(path, x, rebalance=False)
    for lo in range(0, 600, 100):  # log records the next open replays
        index.upsert(np.arange(3000 + lo, 3100 + lo), clusters(100, 12 + lo))
    index._closed = True  # stop as a killed process would: no checkpoint at close
    index._finalizer()
    with caplog.at_level(logging.INFO, logger="vindex.progress"):
        with vindex.Index.open(path, progress="log", rebalance=True) as index:
            assert len(index) == 3600
            with index.pause_background():
                index.upsert(np.arange(4000, 7000), clusters(3000, 13))
            assert index.wait_idle(progress="log")
            assert index.verify(progress=True).ok
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith(f"replaying the log of {path}: done, ") for line in lines), lines
    assert any(line.startswith(f"background work of {path}: done") for line in lines), lines
    assert "verifying the postings" in capsys.readouterr().err  # the tqdm bar


def test_progress_rejects_an_unknown_mode(tmp_path):
    with small_index(tmp_path / "i", clusters(100, 14)) as index:
        with pytest.raises(ValueError, match="progress: expected True, False, None or 'log'"):
            index.verify(progress="bar")
