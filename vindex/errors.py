"""Exceptions raised by vindex.

Every problem with caller input is a ``ValueError`` subclass whose message says what was
expected and what was given, naming the offending ids where there are any.
"""
from __future__ import annotations

from typing import Iterable


class VindexError(Exception):
    """Base class of every vindex error."""


class InvalidInputError(VindexError, ValueError):
    """Bad caller input; nothing was changed."""


class DimensionError(InvalidInputError):
    """Vectors or queries of the wrong dimension or shape."""


class NonFiniteError(InvalidInputError):
    """NaN or infinite values in vectors or queries."""


class InvalidKError(InvalidInputError):
    """``k`` (or another search parameter) out of range."""


class InvalidIdError(InvalidInputError):
    """Ids that are not non-negative integers."""


class LengthMismatchError(InvalidInputError):
    """Ids and vectors of different lengths."""


class DuplicateIdError(InvalidInputError):
    """Ids repeated within one call, or ``add`` of ids already in the index."""

    def __init__(self, message: str, ids: Iterable[int | str]):
        super().__init__(message)
        self.ids = [i if isinstance(i, str) else int(i) for i in ids]


class IdExistsError(DuplicateIdError):
    """``add`` of ids already in the index (ALREADY_EXISTS over gRPC)."""


class FilterError(InvalidInputError):
    """A filter that is not valid in the filter language (an unknown operator, a value of the
    wrong type); the message names the path to the problem."""


class PayloadTooLargeError(InvalidInputError):
    """Metadata or a document over its per-row limit (``max_metadata_bytes``,
    ``max_document_bytes``)."""


class UnknownIdError(InvalidInputError, KeyError):
    """Ids that must exist (``set_metadata``) but are not live in the index."""

    def __init__(self, message: str, ids: Iterable[object] = ()):
        super().__init__(message)
        self.ids = list(ids)

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class IndexNotFoundError(InvalidInputError, FileNotFoundError):
    """``Index.open`` on a path that does not exist."""


class NotAnIndexError(InvalidInputError):
    """``Index.open`` on a directory that holds no vindex index."""


class IndexExistsError(InvalidInputError, FileExistsError):
    """``Index.create`` / ``Index.build`` over an existing index or a non-empty directory."""


class InvalidConfigError(InvalidInputError):
    """A configuration value out of range or of the wrong type."""


class IndexClosedError(VindexError, RuntimeError):
    """Use of an index after ``close()``."""


class IndexLockedError(VindexError, RuntimeError):
    """The index is already open in this or another process."""


class CorruptionError(VindexError):
    """Index files fail a checksum or a structural check (DATA_LOSS over gRPC)."""


class StorageError(VindexError, OSError):
    """The store could not read or write (disk full, I/O error). The write that raised it was
    not acknowledged; the index keeps working once the cause is gone (UNAVAILABLE over gRPC)."""


class ResourceExhaustedError(VindexError):
    """A tenant's quota or a class queue is full; retry later (RESOURCE_EXHAUSTED over gRPC)."""


class DeadlineExpired(VindexError):
    """The request's deadline passed before a worker reached it; it was not run."""


def preview(ids: Iterable[int], limit: int = 10) -> str:
    """``[3, 7, 9]`` or ``[3, 7, ... (+12 more)]`` for error messages."""
    ids = [i if isinstance(i, str) else int(i) for i in ids]
    head = ", ".join(repr(i) if isinstance(i, str) else str(i) for i in ids[:limit])
    more = f", ... (+{len(ids) - limit} more)" if len(ids) > limit else ""
    return f"[{head}{more}]"
