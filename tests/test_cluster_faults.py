"""ShardedIndex under replica failures: actors killed during ingest lose nothing acknowledged,
and with two replicas searches keep answering while one restarts and catches up."""
from __future__ import annotations

import threading

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from vindex.cluster import ShardedIndex  # noqa: E402
from vindex.cluster.remote import result  # noqa: E402

DIM = 8
CPUS = 0.1


def _kill(actor) -> None:
    ray.kill(actor, no_restart=False)  # Ray restarts it; its constructor reopens the index


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
        rows = 0
        while shard.seq <= TRIM_EVERY:  # past a trim: the peer's log no longer reaches write 1
            index.upsert(np.arange(rows, rows + 10), x[rows:rows + 10])
            rows += 10
        victim = shard.actors[0]
        shutil.rmtree(replica_dir(str(path), 0, 0))  # its disk is lost...
        _kill(victim)  # ...and Ray restarts it on an empty directory
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
