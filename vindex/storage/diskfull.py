"""What a store needs to live through a full disk: recognising "out of space" in RocksDB's
messages, measuring the room that is back, and a gate that lets the store replace its RocksDB
handle while no reader or writer is using it.

RocksDB stops taking writes after a write-ahead-log append fails ("Writer has previous
error"); its own recovery resumes only once more than its largest memtable budget is free,
which a small volume never has. The store therefore reopens its handle itself once room is
back (see ``RocksStore._writable``).
"""
from __future__ import annotations

import errno
import os
import threading
from contextlib import contextmanager
from typing import Iterator

#: RocksDB message fragments and the errno they stand for.
_NO_SPACE = (("No space left", errno.ENOSPC), ("Disk quota exceeded", errno.EDQUOT))
#: Errnos that mean "out of space": the disk is full, or the user's quota is.
NO_SPACE_ERRNOS = frozenset(code for _, code in _NO_SPACE)


def no_space_errno(message: str) -> int | None:
    """ENOSPC or EDQUOT when ``message`` (a RocksDB error) reports running out of space."""
    for fragment, code in _NO_SPACE:
        if fragment in message:
            return code
    return None


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on the file system holding ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def wal_bytes(path: str) -> int:
    """Bytes of RocksDB write-ahead logs in ``path``: about what reopening writes out as
    tables before it takes writes again."""
    total = 0
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.name.endswith(".log"):
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:  # removed meanwhile by RocksDB
                    pass
    return total


class HandleGate:
    """Shared use of a handle by many threads (``with gate:``); exclusive use while it is
    replaced (``with gate.exclusive():``).

    A user waits only while a replacement runs (rare: after a write failure, once space is
    back); otherwise entering and leaving cost one uncontended lock each (a plain context
    manager: a generator-based one would cost three times as much on every read).
    """

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._users = 0
        self._replacing = False

    def __enter__(self) -> None:
        with self._cv:
            while self._replacing:
                self._cv.wait()
            self._users += 1

    def __exit__(self, *exc: object) -> None:
        with self._cv:
            self._users -= 1
            if not self._users:
                self._cv.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """No shared user runs inside; new ones wait until it ends."""
        with self._cv:
            while self._replacing:
                self._cv.wait()
            self._replacing = True
            self._cv.wait_for(lambda: not self._users)
        try:
            yield
        finally:
            with self._cv:
                self._replacing = False
                self._cv.notify_all()
