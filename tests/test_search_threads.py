"""``search(..., threads=N)`` and ``IndexConfig.search_threads``: a batch cut into pieces
searched in parallel gives the batch's own results; N is checked."""
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
