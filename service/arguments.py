"""Client-side checks of method arguments, and the request fields they become.

Both clients check ids, filters, ``include`` and per-row metadata / documents here, before
anything is sent, with the library's exceptions and messages.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from vindex import errors, validation

from .payloads import to_struct


def id_fields(ids: Any, what: str = "ids") -> dict:
    """``ids`` as request fields: ``{"str_ids": [...]}`` for str ids, else ``{"ids": [...]}``."""
    if isinstance(ids, str):
        raise errors.InvalidIdError(f"{what}: expected a sequence of ids, got one str {ids[:64]!r}; "
                                    f"pass [{ids[:64]!r}]")
    items = ids.tolist() if isinstance(ids, np.ndarray) and ids.dtype.kind in "UO" else \
        ids if isinstance(ids, (list, tuple)) else None
    if items and any(isinstance(i, str) for i in items):
        if not all(isinstance(i, str) for i in items):
            raise errors.InvalidIdError(f"{what}: mixes str and other ids; a collection holds one kind")
        return {"str_ids": list(items)}
    return {"ids": validation.ids(ids, what=what).tolist()}


def filter_struct(where: Any) -> Any:
    """A filter dict as a ``Struct``; a filter that is not a JSON object raises ``FilterError``."""
    if not isinstance(where, dict):
        raise errors.FilterError(f"filter: expected a dict, got {type(where).__name__}")
    try:
        return to_struct(where, "filter")
    except errors.InvalidInputError as e:
        raise errors.FilterError(str(e)) from None


def set_filter(request: Any, where: dict | None) -> None:
    """Set ``request.filter`` from a filter dict; None leaves it unset (no filter)."""
    if where is not None:
        request.filter.CopyFrom(filter_struct(where))


def include_names(include: Any) -> list[str]:
    """``include`` as a list of names (one str is one name)."""
    return [include] if isinstance(include, str) else list(include)


def rows_of(values: Any, n: int, what: str, kind: type) -> list | None:
    """Per-row ``values`` (None: no row has one), checked: one ``kind`` or None per row."""
    if values is None:
        return None
    if isinstance(values, (str, dict)) or not isinstance(values, (list, tuple)):
        raise errors.InvalidInputError(f"{what}: expected a list with one {kind.__name__} (or None) per row, "
                                       f"got {type(values).__name__}")
    if len(values) != n:
        raise errors.LengthMismatchError(f"{what}: {len(values)} entries for {n} ids; expected one per row")
    for i, v in enumerate(values):
        if v is not None and not isinstance(v, kind):
            raise errors.InvalidInputError(f"{what}[{i}]: expected a {kind.__name__} or None, got {type(v).__name__}")
    return list(values)
