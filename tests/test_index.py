"""The public Index API: exactness, recall, persistence, updates."""
from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

import vindex
from conftest import brute_force, recall_at_k

ALL = dict(max_postings=4096, eps=float("inf"), ef=4096)  # visit every posting


@pytest.fixture(scope="module")
def bigann_index(tmp_path_factory, bigann):
    path = tmp_path_factory.mktemp("idx") / "bigann"
    index = vindex.Index.build(path, bigann["base"])
    yield index
    index.close()


def test_exhaustive_search_equals_brute_force_exactly(bigann_index, bigann):
    # SIFT is uint8: float32 squared distances are exact integers, and the set has exact
    # duplicates, so this checks the (distance, id) tie order too.
    q = bigann["base"][:200]
    ids, dists = bigann_index.search(q, 10, **ALL)
    bf_ids, bf_d = brute_force(bigann["base"], q, 10)
    np.testing.assert_array_equal(ids, bf_ids)
    np.testing.assert_array_equal(dists, bf_d.astype(np.float32))


def test_recall_bigann_10k(bigann_index, bigann):
    ids, _ = bigann_index.search(bigann["queries"], 10)
    recall = recall_at_k(ids, bigann["gt_ids"])
    assert recall >= 0.97  # measured 0.998 (default max_postings=64)


def test_recall_bigann_holdout_fewer_postings(tmp_path, bigann):
    n0 = int(bigann["holdout_base_n"])
    with vindex.Index.build(tmp_path / "h", bigann["base"][:n0]) as index:
        ids, _ = index.search(bigann["base"][n0:], 10, max_postings=16)
    recall = recall_at_k(ids, bigann["holdout_gt_ids"])
    assert recall >= 0.92  # measured 0.949


def test_recall_wiki_minilm_cosine(tmp_path, wiki):
    with vindex.Index.build(tmp_path / "w", wiki["base"], metric="cosine") as index:
        ids, dists = index.search(wiki["queries"], 10)
    recall = recall_at_k(ids, wiki["gt_ids"])
    assert recall >= 0.95  # measured 0.972
    # distances are 1 - cos, ascending
    assert (np.diff(dists, axis=1) >= 0).all()
    hit = ids[:, 0] == wiki["gt_ids"][:, 0]
    assert hit.mean() > 0.95
    np.testing.assert_allclose(1 - dists[hit, 0], wiki["gt_dists"][hit, 0], atol=2e-3)


@pytest.mark.parametrize("metric", ["cosine", "ip"])
def test_exhaustive_float_metrics_match_brute_force(tmp_path, metric):
    rng = np.random.default_rng(3)
    base = rng.standard_normal((1500, 24)).astype(np.float32)
    q = rng.standard_normal((40, 24)).astype(np.float32)
    with vindex.Index.build(tmp_path / metric, base, metric=metric) as index:
        ids, dists = index.search(q, 10, **ALL)
    bf_ids, bf_d = brute_force(base, q, 10, metric)
    # float32 kernels vs float64 oracle: equal except where two distances are within rounding
    np.testing.assert_allclose(dists, bf_d, rtol=1e-4, atol=1e-4)
    assert (ids == bf_ids).mean() > 0.99


def test_close_and_reopen_give_identical_results(tmp_path, bigann):
    path = tmp_path / "r"
    q = bigann["queries"]
    with vindex.Index.build(path, bigann["base"]) as index:
        before = index.search(q, 10)
        stats = index.stats()
    with vindex.Index.open(path) as index:
        after = index.search(q, 10)
        assert len(index) == bigann["base"].shape[0]
        assert index.stats()["heads"] == stats["heads"]
    np.testing.assert_array_equal(before.ids, after.ids)
    np.testing.assert_array_equal(before.distances, after.distances)


def test_user_ids_are_returned(tmp_path, bigann):
    base = bigann["base"][:2000]
    ext = np.arange(2000, dtype=np.int64) * 1_000_003 + 7
    with vindex.Index.build(tmp_path / "u", base, ext) as index:
        ids, _ = index.search(base[:50], 1, **ALL)
    bf_ids, _ = brute_force(base, base[:50], 1, ids=ext)
    np.testing.assert_array_equal(ids, bf_ids)


def test_one_dimensional_query_and_padding(tmp_path):
    base = np.eye(5, 8, dtype=np.float32)
    with vindex.Index.build(tmp_path / "p", base) as index:
        res = index.search(base[0], k=8)
    assert res.ids.shape == (1, 8) and res.distances.shape == (1, 8)
    assert res.ids.dtype == np.int64 and res.distances.dtype == np.float32
    assert res.ids[0, 0] == 0
    assert (res.ids[0, 5:] == -1).all() and np.isinf(res.distances[0, 5:]).all()
    ids, dists = res
    assert ids is res.ids and dists is res.distances


def test_search_result_is_a_named_pair():
    """Indexable and sized like a named tuple of (ids, distances); ``stats`` rides along."""
    import copy
    import pickle

    ids, dists = np.array([[3, -1]]), np.array([[0.5, np.inf]], np.float32)
    res = vindex.SearchResult(ids, dists, {"postings_dropped": 2})
    assert len(res) == 2 and res[0] is ids and res[1] is dists and res[-1] is dists
    assert res[:1] == (ids,) and isinstance(res, tuple) and res._fields == ("ids", "distances")
    assert res.ids is ids and res.distances is dists and res.partial and res.stats == {"postings_dropped": 2}
    assert vindex.SearchResult(ids, dists).stats == {} and not vindex.SearchResult(ids, dists).partial
    with pytest.raises(IndexError):
        res[2]
    with pytest.raises(AttributeError):
        res.ids = ids  # results are immutable
    with pytest.raises(AttributeError):
        res.stats = {}
    for twin in (copy.copy(res), pickle.loads(pickle.dumps(res))):
        assert type(twin) is vindex.SearchResult and twin.stats == res.stats
        assert (twin[0] == ids).all() and (twin.distances == dists).all()
    assert "stats={'postings_dropped': 2}" in repr(res)


@pytest.mark.parametrize("store", ["rocksdb", "blocks"])
def test_opening_an_index_does_not_load_numba(tmp_path, store):
    # native's submodules load on first use: a process that opens an index and never
    # searches (the command line's stats, say) does not pay numba's import time and memory
    vindex.Index.create(tmp_path / "n", dim=8, store=store).close()
    script = (f"import sys, vindex\n"
              f"with vindex.Index.open({str(tmp_path / 'n')!r}) as index:\n"
              f"    index.stats()\n"
              f"assert 'numba' not in sys.modules, sorted(m for m in sys.modules if m.startswith('vindex.native'))\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_add_into_built_index_then_reopen_replays_log(tmp_path, bigann):
    base = bigann["base"]
    path = tmp_path / "a"
    index = vindex.Index.build(path, base[:6000])
    for lo in range(6000, 10000, 1000):
        index.add(np.arange(lo, lo + 1000), base[lo:lo + 1000])
    assert len(index) == 10000
    q = base[::97]
    ids, dists = index.search(q, 10, **ALL)
    bf_ids, _ = brute_force(base, q, 10)
    np.testing.assert_array_equal(ids, bf_ids)
    del index  # no close: reopening must replay the operation log
    import gc

    gc.collect()
    with vindex.Index.open(path, rebalance=False) as again:
        seq = again.stats()["log_seq"]
        assert seq >= 4 and again.stats()["checkpoint_seq"] < seq  # the log was replayed
        np.testing.assert_array_equal(again.search(q, 10, **ALL).ids, ids)
    with vindex.Index.open(path) as third:  # closed cleanly: checkpoint covers the log
        assert third.stats()["checkpoint_seq"] == seq
        assert len(third) == 10000


def test_add_into_empty_index(tmp_path, bigann):
    base = bigann["base"][:3000]
    with vindex.Index.create(tmp_path / "e", dim=128) as index:
        assert len(index) == 0
        ids, _ = index.search(base[:3], 5)
        assert (ids == -1).all()
        index.add(np.arange(1000), base[:1000])
        index.add(np.arange(1000, 3000), base[1000:])
        assert len(index) == 3000
        got, _ = index.search(base[:100], 10, **ALL)
    np.testing.assert_array_equal(got, brute_force(base, base[:100], 10)[0])


def test_add_existing_id_raises_and_writes_nothing(tmp_path, bigann):
    base = bigann["base"][:500]
    with vindex.Index.build(tmp_path / "d", base) as index:
        seq = index.stats()["log_seq"]
        with pytest.raises(vindex.DuplicateIdError, match=r"\[3, 7\]") as err:
            index.add([600, 3, 7], base[:3])
        assert err.value.ids == [3, 7]
        assert len(index) == 500 and index.stats()["log_seq"] == seq
        ids, _ = index.search(base[0], 1, **ALL)
        assert ids[0, 0] == 0


def test_memory_store_matches_rocksdb(tmp_path, bigann):
    base, q = bigann["base"][:3000], bigann["queries"]
    with vindex.Index.build(tmp_path / "m1", base, store="memory") as mem, \
            vindex.Index.build(tmp_path / "m2", base) as rocks:
        np.testing.assert_array_equal(mem.search(q, 10).ids, rocks.search(q, 10).ids)


def test_concurrent_searches_equal_serial(bigann_index, bigann):
    q = bigann["queries"]
    serial = bigann_index.search(q, 10).ids
    results = [None] * 4

    def run(i):
        results[i] = [bigann_index.search(q[j:j + 1], 10).ids for j in range(len(q))]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        np.testing.assert_array_equal(np.vstack(r), serial)


def test_stats_describe_the_index(bigann_index):
    s = bigann_index.stats()
    for key in ("live", "heads", "posting_limit", "posting_mean", "posting_histogram",
                "replicas_mean", "store", "memory_bytes"):
        assert key in s
    assert s["live"] == 10000 and s["heads"] > 0
    assert s["posting_max"] <= s["posting_limit"]
    assert sum(s["posting_histogram"]["counts"]) == s["heads"]


def test_closed_index_refuses_calls(tmp_path):
    index = vindex.Index.build(tmp_path / "c", np.ones((3, 4), np.float32) * np.arange(3)[:, None])
    index.close()
    index.close()  # idempotent
    with pytest.raises(vindex.IndexClosedError):
        index.search(np.zeros(4), 1)
