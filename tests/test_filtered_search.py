"""Filtered search's plans: the gathered exact scan, its planner, and the plan cache."""
from __future__ import annotations

import math

import numpy as np
import pytest

import vindex
from vindex import filtered
from vindex.filters import compile_filter

DIM = 8
N = 2000


def _exact(x, q, rows, k):
    """Brute-force top-k (ids, squared distances) of each query over ``rows``, ties by row."""
    d = ((q[:, None, :] - x[None, rows, :]) ** 2).sum(-1)
    order = np.lexsort((np.broadcast_to(rows, d.shape), d), axis=-1)[:, :k]
    return rows[order], np.take_along_axis(d, order, axis=1)


@pytest.fixture()
def built(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, DIM)).astype(np.float32)
    labels = rng.permutation(N) % 100  # label < t matches t% of the rows
    idx = vindex.Index.build(tmp_path / "idx", x, metadata=[{"label": int(v)} for v in labels], metric="l2",
                             max_postings=8, rebalance=False, posting_limit_bytes=2048)
    yield idx, x, labels
    idx.close()


@pytest.mark.parametrize("share", [1, 5])
def test_gathered_scan_is_exact_and_reads_no_posting(built, share):
    """A filter matching few records is answered by scoring just them: the exact filtered
    top-k, with no posting scanned."""
    idx, x, labels = built
    q = np.random.default_rng(1).standard_normal((7, DIM)).astype(np.float32)
    res = idx.search(q, 10, filter={"label": {"$lt": share}})
    rows, dists = _exact(x, q, np.flatnonzero(labels < share), 10)
    assert res.stats["postings"] == 0 and res.stats["records_scanned"] == 7 * int((labels < share).sum())
    np.testing.assert_array_equal(res.ids, rows)
    np.testing.assert_allclose(res.distances, dists, rtol=1e-5, atol=1e-5)


def test_planner_prefers_postings_for_broad_filters(built):
    """Half the records match: scoring them all would cost more than scanning the two
    postings with matches nearest each query (at max_postings=1)."""
    idx, x, labels = built
    res = idx.search(x[:3], 10, filter={"label": {"$lt": 50}}, max_postings=1)
    assert res.stats["postings"] > 0
    assert (labels[res.ids] < 50).all()


def test_broad_filter_scans_the_graphs_nearest_postings(built):
    """Half the records match, in nearly every posting: the search scans the postings an
    unfiltered search picks at max_postings / sqrt(selectivity) and returns the nearest
    matches among their records."""
    idx, x, labels = built
    q = np.random.default_rng(3).standard_normal((5, DIM)).astype(np.float32)
    m = 4
    res = idx.search(q, 10, filter={"label": {"$lt": 50}}, max_postings=m)
    every = idx.search(q, 500, max_postings=math.ceil(m / math.sqrt(0.5)))  # all their records, nearest first
    assert res.stats["postings"] == every.stats["postings"] > 0
    for row in range(q.shape[0]):
        found = every.ids[row][every.ids[row] >= 0]
        assert res.ids[row].tolist() == found[labels[found] < 50][:10].tolist()


@pytest.mark.parametrize("nq", [1, 40])  # the GIL-held kernel and the nogil one
def test_gathered_cosine_distances_are_one_minus_cos(tmp_path, nq):
    """Under cosine the gathered scan returns 1 - cos, as the posting scan does."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, DIM)).astype(np.float32)
    labels = np.arange(300) % 50
    with vindex.Index.build(tmp_path / "cos", x, metadata=[{"label": int(v)} for v in labels], metric="cosine",
                            rebalance=False) as idx:
        q = rng.standard_normal((nq, DIM)).astype(np.float32)
        res = idx.search(q, 4, filter={"label": 7})
        assert res.stats["postings"] == 0
        unit = x / np.linalg.norm(x, axis=1, keepdims=True)
        qs = q / np.linalg.norm(q, axis=1, keepdims=True)
        cos = np.take_along_axis(qs @ unit.T, res.ids, axis=1)
        np.testing.assert_allclose(res.distances, 1 - cos, rtol=1e-4, atol=1e-5)
        assert np.all(labels[res.ids] == 7)


def test_gathered_search_returns_what_include_asks_for(built):
    idx, x, labels = built
    res = idx.search(x[:2], 3, filter={"label": {"$lt": 1}}, include=("metadata", "vectors"))
    assert res.stats["postings"] == 0
    assert [[m["label"] for m in row] for row in res.metadata] == labels[res.ids].tolist()
    np.testing.assert_array_equal(res.vectors, x[res.ids])


def test_gathered_and_posting_paths_agree(tmp_path, built):
    """The same filtered searches with the gathered scan turned off (filter_gather_ratio=0)
    scan every posting with a match and return the same answer."""
    idx, x, labels = built
    q = np.random.default_rng(2).standard_normal((5, DIM)).astype(np.float32)
    flt = {"label": {"$lt": 2}}
    gathered = idx.search(q, 10, filter=flt)
    idx.close()
    with vindex.Index.open(idx.path, filter_gather_ratio=0) as other:
        scanned = other.search(q, 10, filter=flt, max_postings=4096)
    assert gathered.stats["postings"] == 0 < scanned.stats["postings"]
    np.testing.assert_array_equal(gathered.ids, scanned.ids)
    np.testing.assert_allclose(gathered.distances, scanned.distances, rtol=1e-5, atol=1e-5)


def test_gathered_plan_follows_every_write(built):
    """The gathered vectors belong to one state: after a delete, an upsert that moves a
    match and one that adds a match, the next search sees each, never a deleted id."""
    idx, x, labels = built
    flt = {"label": 0}
    q = x[np.flatnonzero(labels == 0)[:1]]
    first = idx.search(q, 5, filter=flt).ids[0]
    idx.delete([int(first[0])])
    after = idx.search(q, 5, filter=flt)
    assert int(first[0]) not in after.ids[0] and after.stats["postings"] == 0
    assert after.ids[0, 0] == first[1]
    idx.upsert([int(first[2])], -q, metadata=[{"label": 0}])  # moved far away
    assert int(first[2]) not in idx.search(q, 3, filter=flt).ids[0]
    idx.upsert([N + 1], q + 1e-3, metadata=[{"label": 0}])
    assert idx.search(q, 1, filter=flt).ids[0, 0] == N + 1
    idx.set_metadata([N + 1], {"label": 1})
    assert N + 1 not in idx.search(q, 5, filter=flt).ids[0]


def test_plan_cache_drops_least_recently_used_beyond_its_bytes(built):
    idx, _, _ = built
    st = idx._engine.state
    a, b, c = (compile_filter({"label": v}) for v in (1, 2, 3))
    one = filtered.plan(st, a).nbytes
    cache = filtered.PlanCache(max_bytes=2 * one)
    pa = cache.get(st, a)
    cache.get(st, b)
    assert cache.get(st, a) is pa  # a is now the most recently used
    cache.get(st, c)  # over budget: b goes
    assert cache.get(st, a) is pa
    assert set(k[0] for k in cache._plans) == {a, c}


def test_masked_versions_made_once_per_plan(built):
    idx, _, labels = built
    st = idx._engine.state
    p = filtered.plan(st, compile_filter({"label": 3}))
    live = st.idmap.versions
    m = p.versions_for(live, st.applied)
    assert p.versions_for(live, st.applied) is m
    assert p.versions_for(live) is not m  # another state's map: made afresh
    np.testing.assert_array_equal(p.versions_for(live), m)
    assert (m[: labels.shape[0]] != 0x80).sum() == (labels == 3).sum()


def test_bad_planner_settings_are_refused(tmp_path):
    for key, value in (("filter_gather_ratio", -1), ("filter_cache_bytes", -1)):
        with pytest.raises(vindex.InvalidConfigError, match=key):
            vindex.Index.create(tmp_path / key, dim=4, **{key: value})


def test_deleted_ids_never_come_back_while_writes_run(built):
    """Searches with a gathered plan beside a thread deleting matches and adding others: no
    search that starts after a delete is acknowledged returns its id, and every result
    matches the filter."""
    import threading

    idx, x, labels = built
    flt = {"label": {"$lt": 3}}
    victims = np.flatnonzero(labels < 3)[:40].tolist()
    gone: list[int] = []
    done = threading.Event()

    def writer():
        try:
            for i, vid in enumerate(victims):
                idx.delete([vid])
                gone.append(vid)
                idx.upsert([N + 10 + i], x[vid:vid + 1] + 1e-3, metadata=[{"label": 99}])
        finally:
            done.set()

    t = threading.Thread(target=writer)
    t.start()
    q = x[victims[:4]]
    searches = 0
    while not done.is_set() or searches < 5:
        before = set(gone)
        res = idx.search(q, 10, filter=flt)
        found = set(res.ids[res.ids >= 0].tolist())
        assert not found & before
        assert all(i < N and labels[i] < 3 for i in found)
        searches += 1
    t.join()
    assert not set(idx.search(q, 10, filter=flt).ids.reshape(-1).tolist()) & set(victims)


def test_metadata_changed_during_a_posting_scan_is_checked_again(built, tmp_path, monkeypatch):
    """A ``set_metadata`` applied while a filtered search runs (here between its choice of
    postings and their scan) takes the records it changed out of the results: the plan's
    mask predates it. With no write applied meanwhile, the mask is current and no result is
    checked again (the ``check`` below is never called)."""
    _, x, labels = built
    idx = vindex.Index.build(tmp_path / "scan", x, metadata=[{"label": int(v)} for v in labels], metric="l2",
                             rebalance=False, posting_limit_bytes=2048, filter_gather_ratio=0)
    flt = {"label": {"$lt": 2}}  # the postings nearest the query among those with a match
    q = x[np.flatnonzero(labels < 2)[:1]]
    want = idx.search(q, 10, filter=flt, max_postings=2)
    assert 0 < want.stats["postings"] < 40
    payload = type(idx._engine.state.payload)
    checks = []
    real_check = payload.check
    monkeypatch.setattr(payload, "check", lambda self, f, vids: checks.append(len(vids)) or real_check(self, f, vids))
    assert (idx.search(q, 10, filter=flt, max_postings=2).ids == want.ids).all() and not checks

    flipped = want.ids[0, :3].tolist()
    real_choose = filtered.choose_postings

    def choose_then_flip(*args, **kwargs):
        out = real_choose(*args, **kwargs)
        if flipped:
            idx.set_metadata([flipped.pop()], {"label": 99})
        return out

    monkeypatch.setattr(filtered, "choose_postings", choose_then_flip)
    changed = idx.search(q, 10, filter=flt, max_postings=2).ids[0].tolist()
    idx.close()
    assert checks and want.ids[0, 2] not in changed
    assert changed[:2] == want.ids[0, :2].tolist()
