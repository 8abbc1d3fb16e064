"""Types shared by every posting store."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import numpy as np

from ..iosched import IOClass, IOScheduler

__all__ = ["IOClass", "IOScheduler", "InPlace", "PostingBatch", "ReadBuffers", "Change", "PostingStore"]


@dataclass
class InPlace:
    """Postings a read with ``in_place=True`` left where the store keeps them in memory:
    posting ``pids[index[j]]`` is ``rows[starts[j]:ends[j]]``. The rows stay as they are
    until ``release()``, which the reader must call once done with them."""

    rows: np.ndarray  # (R, record words) uint32
    index: np.ndarray  # int64 positions in the read's pids
    starts: np.ndarray  # int64
    ends: np.ndarray  # int64
    release: Callable[[], None]


@dataclass
class PostingBatch:
    """Postings read in one call: records of posting ``i`` are records
    ``offsets[i]:offsets[i+1]`` of ``data`` (offsets count records, not bytes). With
    ``in_place`` set, ``data`` holds only the other postings, in the order of the read's pids.

    ``data`` is a uint8 array that may live in a per-thread buffer: it stays valid until the
    same thread's next read from the same store.
    """

    data: np.ndarray
    offsets: np.ndarray  # int64, postings in data + 1
    in_place: InPlace | None = None


class ReadBuffers(threading.local):
    """A growable per-thread byte buffer for read results."""

    def __init__(self) -> None:
        self.buf = np.empty(0, dtype=np.uint8)

    def get(self, size: int) -> np.ndarray:
        if self.buf.shape[0] < size:
            self.buf = np.empty(max(size, 2 * self.buf.shape[0], 1 << 16), dtype=np.uint8)
        return self.buf


@dataclass
class Change:
    """One atomic store update."""

    appends: dict[int, bytes] = field(default_factory=dict)   # pid -> records to append
    replaces: dict[int, bytes] = field(default_factory=dict)  # pid -> new full content
    drops: list[int] = field(default_factory=list)            # postings to delete
    log: bytes | None = None                                  # operation-log record
    # metadata and documents (``payload`` keys): a value to put, or None to delete the key;
    # (the RocksDB and memory stores take them; see ``payloads.STORES``)
    payload: dict[bytes, bytes | None] = field(default_factory=dict)
    # called between the pieces of a large write, GIL released while it waits: the engine
    # lets running searches finish there (see ``Engine.yield_to_searches``)
    pause: Callable[[], object] | None = None


class PostingStore(Protocol):
    """What the engine needs from a posting store."""

    record_size: int
    #: Queues, deadlines and per-tenant I/O quotas of the reads (None: reads run at once).
    scheduler: "IOScheduler | None"

    def read(self, pids: np.ndarray, io: IOClass, *, deadline: float | None = None,
             tenant: str = "default", in_place: bool = False) -> PostingBatch:
        """Read postings ``pids`` (any order, no duplicates) in one call, queued by class
        ``io`` for ``tenant``. A request still queued at ``deadline`` (``time.monotonic()``
        seconds) is dropped: ``iosched.DeadlineExpired``. The bytes land in a buffer of the
        calling thread. ``in_place``: the store may leave postings it keeps in memory where
        they are (``PostingBatch.in_place``) instead of copying them."""

    def commit(self, change: Change, io: IOClass) -> int:
        """Apply ``change`` atomically; returns the log sequence number (0 if no log)."""

    def bulk_load(self, pids: np.ndarray, records: np.ndarray, offsets: np.ndarray,
                  io: IOClass = IOClass.BACKGROUND) -> None:
        """Write fresh postings in bulk (index build); durable on return."""

    def lengths(self) -> np.ndarray:
        """Records per posting, indexed by pid (0 for absent postings)."""

    def fragments(self, pids: np.ndarray) -> np.ndarray:
        """Separately stored pieces of each posting (a read pays one lookup per piece;
        appends add pieces, a replace folds them back into one)."""

    def log_since(self, seq: int, io: IOClass = IOClass.BACKGROUND) -> Iterator[tuple[int, bytes]]:
        """Log records with sequence number > ``seq``, in order."""

    def continue_after(self, seq: int, io: IOClass = IOClass.BACKGROUND) -> None:
        """Number later log records above ``seq`` (the checkpoint's), even if the log was
        truncated down to nothing."""

    def truncate_log(self, upto: int, io: IOClass = IOClass.BACKGROUND) -> None:
        """Forget log records with sequence number <= ``upto`` (covered by a checkpoint)."""

    def sync(self, io: IOClass = IOClass.UPDATE) -> None:
        """Make every committed change durable against power loss."""

    def stats(self) -> dict:
        """Store-specific counters for ``Index.stats()``."""

    def close(self) -> None:
        """Release resources; committed changes stay durable."""
