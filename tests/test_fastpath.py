"""The small-search fast path (``native.fast``, ``RocksStore.scan_resident``): searches of a
few queries scan the postings kept in memory where they lie and read only the others; they
find what the general path (batches) finds, while writes, deletes and rebalancing go on."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import vindex
from vindex.config import SMALL_SEARCH_QUERIES
from conftest import run_for

# the head graph for every search, so that batches and single queries choose the same heads
GRAPH = {"exact_search_max_heads": 0}


def _resident_reads(index: vindex.Index) -> int:
    return index.stats()["store"]["resident_reads"]


def _assert_singles_match_batch(index: vindex.Index, queries: np.ndarray, gone: set[int], rtol: float = 0) -> None:
    """Each query alone finds what the batch (the general path) finds: the same ids, the same
    distances (to ``rtol``), no id in ``gone``."""
    assert queries.shape[0] > SMALL_SEARCH_QUERIES  # the batch takes the general path
    batch = index.search(queries, 10)
    for i in range(queries.shape[0]):
        one = index.search(queries[i], 10)
        np.testing.assert_array_equal(one.ids[0], batch.ids[i])
        np.testing.assert_allclose(one.distances[0], batch.distances[i], rtol=rtol, atol=0)
        assert not gone.intersection(one.ids[0].tolist())


def test_fast_path_matches_the_general_path_through_updates_and_rebalancing(tmp_path, bigann):
    base = bigann["base"][:6000].astype(np.float32)
    queries = bigann["queries"][:SMALL_SEARCH_QUERIES + 4].astype(np.float32)
    index = vindex.Index.build(tmp_path / "f", base[:3000], posting_limit_bytes=8 * 1024, **GRAPH)
    index.search(queries, 10)  # the read keeps the postings in memory
    before = _resident_reads(index)
    _assert_singles_match_batch(index, queries, set())
    assert _resident_reads(index) > before  # the singles took the fast path
    rng = np.random.default_rng(0)
    gone: set[int] = set()
    for lo in range(3000, 6000, 1000):  # appends grow postings, splits replace them
        index.upsert(np.arange(lo, lo + 1000), base[lo:lo + 1000])
        dead = rng.choice(np.arange(lo + 1000), 200, replace=False)
        index.delete(dead)
        gone.update(dead.tolist())
        moved = rng.choice(np.setdiff1d(np.arange(lo + 1000), dead), 100, replace=False)
        index.upsert(moved, base[moved] + 500.0)  # their old copies turn stale
        _assert_singles_match_batch(index, queries, gone)
        assert index.wait_idle(timeout=60)
        _assert_singles_match_batch(index, queries, gone)
    assert index.stats()["splits"] > 0
    index.close()


@pytest.mark.parametrize("resident, served", [({}, "resident_reads"), ({"resident_bytes": 0}, "code_reads")])
def test_fast_path_never_returns_an_acknowledged_delete(tmp_path, bigann, resident, served):
    """One-query searches in threads while a writer deletes and inserts: a search that
    starts after a delete was acknowledged never returns the id; from float32 postings
    kept, and from int8 posting codes (none kept)."""
    base = bigann["base"][:4000].astype(np.float32)
    extra = bigann["base"][4000:8000].astype(np.float32)
    index = vindex.Index.build(tmp_path / "d", base, posting_limit_bytes=8 * 1024, **resident)
    index.search(base[::10], 10)
    lock = threading.Lock()
    deleted: set[int] = set()
    errors: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        order = np.random.default_rng(1).permutation(4000)
        fresh = 4000
        for lo in range(0, 3000, 20):  # deleted ids are never written again
            if stop.is_set():
                return
            index.upsert(np.arange(fresh, fresh + 20), extra[fresh - 4000:fresh - 3980])
            fresh += 20
            index.delete(order[lo:lo + 20])
            with lock:
                deleted.update(order[lo:lo + 20].tolist())

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            with lock:
                gone = set(deleted)
            i = int(rng.integers(4000))
            ids = index.search(base[i], 10).ids[0]
            bad = gone.intersection(ids.tolist())
            if bad:
                errors.append(f"deleted ids {sorted(bad)} returned")

    before = index.stats()["store"][served]
    run_for([threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(s,)) for s in range(2)],
            3, stop)
    assert not errors, errors[:5]
    assert index.stats()["store"][served] > before
    index.close()


def test_resident_bytes_bounds_the_postings_kept(tmp_path, bigann):
    base = bigann["base"][:3000].astype(np.float32)
    queries = bigann["queries"][:50].astype(np.float32)
    vindex.Index.build(tmp_path / "r", base, posting_limit_bytes=8 * 1024).close()
    with vindex.Index.open(tmp_path / "r") as ix:
        want = [ix.search(q, 10).ids for q in queries]
    for budget in (0, 64 * 1024):
        with vindex.Index.open(tmp_path / "r", resident_bytes=budget) as ix:
            got = [ix.search(q, 10).ids for q in queries]
            store = ix.stats()["store"]
            assert store["kept_allocated_bytes"] <= budget
            assert (store["resident_reads"] > 0) == (budget > 0)
        np.testing.assert_array_equal(np.concatenate(got), np.concatenate(want))
    with pytest.raises(ValueError, match="resident_bytes"):
        vindex.Index.open(tmp_path / "r", resident_bytes=-2)


def _ranked(ids: np.ndarray, dists: np.ndarray) -> bool:
    """Results best first, ties by id, each id once."""
    n = int((ids >= 0).sum())
    pairs = list(zip(dists[:n].tolist(), ids[:n].tolist()))
    return pairs == sorted(pairs) and len(set(ids[:n].tolist())) == n and (ids[n:] == -1).all()


def test_fused_path_matches_the_general_path_under_concurrent_writes(tmp_path, bigann):
    """One-query searches (the fused kernel: head search and resident scan in one call) run
    in threads while a writer upserts, deletes and moves vectors and rebalancing splits
    postings: each result is ranked (ties by id) and holds no acknowledged delete; whenever
    the writer pauses, every single query finds exactly what the same query finds in a
    batch (the general path), distances bit for bit."""
    base = bigann["base"][:6000].astype(np.float32)
    queries = bigann["queries"][:SMALL_SEARCH_QUERIES + 4].astype(np.float32)
    index = vindex.Index.build(tmp_path / "c", base[:3000], posting_limit_bytes=8 * 1024, **GRAPH)
    index.search(queries, 10)
    lock = threading.Lock()
    gone: set[int] = set()
    errors: list[str] = []
    stop, running = threading.Event(), threading.Event()

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            if not running.wait(0.01):  # searches keep rebalancing waiting: none while it drains
                continue
            with lock:
                dead = set(gone)
            q = queries[int(rng.integers(queries.shape[0]))]
            res = index.search(q, 10)
            if not _ranked(res.ids[0], res.distances[0]):
                errors.append(f"unranked result {res.ids[0].tolist()} {res.distances[0].tolist()}")
            if dead.intersection(res.ids[0].tolist()):
                errors.append(f"deleted ids {sorted(dead.intersection(res.ids[0].tolist()))} returned")

    readers = [threading.Thread(target=reader, args=(s,)) for s in range(2)]
    for t in readers:
        t.start()
    rng = np.random.default_rng(0)
    try:
        for lo in range(3000, 6000, 1000):
            running.set()
            index.upsert(np.arange(lo, lo + 1000), base[lo:lo + 1000])
            dead = rng.choice(np.setdiff1d(np.arange(lo + 1000), list(gone)), 200, replace=False)
            index.delete(dead)
            with lock:
                gone.update(dead.tolist())
            moved = rng.choice(np.setdiff1d(np.arange(lo + 1000), list(gone)), 100, replace=False)
            index.upsert(moved, base[moved] + 500.0)
            running.clear()
            assert index.wait_idle(timeout=60)
            _assert_singles_match_batch(index, queries, gone)
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert not errors, errors[:5]
    assert index.stats()["splits"] > 0
    index.close()


#: float32 sums of the same terms in another order differ by a few units in the last place
ULP = 4 * float(np.finfo(np.float32).eps)


def _code_scans(index: vindex.Index) -> int:
    return index.stats()["store"]["resident_code_scans"]


def test_wide_kept_postings_scanned_as_codes_first_find_what_the_float32_scan_does(tmp_path):
    """At 384 dimensions a one-query search scans the postings kept both as float32 and as
    codes through their codes, reranking from the kept rows (``codes.scan_kept``): the ids
    equal the batch's float32 scan, and the distances but for the last bit (summed in another
    order), through appends, deletes, replaced vectors and rebalancing; deleted ids never
    come back."""
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((40, 384)).astype(np.float32)
    x = centres[rng.integers(0, 40, 5000)] + 0.3 * rng.standard_normal((5000, 384)).astype(np.float32)
    queries = x[rng.choice(5000, SMALL_SEARCH_QUERIES + 4, replace=False)] + 0.1
    index = vindex.Index.build(tmp_path / "w", x[:3000], posting_limit_bytes=64 * 1024, **GRAPH)
    index.search(queries[0], 10)  # starts the codes build
    assert index.wait_idle(timeout=60)
    before = _code_scans(index)
    _assert_singles_match_batch(index, queries, set(), ULP)
    assert _code_scans(index) > before
    gone: set[int] = set()
    for lo in (3000, 4000):
        index.upsert(np.arange(lo, lo + 1000), x[lo:lo + 1000])
        dead = rng.choice(np.arange(lo + 1000), 200, replace=False)
        index.delete(dead)
        gone.update(dead.tolist())
        moved = rng.choice(np.setdiff1d(np.arange(lo + 1000), dead), 100, replace=False)
        index.upsert(moved, x[moved] + 0.5)
        _assert_singles_match_batch(index, queries, gone, ULP)
        assert index.wait_idle(timeout=60)
        before = _code_scans(index)
        _assert_singles_match_batch(index, queries, gone, ULP)
        assert _code_scans(index) > before
    assert index.stats()["splits"] > 0
    index.close()
