"""The reference evaluation of a filter on one record's metadata: plain Python, the definition
of the language's semantics that ``PayloadIndex`` is tested against."""
from __future__ import annotations

from vindex.filters.language import And, Field, Filter, Not, Or, scalar_kind

_MISSING = object()


def matches(f: Filter, meta: dict | None) -> bool:
    """Whether a record with metadata ``meta`` (None: no metadata) satisfies ``f``."""
    if isinstance(f, And):
        return all(matches(c, meta) for c in f.children)
    if isinstance(f, Or):
        return any(matches(c, meta) for c in f.children)
    if isinstance(f, Not):
        return not matches(f.child, meta)
    if not isinstance(f, Field):
        raise TypeError(f"expected a compiled Filter, got {type(f).__name__}")
    value = _resolve(meta, f.path)
    if f.op == "$exists":
        return (value is not _MISSING) == f.operand
    # the scalars a comparison sees: a list's elements, none for a missing key or a dict
    if value is _MISSING or isinstance(value, dict):
        elements: list = []
    else:
        elements = value if isinstance(value, list) else [value]
    if f.op == "$eq":
        return any(_equal(e, f.operand) for e in elements)
    if f.op == "$ne":
        return not any(_equal(e, f.operand) for e in elements)
    if f.op == "$in":
        return any(_equal(e, x) for e in elements for x in f.operand)
    if f.op == "$nin":
        return not any(_equal(e, x) for e in elements for x in f.operand)
    return any(_in_range(e, f.op, f.operand) for e in elements)


def _resolve(meta: dict | None, path: tuple[str, ...]) -> object:
    value: object = meta
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _equal(a: object, b: object) -> bool:
    kind = scalar_kind(a)
    if kind != scalar_kind(b):
        return False
    return float(a) == float(b) if kind == "num" else a == b  # type: ignore[arg-type]


def _in_range(a: object, op: str, bound: object) -> bool:
    kind = scalar_kind(a)
    if kind != scalar_kind(bound):
        return False
    if kind == "num":
        a, bound = float(a), float(bound)  # type: ignore[arg-type]
    if op == "$gt":
        return a > bound  # type: ignore[operator]
    if op == "$gte":
        return a >= bound  # type: ignore[operator]
    if op == "$lt":
        return a < bound  # type: ignore[operator]
    return a <= bound  # type: ignore[operator]
