"""``PayloadIndex``: the in-memory index of every row's metadata, by internal row number (vid).

Each flattened metadata path (``("a", "b")`` for ``{"a": {"b": ...}}``) has its own ``Column``
(see columns.py); a filter is evaluated over them with numpy (evaluate.py). One writer calls
``set`` at a time; readers (``mask``, ``check``) may run concurrently and never see arrays
resized under them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from vindex.errors import InvalidInputError
from vindex.filters.columns import Column, Lists, compact_lists, entry_ranges
from vindex.filters.evaluate import AllRows, SomeRows, evaluate
from vindex.filters.flat import KEYWORD, NUMBER, FlatGroup, flat_groups
from vindex.filters.language import Filter

Path = tuple[str, ...]

# list entries are compacted once more than this share of them has been replaced
_COMPACT_DEAD_SHARE = 0.5


class _Plan:
    """The new values of one path for the rows of one ``set`` call (positions into its vids):
    lists, or arrays when planned from flat groups."""

    def __init__(self) -> None:
        self.kw_pos: list[int] = []
        self.kw_codes: list[int] = []
        self.num_pos: list[int] = []
        self.num_values: list[float] = []
        self.list_pos: list[int] = []
        self.list_counts: list[int] = []
        self.entry_codes: list[int] = []
        self.entry_nums: list[float] = []


class PayloadIndex:
    """Metadata of rows ``0 .. n-1`` as columns, evaluated against compiled filters."""

    def __init__(self) -> None:
        self._columns: dict[Path, Column] = {}
        self._capacity = 0
        self._n = 0

    @property
    def n(self) -> int:
        """One past the highest vid ever set."""
        return self._n

    def set(self, vids: np.ndarray, metas: Sequence[dict | None]) -> None:
        """Replace the metadata of rows ``vids`` (None: none). A vid given twice keeps its last
        metadata. Raises ``InvalidInputError`` (changing nothing) on a value that is not JSON
        metadata (see ``check_metadata``). Flat rows are indexed a column at a time."""
        vids = np.asarray(vids, np.int64).ravel()
        if len(vids) != len(metas):
            raise InvalidInputError(f"payload: {len(vids)} vids but {len(metas)} metadata entries")
        if len(vids) == 0:
            return
        if vids.min() < 0:
            raise InvalidInputError(f"payload: vids must be non-negative, got {int(vids.min())}")
        vids, metas = _last_of_each(vids, metas)
        groups = flat_groups(metas)
        # every check before the first write
        self._apply(vids, self._plan(metas) if groups is None else self._plan_flat(groups))

    def set_groups(self, vids: np.ndarray, groups: list[FlatGroup]) -> None:
        """Replace the metadata of distinct rows ``vids``: those at a group's positions get
        its rows (see ``filters.flat``), the others none."""
        vids = np.asarray(vids, np.int64).ravel()
        if len(vids) == 0:
            return
        if vids.min() < 0 or len(np.unique(vids)) != len(vids):
            raise InvalidInputError("payload: vids must be distinct and non-negative")
        self._apply(vids, self._plan_flat(groups))

    def _apply(self, vids: np.ndarray, plans: dict[Path, _Plan]) -> None:
        for path in plans:
            self._column(path)
        self._reserve(int(vids.max()) + 1)
        for path, column in list(self._columns.items()):
            self._write(column, vids, plans.get(path))
        self._n = max(self._n, int(vids.max()) + 1)

    def mask(self, f: Filter, n: int) -> np.ndarray:
        """Which rows ``0 .. n-1`` match ``f`` (bool array of length ``n``). Rows without
        metadata match as records without any key do (``$ne``, ``$nin``, ``$exists: false``)."""
        return evaluate(f, self._columns, AllRows(int(n)))

    def check(self, f: Filter, vids: np.ndarray) -> np.ndarray:
        """Which of ``vids`` match ``f`` (for a few rows; ``mask`` for many)."""
        vids = np.asarray(vids, np.int64).ravel()
        if len(vids) and vids.min() < 0:
            raise InvalidInputError(f"payload: vids must be non-negative, got {int(vids.min())}")
        return evaluate(f, self._columns, SomeRows(vids))

    def nbytes(self) -> int:
        """Memory held by the columns and their dictionaries (the dictionaries estimated)."""
        return sum(c.nbytes() for c in self._columns.values())

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything as plain numpy arrays (no object arrays), names prefixed ``pl_``."""
        from vindex.filters.codec import to_arrays
        return to_arrays(self._columns, self._n)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> PayloadIndex:
        """The index ``arrays()`` described. Raises ``CorruptionError`` on inconsistent arrays."""
        from vindex.filters.codec import from_arrays
        index = cls()
        index._columns, index._n = from_arrays(arrays)
        index._capacity = index._n
        return index

    # -- writing --

    def _plan(self, metas: Sequence[dict | None]) -> dict[Path, _Plan]:
        plans: dict[Path, _Plan] = {}
        for pos, meta in enumerate(metas):
            if meta is None:
                continue
            if not isinstance(meta, dict):
                raise InvalidInputError(f"payload: metadata must be a dict or None, got {type(meta).__name__}")
            self._plan_dict(meta, (), pos, plans)
        return plans

    def _plan_flat(self, groups: list[FlatGroup]) -> dict[Path, _Plan]:
        """The plans of flat rows, a column at a time: numbers as one array, keywords coded by
        the dictionary at once."""
        parts: dict[Path, list[tuple[np.ndarray, tuple, frozenset]]] = {}
        for group in groups:
            for key, values, kinds in zip(group.keys, group.columns, group.kinds):
                parts.setdefault((key,), []).append((group.positions, values, kinds))
        plans: dict[Path, _Plan] = {}
        for path, columns in parts.items():
            column = self._column(path)
            kw_pos, kw_codes, num_pos, num_values = [], [], [], []
            for positions, values, kinds in columns:
                if kinds <= KEYWORD:
                    kw_pos.append(positions)
                    kw_codes.append(column.codes_of(values))
                elif kinds <= NUMBER:
                    num_pos.append(positions)
                    num_values.append(np.array(values, np.float64))
                else:  # keywords and numbers in one column: split
                    keyword = np.fromiter((type(v) in KEYWORD for v in values), bool, len(values))
                    kw_pos.append(positions[keyword])
                    kw_codes.append(column.codes_of([v for v, k in zip(values, keyword) if k]))
                    num_pos.append(positions[~keyword])
                    num_values.append(np.array([v for v, k in zip(values, keyword) if not k], np.float64))
            plan = plans[path] = _Plan()
            if kw_pos:
                plan.kw_pos, plan.kw_codes = np.concatenate(kw_pos), np.concatenate(kw_codes)
            if num_pos:
                plan.num_pos, plan.num_values = np.concatenate(num_pos), np.concatenate(num_values)
        return plans

    def _plan_dict(self, meta: dict, prefix: Path, pos: int, plans: dict[Path, _Plan]) -> None:
        for key, value in meta.items():
            path = prefix + (key,)
            plan = plans.get(path)
            if plan is None:
                plan = plans[path] = _Plan()
            kind = type(value)
            if kind is str or kind is bool or value is None:
                plan.kw_pos.append(pos)
                plan.kw_codes.append(self._column(path).code_of(value))
            elif kind is int or kind is float:
                plan.num_pos.append(pos)
                plan.num_values.append(value)
            elif kind is list:
                plan.list_pos.append(pos)
                plan.list_counts.append(len(value))
                for element in value:
                    self._plan_element(element, path, plan)
            elif kind is dict:
                plan.list_pos.append(pos)  # present, no elements of its own
                plan.list_counts.append(0)
                self._plan_dict(value, path, pos, plans)
            else:
                raise InvalidInputError(f"payload: metadata {'.'.join(path)}: unsupported type {kind.__name__}")

    def _plan_element(self, element: object, path: Path, plan: _Plan) -> None:
        kind = type(element)
        if kind is str or kind is bool or element is None:
            plan.entry_codes.append(self._column(path).code_of(element))  # type: ignore[arg-type]
            plan.entry_nums.append(np.nan)
        elif kind is int or kind is float:
            plan.entry_codes.append(0)
            plan.entry_nums.append(element)  # type: ignore[arg-type]
        else:
            raise InvalidInputError(f"payload: metadata {'.'.join(path)}: list element of type {kind.__name__}")

    def _column(self, path: Path) -> Column:
        column = self._columns.get(path)
        if column is None:
            column = Column(self._capacity)
            # a new dict, not an insertion into the one readers may be iterating
            self._columns = {**self._columns, path: column}
        return column

    def _reserve(self, rows: int) -> None:
        if rows <= self._capacity:
            return
        self._capacity = max(rows, self._capacity * 3 // 2, 1024)
        for column in self._columns.values():
            column.grow(self._capacity)

    def _write(self, column: Column, vids: np.ndarray, plan: _Plan | None) -> None:
        m = len(vids)
        if plan is not None and len(plan.kw_pos):
            column.ensure_kw()
        if column.kw is not None:
            codes = np.zeros(m, np.int32)
            if plan is not None:
                codes[plan.kw_pos] = plan.kw_codes
            column.kw[vids] = codes
        if plan is not None and len(plan.num_pos):
            column.ensure_num()
        if column.num is not None:
            numbers = np.full(m, np.nan)
            if plan is not None:
                numbers[plan.num_pos] = plan.num_values
            column.num[vids] = numbers
        if plan is not None and len(plan.list_pos):
            column.ensure_lists()
        if column.lists is not None:
            column.lists = _write_lists(column.lists, vids, plan)


def _write_lists(lists: Lists, vids: np.ndarray, plan: _Plan | None) -> Lists:
    """``lists`` with rows ``vids`` holding the plan's lists (or none): old entries are marked
    replaced, new ones appended; arrays that must grow are replaced."""
    old_starts, old_counts = lists.start[vids], lists.count[vids]
    replaced, _ = entry_ranges(old_starts[old_starts >= 0], old_counts[old_starts >= 0])
    lists.vid[replaced] = -1
    dead = lists.dead + len(replaced)
    starts = np.full(len(vids), -1, np.int64)
    counts = np.zeros(len(vids), np.int32)
    size = lists.size
    if plan is not None and len(plan.list_pos):
        pos = np.asarray(plan.list_pos, np.int64)
        row_counts = np.asarray(plan.list_counts, np.int64)
        new = int(row_counts.sum())
        if size + new > len(lists.vid):
            capacity = max(size + new, len(lists.vid) * 3 // 2, 1024)
            lists = lists._replace(vid=_resized(lists.vid, capacity, size), code=_resized(lists.code, capacity, size),
                                   num=_resized(lists.num, capacity, size))
        starts[pos] = size + np.cumsum(row_counts) - row_counts
        counts[pos] = row_counts
        lists.vid[size:size + new] = np.repeat(vids[pos], row_counts)
        lists.code[size:size + new] = plan.entry_codes
        lists.num[size:size + new] = plan.entry_nums
        size += new
    lists.start[vids] = starts
    lists.count[vids] = counts
    lists = lists._replace(size=size, dead=dead)
    if dead > 1024 and dead > _COMPACT_DEAD_SHARE * size:
        lists = compact_lists(lists)
    return lists


def _resized(array: np.ndarray, capacity: int, used: int) -> np.ndarray:
    out = np.empty(capacity, array.dtype)
    out[:used] = array[:used]
    return out


def _last_of_each(vids: np.ndarray, metas: Sequence[dict | None]) -> tuple[np.ndarray, Sequence[dict | None]]:
    """The vids once each, with the metadata of their last occurrence."""
    if len(np.unique(vids)) == len(vids):
        return vids, metas
    _, first_from_end = np.unique(vids[::-1], return_index=True)
    keep = np.sort(len(vids) - 1 - first_from_end)
    return vids[keep], [metas[i] for i in keep]
