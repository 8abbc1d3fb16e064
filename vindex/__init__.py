"""vindex: an updatable, disk-resident approximate nearest-neighbour index.

SPANN/SPFresh design: in-memory heads navigated by a graph, posting lists on disk (RocksDB),
numba kernels for every hot loop.

    >>> import vindex
    >>> index = vindex.Index.build("/tmp/idx", vectors)        # doctest: +SKIP
    >>> ids, dists = index.search(queries, k=10)                # doctest: +SKIP
"""
from __future__ import annotations

from .config import IndexConfig
from .errors import (CorruptionError, DeadlineExpired, DimensionError, DuplicateIdError, FilterError, IdExistsError,
                     IndexClosedError, IndexExistsError, IndexLockedError, IndexNotFoundError, InvalidConfigError,
                     InvalidIdError, InvalidInputError, InvalidKError, LengthMismatchError, NonFiniteError,
                     NotAnIndexError, PayloadTooLargeError, ResourceExhaustedError, StorageError, UnknownIdError,
                     VindexError)
from .gcpause import freeze_heap
from .index import Index
from .results import SearchResult
from .verify import VerifyReport

__version__ = "0.1.0"


def warmup() -> None:
    """Compile (or load from cache) every numba kernel, so the first query is not slow."""
    from vindex import native

    native.warmup()


def __getattr__(name: str):
    # the gRPC client loads grpc and protobuf, so only when asked for
    if name in ("Client", "Collection", "ServiceError"):
        from vindex.service import client, status

        return {"Client": client.Client, "Collection": client.Collection, "ServiceError": status.ServiceError}[name]
    if name in ("AsyncClient", "AsyncCollection"):
        from vindex.service import aio_client

        return getattr(aio_client, name)
    raise AttributeError(f"module 'vindex' has no attribute {name!r}")


__all__ = [
    "Index", "Client", "Collection", "AsyncClient", "AsyncCollection", "ServiceError", "IndexConfig", "SearchResult",
    "warmup", "freeze_heap",
    "VindexError", "InvalidInputError", "DimensionError", "NonFiniteError", "InvalidKError",
    "InvalidIdError", "LengthMismatchError", "DuplicateIdError", "IdExistsError", "IndexNotFoundError",
    "NotAnIndexError", "IndexExistsError", "IndexLockedError", "InvalidConfigError", "IndexClosedError",
    "CorruptionError", "StorageError", "ResourceExhaustedError", "DeadlineExpired", "VerifyReport",
    "FilterError", "PayloadTooLargeError", "UnknownIdError",
]
