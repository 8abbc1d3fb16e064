"""Crash harness in CI: 30 kill -9 cycles of a writing child with rebalancing running
(``python -m bench.crash --cycles 300`` runs the long version), and its WAL-corruption mode on
the log of a killed writer (``python -m bench.crash --wal``)."""
from __future__ import annotations

import os

import pytest

from bench import crash, crashwal


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


# --- damaged write-ahead logs (bench.crashwal) ------------------------------------------------------
WAL_ROWS = 3000


@pytest.fixture(scope="module", params=["rocksdb", "blocks"])
def killed(request, tmp_path_factory):
    """An index whose writer was SIGKILLed mid-upsert after 3,000 acknowledged rows (a
    checkpoint after the first 1,500)."""
    path = str(tmp_path_factory.mktemp(f"wal-{request.param}") / "idx")
    return crashwal.write_and_kill(path, WAL_ROWS, store=request.param, checkpoint_at=WAL_ROWS // 2)


@pytest.mark.parametrize("fraction", [0.1, 0.5])
def test_a_flipped_byte_in_the_write_ahead_log_fails_the_open(killed, tmp_path, fraction):
    """Damage before the log's tail loses acknowledged rows if replay stops there: the open
    raises CorruptionError naming the log, changes nothing, and a retry fails the same way."""
    run = crashwal.copy_of(killed, str(tmp_path / "idx"))
    start = run.checkpoint[1] if run.checkpoint[0] == crashwal.newest_log(run.path) else 0
    size = os.path.getsize(crashwal.newest_log(run.path))
    assert crashwal.check_flip(run, start + int((size - start) * fraction)) is None


def test_a_truncated_write_ahead_log_opens_with_the_batches_before_the_cut(killed, tmp_path):
    run = crashwal.copy_of(killed, str(tmp_path / "idx"))
    log = crashwal.newest_log(run.path)
    start = run.checkpoint[1] if run.checkpoint[0] == log else 0
    assert crashwal.check_cut(run, (start + os.path.getsize(log)) // 2) is None


def test_a_write_ahead_log_cut_before_the_checkpoint_fails_the_open(killed, tmp_path):
    """The checkpoint covers records the cut took away (with their postings): CorruptionError,
    not a state that names vectors the store no longer holds."""
    if killed.store == "blocks":
        pytest.skip("a checkpoint starts a new block-store log: no cut reaches before it")
    run = crashwal.copy_of(killed, str(tmp_path / "idx"))
    assert run.checkpoint[0] == crashwal.newest_log(run.path)
    assert crashwal.check_cut(run, run.checkpoint[1] // 2) is None
