"""A sharded collection's writes give way to its searches: the coordinator's pacing and the
replicas' write-thread priority."""
from __future__ import annotations

import os
import threading

import pytest

pytest.importorskip("ray")

from vindex.config import IndexConfig  # noqa: E402
from vindex.cluster.pacing import WritePacing  # noqa: E402
from vindex.cluster.priority import WritePriority  # noqa: E402


def _in_thread(fn):
    """``fn()``'s result, run on a new thread (a thread's nice must not leak into the test's)."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_write_thread_runs_low_priority_only_after_searches():
    prio = WritePriority(window=3600.0, nice=7)
    assert _in_thread(prio.before_write) == os.getpriority(os.PRIO_PROCESS, 0)  # no search yet
    prio.searched()

    def low_then_back() -> tuple[int, int]:
        low = prio.before_write()
        prio.window = 0.0  # the search is now outside the window
        return low, prio.before_write()

    low, after = _in_thread(low_then_back)
    assert low == 7
    # raising a thread's priority back needs privilege; without it the thread stays low
    assert after in (0, 7)


def test_a_write_waits_for_a_running_small_search():
    pacing = WritePacing(IndexConfig(interactive_p99_ms=5000))
    searching, release, wrote = threading.Event(), threading.Event(), threading.Event()

    def search() -> None:
        with pacing.search(1):
            searching.set()
            release.wait()

    def write() -> None:
        with pacing.write():
            wrote.set()

    s = threading.Thread(target=search)
    s.start()
    searching.wait()
    w = threading.Thread(target=write)
    w.start()
    assert not wrote.wait(0.3)  # held back while the search runs
    release.set()
    assert wrote.wait(5.0)
    s.join()
    w.join()


def test_a_write_does_not_wait_for_a_large_batch_or_under_fifo():
    for config, queries in ((IndexConfig(interactive_p99_ms=5000), 1000),
                            (IndexConfig(interactive_p99_ms=5000, io_scheduler="fifo"), 1)):
        pacing = WritePacing(config)
        done = threading.Event()

        def write() -> None:
            with pacing.write():
                done.set()

        with pacing.search(queries):
            t = threading.Thread(target=write)
            t.start()
            assert done.wait(2.0)  # not held for the 5 s target
            t.join()


def test_slow_searches_cut_the_writers_share():
    now = [0.0]
    pacing = WritePacing(IndexConfig(interactive_p99_ms=0.001), clock=lambda: now[0])
    assert pacing.duty == 1.0
    for _ in range(5):  # each window's searches miss a 1 us target
        with pacing.search(1):
            sum(range(1000))
        now[0] += 1.0
    with pacing.write():
        pass
    assert 0.7 <= pacing.duty < 1.0  # halved, down to the floor writes keep at least
    for _ in range(5):  # windows without searches: back up a step each
        now[0] += 1.0
        with pacing.write():
            pass
    assert pacing.duty == 1.0


def test_overlapping_writers_are_charged_their_union_of_wall_time():
    pacing = WritePacing(IndexConfig())  # no searches: the writers' share is all of the time
    inside = threading.Barrier(2)

    def write() -> None:
        with pacing.write():
            inside.wait()  # both writes running at once...
            threading.Event().wait(0.3)  # ...for 0.3 s: 0.3 s of wall time, not 0.6

    threads = [threading.Thread(target=write) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pacing.duty == 1.0
    assert pacing._pacer.paused_s == 0.0  # charged the sum, the second writer would pause 0.3 s
