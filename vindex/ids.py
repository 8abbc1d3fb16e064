"""The ids callers pass, int or str, and the internal integer ids ("exts") the engine keeps.

An int-id index keeps the caller's integers as they are; a str-id index maps each string to an
integer of its own (``strids``). Which kind an index holds is fixed at build/create
(``id_type``) or by its first write; ids of the other kind are an ``InvalidIdError``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import strids, validation
from .errors import DuplicateIdError, InvalidIdError, preview
from .state import State

ID_TYPES = ("int", "str")


def check_id_type(id_type: Any) -> str | None:
    if id_type is not None and id_type not in ID_TYPES:
        raise InvalidIdError(f"id_type: expected 'int', 'str' or None, got {id_type!r}")
    return id_type


def kind_of(ids: Any) -> str | None:
    """``"str"`` or ``"int"`` by the ids' first element, None when there are none (the
    checks of each kind then validate every element)."""
    if isinstance(ids, str):
        return "str"
    if isinstance(ids, np.ndarray):
        if ids.size == 0:
            return None
        return "str" if ids.dtype.kind in "US" or isinstance(ids.reshape(-1)[0], str) else "int"
    if isinstance(ids, (list, tuple)):
        return None if not ids else "str" if isinstance(ids[0], str) else "int"
    return "int"


class Resolved:
    """A call's ids: ``exts`` (internal, int64; -1 for str ids never seen by a read), the
    caller's ``strs`` (str-id indexes) and the ``new`` strings a write registers."""

    def __init__(self, kind: str, exts: np.ndarray, strs: list[str] | None = None):
        self.kind, self.exts, self.strs = kind, exts, strs
        self.new: list[str] = []

    def __len__(self) -> int:
        return self.exts.shape[0] if self.strs is None else len(self.strs)

    def user(self, mask: np.ndarray) -> list:
        """The caller's ids where ``mask`` is set (for error messages)."""
        return [s for s, m in zip(self.strs, mask.tolist()) if m] if self.strs is not None else self.exts[mask].tolist()


def resolve(id_type: str | None, table: strids.StrIds, ids: Any, *, what: str = "ids") -> Resolved:
    """Validate ``ids`` against the index's kind (``id_type``, None while not fixed) and look
    the str ones up in ``table`` (-1: never seen)."""
    given = kind_of(ids)
    kind = id_type or given or "int"
    if given is not None and given != kind:
        first = ids if isinstance(ids, str) else np.asarray(ids, dtype=object).reshape(-1)[0]
        raise InvalidIdError(f"{what}: this index holds {kind} ids, got {type(first).__name__} {first!r}")
    if kind == "int":
        return Resolved("int", validation.ids(ids, what=what))
    strs = strids.check([ids] if isinstance(ids, str) else np.asarray(ids, dtype=object).reshape(-1).tolist()
                        if isinstance(ids, np.ndarray) else ids)
    if len(set(strs)) != len(strs):
        seen: set[str] = set()
        dup = sorted({s for s in strs if s in seen or seen.add(s)})  # type: ignore[func-returns-value]
        raise DuplicateIdError(f"{what}: ids must be distinct within one call, got duplicates {preview(dup)}", dup)
    return Resolved("str", table.lookup(strs), strs)


def plan_new(table: strids.StrIds, resolved: Resolved) -> None:
    """Give the str ids a write introduces their internal ids (caller holds the writers' lock)."""
    if resolved.strs is not None:
        resolved.exts, resolved.new = table.plan(resolved.strs)


def to_user(state: State, exts: np.ndarray) -> np.ndarray:
    """Internal ids as the caller's: int64 as they are (-1 padding), or an object array of
    str (None padding) in a str-id index."""
    return state.strids.names(exts) if state.id_type == "str" else exts
