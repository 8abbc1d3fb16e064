"""A replica's log of the shard writes it applied, by sequence number.

Each record is ``(seq u64, length u32, pickled write)``, appended before the write reaches the
index (so a write the index may have missed is always in the log) and flushed to the OS, which
survives the kill of the process; ``fsync=True`` (``durability="fsync"``) survives power loss
too. A peer that missed writes replays them from this log. Old records are dropped by
:meth:`trim` once every replica of the shard has them; the last one always stays, so that a
restarted replica knows where it is and can re-apply it.
"""
from __future__ import annotations

import os
import pickle
import struct
import threading
from typing import Any

_HEADER = struct.Struct("<QI")


class LogTrimmedError(RuntimeError):
    """The log no longer reaches back to the asked sequence number."""


class WriteLog:
    def __init__(self, path: str, fsync: bool = False):
        self.path, self.fsync = path, fsync
        self._lock = threading.Lock()
        self._offsets: list[tuple[int, int]] = []  # (seq, offset) of each record
        end = self._scan()
        self._file = open(path, "ab")
        if self._file.tell() != end:  # a record torn by a crash: it was never acknowledged
            self._file.truncate(end)
            self._file.seek(end)

    def _scan(self) -> int:
        """Index the records; returns where the last whole one ends."""
        if not os.path.exists(self.path):
            return 0
        size = os.path.getsize(self.path)
        pos = 0
        with open(self.path, "rb") as f:
            while pos + _HEADER.size <= size:
                f.seek(pos)
                seq, length = _HEADER.unpack(f.read(_HEADER.size))
                if pos + _HEADER.size + length > size:
                    break
                self._offsets.append((seq, pos))
                pos += _HEADER.size + length
        return pos

    @property
    def last_seq(self) -> int:
        return self._offsets[-1][0] if self._offsets else 0

    @property
    def first_seq(self) -> int:
        return self._offsets[0][0] if self._offsets else 0

    def append(self, seq: int, write: Any) -> None:
        body = pickle.dumps(write, protocol=5)
        with self._lock:
            pos = self._file.tell()
            self._file.write(_HEADER.pack(seq, len(body)) + body)
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
            self._offsets.append((seq, pos))

    def since(self, seq: int, limit: int | None = None) -> list[tuple[int, Any]]:
        """The records after ``seq`` (the first ``limit`` of them), oldest first."""
        with self._lock:
            if seq < self.last_seq and (not self._offsets or self.first_seq > seq + 1):
                raise LogTrimmedError(f"{self.path}: records {seq + 1}..{self.first_seq - 1} were trimmed")
            wanted = [(s, pos) for s, pos in self._offsets if s > seq][:limit]
            out = []
            with open(self.path, "rb") as f:
                for s, pos in wanted:
                    f.seek(pos)
                    _, length = _HEADER.unpack(f.read(_HEADER.size))
                    out.append((s, pickle.loads(f.read(length))))
            return out

    def last(self) -> tuple[int, Any] | None:
        """The newest record, or None."""
        if not self._offsets:
            return None
        return self.since(self._offsets[-1][0] - 1)[-1]

    def trim(self, keep_after: int) -> int:
        """Drop the records up to ``keep_after`` (every replica has them), keeping the last one;
        returns how many were dropped. The file is rewritten and renamed over the old one."""
        with self._lock:
            drop = sum(1 for s, _ in self._offsets[:-1] if s <= keep_after)
            if drop == 0:
                return 0
            start = self._offsets[drop][1]
            tmp = self.path + ".tmp"
            with open(self.path, "rb") as src, open(tmp, "wb") as dst:
                src.seek(start)
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            self._file.close()
            os.replace(tmp, self.path)
            self._file = open(self.path, "ab")
            self._offsets = [(s, pos - start) for s, pos in self._offsets[drop:]]
            return drop

    @property
    def bytes(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        with self._lock:
            self._file.close()
