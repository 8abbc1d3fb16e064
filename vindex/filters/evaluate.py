"""Vectorised evaluation of a compiled filter over the payload index's columns.

A filter is evaluated over a row selection: every row ``0 .. n-1`` (``AllRows``, for ``mask``)
or a few given rows (``SomeRows``, for ``check``). A comparison is evaluated once over the
path's keyword dictionary (a set of codes or a lookup table), then mapped onto the code column,
the number column and the list entries; ``$ne``/``$nin``/``$not`` invert the positive result.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from vindex.filters.columns import Column, Lists, entry_ranges
from vindex.filters.language import And, Field, Filter, Not, Or, scalar_kind

NumberTest = Callable[[np.ndarray], np.ndarray]


class AllRows:
    """Rows ``0 .. n-1``."""

    def __init__(self, n: int):
        self.n = n

    def gather(self, array: np.ndarray, fill: float) -> np.ndarray:
        if len(array) >= self.n:
            return array[:self.n]
        out = np.full(self.n, fill, array.dtype)
        out[:len(array)] = array
        return out

    def list_hits(self, lists: Lists, hit: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        size = lists.size
        vid = lists.vid[:size]
        rows = vid[hit(lists.code[:size], lists.num[:size]) & (vid >= 0) & (vid < self.n)]
        out = np.zeros(self.n, bool)
        out[rows] = True
        return out


class SomeRows:
    """The rows ``vids`` (any order, repeats allowed)."""

    def __init__(self, vids: np.ndarray):
        self.vids = vids
        self.n = len(vids)

    def gather(self, array: np.ndarray, fill: float) -> np.ndarray:
        out = np.full(self.n, fill, array.dtype)
        inside = self.vids < len(array)
        out[inside] = array[self.vids[inside]]
        return out

    def list_hits(self, lists: Lists, hit: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        starts, counts = self.gather(lists.start, -1), self.gather(lists.count, 0)
        counts[starts < 0] = 0
        entries, owner = entry_ranges(starts, counts)
        # entries past the snapshot or since replaced belong to no row here
        ok = entries < lists.size
        entries, owner = entries[ok], owner[ok]
        ok = lists.vid[entries] == self.vids[owner]
        entries, owner = entries[ok], owner[ok]
        out = np.zeros(self.n, bool)
        out[owner[hit(lists.code[entries], lists.num[entries])]] = True
        return out


Rows = AllRows | SomeRows


def evaluate(f: Filter, columns: Mapping[tuple[str, ...], Column], rows: Rows) -> np.ndarray:
    """Which of ``rows`` match ``f`` (a bool array, one per row)."""
    if isinstance(f, And):
        out = np.ones(rows.n, bool)
        for child in f.children:
            out &= evaluate(child, columns, rows)
        return out
    if isinstance(f, Or):
        out = np.zeros(rows.n, bool)
        for child in f.children:
            out |= evaluate(child, columns, rows)
        return out
    if isinstance(f, Not):
        return ~evaluate(f.child, columns, rows)
    if not isinstance(f, Field):
        raise TypeError(f"expected a compiled Filter, got {type(f).__name__}")
    column = columns.get(f.path)
    if column is None:  # no row ever had this path
        positive = np.zeros(rows.n, bool)
        return ~positive if f.op in ("$ne", "$nin") or (f.op == "$exists" and not f.operand) else positive
    if f.op == "$exists":
        present = _present(column, rows)
        return present if f.operand else ~present
    keyword, number = _compile_comparison(f, column)
    positive = _any_element(column, rows, keyword, number)
    return ~positive if f.op in ("$ne", "$nin") else positive


def _present(column: Column, rows: Rows) -> np.ndarray:
    out = np.zeros(rows.n, bool)
    if column.kw is not None:
        out |= rows.gather(column.kw, 0) > 0
    if column.num is not None:
        out |= ~np.isnan(rows.gather(column.num, np.nan))
    if column.lists is not None:
        out |= rows.gather(column.lists.start, -1) >= 0
    return out


# A keyword test is the 1-based codes that match (few) or a lookup table indexed by code.
KeywordTest = tuple[str, np.ndarray] | None


def _compile_comparison(f: Field, column: Column) -> tuple[KeywordTest, NumberTest | None]:
    """The comparison's test on keyword codes and on numbers (None: nothing of that kind matches)."""
    op, operand = f.op, f.operand
    if op in ("$eq", "$ne", "$in", "$nin"):
        wanted = operand if op in ("$in", "$nin") else (operand,)
        numbers = np.array([float(v) for v in wanted if scalar_kind(v) == "num"], np.float64)
        codes = np.array([c for c in (column.lookup(v) for v in wanted if scalar_kind(v) != "num") if c > 0],
                         np.int32)
        keyword = ("codes", np.unique(codes)) if len(codes) else None
        if len(numbers) == 0:
            return keyword, None
        if len(numbers) == 1:
            x = numbers[0]
            return keyword, lambda a: a == x
        return keyword, lambda a: np.isin(a, numbers)
    compare = {"$gt": np.greater, "$gte": np.greater_equal, "$lt": np.less, "$lte": np.less_equal}[op]
    if scalar_kind(operand) == "num":
        x = float(operand)
        return None, lambda a: compare(a, x)
    codes, strings = column.string_values()
    # [0]: no keyword; codes past the end (values added since) clip onto a last False
    table = np.zeros(max(len(column.values), int(codes.max(initial=0))) + 2, bool)
    table[codes[compare(strings, operand).astype(bool)]] = True
    return ("table", table), None


def _keyword_hits(codes: np.ndarray, test: KeywordTest) -> np.ndarray:
    kind, values = test  # type: ignore[misc]
    if kind == "table":
        return np.take(values, codes, mode="clip")
    if len(values) == 1:
        return codes == values[0]
    # a lookup table beats np.isin's sort; codes past its end clip onto a last False
    table = np.zeros(int(values.max()) + 2, bool)
    table[values] = True
    return np.take(table, codes, mode="clip")


def _any_element(column: Column, rows: Rows, keyword: KeywordTest, number: NumberTest | None) -> np.ndarray:
    out = np.zeros(rows.n, bool)
    if keyword is not None and column.kw is not None:
        out |= _keyword_hits(rows.gather(column.kw, 0), keyword)
    if number is not None and column.num is not None:
        out |= number(rows.gather(column.num, np.nan))
    lists = column.lists
    if lists is not None and lists.size > lists.dead and (keyword is not None or number is not None):
        def hit(codes: np.ndarray, nums: np.ndarray) -> np.ndarray:
            found = np.zeros(len(codes), bool)
            if keyword is not None:
                found |= _keyword_hits(codes, keyword)
            if number is not None:
                found |= number(nums)
            return found
        out |= rows.list_hits(lists, hit)
    return out
