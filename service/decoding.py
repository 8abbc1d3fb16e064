"""Request decoding: ids and vectors out of ``vindex.v1`` messages, checked.

A request names records by ``ids`` (uint64) or ``str_ids``, one kind per request; the library
refuses the kind its collection does not hold.

Vectors come either as little-endian float32 ``bytes`` (``vectors``, ``queries``) or as their
``repeated float`` twins (``float_vectors``, ``float_queries``); a request sets one of the two.
The number of rows is known from the request, not guessed from the length: ``len(ids)`` for an
upsert, ``nq`` for a search (0 leaves it to the length, for clients that do not send it). A
length that is not exactly rows x dim values is refused, so float64 bytes never pass as twice
the rows.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from vindex import errors

from .status import RequestTooLargeError

MAX_ID = np.iinfo(np.int64).max


def decode_ids(raw: Sequence[int], max_rows: int, what: str = "ids") -> np.ndarray:
    """``raw`` (uint64 ids) as int64, at most ``max_rows`` of them, each at most 2^63 - 1."""
    n = len(raw)
    if n > max_rows:
        raise RequestTooLargeError(f"{what}: at most {max_rows} per request, got {n}")
    ids = np.array(raw, dtype=np.uint64)
    if n and int(ids.max()) > MAX_ID:
        bad = ids[ids > MAX_ID]
        raise errors.InvalidIdError(f"{what}: expected ids <= 2^63-1, got {errors.preview(bad.tolist())}")
    return ids.astype(np.int64)


def decode_request_ids(request: Any, max_rows: int) -> np.ndarray | list[str]:
    """The request's ``ids`` (int64, as :func:`decode_ids`) or ``str_ids`` (a list of str)."""
    if len(request.str_ids):
        if len(request.ids):
            raise errors.InvalidIdError("ids and str_ids: set one of them, not both")
        if len(request.str_ids) > max_rows:
            raise RequestTooLargeError(f"str_ids: at most {max_rows} per request, got {len(request.str_ids)}")
        return list(request.str_ids)
    return decode_ids(request.ids, max_rows)


def values_sent(buf: bytes, floats: Sequence[float]) -> int:
    """How many float32 values a request's bytes field and its ``repeated float`` twin carry
    (whole or not): what sizes a search before it is decoded."""
    return len(buf) // 4 + len(floats)


def decode_vectors(buf: bytes, floats: Sequence[float], dim: int, rows: int | None, what: str,
                   max_rows: int, rows_are: str = "") -> np.ndarray:
    """``rows x dim`` float32 from ``buf`` (the bytes field ``what``) or ``floats`` (its
    ``float_<what>`` twin). ``rows`` None: as many rows as the data holds. ``rows_are`` says
    where ``rows`` comes from in messages (``"ids"``, ``"nq"``)."""
    twin = f"float_{what}"
    if len(buf) and len(floats):
        raise errors.InvalidInputError(f"{what} and {twin}: set one of them, not both")
    if dim == 0:
        raise errors.DimensionError(f"{what}: dim must be set to the vectors' dimension, got 0")
    field, sent, unit, width = (twin, len(floats), "floats", 1) if len(floats) else (what, len(buf), "bytes", 4)
    row = width * dim
    if sent % row:
        raise errors.DimensionError(f"{field}: {sent} {unit} is not a whole number of {dim}-dimensional float32 "
                                    f"rows ({row} {unit} each)")
    n = sent // row
    if n > max_rows:
        raise RequestTooLargeError(f"{field}: at most {max_rows} rows per request, got {n}")
    if rows is not None and n != rows:
        # a whole number of rows, but not the number sent: most likely another element type
        hint = "; float64 data? send little-endian float32" if unit == "bytes" and n == 2 * rows else ""
        raise errors.LengthMismatchError(
            f"{field}: {sent} {unit} for {_count(rows, rows_are)} of dimension {dim}; expected exactly "
            f"{rows * row} ({rows} x {dim}{' x 4' if width == 4 else ''}){hint}")
    if len(floats):
        return np.array(floats, dtype=np.float32).reshape(-1, dim)
    return np.frombuffer(buf, dtype="<f4").reshape(-1, dim)


def _count(rows: int, rows_are: str) -> str:
    if rows_are == "ids":
        return f"{rows} id{'s' if rows != 1 else ''}"
    return f"{rows_are} {rows}" if rows_are else f"{rows} rows"

