"""Block store for raw NVMe: postings in 4 KiB blocks of one file read with O_DIRECT, a
copy-on-write posting -> block-list map, and reads queued per I/O class on io_uring rings.

Layout of the store directory::

    LOCK          flock'ed while the store is open (a second open raises IndexLockedError)
    data          the blocks, opened with O_DIRECT; grown by fallocate in steps of >= 4 MiB
    map.<gen>     map snapshot: every posting's block list, block checksums and record count
                  (``blockmap``)
    log.<gen>     the log after that snapshot: header, then one record per commit

A posting's records lie back to back in its blocks (a record may straddle two blocks; only the
last block is partly filled; see ``blockmap``). A commit never overwrites a block the map
points at: an append rewrites the partly filled tail block into a new block followed by new
blocks, a replace writes new blocks. The bytes of each tail block a commit wrote stay in memory
(``TAIL_CACHE_BYTES`` in all), so the next append to that posting need not read it back. Each
append leaves the posting's full blocks where they were, so a posting appended to many times
ends up in as many places, and a search pays one I/O per place: an append that would leave a
posting in more than ``MAX_RUNS`` runs of consecutive blocks rewrites it whole into one run
instead. Data blocks are written (pwrite, O_DIRECT) before the log record that points at them;
the log record (the map delta, the caller's log bytes, a gapless record number ``lsn``, how
many records up to it are not known synced, and a CRC32) is a buffered write, so it survives a
process crash once ``commit`` returns; ``sync`` fdatasyncs the data file and fsyncs the log for
power loss. A commit syncs on its own once ``SYNC_EVERY_BLOCKS`` blocks were written unsynced;
``close`` syncs and appends an empty record saying so.

Opening loads the newest snapshot and replays the log. A damaged record at the very end of
the log is a commit that was never acknowledged: it is cut off. A damaged record that intact
ones follow, a damaged snapshot, or a map pointing past the end of the data file raise
``CorruptionError`` naming the file. A power loss can also keep a log record (the kernel
writes the log back when it likes) without the blocks it names (O_DIRECT writes may sit in
the disk's volatile cache): so opening reads back the blocks that records after the last one
known synced wrote and the map still points at, and ends the log before the first record
whose blocks fail their checksums, as RocksDB ends its WAL at a torn record. Nothing a sync
covered is cut: damage there is raised when read. ``truncate_log`` writes a new snapshot and
starts log ``gen + 1`` holding only the caller's records it must keep.

Released blocks (an old tail, a replaced or dropped posting) are reused only once the commit
that released them is fsynced and every read that started before it has ended (tickets, as
in ``vindex.readers``); until then they wait in limbo. When the file would have to grow while
plenty of blocks wait only for an fsync, the commit syncs first.

Checksums: every data block has a 32-bit checksum of its 4096 bytes (``native.checksum``),
computed by the commit that writes the block and kept in the map beside the block id. Every
read that returns data (``read``: searches, gets, rebalancing; the old blocks an append
reads back) checks the blocks it gathered with one nogil kernel call before anything else
touches them; a mismatch raises ``CorruptionError`` naming the data file, the block and its
posting, never a wrong vector. Cost: ~0.25 us per 4 KiB block; a 64-posting read of 448
blocks spends ~110 us checking, 3-5% of its 2-4 ms here (``test_checksum_cost_...``).

Reads: every block of every wanted posting, coalesced into runs of consecutive blocks, read
into a page-aligned buffer of the calling thread, checked, then compacted in place (the slack
of each posting's tail block squeezed out) so the result is the records back to back. The
reads are queued per class (``iosched``): with io_uring, one ring per class whose SQEs carry
the class's ioprio, served by a thread that sleeps on an eventfd; otherwise
(``VINDEX_NO_URING=1``, no io_uring, not x86-64) ``os.preadv`` at the class's ioprio, on the
class's worker threads or, when that pool is idle, on the caller (``IOScheduler.run``). Either
way the wait for the disk releases the GIL. Measured on this 2-vCPU VM (virtio disk, ~100 us
per 4 KiB O_DIRECT read): one posting 640 us via a ring (two thread hand-offs) vs 480 us by
inline preadv; 64 postings 2.2 ms vs 8.7 ms (the ring keeps them all in flight).

``cache_bytes`` is accepted for the ``open_store`` signature and ignored: the point of this
store is O_DIRECT reads that bypass every cache. Where O_DIRECT is refused (EINVAL), the store
uses buffered I/O and drops what it read or wrote from the page cache (``posix_fadvise``
DONTNEED); ``stats()["direct_io"]`` says which.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, NamedTuple

import numpy as np

from vindex import native  # its kernels load on first use: numba loads when the store first reads or writes data

from ..errors import CorruptionError, IndexLockedError, StorageError
from ..files import fsync_dir, write_atomic
from ..iosched import CLASSES, IOScheduler, IOTargets, check_mode
from ..readers import Readers
from .base import Change, IOClass, PostingBatch
from .blockmap import (BLOCK, EMPTY, LOG_HEAD, LOG_MAGIC, OLD_FORMAT, OLD_MAGICS, BlockMap, Entries, Entry,
                       FormatError, LogRecord, Snapshot, blocks_for, decode_record, decode_snapshot,
                       durable_lsn, encode_record, encode_snapshot, read_log, replay, runs, MAX_UNSYNCED)
from .uring import CLASS_IOPRIO, RingScheduler, thread_ioprio

log = logging.getLogger("vindex.storage.blocks")

GROW_MIN_BLOCKS = 1024    # grow the data file by at least 4 MiB (and 1/8 of its size)
WRITE_CHUNK = 16 << 20    # bulk_load writes through a buffer of this size
SYNC_TO_REUSE = 1024      # blocks waiting only for an fsync that make a commit sync, not grow
WRITE_PIECE = 256 * 1024  # bytes per pwrite: a search's reads wait behind one piece, not a whole commit
HELD_MAX_BLOCKS = 256     # reads of at most this many blocks check and move them keeping the GIL (native.held)
PAUSE_MIN_POSTINGS = 64   # commits writing more postings pause for running searches in between
#: The most runs of consecutive blocks an append leaves a posting in; past it, the append
#: rewrites the posting whole. Unbounded, 200k upserts into a 200k index left postings in ~6
#: runs: a 16-posting search read 96 runs, not 14, and its read took 1.4 ms, not 0.5. At 2, a
#: posting is rewritten about once per block its appends fill.
MAX_RUNS = 2
SYNC_EVERY_BLOCKS = 65536  # unsynced data (256 MiB) after which a commit syncs: bounds what an open reads back
VERIFY_BLOCKS = 4096       # blocks read back at a time when opening checks unsynced commits
TAIL_CACHE_BYTES = 64 << 20  # partly filled tail blocks kept for appends (~2 KiB a posting)
_ZEROS = bytes(BLOCK)     # padding to a whole block


def _open_direct(path: str) -> int:
    """The data file with O_DIRECT (a function so tests can make it fail like tmpfs once did)."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_DIRECT, 0o644)


_pwrite = os.pwrite  # every write goes through here (fault-injection tests replace it)


def _locate(pids: np.ndarray, counts: np.ndarray, i: int) -> tuple[int, int, int]:
    """Block ``i`` of a read of postings ``pids`` with ``counts`` blocks each: ``(posting, its
    block number from 1, its block count)``."""
    ends = np.cumsum(counts)
    p = int(np.searchsorted(ends, i, side="right"))
    return int(pids[p]), i - int(ends[p] - counts[p]) + 1, int(counts[p])


def _read_table(blocks: np.ndarray) -> np.ndarray:
    """The reads that gather ``blocks`` into a buffer in order: ``(file offset, buffer offset,
    length)`` per run of consecutive blocks (``ReadJob``'s ``runs``)."""
    starts, lens = runs(blocks)
    b = blocks.astype(np.int64)
    return np.stack([b[starts] * BLOCK, starts * BLOCK, lens * BLOCK], axis=1)


def _failed(exc: OSError, where: str, doing: str) -> StorageError:
    """An OSError from the disk as the StorageError callers handle, naming file and step."""
    return StorageError(exc.errno or errno.EIO, f"{where}: {exc.strerror or exc} (while {doing})")


class _Aligned:
    """A page-aligned anonymous mapping: O_DIRECT needs aligned buffers."""

    def __init__(self, size: int):
        self.size = max(BLOCK, -(-size // BLOCK) * BLOCK)
        self.mm = mmap.mmap(-1, self.size)
        self.arr = np.frombuffer(self.mm, dtype=np.uint8)
        self.mv = memoryview(self.mm)
        self.address = self.arr.ctypes.data


class _ThreadBuffers(threading.local):
    """One growable aligned read buffer per thread: a result stays valid until the thread's
    next read (a grown buffer is a new mapping; the old one lives while a result uses it)."""

    def __init__(self) -> None:
        self.buf: _Aligned | None = None

    def get(self, size: int) -> _Aligned:
        if self.buf is None or self.buf.size < size:
            old = 0 if self.buf is None else self.buf.size
            self.buf = _Aligned(max(size, 2 * old, 256 * 1024))
        return self.buf


class ReadJob:
    """The reads of one request: ``runs`` rows ``(file offset, buffer offset, length)``.

    Calling it does them with ``os.preadv`` (which releases the GIL) at the class's ioprio, on
    a preadv worker or inline on the caller (``IOScheduler.run``); ``RingScheduler`` puts the
    same runs on a ring instead."""

    __slots__ = ("fd", "buf", "address", "runs", "prio")

    def __init__(self, fd: int, buf: _Aligned, runs_: np.ndarray, prio: int | None):
        self.fd, self.buf, self.address, self.runs, self.prio = fd, buf, buf.address, runs_, prio

    def __call__(self) -> None:
        mv = self.buf.mv
        with thread_ioprio(self.prio):
            for off, pos, n in self.runs.tolist():
                got = os.preadv(self.fd, [mv[pos:pos + n]], off)
                if got != n:
                    raise OSError(errno.EIO, f"short read: {got} of {n} bytes at offset {off}")


class _Tail(NamedTuple):
    """The bytes of a posting's partly filled last block, kept by the commit that wrote it;
    used only while the map still names that block with that checksum."""

    block: int
    checksum: int
    data: bytes


@dataclass
class _Rewrite:
    """A posting a commit changes: full blocks it keeps (and their checksums), then new bytes
    in new blocks."""

    kept: np.ndarray
    records: int
    pieces: list = field(default_factory=list)
    kept_sums: np.ndarray = field(default_factory=lambda: EMPTY)
    # old blocks read back whose first ``reread_bytes`` start the new bytes: the partly filled
    # tail, or the whole posting when the append folds it into one run; and their checksums
    reread: np.ndarray = field(default_factory=lambda: EMPTY)
    reread_bytes: int = 0
    reread_sums: np.ndarray = field(default_factory=lambda: EMPTY)


def disk_scheduler(path: str) -> tuple[str, str]:
    """``(device, scheduler)`` of the block device holding ``path`` ("unknown" if not found):
    ``/sys/dev/block/MAJ:MIN`` is the device or a partition, whose parent has the queue."""
    try:
        st = os.stat(path)
        dev = os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
        for d in (dev, os.path.dirname(dev)):
            f = os.path.join(d, "queue", "scheduler")
            if os.path.exists(f):
                with open(f) as fh:
                    text = fh.read().strip()
                m = re.search(r"\[([^\]]+)\]", text)
                return os.path.basename(d), (m.group(1) if m else text or "unknown")
    except OSError:
        pass
    return "unknown", "unknown"


class BlockStore:
    """Posting store on a file of 4 KiB blocks (see the module docstring).

    ``engine``: ``"io_uring"``, ``"preadv"`` or None (io_uring unless ``VINDEX_NO_URING=1``
    or unavailable). ``direct``: False skips O_DIRECT (tests); None tries it.
    """

    def __init__(self, path: str, *, record_size: int, cache_bytes: int = 0, create: bool,
                 io_scheduler: str = "sla", engine: str | None = None, direct: bool | None = None,
                 targets: IOTargets = IOTargets()):
        check_mode(io_scheduler)
        if not os.path.isdir(path):
            if not create:
                raise CorruptionError(f"posting store missing: {path}")
            os.makedirs(path)
        self.path = os.fspath(path)
        self.record_size = record_size
        self.mode = io_scheduler
        self._data_path = os.path.join(self.path, "data")
        self._closed = True
        self._fd = self._log_fd = self._lock_fd = -1
        self._lock_fd = self._lock()
        try:
            self._open_data(direct)
            self._map = BlockMap(record_size)
            self._load(create)
            self._sched, self.engine = self._scheduler(engine, targets)
        except BaseException:
            self._release_files()
            raise
        self._closed = False
        self._write_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._tickets = Readers()
        self._buffers = _ThreadBuffers()
        self._wbuf = _Aligned(1 << 20)   # commit data (write lock)
        self._tbuf = _Aligned(1 << 16)   # old blocks an append rewrites (write lock)
        self._tails: OrderedDict[int, _Tail] = OrderedDict()  # (write lock)
        self._tail_bytes = self.tail_hits = 0
        self._stats_lock = threading.Lock()
        self.reads = self.read_bytes = 0
        self._by_class = {c.value: 0 for c in CLASSES}
        self.disk, self.disk_scheduler = disk_scheduler(self.path)
        note = " (I/O priorities have no effect under 'none')" if self.disk_scheduler == "none" else ""
        log.info("block store %s: disk %s, I/O scheduler %s%s; engine %s, direct I/O %s, queues %s",
                 self.path, self.disk, self.disk_scheduler, note, self.engine,
                 "on" if self.direct else "off", self.mode)

    # --- open ---------------------------------------------------------------------------------
    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _lock(self) -> int:
        fd = os.open(self._file("LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise IndexLockedError(f"index store {self.path} is already open (in this or another "
                                   f"process); close it first") from None
        return fd

    def _open_data(self, direct: bool | None) -> None:
        self.direct = False
        if direct is not False:
            try:
                self._fd = _open_direct(self._data_path)
                self.direct = True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                log.warning("block store %s: O_DIRECT refused (EINVAL); using buffered I/O with "
                            "posix_fadvise(DONTNEED)", self.path)
        if not self.direct:
            self._fd = os.open(self._data_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        size = os.fstat(self._fd).st_size
        self._capacity = size // BLOCK  # a partial last block (never written by us) is ignored
        self._unsynced_blocks = 0  # data blocks written since the last sync (> 0: the data file is dirty)

    def _load(self, create: bool) -> None:
        gens = sorted(int(n[4:]) for n in os.listdir(self.path) if n.startswith("map.") and n[4:].isdigit())
        if not gens:
            if not create:
                raise CorruptionError(f"block store {self.path}: no map snapshot (map.<gen>) found")
            self._init_files()
            gens = [0]
        self._gen = gen = gens[-1]
        snap_path, log_path = self._file(f"map.{gen}"), self._file(f"log.{gen}")
        try:
            with open(snap_path, "rb") as f:
                snap = decode_snapshot(f.read(), self.record_size)
            if snap.gen != gen:
                raise FormatError(f"holds generation {snap.gen}")
        except FormatError as exc:
            raise CorruptionError(f"block store snapshot {snap_path}: {exc}") from None
        records, good_end = self._read_log(log_path, gen, snap.lsn)
        landed = self._replay(snap, records)
        lost = len(records) - len(landed)
        cut = "a torn final log record of an unacknowledged commit"
        if lost:
            good_end = records[len(landed)].offset
            cut = (f"{lost} log records from lsn {records[len(landed)].lsn} on, whose "
                   f"data blocks never reached the disk (a power loss before they were fsynced)")
        lsn = landed[-1].lsn if landed else snap.lsn
        self._seq = max([snap.seq] + [r.seq for r in landed])
        self._cut_seq = self._seq if lost else None  # see ``continue_after``
        self._user = [(r.seq, r.offset, r.size) for r in landed if r.seq]
        try:
            self._map.rebuild_free()
        except FormatError as exc:
            raise CorruptionError(f"block store {snap_path} + {log_path}: {exc}") from None
        if self._map.high > self._capacity:
            raise CorruptionError(
                f"block store data file {self._data_path}: the map points at block {self._map.high - 1} "
                f"but the file holds {self._capacity} blocks")
        self._log_fd = os.open(log_path, os.O_RDWR | os.O_CLOEXEC)
        if os.fstat(self._log_fd).st_size > good_end:
            log.warning("block store %s: discarding %s (%d bytes)", log_path, cut,
                        os.fstat(self._log_fd).st_size - good_end)
            os.ftruncate(self._log_fd, good_end)
        # what was read may be in the page cache only (after a process crash): make it durable,
        # since released blocks are reused once their release counts as synced
        os.fdatasync(self._fd)
        os.fsync(self._log_fd)
        self._lsn = self._synced_lsn = lsn
        self._claimed_lsn = durable_lsn(snap.lsn, landed)
        self._log_end = good_end
        self._remove_stale(gen)

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

    def _replay(self, snap: Snapshot, records: list[LogRecord]) -> list[LogRecord]:
        """Install the snapshot and the longest run of ``records`` whose data blocks are on
        disk; returns that run. Only blocks that unsynced records wrote and the map still
        points at are read back and checked; where one fails, the log ends before the record
        that wrote it (and the check repeats for that shorter log)."""
        durable = durable_lsn(snap.lsn, records)
        while True:
            t0 = time.perf_counter()
            got = replay(snap.entries, records, self.record_size, durable)
            bad = self._unwritten(got.blocks, got.sums)
            self._map = got.map
            if got.blocks.size:
                log.info("block store %s: read back %d blocks of %d commits not known synced in %.2f s",
                         self.path, got.blocks.size, records[-1].lsn - durable if records else 0,
                         time.perf_counter() - t0)
            if not bad.any():
                return records
            records = records[: int(got.lsns[bad].min()) - snap.lsn - 1]

    def _unwritten(self, blocks: np.ndarray, sums: np.ndarray) -> np.ndarray:
        """Mask of ``blocks`` (sorted) whose data on disk fails ``sums`` (or lies past the end
        of the file), read in pieces of ``VERIFY_BLOCKS``."""
        bad = blocks >= self._capacity
        buf = _Aligned(min(blocks.shape[0], VERIFY_BLOCKS) * BLOCK)
        got = np.empty(VERIFY_BLOCKS, dtype=np.uint32)
        inside = np.flatnonzero(~bad)
        for lo in range(0, inside.shape[0], VERIFY_BLOCKS):
            idx = inside[lo:lo + VERIFY_BLOCKS]
            try:
                ReadJob(self._fd, buf, _read_table(blocks[idx]), None)()
            except OSError as exc:
                raise _failed(exc, f"block store {self._data_path}", "checking the data of unsynced commits") from None
            native.checksum.block_sums(buf.arr, idx.shape[0], got)
            bad[idx] = got[:idx.shape[0]] != sums[idx]
        return bad

    def _init_files(self) -> None:
        """A new store: an empty log, then the first snapshot (its presence marks the store)."""
        with open(self._file("log.0"), "wb") as f:
            f.write(LOG_HEAD.pack(LOG_MAGIC, 0))
            f.flush()
            os.fsync(f.fileno())
        write_atomic(self._file("map.0"), encode_snapshot(0, 0, 0, self.record_size, {}))

    def _remove_stale(self, gen: int) -> None:
        """Files of other generations (a crash inside ``truncate_log``) and temporaries."""
        for name in os.listdir(self.path):
            stem, _, suffix = name.partition(".")
            if name.endswith(".tmp") or (stem in ("map", "log") and suffix.isdigit() and int(suffix) != gen):
                os.unlink(self._file(name))

    def _scheduler(self, engine: str | None, targets: IOTargets) -> tuple[IOScheduler, str]:
        if engine is None:
            engine = "preadv" if os.environ.get("VINDEX_NO_URING") == "1" else "auto"
        if engine not in ("auto", "io_uring", "preadv"):
            raise ValueError(f"engine: expected 'io_uring', 'preadv' or None, got {engine!r}")
        if engine != "preadv":
            try:
                return RingScheduler(self.mode, targets=targets), "io_uring"
            except OSError as exc:
                if engine == "io_uring":
                    raise
                log.info("block store %s: io_uring unavailable (%s); using preadv workers", self.path, exc)
        return IOScheduler(self.mode, targets=targets), "preadv"

    # --- reads --------------------------------------------------------------------------------
    def read(self, pids: np.ndarray, io: IOClass, *, deadline: float | None = None,
             tenant: str = "default", in_place: bool = False) -> PostingBatch:
        """Read postings ``pids`` in one request of class ``io`` (see ``PostingStore.read``)."""
        self._check_open()
        pids = np.asarray(pids, dtype=np.int64).reshape(-1)
        ticket = self._tickets.begin()  # before the lookups: blocks we see stay ours until end()
        try:
            get = self._map.get
            entries = [get(p) for p in pids.tolist()]
            counts = np.array([0 if e is None else e.blocks.shape[0] for e in entries], dtype=np.int64)
            recs = np.array([0 if e is None else e.records for e in entries], dtype=np.int64)
            total = int(counts.sum())
            buf = self._buffers.get(total * BLOCK)
            if total:
                blocks = np.concatenate([e.blocks for e in entries if e is not None])
                self._read_blocks(blocks, buf, io, deadline=deadline, tenant=tenant, cost=pids.shape[0])
        finally:
            self._tickets.end(ticket)
        # the tail-block slack is squeezed out in place: each posting moves down to where the
        # previous one's records end
        nbytes = recs * self.record_size
        if total:  # the bytes are ours now (thread buffer): check them, then move them (one kernel call)
            src, dst = (np.cumsum(counts) - counts) * BLOCK, np.cumsum(nbytes) - nbytes
            sums = np.concatenate([e.sums for e in entries if e is not None])
            kernels = native.held if total <= HELD_MAX_BLOCKS else native.layout
            bad = kernels.check_and_compact(buf.arr, sums, src, dst, nbytes)
            if bad >= 0:
                self._corrupt(blocks, bad, lambda i: _locate(pids, counts, i))
        offsets = np.zeros(recs.shape[0] + 1, dtype=np.int64)
        np.cumsum(recs, out=offsets[1:])
        data = buf.arr[: int(nbytes.sum())]
        with self._stats_lock:
            self.reads += pids.shape[0]
            self.read_bytes += data.shape[0]
            self._by_class[io.value] += 1
        return PostingBatch(data, offsets)

    @property
    def scheduler(self) -> IOScheduler:
        return self._sched

    def _read_blocks(self, blocks: np.ndarray, buf: _Aligned, io: IOClass, *,
                     deadline: float | None = None, tenant: str = "default", cost: float = 1.0) -> None:
        """Read ``blocks`` into ``buf`` in order: one I/O per run of consecutive blocks."""
        table = _read_table(blocks)
        prio = CLASS_IOPRIO[io] if self.mode == "sla" else None
        try:
            self._sched.run(io, ReadJob(self._fd, buf, table, prio), tenant=tenant, deadline=deadline, cost=cost)
        except StorageError:
            raise
        except OSError as exc:
            raise _failed(exc, f"block store {self._data_path}", "reading") from None
        if not self.direct:
            self._advise(table[:, 0], table[:, 2])

    def _verify(self, buf: _Aligned, blocks: np.ndarray, sums: np.ndarray,
                locate: Callable[[int], tuple[int, int, int]]) -> None:
        """Check the blocks of one read against their checksums (one kernel call for all):
        ``buf`` holds ``blocks`` in order. ``locate(i)``: ``(posting, its block number from 1,
        its block count)`` of ``blocks[i]``, for the error."""
        bad = native.checksum.first_bad(buf.arr, sums)
        if bad >= 0:
            self._corrupt(blocks, bad, locate)

    def _corrupt(self, blocks: np.ndarray, bad: int, locate: Callable[[int], tuple[int, int, int]]) -> None:
        b = int(blocks[bad])
        pid, nth, n = locate(int(bad))
        raise CorruptionError(
            f"block store data file {self._data_path}: block {b} of posting {pid} fails its checksum "
            f"(file offset {b * BLOCK}, the posting's block {nth} of {n}); the data file is damaged")

    def _advise(self, offsets: np.ndarray, lengths: np.ndarray) -> None:
        """Without O_DIRECT: drop these ranges from the page cache (no hidden cache)."""
        for off, n in zip(offsets.tolist(), lengths.tolist()):
            os.posix_fadvise(self._fd, off, n, os.POSIX_FADV_DONTNEED)

    # --- commits ------------------------------------------------------------------------------
    def commit(self, change: Change, io: IOClass) -> int:
        """Apply ``change`` atomically; returns its log sequence number (0 without a log)."""
        with self._write_lock:
            self._check_open()
            work, released = self._plan(change)
            if not work and change.log is None:
                return 0
            if any(w.reread.shape[0] for w in work.values()):
                self._read_back(work, io)
            self._pause(change)
            self._reclaim()
            chosen = self._allocate([blocks_for(sum(len(p) for p in w.pieces)) for w in work.values()])
            sums, tails = self._write(list(work.values()), chosen)
            self._pause(change)
            entries: Entries = {}
            for (pid, w), new, new_sums in zip(work.items(), chosen, sums):
                entries[pid] = (Entry(np.concatenate((w.kept, new)), w.records,
                                      np.concatenate((w.kept_sums, new_sums))) if w.records else None)
            seq = self._seq + 1 if change.log is not None else 0
            synced = self._synced_lsn  # read once: a sync may end meanwhile
            rec = encode_record(self._lsn + 1, seq, entries, change.log, unsynced=self._lsn + 1 - synced)
            offset = self._append_log(rec)
            # the commit is in the log: from here on nothing may fail
            self._lsn += 1
            self._claimed_lsn = max(synced, self._lsn - MAX_UNSYNCED)
            if seq:
                self._seq = seq
                self._user.append((seq, offset, len(rec)))
            self._apply(entries, np.concatenate(chosen) if chosen else EMPTY, released)
            self._keep_tails(entries.items(), tails)
            if self._unsynced_blocks >= SYNC_EVERY_BLOCKS:
                self._sync_quietly()
            return seq

    def _sync_quietly(self) -> None:
        """Sync after a commit that is in already: a failure leaves it for the next sync."""
        try:
            self._sync()
        except StorageError:
            log.warning("block store %s: sync failed; retried after the next commit", self.path, exc_info=True)

    @staticmethod
    def _pause(change: Change) -> None:
        """Between the stretches of a large commit that hold the GIL (planning and reading
        tails; allocating and writing; the log and the map), let running searches finish."""
        if change.pause is not None and len(change.appends) + len(change.replaces) > PAUSE_MIN_POSTINGS:
            change.pause()

    def _plan(self, change: Change) -> tuple[dict[int, _Rewrite], np.ndarray]:
        """What ``change`` rewrites, in the order drops, replaces, appends (as rocks applies
        them), and the blocks it releases."""
        rs = self.record_size
        work: dict[int, _Rewrite] = {}
        released: list[np.ndarray] = []

        def fresh(pid: int, records: int, data: bytes | None) -> None:
            if pid not in work:
                e = self._map.get(pid)
                if e is not None:
                    released.append(e.blocks)
            work[pid] = _Rewrite(EMPTY, records, [] if data is None else [data])

        for pid in change.drops:
            if int(pid) not in work:
                fresh(int(pid), 0, None)
        for pid, data in change.replaces.items():
            fresh(int(pid), self._records(data), data)
        for pid, data in change.appends.items():
            pid, n = int(pid), self._records(data)
            if n == 0:
                continue
            w = work.get(pid)
            if w is not None:
                w.pieces.append(data)
                w.records += n
                continue
            e = self._map.get(pid)
            if e is None:
                work[pid] = _Rewrite(EMPTY, n, [data])
                continue
            blocks, r, sums = e
            tail = (r * rs) % BLOCK
            keep = blocks.shape[0] - (1 if tail else 0)
            if self._kept_runs(pid, blocks, keep) + 1 > MAX_RUNS:  # fold: the whole posting to new blocks
                keep = 0
            if keep == blocks.shape[0]:
                work[pid] = _Rewrite(blocks, r + n, [data], kept_sums=sums)
                continue
            # blocks[keep:] (the partly filled tail, or the runs a fold rewrites) move, with the
            # new records, to new blocks; the tail's bytes come from memory when the commit
            # that wrote it left them there, the rest is read back
            released.append(blocks[keep:])
            kept_tail = self._kept_tail(pid, blocks, sums) if tail else b""
            end = blocks.shape[0] - (1 if kept_tail else 0)
            work[pid] = _Rewrite(blocks[:keep], r + n, [kept_tail, data] if kept_tail else [data],
                                 kept_sums=sums[:keep], reread=blocks[keep:end],
                                 reread_bytes=r * rs - keep * BLOCK - len(kept_tail), reread_sums=sums[keep:end])
        return work, (np.concatenate(released) if released else EMPTY)

    def _kept_tail(self, pid: int, blocks: np.ndarray, sums: np.ndarray) -> bytes:
        """The bytes of the posting's partly filled last block as the commit that wrote it
        kept them, or b"" if none are kept or the map no longer names that block."""
        t = self._tails.get(pid)
        if t is None or (t.block, t.checksum) != (int(blocks[-1]), int(sums[-1])):
            return b""
        self.tail_hits += 1
        return t.data

    def _kept_runs(self, pid: int, blocks: np.ndarray, keep: int) -> int:
        """Runs of consecutive blocks in ``blocks[:keep]`` (a posting's blocks an append keeps),
        from the map's count for all of them: the dropped tail was a run of its own unless it
        followed the block before it."""
        if keep == 0:
            return 0
        n = self._map.runs.get_one(pid)
        if keep < blocks.shape[0] and int(blocks[keep]) != int(blocks[keep - 1]) + 1:
            n -= 1
        return n

    def _records(self, data: bytes) -> int:
        if len(data) % self.record_size:
            raise ValueError(f"expected whole {self.record_size}-byte records, got {len(data)} bytes")
        return len(data) // self.record_size

    def _read_back(self, work: dict[int, _Rewrite], io: IOClass) -> None:
        """Read the old blocks that appends rewrite (one request), check them, and prefix
        their bytes to the new ones."""
        pids = [pid for pid, w in work.items() if w.reread.shape[0]]
        ws = [work[pid] for pid in pids]
        counts = np.array([w.reread.shape[0] for w in ws], dtype=np.int64)
        total = int(counts.sum())
        if self._tbuf.size < total * BLOCK:  # not the thread's read buffer: a caller may hold a result
            self._tbuf = _Aligned(total * BLOCK)
        buf = self._tbuf
        blocks = np.concatenate([w.reread for w in ws])
        self._read_blocks(blocks, buf, io)

        def locate(i: int) -> tuple[int, int, int]:  # numbered among the posting's old blocks
            pid, nth, n = _locate(np.asarray(pids), counts, i)
            kept = work[pid].kept.shape[0]
            return pid, kept + nth, kept + n

        self._verify(buf, blocks, np.concatenate([w.reread_sums for w in ws]), locate)
        start = 0
        for w, n in zip(ws, counts.tolist()):
            w.pieces.insert(0, bytes(buf.arr[start * BLOCK:start * BLOCK + w.reread_bytes]))
            start += n

    def _reclaim(self) -> int:
        return self._map.reclaim(self._synced_lsn, self._tickets.drained)

    def _allocate(self, sizes: list[int]) -> list[np.ndarray]:
        """Blocks for postings of ``sizes`` blocks; the file grows to hold them. If it would
        grow while many released blocks wait only for an fsync, sync first and reuse them."""
        def top(chosen: list[np.ndarray]) -> int:
            flat = np.concatenate(chosen) if chosen else EMPTY
            return int(flat.max()) + 1 if flat.shape[0] else 0

        chosen = self._map.allocate(sizes)
        if top(chosen) > self._map.high and self._map.limbo_blocks >= max(SYNC_TO_REUSE, self._map.high // 8):
            self._sync()
            if self._reclaim():
                chosen = self._map.allocate(sizes)
        self._ensure_capacity(top(chosen))
        return chosen

    def _ensure_capacity(self, blocks: int) -> None:
        if blocks <= self._capacity:
            return
        new = max(blocks, self._capacity + max(GROW_MIN_BLOCKS, self._capacity // 8))
        try:
            try:
                os.posix_fallocate(self._fd, self._capacity * BLOCK, (new - self._capacity) * BLOCK)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(self._fd, new * BLOCK)
            os.fsync(self._fd)  # the new size is durable before any log record points past the old one
        except OSError as exc:
            raise _failed(exc, f"block store {self._data_path}", "growing the file") from None
        self._capacity = new

    def _write(self, work: list[_Rewrite], chosen: list[np.ndarray]) -> tuple[list[np.ndarray], list[bytes]]:
        """Write the new bytes of each posting to its chosen blocks (O_DIRECT, pwrites of at most
        ``WRITE_PIECE`` per run of consecutive blocks); returns each posting's checksums of those blocks, and the
        bytes of its partly filled last block (empty if that block is full)."""
        total = sum(c.shape[0] for c in chosen)
        if total == 0:
            return [EMPTY] * len(chosen), [b""] * len(chosen)
        buf = self._write_buffer(total * BLOCK)
        parts: list[bytes] = []  # one join and one copy: per piece, numpy would cost more
        ends: list[tuple[int, int]] = []  # per posting: where its bytes end in the join, its tail's length
        size = 0
        for w in work:
            parts.extend(w.pieces)
            size += sum(len(p) for p in w.pieces)
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
        self._pwrite_blocks(blocks, buf)
        tails = [joined[end - tail:end] for end, tail in ends]
        return np.split(sums, np.cumsum([c.shape[0] for c in chosen[:-1]]).astype(np.int64)), tails

    def _keep_tails(self, written: Iterable[tuple[int, Entry | None]], tails: list[bytes]) -> None:
        """Keep the partly filled last block of each posting a commit wrote, so the next append
        to it need not read it back (under a flat-out ingest most appends would, one I/O each);
        past ``TAIL_CACHE_BYTES`` those written longest ago go. A kept tail is used only while
        the map still names its block and checksum. Holds the write lock."""
        for (pid, e), tail in zip(written, tails):
            old = self._tails.pop(pid, None)
            if old is not None:
                self._tail_bytes -= len(old.data)
            if e is not None and tail:
                self._tails[pid] = _Tail(int(e.blocks[-1]), int(e.sums[-1]), tail)
                self._tail_bytes += len(tail)
        while self._tail_bytes > TAIL_CACHE_BYTES:
            self._tail_bytes -= len(self._tails.popitem(last=False)[1].data)

    def _write_buffer(self, size: int) -> _Aligned:
        if self._wbuf.size < size:
            self._wbuf = _Aligned(max(size, 2 * self._wbuf.size))
        return self._wbuf

    def _pwrite_blocks(self, blocks: np.ndarray, buf: _Aligned) -> None:
        starts, lens = runs(blocks)
        b = blocks.astype(np.int64)
        try:
            for s, n in zip(starts.tolist(), lens.tolist()):
                pos, off, size = s * BLOCK, int(b[s]) * BLOCK, n * BLOCK
                done = 0
                while done < size:  # in pieces, each after the searches' reads in flight
                    self._sched.yield_to_interactive()
                    end = pos + min(size, done + WRITE_PIECE)
                    done += _pwrite(self._fd, buf.mv[pos + done:end], off + done)
                if not self.direct:
                    os.posix_fadvise(self._fd, off, size, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            raise _failed(exc, f"block store {self._data_path}", "writing postings") from None
        self._unsynced_blocks += blocks.shape[0]

    def _append_log(self, rec: bytes) -> int:
        """Append one record to the log (buffered: durable against a process crash once this
        returns). On failure the log is cut back, so no torn record is left before later ones."""
        off = self._log_end
        view = memoryview(rec)
        try:
            done = 0
            while done < len(rec):
                done += _pwrite(self._log_fd, view[done:], off + done)
        except OSError as exc:
            try:
                os.ftruncate(self._log_fd, off)
            except OSError:
                pass  # the next record overwrites it; a leftover tail reads as a torn write
            where = f"block store log {self._file(f'log.{self._gen}')}"
            raise _failed(exc, where, "appending a commit") from None
        self._log_end = off + len(rec)
        return off

    def _apply(self, entries: Entries, taken: np.ndarray, released: np.ndarray) -> None:
        """Install a durable commit in memory: new entries first, then the ticket boundary, so
        a read that can still hold a released block has a ticket below it."""
        self._map.take(taken)
        self._map.install(entries)
        self._map.release(released, self._lsn, self._tickets.now())

    def bulk_load(self, pids: np.ndarray, records: np.ndarray, offsets: np.ndarray,
                  io: IOClass = IOClass.BACKGROUND) -> None:
        """Write fresh postings (index build); durable on return (data fdatasync'ed, then a
        new map snapshot)."""
        rs = self.record_size
        raw = np.ascontiguousarray(records).view(np.uint8).reshape(-1)
        offsets = np.asarray(offsets, dtype=np.int64)
        pids = [int(p) for p in np.asarray(pids).tolist()]
        counts = np.diff(offsets)
        with self._write_lock:
            self._check_open()
            self._reclaim()
            chosen = self._allocate([blocks_for(int(n) * rs) for n in counts.tolist()])
            sums: list[np.ndarray] = []
            tails: list[bytes] = []
            lo = 0
            while lo < len(pids):  # a buffer's worth of postings per write
                hi, size = lo, 0
                while hi < len(pids) and (hi == lo or size + chosen[hi].shape[0] * BLOCK <= WRITE_CHUNK):
                    size += chosen[hi].shape[0] * BLOCK
                    hi += 1
                pieces = [_Rewrite(EMPTY, int(counts[i]), [raw[offsets[i] * rs:offsets[i + 1] * rs]])
                          for i in range(lo, hi)]
                written, ends = self._write(pieces, chosen[lo:hi])
                sums += written
                tails += ends
                lo = hi
            fresh = [(pid, Entry(c, int(n), s) if n else None)
                     for pid, c, n, s in zip(pids, chosen, counts.tolist(), sums)]
            entries: Entries = dict(fresh)
            old = [e.blocks for p in pids if (e := self._map.get(p)) is not None]
            with self._sync_lock:
                self._rotate(keep_above=-1, overlay=entries)
            self._apply(entries, np.concatenate(chosen) if chosen else EMPTY,
                        np.concatenate(old) if old else EMPTY)
            self._keep_tails(fresh, tails)

    # --- the log ------------------------------------------------------------------------------
    def log_since(self, seq: int, io: IOClass = IOClass.BACKGROUND) -> Iterator[tuple[int, bytes]]:
        """The caller's log records with sequence number > ``seq``, in order."""
        with self._write_lock:
            self._check_open()
            todo = [u for u in self._user if u[0] > seq]
            fd = os.dup(self._log_fd)  # stays readable even if truncate_log swaps the log
            path = self._file(f"log.{self._gen}")
        return self._iter_log(fd, path, todo)

    def _iter_log(self, fd: int, path: str, todo: list) -> Iterator[tuple[int, bytes]]:
        try:
            for seq, offset, size in todo:
                yield seq, self._read_record(fd, path, offset, size).log
        finally:
            os.close(fd)

    def _read_record(self, fd: int, path: str, offset: int, size: int):
        try:
            return decode_record(os.pread(fd, size, offset), self.record_size)
        except FormatError as exc:
            raise CorruptionError(f"block store log {path}: record at offset {offset}: {exc}") from None

    def continue_after(self, seq: int, io: IOClass = IOClass.BACKGROUND) -> None:
        if self._cut_seq is not None and seq > self._cut_seq:
            # the caller saved its state after commits this open had to cut (their data was
            # synced, so only damage can have lost it): its state would name missing records
            raise CorruptionError(
                f"block store {self.path}: the caller's state covers log record {seq}, but the "
                f"log ends at {self._cut_seq} after commits whose data blocks fail their checksums were cut")
        with self._write_lock:
            self._seq = max(self._seq, seq)

    def truncate_log(self, upto: int, io: IOClass = IOClass.BACKGROUND) -> None:
        """Drop the caller's records <= ``upto``: a new snapshot covering every commit, and a
        new log generation holding only the records kept."""
        with self._write_lock, self._sync_lock:
            self._check_open()
            self._rotate(keep_above=upto)

    def _rotate(self, keep_above: int, overlay: Entries | None = None) -> None:
        """Start generation ``gen + 1``: its log (copies of the caller's records above
        ``keep_above``) fsynced, the data fdatasync'ed, then the snapshot of the map (plus
        ``overlay``) renamed into place, which is the switch. Holds both locks."""
        gen, old_gen = self._gen + 1, self._gen
        log_path = self._file(f"log.{gen}")
        parts, user, pos, lsn = [LOG_HEAD.pack(LOG_MAGIC, gen)], [], LOG_HEAD.size, self._lsn
        old_log = self._file(f"log.{old_gen}")
        for seq, offset, size in self._user:
            if seq > keep_above:
                lsn += 1
                rec = encode_record(lsn, seq, {}, self._read_record(self._log_fd, old_log, offset, size).log)
                parts.append(rec)
                user.append((seq, pos, len(rec)))
                pos += len(rec)
        entries = self._map.entries()
        entries.update(overlay or {})
        entries = {p: e for p, e in entries.items() if e is not None}
        try:
            with open(log_path, "wb") as f:
                f.write(b"".join(parts))
                f.flush()
                os.fsync(f.fileno())
            os.fdatasync(self._fd)
            write_atomic(self._file(f"map.{gen}"),
                         encode_snapshot(gen, self._lsn, self._seq, self.record_size, entries))
        except OSError as exc:
            for leftover in (log_path, self._file(f"map.{gen}.tmp")):
                try:
                    os.unlink(leftover)
                except OSError:
                    pass
            raise _failed(exc, f"block store {self.path}", f"writing map snapshot {gen}") from None
        # switched: the new generation is the store now
        new_fd = os.open(log_path, os.O_RDWR | os.O_CLOEXEC)
        os.close(self._log_fd)
        self._log_fd, self._log_end, self._gen = new_fd, pos, gen
        self._lsn = self._synced_lsn = self._claimed_lsn = lsn
        self._user = user
        self._unsynced_blocks = 0
        for name in (f"map.{old_gen}", f"log.{old_gen}"):
            try:
                os.unlink(self._file(name))
            except OSError:
                pass  # removed at the next open
        fsync_dir(self.path)

    def sync(self, io: IOClass = IOClass.UPDATE) -> None:
        """Make every committed change durable against power loss."""
        self._check_open()
        self._sync()

    def _sync(self) -> None:
        with self._sync_lock:
            lsn = self._lsn  # records up to here are in the log already
            written, self._unsynced_blocks = self._unsynced_blocks, 0
            try:
                self._sched.yield_to_interactive()  # a flush holds up the reads queued behind it
                if written:
                    os.fdatasync(self._fd)  # O_DIRECT data may sit in the disk's write cache
                os.fsync(self._log_fd)
            except OSError as exc:
                self._unsynced_blocks += written
                raise _failed(exc, f"block store {self.path}", "syncing") from None
            self._synced_lsn = max(self._synced_lsn, lsn)

    # --- bookkeeping --------------------------------------------------------------------------
    def lengths(self) -> np.ndarray:
        return self._map.lengths.array()

    def fragments(self, pids: np.ndarray) -> np.ndarray:
        """Runs of consecutive blocks per posting: a read pays one I/O per run."""
        runs_ = self._map.runs.array()
        pids = np.asarray(pids, dtype=np.int64)
        return np.where(pids < runs_.shape[0], runs_[np.minimum(pids, runs_.shape[0] - 1)], 0)

    def stats(self) -> dict:
        m = self._map
        with self._stats_lock:
            reads, read_bytes, by_class = self.reads, self.read_bytes, dict(self._by_class)
        return {
            "kind": "blocks", "engine": self.engine, "io_scheduler": self.mode, "direct_io": self.direct,
            "disk": self.disk, "disk_scheduler": self.disk_scheduler,
            "file_bytes": self._capacity * BLOCK, "postings": len(m), "blocks_used": m.used_blocks,
            "blocks_free": int(m.free.shape[0]) + max(0, self._capacity - m.high),
            "blocks_held": m.limbo_blocks, "log_bytes": self._log_end, "seq": self._seq,
            "reads": reads, "read_bytes": read_bytes, "reads_by_class": by_class,
            "tails_kept": len(self._tails), "tail_hits": self.tail_hits,
            "io": self._sched.stats(),  # the scheduler's counters, under the same key as RocksStore's
        }

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(errno.EBADF, f"block store {self.path} is closed")

    def close(self) -> None:
        """Stop the I/O threads, fsync, release the files; reopening works at once."""
        if self._closed:
            return
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._sched.close()
                self._sync()
                self._claim_synced()
            finally:
                self._release_files()

    def _claim_synced(self) -> None:
        """Say in the log that every record is synced (an empty record claiming it), so the
        next open need not read back the data of the last commits."""
        if self._synced_lsn <= self._claimed_lsn:
            return
        try:
            self._append_log(encode_record(self._lsn + 1, 0, {}, None, unsynced=1))
            os.fsync(self._log_fd)
        except (OSError, StorageError):
            log.warning("block store %s: could not mark the log synced; the next open checks the "
                        "last commits' data", self.path, exc_info=True)
            return
        self._lsn += 1
        self._claimed_lsn = self._lsn - 1

    def _release_files(self) -> None:
        for name in ("_fd", "_log_fd", "_lock_fd"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                os.close(fd)  # closing the LOCK fd releases the flock
                setattr(self, name, -1)
