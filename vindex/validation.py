"""Input validation: coerce caller arrays and raise specific errors before anything changes."""
from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .errors import (DimensionError, DuplicateIdError, InvalidIdError, InvalidInputError,
                     InvalidKError, LengthMismatchError, NonFiniteError, preview)

#: Largest k a search may ask for.
MAX_K = 10_000


def vectors(x: Any, dim: int, *, what: str = "vectors", allow_1d: bool = True) -> np.ndarray:
    """``x`` as a C-contiguous ``(n, dim) float32`` array of finite values.

    A 1-D input of length ``dim`` is one row.
    """
    if type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous:
        # fast path for the common case (one query on the search path): checks only
        arr = x.reshape(1, -1) if x.ndim == 1 and allow_1d else x
        if arr.ndim == 2 and arr.shape[1] == dim and np.isfinite(arr).all():
            return arr
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged nested lists and the like
        raise DimensionError(f"{what}: expected an (n, {dim}) array of numbers, got {type(x).__name__}: {exc}") from None
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise InvalidInputError(f"{what}: expected numbers, got dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise InvalidInputError(f"{what}: expected real numbers, got dtype {arr.dtype}")
    if arr.ndim == 1 and allow_1d:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2:
        raise DimensionError(f"{what}: expected a 2-D (n, {dim}) array, got shape {arr.shape}")
    if arr.shape[1] != dim:
        raise DimensionError(f"{what}: expected dimension {dim}, got {arr.shape[1]} (shape {arr.shape})")
    with np.errstate(over="ignore"):  # overflow becomes inf, reported just below
        out = np.ascontiguousarray(arr, dtype=np.float32)
    if out.size and not np.isfinite(out).all():
        # float64 inputs may overflow float32; report rows either way
        bad_rows = np.flatnonzero(~np.isfinite(out).all(axis=1))
        raise NonFiniteError(
            f"{what}: expected finite float32 values, got NaN/Inf (after float32 conversion) in rows {preview(bad_rows)}")
    return out


def matrix(x: Any, *, what: str = "vectors") -> np.ndarray:
    """``x`` as a ``(n, dim) float32`` array whose dimension is taken from ``x`` itself."""
    try:
        shape = np.shape(x)
    except Exception:  # ragged nested lists
        shape = None
    if shape is None or len(shape) != 2 or shape[1] < 1:
        raise DimensionError(f"{what}: expected a 2-D (n, dim) array with dim >= 1, got shape {shape}")
    return vectors(x, int(shape[1]), what=what, allow_1d=False)


def ids(x: Any, *, what: str = "ids") -> np.ndarray:
    """``x`` as a 1-D int64 array of non-negative, distinct ids."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        x = [x]
    try:
        arr = np.asarray(x)
    except Exception:
        raise InvalidIdError(f"{what}: expected a sequence of non-negative integers, got {type(x).__name__}") from None
    if arr.ndim != 1:
        raise InvalidIdError(f"{what}: expected a 1-D sequence of integers, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise InvalidIdError(f"{what}: expected integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and (arr > np.iinfo(np.int64).max).any():
        big = arr[arr > np.iinfo(np.int64).max]
        raise InvalidIdError(f"{what}: expected ids below 2**63, got {preview(big)}")
    out = arr.astype(np.int64, copy=False)
    if (out < 0).any():
        raise InvalidIdError(f"{what}: expected non-negative integers, got {preview(out[out < 0])}")
    out = np.ascontiguousarray(out)
    if out.size > 1:
        srt = np.sort(out)
        dup = srt[1:][srt[1:] == srt[:-1]]
        if dup.size:
            dup = np.unique(dup)
            raise DuplicateIdError(f"{what}: ids must be distinct within one call, got duplicates {preview(dup)}", dup)
    return out


def same_length(id_arr: np.ndarray, vec_arr: np.ndarray) -> None:
    if id_arr.shape[0] != vec_arr.shape[0]:
        raise LengthMismatchError(
            f"expected as many ids as vectors, got {id_arr.shape[0]} ids and {vec_arr.shape[0]} vectors")


def positive_int(value: Any, name: str, *, upper: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidKError(f"{name}: expected an integer in 1..{upper}, got {value!r}")
    value = int(value)
    if not 1 <= value <= upper:
        raise InvalidKError(f"{name}: expected an integer in 1..{upper}, got {value}")
    return value


def k(value: Any) -> int:
    return positive_int(value, "k", upper=MAX_K)


def non_negative_float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) or value < 0:
        raise InvalidKError(f"{name}: expected a finite number >= 0, got {value!r}")
    return float(value)


def unit_rows(x: np.ndarray, *, what: str) -> np.ndarray:
    """Rows scaled to unit length (cosine metric); zero rows are an error."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    if not norms.all():
        zero = np.flatnonzero(norms == 0)
        raise InvalidInputError(f"{what}: cosine metric needs non-zero vectors, got zero vectors in rows {preview(zero)}")
    return x / norms[:, None]
