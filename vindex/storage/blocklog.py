"""The block store's log of map changes and its snapshots: opening (newest snapshot, then the
log replayed), appending a commit's record, the caller's records read back, and rotation to a
new generation (``map.<gen>`` + ``log.<gen>``; formats in ``blockmap``).

Each log record (the map delta, the caller's log bytes, a gapless record number ``lsn``, how
many records up to it are not known synced, and a CRC32) is a buffered write, so it survives a
process crash once appended; an fsync of the log (``BlockStore.sync``) makes it survive power
loss. A damaged record at the very end of the log is a commit that was never acknowledged: it
is cut off. A damaged record that intact ones follow, a damaged snapshot, or a map pointing
past the end of the data file raise ``CorruptionError`` naming the file. A power loss can keep
a log record without the blocks it names (O_DIRECT writes may sit in the disk's volatile
cache): so opening reads back the blocks that records after the last one known synced wrote
and the map still points at, and ends the log before the first record whose blocks fail their
checksums, as RocksDB ends its WAL at a torn record. Nothing a sync covered is cut.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Iterator

from ..errors import CorruptionError, StorageError
from ..files import fsync_dir, write_atomic
from . import diskio
from .blockmap import (LOG_HEAD, LOG_MAGIC, MAX_UNSYNCED, OLD_FORMAT, OLD_MAGICS, BlockMap, Entries,
                       FormatError, LogRecord, Snapshot, decode_record, decode_snapshot, durable_lsn,
                       encode_record, encode_snapshot, read_log, replay)
from .datafile import DataFile
from .diskio import failed

log = logging.getLogger("vindex.storage.blocks")


class BlockLog:
    """The log of one store directory ``path``: its generation, open file and end, the
    record numbers (``lsn`` written, ``synced_lsn`` fsynced, ``claimed_lsn`` said synced in
    the log), the caller's sequence number ``seq`` and where its records lie (``user``).
    Not thread-safe: the block store calls it under its locks."""

    def __init__(self, path: str, record_size: int):
        self.path = path
        self.record_size = record_size
        self.fd = -1
        self.gen = self.end = self.lsn = self.synced_lsn = self.claimed_lsn = self.seq = 0
        self.cut_seq: int | None = None  # see ``BlockStore.continue_after``
        self.user: list[tuple[int, int, int]] = []  # (seq, offset, size) of the caller's records

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def close(self) -> None:
        """Close the log file (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # --- open ---------------------------------------------------------------------------------
    def load(self, create: bool, data: DataFile) -> BlockMap:
        """Open the newest generation: its snapshot plus the log records whose data blocks are
        on disk (the rest cut off), made durable; returns the map."""
        gens = sorted(int(n[4:]) for n in os.listdir(self.path) if n.startswith("map.") and n[4:].isdigit())
        if not gens:
            if not create:
                raise CorruptionError(f"block store {self.path}: no map snapshot (map.<gen>) found")
            self._init_files()
            gens = [0]
        self.gen = gen = gens[-1]
        snap_path, log_path = self._file(f"map.{gen}"), self._file(f"log.{gen}")
        try:
            with open(snap_path, "rb") as f:
                snap = decode_snapshot(f.read(), self.record_size)
            if snap.gen != gen:
                raise FormatError(f"holds generation {snap.gen}")
        except FormatError as exc:
            raise CorruptionError(f"block store snapshot {snap_path}: {exc}") from None
        records, good_end = self._read_log(log_path, gen, snap.lsn)
        landed, bmap = self._replay(snap, records, data)
        lost = len(records) - len(landed)
        cut = "a torn final log record of an unacknowledged commit"
        if lost:
            good_end = records[len(landed)].offset
            cut = (f"{lost} log records from lsn {records[len(landed)].lsn} on, whose "
                   f"data blocks never reached the disk (a power loss before they were fsynced)")
        lsn = landed[-1].lsn if landed else snap.lsn
        self.seq = max([snap.seq] + [r.seq for r in landed])
        self.cut_seq = self.seq if lost else None
        self.user = [(r.seq, r.offset, r.size) for r in landed if r.seq]
        try:
            bmap.rebuild_free()
        except FormatError as exc:
            raise CorruptionError(f"block store {snap_path} + {log_path}: {exc}") from None
        if bmap.high > data.capacity:
            raise CorruptionError(
                f"block store data file {data.path}: the map points at block {bmap.high - 1} "
                f"but the file holds {data.capacity} blocks")
        self.fd = os.open(log_path, os.O_RDWR | os.O_CLOEXEC)
        if os.fstat(self.fd).st_size > good_end:
            log.warning("block store %s: discarding %s (%d bytes)", log_path, cut,
                        os.fstat(self.fd).st_size - good_end)
            os.ftruncate(self.fd, good_end)
        # what was read may be in the page cache only (after a process crash): make it durable,
        # since released blocks are reused once their release counts as synced
        os.fdatasync(data.fd)
        os.fsync(self.fd)
        self.lsn = self.synced_lsn = lsn
        self.claimed_lsn = durable_lsn(snap.lsn, landed)
        self.end = good_end
        self._remove_stale(gen)
        return bmap

    def _read_log(self, log_path: str, gen: int, lsn: int) -> tuple[list[LogRecord], int]:
        """The log records after the snapshot (which ends at ``lsn``), gapless, and the end of
        the good ones."""
        try:
            with open(log_path, "rb") as f:
                magic, g = LOG_HEAD.unpack(f.read(LOG_HEAD.size).ljust(LOG_HEAD.size, b"\0"))
                if magic in OLD_MAGICS:
                    raise FormatError(f"log of {OLD_FORMAT}")
                if magic != LOG_MAGIC or g != gen:
                    raise FormatError(f"bad header (magic {magic!r}, generation {g}, expected {gen})")
                records, good_end = read_log(f, LOG_HEAD.size, lsn + 1, self.record_size)
        except FileNotFoundError:
            raise CorruptionError(f"block store log {log_path} is missing") from None
        except FormatError as exc:
            raise CorruptionError(f"block store log {log_path}: {exc}") from None
        for i, rec in enumerate(records):
            if rec.lsn != lsn + 1 + i:
                raise CorruptionError(f"block store log {log_path}: record {lsn + 1 + i} is missing "
                                      f"(the next one is {rec.lsn})")
        return records, good_end

    def _replay(self, snap: Snapshot, records: list[LogRecord], data: DataFile) -> tuple[list[LogRecord], BlockMap]:
        """The snapshot and the longest run of ``records`` whose data blocks are on disk: that
        run and the map it gives. Only blocks that unsynced records wrote and the map still
        points at are read back and checked; where one fails, the log ends before the record
        that wrote it (and the check repeats for that shorter log)."""
        durable = durable_lsn(snap.lsn, records)
        while True:
            t0 = time.perf_counter()
            got = replay(snap.entries, records, self.record_size, durable)
            bad = data.unwritten(got.blocks, got.sums)
            if got.blocks.size:
                log.info("block store %s: read back %d blocks of %d commits not known synced in %.2f s",
                         self.path, got.blocks.size, records[-1].lsn - durable if records else 0,
                         time.perf_counter() - t0)
            if not bad.any():
                return records, got.map
            records = records[: int(got.lsns[bad].min()) - snap.lsn - 1]

    def _init_files(self) -> None:
        """A new store: an empty log, then the first snapshot (its presence marks the store)."""
        with open(self._file("log.0"), "wb") as f:
            f.write(LOG_HEAD.pack(LOG_MAGIC, 0))
            f.flush()
            os.fsync(f.fileno())
        write_atomic(self._file("map.0"), encode_snapshot(0, 0, 0, self.record_size, {}))

    def _remove_stale(self, gen: int) -> None:
        """Files of other generations (a crash inside ``rotate``) and temporaries."""
        for name in os.listdir(self.path):
            stem, _, suffix = name.partition(".")
            if name.endswith(".tmp") or (stem in ("map", "log") and suffix.isdigit() and int(suffix) != gen):
                os.unlink(self._file(name))

    # --- appends ------------------------------------------------------------------------------
    def append(self, rec: bytes) -> int:
        """Append one record (buffered: durable against a process crash once this returns);
        returns its offset. On failure the log is cut back, so no torn record is left before
        later ones."""
        off = self.end
        view = memoryview(rec)
        try:
            done = 0
            while done < len(rec):
                done += diskio.pwrite(self.fd, view[done:], off + done)
        except OSError as exc:
            try:
                os.ftruncate(self.fd, off)
            except OSError:
                pass  # the next record overwrites it; a leftover tail reads as a torn write
            raise failed(exc, f"block store log {self._file(f'log.{self.gen}')}", "appending a commit") from None
        self.end = off + len(rec)
        return off

    def commit(self, entries: Entries, user_log: bytes | None) -> int:
        """Append the record of a commit (its map delta and the caller's ``user_log``); returns
        the caller's sequence number (0 without ``user_log``). Once it returns, the commit is
        in and nothing after it may fail."""
        seq = self.seq + 1 if user_log is not None else 0
        synced = self.synced_lsn  # read once: a sync may end meanwhile
        rec = encode_record(self.lsn + 1, seq, entries, user_log, unsynced=self.lsn + 1 - synced)
        offset = self.append(rec)
        self.lsn += 1
        self.claimed_lsn = max(synced, self.lsn - MAX_UNSYNCED)
        if seq:
            self.seq = seq
            self.user.append((seq, offset, len(rec)))
        return seq

    def claim_synced(self) -> None:
        """Say in the log that every record is synced (an empty record claiming it), so the
        next open need not read back the data of the last commits."""
        if self.synced_lsn <= self.claimed_lsn:
            return
        try:
            self.append(encode_record(self.lsn + 1, 0, {}, None, unsynced=1))
            os.fsync(self.fd)
        except (OSError, StorageError):
            log.warning("block store %s: could not mark the log synced; the next open checks the "
                        "last commits' data", self.path, exc_info=True)
            return
        self.lsn += 1
        self.claimed_lsn = self.lsn - 1

    # --- the caller's records -----------------------------------------------------------------
    def since(self, seq: int) -> Iterator[tuple[int, bytes]]:
        """The caller's records with sequence number > ``seq``, in order; read from a
        duplicate of the log's fd, so they stay readable even if ``rotate`` swaps the log."""
        todo = [u for u in self.user if u[0] > seq]
        fd = os.dup(self.fd)
        return self._iter(fd, self._file(f"log.{self.gen}"), todo)

    def _iter(self, fd: int, path: str, todo: list) -> Iterator[tuple[int, bytes]]:
        try:
            for seq, offset, size in todo:
                yield seq, self._read_record(fd, path, offset, size).log
        finally:
            os.close(fd)

    def _read_record(self, fd: int, path: str, offset: int, size: int) -> LogRecord:
        try:
            return decode_record(os.pread(fd, size, offset), self.record_size)
        except FormatError as exc:
            raise CorruptionError(f"block store log {path}: record at offset {offset}: {exc}") from None

    # --- rotation -----------------------------------------------------------------------------
    def rotate(self, keep_above: int, entries: Entries, data: DataFile) -> None:
        """Start generation ``gen + 1``: its log (copies of the caller's records above
        ``keep_above``) fsynced, the data fdatasync'ed, then the snapshot of ``entries`` (the
        whole map) renamed into place, which is the switch."""
        gen, old_gen = self.gen + 1, self.gen
        log_path = self._file(f"log.{gen}")
        parts, user, pos, lsn = [LOG_HEAD.pack(LOG_MAGIC, gen)], [], LOG_HEAD.size, self.lsn
        old_log = self._file(f"log.{old_gen}")
        for seq, offset, size in self.user:
            if seq > keep_above:
                lsn += 1
                rec = encode_record(lsn, seq, {}, self._read_record(self.fd, old_log, offset, size).log)
                parts.append(rec)
                user.append((seq, pos, len(rec)))
                pos += len(rec)
        entries = {p: e for p, e in entries.items() if e is not None}
        try:
            with open(log_path, "wb") as f:
                f.write(b"".join(parts))
                f.flush()
                os.fsync(f.fileno())
            os.fdatasync(data.fd)
            write_atomic(self._file(f"map.{gen}"),
                         encode_snapshot(gen, self.lsn, self.seq, self.record_size, entries))
        except OSError as exc:
            for leftover in (log_path, self._file(f"map.{gen}.tmp")):
                try:
                    os.unlink(leftover)
                except OSError:
                    pass
            raise failed(exc, f"block store {self.path}", f"writing map snapshot {gen}") from None
        # switched: the new generation is the store now
        new_fd = os.open(log_path, os.O_RDWR | os.O_CLOEXEC)
        os.close(self.fd)
        self.fd, self.end, self.gen = new_fd, pos, gen
        self.lsn = self.synced_lsn = self.claimed_lsn = lsn
        self.user = user
        data.unsynced_blocks = 0
        for name in (f"map.{old_gen}", f"log.{old_gen}"):
            try:
                os.unlink(self._file(name))
            except OSError:
                pass  # removed at the next open
        fsync_dir(self.path)
