"""``compile_filter`` for filters seen again: a pipeline searches with the same few filter dicts
over and over, and compiling one (validation, normalised operands) costs more than the rest of a
small filtered search's Python."""
from __future__ import annotations

import copy
import threading
from typing import Mapping

from vindex.filters.language import Filter, compile_filter

#: Distinct filter dicts remembered (oldest out first).
MAX_FILTERS = 256

_compiled: dict[str, tuple[object, Filter]] = {}
_lock = threading.Lock()


def compile_cached(obj: Mapping | Filter) -> Filter:
    """``compile_filter(obj)``, remembered by the dict's ``repr``. A hit also needs the dict
    equal to the one compiled (a copy, kept apart from later changes to the caller's): ``repr``
    tells ``1``, ``1.0`` and ``True`` apart, ``==`` tells apart values whose ``repr`` alone
    could coincide (types of other libraries)."""
    if isinstance(obj, Filter):
        return obj
    key = repr(obj)
    found = _compiled.get(key)
    if found is not None and found[0] == obj:
        return found[1]
    f = compile_filter(obj)  # raises on a bad filter: nothing is remembered
    with _lock:
        while len(_compiled) >= MAX_FILTERS:
            del _compiled[next(iter(_compiled))]
        _compiled[key] = (copy.deepcopy(obj), f)
    return f
