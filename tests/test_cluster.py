"""vindex.cluster.ShardedIndex: the Index API over shards of Ray actors, routing and the exact merge."""
from __future__ import annotations

import numpy as np
import pytest

import vindex
from vindex.errors import (DimensionError, IdExistsError, IndexExistsError, InvalidConfigError, InvalidIdError,
                           UnknownIdError)

pytest.importorskip("ray")

from vindex.cluster import ShardedIndex  # noqa: E402
from vindex.cluster.routing import shard_of  # noqa: E402

#: CPUs each replica reserves: small, so that the collections of the tests fit beside each other
CPUS = 0.1
ALL = 4096  # max_postings that reads every posting of these small collections: exact search
DIM = 16


def _data(n: int = 3000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(20, DIM)).astype(np.float32)
    return centres[rng.integers(0, 20, n)] + 0.3 * rng.normal(size=(n, DIM)).astype(np.float32)


@pytest.fixture(scope="module")
def pair(ray_local, tmp_path_factory):
    """The same records in a 2-shard collection and in one Index."""
    root = tmp_path_factory.mktemp("cluster")
    x = _data()
    ids = np.arange(x.shape[0]) * 7 + 3
    meta = [{"colour": ["red", "green", "blue"][i % 3], "n": i} for i in range(x.shape[0])]
    docs = [f"doc {i}" for i in range(x.shape[0])]
    sharded = ShardedIndex.create("pair", DIM, "l2", shards=2, replicas=1, path=root / "sharded", actor_cpus=CPUS)
    for lo in range(0, x.shape[0], 1000):
        sharded.upsert(ids[lo:lo + 1000], x[lo:lo + 1000], metadata=meta[lo:lo + 1000], documents=docs[lo:lo + 1000])
    one = vindex.Index.build(root / "one", x, ids, metadata=meta, documents=docs)
    yield sharded, one, x, ids
    sharded.close()
    one.close()


def test_routing_is_stable_and_spreads():
    # fixed values: a change of hash would send existing ids to the wrong shard
    assert shard_of(np.array([0, 1, 2, 3, 4, 5, 2**62], np.int64), 2).tolist() == [1, 1, 0, 1, 0, 0, 1]
    assert shard_of(["a", "b", "doc-1"], 3).tolist() == [2, 2, 1]
    counts = np.bincount(shard_of(np.arange(100_000, dtype=np.int64), 4), minlength=4)
    assert counts.min() > 24_000


def test_search_is_congruent_with_one_index(pair):
    """Every posting read, the shards find what one index does: the same ids, the same
    distances but for the last bits (a batch scans a posting for four of its queries at a
    time and for the rest one by one, summing in another order, and which queries share a
    posting differs by shard)."""
    sharded, one, x, ids = pair
    q = x[::97] + 0.01
    a = sharded.search(q, k=10, max_postings=ALL)
    b = one.search(q, k=10, max_postings=ALL)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_allclose(a.distances, b.distances, rtol=4 * float(np.finfo(np.float32).eps), atol=0)
    assert a.stats["records_scanned"] >= x.shape[0] * q.shape[0]


def test_search_parameters_reach_the_shards(pair):
    sharded, one, x, _ = pair
    q = x[::211] + 0.01
    exact = one.search(q, k=10, max_postings=ALL)
    for kw in (dict(threads=2), dict(rerank=0), dict(rerank=40)):
        np.testing.assert_array_equal(sharded.search(q, k=10, max_postings=ALL, **kw).ids, exact.ids)
    aimed = sharded.search(q, k=10, recall_target=0.9)
    found = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(aimed.ids, exact.ids)])
    assert found >= 0.9  # measured 0.993: each shard calibrates its own probing to the target
    for kw, message in ((dict(threads=0), "threads"), (dict(rerank=3), "rerank: expected 0"),
                        (dict(recall_target=1.5), "recall_target")):
        with pytest.raises(ValueError, match=message):
            sharded.search(q, k=10, **kw)
        with pytest.raises(ValueError, match=message):
            sharded.check_queries(q, k=10, **kw)


def test_filtered_search_with_include_matches_one_index(pair):
    sharded, one, x, _ = pair
    kw = dict(k=5, max_postings=ALL, filter={"colour": "green", "n": {"$lt": 2000}},
              include=["metadata", "documents", "vectors"])
    a, b = sharded.search(x[:7], **kw), one.search(x[:7], **kw)
    np.testing.assert_array_equal(a.ids, b.ids)
    assert a.metadata == b.metadata and a.documents == b.documents
    np.testing.assert_array_equal(a.vectors, b.vectors)
    assert all(m["colour"] == "green" for row in a.metadata for m in row)


def test_ties_go_to_the_smaller_id_across_shards(ray_local, tmp_path):
    ids = np.arange(40)
    x = np.ones((40, DIM), np.float32)  # every record at the same distance
    with ShardedIndex.create("ties", DIM, shards=3, path=tmp_path / "c", actor_cpus=CPUS) as sharded:
        sharded.upsert(ids, x)
        assert set(shard_of(ids, 3).tolist()) == {0, 1, 2}
        np.testing.assert_array_equal(sharded.search(x[0], k=10, max_postings=ALL).ids[0], np.arange(10))


def test_get_count_len_and_scroll(pair):
    sharded, one, x, ids = pair
    got = sharded.get([ids[5], 999_999, ids[2000]], include=["metadata", "documents"])
    assert got.found.tolist() == [True, False, True]
    np.testing.assert_array_equal(got.vectors[0], x[5])
    assert got.metadata[1] is None and got.documents[2] == "doc 2000"
    assert len(sharded) == len(one) == x.shape[0]
    assert sharded.count({"colour": "red"}) == one.count({"colour": "red"})
    pages = list(sharded.scroll(batch=400))
    seen = [i for p in pages for i in np.asarray(p.ids).tolist()]
    assert sorted(seen) == sorted(ids.tolist()) and len(seen) == len(set(seen))
    # a cursor resumes in a new scroll, from where the page left off
    resumed = [i for p in sharded.scroll(batch=400, cursor=pages[2].cursor) for i in np.asarray(p.ids).tolist()]
    assert resumed == seen[sum(len(p) for p in pages[:3]):]
    assert all(len(p) <= 400 for p in pages)


def test_writes_route_and_delete(ray_local, tmp_path):
    x = _data(600, seed=2)
    with ShardedIndex.create("w", DIM, shards=2, replicas=1, path=tmp_path / "c", actor_cpus=CPUS) as sharded:
        sharded.add(np.arange(600), x)
        with pytest.raises(IdExistsError) as exc:
            sharded.add([599, 1000, 3], x[:3])
        assert exc.value.ids == [3, 599]
        assert not sharded.get([1000]).found[0]  # nothing of the refused add was written
        sharded.upsert([7], x[8:9])
        np.testing.assert_array_equal(sharded.get([7]).vectors[0], x[8])
        assert sharded.delete([1, 2, 3, 12345]) == 3
        assert len(sharded) == 597
        sharded.set_metadata(np.arange(10, 20), {"tag": "t"})
        with pytest.raises(UnknownIdError):
            sharded.set_metadata([10, 2], {"tag": "u"})
        assert sharded.count({"tag": "t"}) == 10 and sharded.count({"tag": "u"}) == 0
        assert sharded.delete(filter={"tag": "t"}) == 10
        assert len(sharded) == 587
        with pytest.raises(DimensionError):
            sharded.upsert([5000, 5001], np.ones((2, DIM + 1), np.float32))
        assert not sharded.get([5000, 5001]).found.any()


def test_str_ids_and_reopen(ray_local, tmp_path):
    x = _data(300, seed=3)
    names = [f"doc-{i}" for i in range(300)]
    path = tmp_path / "c"
    sharded = ShardedIndex.create("s", DIM, shards=2, path=path, actor_cpus=CPUS)
    try:
        sharded.upsert(names, x, documents=[n.upper() for n in names])
        assert sharded.id_type == "str"
        with pytest.raises(InvalidIdError, match="str ids"):
            sharded.upsert([1], x[:1])
        res = sharded.search(x[:3], k=4, max_postings=ALL, include=["documents"])
        assert res.ids[:, 0].tolist() == names[:3] and res.documents[0][0] == "DOC-0"
    finally:
        sharded.close()
    with ShardedIndex.open(path, actor_cpus=CPUS) as sharded:
        assert sharded.id_type == "str" and len(sharded) == 300
        assert sharded.get(["doc-9", "nope"]).found.tolist() == [True, False]
        assert sharded.delete(["doc-9"]) == 1


def test_create_refuses_bad_layouts(ray_local, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(IndexExistsError):
        ShardedIndex.create("b", DIM, path=tmp_path / "full")
    with pytest.raises(InvalidConfigError, match="persistent"):
        ShardedIndex.create("b", DIM, path=tmp_path / "m", store="memory")
    with pytest.raises(ValueError, match="shards"):
        ShardedIndex.create("b", DIM, shards=0, path=tmp_path / "z")
