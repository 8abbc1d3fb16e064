"""Every bad input raises a specific ValueError subclass that names the problem, and
changes nothing."""
from __future__ import annotations

import numpy as np
import pytest

import vindex


@pytest.fixture
def index(tmp_path):
    base = np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32)
    with vindex.Index.build(tmp_path / "i", base) as idx:
        yield idx


def _unchanged(index, n=300):
    assert len(index) == n


@pytest.mark.parametrize("queries,match", [
    (np.zeros((2, 15)), r"expected dimension 16, got 15"),
    (np.zeros((2, 3, 16)), r"2-D"),
    (np.array([[np.nan] * 16]), r"NaN/Inf .* rows \[0\]"),
    (np.array([[0.0] * 15 + [np.inf]]), r"NaN/Inf"),
    (np.full((1, 16), 1e39), r"NaN/Inf"),  # overflows float32
    ([["a"] * 16], r"expected numbers"),
])
def test_bad_queries(index, queries, match):
    with pytest.raises(ValueError, match=match):
        index.search(queries, 5)


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "3", 10**9])
def test_bad_k(index, k):
    with pytest.raises(vindex.InvalidKError, match="k: expected an integer"):
        index.search(np.zeros(16), k)


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_postings=0), "max_postings"),
    (dict(eps=-1.0), "eps"),
    (dict(eps=float("nan")), "eps"),
    (dict(ef=0), "ef"),
])
def test_bad_search_params(index, kwargs, match):
    with pytest.raises(vindex.InvalidKError, match=match):
        index.search(np.zeros(16), 5, **kwargs)


@pytest.mark.parametrize("ids,vectors,exc,match", [
    ([1000, 1001], np.zeros((2, 8)), vindex.DimensionError, "expected dimension 16, got 8"),
    ([1000], np.array([[np.nan] * 16]), vindex.NonFiniteError, "NaN/Inf"),
    ([1000.5], np.zeros((1, 16)), vindex.InvalidIdError, "expected integers"),
    ([-4, 1000], np.zeros((2, 16)), vindex.InvalidIdError, r"non-negative integers, got \[-4\]"),
    ([1000, 1001, 1000], np.zeros((3, 16)), vindex.DuplicateIdError, r"duplicates \[1000\]"),
    ([1000, 1001], np.zeros((3, 16)), vindex.LengthMismatchError, "2 ids and 3 vectors"),
    ([5], np.zeros((1, 16)), vindex.DuplicateIdError, r"already in the index: \[5\]"),
    (np.array([2**63], dtype=np.uint64), np.zeros((1, 16)), vindex.InvalidIdError, "below 2\\*\\*63"),
])
def test_bad_add(index, ids, vectors, exc, match):
    with pytest.raises(exc, match=match):
        index.add(ids, vectors)
    assert issubclass(exc, ValueError)
    _unchanged(index)


def test_bad_build_inputs(tmp_path):
    with pytest.raises(vindex.DimensionError):
        vindex.Index.build(tmp_path / "a", np.zeros(16, np.float32))
    with pytest.raises(vindex.DimensionError, match="2-D"):
        vindex.Index.build(tmp_path / "a", [[1.0, 2.0], [3.0]])  # ragged
    with pytest.raises(vindex.NonFiniteError):
        vindex.Index.build(tmp_path / "b", np.full((3, 4), np.nan))
    with pytest.raises(vindex.LengthMismatchError):
        vindex.Index.build(tmp_path / "c", np.zeros((3, 4)), ids=[1, 2])
    with pytest.raises(vindex.DuplicateIdError):
        vindex.Index.build(tmp_path / "d", np.zeros((3, 4)), ids=[1, 2, 1])
    with pytest.raises(vindex.InvalidConfigError, match="unknown config parameter"):
        vindex.Index.build(tmp_path / "e", np.zeros((3, 4)), posting_limit=3)
    with pytest.raises(vindex.InvalidConfigError, match="metric"):
        vindex.Index.build(tmp_path / "f", np.zeros((3, 4)), metric="hamming")
    with pytest.raises(vindex.InvalidConfigError, match="max_replicas"):
        vindex.Index.build(tmp_path / "g", np.zeros((3, 4)), max_replicas=9)
    with pytest.raises(ValueError, match=r"zero vectors in rows \[0, 1, 2\]"):
        vindex.Index.build(tmp_path / "h", np.zeros((3, 4)), metric="cosine")
    # nothing half-built is left behind
    for name in "abcdefgh":
        assert not (tmp_path / name).exists()


def test_open_missing_and_non_index(tmp_path):
    with pytest.raises(vindex.IndexNotFoundError, match="does not exist"):
        vindex.Index.open(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hello")
    with pytest.raises(vindex.NotAnIndexError, match="not a vindex index"):
        vindex.Index.open(tmp_path / "plain")
    (tmp_path / "file").write_text("x")
    with pytest.raises(vindex.NotAnIndexError):
        vindex.Index.open(tmp_path / "file")
    for exc in (vindex.IndexNotFoundError, vindex.NotAnIndexError):
        assert issubclass(exc, ValueError)


def test_create_over_existing(tmp_path):
    path = tmp_path / "x"
    vindex.Index.create(path, dim=4).close()
    with pytest.raises(vindex.IndexExistsError, match="already exists"):
        vindex.Index.create(path, dim=4)
    with pytest.raises(vindex.IndexExistsError, match="already exists"):
        vindex.Index.build(path, np.zeros((2, 4)))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "f").write_text("x")
    with pytest.raises(vindex.IndexExistsError, match="not empty"):
        vindex.Index.create(tmp_path / "busy", dim=4)
    assert (tmp_path / "busy" / "f").exists()
    with vindex.Index.open(path) as index:  # the existing index is untouched
        assert index.dim == 4


@pytest.mark.parametrize("dim", [0, -3, 2.0, True])
def test_create_bad_dim(tmp_path, dim):
    with pytest.raises(vindex.DimensionError, match="dim"):
        vindex.Index.create(tmp_path / "z", dim=dim)


def test_open_twice_is_a_clear_error(tmp_path):
    path = tmp_path / "t"
    with vindex.Index.create(path, dim=4):
        with pytest.raises(vindex.IndexLockedError, match="already open"):
            vindex.Index.open(path)


def test_open_rejects_structural_overrides(tmp_path):
    path = tmp_path / "o"
    vindex.Index.create(path, dim=4).close()
    with pytest.raises(vindex.InvalidConfigError, match="cannot change"):
        vindex.Index.open(path, max_replicas=2)
    vindex.Index.open(path, cache_bytes=1 << 22).close()


def test_failed_build_leaves_nothing_and_can_be_retried(tmp_path, monkeypatch):
    import vindex.index as index_module

    def boom(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(index_module, "build_postings", boom)
    with pytest.raises(RuntimeError, match="disk on fire"):
        vindex.Index.build(tmp_path / "f", np.ones((10, 4), np.float32))
    assert not (tmp_path / "f").exists()
    monkeypatch.undo()
    with vindex.Index.build(tmp_path / "f", np.ones((10, 4), np.float32)) as index:
        assert len(index) == 10
