"""The payload index as plain numpy arrays (for ``np.save(allow_pickle=False)``) and back.

``pl_meta``: [format, rows, columns]. Paths and keyword dictionaries are UTF-8 bytes plus
offsets: a path is its JSON list of keys; a dictionary value is a tag byte (``s`` str, ``t``
True, ``f`` False, ``n`` None) followed by the string's UTF-8. Column ``i``'s arrays are
``pl_c{i}_kw``, ``_num``, ``_lstart``, ``_lcount``, ``_lvid``, ``_lcode``, ``_lnum`` (those it
has) and ``_dict_bytes``, ``_dict_offsets``; list entries are saved compacted.
"""
from __future__ import annotations

import json

import numpy as np

from vindex.errors import CorruptionError
from vindex.filters.columns import Column, Keyword, Lists, compact_lists

FORMAT = 1
_TAGS = {True: b"t", False: b"f", None: b"n"}
_UNTAG = {ord("t"): True, ord("f"): False, ord("n"): None}


def _pack(items: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(items) + 1, np.int64)
    offsets[1:] = np.cumsum([len(b) for b in items])
    return np.frombuffer(b"".join(items), np.uint8).copy(), offsets


def _unpack(data: np.ndarray, offsets: np.ndarray) -> list[bytes]:
    raw = data.tobytes()
    return [raw[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def _encode_value(value: Keyword) -> bytes:
    return b"s" + value.encode("utf-8") if type(value) is str else _TAGS[value]  # type: ignore[index]


def _decode_value(item: bytes) -> Keyword:
    return item[1:].decode("utf-8") if item[:1] == b"s" else _UNTAG[item[0]]


def to_arrays(columns: dict[tuple[str, ...], Column], n: int) -> dict[str, np.ndarray]:
    """Every column trimmed to ``n`` rows, as plain arrays."""
    out: dict[str, np.ndarray] = {"pl_meta": np.array([FORMAT, n, len(columns)], np.int64)}
    out["pl_path_bytes"], out["pl_path_offsets"] = _pack(
        [json.dumps(list(path), ensure_ascii=False).encode("utf-8") for path in columns])
    for i, column in enumerate(columns.values()):
        name = f"pl_c{i}_"
        if column.kw is not None:
            out[name + "kw"] = column.kw[:n].copy()
        if column.num is not None:
            out[name + "num"] = column.num[:n].copy()
        if column.lists is not None:
            lists = compact_lists(column.lists)
            out[name + "lstart"], out[name + "lcount"] = lists.start[:n], lists.count[:n]
            out[name + "lvid"], out[name + "lcode"], out[name + "lnum"] = lists.vid, lists.code, lists.num
        values = list(column.values)
        out[name + "dict_bytes"], out[name + "dict_offsets"] = _pack([_encode_value(v) for v in values])
    return out


def from_arrays(arrays: dict[str, np.ndarray]) -> tuple[dict[tuple[str, ...], Column], int]:
    """``(columns, n)`` from ``to_arrays``'s output."""
    try:
        fmt, n, count = (int(x) for x in arrays["pl_meta"])
        if fmt != FORMAT:
            raise CorruptionError(f"payload index: unknown format {fmt} (expected {FORMAT})")
        paths = [tuple(json.loads(b)) for b in _unpack(arrays["pl_path_bytes"], arrays["pl_path_offsets"])]
        if len(paths) != count:
            raise CorruptionError(f"payload index: {len(paths)} paths for {count} columns")
        columns = {path: _column(arrays, f"pl_c{i}_", n) for i, path in enumerate(paths)}
    except (KeyError, ValueError, IndexError, TypeError) as e:
        raise CorruptionError(f"payload index: arrays are inconsistent ({type(e).__name__}: {e})") from None
    return columns, n


def _column(arrays: dict[str, np.ndarray], name: str, n: int) -> Column:
    column = Column(n)
    for value in (_decode_value(b) for b in _unpack(arrays[name + "dict_bytes"], arrays[name + "dict_offsets"])):
        column.code_of(value)
    if name + "kw" in arrays:
        column.kw = _checked(arrays[name + "kw"], np.int32, n, name + "kw")
        if column.kw.max(initial=0) > len(column.values) or column.kw.min(initial=0) < 0:
            raise CorruptionError(f"payload index: {name}kw holds codes outside its dictionary")
    if name + "num" in arrays:
        column.num = _checked(arrays[name + "num"], np.float64, n, name + "num")
    if name + "lstart" in arrays:
        vid = np.array(arrays[name + "lvid"], np.int64)
        size = len(vid)
        column.lists = Lists(_checked(arrays[name + "lstart"], np.int64, n, name + "lstart"),
                             _checked(arrays[name + "lcount"], np.int32, n, name + "lcount"),
                             vid, _checked(arrays[name + "lcode"], np.int32, size, name + "lcode"),
                             _checked(arrays[name + "lnum"], np.float64, size, name + "lnum"), size, 0)
    return column


def _checked(array: np.ndarray, dtype: type, length: int, name: str) -> np.ndarray:
    if array.shape != (length,):
        raise CorruptionError(f"payload index: {name} has shape {array.shape}, expected ({length},)")
    return np.array(array, dtype)  # a writable copy: set() writes in place
