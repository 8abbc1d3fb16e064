"""Named collections in one data directory, each its own :class:`vindex.Index`.

::

    <data>/collections/<name>/                 one index directory per collection
    <data>/collections/.dropping-<name>-<n>/   a dropped one whose files are being removed

A collection in use is pinned by the calls that use it; dropping one refuses new calls at once
and closes the index only after the calls already running on it have finished, so no search
ever reads a store that is being closed. A drop first renames the directory out of the
served namespace, so that a drop cut short leaves no half-deleted collection: the next start
removes the leftovers.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import itertools
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import vindex
from vindex import errors

from .status import CollectionExistsError, CollectionNotFoundError

log = logging.getLogger("vindex.service")

#: Names of collections and tenants. Use ``fullmatch``: ``match`` with ``$`` accepted a
#: trailing newline ("docs\n" was a valid name).
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SUBDIR = "collections"
#: What ``Index.open`` raises when a collection's own files are bad (checksums, a damaged
#: write-ahead log, a manifest that is invalid or of an unsupported format version): that
#: collection is marked damaged and the others are served. Anything else (the index locked
#: by another process, a bad runtime setting) stops the server.
DAMAGED = (errors.CorruptionError, errors.NotAnIndexError)
DROPPING_PREFIX = ".dropping-"


@dataclasses.dataclass(frozen=True)
class Sharding:
    """``vindex serve --ray``: every collection is a :class:`vindex.cluster.ShardedIndex` of
    ``shards`` x ``replicas`` actors on the Ray cluster at ``address`` ("auto": the local one)."""
    address: str
    shards: int = 2
    replicas: int = 1

    @property
    def marker(self) -> str:
        """The file whose presence says a collection's creation finished."""
        return "cluster.json"

    def open(self, path: str) -> Any:
        from vindex.cluster import ShardedIndex

        return ShardedIndex.open(path, ray_address=self.address)

    def create(self, path: str, name: str, dim: int, metric: str, id_type: str | None, vectors: Any,
               metadata: Any, documents: Any, config: dict) -> Any:
        import numpy as np

        from vindex.cluster import ShardedIndex

        index = ShardedIndex.create(name, dim, metric, shards=self.shards, replicas=self.replicas, path=path,
                                    ray_address=self.address, id_type=id_type, **config)
        if vectors is not None:
            try:
                index.upsert(np.arange(len(vectors)), vectors, metadata=metadata, documents=documents)
            except BaseException:
                index.close()
                raise
        return index


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        shown = repr(name) if len(name) <= 80 else f"{name[:64]!r}... ({len(name)} characters)"
        raise errors.InvalidInputError(
            f"collection name: expected 1-64 characters from [A-Za-z0-9_.-] starting with a letter "
            f"or digit, got {shown}")
    return name


def _lock_dir(data_dir: str) -> int | None:
    """Hold ``<data_dir>/server.lock`` so a second server cannot share the directory (it would
    delete, as unfinished, a collection the first one is creating). Released at process exit."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the indexes' own locks still refuse a second opener
        return None
    fd = os.open(os.path.join(data_dir, "server.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise errors.IndexLockedError(f"data directory {data_dir} is in use by another vindex server") from None
    return fd


class _Entry:
    """A collection's state: open (``index``), damaged (``broken``) or being created, and
    the count of calls using it."""

    def __init__(self, name: str, index: vindex.Index | None, broken: Exception | None = None):
        self.name, self.index = name, index
        self.broken = broken  # why a collection on disk could not be opened (corruption)
        self.creating = False  # the name is reserved by a create in progress
        self.users = 0
        self.dropping = False

    def damaged_error(self) -> errors.CorruptionError:
        return errors.CorruptionError(
            f"collection {self.name!r} is damaged (drop it, or stop the server and run "
            f"'vindex verify'): {self.broken}")


class Collections:
    """The registry of open collections under ``data_dir``. Thread-safe."""

    def __init__(self, data_dir: str, on_open: Callable[[vindex.Index], None] | None = None,
                 sharding: Sharding | None = None, **runtime: Any):
        """``on_open`` is called with each index opened or created (before any call uses it);
        with ``sharding``, collections are sharded over Ray actors."""
        self.root = os.path.join(os.path.abspath(data_dir), SUBDIR)
        self._runtime = runtime
        self._sharding = sharding
        self._on_open = on_open or (lambda index: None)
        self._entries: dict[str, _Entry] = {}
        self._cond = threading.Condition()
        os.makedirs(self.root, exist_ok=True)
        self._lock_fd = _lock_dir(os.path.dirname(self.root))

    def open_all(self) -> list[str]:
        """Open every collection found on disk; returns their names. One whose files are
        damaged (``DAMAGED``) stays closed and answers every call naming it with DATA_LOSS."""
        for name in sorted(os.listdir(self.root)):
            path = os.path.join(self.root, name)
            if name.startswith(DROPPING_PREFIX) and os.path.isdir(path):
                log.warning("removing %s: what a drop that did not finish left behind", path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            if not NAME_RE.fullmatch(name) or not os.path.isdir(path):
                continue
            if not os.path.exists(os.path.join(path, self._sharding.marker if self._sharding else "vindex.json")):
                log.warning("removing %s: a collection whose creation did not finish", path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            try:
                index = (self._sharding.open(path) if self._sharding  # an Index's replay logs its progress
                         else vindex.Index.open(path, progress="log", **self._runtime))
                self._entries[name] = _Entry(name, self._opened(index))
            except DAMAGED as exc:  # serve the others; calls on it get DATA_LOSS
                log.error("collection %s is damaged and stays closed: %s", name, exc)
                self._entries[name] = _Entry(name, None, broken=exc)
        return sorted(self._entries)

    def _opened(self, index: vindex.Index) -> vindex.Index:
        try:
            self._on_open(index)
        except BaseException:
            index.close()
            raise
        return index

    def names(self) -> list[str]:
        with self._cond:
            return sorted(n for n, e in self._entries.items() if not e.dropping)

    def has(self, name: str) -> bool:
        """Whether a collection of this name exists (no lock: one dict lookup)."""
        entry = self._entries.get(name)
        return entry is not None and not entry.dropping

    def open_indexes(self) -> Iterator[tuple[str, vindex.Index]]:
        """``(name, index)`` of each open collection, pinned while the caller holds it."""
        for name in self.names():
            try:
                with self.use(name) as index:
                    yield name, index
            except errors.VindexError:  # dropped meanwhile, or damaged: nothing to read
                continue

    def create(self, name: str, *, dim: int, metric: str, config: dict, if_not_exists: bool = False,
               vectors: Any = None, id_type: str | None = None, metadata: Any = None,
               documents: Any = None) -> vindex.Index:
        """Create collection ``name``: empty (of ``id_type`` ids, None: fixed by the first write),
        or bulk-built over ``vectors`` (ids 0..n-1), with their ``metadata`` and ``documents`` if given."""
        check_name(name)
        if config.get("store", "rocksdb") != "rocksdb":
            raise errors.InvalidConfigError(
                f"config store: a served collection must be persistent ('rocksdb'), got {config['store']!r}")
        with self._cond:
            entry = self._entries.get(name)
            while entry is not None and entry.creating:  # another call is creating it: wait
                self._cond.wait()
                entry = self._entries.get(name)
            if entry is not None and entry.broken is not None and not entry.dropping:
                raise entry.damaged_error()
            if entry is not None and not entry.dropping:
                index = entry.index
                same_ids = id_type is None or index.id_type in (None, id_type)
                if if_not_exists and (index.dim, index.metric) == (dim, metric) and same_ids:
                    return index
                detail = "" if not if_not_exists else (
                    f" with dim {index.dim} and metric {index.metric!r}, not {dim} and {metric!r}" if same_ids
                    else f" with {index.id_type} ids, not {id_type}")
                raise CollectionExistsError(f"collection {name!r} already exists{detail}")
            if entry is not None:
                raise errors.IndexLockedError(f"collection {name!r} is being dropped; retry")
            # reserve the name while the (slow) creation runs outside the lock
            self._entries[name] = reserved = _Entry(name, None)
            reserved.creating = reserved.dropping = True  # calls naming it get NOT_FOUND meanwhile
        path = os.path.join(self.root, name)
        try:
            if os.path.exists(path):  # left behind by a failed create
                shutil.rmtree(path)
            settings = {**self._runtime, **config}
            index = self._opened(
                self._sharding.create(path, name, dim, metric, id_type, vectors, metadata, documents, settings)
                if self._sharding
                else vindex.Index.create(path, dim=dim, metric=metric, id_type=id_type, **settings) if vectors is None
                else vindex.Index.build(path, vectors, metric=metric, metadata=metadata, documents=documents,
                                        **settings))
        except BaseException:
            with self._cond:
                del self._entries[name]
                self._cond.notify_all()
            raise
        with self._cond:
            self._entries[name] = _Entry(name, index)
            self._cond.notify_all()
        return index

    @contextmanager
    def use(self, name: str) -> Iterator[vindex.Index]:
        """Pin collection ``name`` for the duration of a call."""
        check_name(name)
        with self._cond:
            entry = self._entries.get(name)
            if entry is None or entry.dropping:
                raise CollectionNotFoundError(f"no collection named {name!r}")
            if entry.broken is not None:
                raise entry.damaged_error()
            entry.users += 1
        try:
            yield entry.index
        finally:
            with self._cond:
                entry.users -= 1
                if entry.users == 0:
                    self._cond.notify_all()

    def drop(self, name: str) -> bool:
        """Remove a collection and its files; False if there is none of that name."""
        check_name(name)
        with self._cond:
            entry = self._entries.get(name)
            if entry is None or entry.dropping:
                return False
            entry.dropping = True
            while entry.users:
                self._cond.wait()
        try:
            if entry.index is not None:
                entry.index.close()
            shutil.rmtree(self._move_out(name))
        finally:
            with self._cond:
                del self._entries[name]
        return True

    def _move_out(self, name: str) -> str:
        """Rename collection ``name``'s directory to a fresh ``.dropping-<name>-<n>``; returns it."""
        for n in itertools.count(1):
            moved = os.path.join(self.root, f"{DROPPING_PREFIX}{name}-{n}")
            if not os.path.exists(moved):
                os.rename(os.path.join(self.root, name), moved)
                return moved
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Wait for running calls, then close every collection (checkpointing each)."""
        with self._cond:
            entries = list(self._entries.values())
            for e in entries:
                e.dropping = True
            while any(e.users for e in entries):
                self._cond.wait()
        for e in entries:
            if e.index is not None:
                try:
                    e.index.close()
                except errors.StorageError as exc:  # a full disk: one line, not a traceback
                    log.warning("closing collection %s: %s (what it acknowledged is in its write-ahead "
                                "log and replays at the next start)", e.name, exc)
                except Exception:
                    log.exception("closing collection %s", e.name)
        with self._cond:
            self._entries.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the data directory's lock
            self._lock_fd = None
