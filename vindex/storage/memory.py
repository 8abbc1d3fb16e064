"""In-memory posting store for tests: same semantics as the RocksDB store, no persistence."""
from __future__ import annotations

import threading
from typing import Iterator

import numpy as np

from .base import Change, IOClass, PostingBatch
from .directory import Lengths


class MemoryStore:
    """Postings as lists of byte chunks in a dict."""

    def __init__(self, record_size: int):
        self.record_size = record_size
        self.scheduler = None  # reads run at once
        self._chunks: dict[int, list[bytes]] = {}
        self._lengths = Lengths()
        self._log: list[tuple[int, bytes]] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._payload: dict[bytes, bytes] = {}
        self.reads = 0

    def read_payload(self, keys: list[bytes]) -> list[bytes | None]:
        with self._lock:
            return [self._payload.get(k) for k in keys]

    def read(self, pids: np.ndarray, io: IOClass, *, deadline: float | None = None,
             tenant: str = "default", in_place: bool = False) -> PostingBatch:
        parts: list[bytes] = []
        offsets = np.zeros(len(pids) + 1, dtype=np.int64)
        with self._lock:
            for i, pid in enumerate(pids):
                chunks = self._chunks.get(int(pid), ())
                parts.extend(chunks)
                offsets[i + 1] = offsets[i] + sum(len(c) for c in chunks) // self.record_size
            self.reads += len(pids)
        return PostingBatch(np.frombuffer(bytearray(b"".join(parts)), dtype=np.uint8), offsets)

    def commit(self, change: Change, io: IOClass) -> int:
        with self._lock:
            for pid in change.drops:
                self._chunks.pop(pid, None)
                self._lengths.ensure(pid)
                self._lengths[pid] = 0
            for pid, data in change.replaces.items():
                self._chunks[pid] = [data]
                self._lengths.ensure(pid)
                self._lengths[pid] = len(data) // self.record_size
            for pid, data in change.appends.items():
                self._chunks.setdefault(pid, []).append(data)
                self._lengths.ensure(pid)
                self._lengths[pid] += len(data) // self.record_size
            for key, value in change.payload.items():
                if value is None:
                    self._payload.pop(key, None)
                else:
                    self._payload[key] = value
            if change.log is None:
                return 0
            self._seq += 1
            self._log.append((self._seq, change.log))
            return self._seq

    def bulk_load(self, pids: np.ndarray, records: np.ndarray, offsets: np.ndarray,
                  io: IOClass = IOClass.BACKGROUND) -> None:
        for i, pid in enumerate(pids):
            data = records[offsets[i]:offsets[i + 1]].tobytes()
            self.commit(Change(replaces={int(pid): data}), IOClass.BACKGROUND)

    def lengths(self) -> np.ndarray:
        return self._lengths.array()

    def fragments(self, pids: np.ndarray) -> np.ndarray:
        return np.array([len(self._chunks.get(int(p), ())) for p in pids], dtype=np.int64)

    def log_since(self, seq: int, io: IOClass = IOClass.BACKGROUND) -> Iterator[tuple[int, bytes]]:
        return iter([(s, r) for s, r in self._log if s > seq])

    def continue_after(self, seq: int, io: IOClass = IOClass.BACKGROUND) -> None:
        self._seq = max(self._seq, seq)

    def truncate_log(self, upto: int, io: IOClass = IOClass.BACKGROUND) -> None:
        with self._lock:
            self._log = [(s, r) for s, r in self._log if s > upto]

    def sync(self, io: IOClass = IOClass.UPDATE) -> None:
        pass

    def stats(self) -> dict:
        return {"kind": "memory", "postings": len(self._chunks), "reads": self.reads}

    def close(self) -> None:
        pass
