"""The columnar write path of metadata: batches of flat rows checked, encoded and indexed a
column at a time give exactly what the row-by-row path gives (bytes, errors, payload index),
live and after replay."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vindex
from vindex import payloads
from vindex.errors import InvalidInputError
from vindex.filters import PayloadIndex, check_metadata, compile_filter, matches
from vindex.filters.flat import flat_groups
from vindex.filters.metadata import encode_batch

KEYS = ["a", "b", "%s", "é", "$x", ""]
plain = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([2 ** 63 - 1, -(2 ** 63), 2 ** 63, 10 ** 30]),
    st.sampled_from([0.0, -0.0, 2.5, 1e300, 1e16, 1.5e-7, float("nan"), float("inf")]),
    st.sampled_from(["", "a", "B", 'q"\\\n', "é", "\ud800", "%d", "x" * 40]),
)


@st.composite
def flat_rows(draw, keys: list[str], values: st.SearchStrategy) -> list:
    """Rows of at most four key orders (a batch the columnar path takes), some None."""
    orders = draw(st.lists(st.lists(st.sampled_from(keys), max_size=4, unique=True), min_size=1, max_size=4))
    count = draw(st.integers(1, 40))
    return [None if (i := draw(st.integers(-1, len(orders) - 1))) < 0 else
            {key: draw(values) for key in orders[i]} for _ in range(count)]


# some invalid keys, some values the checks refuse
BAD = {2 ** 63, 10 ** 30, float("inf"), "\ud800"}
valid = plain.filter(lambda v: v == v and v not in BAD)  # (nan is never equal, to itself either)
rows_strategy = (flat_rows(KEYS, plain) | flat_rows(KEYS[:4], valid)
                 | st.lists(st.none() | st.dictionaries(st.sampled_from(KEYS), plain), max_size=9))
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _row_by_row(rows: list, max_bytes: int) -> list | str:
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(None if row is None else check_metadata(row, max_bytes))
        except InvalidInputError as exc:
            return f"{type(exc).__name__}: metadata[{i}]: {exc}"
    return out


@SETTINGS
@given(rows=rows_strategy, max_bytes=st.sampled_from([30, 1 << 16]))
def test_batch_encoding_equals_row_by_row(rows, max_bytes) -> None:
    expected = _row_by_row(rows, max_bytes)
    columnar = encode_batch(rows, max_bytes)
    assert columnar is None or columnar[0] == expected  # None: a row the row-by-row path refuses, or not flat
    try:
        got = payloads.check_metadata_rows(rows, len(rows), max_bytes)
    except InvalidInputError as exc:
        assert f"{type(exc).__name__}: {exc}" == expected
        return
    assert got.encoded == expected
    assert got.rows == rows


def test_flat_batches_take_the_columnar_path() -> None:
    rows = [{"label": i, "year": 1900 + i, "topic": f"t{i % 3}", "ok": i % 2 == 0, "score": i / 7, "none": None}
            for i in range(50)]
    rows[3] = None
    rows[7] = {"topic": "other", "label": "mixed"}  # another key order, a str among ints
    encoded, groups = encode_batch(rows, 1 << 16)
    assert encoded == [None if r is None else check_metadata(r, 1 << 16) for r in rows]
    assert sorted(len(g.positions) for g in groups) == [1, 48]
    # nested values, numpy scalars and dict subclasses are checked row by row
    for odd in ({"a": [1]}, {"a": {"b": 1}}, {"a": np.int64(1)}, type("D", (dict,), {})(a=1)):
        assert flat_groups(rows[:5] + [odd]) is None
        assert payloads.check_metadata_rows(rows[:5] + [odd], 6, 1 << 16).encoded[5] == check_metadata(odd, 1 << 16)


def test_documents_fast_path_keeps_its_errors() -> None:
    assert payloads.encode_documents(["é", None, ""], 3, 10) == ["é".encode(), None, b""]
    with pytest.raises(InvalidInputError, match=r"documents\[1\]: not valid UTF-8 text"):
        payloads.encode_documents(["a", "\ud800"], 2, 10)
    with pytest.raises(vindex.PayloadTooLargeError, match=r"documents\[2\]: 11 bytes of UTF-8, over the limit of 10"):
        payloads.encode_documents(["a", "b", "x" * 11], 3, 10)


FILTERS = [{"a": {"$gte": 0}}, {"a": {"$lt": 2.5}}, {"a": "a"}, {"a": None}, {"a": True}, {"b": {"$exists": False}},
           {"b": {"$ne": 1}}, {"%s": {"$in": ["", 0, None]}}, {"é": {"$nin": [False, "é"]}}, {"$or": [{"a": 1}, {"b": "B"}]}]
valid_plain = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.0, -0.0, 2.5, 1e16]),
                        st.sampled_from(["", "a", "B", "é"]))
valid_rows = flat_rows(KEYS[:4], valid_plain)


@SETTINGS
@given(first=valid_rows, second=valid_rows)
def test_columnar_payload_index_equals_row_by_row(first, second) -> None:
    columnar, rowwise = PayloadIndex(), PayloadIndex()
    for rows, offset in ((first, 0), (second, len(first) // 2)):
        vids = np.arange(offset, offset + len(rows))
        assert flat_groups(rows) is not None
        columnar.set(vids, rows)
        _set_row_by_row(rowwise, vids, rows)
    merged = (first + [None] * len(second))[:max(len(first), len(first) // 2 + len(second))]
    merged[len(first) // 2:len(first) // 2 + len(second)] = second
    n = len(merged) + 1
    for raw in FILTERS:
        f = compile_filter(raw)
        expected = [matches(f, merged[i] if i < len(merged) else None) for i in range(n)]
        assert columnar.mask(f, n).tolist() == expected, raw
        assert rowwise.mask(f, n).tolist() == expected, raw


def _set_row_by_row(index: PayloadIndex, vids: np.ndarray, rows: list) -> None:
    """``PayloadIndex.set`` forced onto its row-by-row planner."""
    index._apply(vids, index._plan(rows))


def test_live_and_replayed_metadata_agree(tmp_path) -> None:
    """Upserts and set_metadata hand their checked rows to the payload index; a reopen
    replays the log and decodes them: the same filters match the same ids."""
    rng = np.random.default_rng(0)
    path = tmp_path / "idx"
    n = 400
    rows = [{"label": int(rng.integers(0, 10)), "topic": ["x", "y", None, True][i % 4], "mix": [1, "1", 2.5][i % 3]}
            for i in range(n)]
    rows[5] = None
    checks = [{"label": {"$lt": 3}}, {"topic": "x"}, {"topic": True}, {"mix": 1}, {"mix": "1"},
              {"mix": {"$gt": 1}}, {"label": {"$exists": False}}, {"extra": 1}]
    with vindex.Index.create(path, dim=4, rebalance=False) as idx:
        idx.upsert(np.arange(n), rng.standard_normal((n, 4)).astype(np.float32), metadata=rows,
                   documents=[f"doc {i}" for i in range(n)])
        idx.set_metadata([1, 2], {"extra": 1})
        idx.set_metadata([3], [{"label": 99}], merge=False)
        live = [idx.count(c) for c in checks]
    rows[1], rows[2], rows[3] = {**rows[1], "extra": 1}, {**rows[2], "extra": 1}, {"label": 99}
    assert live == [sum(matches(compile_filter(c), r) for r in rows) for c in checks]
    with vindex.Index.open(path) as idx:
        assert [idx.count(c) for c in checks] == live
        assert idx.get([1, 3, 5], include=["metadata"]).metadata == [rows[1], rows[3], None]


def test_metadata_as_columns_equals_rows(tmp_path) -> None:
    """Metadata given as columns (a dict of lists / numpy arrays, a pyarrow Table; None leaves
    the key out of a row) stores and indexes what the same rows as dicts do."""
    pa = pytest.importorskip("pyarrow")
    n = 60
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    columns = {"label": np.arange(n) % 7, "score": (np.arange(n) / 4).tolist(),
               "topic": [None if i % 5 == 0 else f"t{i % 3}" for i in range(n)], "flag": [i % 2 == 0 for i in range(n)]}
    rows = [{k: v[i].item() if isinstance(v, np.ndarray) else v[i] for k, v in columns.items()
             if v[i] is not None} for i in range(n)]
    checks = [{"label": {"$lt": 3}}, {"topic": "t1"}, {"topic": {"$exists": False}}, {"flag": True, "score": {"$gte": 5}}]
    expected = [sum(matches(compile_filter(c), r) for r in rows) for c in checks]
    for name, metadata in (("dict", columns), ("table", pa.table(columns)), ("rows", rows)):
        path = tmp_path / name
        with vindex.Index.create(path, dim=4, rebalance=False) as idx:
            idx.upsert(np.arange(n), x, metadata=metadata, documents=pa.array([f"d{i}" for i in range(n)]))
            assert [idx.count(c) for c in checks] == expected, name
        with vindex.Index.open(path) as idx:
            got = idx.get(np.arange(n), include=["metadata", "documents"])
            assert got.metadata == rows and got.documents == [f"d{i}" for i in range(n)], name
            assert [idx.count(c) for c in checks] == expected, name


def test_columns_as_rows_for_sharded_writes() -> None:
    """What a ShardedIndex splits among its shards: columns as one dict per row."""
    assert payloads.metadata_rows({"a": np.array([1, 2]), "b": ["x", None]}, 2) == [{"a": 1, "b": "x"}, {"a": 2}]
    assert payloads.metadata_rows([{"a": 1}, None], 2) == [{"a": 1}, None]
    assert payloads.metadata_rows(None, 2) is None


@pytest.mark.parametrize("metadata, error, text", [
    ({"a": [1, 2]}, vindex.LengthMismatchError, "metadata['a']: expected 3 values (one per row), got 2"),
    ({"a": "abc"}, InvalidInputError, "metadata['a']: expected a column of 3 values, got str"),
    ({"a": [1, float("nan"), 3]}, InvalidInputError, "metadata[1]: metadata.a: nan is not a finite number"),
    ({"$a": [1, 2, 3]}, InvalidInputError, "metadata[0]: metadata: key '$a' starts with '$'"),
    ({"a": ["x", "y", "z" * 100]}, vindex.PayloadTooLargeError, "metadata[2]: metadata: 108 bytes as JSON"),
])
def test_bad_metadata_columns_are_named_and_change_nothing(tmp_path, metadata, error, text) -> None:
    idx = vindex.Index.create(tmp_path / "idx", dim=4, store="memory", max_metadata_bytes=100)
    idx.upsert([7], np.ones((1, 4), np.float32), metadata=[{"k": 1}])
    with pytest.raises(error) as info:
        idx.upsert([7, 8, 9], np.zeros((3, 4), np.float32), metadata=metadata)
    assert text in str(info.value)
    assert len(idx) == 1 and idx.get([7], include=["metadata"]).metadata == [{"k": 1}]


def test_sharded_index_takes_metadata_columns(ray_local, tmp_path) -> None:
    """A ShardedIndex splits columns into rows per shard: the same records as rows."""
    from vindex.cluster import ShardedIndex

    n = 40
    x = np.random.default_rng(2).standard_normal((n, 4)).astype(np.float32)
    columns = {"colour": [["red", "blue"][i % 2] for i in range(n)], "n": np.arange(n), "t": [None] * (n - 1) + ["x"]}
    sharded = ShardedIndex.create("cols", 4, "l2", shards=2, replicas=1, path=tmp_path / "s", actor_cpus=0.1)
    try:
        sharded.upsert(np.arange(n), x, metadata=columns, documents=np.array([f"d{i}" for i in range(n)]))
        assert sharded.count({"colour": "red", "n": {"$lt": 10}}) == 5
        got = sharded.get([0, n - 1], include=["metadata", "documents"])
        assert got.metadata == [{"colour": "red", "n": 0}, {"colour": "blue", "n": n - 1, "t": "x"}]
        assert got.documents == ["d0", f"d{n - 1}"]
    finally:
        sharded.close()
