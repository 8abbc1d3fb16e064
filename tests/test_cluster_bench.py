"""bench/sharded.py end to end on a small synthetic set."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")


def test_sharded_bench_runs_small(ray_local, tmp_path):
    from bench import sharded

    assert sharded.main(["--dataset", "synthetic-5k", "--queries", "100", "--latency-queries", "50",
                         "--repeat", "1", "--settings", "8,32", "--congruence-n", "3k", "--kills", "2",
                         "--kill-rows", "3k", "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "sharded.json").read_text())
    assert out["congruence"]["identical_ids"] and out["congruence"]["identical_distances"]
    assert out["faults"]["lost"] == 0 and out["faults"]["kills"] >= 1
    assert out["ingest"]["sharded_rows_per_s"] > 0 and out["latency"]["sharded"]["idle"]["p99"] > 0


def test_sharded_bench_refuses_unknown_or_dangling_parts(capsys):
    from bench import sharded

    for parts, says in (("ingest,bogus", "unknown ['bogus']"), ("search", "add ingest")):
        with pytest.raises(SystemExit):
            sharded.main(["--parts", parts])
        assert says in capsys.readouterr().err
