"""``vindex serve --ray``: the gRPC service fronting sharded collections, same proto and client."""
from __future__ import annotations

import numpy as np
import pytest

import vindex

pytest.importorskip("ray")

from vindex.service.cli import parser  # noqa: E402
from vindex.service.collections import Sharding  # noqa: E402
from tests.test_service import InProcessServer  # noqa: E402

DIM = 8


def test_cli_parses_ray_flags():
    args = parser().parse_args(["serve", "--ray", "auto", "--shards", "3", "--replicas", "2"])
    assert (args.ray, args.shards, args.replicas) == ("auto", 3, 2)


def test_served_sharded_collection_matches_one_index(ray_local, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1500, DIM)).astype(np.float32)
    data = tmp_path / "data"
    srv = InProcessServer(data, sharding=Sharding("local", shards=2, replicas=1))
    try:
        assert srv.ready.wait(120)
        with vindex.Client(srv.target) as client:
            col = client.create_collection("docs", dim=DIM, metric="l2")
            col.upsert(np.arange(1500), x, metadata=[{"odd": i % 2} for i in range(1500)])
            with vindex.Index.build(tmp_path / "one", x, metadata=[{"odd": i % 2} for i in range(1500)]) as one:
                a = col.search(x[:20], k=10, max_postings=4096, filter={"odd": 1})
                b = one.search(x[:20], k=10, max_postings=4096, filter={"odd": 1})
                np.testing.assert_array_equal(a.ids, b.ids)
                np.testing.assert_allclose(a.distances, b.distances)
            assert col.delete([1, 2, 3]) == 3 and len(col) == 1497
            assert col.stats()["shard_count"] == 2
    finally:
        srv.stop()
    assert (data / "collections" / "docs" / "cluster.json").exists()
    srv = InProcessServer(data, sharding=Sharding("local", shards=2, replicas=1))
    try:
        assert srv.ready.wait(120)
        with vindex.Client(srv.target) as client:  # reopened by the next server
            col = client.collection("docs")
            assert len(col) == 1497 and col.get([1, 4]).found.tolist() == [False, True]
    finally:
        srv.stop()
