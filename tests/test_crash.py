"""Crash harness in CI: 30 kill -9 cycles of a writing child with rebalancing running
(``python -m bench.crash --cycles 300`` runs the long version)."""
from __future__ import annotations

import pytest

from bench import crash


def test_thirty_kill9_cycles_lose_nothing_acknowledged(tmp_path):
    totals = crash.run(str(tmp_path / "idx"), cycles=30, seed=1, log=None)
    assert totals.problems == []
    assert totals.lost == 0 and totals.resurrected == 0 and totals.torn == 0
    assert totals.verify_failures == 0
    # the kills landed while work was acknowledged, not only before the child was ready
    assert totals.acknowledged_ops > 100 and totals.acknowledged_writes > 1000


def test_kill9_cycles_on_the_block_store(tmp_path):
    """The block store reopens after each kill by reading back the blocks of the commits since
    its last sync (what a power loss could have lost): with the data all there, it keeps them."""
    totals = crash.run(str(tmp_path / "idx"), cycles=15, seed=3, log=None, store="blocks")
    assert totals.problems == []
    assert totals.lost == 0 and totals.resurrected == 0 and totals.torn == 0
    assert totals.verify_failures == 0
    assert totals.acknowledged_ops > 50 and totals.acknowledged_writes > 500


@pytest.mark.slow
def test_hundred_kill9_cycles(tmp_path):
    totals = crash.run(str(tmp_path / "idx"), cycles=100, seed=2, log=None)
    assert totals.problems == []
