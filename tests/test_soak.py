"""One-minute soak of the gRPC service: the harness of ``python -m bench.soak`` (a real
``vindex serve`` subprocess under a bounded mixed load of searches, upserts, deletes and gets
from client processes) with the same pass criteria: no errors, memory outside RocksDB's
memtables and block cache flat, threads and file descriptors not growing, search p99 stable.
Marked ``soak`` (not ``slow``), so ``make test`` and CI run it; ``-m "not soak"`` skips it."""
from __future__ import annotations

import pytest

from bench.soak import SoakConfig, run_soak, summary


@pytest.mark.soak
def test_soak_one_minute(tmp_path):
    cfg = SoakConfig(minutes=1.0, window_s=15.0, sample_s=2.0)
    result = run_soak(cfg, root=str(tmp_path), log=lambda line: None)
    text = summary(cfg, result)
    print("\n" + text)
    failed = sorted(name for name, c in result["criteria"].items() if not c["ok"])
    assert not failed, f"soak criteria failed: {failed}\n{text}"
    # the load was delivered: a stalled harness would pass every criterion trivially
    for kind, rate in (("search", cfg.search_rate), ("upsert", cfg.upsert_rate),
                       ("delete", cfg.delete_rate), ("get", cfg.get_rate)):
        assert result["calls"][kind]["count"] >= 0.8 * rate * cfg.seconds, (kind, result["calls"][kind])
    assert result["final_stats"]["splits"] > 0 and result["final_stats"]["reassigns"] > 0
