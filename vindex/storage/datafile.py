"""The block store's data file: opened with O_DIRECT (buffered with page-cache drops where
O_DIRECT is refused), grown in steps, written in pieces, synced, and read back to check that
the blocks of commits not known synced reached the disk.

Writes go out in pieces of at most ``write_piece`` bytes, each after the searches' reads in
flight (``before_piece``), so a search waits behind one piece, not a whole commit. The file
grows by fallocate (ftruncate where that is unsupported) and the new size is fsynced before any
log record can point past the old one.
"""
from __future__ import annotations

import errno
import logging
import os
from typing import Callable

import numpy as np

from vindex import native  # its kernels load on first use

from . import diskio
from .blockmap import BLOCK, EMPTY, runs
from .blockread import ReadJob, read_table
from .diskio import Aligned, failed

log = logging.getLogger("vindex.storage.blocks")

GROW_MIN_BLOCKS = 1024    # grow the data file by at least 4 MiB (and 1/8 of its size)
VERIFY_BLOCKS = 4096      # blocks read back at a time when opening checks unsynced commits
#: Default bytes per pwrite: a search's reads wait behind one piece, not a whole commit.
WRITE_PIECE = 256 * 1024
_ZEROS = bytes(BLOCK)     # padding to a whole block


class DataFile:
    """The file of 4 KiB blocks. ``direct``: False skips O_DIRECT; None tries it."""

    def __init__(self, path: str, *, direct: bool | None, write_piece: int):
        self.path = path
        self.write_piece = write_piece
        self.direct = False
        self.fd = -1
        if direct is not False:
            try:
                self.fd = diskio.open_direct(path)
                self.direct = True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                log.warning("block store %s: O_DIRECT refused (EINVAL); using buffered I/O with "
                            "posix_fadvise(DONTNEED)", os.path.dirname(path))
        if not self.direct:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.capacity = os.fstat(self.fd).st_size // BLOCK  # a partial last block (never written by us) is ignored
        self.unsynced_blocks = 0  # data blocks written since the last sync (> 0: the file is dirty)
        self._wbuf = Aligned(1 << 20)  # commit data (the store's write lock)

    def close(self) -> None:
        """Close the file (idempotent); its data is as durable as the last sync left it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def grow(self, blocks: int) -> None:
        """Make the file hold at least ``blocks`` blocks, durably."""
        if blocks <= self.capacity:
            return
        new = max(blocks, self.capacity + max(GROW_MIN_BLOCKS, self.capacity // 8))
        try:
            try:
                os.posix_fallocate(self.fd, self.capacity * BLOCK, (new - self.capacity) * BLOCK)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(self.fd, new * BLOCK)
            os.fsync(self.fd)  # the new size is durable before any log record points past the old one
        except OSError as exc:
            raise failed(exc, f"block store {self.path}", "growing the file") from None
        self.capacity = new

    def write_postings(self, pieces: list[list], chosen: list[np.ndarray],
                       before_piece: Callable[[], None]) -> tuple[list[np.ndarray], list[bytes]]:
        """Write each posting's new bytes (``pieces``, joined) to its chosen blocks; returns
        each posting's checksums of those blocks, and the bytes of its partly filled last
        block (empty if that block is full)."""
        total = sum(c.shape[0] for c in chosen)
        if total == 0:
            return [EMPTY] * len(chosen), [b""] * len(chosen)
        buf = self._write_buffer(total * BLOCK)
        parts: list[bytes] = []  # one join and one copy: per piece, numpy would cost more
        ends: list[tuple[int, int]] = []  # per posting: where its bytes end in the join, its tail's length
        size = 0
        for posting in pieces:
            parts.extend(posting)
            size += sum(len(p) for p in posting)
            ends.append((size, size % BLOCK))
            pad = -size % BLOCK
            if pad:
                parts.append(_ZEROS[:pad])
                size += pad
        joined = b"".join(parts)
        buf.arr[:len(joined)] = np.frombuffer(joined, dtype=np.uint8)
        blocks = np.concatenate(chosen)
        sums = np.empty(total, dtype=np.uint32)
        native.checksum.block_sums(buf.arr, total, sums)
        self.write_blocks(blocks, buf, before_piece)
        tails = [joined[end - tail:end] for end, tail in ends]
        return np.split(sums, np.cumsum([c.shape[0] for c in chosen[:-1]]).astype(np.int64)), tails

    def _write_buffer(self, size: int) -> Aligned:
        if self._wbuf.size < size:
            self._wbuf = Aligned(max(size, 2 * self._wbuf.size))
        return self._wbuf

    def write_blocks(self, blocks: np.ndarray, buf: Aligned, before_piece: Callable[[], None]) -> None:
        """Write ``buf`` to ``blocks`` in order: pwrites of at most ``write_piece`` bytes per
        run of consecutive blocks."""
        starts, lens = runs(blocks)
        b = blocks.astype(np.int64)
        try:
            for s, n in zip(starts.tolist(), lens.tolist()):
                pos, off, size = s * BLOCK, int(b[s]) * BLOCK, n * BLOCK
                done = 0
                while done < size:  # in pieces, each after the searches' reads in flight
                    before_piece()
                    end = pos + min(size, done + self.write_piece)
                    done += diskio.pwrite(self.fd, buf.mv[pos + done:end], off + done)
                if not self.direct:
                    os.posix_fadvise(self.fd, off, size, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            raise failed(exc, f"block store {self.path}", "writing postings") from None
        self.unsynced_blocks += blocks.shape[0]

    def advise(self, offsets: np.ndarray, lengths: np.ndarray) -> None:
        """Without O_DIRECT: drop these ranges from the page cache (no hidden cache)."""
        for off, n in zip(offsets.tolist(), lengths.tolist()):
            os.posix_fadvise(self.fd, off, n, os.POSIX_FADV_DONTNEED)

    def unwritten(self, blocks: np.ndarray, sums: np.ndarray) -> np.ndarray:
        """Mask of ``blocks`` (sorted) whose data on disk fails ``sums`` (or lies past the end
        of the file), read in pieces of ``VERIFY_BLOCKS``."""
        bad = blocks >= self.capacity
        buf = Aligned(min(blocks.shape[0], VERIFY_BLOCKS) * BLOCK)
        got = np.empty(VERIFY_BLOCKS, dtype=np.uint32)
        inside = np.flatnonzero(~bad)
        for lo in range(0, inside.shape[0], VERIFY_BLOCKS):
            idx = inside[lo:lo + VERIFY_BLOCKS]
            try:
                ReadJob(self.fd, buf, read_table(blocks[idx]), None)()
            except OSError as exc:
                raise failed(exc, f"block store {self.path}", "checking the data of unsynced commits") from None
            native.checksum.block_sums(buf.arr, idx.shape[0], got)
            bad[idx] = got[:idx.shape[0]] != sums[idx]
        return bad
