"""Posting storage: the ``PostingStore`` protocol and its implementations.

A posting is a list of fixed-size records (see ``records``). Stores read many postings in one
call and apply appends, replacements and drops atomically together with one operation-log
record, so the in-memory state (id map, version map, heads) can always be rebuilt from the
last checkpoint plus the log. Every call names the I/O class it serves.
"""
from __future__ import annotations

from ..iosched import IOTargets
from .base import Change, InPlace, IOClass, PostingBatch, PostingStore
from .memory import MemoryStore

__all__ = ["Change", "InPlace", "IOClass", "PostingBatch", "PostingStore", "MemoryStore", "open_store"]


def open_store(kind: str, path: str, *, record_size: int, cache_bytes: int, create: bool,
               io_scheduler: str = "sla", targets: IOTargets = IOTargets(),
               resident_bytes: int | None = None, codes_bytes: int = 0) -> PostingStore:
    """Open (or create) the store of an index directory. ``io_scheduler``: ``sla`` (a queue
    and workers per I/O class) or ``fifo`` (one shared queue); ``targets``: the latencies its
    scheduler works to; ``resident_bytes``: postings the RocksDB store may keep in memory
    (None: a quarter of ``cache_bytes``); ``codes_bytes``: int8 codes of postings it may keep
    in memory (RocksDB store; see ``codes``)."""
    if kind == "memory":
        return MemoryStore(record_size)
    if kind == "blocks":
        from .blocks import BlockStore

        return BlockStore(path, record_size=record_size, cache_bytes=cache_bytes, create=create,
                          io_scheduler=io_scheduler, targets=targets)
    from .rocks import RocksStore  # rocksdict loads a large shared library; only when used

    return RocksStore(path, record_size=record_size, cache_bytes=cache_bytes, create=create,
                      io_scheduler=io_scheduler, targets=targets, resident_bytes=resident_bytes,
                      codes_bytes=codes_bytes)
