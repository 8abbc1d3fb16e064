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

    A 1-D input of length ``dim`` is one row; an empty one (``[]``) is no rows.
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
        arr = arr.reshape(1, -1) if arr.size else arr.reshape(0, dim)  # [] is no rows
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


def positive_int(value: Any, name: str, *, upper: int, lower: int = 1) -> int:
    if type(value) is int and lower <= value <= upper:  # the common case, without the ABC check
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidKError(f"{name}: expected an integer in {lower}..{upper}, got {value!r}")
    value = int(value)
    if not lower <= value <= upper:
        raise InvalidKError(f"{name}: expected an integer in {lower}..{upper}, got {value}")
    return value


def k(value: Any) -> int:
    return positive_int(value, "k", upper=MAX_K)


def non_negative_float(value: Any, name: str) -> float:
    out = float("nan")
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        try:
            out = float(value)  # an int past 1e308 overflows; np.isfinite refuses ints and Fractions
        except (OverflowError, TypeError, ValueError):
            pass
    if not np.isfinite(out) or out < 0:
        raise InvalidKError(f"{name}: expected a finite number >= 0, got {value!r}")
    return out


#: Largest squared norm of a stored vector or query under l2 and ip: distances and inner
#: products of such rows stay finite in float32 (|a - b|^2 <= 2|a|^2 + 2|b|^2 < 3.4e38).
MAX_SQUARED_NORM = 1e37


_native: Any = None


def _kernels() -> Any:
    """``vindex.native``, imported on the first search or write (numba loads then, not on
    ``import vindex``), then kept: an import statement per call costs a small search ~0.3 us."""
    global _native
    if _native is None:
        from vindex import native
        _native = native
    return _native


def search_rows(x: Any, dim: int, *, unit: bool, what: str) -> np.ndarray:
    """``x`` as ``vectors`` makes it, then scaled to unit length (``unit``: the cosine
    metric) or checked as ``bounded_rows`` does, the checks in one kernel pass
    (``native.rows``); ``unit_rows`` and ``bounded_rows`` name a failing row."""
    native = _kernels()
    if not (type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous and 1 <= x.ndim <= 2
            and x.shape[-1] == dim and x.size):
        x = vectors(x, dim, what=what)
        if not x.shape[0]:
            return x
    elif x.ndim == 1:
        x = x.reshape(1, dim)
    out = np.empty(x.shape if unit else (0, 0), np.float32)  # (x itself may be read-only)
    if native.rows.check_rows(x, unit, MAX_SQUARED_NORM, out) < 0:
        return out if unit else x
    x = vectors(x, dim, what=what)  # the specific error: non-finite values,
    return unit_rows(x, what=what) if unit else bounded_rows(x, what=what)  # a zero row, a norm too large


def bounded_rows(x: np.ndarray, *, what: str) -> np.ndarray:
    """``x`` unchanged if every row's squared norm is at most ``MAX_SQUARED_NORM``."""
    with np.errstate(over="ignore"):
        sq = np.einsum("ij,ij->i", x, x)
    over = ~(sq <= MAX_SQUARED_NORM)  # inf and NaN sums count as over
    if over.any():
        rows = np.flatnonzero(over)
        raise NonFiniteError(
            f"{what}: rows {preview(rows)} have squared norms above {MAX_SQUARED_NORM:g}; distances "
            f"between such vectors overflow float32 (scale the vectors down)")
    return x


def unit_rows(x: np.ndarray, *, what: str) -> np.ndarray:
    """Finite rows ``x (n, d) float32`` scaled to unit length (cosine metric), their norms
    summed in float64 (``native.rows``); zero rows are an error."""
    out = np.empty_like(x)
    if _kernels().rows.check_rows(x, True, 0.0, out) < 0:
        return out
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        raise NonFiniteError(f"{what}: expected finite float32 values, got NaN/Inf in rows "
                             f"{preview(np.flatnonzero(~finite))}")
    zero = np.flatnonzero(~x.any(axis=1))
    raise InvalidInputError(f"{what}: cosine metric needs non-zero vectors, got zero vectors in rows {preview(zero)}")


def seconds(value: Any, what: str) -> float:
    """A positive number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not value > 0:
        raise InvalidInputError(f"{what}: expected a positive number of seconds, got {value!r}")
    return float(value)


def check_eps(value: Any) -> float:
    """The search pruning factor ``eps``: a non-negative float, ``inf`` for no pruning."""
    if isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and value == np.inf:
        return float("inf")
    return non_negative_float(value, "eps")


def rerank(value: Any, k: int) -> int:
    """A search's ``rerank``: 0 (float32 postings only) or at least ``k`` candidates."""
    n = positive_int(value, "rerank", upper=1 << 16, lower=0)
    if 0 < n < k:
        raise InvalidInputError(f"rerank: expected 0 (no codes) or at least k={k} candidates, got {value!r}")
    return n
