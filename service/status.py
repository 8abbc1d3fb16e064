"""Library exceptions <-> gRPC status codes, both ways.

The server answers each library error with the status code the design lists and the error's
message; the exception's class name (and any ids it names) travel in trailing metadata, so the
client re-raises the very exception the embedded library would have raised.
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable

import grpc

from vindex import errors
from vindex.errors import ResourceExhaustedError
from vindex.storage.diskfull import NO_SPACE_ERRNOS

#: Trailing-metadata keys carrying the library exception.
ERROR_KEY = "vindex-error"
IDS_KEY = "vindex-error-ids"
STR_IDS_KEY = "vindex-error-str-ids-bin"  # a JSON list of the string ids (binary: any UTF-8)
#: Characters of ids sent in trailing metadata: gRPC refuses trailers over 8 KiB (soft limit)
#: and replaces the whole status, so only the first ids that fit are named.
MAX_IDS_CHARS = 4096

#: Most specific first: the first class an exception is an instance of decides its code.
_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (errors.IdExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (errors.IndexExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (errors.IndexNotFoundError, grpc.StatusCode.NOT_FOUND),
    (errors.InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.CorruptionError, grpc.StatusCode.DATA_LOSS),
    (errors.StorageError, grpc.StatusCode.UNAVAILABLE),
    (errors.IndexClosedError, grpc.StatusCode.UNAVAILABLE),
    (errors.IndexLockedError, grpc.StatusCode.FAILED_PRECONDITION),
    (ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
]


class CollectionNotFoundError(errors.IndexNotFoundError):
    """No collection of that name on the server (NOT_FOUND)."""


class CollectionExistsError(errors.IndexExistsError):
    """A collection of that name already exists (ALREADY_EXISTS)."""


class RequestTooLargeError(errors.InvalidInputError):
    """More rows, queries or results than the server accepts in one request (RESOURCE_EXHAUSTED).
    A ``k`` above the server's ``max_k`` is an ``InvalidKError`` (INVALID_ARGUMENT) instead."""


class QuotaExceededError(ResourceExhaustedError):
    """A tenant is over its query or row rate, or at its calls in flight (RESOURCE_EXHAUSTED);
    the message names the tenant and the quota. ``retry_after_s``, when known, is how long until
    the call would pass (the server sends it as ``grpc-retry-pushback-ms``)."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServiceError(errors.VindexError):
    """A gRPC failure that is not a library error (UNAVAILABLE, DEADLINE_EXCEEDED, ...).

    ``code`` is the :class:`grpc.StatusCode`."""

    def __init__(self, message: str, code: grpc.StatusCode):
        super().__init__(message)
        self.code = code


def out_of_space(exc: BaseException) -> bool:
    """A full disk (or quota): RESOURCE_EXHAUSTED, writes resume once space is freed."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS


def library_error(exc: Exception) -> Exception:
    """``exc``, or for a plain ``OSError`` of a full disk (a checkpoint or a new collection's
    files failing to write) the ``StorageError`` the library raises for one."""
    if out_of_space(exc) and not isinstance(exc, errors.StorageError):
        where = f" ({exc.filename})" if exc.filename else ""
        return errors.StorageError(exc.errno, f"{exc.strerror}{where}")
    return exc


def code_for(exc: BaseException) -> grpc.StatusCode:
    """The status code for a library exception; INTERNAL for anything unexpected."""
    if isinstance(exc, RequestTooLargeError) or isinstance(exc, errors.StorageError) and out_of_space(exc):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


#: Longest status message sent: a message repeating a long caller input (a name, config_json)
#: must not push the trailers over gRPC's metadata limit, which would replace the status.
MAX_MESSAGE_CHARS = 1024


#: Said of every out-of-space error that does not say it already.
DISK_FULL = "the disk is full; writes resume once space is freed"


def message(exc: object) -> str:
    """The exception's message for the status details, shortened to ``MAX_MESSAGE_CHARS``."""
    text, more = str(exc), " ... (shortened)"
    if isinstance(exc, BaseException) and out_of_space(exc) and "disk is full" not in text:
        text = f"{text}: {DISK_FULL}"
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS - len(more)] + more


def trailers(exc: BaseException) -> tuple[tuple[str, str | bytes], ...]:
    """Metadata naming the exception class (and its ids) for :func:`to_exception`."""
    md: list[tuple[str, str | bytes]] = [(ERROR_KEY, type(exc).__name__)]
    ids = getattr(exc, "ids", None)
    if ids:
        if all(isinstance(i, str) for i in ids):  # any UTF-8: JSON in a binary header
            md.append((STR_IDS_KEY, json.dumps(_first_fitting(ids, json.dumps, 2)).encode()))
        else:
            md.append((IDS_KEY, ",".join(_first_fitting([str(int(i)) for i in ids], str, 1))))
    return tuple(md)


def _first_fitting(ids: list, encode: Callable[[Any], str], sep: int) -> list:
    """The first ``ids`` whose encodings joined by ``sep``-byte separators fit in ``MAX_IDS_CHARS``."""
    out, size = [], -sep
    for i in ids:
        size += len(encode(i).encode()) + sep
        if size > MAX_IDS_CHARS:
            break
        out.append(i)
    return out


_KNOWN = {cls.__name__: cls for cls in (
    errors.DimensionError, errors.NonFiniteError, errors.InvalidKError, errors.InvalidIdError,
    errors.LengthMismatchError, errors.DuplicateIdError, errors.IdExistsError, errors.InvalidConfigError,
    errors.InvalidInputError, errors.CorruptionError, errors.StorageError, errors.IndexLockedError,
    errors.IndexClosedError,
    errors.IndexNotFoundError, errors.IndexExistsError, errors.NotAnIndexError,
    CollectionNotFoundError, CollectionExistsError, RequestTooLargeError, ResourceExhaustedError,
    QuotaExceededError, errors.FilterError, errors.PayloadTooLargeError, errors.UnknownIdError,
)}


#: How an ``OSError`` (a ``StorageError``) prints its errno: the client raises one with it.
_ERRNO = re.compile(r"\[Errno (\d+)\] (.*)", re.DOTALL)


def to_exception(err: grpc.RpcError) -> Exception:
    """The library exception a failed call stands for (``ServiceError`` when there is none)."""
    code, message = err.code(), err.details() or ""
    md = dict(err.trailing_metadata() or ())
    cls = _KNOWN.get(md.get(ERROR_KEY, ""))
    if cls is not None:
        if issubclass(cls, (errors.DuplicateIdError, errors.UnknownIdError)):
            return _with_ids(cls, message, md)
        numbered = _ERRNO.fullmatch(message) if issubclass(cls, errors.StorageError) else None
        if numbered:
            return cls(int(numbered[1]), numbered[2])
        return cls(message)
    return ServiceError(f"{code.name}: {message}", code)


def _with_ids(cls: type, message: str, md: dict) -> Exception:
    """``cls(message, ids)`` with the ids the trailers name (ints, or strs for string ids)."""
    if STR_IDS_KEY in md:
        try:
            ids = json.loads(md[STR_IDS_KEY])
        except ValueError:
            ids = []
        exc = cls(message, [])
        exc.ids = list(ids)  # set after: DuplicateIdError's constructor makes ints of its ids
        return exc
    return cls(message, [int(i) for i in md.get(IDS_KEY, "").split(",") if i])
