"""A batch of flat metadata rows (dicts of plain scalars) as columns.

Rows with the same keys in the same order form a group; each key's values are one tuple, with
the set of types they have. The write path checks, encodes (metadata.encode_batch) and indexes
(PayloadIndex.set) such a batch a column at a time, at C speed, instead of a row at a time.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from itertools import repeat
from typing import Sequence

import numpy as np

#: The types a flat row's values may have.
PLAIN = frozenset((str, int, float, bool, type(None)))
#: Values the payload index keeps as keywords (the others of ``PLAIN`` are numbers).
KEYWORD = frozenset((str, bool, type(None)))
NUMBER = frozenset((int, float))


@dataclass
class FlatGroup:
    """Rows ``positions`` of a batch, which all have the keys ``keys`` in this order:
    ``columns[j][i]`` is row ``positions[i]``'s value of ``keys[j]``, ``kinds[j]`` the types
    in ``columns[j]``."""

    positions: np.ndarray
    keys: tuple[str, ...]
    columns: list[tuple]
    kinds: list[frozenset[type]]


def flat_groups(rows: Sequence[object]) -> list[FlatGroup] | None:
    """``rows`` (a dict or None each; None rows belong to no group) as groups of flat rows, or
    None when a row is something else (a dict subclass, a nested value, a list, a numpy
    scalar) or the rows have so many key orders that grouping them would not pay."""
    n = len(rows)
    if n and None not in rows:
        if any(type(row) is not dict for row in rows):
            return None
        orders = list(map(tuple, rows))  # type: ignore[arg-type]
        if orders.count(orders[0]) == n:  # the common case: one group of every row
            return _group(rows, np.arange(n, dtype=np.int64), orders[0])
    by_keys: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        if row is None:
            continue
        if type(row) is not dict:
            return None
        by_keys.setdefault(tuple(row), []).append(i)  # type: ignore[arg-type]
    if len(by_keys) > max(4, n // 16):
        return None
    groups = []
    for keys, members in by_keys.items():
        group = _group([rows[i] for i in members], np.asarray(members, np.int64), keys)
        if group is None:
            return None
        groups += group
    return groups


def _group(rows: Sequence[object], positions: np.ndarray, keys: tuple) -> list[FlatGroup] | None:
    columns = list(zip(*map(dict.values, rows))) if keys else []  # type: ignore[arg-type]
    kinds = [frozenset(map(type, column)) for column in columns]
    if not all(kind <= PLAIN for kind in kinds):
        return None
    return [FlatGroup(positions, keys, columns, kinds)]


def column_groups(names: Sequence[str], columns: Sequence[Sequence[object]], n: int) -> list[FlatGroup] | None:
    """Rows given as ``columns`` (``columns[j][i]``: row ``i``'s value of ``names[j]``, None
    where row ``i`` has no such key) as flat groups, one for each set of keys rows have; None
    when a value is not a plain scalar."""
    kinds = [frozenset(map(type, column)) for column in columns]
    if not all(kind <= PLAIN for kind in kinds):
        return None
    if not any(type(None) in kind for kind in kinds):
        return [FlatGroup(np.arange(n, dtype=np.int64), tuple(names), [tuple(c) for c in columns], kinds)]
    present = np.empty((n, len(columns)), bool)
    for j, column in enumerate(columns):
        present[:, j] = np.fromiter(map(operator.is_not, column, repeat(None)), bool, n)
    patterns, which = np.unique(present, axis=0, return_inverse=True)
    groups = []
    for p, pattern in enumerate(patterns):
        positions = np.flatnonzero(which.ravel() == p)
        rows = positions.tolist()
        cols = [tuple(map(columns[j].__getitem__, rows)) for j in np.flatnonzero(pattern).tolist()]
        groups.append(FlatGroup(positions, tuple(names[j] for j in np.flatnonzero(pattern).tolist()), cols,
                                [frozenset(map(type, c)) for c in cols]))
    return groups
