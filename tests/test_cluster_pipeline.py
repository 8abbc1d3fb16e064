"""Several writes in flight per shard: a replica applies them in number order whatever order
they start in, and concurrent writers with replicas killed under them lose nothing
acknowledged and keep each id's last acknowledged vector."""
from __future__ import annotations

import threading

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from vindex.cluster import ShardedIndex  # noqa: E402
from vindex.cluster.replica import ShardReplica  # noqa: E402

DIM = 8
CPUS = 0.1


def test_a_replica_applies_writes_in_number_order_when_they_start_out_of_order(tmp_path):
    replica = ShardReplica(str(tmp_path / "r"), DIM, "l2", None, {})
    try:
        assert replica.serve(0)
        x = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM)
        second = {"ids": np.array([5]), "vectors": x[1:2]}
        first = {"ids": np.array([5]), "vectors": x[0:1]}
        later = threading.Thread(target=replica.apply, args=(2, ("upsert", second)))
        later.start()  # write 2 starts first and waits for write 1
        later.join(0.3)
        assert later.is_alive() and replica.log.last_seq == 0
        replica.apply(1, ("upsert", first))
        later.join(10.0)
        assert not later.is_alive() and replica.log.last_seq == 2
        np.testing.assert_array_equal(replica.index.get([5]).vectors[0], x[1])  # write 2's vector last
        assert [seq for seq, _ in replica.log.since(0)] == [1, 2]
    finally:
        replica.close()


def test_concurrent_writers_with_kills_keep_the_last_acknowledged_vector(ray_local, tmp_path):
    writers, ids_each, rounds = 4, 300, 12
    rng = np.random.default_rng(3)
    with ShardedIndex.create("p", DIM, shards=2, replicas=1, path=tmp_path / "c", actor_cpus=CPUS) as index:
        actors = [a for s in index._shards for a in s.actors]
        last: dict[int, np.ndarray] = {}  # writer -> the vectors of its last acknowledged round
        errors: list[BaseException] = []
        go = threading.Event()

        def writer(w: int) -> None:
            ids = np.arange(w * ids_each, (w + 1) * ids_each)
            try:
                go.wait()
                for _ in range(rounds):  # the same ids again and again, new vectors each round
                    x = rng.normal(size=(ids_each, DIM)).astype(np.float32)
                    for lo in range(0, ids_each, 100):
                        index.upsert(ids[lo:lo + 100], x[lo:lo + 100])
                    last[w] = x
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        go.set()
        for k in range(3):
            threading.Event().wait(0.5)
            ray.kill(actors[k % len(actors)], no_restart=False)
        for t in threads:
            t.join()
        assert not errors, errors
        got = index.get(np.arange(writers * ids_each))
        assert got.found.all()
        np.testing.assert_array_equal(got.vectors, np.concatenate([last[w] for w in range(writers)]))
        assert len(index) == writers * ids_each
        shards = index._shards
        assert all(s.seq == s.acked for s in shards)


def test_checked_writes_beside_a_stream_of_upserts(ray_local, tmp_path):
    rng = np.random.default_rng(4)
    with ShardedIndex.create("a", DIM, shards=2, replicas=1, path=tmp_path / "c", actor_cpus=CPUS) as index:
        stop, errors = threading.Event(), []

        def upserts(w: int) -> None:
            ids = np.arange(w * 100, (w + 1) * 100)
            try:
                while not stop.is_set():  # the pool's threads busy with (or waiting for) shard writes
                    index.upsert(ids, rng.normal(size=(100, DIM)).astype(np.float32))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        threads = [threading.Thread(target=upserts, args=(w,)) for w in range(6)]
        for t in threads:
            t.start()
        adder = threading.Thread(target=lambda: [
            index.add(np.arange(10_000 + 50 * i, 10_050 + 50 * i), np.ones((50, DIM), np.float32) * i)
            for i in range(10)])
        adder.start()
        adder.join(120.0)
        stop.set()
        for t in threads:
            t.join(60.0)
        assert not adder.is_alive(), "add waited for ever beside the upserts"
        assert not errors, errors
        got = index.get(np.arange(10_000, 10_500))
        assert got.found.all()
        np.testing.assert_array_equal(got.vectors, np.repeat(np.arange(10, dtype=np.float32), 50)[:, None]
                                      * np.ones((1, DIM), np.float32))
