"""The columns the payload index keeps for one flattened metadata path.

A row's value at a path is one of: missing; a single str/bool/None (``kw``: 1 + its code in the
path's dictionary, 0 none); a single number (``num``: float64, NaN none); or a list or a dict
(``lists``: the row's elements as entries, a dict or an empty list being present with none).
Arrays are written in place only inside their length; growing replaces them, so a reader that
holds the old arrays keeps reading valid (if stale) data.
"""
from __future__ import annotations

import sys
from typing import NamedTuple, Sequence

import numpy as np

Keyword = str | bool | None


class Lists(NamedTuple):
    """The list (and dict) values of one path, published as one snapshot.

    Row ``v``'s elements are entries ``start[v] .. start[v] + count[v]``; ``start[v] == -1``: the
    row holds no list or dict here. Each entry has its row (``vid``, -1 once replaced), a keyword
    code (``code``, 1-based, 0 for a number) and a number (``num``, NaN for a keyword). Only the
    first ``size`` entries are in use; ``dead`` of them are replaced ones."""

    start: np.ndarray
    count: np.ndarray
    vid: np.ndarray
    code: np.ndarray
    num: np.ndarray
    size: int
    dead: int


def empty_lists(capacity: int) -> Lists:
    """A ``Lists`` for ``capacity`` rows without entries."""
    return Lists(np.full(capacity, -1, np.int64), np.zeros(capacity, np.int32), np.zeros(0, np.int64),
                 np.zeros(0, np.int32), np.zeros(0, np.float64), 0, 0)


def entry_ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(entries, owner)``: the entry numbers ``starts[i] .. starts[i] + counts[i]`` of every
    ``i``, and the ``i`` each came from."""
    counts = counts.astype(np.int64)
    owner = np.repeat(np.arange(len(starts)), counts)
    first = np.cumsum(counts) - counts
    return starts[owner] + (np.arange(len(owner)) - first[owner]), owner


def compact_lists(lists: Lists) -> Lists:
    """The same lists without replaced entries (new arrays, exactly sized)."""
    size = lists.size
    live = lists.vid[:size] >= 0
    dead_before = np.concatenate([[0], np.cumsum(~live)])
    start = lists.start.copy()
    has = start >= 0
    start[has] -= dead_before[np.minimum(start[has], size)]
    return Lists(start, lists.count.copy(), lists.vid[:size][live], lists.code[:size][live],
                 lists.num[:size][live], int(live.sum()), 0)


def _grow(array: np.ndarray, capacity: int, fill: float) -> np.ndarray:
    out = np.full(capacity, fill, array.dtype)
    out[:len(array)] = array
    return out


class Column:
    """Everything the payload index holds for one flattened path."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.kw: np.ndarray | None = None
        self.num: np.ndarray | None = None
        self.lists: Lists | None = None
        self.values: list[Keyword] = []          # code -> value
        self.codes: dict[Keyword, int] = {}      # value -> code (never a number: 1 == True)
        self.dictionary_bytes = 0
        self._strings: tuple[int, np.ndarray, np.ndarray] = (0, np.zeros(0, np.int32), np.zeros(0, object))

    def code_of(self, value: Keyword) -> int:
        """The 1-based code of ``value``, added to the dictionary if new."""
        code = self.codes.get(value, -1)
        if code < 0:
            code = len(self.values)
            self.values.append(value)
            self.codes[value] = code
            # a list slot and a dict entry besides the object itself (an estimate for nbytes)
            self.dictionary_bytes += sys.getsizeof(value) + 40
        return code + 1

    def codes_of(self, values: Sequence[Keyword]) -> np.ndarray:
        """The 1-based codes (int32) of ``values``, new ones added to the dictionary in order of
        first appearance (as ``code_of`` one at a time would)."""
        codes = self.codes
        for value in dict.fromkeys(values):
            if value not in codes:
                self.code_of(value)
        return np.fromiter(map(codes.__getitem__, values), np.int32, len(values)) + 1

    def lookup(self, value: Keyword) -> int:
        """The 1-based code of ``value``, 0 when no row ever held it."""
        return self.codes.get(value, -1) + 1

    def string_values(self) -> tuple[np.ndarray, np.ndarray]:
        """``(codes, strings)``: every str in the dictionary (an object array) with its code."""
        done, codes, strings = self._strings
        if done < len(self.values):
            new = [(i + 1, v) for i, v in enumerate(self.values[done:], start=done) if type(v) is str]
            codes = np.concatenate([codes, np.array([c for c, _ in new], np.int32)])
            added = np.empty(len(new), object)
            added[:] = [v for _, v in new]
            strings = np.concatenate([strings, added])
            self._strings = (len(self.values), codes, strings)
        return codes, strings

    def ensure_kw(self) -> np.ndarray:
        if self.kw is None:
            self.kw = np.zeros(self.capacity, np.int32)
        return self.kw

    def ensure_num(self) -> np.ndarray:
        if self.num is None:
            self.num = np.full(self.capacity, np.nan)
        return self.num

    def ensure_lists(self) -> Lists:
        if self.lists is None:
            self.lists = empty_lists(self.capacity)
        return self.lists

    def grow(self, capacity: int) -> None:
        """Room for ``capacity`` rows: new arrays, the old ones left to their readers."""
        if self.kw is not None:
            self.kw = _grow(self.kw, capacity, 0)
        if self.num is not None:
            self.num = _grow(self.num, capacity, np.nan)
        if self.lists is not None:
            self.lists = self.lists._replace(start=_grow(self.lists.start, capacity, -1),
                                             count=_grow(self.lists.count, capacity, 0))
        self.capacity = capacity

    def nbytes(self) -> int:
        arrays = [a for a in (self.kw, self.num) if a is not None]
        if self.lists is not None:
            arrays += [self.lists.start, self.lists.count, self.lists.vid, self.lists.code, self.lists.num]
        return sum(a.nbytes for a in arrays) + self.dictionary_bytes + self._strings[1].nbytes + self._strings[2].nbytes
