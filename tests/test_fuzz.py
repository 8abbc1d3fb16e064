"""Hypothesis fuzzing of the library API and of the gRPC service.

Library: ``vindex.Index`` on a small RocksDB index takes valid, single-defect and wild inputs
(random dimensions and dtypes, NaN/Inf, negative and huge k, empty and duplicate ids, ids >= 2^63,
wrong types). A valid call must succeed, a single-defect call must raise the documented
``InvalidInputError`` subclass for its defect, and a wild call may only succeed or raise an
``InvalidInputError`` (never a raw numpy/numba/TypeError/IndexError). A dict models every
acknowledged write; after every example the index holds exactly the model (count and bytes).

gRPC: one ``vindex serve`` subprocess for the module. Structured requests of every RPC (valid,
single-defect, wild), raw garbage bytes and mutated serialisations sent through a raw channel,
upsert streams mixing valid chunks with garbage, and messages over 64 MiB. Vectors go as bytes
or as their ``repeated float`` twins, as float64 bytes or in both fields (both refused), and
searches state their ``nq`` rightly, wrongly (refused) or not at all. Every status is a
documented one (never UNKNOWN or INTERNAL), library errors carry their class in the trailers,
predictable outcomes are the predicted code, and a call never exceeds its 30 s deadline. The
collections written before fuzzing are checked after every example: ``sentinel`` (never
written by the fuzz) keeps its bytes and count, ``fuzz`` and ``fuzz-cos`` equal a model of the
acknowledged writes. At the end the server still reports SERVING, its log holds no traceback,
and it stops cleanly.

Bugs this fuzzing found below the validation layer have regression tests at the end of this
file: finite vectors whose squared norms overflow float32 (now refused), more identical
vectors than a posting holds (a RecursionError in clustering), config values past what faiss
or the head graph take (now refused up front). The fuzz domain still keeps values under
``BOUND``.
"""
from __future__ import annotations

import fractions
import json
import os
import subprocess
import sys
import tempfile

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, assume, currently_in_test_context, event, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import vindex
from vindex.service import vindex_pb2 as pb
from vindex.service import vindex_pb2_grpc as pb_grpc
from vindex.service.collections import NAME_RE
from vindex.service.status import _KNOWN, ERROR_KEY
from test_service import ServerProcess, health, stopped_cleanly
from vindex import errors, validation

DIM = 8
#: Finite values this large keep every squared distance inside float32 (see the xfail below).
BOUND = float(np.float32(1e15))
#: 8-d records are 40 bytes: 25 to a posting, so a few hundred vectors fill a dozen postings.
CONFIG = dict(posting_limit_bytes=1024)
ID_MAX = 300                                  # fuzzed ids live in 0..ID_MAX (and a few huge ones)
SENTINEL_IDS = np.arange(10**6, 10**6 + 64)   # written before fuzzing, never named by the fuzz
BIG_VALID_IDS = [2**63 - 1, 2**62, 2**32, 2**31 - 1]

SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

#: ``VINDEX_FUZZ_SCALE=20`` runs every fuzz test with 20x the examples (``test_fuzz_long``).
SCALE = int(os.environ.get("VINDEX_FUZZ_SCALE", "1"))


def fuzz_settings(n: int) -> settings:
    return settings(max_examples=n * SCALE, deadline=None, suppress_health_check=SUPPRESSED)


# --- shared strategies ---------------------------------------------------------------------------
finite = st.floats(-BOUND, BOUND, allow_nan=False, allow_infinity=False, width=32)
#: Non-finite values, and float64 values that overflow float32.
non_finite = st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e39, -3.5e38])


def rows(n: int, dim: int = DIM):
    return hnp.arrays(np.float32, (n, dim), elements=finite)


def _noncontiguous(a: np.ndarray) -> np.ndarray:
    wide = np.repeat(a, 2, axis=-1)
    return wide[..., ::2]


#: Ways of passing the same float32 rows: the library must read each as those rows.
ROW_FORMS = {
    "f32": lambda a: a,
    "f64": lambda a: a.astype(np.float64),
    "list": lambda a: a.tolist(),
    "fortran": np.asfortranarray,
    "big-endian": lambda a: a.astype(">f4"),
    "strided": _noncontiguous,
}
#: Ways of passing the same ids.
ID_FORMS = {
    "list": lambda i: list(i),
    "tuple": lambda i: tuple(i),
    "int64": lambda i: np.array(i, dtype=np.int64),
    "uint64": lambda i: np.array(i, dtype=np.uint64),
    "strided": lambda i: np.repeat(np.array(i, dtype=np.int64), 2)[::2],
}

valid_id = st.one_of(st.integers(0, ID_MAX), st.sampled_from(BIG_VALID_IDS))
valid_ids = st.lists(valid_id, max_size=24, unique=True)

wild_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4),
                        st.binary(max_size=4), st.complex_numbers())
wild = st.one_of(
    wild_scalar,
    st.lists(wild_scalar, max_size=DIM + 1),
    st.lists(st.lists(st.one_of(st.integers(), st.floats()), max_size=DIM + 1), max_size=3),
    hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=DIM + 1)),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


def wild_ids_filter(x) -> bool:
    """Wild ids never name the sentinel ids (unlikely anyway), which must stay as written."""
    try:
        arr = np.asarray(x)
        if arr.dtype.kind in "iu" and arr.size:
            return not np.isin(arr.ravel(), SENTINEL_IDS).any()
    except Exception:
        pass
    return True


# --- library -------------------------------------------------------------------------------------
class Library:
    """The fuzzed index and its model: id -> the float32 row the index must return."""

    def __init__(self, index: vindex.Index, model: dict[int, np.ndarray]):
        self.index, self.model = index, model

    def stored(self, ids: np.ndarray, x: np.ndarray) -> None:
        for i, row in zip(ids.tolist(), x):
            self.model[int(i)] = row.copy()

    def check(self) -> None:
        """The index holds exactly the model: count, every vector's bytes, absent ids absent."""
        idx = self.index
        assert len(idx) == len(self.model)
        ids = np.array(sorted(self.model), dtype=np.int64)
        got, found = idx.get(ids)
        assert found.all(), ids[~found]
        want = np.stack([self.model[i] for i in ids.tolist()])
        assert got.tobytes() == want.tobytes()
        absent = np.setdiff1d(np.arange(ID_MAX + 1), ids)[:20]
        got, found = idx.get(absent)
        assert not found.any() and not got.any()


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    rng = np.random.default_rng(0)
    index = vindex.Index.create(tmp_path_factory.mktemp("lib") / "index", dim=DIM, **CONFIG)
    model: dict[int, np.ndarray] = {}
    lib = Library(index, model)
    start = np.arange(0, ID_MAX, 2)
    x = rng.standard_normal((start.size + SENTINEL_IDS.size, DIM)).astype(np.float32)
    ids = np.concatenate([start, SENTINEL_IDS])
    index.upsert(ids, x)
    lib.stored(ids, x)
    lib.sentinel = x[start.size:].copy()
    yield lib
    lib.check()
    got, found = index.get(SENTINEL_IDS)
    assert found.all() and got.tobytes() == lib.sentinel.tobytes()
    index.close()


def documented(fn):
    """``(result, None)`` or ``(None, error)`` for a documented input error; anything else raises."""
    try:
        out = fn(), None
    except errors.VindexError as e:
        assert isinstance(e, errors.InvalidInputError) and isinstance(e, ValueError), repr(e)
        out = None, e
    if currently_in_test_context():
        event("ok" if out[1] is None else type(out[1]).__name__)
    return out


def expect(error, expected) -> None:
    """``error`` is exactly the documented class (``None``: the call had to succeed)."""
    if expected is None:
        assert error is None, f"a valid call failed: {error!r}"
    else:
        assert error is not None, f"expected {expected.__name__}, the call succeeded"
        assert type(error) is expected, f"expected {expected.__name__}, got {error!r}"


@st.composite
def write_case(draw):
    """``(label, ids, vectors, expected error class or None, or "wild")``."""
    ids = draw(valid_ids)
    n = len(ids)
    x = draw(rows(n))
    kind = draw(st.sampled_from(["valid"] * 4 + ["ids", "vectors", "length", "wild"]))
    id_form = draw(st.sampled_from(sorted(ID_FORMS)))
    row_form = draw(st.sampled_from(sorted(ROW_FORMS)))
    if kind == "valid":
        if n == 1 and draw(st.booleans()):  # one id and one (dim,) vector
            return "valid-1d", ids[0], ROW_FORMS[row_form](x[0]), None, (ids, x)
        return "valid", ID_FORMS[id_form](ids), ROW_FORMS[row_form](x), None, (ids, x)
    if kind == "length":
        m = draw(st.integers(0, 6).filter(lambda m: m != n))
        return "length", ids, draw(rows(m)), errors.LengthMismatchError, None
    if kind == "ids":
        bad, error = draw(st.sampled_from([
            ("negative", errors.InvalidIdError), ("2^63", errors.InvalidIdError),
            ("2^64", errors.InvalidIdError), ("float", errors.InvalidIdError), ("bool", errors.InvalidIdError),
            ("2d", errors.InvalidIdError), ("str", errors.InvalidIdError), ("none", errors.InvalidIdError),
            ("dup", errors.DuplicateIdError)]))
        pos = draw(st.integers(0, n))
        bad_ids = list(ids)
        if bad == "negative":
            bad_ids.insert(pos, draw(st.integers(-2**63, -1)))
        elif bad == "2^63":
            bad_ids.insert(pos, draw(st.integers(2**63, 2**64 - 1)))
            if draw(st.booleans()):
                bad_ids = np.array(bad_ids, dtype=np.uint64)
        elif bad == "2^64":
            bad_ids.insert(pos, draw(st.integers(2**64, 2**80)))
        elif bad == "float":
            bad_ids = [float(i) for i in ids] or [draw(st.floats())]
        elif bad == "bool":
            bad_ids = [True] + [bool(i % 2) for i in ids]
        elif bad == "2d":
            bad_ids = [ids] if ids else [[0]]
        elif bad == "str":
            bad_ids = [str(i) for i in ids] or ["1"]
        elif bad == "none":
            bad_ids = None
        else:
            if not ids:
                ids, bad_ids = [7], [7]
            bad_ids.insert(pos, ids[draw(st.integers(0, len(ids) - 1))])
        m = 1 if bad_ids is None or np.ndim(bad_ids) == 0 else len(bad_ids)
        return f"ids-{bad}", bad_ids, draw(rows(m)), error, None
    if kind == "vectors":
        bad, error = draw(st.sampled_from([
            ("dim", errors.DimensionError), ("nonfinite", errors.NonFiniteError), ("3d", errors.DimensionError),
            ("strings", errors.InvalidInputError), ("complex", errors.InvalidInputError),
            ("ragged", errors.DimensionError), ("objects", errors.InvalidInputError)]))
        if bad == "dim":
            dim = draw(st.integers(0, 3 * DIM - 1).map(lambda d: d + (d >= DIM)))
            vec = draw(rows(n, dim))
            if n == 1 and dim > 0 and draw(st.booleans()):
                vec = vec[0]
        elif bad == "nonfinite":
            assume(n > 0)
            vec = x.astype(np.float64)
            vec[draw(st.integers(0, n - 1)), draw(st.integers(0, DIM - 1))] = draw(non_finite)
        elif bad == "3d":
            vec = x[None]
        elif bad == "strings":
            vec = x.astype(str)
        elif bad == "complex":
            vec = x.astype(np.complex64)
        elif bad == "ragged":
            vec = x.tolist() + [[1.0] * (DIM - 1)]
        else:
            vec = [[object()] * DIM for _ in range(n)] or [[None] * DIM]
        return f"vectors-{bad}", ids, vec, error, None
    # wild: either side or both
    side = draw(st.sampled_from(["ids", "vectors", "both"]))
    wid = draw(wild.filter(wild_ids_filter)) if side != "vectors" else ids
    wvec = draw(wild) if side != "ids" else ROW_FORMS[row_form](x)
    return f"wild-{side}", wid, wvec, "wild", None


def bounded_if_valid(vectors) -> bool:
    """False for vectors the library would accept holding finite values past ``BOUND``."""
    try:
        x = validation.vectors(vectors, DIM)
    except errors.VindexError:
        return True
    return bool((np.abs(x) <= BOUND).all())


@fuzz_settings(120)
@given(case=write_case(), op=st.sampled_from(["upsert", "upsert", "add"]))
def test_library_writes(lib, case, op):
    label, ids, vectors, expected, valid = case
    note(f"{op} {label}")
    idx = lib.index
    if valid is not None and op == "add":
        live = sorted(i for i in valid[0] if i in lib.model)
        if live:
            _, err = documented(lambda: idx.add(ids, vectors))
            expect(err, errors.IdExistsError)
            assert err.ids == live
            lib.check()
            return
    if expected == "wild":
        assume(bounded_if_valid(vectors))
    _, err = documented(lambda: getattr(idx, op)(ids, vectors))
    if expected == "wild":
        if err is None:  # coercible after all: it is stored as the library read it
            i = validation.ids(ids)
            lib.stored(i, validation.vectors(vectors, DIM))
    else:
        expect(err, expected)
        if err is None:
            lib.stored(np.asarray(valid[0], dtype=np.int64), valid[1])
    lib.check()


@st.composite
def ids_case(draw):
    ids = draw(valid_ids)
    kind = draw(st.sampled_from(["valid"] * 3 + ["negative", "2^63", "dup", "float", "wild"]))
    if kind == "valid":
        if len(ids) == 1 and draw(st.booleans()):
            return "valid-int", ids[0], None, ids
        return "valid", ID_FORMS[draw(st.sampled_from(sorted(ID_FORMS)))](ids), None, ids
    if kind == "negative":
        return kind, ids + [draw(st.integers(-2**70, -1))], errors.InvalidIdError, None
    if kind == "2^63":
        return kind, np.array(ids + [2**63 + draw(st.integers(0, 2**63 - 1))], dtype=np.uint64), \
            errors.InvalidIdError, None
    if kind == "dup":
        ids = ids or [3]
        return kind, ids + [draw(st.sampled_from(ids))], errors.DuplicateIdError, None
    if kind == "float":
        return kind, np.array(ids or [1], dtype=np.float64), errors.InvalidIdError, None
    return kind, draw(wild.filter(wild_ids_filter)), "wild", None


@fuzz_settings(100)
@given(case=ids_case(), op=st.sampled_from(["get", "delete"]))
def test_library_get_delete(lib, case, op):
    label, ids, expected, valid = case
    note(f"{op} {label}")
    idx = lib.index
    res, err = documented(lambda: getattr(idx, op)(ids))
    if expected == "wild":
        if err is not None:
            lib.check()
            return
        valid = validation.ids(ids).tolist()
    else:
        expect(err, expected)
        if err is not None:
            lib.check()
            return
    if op == "delete":
        assert res == sum(i in lib.model for i in valid)
        for i in valid:
            lib.model.pop(i, None)
    else:
        x, found = res
        assert x.shape == (len(valid), DIM) and x.dtype == np.float32 and found.dtype == bool
        assert found.tolist() == [i in lib.model for i in valid]
        for i, row, f in zip(valid, x, found):
            assert row.tobytes() == (lib.model[i] if f else np.zeros(DIM, np.float32)).tobytes()
    lib.check()


BAD_K = [0, -1, -2**70, validation.MAX_K + 1, 2**64, 1.5, "5", None, True, np.float32(3), 3j]
BAD_MAX_POSTINGS = [0, 4097, -5, 2.0, "x", False, 2**70]
BAD_EF = [0, 65537, -1, 8.0, "8", True]
BAD_EPS = [-1e-9, -1.0, float("nan"), float("-inf"), "x", 1j, 10**400, True]  # None: the default


@st.composite
def search_case(draw):
    nq = draw(st.integers(0, 5))
    q = draw(rows(nq))
    k = draw(st.one_of(st.integers(1, 20), st.sampled_from([1, validation.MAX_K]), st.integers(1, validation.MAX_K)))
    params = draw(st.fixed_dictionaries({}, optional={
        "max_postings": st.integers(1, 4096), "ef": st.integers(1, 65536),
        "eps": st.one_of(st.floats(0, 1e6), st.just(float("inf")), st.integers(0, 100))}))
    query = ROW_FORMS[draw(st.sampled_from(sorted(ROW_FORMS)))](q)
    if nq == 1 and draw(st.booleans()):
        query = q[0]
    kind = draw(st.sampled_from(["valid"] * 3 + ["k", "param", "queries", "wild"]))
    if kind == "valid":
        return kind, query, k, params, None
    if kind == "k":
        return kind, query, draw(st.sampled_from(BAD_K)), params, errors.InvalidKError
    if kind == "param":
        name = draw(st.sampled_from(["max_postings", "ef", "eps"]))
        bad = {"max_postings": BAD_MAX_POSTINGS, "ef": BAD_EF, "eps": BAD_EPS}[name]
        return f"param-{name}", query, k, {**params, name: draw(st.sampled_from(bad))}, errors.InvalidKError
    if kind == "queries":
        bad = draw(st.sampled_from(["dim", "nonfinite", "strings", "3d"]))
        if bad == "dim":
            dim = draw(st.integers(0, 3 * DIM - 1).map(lambda d: d + (d >= DIM)))
            return "queries-dim", draw(rows(nq, dim)), k, params, errors.DimensionError
        if bad == "nonfinite":
            q = q.astype(np.float64) if nq else np.zeros((1, DIM))
            q[draw(st.integers(0, q.shape[0] - 1)), draw(st.integers(0, DIM - 1))] = draw(non_finite)
            return "queries-nonfinite", q, k, params, errors.NonFiniteError
        if bad == "strings":
            return "queries-strings", q.astype(str), k, params, errors.InvalidInputError
        return "queries-3d", q[None], k, params, errors.DimensionError
    which = draw(st.sampled_from(["queries", "k", "params"]))
    if which == "queries":
        query = draw(wild)
    elif which == "k":
        k = draw(wild)
    else:
        params = {name: draw(wild) for name in draw(st.sets(st.sampled_from(["max_postings", "ef", "eps"]),
                                                             min_size=1))}
    return f"wild-{which}", query, k, params, "wild"


@fuzz_settings(120)
@given(case=search_case())
def test_library_search(lib, case):
    label, query, k, params, expected = case
    note(label)
    res, err = documented(lambda: lib.index.search(query, k, **params))
    if expected != "wild":
        expect(err, expected)
    if res is not None:
        nq = validation.vectors(query, DIM).shape[0]
        kk = int(k)
        assert res.ids.shape == res.distances.shape == (nq, kk)
        assert res.ids.dtype == np.int64 and res.distances.dtype == np.float32
        pad = res.ids == -1
        assert np.isin(res.ids[~pad], np.array(sorted(lib.model), dtype=np.int64)).all()
        assert np.isinf(res.distances[pad]).all()
        for row_ids, row_d, row_pad in zip(res.ids, res.distances, pad):
            assert (row_pad[:-1] <= row_pad[1:]).all()  # padding only at the end
            found = row_ids[~row_pad]
            assert np.unique(found).size == found.size
            if expected is None:  # bounded values: every distance is finite and sorted
                assert np.isfinite(row_d[~row_pad]).all() and (np.diff(row_d[~row_pad]) >= 0).all()
            else:
                assert not np.isnan(row_d).any()
    assert len(lib.index) == len(lib.model)


@pytest.fixture(scope="module")
def cosine_index(tmp_path_factory):
    index = vindex.Index.create(tmp_path_factory.mktemp("cos") / "index", dim=4, metric="cosine", **CONFIG)
    yield index
    index.close()


any_finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


@fuzz_settings(60)
@given(x=hnp.arrays(np.float32, st.tuples(st.integers(1, 6), st.just(4)), elements=any_finite32, fill=st.nothing()))
@example(x=np.full((2, 4), 3e38, np.float32))       # the sum of squares overflowed: stored as zeros
@example(x=np.full((1, 4), 1e-30, np.float32))      # it underflowed: refused as a zero vector
@example(x=np.array([[1e-45, 0, 0, 0], [1e-20, 1e-20, 0, 0]], np.float32))  # subnormal precision
def test_library_cosine_any_magnitude(cosine_index, x):
    """Cosine rows of any finite magnitude (3e38 down to subnormals) are stored as unit
    vectors; only all-zero rows are refused. Regression: a float32 sum of squares overflowed
    (rows past ~1e19 were stored as zeros) or underflowed (rows below ~1e-23 were refused)."""
    ids = np.arange(x.shape[0])
    zero = ~x.any(axis=1)
    _, err = documented(lambda: cosine_index.upsert(ids, x))
    if zero.any():
        expect(err, errors.InvalidInputError)
        assert "non-zero vectors" in str(err)
        return
    expect(err, None)
    got, found = cosine_index.get(ids)
    assert found.all()
    wide = x.astype(np.float64)
    unit = wide / np.linalg.norm(wide, axis=1, keepdims=True)
    np.testing.assert_allclose(got, unit, rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got.astype(np.float64), axis=1), 1.0, atol=1e-6)
    res = cosine_index.search(x, 1, max_postings=4096, eps=float("inf"))
    assert (res.ids[:, 0] >= 0).all()


# --- library: create, build and open -----------------------------------------------------------
#: IndexConfig fields: (values in range, values out of range). The in-range values stop short
#: of the known config bugs below (past 2^31 for faiss, alpha past 1e154, thread counts, ...).
CONFIG_FIELDS = {
    "posting_limit_bytes": (st.integers(1024, 2**40), st.integers(-1, 1023)),
    "build_fill": (st.floats(0.05, 1.0), st.sampled_from([0.0, 0.04, 1.01, float("inf")])),
    "max_replicas": (st.integers(1, 8), st.sampled_from([0, 9, -1])),
    "replica_candidates": (st.integers(1, 1024), st.sampled_from([0, 1025])),
    "replica_eps": (st.floats(0, 1e30), st.sampled_from([-1e-9, -1.0])),
    "rng_factor": (st.floats(1e-30, 1e30), st.sampled_from([0.0, -1.0])),
    "insert_candidates": (st.integers(1, 1024), st.sampled_from([0, 1025])),
    "insert_ef": (st.integers(1, 4096), st.sampled_from([0, 4097])),
    "new_head_factor": (st.floats(0, 1e30), st.just(-0.5)),
    "merge_fraction": (st.floats(0, 0.49), st.sampled_from([0.5, -0.1])),
    "gc_fraction": (st.floats(0.01, 1.0), st.sampled_from([0.0, 1.5])),
    "reassign_neighbors": (st.integers(0, 1024), st.sampled_from([-1, 1025])),
    "scrub_ratio": (st.floats(0, 1e30), st.just(-1.0)),
    "split_balance": (st.floats(0, 1e30), st.just(-1.0)),
    "rebalance_batch": (st.integers(1, 65536), st.sampled_from([0, 65537])),
    "checkpoint_every": (st.integers(1, 2**62), st.sampled_from([0, -5])),
    "graph_degree": (st.integers(4, 64), st.sampled_from([3, 257])),
    "graph_build_ef": (st.integers(64, 4096), st.sampled_from([0, 3])),
    "graph_alpha": (st.floats(1.0, 1e6), st.sampled_from([0.99, -1.0])),
    "graph_entries": (st.integers(1, 4096), st.sampled_from([0, 4097])),
    "kmeans_iters": (st.integers(1, 30), st.sampled_from([0, 1001])),
    "kmeans_max_points_per_centroid": (st.integers(8, 2**31 - 1), st.just(7)),
    "seed": (st.integers(0, 2**31 - 1), st.just(-1)),
    "build_threads": (st.integers(0, 2), st.just(-1)),
    "max_postings": (st.integers(1, 4096), st.sampled_from([0, 4097])),
    "search_eps": (st.floats(0, 1e30), st.just(-1.0)),
    "search_ef": (st.integers(0, 2**31), st.just(-1)),
    "cache_bytes": (st.integers(0, 2**40), st.just(-1)),
    "rebalance": (st.booleans(), st.sampled_from([0, 1, "yes"])),
}
WRONG_TYPE = st.one_of(st.none(), st.text(max_size=3), st.lists(st.integers(), max_size=2), st.just(True),
                       st.just(float("nan")), st.just(1.5), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))


@st.composite
def config_kwargs(draw, valid: bool = False):
    """Up to three IndexConfig fields: in range, or (unless ``valid``) out of range or of the
    wrong type, plus the odd unknown or reserved key."""
    out = {}
    for name in draw(st.sets(st.sampled_from(sorted(CONFIG_FIELDS)), max_size=3)):
        good, bad = CONFIG_FIELDS[name]
        out[name] = draw(good if valid else st.one_of(good, good, bad, WRONG_TYPE))
    if not valid and draw(st.integers(0, 9)) == 0:
        out[draw(st.sampled_from(["bogus", "store", "dim", "metric"]))] = draw(st.one_of(st.just("memory"), WRONG_TYPE))
    return out


def max_repeats(x: np.ndarray) -> int:
    """How often the most repeated row of ``x`` occurs."""
    return int(np.unique(x, axis=0, return_counts=True)[1].max()) if x.shape[0] else 0


def config_ok(config: dict) -> bool:
    try:
        vindex.IndexConfig.from_kwargs(config)
        return True
    except errors.InvalidConfigError:
        return False


VALID_DIM = st.integers(1, 40)
VALID_METRIC = st.sampled_from(["l2", "ip", "cosine"])
ANY_DIM = st.one_of(VALID_DIM, st.integers(-3, 70_000), st.sampled_from([0, 65536, 65537, 2**63, -2**70]),
                    st.just(np.int32(5)), st.floats(1, 10), st.text(max_size=2), st.none(), st.booleans())
ANY_METRIC = st.one_of(VALID_METRIC, st.text(max_size=6), st.none(), st.integers(), st.just("L2"))


@fuzz_settings(25)
@given(how=st.sampled_from(["create", "build"]), valid=st.booleans(), data=st.data())
def test_library_create_and_build(how, valid, data):
    """Random dimensions, metrics and configs: creating or building an index either works (and
    the index then takes writes and answers searches) or raises a documented error, leaving no
    index behind. Whatever the library's own checks accept must work."""
    dim = data.draw(VALID_DIM if valid else ANY_DIM, label="dim")
    metric = data.draw(VALID_METRIC if valid else ANY_METRIC, label="metric")
    config = data.draw(config_kwargs(valid), label="config")
    if valid:
        assume(config_ok(config))  # graph_build_ef >= graph_degree
    config.pop("dim", None)  # a second dim argument is a Python TypeError, not a library one
    config.pop("metric", None)
    sane_dim = isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) and 1 <= dim <= 64
    must_work = sane_dim and metric in ("l2", "ip", "cosine") and config_ok(config)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "index")
        if how == "create":
            if not must_work:  # a valid create of a huge dim is slow for nothing
                assume(not (isinstance(dim, (int, np.integer)) and 64 < dim <= 65536))
            index, err = documented(lambda: vindex.Index.create(path, dim=dim, metric=metric, **config))
        else:
            d = int(dim) if sane_dim else data.draw(st.integers(1, 16), label="dim")
            n = data.draw(st.integers(0, 120), label="n")
            elements = finite if valid else st.one_of(finite, non_finite)
            x = data.draw(hnp.arrays(np.float64, (n, d), elements=elements), label="vectors")
            assume(max_repeats(x) <= 4)  # more identical rows than a posting holds: a known bug below
            must_work = must_work and np.isfinite(x).all() and not (metric == "cosine" and (~x.any(axis=1)).any())
            index, err = documented(lambda: vindex.Index.build(path, x, metric=metric, **config))
        note(f"error: {err!r}")
        if must_work:
            expect(err, None)
        if index is None:
            assert not os.path.exists(os.path.join(path, "vindex.json"))
            return
        with index:
            rng = np.random.default_rng(0)
            y = rng.standard_normal((30, index.dim)).astype(np.float32)
            index.upsert(np.arange(10**6, 10**6 + 30), y)
            res = index.search(y[:3], 5)
            assert res.ids.shape == (3, 5) and (res.ids[:, 0] >= 0).all()
            assert index.get([10**6])[1].all()


@fuzz_settings(40)
@given(content=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode),
                         st.dictionaries(st.sampled_from(["dim", "metric", "config", "format", "version", "x"]),
                                         st.one_of(st.integers(), st.text(max_size=5), st.none(), st.floats(),
                                                   st.dictionaries(st.text(max_size=8), st.integers(), max_size=2)),
                                         max_size=5).map(lambda d: json.dumps(d).encode())),
       where=st.sampled_from(["manifest", "file-instead-of-dir", "nothing"]))
def test_library_open_garbage(content, where):
    """Index.open on garbage: a missing path, a file, a directory whose manifest is random
    bytes or random JSON. Only documented errors (IndexNotFoundError, NotAnIndexError,
    CorruptionError, InvalidConfigError)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "index")
        if where == "manifest":
            os.makedirs(path)
            with open(os.path.join(path, "vindex.json"), "wb") as f:
                f.write(content)
        elif where == "file-instead-of-dir":
            with open(path, "wb") as f:
                f.write(content)
        try:
            vindex.Index.open(path).close()
        except (errors.InvalidInputError, errors.CorruptionError) as e:
            note(repr(e))
        else:
            raise AssertionError("opened garbage as an index")


# --- gRPC ----------------------------------------------------------------------------------------
OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
EXISTS = grpc.StatusCode.ALREADY_EXISTS
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
#: Every status a fuzzed request may get. Not UNAVAILABLE (only while starting or stopping),
#: DEADLINE_EXCEEDED (a hang, with 30 s deadlines) or DATA_LOSS (corrupt index files).
ALLOWED = {OK, INVALID, NOT_FOUND, EXISTS, EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION}
MAX_ROWS, MAX_QUERIES, MAX_K, MAX_RESULTS = 1000, 100, 256, 10_000
SERVICE = "vindex.v1.VectorIndex"
TIMEOUT = 30.0
SENTINEL, FUZZ, FUZZ_COS, COS_DIM = "sentinel", "fuzz", "fuzz-cos", 3
MODELED = {FUZZ: DIM, FUZZ_COS: COS_DIM}
SCRATCH = ["scratch-a", "scratch-b"]
BAD_NAMES = ["", "a/b", "..", ".hidden", "a b", "x" * 65, "ünï", "nul\0l", "-dash", "y" * 5000, "scratch-a\n"]
UNKNOWN = ["nope", "FUZZ", "fuzz.", "sentinel2", "0"]
UNARY = ["CreateCollection", "DropCollection", "ListCollections", "DescribeCollection", "Upsert", "Delete",
         "Get", "Search", "Stats", "Flush"]
_METHODS = pb.DESCRIPTOR.services_by_name["VectorIndex"].methods
REQUEST_TYPES = {m.name: getattr(pb, m.input_type.name) for m in _METHODS}
RESPONSE_TYPES = {m.name: getattr(pb, m.output_type.name) for m in _METHODS}


def f32(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x, dtype="<f4").tobytes()


def sent_values(req, field: str) -> bytes:
    """The float32 bytes a request carries in ``field`` or in its ``float_`` twin."""
    return getattr(req, field) or f32(np.array(getattr(req, f"float_{field}"), np.float32))


class World:
    """The served collections and their models, checked after every example."""

    def __init__(self, server: ServerProcess):
        self.server = server
        self.channel = grpc.insecure_channel(server.target, options=[("grpc.max_send_message_length", -1),
                                                                    ("grpc.max_receive_message_length", -1)])
        self.stub = pb_grpc.VectorIndexStub(self.channel)
        self.models: dict[str, dict[int, bytes]] = {FUZZ: {}, FUZZ_COS: {}}
        self.scratch: dict[str, tuple[int, str]] = {}   # other existing collections: (dim, metric)
        rng = np.random.default_rng(1)
        for name, dim, metric in [(SENTINEL, DIM, "l2"), (FUZZ, DIM, "l2"), (FUZZ_COS, COS_DIM, "cosine")]:
            self.stub.CreateCollection(pb.CreateCollectionRequest(name=name, dim=dim, metric=metric,
                                                                  config_json=json.dumps(CONFIG)), timeout=TIMEOUT)
        self.sentinel = rng.standard_normal((500, DIM)).astype(np.float32)
        self.stub.Upsert(pb.UpsertRequest(collection=SENTINEL, ids=list(range(500)), vectors=f32(self.sentinel),
                                          dim=DIM), timeout=TIMEOUT)
        for name, dim in MODELED.items():
            # the anchors keep the collection non-empty whatever the fuzz deletes
            ids = np.concatenate([np.arange(0, ID_MAX, 3), SENTINEL_IDS])
            x = rng.standard_normal((ids.size, dim)).astype(np.float32)
            self.stub.Upsert(pb.UpsertRequest(collection=name, ids=ids.tolist(), vectors=f32(x), dim=dim),
                             timeout=TIMEOUT)
            self.stored(name, ids, x)

    def stored(self, name: str, ids, x: np.ndarray) -> None:
        if name == FUZZ_COS:
            x = validation.unit_rows(x, what="vectors")
        for i, row in zip(list(ids), x):
            self.models[name][int(i)] = np.ascontiguousarray(row, "<f4").tobytes()

    def apply(self, method: str, request, response, stream_name: str = "") -> None:
        """Record an acknowledged write to a modeled collection."""
        if method in ("Upsert", "UpsertStream"):
            name = request.collection or stream_name
            if name in self.models:
                dim = MODELED[name]
                self.stored(name, request.ids, np.frombuffer(sent_values(request, "vectors"), "<f4").reshape(-1, dim))
        elif method == "Delete" and request.collection in self.models:
            model = self.models[request.collection]
            assert response.deleted == sum(int(i) in model for i in set(request.ids))
            for i in request.ids:
                model.pop(int(i), None)
        elif method == "CreateCollection" and request.name not in PROTECTED and request.name not in self.scratch:
            self.scratch[request.name] = (request.dim, request.metric or "l2")
        elif method == "DropCollection":
            assert response.dropped == (request.name in self.scratch), request.name
            self.scratch.pop(request.name, None)

    def check(self) -> None:
        assert self.server.proc.poll() is None, "the server died"
        res = self.stub.Get(pb.GetRequest(collection=SENTINEL, ids=list(range(500))), timeout=TIMEOUT)
        assert all(res.found) and res.vectors == f32(self.sentinel), "sentinel changed"
        assert self.stub.DescribeCollection(pb.DescribeCollectionRequest(name=SENTINEL), timeout=TIMEOUT).count == 500
        for name, model in self.models.items():
            ids = sorted(model)
            res = self.stub.Get(pb.GetRequest(collection=name, ids=ids), timeout=TIMEOUT)
            assert all(res.found), name
            assert res.vectors == b"".join(model[i] for i in ids), name
            assert self.stub.DescribeCollection(pb.DescribeCollectionRequest(name=name),
                                                timeout=TIMEOUT).count == len(model), name


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("fuzzed") / "data", "--max-rows", str(MAX_ROWS),
                        "--max-queries", str(MAX_QUERIES), "--max-k", str(MAX_K), "--max-results", str(MAX_RESULTS))
    try:
        yield srv
    finally:
        stopped_cleanly(srv)  # exit 0, no traceback, no "internal error" in its log


@pytest.fixture(scope="module")
def world(server):
    w = World(server)
    yield w
    w.channel.close()


def outcome(call, request, timeout: float = TIMEOUT):
    """``(code, response, error)`` of one call."""
    try:
        return OK, call(request, timeout=timeout), None
    except grpc.RpcError as e:
        return e.code(), None, e


def check_status(code, err, allowed) -> None:
    details = "" if err is None else err.details() or ""
    if currently_in_test_context():
        note(f"-> {code.name}: {details[:300]}")
        event(code.name)  # pytest --hypothesis-show-statistics: the outcomes reached
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED, "a fuzzed call hung for 30 s"
    assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), f"{code.name}: {details}"
    assert code in allowed, f"{code.name} not in {sorted(c.name for c in allowed)}: {details}"
    if code in (INVALID, NOT_FOUND, EXISTS):  # a library error: the client can re-raise it
        md = dict(err.trailing_metadata() or ())
        assert md.get(ERROR_KEY) in _KNOWN, md
        assert len(details) <= 1024


def bounded(x: np.ndarray) -> np.ndarray:
    """Random float32 bit patterns, with finite values past ``BOUND`` pulled back inside."""
    x = x.copy()
    big = np.isfinite(x) & (np.abs(x) > BOUND)
    x[big] = np.float32(BOUND) * np.sign(x[big])
    return x


vector_values = st.one_of(finite, finite, st.sampled_from([0.0, -0.0, 1e-45, -1e-38, BOUND]))


@st.composite
def vector_bytes(draw, n: int, dim: int):
    """``n`` whole rows of bounded finite values: seeded normals of any scale, values from a
    drawn pool of interesting floats, or random bit patterns (bounded, non-finite ones zeroed).
    What is drawn does not depend on ``n`` or ``dim``, which may come from the server's state:
    hypothesis replays an example by its draws."""
    seed = draw(st.integers(0, 2**32 - 1))
    pool = np.array(draw(st.lists(vector_values, min_size=8, max_size=8)), dtype=np.float32)
    how = draw(st.sampled_from(["normal", "normal", "pool", "mixed", "bits"]))
    if dim == 0 or n == 0:
        return b""
    rng = np.random.default_rng(seed)
    if how == "bits":
        x = bounded(rng.integers(0, 2**32, size=(n, dim), dtype=np.uint32).view("<f4"))
        x[~np.isfinite(x)] = 0.0
    elif how == "pool":
        x = rng.choice(pool, size=(n, dim))
    else:
        x = (rng.standard_normal((n, dim)) * 10.0 ** rng.uniform(-6, 6)).astype(np.float32)
        if how == "mixed":
            mask = rng.random((n, dim)) < 0.3
            x[mask] = rng.choice(pool, size=int(mask.sum()))
    return f32(x)


def index_into(draw, size: int) -> int:
    """A position below ``size`` (state-dependent) from a draw that is not."""
    return draw(st.integers(0, 2**20)) % size


def ids_for(draw, name: str) -> list[int]:
    return draw(st.lists(st.integers(0, ID_MAX) if name in MODELED else valid_id, max_size=20, unique=True))


@st.composite
def grpc_case(draw, world: World, methods: list[str] | None = None):
    """``(method, request, allowed codes)``: valid, single-defect or wild requests of every RPC,
    their vectors sent in any of the ways the protocol has (see :func:`vector_encoding`)."""
    method, req, allowed = draw(structured_case(world, methods))
    if method in ("Upsert", "Search"):
        allowed = vector_encoding(draw, req, "vectors" if method == "Upsert" else "queries", allowed)
    return method, req, allowed


def vector_encoding(draw, req, field: str, allowed: set) -> set:
    """Send ``req``'s vector bytes as they are, as its ``repeated float`` twin (same outcome),
    as float64 bytes or in both fields (refused); give a search its ``nq``, right (same
    outcome) or wrong (refused). Returns the codes allowed then."""
    buf, dim = getattr(req, field), req.dim
    how = draw(st.sampled_from(["bytes", "bytes", "floats", "both", "float64"]))
    nq = draw(st.sampled_from(["unset", "right", "wrong"])) if field == "queries" else "unset"
    refused = allowed if allowed == ALLOWED else {INVALID, EXHAUSTED}  # a row limit may come first
    if len(buf) % 4 or len(buf) > 1 << 16:
        return allowed
    rows = len(buf) // (4 * dim) if dim and len(buf) % (4 * dim) == 0 else None
    if how == "floats":
        getattr(req, f"float_{field}").extend(np.frombuffer(buf, "<f4").tolist())
        req.ClearField(field)
    elif how == "both" and buf:
        getattr(req, f"float_{field}").extend(np.frombuffer(buf, "<f4")[:dim or 1].tolist())
        return refused
    elif how == "float64" and rows and (field == "vectors" or nq != "unset"):
        setattr(req, field, np.frombuffer(buf, "<f4").astype("<f8").tobytes())
        if field == "queries":
            req.nq = rows
        return refused if field == "queries" or len(req.ids) == rows else allowed
    if rows and nq != "unset":
        req.nq = rows if nq == "right" else rows + 1
        return allowed if nq == "right" else refused
    return allowed


@st.composite
def structured_case(draw, world: World, methods: list[str] | None = None):
    """``(method, request, allowed codes)`` with vectors as bytes."""
    method = draw(st.sampled_from(methods or UNARY + ["Upsert", "Search", "Get", "Delete"]))
    kind = draw(st.sampled_from(["valid", "valid", "defect", "wild"]))
    read_names = [SENTINEL, FUZZ, FUZZ_COS]
    if method == "ListCollections":
        return method, pb.ListCollectionsRequest(), {OK}
    if method in ("DescribeCollection", "Stats", "Flush"):
        name = draw(st.sampled_from(read_names + SCRATCH + [draw(st.sampled_from(UNKNOWN + BAD_NAMES))]))
        field = "name" if method == "DescribeCollection" else "collection"
        req = REQUEST_TYPES[method](**{field: name})
        if method == "Flush":
            req.wait_idle = draw(st.booleans())
        known = name in read_names or name in world.scratch
        return method, req, {OK} if known else {INVALID} if name in BAD_NAMES else {NOT_FOUND}
    if method == "DropCollection":
        name = draw(st.sampled_from(SCRATCH + UNKNOWN + BAD_NAMES))
        return method, pb.DropCollectionRequest(name=name), {INVALID} if name in BAD_NAMES else {OK}
    if method == "CreateCollection":
        return create_case(draw, world, kind)
    # data RPCs: a modeled collection (exact expectations), scratch, unknown or bad names
    name = draw(st.sampled_from([FUZZ] * 6 + [FUZZ_COS] * 3 + SCRATCH + ["unknown", "bad"]
                                + ([SENTINEL] if method in ("Get", "Search") else [])))
    if name in ("unknown", "bad"):
        name = draw(st.sampled_from(UNKNOWN if name == "unknown" else BAD_NAMES))
    dim = MODELED.get(name, DIM if name == SENTINEL else None)
    exact = dim is not None
    # every draw below is made whatever the server's state, which only picks among the values:
    # hypothesis replays a failing example by its draws
    fallback_dim = draw(st.integers(1, 16))
    if dim is None:
        known = world.scratch.get(name)
        dim = known[0] if known and 1 <= known[0] <= 64 else fallback_dim
    missing = name not in MODELED and name != SENTINEL and name not in world.scratch
    ok = ({INVALID} if name in BAD_NAMES else {NOT_FOUND}) if missing else {OK} if exact else ALLOWED
    ids = ids_for(draw, name)
    if method in ("Get", "Delete"):
        req = REQUEST_TYPES[method](collection=name, ids=ids)
        if kind == "defect":
            bad = draw(st.sampled_from(["2^63", "dup", "rows"]))
            if bad == "2^63":
                req.ids.insert(draw(st.integers(0, len(ids))), draw(st.integers(2**63, 2**64 - 1)))
            elif bad == "dup":
                req.ids.extend([ids[0] if ids else 5] * (1 if ids else 2))
                return method, req, {INVALID, NOT_FOUND} if missing else {INVALID}
            else:
                req.ids.extend(range(10**7, 10**7 + MAX_ROWS + 1 - len(ids)))
                return method, req, {EXHAUSTED}
            return method, req, {INVALID}
        if kind == "wild":
            req.ids.extend(draw(st.lists(st.integers(0, 2**64 - 1), max_size=5)))
            return method, req, ALLOWED
        return method, req, ok
    if method == "Upsert":
        n = len(ids)
        req = pb.UpsertRequest(collection=name, ids=ids, vectors=draw(vector_bytes(n, dim)), dim=dim,
                               add_only=draw(st.booleans()))
        if kind == "valid":
            if name == FUZZ_COS and n and not all(np.frombuffer(req.vectors, "<f4").reshape(n, dim).any(axis=1)):
                return method, req, {INVALID}  # an all-zero row (checked before stored ids)
            if req.add_only and name in MODELED and any(i in world.models[name] for i in ids):
                return method, req, {EXISTS}
            return method, req, ok
        if kind == "wild":
            req.dim = draw(st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 20)))
            req.vectors = draw(st.one_of(st.binary(max_size=200), vector_bytes(draw(st.integers(0, 8)), req.dim % 20)))
            req.ids.extend(draw(st.lists(st.integers(0, 2**64 - 1), max_size=4)))
            return method, req, ALLOWED
        bad = draw(st.sampled_from(["dim", "dim0", "dim-huge", "partial", "nonfinite", "length", "dup", "2^63", "rows",
                                    "add-existing"]))
        invalid = {INVALID}
        if bad == "dim":
            other = draw(st.integers(1, 39).map(lambda d: d + (d >= dim)))
            req.dim, req.vectors = other, draw(vector_bytes(n, other))
            invalid = {INVALID, NOT_FOUND} if missing else {INVALID}
        elif bad == "dim0":
            req.dim = 0
        elif bad == "dim-huge":
            req.dim, req.vectors = draw(st.integers(2**20, 2**32 - 1)), b""
            invalid = {INVALID, NOT_FOUND} if missing else {INVALID}
        elif bad == "partial":
            req.vectors += draw(st.binary(min_size=4 * 64, max_size=4 * 64))[:1 + index_into(draw, 4 * dim - 1)]
        elif bad == "nonfinite":
            x = np.frombuffer(req.vectors, "<f4").copy() if n else np.zeros(dim, np.float32)
            if not n:
                req.ids.append(7)
            x[index_into(draw, x.size)] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
            req.vectors = f32(x)
            invalid = {INVALID, NOT_FOUND} if missing else {INVALID}
        elif bad == "length":
            m = draw(st.integers(0, 5).filter(lambda m: m != n))
            req.vectors = draw(vector_bytes(m, dim))
            invalid = {INVALID, NOT_FOUND} if missing else {INVALID}
        elif bad == "dup":
            if not ids:
                req.ids.append(3)
            req.ids.append(req.ids[0])
            req.vectors = draw(vector_bytes(len(req.ids), dim))
            invalid = {INVALID, NOT_FOUND} if missing else {INVALID}
        elif bad == "2^63":
            req.ids.append(draw(st.integers(2**63, 2**64 - 1)))
            req.vectors = draw(vector_bytes(len(req.ids), dim))
        elif bad == "rows":
            over = MAX_ROWS + 1
            if draw(st.booleans()):
                req.ids[:] = list(range(over))
            else:
                req.vectors = bytes(4 * dim * over)
            invalid = {EXHAUSTED}
        else:  # add_only of stored ids
            pick = draw(st.integers(0, 2**20))
            more = draw(vector_bytes(n + 1, dim))
            if name not in MODELED:
                return method, req, ALLOWED
            live = sorted(world.models[name])
            req.ids[:] = sorted(set(ids) | {live[pick % len(live)]})
            req.vectors, req.add_only = more[:4 * dim * len(req.ids)], True
            if name == FUZZ_COS:
                return method, req, {EXISTS, INVALID}  # a zero row is refused first
            invalid = {EXISTS}
        return method, req, invalid
    # Search
    nq = draw(st.integers(0, 4))
    req = pb.SearchRequest(collection=name, queries=draw(vector_bytes(nq, dim)), dim=dim,
                           k=draw(st.one_of(st.integers(1, 12), st.just(MAX_K))))
    if draw(st.booleans()):
        req.max_postings = draw(st.integers(1, 4096))
    if draw(st.booleans()):
        req.ef = draw(st.integers(1, 65536))
    if draw(st.booleans()):
        req.eps = draw(st.one_of(st.floats(0, 1e6, width=32), st.just(float("inf"))))
    if kind == "valid":
        if name == FUZZ_COS and nq and not all(np.frombuffer(req.queries, "<f4").reshape(nq, dim).any(axis=1)):
            return method, req, {INVALID}
        return method, req, ok
    if kind == "wild":
        req.dim = draw(st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 20)))
        req.queries = draw(st.one_of(st.binary(max_size=200), vector_bytes(draw(st.integers(0, 4)), req.dim % 20)))
        req.k = draw(st.integers(0, 2**32 - 1))
        req.max_postings = draw(st.integers(0, 2**32 - 1))
        req.ef = draw(st.integers(0, 2**32 - 1))
        req.eps = draw(st.floats(width=32))
        return method, req, ALLOWED
    bad = draw(st.sampled_from(["k0", "k-big", "dim", "partial", "nonfinite", "max_postings", "ef", "eps",
                                "queries", "results"]))
    if bad == "k0":
        req.k = 0
    elif bad == "k-big":
        req.k = draw(st.integers(MAX_K + 1, 2**32 - 1))
    elif bad == "dim":
        other = draw(st.integers(1, 39).map(lambda d: d + (d >= dim)))
        req.dim, req.queries = other, draw(vector_bytes(nq, other))
        return method, req, {INVALID, NOT_FOUND} if missing else {INVALID}
    elif bad == "partial":
        req.queries += draw(st.binary(min_size=4 * 64, max_size=4 * 64))[:1 + index_into(draw, 4 * dim - 1)]
    elif bad == "nonfinite":
        x = np.frombuffer(req.queries, "<f4").copy() if nq else np.zeros(dim, np.float32)
        x[index_into(draw, x.size)] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        req.queries = f32(x)
        return method, req, {INVALID, NOT_FOUND} if missing else {INVALID}
    elif bad == "max_postings":
        req.max_postings = draw(st.integers(4097, 2**32 - 1))
        return method, req, {INVALID, NOT_FOUND} if missing else {INVALID}
    elif bad == "ef":
        req.ef = draw(st.integers(65537, 2**32 - 1))
        return method, req, {INVALID, NOT_FOUND} if missing else {INVALID}
    elif bad == "eps":
        req.eps = draw(st.sampled_from([-1e-6, -1.0, float("nan"), float("-inf")]))
        return method, req, {INVALID, NOT_FOUND} if missing else {INVALID}
    elif bad == "queries":
        req.queries = bytes(4 * dim * (MAX_QUERIES + 1))
        return method, req, {EXHAUSTED}
    else:
        req.k = MAX_K
        req.queries = bytes(4 * dim * (MAX_RESULTS // MAX_K + 1))
        return method, req, {EXHAUSTED}
    return method, req, {INVALID}


def create_case(draw, world: World, kind: str):
    name = draw(st.sampled_from(SCRATCH + [SENTINEL, FUZZ] + BAD_NAMES))
    dim = draw(st.one_of(st.integers(1, 64), st.sampled_from([0, 65537, 2**32 - 1])))
    metric = draw(st.one_of(st.sampled_from(["", "l2", "ip", "cosine"]), st.text(max_size=5)))
    config = draw(config_kwargs(draw(st.booleans())))
    text = json.dumps(config)
    if kind == "defect":
        text = draw(st.sampled_from(["{", "[1]", "null", "1", '"x"', "[" * 5000, '{"seed": ' + "9" * 5000 + "}",
                                     '{"cache_bytes": 18446744073709551616}', '{"dim": 4}', '{"store": "memory"}']))
    elif kind == "wild":
        text = draw(st.one_of(st.text(max_size=30), st.just(text)))
    req = pb.CreateCollectionRequest(name=name, dim=dim, metric=metric, config_json=text,
                                     if_not_exists=draw(st.booleans()))
    # predicted outcome, in the server's order of checks
    try:
        cfg = json.loads(text) if text else {}
        cfg_json_ok = isinstance(cfg, dict) and not set(cfg) & {"dim", "metric"} \
            and all(not isinstance(v, int) or -2**63 <= v < 2**63 for v in cfg.values())
    except (ValueError, RecursionError):
        cfg_json_ok = False
    if not cfg_json_ok or not NAME_RE.fullmatch(name) or (cfg.get("store", "rocksdb") != "rocksdb"):
        return "CreateCollection", req, {INVALID}
    existing = {SENTINEL: (DIM, "l2"), FUZZ: (DIM, "l2"), **world.scratch}.get(name)
    if existing is not None:
        same = req.if_not_exists and existing == (dim, metric or "l2")
        return "CreateCollection", req, {OK} if same else {EXISTS}
    valid = 1 <= dim <= 65536 and (metric or "l2") in ("l2", "ip", "cosine") and config_ok(cfg)
    return "CreateCollection", req, {OK} if valid else {INVALID}


def check_response(world: World, method: str, req, res) -> None:
    """Responses to valid reads of a modeled collection match the model."""
    name = getattr(req, "collection", "")
    if method == "Get" and name in world.models:
        model, dim = world.models[name], MODELED[name]
        assert res.dim == dim and list(res.found) == [int(i) in model for i in req.ids]
        want = b"".join(model.get(int(i), bytes(4 * dim)) for i in req.ids)
        assert res.vectors == want
    elif method == "Search":
        nq = len(sent_values(req, "queries")) // (4 * req.dim)
        assert (res.nq, res.k, len(res.ids), len(res.distances)) == (nq, req.k, nq * req.k, nq * req.k)
        if name in world.models:
            ids = np.array(res.ids, dtype=np.int64)
            assert np.isin(ids[ids >= 0], np.array(sorted(world.models[name]))).all()


@fuzz_settings(120)
@given(data=st.data())
def test_grpc_structured(world, data):
    method, req, allowed = data.draw(grpc_case(world), label="case")
    assume(not hits_known_bug(method, req))
    note(f"{method} {str(req)[:400]!r}")
    code, res, err = outcome(getattr(world.stub, method), req)
    check_status(code, err, allowed)
    if code == OK:
        world.apply(method, req, res)
        check_response(world, method, req, res)
    world.check()


def mutate(draw, raw: bytes) -> bytes:
    how = draw(st.sampled_from(["flip", "truncate", "append", "splice", "bad-utf8"]))
    buf = bytearray(raw)
    if how == "flip" and buf:
        for _ in range(draw(st.integers(1, 4))):
            buf[draw(st.integers(0, len(buf) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif how == "truncate" and buf:
        del buf[draw(st.integers(0, len(buf) - 1)):]
    elif how == "append":
        buf += draw(st.binary(min_size=1, max_size=16))
    elif how == "splice" and buf:
        at = draw(st.integers(0, len(buf)))
        buf[at:at] = draw(st.binary(min_size=1, max_size=8))
    else:  # field 1 (the collection name: a string) holding invalid UTF-8
        buf = bytearray(b"\x0a\x03\xff\xfe\xfd") + buf
    return bytes(buf)


PROTECTED = {SENTINEL, FUZZ, FUZZ_COS}


def parse(method: str, raw: bytes):
    try:
        return REQUEST_TYPES[method].FromString(raw)
    except Exception:
        return None


def hits_known_bug(method: str, req) -> bool:
    """An upsert of finite values past ``BOUND`` into a collection that may be empty."""
    if method not in ("Upsert", "UpsertStream") or req is None or req.collection in MODELED or not req.dim:
        return False
    values = sent_values(req, "vectors")
    if len(values) % (4 * req.dim):
        return False
    x = np.frombuffer(values, "<f4")
    return bool((np.abs(x[np.isfinite(x)]) > BOUND).any())


def harmless(method: str, req) -> bool:
    """What raw bytes parse to must not drop or write the protected collections behind the
    model's back (modeled writes are applied when acknowledged)."""
    if req is None:
        return True
    if method == "DropCollection":
        return req.name not in PROTECTED
    if method in ("Upsert", "UpsertStream", "Delete"):
        return req.collection != SENTINEL
    return True


@fuzz_settings(120)
@given(data=st.data())
def test_grpc_raw_bytes(world, data):
    """Random bytes and mutated serialisations as requests, through a raw channel."""
    method = data.draw(st.sampled_from(UNARY), label="method")
    if data.draw(st.booleans(), label="random"):
        raw = data.draw(st.binary(max_size=300), label="raw")
    else:
        _, req, _ = data.draw(grpc_case(world), label="base")
        raw = mutate(data.draw, req.SerializeToString())
        method = data.draw(st.sampled_from([method, type(req).__name__.replace("Request", "")]), label="as")
        method = method if method in UNARY else "Upsert"
    parsed = parse(method, raw)
    assume(harmless(method, parsed) and not hits_known_bug(method, parsed))
    note(f"{method} {raw[:200]!r} parsed={parsed is not None}")
    call = world.channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=None, response_deserializer=None)
    code, res, err = outcome(call, raw)
    check_status(code, err, ALLOWED)
    if parsed is None:
        assert code == INVALID, "undecodable bytes must be INVALID_ARGUMENT"
        assert "not a valid" in err.details()
    if code == OK and parsed is not None:
        world.apply(method, parsed, RESPONSE_TYPES[method].FromString(res))
    world.check()


@fuzz_settings(60)
@given(data=st.data())
def test_grpc_upsert_stream(world, data):
    """Streams mixing valid chunks, bad chunks and garbage bytes: the chunks before the first
    bad one are acknowledged (and stored), then a documented status ends the stream."""
    name = data.draw(st.sampled_from([FUZZ, FUZZ_COS, "nope", ""]), label="first collection")
    chunks = []
    for i in range(data.draw(st.integers(1, 5), label="chunks")):
        kind = data.draw(st.sampled_from(["valid", "valid", "valid", "garbage", "case"]), label=f"chunk {i}")
        target = name if i == 0 else data.draw(st.sampled_from(["", name]), label=f"name {i}")
        dim = MODELED.get(name, DIM)
        if kind == "garbage":
            chunks.append(data.draw(st.one_of(st.binary(max_size=64), st.just(b"\x0a\x02\xc3\x28")), label="raw"))
        elif kind == "case":
            _, req, _ = data.draw(grpc_case(world, ["Upsert"]), label="req")
            if req.collection == SENTINEL:
                req.collection = FUZZ
            chunks.append(req.SerializeToString())
        else:
            ids = data.draw(st.lists(st.integers(0, ID_MAX), max_size=10, unique=True), label="ids")
            x = data.draw(rows(len(ids), dim).map(lambda a: a + 1.0 if name == FUZZ_COS else a), label="x")
            chunks.append(pb.UpsertRequest(collection=target, ids=ids, vectors=f32(x), dim=dim).SerializeToString())
    parsed = [parse("UpsertStream", c) for c in chunks]
    assume(not any(hits_known_bug("UpsertStream", p) or not harmless("UpsertStream", p) for p in parsed))
    call = world.channel.stream_stream(f"/{SERVICE}/UpsertStream", request_serializer=None,
                                       response_deserializer=pb.UpsertAck.FromString)
    acks, code, err = [], OK, None
    try:
        for ack in call(iter(chunks), timeout=TIMEOUT):
            acks.append(ack)
    except grpc.RpcError as e:
        code, err = e.code(), e
    check_status(code, err, ALLOWED)
    assert [a.chunk for a in acks] == list(range(len(acks)))
    assert len(acks) == len(chunks) if code == OK else len(acks) < len(chunks)
    stream_name, total = "", 0
    for ack, req in zip(acks, parsed):
        assert req is not None and ack.upserted == len(req.ids)
        total += ack.upserted
        assert ack.total == total
        stream_name = req.collection or stream_name
        world.apply("UpsertStream", req, ack, stream_name)
    if code != OK and parsed[len(acks)] is None:
        assert code == INVALID
    world.check()


@pytest.mark.parametrize("method", ["Upsert", "Search", "CreateCollection", "UpsertStream"])
def test_grpc_oversized_garbage(world, method):
    """A garbage message over 64 MiB is refused before any parsing."""
    raw = os.urandom(64 * 2**20 + 17)
    if method == "UpsertStream":
        call = world.channel.stream_stream(f"/{SERVICE}/{method}", request_serializer=None,
                                           response_deserializer=None)
        code, _, err = outcome(lambda r, timeout: list(call(iter([r]), timeout=timeout)), raw)
    else:
        call = world.channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=None, response_deserializer=None)
        code, _, err = outcome(call, raw)
    check_status(code, err, {EXHAUSTED})
    world.check()


@fuzz_settings(40)
@given(data=st.data())
def test_client_wild_inputs(world, data):
    """The Python client with wild arguments raises the library's documented errors."""
    with vindex.Client(world.server.target, timeout=TIMEOUT) as client:
        col = client.collection(FUZZ)
        op = data.draw(st.sampled_from(["search", "upsert", "add", "delete", "get", "upsert_many"]), label="op")
        a = data.draw(st.one_of(wild.filter(wild_ids_filter), valid_ids), label="a")
        b = data.draw(st.one_of(wild, rows(len(a) if isinstance(a, list) else 1)), label="b")
        try:
            if op == "search":
                res = col.search(a, b if isinstance(b, (int, np.integer)) else 5)
            elif op in ("delete", "get"):
                res = getattr(col, op)(a)
            else:
                res = getattr(col, op)(a, b)
        except errors.VindexError as e:
            assert isinstance(e, errors.InvalidInputError), repr(e)
            event(type(e).__name__)
            world.check()
            return
        event("ok")
        if op in ("upsert", "add", "upsert_many"):
            world.stored(FUZZ, validation.ids(a), validation.vectors(b, DIM))
        elif op == "delete":
            ids = validation.ids(a).tolist()
            assert res == sum(i in world.models[FUZZ] for i in ids)
            for i in ids:
                world.models[FUZZ].pop(i, None)
        world.check()


# --- regressions the fuzzing found (fixed in validation and request checks) -----------------------
@pytest.mark.parametrize("eps,ok", [(10**400, False), (-10**400, False), (fractions.Fraction(1, 3), True)],
                         ids=["1e400", "-1e400", "fraction"])
def test_regression_eps_of_any_real_type(lib, eps, ok):
    """An int past 1e308 or a Fraction as ``eps`` raised a raw TypeError from np.isfinite."""
    _, err = documented(lambda: lib.index.search(np.zeros(DIM), 3, eps=eps))
    expect(err, None if ok else errors.InvalidKError)


def test_regression_empty_list_is_no_rows(lib):
    """``[]`` as vectors or queries is no rows (it was one row of dimension 0: DimensionError)."""
    lib.index.upsert([], [])
    lib.index.add([], [])
    res = lib.index.search([], 3)
    assert res.ids.shape == res.distances.shape == (0, 3)
    lib.check()


def test_regression_empty_list_through_the_client(world):
    with vindex.Client(world.server.target, timeout=TIMEOUT) as client:
        col = client.collection(FUZZ)
        col.upsert([], [])
        assert col.search([], 3).ids.shape == (0, 3)
    world.check()


@pytest.mark.parametrize("config_json", [
    "[" * 100_000,                                # RecursionError in json.loads: was INTERNAL
    '{"seed": ' + "9" * 5000 + "}",               # ValueError (int over 4300 digits): was INTERNAL
    '{"cache_bytes": 18446744073709551616}',      # OverflowError in the store: was INTERNAL
    '{"graph_alpha": -' + "9" * 400 + "}",
], ids=["deep", "digits", "2^64", "big-negative"])
def test_regression_create_with_bad_config_json(world, config_json):
    code, _, err = outcome(world.stub.CreateCollection,
                           pb.CreateCollectionRequest(name="scratch-z", dim=4, config_json=config_json))
    check_status(code, err, {INVALID})
    assert dict(err.trailing_metadata())[ERROR_KEY] == "InvalidConfigError"
    code, _, _ = outcome(world.stub.DescribeCollection, pb.DescribeCollectionRequest(name="scratch-z"))
    assert code == NOT_FOUND


@pytest.mark.parametrize("name", ["scratch-a\n", "fuzz\n"])
def test_regression_name_with_trailing_newline(world, name):
    """``$`` in the name pattern matched before a trailing newline: "x\n" was a valid name."""
    code, _, err = outcome(world.stub.CreateCollection, pb.CreateCollectionRequest(name=name, dim=4))
    check_status(code, err, {INVALID})
    code, _, _ = outcome(world.stub.DescribeCollection, pb.DescribeCollectionRequest(name=name))
    assert code == INVALID


@pytest.mark.parametrize("payload", [b"\xff\xff\xff", b"\x0a\x02\xc3\x28"], ids=["bad-tag", "bad-utf8"])
@pytest.mark.parametrize("method", UNARY + ["UpsertStream"])
def test_regression_undecodable_request(world, method, payload):
    """Bytes that do not parse as the request type were UNKNOWN ("Unexpected DecodeError");
    now INVALID_ARGUMENT naming the type, with the library class in the trailers. In a stream
    the chunks before the bad one are acknowledged."""
    request_type = REQUEST_TYPES[method]
    if parse(method, payload) is not None:
        assert method == "ListCollections" and payload[0] == 0x0A  # no string field to break
        return
    if method == "UpsertStream":
        good = pb.UpsertRequest(collection=FUZZ, ids=[5], vectors=f32(np.ones((1, DIM))), dim=DIM)
        call = world.channel.stream_stream(f"/{SERVICE}/{method}", request_serializer=None,
                                           response_deserializer=pb.UpsertAck.FromString)
        acks = []
        with pytest.raises(grpc.RpcError) as ei:
            for ack in call(iter([good.SerializeToString(), payload]), timeout=TIMEOUT):
                acks.append(ack)
        code, err = ei.value.code(), ei.value
        assert [(a.chunk, a.upserted) for a in acks] == [(0, 1)]
        world.apply("UpsertStream", good, acks[0])
    else:
        call = world.channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=None,
                                         response_deserializer=None)
        code, _, err = outcome(call, payload)
    check_status(code, err, {INVALID})
    assert f"not a valid {request_type.DESCRIPTOR.full_name} message" in err.details()
    assert dict(err.trailing_metadata())[ERROR_KEY] == "InvalidInputError"
    world.check()


def test_grpc_healthy_after_fuzzing(world):
    """Runs after the fuzz tests above (file order): still SERVING, data intact, no internal
    errors logged (the fixture then checks the server stops cleanly)."""
    assert health(world.channel) == health(world.channel, SERVICE) == health_pb2.HealthCheckResponse.SERVING
    world.check()
    log = world.server.log()
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]


# --- bugs the fuzzing found below the validation layer: regression tests ----------------------
@pytest.mark.parametrize("how", ["first-upsert", "build", "later-upsert", "query"])
def test_vectors_whose_squared_norms_overflow_are_refused(tmp_path, how):
    """Finite vectors with |x|^2 past float32's range used to raise a raw ValueError in a build,
    or be acknowledged yet missing from their home postings (get: DATA_LOSS)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((20, 16)) * 1e19).astype(np.float32)
    assert np.isfinite(x).all()
    with pytest.raises(errors.NonFiniteError, match="squared norms"):
        if how == "build":
            vindex.Index.build(tmp_path / "i", x)
        else:
            with vindex.Index.create(tmp_path / "i", dim=16, posting_limit_bytes=2048) as idx:
                if how != "first-upsert":
                    idx.upsert(np.arange(400), rng.standard_normal((400, 16)))
                try:
                    if how == "query":
                        idx.search(x[:2], 3)
                    else:
                        idx.upsert(np.arange(1000, 1020), x)
                finally:
                    assert len(idx) == (0 if how == "first-upsert" else 400)  # nothing written
    with vindex.Index.create(tmp_path / "cos", dim=16, metric="cosine") as idx:
        idx.upsert(np.arange(20), x)  # cosine normalises: any magnitude is fine
        assert idx.get(np.arange(20))[1].all()


@pytest.mark.parametrize("how", ["first-upsert", "build"])
def test_many_identical_vectors_build_and_stay_reachable(tmp_path, how):
    """More identical vectors than a posting holds used to recurse without end in
    clustering._leaves (RecursionError)."""
    x = np.ones((100, 8), np.float32)  # 25 fit in a posting of 1024 bytes
    if how == "build":
        idx = vindex.Index.build(tmp_path / "i", x, posting_limit_bytes=1024)
    else:
        idx = vindex.Index.create(tmp_path / "i", dim=8, posting_limit_bytes=1024)
        idx.upsert(np.arange(100), x)
    with idx:
        assert idx.wait_idle(120)
        assert len(idx) == 100 and idx.get(np.arange(100))[1].all()
        report = idx.verify()
        assert report.ok, str(report)
        assert idx.search(x[:1], 5, max_postings=4096).ids.min() >= 0


@pytest.mark.parametrize("config", [
    dict(seed=2**31), dict(kmeans_max_points_per_centroid=2**31), dict(build_threads=2**31),
    dict(graph_alpha=1e300), dict(cache_bytes=2**64), dict(graph_build_ef=2**62),
], ids=lambda c: next(iter(c)))
def test_config_values_past_what_faiss_or_the_graph_take_are_refused(tmp_path, config):
    x = np.random.default_rng(0).standard_normal((100, 8)).astype(np.float32)
    with pytest.raises(errors.InvalidConfigError, match=next(iter(config))):
        vindex.Index.build(tmp_path / "i", x, posting_limit_bytes=1024, **config)
    assert not os.path.exists(tmp_path / "i" / "vindex.json")


@pytest.mark.slow
def test_fuzz_long():
    """Every fuzz test above with 20x the examples (about 10 minutes on 2 cores)."""
    env = dict(os.environ, VINDEX_FUZZ_SCALE="20")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                          os.path.abspath(__file__)], cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         env=env, capture_output=True, text=True, timeout=3600)
    print(res.stdout, res.stderr)  # shown in full when this fails
    assert res.returncode == 0, res.stdout[-3000:]
