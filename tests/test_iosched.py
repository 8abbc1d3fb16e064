"""The SLA I/O scheduler: class ordering, deadline drops, pacing and quotas.

Policy tests drive ``Queues`` / ``TokenBucket`` / ``Aimd`` with explicit times; thread tests
use events, never sleeps, to decide what may have run."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import wait_until

from vindex.iosched import (Aimd, BusyClock, DeadlineExpired, IOScheduler, IOTargets, Queues, Request,
                            ResourceExhaustedError, TokenBucket, percentile)
from vindex.storage import IOClass

I, U, B = IOClass.INTERACTIVE, IOClass.UPDATE, IOClass.BACKGROUND


def _req(io, deadline=float("inf"), seq=0, tenant="t", cost=1.0):
    return Request(deadline, seq, io, tenant, lambda: seq, cost)


def test_interactive_is_earliest_deadline_first_and_drops_expired_requests():
    q = Queues("sla", limit=100, background=None)
    for seq, d in enumerate([5.0, 3.0, 9.0, 1.0, 2.0]):
        q.push(_req(I, d, seq))
    req, expired, _ = q.pop(I, now=2.5)
    assert [r.deadline for r in expired] == [1.0, 2.0]  # past their deadline: dropped, not run
    assert req.deadline == 3.0
    assert [q.pop(I, now=2.5)[0].deadline for _ in range(2)] == [5.0, 9.0]
    assert q.pop(I, now=2.5)[0] is None
    assert q.dropped[I] == 2


def test_classes_never_share_a_queue_under_sla():
    q = Queues("sla", limit=100, background=None)
    q.push(_req(B, seq=0))
    q.push(_req(U, seq=1))
    q.push(_req(I, 10.0, seq=2))
    assert q.pop(I, 0.0)[0].seq == 2 and q.pop(I, 0.0)[0] is None
    assert q.pop(U, 0.0)[0].seq == 1 and q.pop(U, 0.0)[0] is None
    assert q.pop(B, 0.0)[0].seq == 0


def test_fifo_serves_every_class_in_arrival_order_without_drops():
    q = Queues("fifo", limit=100, background=None)
    for seq, io in enumerate([B, B, I, U]):
        q.push(_req(io, deadline=0.5, seq=seq))
    order = [q.pop(None, now=10.0)[0] for _ in range(4)]
    assert [r.seq for r in order] == [0, 1, 2, 3]
    assert q.dropped[I] == 0


def test_background_is_paced_by_its_token_bucket():
    bucket = TokenBucket(rate=10.0, burst=2.0, now=0.0)
    q = Queues("sla", limit=100, background=bucket)
    for seq in range(3):
        q.push(_req(B, seq=seq))
    assert q.pop(B, 0.0)[0].seq == 0
    assert q.pop(B, 0.0)[0].seq == 1
    req, _, wait = q.pop(B, 0.0)
    assert req is None and wait == pytest.approx(0.1)
    assert q.pop(B, 0.1)[0].seq == 2


def test_bounded_queues_refuse_instead_of_buffering():
    q = Queues("sla", limit=2, background=None)
    q.push(_req(U, seq=0))
    q.push(_req(U, seq=1))
    with pytest.raises(ResourceExhaustedError, match="update I/O queue is full"):
        q.push(_req(U, seq=2))
    q.push(_req(I, 1.0, seq=3))  # other classes have their own room


def test_aimd_halves_on_a_missed_target_and_grows_on_target():
    bucket = TokenBucket(rate=100.0, burst=10.0, now=0.0)
    aimd = Aimd(bucket, target_s=0.002, step=10.0, floor=5.0, ceiling=120.0, window=1.0, now=0.0)
    for t in range(10):
        aimd.observe(0.010, now=0.05 * t)  # slow searches in the first window
    aimd.observe(0.010, now=1.0)
    assert bucket.rate == 50.0
    aimd.observe(0.001, now=2.0)
    assert bucket.rate == 60.0
    for w in range(3, 10):
        aimd.tick(now=float(w))  # quiet windows: on target
    assert bucket.rate == 120.0  # capped
    for w in range(10, 20):
        aimd.observe(1.0, now=float(w))
    assert bucket.rate == 5.0  # floored


def test_the_pacers_percentile_is_numpys():
    """The pacer's p99 is computed in Python (numpy's partition releases the GIL inside the
    search that closes a window); it interpolates as ``np.percentile`` does."""
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 100, 1001):
        samples = rng.exponential(size=n).tolist()
        for q in (0, 50, 99, 100):
            assert percentile(samples, q) == pytest.approx(float(np.percentile(samples, q)), rel=1e-12)


def test_tenant_quotas_refuse_with_resource_exhausted():
    now = [0.0]
    s = IOScheduler("sla", tenant_rate=1.0, tenant_burst=2.0, clock=lambda: now[0])
    try:
        assert s.run(I, lambda: 1, tenant="a") == 1
        assert s.run(I, lambda: 2, tenant="a") == 2
        with pytest.raises(ResourceExhaustedError, match="tenant 'a'"):
            s.submit(I, lambda: 3, tenant="a")
        assert s.run(I, lambda: 4, tenant="b") == 4  # another tenant is not affected
        now[0] = 1.0  # a second later a's bucket holds a token again
        assert s.run(I, lambda: 5, tenant="a") == 5
    finally:
        s.close()


def test_a_search_runs_while_background_work_blocks_its_workers():
    s = IOScheduler("sla", workers={I: 1, U: 1, B: 1})
    release, started = threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(30)
        return "bg"

    try:
        bg = s.submit(B, slow)
        assert started.wait(30)
        assert s.submit(I, lambda: "search").result(timeout=30) == "search"
        assert not bg.done()  # the search did not wait for it
        release.set()
        assert bg.result(timeout=30) == "bg"
    finally:
        release.set()
        s.close()


def test_under_fifo_a_search_waits_behind_background_work():
    s = IOScheduler("fifo", workers={I: 1})  # one shared worker
    release, started = threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(30)

    try:
        bg = s.submit(B, slow)
        assert started.wait(30)
        search = s.submit(I, lambda: "search")
        assert not search.done()  # the only worker is busy with the background request
        release.set()
        assert search.result(timeout=30) == "search"
        assert bg.done()
    finally:
        release.set()
        s.close()


def test_an_interactive_request_past_its_deadline_is_dropped_not_run():
    now = [0.0]
    ran = []
    s = IOScheduler("sla", workers={I: 1, U: 1, B: 1}, clock=lambda: now[0])
    release, started = threading.Event(), threading.Event()

    def hold():
        started.set()
        release.wait(30)

    try:
        s.submit(I, hold)  # occupies the only interactive worker
        assert started.wait(30)
        late = s.submit(I, lambda: ran.append("late"), deadline=1.0)
        fine = s.submit(I, lambda: ran.append("fine"), deadline=100.0)
        now[0] = 5.0  # the first deadline passes while both wait
        release.set()
        with pytest.raises(DeadlineExpired):
            late.result(timeout=30)
        fine.result(timeout=30)
        assert ran == ["fine"]
        assert s.stats()["dropped"]["interactive"] == 1
    finally:
        release.set()
        s.close()


def test_close_fails_queued_requests():
    s = IOScheduler("fifo", workers={I: 1})
    release, started = threading.Event(), threading.Event()
    s.submit(B, lambda: (started.set(), release.wait(30)))
    assert started.wait(30)
    queued = s.submit(U, lambda: 1)
    closer = threading.Thread(target=s.close)
    closer.start()
    with pytest.raises(RuntimeError, match="closed"):
        queued.result(timeout=30)
    release.set()
    closer.join(30)
    assert not closer.is_alive()


def test_background_pacer_yields_when_searches_miss_their_target():
    from vindex.iosched import BackgroundPacer

    now = [0.0]
    p = BackgroundPacer("sla", 0.002, clock=lambda: now[0], window=1.0)
    assert p.charge(0.01) == 0.0  # within the burst: no pause
    for _ in range(20):
        p.observe(0.010, 1)      # small searches at 10 ms, target 2 ms
        p.observe(5.0, 1000)     # a bulk batch is not an interactive sample
    assert p.on_target           # no window closed yet
    now[0] = 1.0
    p.observe(0.010, 1)          # the window closes: duty cycle halves
    assert p.duty == 0.5 and not p.on_target
    assert p.charge(0.5) == 0.0  # a 0.5 s step within 1 s of wall time: half, on budget
    assert p.charge(0.5) == pytest.approx(0.92)  # another at once: 0.46 s of debt at half speed
    q = BackgroundPacer("sla", 0.002, clock=lambda: now[0])
    for _ in range(10):  # at full speed, back-to-back steps never pause
        now[0] += 0.3
        assert q.charge(0.3) == 0.0
    for w in range(2, 12):       # no searches: back to full speed step by step
        now[0] = float(w)
        p.charge(0.0)
    assert p.duty == 1.0 and p.on_target
    now[0] = 20.0
    assert BackgroundPacer("fifo", 0.002).charge(10.0) == 0.0
    assert BackgroundPacer("fifo", 0.002).on_target


def test_a_tenant_quota_set_on_a_scheduler_counts_postings():
    now = [0.0]
    s = IOScheduler("sla", clock=lambda: now[0])
    try:
        s.set_tenant_quota("a", 10.0, burst=20.0)
        assert s.run(I, lambda: 1, tenant="a", cost=16) == 1
        with pytest.raises(ResourceExhaustedError, match=r"10 postings/s \(burst 20\): this read needs 16; retry in 1200 ms"):
            s.run(I, lambda: 2, tenant="a", cost=16)
        assert s.run(I, lambda: 3, tenant="b", cost=500) == 3  # no quota: the default is none
        now[0] = 2.0  # full again: a read larger than the burst passes once, into debt
        assert s.run(I, lambda: 4, tenant="a", cost=50) == 4
        with pytest.raises(ResourceExhaustedError):
            s.run(I, lambda: 5, tenant="a", cost=1)
        s.set_tenant_quota("a", None)
        assert s.run(I, lambda: 6, tenant="a", cost=1) == 6
    finally:
        s.close()


def test_index_tenant_quota_refuses_searches_and_checks_its_arguments(tmp_path):
    import numpy as np

    import vindex

    x = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
    with vindex.Index.build(tmp_path / "idx", x, posting_limit_bytes=1024, search_eps=100.0) as idx:
        idx.set_tenant_quota("a", 0.001, burst=8)
        assert idx.search(x[0], 5, max_postings=8, tenant="a").stats["postings"] == 8
        # the same postings again come from memory, with no I/O: the quota still counts them
        with pytest.raises(ResourceExhaustedError, match="tenant 'a' is over its I/O quota"):
            idx.search(x[0], 5, max_postings=8, tenant="a")
        assert idx.search(x[0], 5, max_postings=8, tenant="b").ids[0, 0] == 0
        assert idx.search(x[0], 5, max_postings=8).ids[0, 0] == 0  # untagged: the "default" tenant
        idx.set_tenant_quota("a", None)
        assert idx.search(x[0], 5, max_postings=8, tenant="a").ids[0, 0] == 0
        for rate, burst in ((0, None), (-1, None), (float("nan"), None), (5, 0.5), ("fast", None)):
            with pytest.raises(ValueError):
                idx.set_tenant_quota("a", rate, burst)
    with vindex.Index.build(tmp_path / "mem", x, store="memory") as idx:
        with pytest.raises(ValueError, match="'memory' reads without an I/O scheduler"):
            idx.set_tenant_quota("a", 5)


def test_pacing_is_a_runtime_setting_and_background_still_drains(tmp_path):
    import numpy as np

    import vindex

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 16)).astype(np.float32)
    with vindex.Index.build(tmp_path / "idx", x, posting_limit_bytes=1024, io_scheduler="sla",
                            interactive_p99_ms=0.001) as idx:  # a target no search meets
        for _ in range(20):
            idx.search(x[:1], 5)
        idx.upsert(np.arange(2000, 3000), rng.standard_normal((1000, 16)).astype(np.float32) + 2)
        for _ in range(50):
            idx.search(x[:1], 5)
        assert idx.wait_idle(120)  # paced, not starved
        s = idx.stats()
        assert s["io_scheduler"] == "sla" and s["postings_over_limit"] == 0
    with vindex.Index.open(tmp_path / "idx", io_scheduler="fifo") as idx:
        assert idx.stats()["io_scheduler"] == "fifo"


@pytest.mark.parametrize("store", ["rocksdb", "blocks"])
def test_the_stores_scheduler_works_to_the_configured_read_target(tmp_path, store):
    """``read_p99_ms`` is the one source of both the background pacing's target and the bound
    on yielding to interactive reads, at build and as a runtime setting when reopened."""
    import vindex

    with vindex.Index.create(tmp_path / "idx", dim=8, store=store) as idx:
        sched = idx._engine.store.scheduler
        assert sched.aimd.target == sched.yield_max_s == vindex.IndexConfig().read_p99_ms / 1000
    with vindex.Index.open(tmp_path / "idx", read_p99_ms=7.0) as idx:
        sched = idx._engine.store.scheduler
        assert sched.aimd.target == sched.yield_max_s == 0.007
    with pytest.raises(vindex.InvalidConfigError, match="read_p99_ms"):
        vindex.IndexConfig(read_p99_ms=0)


def test_writes_are_paced_while_searches_miss_their_target(tmp_path):
    import numpy as np

    import vindex

    rng = np.random.default_rng(1)
    x = rng.standard_normal((2000, 16)).astype(np.float32)
    for mode in ("sla", "fifo"):
        with vindex.Index.build(tmp_path / mode, x, io_scheduler=mode, rebalance=False,
                                interactive_p99_ms=0.001) as idx:  # a target no search meets
            end = time.monotonic() + 1.0  # a few 0.25 s pacing windows
            i = 0
            while time.monotonic() < end:
                idx.search(x[:1], 5)
                idx.upsert([i % 2000], x[i % 2000:i % 2000 + 1])
                i += 1
            duty = idx.stats()["update_duty"]
            end, j = time.monotonic() + 1.0, 0
            while time.monotonic() < end:  # writes back to back: over their share, so they pause
                lo = 50 * (j % 40)
                idx.upsert(np.arange(lo, lo + 50), x[lo:lo + 50])
                j += 1
            s = idx.stats()
            s["update_duty"] = duty
            if mode == "sla":  # the write share halved towards its floor, and writers paused
                assert s["update_duty"] < 1.0 and s["update_paused_s"] > 0
            else:
                assert s["update_duty"] == 1.0 and s["update_paused_s"] == 0


def test_busy_clock_charges_the_union_of_overlapping_tasks():
    now = [0.0]
    busy = BusyClock(clock=lambda: now[0])
    busy.enter()          # task a from 0
    now[0] = 1.0
    busy.enter()          # task b from 1, beside a
    now[0] = 3.0
    assert busy.leave() == 3.0  # a ends at 3: busy 0..3 (b ran within it)
    now[0] = 4.0
    assert busy.leave() == 1.0  # b ends at 4: 3..4 not charged yet
    now[0] = 10.0         # idle: nothing running, nothing to charge
    busy.enter()
    now[0] = 10.5
    assert busy.leave() == 0.5


def test_overlapping_writers_of_an_index_do_not_pause_without_searches(tmp_path):
    """Two threads upserting at once into one index with no search at all: the writers' share
    is all of the time, and each write's wait for the other's lock is not charged twice."""
    import vindex

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4000, 16)).astype(np.float32)
    with vindex.Index.build(tmp_path / "w", x[:2000], rebalance=False) as idx:
        def writer(lo: int) -> None:
            for j in range(40):
                start = lo + 25 * (j % 40)
                idx.upsert(np.arange(start, start + 25), x[start:start + 25])

        threads = [threading.Thread(target=writer, args=(lo,)) for lo in (2000, 3000)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        s = idx.stats()
        assert s["update_duty"] == 1.0
        assert s["update_paused_s"] == 0  # charged the sum of their times, they paused ~half of it


def test_a_search_whose_reads_miss_its_timeout_is_partial(tmp_path):
    """Both interactive slots busy: the search's read waits in the queue past its deadline,
    is dropped when a slot frees, and the search says its result is partial."""
    import numpy as np

    import vindex

    rng = np.random.default_rng(2)
    x = rng.standard_normal((500, 8)).astype(np.float32)
    # cache_bytes=0: no postings kept in memory, so every search reads
    with vindex.Index.build(tmp_path / "p", x, rebalance=False, cache_bytes=0) as idx:
        full = idx.search(x[0], 5)
        assert not full.partial and full.stats["postings_dropped"] == 0
        sched = idx._engine.store._io
        release = threading.Event()
        blockers = [sched.submit(I, lambda: release.wait(30)) for _ in range(2)]
        wait_until(lambda: sched._busy[I] == 2, "both searches to run", timeout=30)
        out = {}
        t = threading.Thread(target=lambda: out.update(res=idx.search(x[0], 5, timeout=0.01)))
        t.start()
        wait_until(lambda: sched.queues.depth(I) == 1, "the search's read to queue", timeout=30)
        deadline_passed = time.monotonic() + 0.02
        wait_until(lambda: time.monotonic() > deadline_passed, "the deadline to pass", timeout=30)
        release.set()
        t.join(30)
        for b in blockers:
            b.result(30)
        res = out["res"]
        assert res.partial and res.stats["postings_dropped"] > 0 and res.stats["postings"] == 0
        assert (res.ids == -1).all()
        assert sched.stats()["dropped"]["interactive"] == 1
        assert idx.search(x[0], 5, timeout=30).ids.tolist() == full.ids.tolist()
        with pytest.raises(vindex.errors.InvalidInputError):
            idx.search(x[0], 5, timeout=0)


def test_wait_for_searches_returns_when_the_last_search_ends():
    from vindex.readers import Readers

    r = Readers()
    assert r.wait_for_searches(0.0)
    t = r.begin()
    assert not r.wait_for_searches(0.0)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (r.wait_for_searches(30), done.set()))
    waiter.start()
    r.end(t)
    waiter.join(30)
    assert done.is_set()


def test_writers_yield_to_interactive_searches_only_but_drops_wait_for_every_search(tmp_path):
    import numpy as np

    import vindex
    from vindex.readers import Readers

    r = Readers()
    batch = r.begin(interactive=False)
    assert r.wait_for_searches(0.0)  # a large batch is throughput work: writers go on
    boundary = r.now()
    assert not r.drained(boundary)  # but what it may still read stays in the store
    small = r.begin()
    assert not r.wait_for_searches(0.0)
    r.end(small)
    assert r.wait_for_searches(0.0) and not r.drained(boundary)
    r.end(batch)
    assert r.drained(boundary)

    # Index.search: up to 16 queries are interactive by default; ``interactive`` overrides it
    x = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
    with vindex.Index.build(str(tmp_path / "i"), x, progress=False) as idx:
        readers, seen = idx._engine.readers, []
        begin = readers.begin
        readers.begin = lambda interactive=True: seen.append(interactive) or begin(interactive)
        idx.search(x[:16], 3)
        idx.search(x[:17], 3)
        idx.search(x[:17], 3, interactive=True)
        idx.search(x[:1], 3, interactive=False)
        assert seen == [True, False, True, False]
        with pytest.raises(vindex.errors.InvalidInputError, match="interactive"):
            idx.search(x[:1], 3, interactive="no")  # a truthy string must not pass as True
        assert len(seen) == 4


@pytest.mark.parametrize("mode", ["sla", "fifo"])
def test_large_rocksdb_commit_yields_to_searches_between_pieces_under_sla_only(tmp_path, monkeypatch, mode):
    import numpy as np

    import vindex

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 8)).astype(np.float32)
    vindex.Index.build(str(tmp_path / "i"), x, progress=False).close()
    with vindex.Index.open(str(tmp_path / "i"), io_scheduler=mode, rebalance=False) as idx:
        readers = idx._engine.readers
        waits = []
        real = readers.wait_for_searches
        monkeypatch.setattr(readers, "wait_for_searches", lambda timeout: waits.append(timeout) or real(0.0))
        store, appended = idx._engine.store, []
        store.early_write_keys = 2  # every commit of 3+ postings goes in pieces
        commit = store.commit
        monkeypatch.setattr(store, "commit", lambda change, io: appended.append(len(change.appends)) or commit(change, io))
        new = rng.standard_normal((200, 8)).astype(np.float32)
        idx.upsert(np.arange(2000, 2200), new)
        assert len(appended) == 1 and appended[0] >= 3
        if mode == "sla":
            # once before the commit, then after each early piece of 2 postings
            assert len(waits) == 1 + -(-appended[0] // 2)
            assert all(t == idx.config.interactive_p99_ms / 1000 for t in waits)
        else:
            assert waits == []
        assert idx.search(new[0], 1).ids[0] == 2000


def test_a_pause_repriced_in_slices_ends_soon_after_searches_stop():
    """The background worker re-prices its pause every ``PACE_SLICE_S``: a long step at the
    floor share asks for tens of seconds, but with no searches the share climbs back and the
    debt is repaid within a few seconds."""
    from vindex.iosched import BackgroundPacer
    from vindex.rebalance import PACE_SLICE_S

    now = [0.0]
    p = BackgroundPacer("sla", 0.002, clock=lambda: now[0])
    for t in range(12):  # searches miss their target for 3 s: the share falls to the floor
        now[0] = 0.25 * t
        for _ in range(5):
            p.observe(0.010, 1)
    assert p.duty == pytest.approx(0.05)
    pause = p.charge(2.0)  # a 2 s round at a 5% share
    assert pause > 30
    slept = 0.0
    while pause > PACE_SLICE_S / 50:  # what the worker does, with no searches any more
        step = min(pause, PACE_SLICE_S)
        now[0] += step
        slept += step
        pause = p.charge(0.0)
    assert slept < 5 and p.duty == 1.0


def test_update_and_background_requests_wait_for_the_searches_reads_in_flight():
    """Under sla a request of another class is issued only once the interactive requests
    running when it arrived have ended (the disk serves in order: issued first, it would
    delay them), whether it runs on its caller's thread or on a worker."""
    s = IOScheduler("sla", workers={I: 1, U: 1, B: 1}, targets=IOTargets(yield_max_s=30.0))
    release, started, order = threading.Event(), threading.Event(), []

    def search():
        started.set()
        release.wait(30)
        order.append("search")

    try:
        reader = threading.Thread(target=s.run, args=(I, search))
        reader.start()
        assert started.wait(30)
        writer = threading.Thread(target=s.run, args=(U, lambda: order.append("update")))
        writer.start()
        wait_until(lambda: s.stats()["yields"] == 1, "the update to yield", timeout=30)
        bg = s.submit(B, lambda: order.append("background"))
        wait_until(lambda: s.stats()["yields"] == 2, "the background request to yield", timeout=30)
        assert order == [] and writer.is_alive() and not bg.done()
        release.set()
        reader.join(30)
        writer.join(30)
        bg.result(timeout=30)
        assert order[0] == "search" and sorted(order[1:]) == ["background", "update"]
        assert s.submit(I, lambda: "next").result(timeout=30) == "next"  # searches never yield
        assert s.stats()["yields"] == 2
    finally:
        release.set()
        s.close()


@pytest.mark.parametrize("mode", ["sla", "fifo"])
def test_yielding_to_searches_is_bounded_and_only_under_sla(mode):
    s = IOScheduler(mode, workers={I: 1, U: 1, B: 1}, targets=IOTargets(yield_max_s=0.01))
    release, started = threading.Event(), threading.Event()
    try:
        reader = threading.Thread(target=s.run, args=(I, lambda: (started.set(), release.wait(30))))
        reader.start()
        assert started.wait(30)
        assert s.run(U, lambda: "update") == "update"  # returns while the search still runs
        assert reader.is_alive()
        assert s.stats()["yields"] == (1 if mode == "sla" else 0)
    finally:
        release.set()
        s.close()
