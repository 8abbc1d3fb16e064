"""One row's metadata: validation and its stored form (compact UTF-8 JSON)."""
from __future__ import annotations

import json
import math
from json.encoder import encode_basestring  # what the encoder below quotes strings with
from typing import Any, Callable, Sequence

import numpy as np

from vindex.errors import InvalidInputError, PayloadTooLargeError
from vindex.filters.flat import FlatGroup, flat_groups

# metadata nested deeper than this is refused (a filter path can reach it, the JSON codec can
# recurse into it without risk)
MAX_METADATA_DEPTH = 32
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def check_metadata(meta: object, max_bytes: int) -> bytes:
    """``checked_metadata(meta, max_bytes)``'s encoding."""
    return checked_metadata(meta, max_bytes)[0]


def checked_metadata(meta: object, max_bytes: int) -> tuple[bytes, dict]:
    """Validate one row's metadata and return its canonical encoding: compact JSON (keys in the
    caller's order), UTF-8, with the dict it encodes (a copy of ``meta``, numpy scalars and
    tuples made plain).

    ``meta`` is a dict with non-empty str keys not starting with '$'; values are str, int
    (int64), finite float, bool, None, lists of those scalars, or dicts of the same shape.
    numpy scalars and tuples are accepted and stored as their JSON equivalents.
    Raises ``InvalidInputError`` naming the offending key, ``PayloadTooLargeError`` when the
    encoding is over ``max_bytes``."""
    # a copy either way: what is indexed must be what was encoded, whatever the caller's dict becomes
    clean = dict(meta) if _plain_flat(meta) else _check_dict(meta, "metadata", 0)  # type: ignore[call-overload]
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
    return encoded, clean


def encode_batch(rows: Sequence[object], max_bytes: int) -> tuple[list[bytes | None], list[FlatGroup]] | None:
    """``(each row's check_metadata encoding (None for a None row), the rows' flat groups)``
    when every row is a flat dict of plain scalars (see flat.py) and valid; otherwise None,
    and the caller checks row by row (which names the problem of an invalid row).

    Each column is checked and turned into JSON text at once; a row's text is then its
    group's template filled in: the same bytes as ``check_metadata``'s."""
    groups = flat_groups(rows)
    if groups is None:
        return None
    encoded = encode_groups(groups, len(rows), max_bytes)
    return None if encoded is None else (encoded, groups)


def encode_groups(groups: list[FlatGroup], n: int, max_bytes: int) -> list[bytes | None] | None:
    """The ``check_metadata`` encoding of each of ``n`` rows in ``groups`` (None for rows in
    none); None when a row is invalid."""
    out: list[bytes | None] = [None] * n
    for group in groups:
        encoded = _encode_group(group, max_bytes)
        if encoded is None:
            return None
        if len(encoded) == n:
            out = encoded  # type: ignore[assignment]
        else:
            for pos, value in zip(group.positions.tolist(), encoded):
                out[pos] = value
    return out


_BOOL_JSON = {True: "true", False: "false"}
_JSON_OF: dict[type, Callable[[Any], str]] = {
    str: encode_basestring, int: int.__repr__, float: float.__repr__, bool: _BOOL_JSON.__getitem__,
    type(None): lambda _: "null"}


def _encode_group(group: FlatGroup, max_bytes: int) -> list[bytes] | None:
    """The rows of ``group`` as ``check_metadata`` encodes them; None when one is invalid."""
    if not all(type(key) is str and key and key[0] != "$" for key in group.keys):
        return None
    fields, slots = [], []
    for column, kinds in zip(group.columns, group.kinds):
        if int in kinds:
            ints = column if len(kinds) == 1 else [v for v in column if type(v) is int]
            if not (INT64_MIN <= min(ints) and max(ints) <= INT64_MAX):
                return None
        if float in kinds:
            floats = column if len(kinds) == 1 else [v for v in column if type(v) is float]
            if not all(map(math.isfinite, floats)):
                return None
        # ints and floats go into the template as they are: "%d" and "%r" write what the
        # encoder writes (int.__repr__, float.__repr__); other values as their JSON text
        (kind,) = kinds if len(kinds) == 1 else (None,)
        if kind is int or kind is float:
            slots.append("%d" if kind is int else "%r")
            fields.append(column)
        else:
            slots.append("%s")
            fields.append(list(map(_JSON_OF[kind], column)) if kind is not None
                          else [_JSON_OF[type(v)](v) for v in column])
    # the JSON encoder's own output: keys quoted alike, "," and ":" without spaces
    template = "{" + ",".join(encode_basestring(key).replace("%", "%%") + ":" + slot
                              for key, slot in zip(group.keys, slots)) + "}"
    rows = list(map(template.__mod__, zip(*fields))) if fields else [template] * len(group.positions)
    try:
        encoded = list(map(str.encode, rows))
    except UnicodeEncodeError:  # a lone surrogate
        return None
    if encoded and max(map(len, encoded)) > max_bytes:
        return None
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
