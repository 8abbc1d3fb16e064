"""A copy of an open replica's index, taken while it keeps serving, to seed a peer.

:func:`take` writes a consistent copy of an open :class:`vindex.Index` into a directory: the
RocksDB store through RocksDB's own checkpoint (hard links to its immutable table files plus
a copy of its live logs), the newest engine checkpoint (hard links: its files are never
rewritten) and the manifest. It holds the index's writers' lock and its checkpoint writer's
lock meanwhile (no commit, and no checkpoint truncating the log the copy still needs), which
takes milliseconds; the copy reopens as the index was, replaying its log from that checkpoint.

The files travel to the peer in pieces through actor calls (:func:`files` lists them, the
peer reads each with :func:`read_piece`), so source and target need not share a disk.
Only the RocksDB store (the default) has a live checkpoint; other stores raise
:class:`SnapshotUnsupportedError` and their replicas catch up from the write log alone.
"""
from __future__ import annotations

import os
import shutil
from typing import Callable

from vindex import Index, checkpoint

#: Bytes a peer fetches per call.
PIECE_BYTES = 8 << 20


class SnapshotUnsupportedError(RuntimeError):
    """The index's store cannot be copied while it is open."""


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(src, dst)


def take(index: Index, dest: str) -> None:
    """Write a consistent copy of ``index`` (open, maybe being written) into ``dest`` (new).
    The caller keeps the index's own writes (its replica's) out meanwhile."""
    from rocksdict import Checkpoint

    eng = index._engine
    if eng.config.store != "rocksdb":
        raise SnapshotUnsupportedError(f"store {eng.config.store!r}: only a rocksdb index can be copied while open")
    os.makedirs(dest)
    with eng.lock, eng.checkpoints._write_lock:
        Checkpoint(eng.store._db).create_checkpoint(os.path.join(dest, os.path.basename(eng.store.path)))
        seq = checkpoint.latest(eng.path)
        if seq is not None:
            name = checkpoint._name(seq)
            src = os.path.join(eng.path, checkpoint.DIR, name)
            dst = os.path.join(dest, checkpoint.DIR, name)
            os.makedirs(dst)
            for f in os.listdir(src):
                _link_or_copy(os.path.join(src, f), os.path.join(dst, f))
        for f in os.listdir(eng.path):
            if os.path.isfile(os.path.join(eng.path, f)):
                shutil.copy2(os.path.join(eng.path, f), os.path.join(dest, f))


def files(root: str) -> list[tuple[str, int]]:
    """``(path relative to root, bytes)`` of every file under ``root``."""
    out = []
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            out.append((os.path.relpath(p, root), os.path.getsize(p)))
    return out


def read_piece(root: str, rel: str, offset: int, size: int = PIECE_BYTES) -> bytes:
    with open(os.path.join(root, rel), "rb") as f:
        f.seek(offset)
        return f.read(size)


def write_piece(root: str, rel: str, offset: int, data: bytes) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "r+b" if offset else "wb") as f:
        f.seek(offset)
        f.write(data)


def fetch(listing: list[tuple[str, int]], read: Callable[[str, int], bytes], dest: str) -> None:
    """Rebuild under ``dest`` the files of ``listing`` (from :func:`files`), each read in
    pieces with ``read(path, offset)``."""
    for rel, size in listing:
        write_piece(dest, rel, 0, b"")
        offset = 0
        while offset < size:
            piece = read(rel, offset)
            if not piece:
                raise OSError(f"snapshot file {rel} ended at {offset} of {size} bytes")
            write_piece(dest, rel, offset, piece)
            offset += len(piece)
