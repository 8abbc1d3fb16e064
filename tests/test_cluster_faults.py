"""ShardedIndex under replica failures: actors killed during ingest lose nothing acknowledged,
and with two replicas searches keep answering while one restarts and catches up."""
from __future__ import annotations

import threading

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from vindex.cluster import ShardedIndex  # noqa: E402
from vindex.cluster.remote import REPLICA_DOWN, result  # noqa: E402
from conftest import wait_until  # noqa: E402

DIM = 8
CPUS = 0.1


def _kill(actor) -> None:
    ray.kill(actor, no_restart=False)  # Ray restarts it; its constructor reopens the index


def _pid(actor) -> int | None:
    """The process id of ``actor``; None while it is down."""
    try:
        return result(actor.state.remote(), timeout=5.0)["pid"]
    except REPLICA_DOWN:
        return None


def _until_in_sync(shard, attempts: int = 60) -> None:
    for _ in range(attempts):
        if shard.repair(timeout=5.0):
            return
    raise AssertionError(f"shard {shard.number} did not get back in sync: {shard.in_sync}")


def test_actor_kills_during_ingest_lose_nothing_acknowledged(ray_local, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60_000, DIM)).astype(np.float32)
    kills, rows = 0, 0
    with ShardedIndex.create("k", DIM, shards=2, replicas=1, path=tmp_path / "c", actor_cpus=CPUS) as index:
        actors = [a for s in index._shards for a in s.actors]
        stop, started = threading.Event(), threading.Event()

        def killer() -> None:
            nonlocal kills
            started.wait()
            while kills < 3 and not stop.is_set():
                _kill(actors[kills % len(actors)])
                kills += 1
                stop.wait(1.0)

        thread = threading.Thread(target=killer)
        thread.start()
        try:
            while (kills < 3 or not started.is_set()) and rows < x.shape[0]:  # ingest until the kills are done
                index.upsert(np.arange(rows, rows + 200), x[rows:rows + 200])
                rows += 200  # acknowledged
                started.set()
        finally:
            stop.set()
            thread.join()
        assert kills == 3
        got = index.get(np.arange(rows))
        assert got.found.all(), f"{(~got.found).sum()} acknowledged writes lost"
        np.testing.assert_array_equal(got.vectors, x[:rows])
        assert len(index) == rows
        assert sum(s.restored for s in index._shards) >= 1


def test_searches_answer_while_a_replica_is_down_and_it_catches_up(ray_local, tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, DIM)).astype(np.float32)
    with ShardedIndex.create("r", DIM, shards=1, replicas=2, path=tmp_path / "c", actor_cpus=CPUS) as index:
        index.upsert(np.arange(1000), x[:1000])
        shard = index._shards[0]
        victim = shard.actors[0]
        _kill(victim)
        assert index.stats()["live"] == 1000 and len(index) == 1000  # answered by the other replica
        # while it restarts, every search answers, and never from the replica that lacks the
        # newest writes
        for lo in range(1000, 2000, 100):
            index.upsert(np.arange(lo, lo + 100), x[lo:lo + 100])
            for _ in range(5):
                res = index.search(x[lo + 99], k=1, max_postings=512)
                assert res.ids[0, 0] == lo + 99
        assert not all(shard.in_sync) or shard.restored >= 1
        _until_in_sync(shard)
        # the restarted replica has every write, replayed from its peer's log
        state = result(victim.state.remote())
        assert state["serving"] and state["seq"] == shard.seq
        vectors, found, _ = result(victim.get.remote(np.arange(2000), ()))
        assert found.all()
        np.testing.assert_array_equal(vectors, x)


def test_a_replica_that_lost_its_disk_copies_a_peer_while_writes_go_on(ray_local, tmp_path):
    import shutil

    from vindex.cluster.manifest import replica_dir
    from vindex.cluster.shard import TRIM_EVERY

    rng = np.random.default_rng(2)
    x = rng.normal(size=(20_000, DIM)).astype(np.float32)
    path = tmp_path / "c"
    with ShardedIndex.create("d", DIM, shards=1, replicas=2, path=path, actor_cpus=CPUS) as index:
        shard = index._shards[0]
        _until_in_sync(shard)  # the second replica may start late
        rows = 0
        while result(shard.actors[1].state.remote())["log_first"] <= 1:  # until a trim: the peer's
            for _ in range(TRIM_EVERY // 8):                             # log no longer reaches write 1
                index.upsert(np.arange(rows, rows + 10), x[rows:rows + 10])
                rows += 10
        victim = shard.actors[0]
        pid = _pid(victim)
        shutil.rmtree(replica_dir(str(path), 0, 0))  # its disk is lost...
        _kill(victim)  # ...and Ray restarts it on an empty directory
        wait_until(lambda: _pid(victim) not in (pid, None), "the replica's restart", timeout=60)
        stop = threading.Event()
        acked = [rows]

        def writer() -> None:
            while not stop.is_set() and acked[0] < x.shape[0]:
                lo = acked[0]
                index.upsert(np.arange(lo, lo + 10), x[lo:lo + 10])
                acked[0] = lo + 10

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            _until_in_sync(shard)
        finally:
            stop.set()
            thread.join()
        assert shard.snapshots >= 1  # a copy of the peer's index, not an empty restart
        assert shard.writes_during_catch_up >= 1  # the shard took writes while it copied
        state = result(victim.state.remote())
        assert state["serving"] and state["seq"] == shard.seq
        vectors, found, _ = result(victim.get.remote(np.arange(acked[0]), ()))
        assert found.all()
        np.testing.assert_array_equal(vectors, x[:acked[0]])


def test_tenant_quotas_reach_every_replica_and_a_restarted_one(ray_local, tmp_path):
    from vindex.errors import ResourceExhaustedError

    rng = np.random.default_rng(3)
    x = rng.normal(size=(1000, DIM)).astype(np.float32)
    q = x[:1]
    with ShardedIndex.create("q", DIM, shards=2, replicas=1, path=tmp_path / "c", actor_cpus=CPUS) as index:
        index.upsert(np.arange(1000), x)
        with pytest.raises(ValueError, match="postings_per_s"):
            index.set_tenant_quota("t", -1.0)
        index.set_tenant_quota("t", 0.01, burst=1)
        index.search(q, k=1, max_postings=8, tenant="t")  # a full bucket lets one search run, into debt
        with pytest.raises(ResourceExhaustedError):
            index.search(q, k=1, max_postings=8, tenant="t")
        index.search(q, k=1, max_postings=8)  # other tenants are not limited
        shard = index._shards[0]
        pid = _pid(shard.actors[0])
        _kill(shard.actors[0])
        wait_until(lambda: _pid(shard.actors[0]) not in (pid, None), "the replica's restart", timeout=60)
        _until_in_sync(shard)
        params = {"max_postings": 8, "tenant": "t"}
        result(shard.actors[0].search.remote(q, 1, params))
        with pytest.raises(ResourceExhaustedError):  # the restarted replica has the quota again
            result(shard.actors[0].search.remote(q, 1, params))
        index.set_tenant_quota("t", None)
        for _ in range(3):
            index.search(q, k=1, max_postings=8, tenant="t")
