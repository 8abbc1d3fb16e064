"""The filter language: Mongo-style dicts compiled into an immutable, hashable ``Filter`` tree.

``compile_filter`` is the only way to build a filter; it checks everything up front so the
evaluators (``oracle.matches``, ``PayloadIndex.mask``) never meet a malformed tree. Every error is
a ``FilterError`` whose message names the path to the problem, e.g.
``filter: $and[1].page.$in: expected a list, got 3``.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from vindex.errors import FilterError
from vindex.filters.metadata import plain_scalar

Scalar = str | int | float | bool | None

COMPARISONS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists")
RANGES = ("$gt", "$gte", "$lt", "$lte")
LOGICAL = ("$and", "$or", "$not")
# deeper trees are refused rather than risking a RecursionError in the evaluators
MAX_DEPTH = 64


def scalar_kind(value: object) -> str:
    """``"str" | "num" | "bool" | "null"`` for a normalised scalar (bool is not a number)."""
    if value is None:
        return "null"
    if type(value) is bool:
        return "bool"
    if type(value) is str:
        return "str"
    return "num"


class Filter:
    """A compiled filter: ``Field``, ``And``, ``Or`` or ``Not``. Immutable and hashable; equal
    filters have equal hashes (``1``, ``1.0`` and ``True`` are told apart where the language
    does)."""

    __slots__ = ("_hash",)

    def to_dict(self) -> dict:
        """The filter in the language's explicit form (every comparison spelled with its $op)."""
        raise NotImplementedError

    def _key(self) -> tuple:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._key() == other._key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        try:
            return self._hash  # type: ignore[attr-defined]
        except AttributeError:  # first call: the plan cache hashes the same filter per search
            h = hash((type(self).__name__, self._key()))
            object.__setattr__(self, "_hash", h)
            return h

    def __repr__(self) -> str:
        return f"Filter({self.to_dict()!r})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")


def _tagged(value: object) -> object:
    """A comparison key that tells 1 from True and compares 1 with 1.0 as numbers do."""
    if isinstance(value, tuple):
        return tuple(_tagged(v) for v in value)
    kind = scalar_kind(value)
    return (kind, float(value)) if kind == "num" else (kind, value)  # type: ignore[arg-type]


class Field(Filter):
    """One comparison ``op`` of the value at ``path`` (a tuple of nested keys) with ``operand``
    (a scalar; a tuple of scalars for $in/$nin; a bool for $exists)."""

    __slots__ = ("path", "op", "operand")
    path: tuple[str, ...]
    op: str
    operand: Any

    def __init__(self, path: tuple[str, ...], op: str, operand: Any):
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "operand", operand)

    def to_dict(self) -> dict:
        operand = list(self.operand) if isinstance(self.operand, tuple) else self.operand
        return {".".join(self.path): {self.op: operand}}

    def _key(self) -> tuple:
        return (self.path, self.op, _tagged(self.operand))


class _Group(Filter):
    __slots__ = ("children",)
    children: tuple[Filter, ...]
    op = ""

    def __init__(self, children: tuple[Filter, ...]):
        object.__setattr__(self, "children", tuple(children))

    def to_dict(self) -> dict:
        return {self.op: [c.to_dict() for c in self.children]}

    def _key(self) -> tuple:
        return self.children


class And(_Group):
    """Every child matches (``And(())`` matches every record: the empty filter ``{}``)."""

    __slots__ = ()
    op = "$and"


class Or(_Group):
    """At least one child matches."""

    __slots__ = ()
    op = "$or"


class Not(Filter):
    """The child does not match."""

    __slots__ = ("child",)
    child: Filter

    def __init__(self, child: Filter):
        object.__setattr__(self, "child", child)

    def to_dict(self) -> dict:
        return {"$not": self.child.to_dict()}

    def _key(self) -> tuple:
        return (self.child,)


def compile_filter(obj: Mapping | Filter) -> Filter:
    """Validate a filter dict into a ``Filter`` (a ``Filter`` is returned as is).

    Raises ``FilterError`` naming the path to the first problem found."""
    if isinstance(obj, Filter):
        return obj
    return _compile_doc(obj, (), 0)


def _where(loc: tuple[str, ...]) -> str:
    text = ""
    for part in loc:
        text += part if part.startswith("[") or not text else "." + part
    return f"filter: {text}: " if text else "filter: "


def _fail(loc: tuple[str, ...], message: str) -> FilterError:
    return FilterError(_where(loc) + message)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _compile_doc(obj: object, loc: tuple[str, ...], depth: int) -> Filter:
    if depth > MAX_DEPTH:
        raise _fail(loc, f"nested deeper than {MAX_DEPTH} levels")
    if not isinstance(obj, Mapping):
        raise _fail(loc, f"expected a dict, got {type(obj).__name__} {_show(obj)}")
    parts: list[Filter] = []
    for key, value in obj.items():
        if not isinstance(key, str):
            raise _fail(loc, f"keys must be str, got {type(key).__name__} {_show(key)}")
        if key.startswith("$"):
            parts.append(_compile_logical(key, value, loc + (key,), depth))
        else:
            parts.append(_compile_field(_parse_path(key, loc), value, loc + (key,), depth))
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def _compile_logical(op: str, value: object, loc: tuple[str, ...], depth: int) -> Filter:
    if op == "$not":
        return Not(_compile_doc(value, loc, depth + 1))
    if op not in ("$and", "$or"):
        raise _fail(loc[:-1], f"unknown operator {op!r} (expected one of {', '.join(LOGICAL)} or a field name)")
    if not isinstance(value, (list, tuple)):
        raise _fail(loc, f"expected a non-empty list of filters, got {_show(value)}")
    if not value:
        raise _fail(loc, "expected a non-empty list of filters, got []")
    children = tuple(_compile_doc(v, loc + (f"[{i}]",), depth + 1) for i, v in enumerate(value))
    return And(children) if op == "$and" else Or(children)


def _parse_path(key: str, loc: tuple[str, ...]) -> tuple[str, ...]:
    if not key:
        raise _fail(loc, "empty field name")
    path = tuple(key.split("."))
    for segment in path:
        if not segment:
            raise _fail(loc, f"field {key!r} has an empty path segment")
        if segment.startswith("$"):
            raise _fail(loc, f"field {key!r}: path segment {segment!r} starts with '$'")
    return path


def _compile_field(path: tuple[str, ...], value: object, loc: tuple[str, ...], depth: int) -> Filter:
    if not isinstance(value, Mapping):
        return Field(path, "$eq", _equality_operand(value, loc))
    if not value:
        raise _fail(loc, "expected a value or an operator dict, got {}")
    parts: list[Filter] = []
    for op, operand in value.items():
        if not isinstance(op, str) or not op.startswith("$"):
            raise _fail(loc, f"a dict operand is not supported (got key {_show(op)}); "
                             f"use an operator such as $eq, or a dotted path like '{'.'.join(path)}.{op}'")
        parts.append(_compile_operator(path, op, operand, loc, depth))
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def _compile_operator(path: tuple[str, ...], op: str, operand: object, loc: tuple[str, ...],
                      depth: int) -> Filter:
    here = loc + (op,)
    if op == "$not":  # field-level $not, as in MongoDB: {"page": {"$not": {"$gt": 3}}}
        if depth > MAX_DEPTH:
            raise _fail(here, f"nested deeper than {MAX_DEPTH} levels")
        if not isinstance(operand, Mapping):
            raise _fail(here, f"expected an operator dict, got {_show(operand)}")
        return Not(_compile_field(path, operand, here, depth + 1))
    if op in ("$eq", "$ne"):
        return Field(path, op, _equality_operand(operand, here))
    if op in RANGES:
        value = _scalar(operand, here)
        if scalar_kind(value) not in ("num", "str"):
            raise _fail(here, f"expected a number or a string, got {_show(operand)}")
        return Field(path, op, value)
    if op in ("$in", "$nin"):
        if not isinstance(operand, (list, tuple, np.ndarray)):
            raise _fail(here, f"expected a list, got {_show(operand)}")
        return Field(path, op, tuple(_scalar(v, here + (f"[{i}]",)) for i, v in enumerate(operand)))
    if op == "$exists":
        if not isinstance(operand, (bool, np.bool_)):
            raise _fail(here, f"expected true or false, got {_show(operand)}")
        return Field(path, op, bool(operand))
    raise _fail(loc, f"unknown operator {op!r} (expected one of {', '.join(COMPARISONS)}, $not)")


def _equality_operand(value: object, loc: tuple[str, ...]) -> Scalar:
    if isinstance(value, (list, tuple)):
        raise _fail(loc, f"expected a scalar, got a list {_show(value)}; use $in to match any of several values")
    return _scalar(value, loc)


def _scalar(value: object, loc: tuple[str, ...]) -> Scalar:
    """``value`` as a plain str/int/float/bool/None (numpy scalars converted), or FilterError."""
    value, problem = plain_scalar(value)
    if problem:
        raise _fail(loc, problem)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value  # type: ignore[return-value]
    raise _fail(loc, f"expected a str, number, bool or None, got {type(value).__name__} {_show(value)}")
