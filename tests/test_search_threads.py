"""``search(..., threads=N)`` and ``IndexConfig.search_threads``: a batch whose postings are
read and scanned by N threads gives the batch's own results, reading each posting once; N
is checked."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import vindex
from vindex.errors import InvalidInputError


@pytest.fixture
def index(tmp_path, bigann):
    base = bigann["base"][:5000].astype(np.float32)
    with vindex.Index.build(tmp_path / "t", base, posting_limit_bytes=8 * 1024) as ix:
        yield ix


def test_threads_give_the_same_results_on_several_threads(index, bigann):
    queries = bigann["queries"][:200].astype(np.float32)
    one = index.search(queries, 10)
    for n in (2, 3, 7):
        res = index.search(queries, 10, threads=n)
        np.testing.assert_array_equal(res.ids, one.ids)
        np.testing.assert_array_equal(res.distances, one.distances)
        assert res.stats["records_scanned"] == one.stats["records_scanned"]
    names = {t.name for t in threading.enumerate()}
    assert any(name.startswith("vindex-search") for name in names)  # pieces ran on the pool


def test_threads_read_each_posting_once(index, bigann):
    """The threads share the batch's postings: none is read by two of them."""
    queries = bigann["queries"][:300].astype(np.float32)
    one = index.search(queries, 10, max_postings=16)
    two = index.search(queries, 10, max_postings=16, threads=2)
    np.testing.assert_array_equal(two.ids, one.ids)
    assert two.stats["postings"] == one.stats["postings"]


def test_merged_heaps_keep_each_id_once():
    """Heaps of two threads holding the same id (a replica scanned by each) merge into one entry."""
    from vindex import native

    d = np.array([[3.0, 1.0, 2.0]], np.float32)  # a max-heap: (3, 7) at the root
    i = np.array([[7, 5, 6]], np.int64)
    od = np.array([[2.0, 0.5, 9.0]], np.float32)
    oi = np.array([[6, 4, 8]], np.int64)
    sizes, other_sizes = np.array([3], np.int32), np.array([3], np.int32)
    native.scan.merge_heaps(d, i, sizes, od, oi, other_sizes)
    native.scan.finish(d, i, sizes)
    assert i.tolist() == [[4, 5, 6]] and d.tolist() == [[0.5, 1.0, 2.0]]


def test_small_batches_stay_on_the_calling_thread(index, bigann):
    queries = bigann["queries"][:20].astype(np.float32)  # too few for two pieces of > 16
    np.testing.assert_array_equal(index.search(queries, 10, threads=4).ids, index.search(queries, 10).ids)
    assert not any(t.name.startswith("vindex-search") for t in threading.enumerate())


def test_config_default_and_reopen(tmp_path, bigann):
    base = bigann["base"][:2000].astype(np.float32)
    queries = bigann["queries"][:100].astype(np.float32)
    vindex.Index.build(tmp_path / "c", base).close()
    with vindex.Index.open(tmp_path / "c") as plain:
        want = plain.search(queries, 5).ids
    with vindex.Index.open(tmp_path / "c", search_threads=2) as ix:
        assert ix.config.search_threads == 2
        np.testing.assert_array_equal(ix.search(queries, 5).ids, want)
        assert any(t.name.startswith("vindex-search") for t in threading.enumerate())
    assert not any(t.name.startswith("vindex-search") for t in threading.enumerate())  # closed with the index


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, 257])
def test_bad_threads_are_refused_by_name(index, bigann, bad):
    with pytest.raises(InvalidInputError, match="threads"):
        index.search(bigann["queries"][:40].astype(np.float32), 10, threads=bad)
    with pytest.raises(InvalidInputError, match="threads"):
        index.check_queries(bigann["queries"][:1].astype(np.float32), 10, threads=bad)


def test_bad_search_threads_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="search_threads"):
        vindex.Index.create(tmp_path / "b", dim=4, search_threads=0)


def test_searches_with_growing_thread_counts_at_once(index, bigann):
    """Searches asking for more threads than the pool has replace it while others use it."""
    queries = bigann["queries"][:300].astype(np.float32)
    want = index.search(queries, 10).ids
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            for _ in range(2):
                np.testing.assert_array_equal(index.search(queries, 10, threads=n).ids, want)
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(n,)) for n in (2, 3, 4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors[:2]


def test_filtered_batches_on_threads_give_the_same_results(tmp_path, bigann):
    """A filter's choice of postings, made in pieces of the queries, then shared by the threads."""
    base = bigann["base"][:3000].astype(np.float32)
    labels = np.arange(3000) % 5
    queries = bigann["queries"][:100].astype(np.float32)
    with vindex.Index.build(tmp_path / "f", base, metadata=[{"label": int(v)} for v in labels],
                            posting_limit_bytes=8 * 1024, filter_gather_ratio=0.0) as ix:
        one = ix.search(queries, 10, filter={"label": 2})
        two = ix.search(queries, 10, filter={"label": 2}, threads=2)
    np.testing.assert_array_equal(two.ids, one.ids)
    np.testing.assert_array_equal(two.distances, one.distances)
    assert set(labels[one.ids[one.ids >= 0]].tolist()) == {2}
    assert two.stats["postings"] == one.stats["postings"] > 0
