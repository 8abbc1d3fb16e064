"""The filter language (vindex/filters): compile errors, metadata checks, and the payload index
against the plain-Python oracle on random metadata and random filters."""
from __future__ import annotations

import io
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vindex.errors import FilterError, InvalidInputError, PayloadTooLargeError
from vindex.filters import Filter, PayloadIndex, check_metadata, compile_filter, decode_metadata, matches
from vindex.filters.memo import compile_cached

# -- random metadata and filters over a small vocabulary, so that filters often hit --

KEYS = ["a", "b", "x.y"]
PATHS = ["a", "b", "a.b", "b.a", "x", "x.y"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(0, 2), st.sampled_from([0.0, -0.0, 1.0, 2.5, 1e300]),
    st.sampled_from(["", "a", "b", "B", "ab", "1", "é"]),
)
values = st.recursive(scalars | st.lists(scalars, max_size=4) | st.lists(scalars, min_size=1, max_size=4),
                      lambda inner: st.dictionaries(st.sampled_from(KEYS), inner, max_size=3), max_leaves=6)
metas = st.none() | st.dictionaries(st.sampled_from(KEYS), values, max_size=3)
range_operands = st.one_of(st.integers(-1, 3), st.sampled_from([0.5, -0.0, 2.5]), st.sampled_from(["", "a", "ab", "b"]))
operators = st.one_of(
    st.tuples(st.sampled_from(["$eq", "$ne"]), scalars),
    st.tuples(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), range_operands),
    st.tuples(st.sampled_from(["$in", "$nin"]), st.lists(scalars, max_size=3)),
    st.tuples(st.just("$exists"), st.booleans()),
)


@st.composite
def fields(draw) -> dict:
    path = draw(st.sampled_from(PATHS))
    form = draw(st.integers(0, 3))
    if form == 0:
        return {path: draw(scalars)}
    op, operand = draw(operators)
    if form == 1:
        return {path: {op: operand}}
    if form == 2:
        return {path: {"$not": {op: operand}}}
    op2, operand2 = draw(operators)
    return {path: {op: operand, op2: operand2}}


filters = st.recursive(
    fields(),
    lambda inner: st.one_of(
        st.builds(lambda fs: {"$and": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda fs: {"$or": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda f: {"$not": f}, inner),
        st.builds(lambda a, b: {**a, **b}, inner, inner),  # implicit $and of several keys
    ),
    max_leaves=5,
)

# every leaf comparison on every path, beside the random trees
LEAVES = [{path: {op: operand}} for path in PATHS for op, operands in [
    ("$eq", [None, True, False, 0, 1, 2.5, "", "a", "ab"]), ("$ne", [None, False, 1, "a"]),
    ("$gt", [0, 1, "", "a"]), ("$gte", [1, 2.5, "ab"]), ("$lt", [1, 0.5, "b", "ab"]), ("$lte", [0, "a"]),
    ("$in", [[], [1, "a"], [None, True, 2.5, "b"]]), ("$nin", [[0, "ab"], [None]]), ("$exists", [True, False]),
] for operand in operands]

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _expected(f: Filter, rows: list, n: int) -> np.ndarray:
    return np.array([matches(f, rows[i] if i < len(rows) else None) for i in range(n)], bool)


def _assert_agrees(index: PayloadIndex, rows: list, raw_filters: list[dict]) -> None:
    n = len(rows) + 2  # rows past the last set one have no metadata
    probe = np.array([n - 1, 0, len(rows) // 2, 0, n + 5], np.int64)
    for raw in raw_filters:
        f = compile_filter(raw)
        expected = _expected(f, rows, n + 6)
        assert index.mask(f, n).tolist() == expected[:n].tolist(), raw
        assert index.check(f, probe).tolist() == expected[probe].tolist(), raw


def _round_trip(index: PayloadIndex) -> PayloadIndex:
    loaded = {}
    for name, array in index.arrays().items():
        assert array.dtype != object, name
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        buffer.seek(0)
        loaded[name] = np.load(buffer, allow_pickle=False)
    return PayloadIndex.from_arrays(loaded)


@SETTINGS
@given(rows=st.lists(metas, min_size=1, max_size=25), raw_filters=st.lists(filters, min_size=1, max_size=4),
       replaced=st.lists(st.tuples(st.integers(0, 30), metas), max_size=12))
def test_payload_index_agrees_with_oracle(rows, raw_filters, replaced) -> None:
    index = PayloadIndex()
    index.set(np.arange(len(rows)), rows)
    _assert_agrees(index, rows, raw_filters + LEAVES)

    # mostly rows already set, a few past the end
    replaced = [(v % (len(rows) + 2), m) for v, m in replaced]
    vids = np.array([v for v, _ in replaced], np.int64)
    index.set(vids, [m for _, m in replaced])
    for vid, meta in replaced:  # the last of repeated vids wins
        rows += [None] * (vid + 1 - len(rows))
        rows[vid] = meta
    _assert_agrees(index, rows, raw_filters + LEAVES)
    _assert_agrees(_round_trip(index), rows, raw_filters + LEAVES)

    rows.reverse()  # every row replaced by another one's metadata
    index.set(np.arange(len(rows)), rows)
    _assert_agrees(index, rows, raw_filters + LEAVES)


@settings(max_examples=60, deadline=None)
@given(raw=filters)
def test_compiled_filters_are_stable_values(raw) -> None:
    f = compile_filter(raw)
    again = compile_filter(f.to_dict())
    assert again == f and hash(again) == hash(f)
    assert repr(f).startswith("Filter({")
    assert compile_filter(f) is f


def test_list_of_many_rows_replaced_many_times_keeps_agreeing() -> None:
    """Lists churned enough that replaced entries are compacted away."""
    rng = np.random.default_rng(0)
    rows: list = [None] * 3000
    index = PayloadIndex()
    f = compile_filter({"$or": [{"tags": "t3"}, {"tags": {"$gt": 7}}]})
    for _ in range(5):
        vids = rng.choice(3000, 2000, replace=False)
        batch = [{"tags": [f"t{x}" if x % 2 else int(x) for x in rng.integers(0, 10, rng.integers(0, 4))]}
                 for _ in vids]
        index.set(vids, batch)
        for vid, meta in zip(vids, batch):
            rows[vid] = meta
        assert index.mask(f, 3000).tolist() == _expected(f, rows, 3000).tolist()
    lists = index._columns[("tags",)].lists
    assert lists.dead <= lists.size  # compaction ran: dead entries never pile up past the live ones


# -- semantics the contract spells out --

@pytest.mark.parametrize("raw, meta, expected", [
    ({"page": "3"}, {"page": 3}, False),          # mixed types never match
    ({"page": 3}, {"page": 3.0}, True),           # int and float alike
    ({"page": 1}, {"page": True}, False),         # bool is not a number
    ({"flag": True}, {"flag": 1}, False),
    ({"page": {"$gt": 2}}, {"page": "9"}, False),
    ({"s": {"$gte": "b"}}, {"s": "ba"}, True),    # strings: lexicographic
    ({"s": {"$lt": "B"}}, {"s": "a"}, False),
    ({"tags": "x"}, {"tags": ["y", "x"]}, True),  # any element
    ({"tags": {"$ne": "x"}}, {"tags": ["y", "x"]}, False),  # no element
    ({"tags": {"$nin": ["x"]}}, {}, True),        # missing key matches $ne / $nin
    ({"tags": {"$ne": None}}, {}, True),
    ({"tags": None}, {}, False),                  # None only equals None
    ({"tags": None}, {"tags": None}, True),
    ({"tags": {"$exists": True}}, {"tags": None}, True),
    ({"tags": {"$exists": True}}, {"tags": []}, True),
    ({"a.b": 1}, {"a": {"b": 1}}, True),          # dotted paths reach nested dicts
    ({"a.b": 1}, {"a.b": 1}, False),              # ... not keys that contain a dot
    ({"a": {"$exists": True}}, {"a": {"b": 1}}, True),
    ({"a": {"$ne": 1}}, {"a": {"b": 1}}, True),
    ({}, None, True),
    ({"$not": {"page": {"$gt": 2}}}, {"page": 1}, True),
    ({"page": {"$not": {"$gt": 2}}}, {}, True),
])
def test_semantics(raw, meta, expected) -> None:
    f = compile_filter(raw)
    assert matches(f, meta) is expected
    index = PayloadIndex()
    index.set(np.array([0]), [meta])
    assert index.mask(f, 1).tolist() == [expected]


@settings(max_examples=60, deadline=None)
@given(raw=filters)
def test_remembered_compiles_equal_fresh_ones(raw) -> None:
    assert compile_cached(raw) == compile_filter(raw)
    assert compile_cached(raw) is compile_cached(raw)  # the second from memory


def test_remembered_compiles_follow_the_dict_not_its_identity() -> None:
    raw = {"a": 1}
    one = compile_cached(raw)
    raw["a"] = True  # the caller changes its dict: the remembered one was a copy
    assert compile_cached(raw) == compile_filter({"a": True}) != one
    assert compile_cached({"a": 1}) is one
    assert compile_cached({"a": 1.0}) == one and compile_cached({"a": np.float32(0.1)}) != compile_cached({"a": 0.1})
    with pytest.raises(FilterError, match=r"filter: a\.\$in: expected a list"):
        compile_cached({"a": {"$in": 3}})
    with pytest.raises(FilterError):  # bad filters are never remembered
        compile_cached({"a": {"$in": 3}})


def test_equal_filters_tell_one_from_true() -> None:
    assert compile_filter({"a": 1}) == compile_filter({"a": 1.0})
    assert compile_filter({"a": 1}) != compile_filter({"a": True})
    assert compile_filter({"a": {"$in": [0]}}) != compile_filter({"a": {"$in": [False]}})


def test_langchain_and_chroma_style_filters() -> None:
    rows = [{"source": "a.pdf", "page": 3, "topic": "ml"}, {"source": "b.pdf", "page": 12, "topic": "db"}]
    index = PayloadIndex()
    index.set(np.arange(2), rows)
    chroma = {"$and": [{"source": {"$in": ["a.pdf", "c.pdf"]}}, {"page": {"$lte": 5}}]}
    langchain = {"$or": [{"topic": {"$eq": "db"}}, {"page": {"$gt": 100}}]}
    assert index.mask(compile_filter(chroma), 2).tolist() == [True, False]
    assert index.mask(compile_filter(langchain), 2).tolist() == [False, True]


# -- errors --

@pytest.mark.parametrize("raw, message", [
    ([1], "filter: expected a dict, got list [1]"),
    (None, "filter: expected a dict, got NoneType None"),
    ({"$and": [{"a": 1}, {"page": {"$regex": "x"}}]},
     "filter: $and[1].page: unknown operator '$regex' (expected one of $eq, $ne, $gt, $gte, $lt, $lte, $in, "
     "$nin, $exists, $not)"),
    ({"$and": [{"a": 1}, {"page": {"$in": 3}}]}, "filter: $and[1].page.$in: expected a list, got 3"),
    ({"$and": []}, "filter: $and: expected a non-empty list of filters, got []"),
    ({"$or": {"a": 1}}, "filter: $or: expected a non-empty list of filters, got {'a': 1}"),
    ({"$nor": [{"a": 1}]}, "filter: unknown operator '$nor' (expected one of $and, $or, $not or a field name)"),
    ({"$not": [{"a": 1}]}, "filter: $not: expected a dict, got list [{'a': 1}]"),
    ({"page": {"$gt": True}}, "filter: page.$gt: expected a number or a string, got True"),
    ({"page": {"$lt": None}}, "filter: page.$lt: expected a number or a string, got None"),
    ({"page": {"$gt": [1]}}, "filter: page.$gt: expected a str, number, bool or None, got list [1]"),
    ({"page": {"$eq": {"x": 1}}}, "filter: page.$eq: expected a str, number, bool or None, got dict {'x': 1}"),
    ({"page": {"$eq": [1, 2]}},
     "filter: page.$eq: expected a scalar, got a list [1, 2]; use $in to match any of several values"),
    ({"page": [1, 2]}, "filter: page: expected a scalar, got a list [1, 2]; use $in to match any of several values"),
    ({"page": {"x": 1}}, "filter: page: a dict operand is not supported (got key 'x'); use an operator such as "
                         "$eq, or a dotted path like 'page.x'"),
    ({"page": {}}, "filter: page: expected a value or an operator dict, got {}"),
    ({"page": {"$in": [1, [2]]}}, "filter: page.$in[1]: expected a str, number, bool or None, got list [2]"),
    ({"page": {"$exists": 1}}, "filter: page.$exists: expected true or false, got 1"),
    ({"page": {"$not": 3}}, "filter: page.$not: expected an operator dict, got 3"),
    ({"page": float("nan")}, "filter: page: nan is not a finite number"),
    ({"page": 2 ** 63}, "filter: page: integer 9223372036854775808 is outside the int64 range"),
    ({"": 1}, "filter: empty field name"),
    ({"a..b": 1}, "filter: field 'a..b' has an empty path segment"),
    ({"a.$b": 1}, "filter: field 'a.$b': path segment '$b' starts with '$'"),
    ({1: 1}, "filter: keys must be str, got int 1"),
])
def test_filter_errors_name_the_problem(raw, message) -> None:
    with pytest.raises(FilterError) as info:
        compile_filter(raw)
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)


def test_deep_filters_are_refused() -> None:
    raw: dict = {"a": 1}
    for _ in range(100):
        raw = {"$not": raw}
    with pytest.raises(FilterError, match="nested deeper than 64 levels"):
        compile_filter(raw)


# -- check_metadata --

def test_check_metadata_round_trips_compact_json() -> None:
    meta = {"source": "a.pdf", "page": 3, "score": 0.5, "ok": True, "none": None, "tags": ["x", 1],
            "nested": {"k": "é"}}
    encoded = check_metadata(meta, 1 << 16)
    assert encoded == '{"source":"a.pdf","page":3,"score":0.5,"ok":true,"none":null,"tags":["x",1],' \
                      '"nested":{"k":"é"}}'.encode()
    assert decode_metadata(encoded) == meta
    assert decode_metadata(check_metadata({"n": np.int64(4), "t": (1, 2)}, 100)) == {"n": 4, "t": [1, 2]}


@pytest.mark.parametrize("meta, message", [
    ([1], "metadata: expected a dict, got list"),
    ({1: "x"}, "metadata: keys must be str, got int 1"),
    ({"": 1}, "metadata: empty key"),
    ({"a": {"$b": 1}}, "metadata.a: key '$b' starts with '$' (reserved for filter operators)"),
    ({"a": float("nan")}, "metadata.a: nan is not a finite number"),
    ({"a": [1, float("inf")]}, "metadata.a[1]: inf is not a finite number"),
    ({"a": [[1]]}, "metadata.a[0]: lists may hold only str, numbers, bools and None, got a list"),
    ({"a": [{"b": 1}]}, "metadata.a[0]: lists may hold only str, numbers, bools and None, got a dict"),
    ({"a": {1, 2}}, "metadata.a: expected a str, number, bool, None, list or dict, got set"),
    ({"a": 2 ** 64}, "metadata.a: integer 18446744073709551616 is outside the int64 range"),
    ({"a": "\ud800"}, "metadata: not valid Unicode text (surrogates not allowed at '\\ud800')"),
])
def test_check_metadata_errors_name_the_key(meta, message) -> None:
    with pytest.raises(InvalidInputError) as info:
        check_metadata(meta, 1 << 16)
    assert str(info.value) == message


def test_check_metadata_limit() -> None:
    meta = {"text": "x" * 90}
    assert len(check_metadata(meta, 101)) == 101
    with pytest.raises(PayloadTooLargeError, match="metadata: 101 bytes as JSON, over the limit of 100"):
        check_metadata(meta, 100)


def test_payload_set_refuses_bad_rows_and_changes_nothing() -> None:
    index = PayloadIndex()
    index.set(np.array([0]), [{"a": 1}])
    with pytest.raises(InvalidInputError, match="payload: metadata a: unsupported type set"):
        index.set(np.array([0, 1]), [{"a": 2}, {"a": {1}}])
    with pytest.raises(InvalidInputError, match="2 vids but 1 metadata"):
        index.set(np.array([0, 1]), [{"a": 2}])
    assert index.mask(compile_filter({"a": 1}), 2).tolist() == [True, False]


def test_readers_run_while_a_writer_grows_the_arrays() -> None:
    """mask/check never fail on arrays replaced or extended by a concurrent set()."""
    index = PayloadIndex()
    f = compile_filter({"$or": [{"k": {"$gte": "k5"}}, {"tags": 3}, {"n": {"$lt": 10}}]})
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                index.mask(f, index.n + 100)
                index.check(f, np.arange(0, index.n + 100, 7))
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            errors.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for start in range(0, 20000, 500):
            vids = np.arange(start, start + 500)
            index.set(vids, [{"k": f"k{v % 97}", "n": int(v % 50), "tags": [int(v % 5), "t"]} for v in vids])
    finally:
        done.set()
        reader.join()
    assert not errors, errors
    assert index.mask(f, 20000).sum() == len([v for v in range(20000)
                                              if f"k{v % 97}" >= "k5" or v % 5 == 3 or v % 50 < 10])
