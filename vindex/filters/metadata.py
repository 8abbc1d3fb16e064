"""One row's metadata: validation and its stored form (compact UTF-8 JSON)."""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from vindex.errors import InvalidInputError, PayloadTooLargeError

# metadata nested deeper than this is refused (a filter path can reach it, the JSON codec can
# recurse into it without risk)
MAX_METADATA_DEPTH = 32
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def check_metadata(meta: object, max_bytes: int) -> bytes:
    """Validate one row's metadata and return its canonical encoding: compact JSON (keys in the
    caller's order), UTF-8.

    ``meta`` is a dict with non-empty str keys not starting with '$'; values are str, int
    (int64), finite float, bool, None, lists of those scalars, or dicts of the same shape.
    numpy scalars and tuples are accepted and stored as their JSON equivalents.
    Raises ``InvalidInputError`` naming the offending key, ``PayloadTooLargeError`` when the
    encoding is over ``max_bytes``."""
    clean = meta if _plain_flat(meta) else _check_dict(meta, "metadata", 0)
    try:
        text = _ENCODER.encode(clean)
    except ValueError:  # a non-finite float the quick check let through: the full check names its key
        _check_dict(meta, "metadata", 0)
        raise
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate in a key or a string
        raise InvalidInputError(f"metadata: not valid Unicode text ({e.reason} at {e.object[e.start:e.end]!r})") \
            from None
    if len(encoded) > max_bytes:
        raise PayloadTooLargeError(f"metadata: {len(encoded)} bytes as JSON, over the limit of {max_bytes} "
                                   f"(max_metadata_bytes)")
    return encoded


def decode_metadata(data: bytes) -> dict:
    """The dict ``check_metadata`` encoded."""
    return json.loads(data)


_PLAIN = frozenset((str, int, float, bool, type(None)))


def _plain_flat(meta: object) -> bool:
    """Whether ``meta`` is the common case, checked here in a fraction of ``_check_dict``'s
    time: a dict of valid str keys to plain scalars (ints in int64; the encoder refuses
    non-finite floats)."""
    if type(meta) is not dict:
        return False
    for key, value in meta.items():
        kind = type(value)
        if type(key) is not str or not key or key[0] == "$" or kind not in _PLAIN:
            return False
        if kind is int and not INT64_MIN <= value <= INT64_MAX:
            return False
    return True


def _check_dict(meta: object, where: str, depth: int) -> dict:
    if not isinstance(meta, dict):
        raise InvalidInputError(f"{where}: expected a dict, got {type(meta).__name__}")
    if depth >= MAX_METADATA_DEPTH:
        raise InvalidInputError(f"{where}: nested deeper than {MAX_METADATA_DEPTH} levels")
    clean: dict[str, Any] = {}
    for key, value in meta.items():
        if not isinstance(key, str):
            raise InvalidInputError(f"{where}: keys must be str, got {type(key).__name__} {key!r}")
        if not key:
            raise InvalidInputError(f"{where}: empty key")
        if key.startswith("$"):
            raise InvalidInputError(f"{where}: key {key!r} starts with '$' (reserved for filter operators)")
        here = f"{where}.{key}"
        if isinstance(value, dict):
            clean[key] = _check_dict(value, here, depth + 1)
        elif isinstance(value, (list, tuple)):
            clean[key] = [_check_scalar(v, f"{here}[{i}]") for i, v in enumerate(value)]
        else:
            clean[key] = _check_scalar(value, here)
    return clean


def plain_scalar(value: object) -> tuple[object, str | None]:
    """``(value as a plain str/int/float/bool/None, None)`` (numpy scalars converted), or
    ``(value, why it is not one)`` for an int outside int64 or a non-finite float; other types
    are returned unchanged for the caller to name."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        return value, f"integer {value} is outside the int64 range"
    if isinstance(value, float) and not math.isfinite(value):
        return value, f"{value} is not a finite number"
    return value, None


def _check_scalar(value: object, where: str) -> object:
    value, problem = plain_scalar(value)
    if problem:
        raise InvalidInputError(f"{where}: {problem}")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple, dict)):
        raise InvalidInputError(f"{where}: lists may hold only str, numbers, bools and None, "
                                f"got a {type(value).__name__}")
    raise InvalidInputError(f"{where}: expected a str, number, bool, None, list or dict, "
                            f"got {type(value).__name__}")
