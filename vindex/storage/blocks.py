"""Block store for raw NVMe: postings in 4 KiB blocks of one file read with O_DIRECT, a
copy-on-write posting -> block-list map, and reads queued per I/O class on io_uring rings.

Layout of the store directory::

    LOCK          flock'ed while the store is open (a second open raises IndexLockedError)
    data          the blocks, opened with O_DIRECT; grown by fallocate in steps of >= 4 MiB
    map.<gen>     map snapshot: every posting's block list, block checksums and record count
                  (``blockmap``)
    log.<gen>     the log after that snapshot: header, then one record per commit

The parts, one concern each:

- ``blockmap``: the map, its free space and limbo, and the byte formats (pure, no I/O);
- ``blocklog``: the log records, append, opening with replay, and rotation to a new snapshot;
- ``datafile``: the data file: O_DIRECT or buffered, growth, writes in pieces, read-back checks;
- ``allocator``: blocks for a commit, with a sync first where that lets it reuse blocks;
- ``tails``: the cache of partly filled tail blocks, so appends need not read them back;
- ``blockplan``: what a change rewrites, posting by posting, and the blocks it releases;
- ``blockread``: read buffers, read jobs and checksum verification;
- this module: ``BlockStore``, which composes them under its locks (the ``PostingStore``
  protocol).

A posting's records lie back to back in its blocks (a record may straddle two blocks; only the
last block is partly filled; see ``blockmap``). A commit never overwrites a block the map
points at (``blockplan``). The bytes of each tail block a commit wrote stay in memory
(``tail_cache_bytes`` in all), so the next append to that posting need not read it back. Data
blocks are written (pwrite, O_DIRECT) before the log record that points at them; the log
record is a buffered write, so it survives a process crash once ``commit`` returns; ``sync``
fdatasyncs the data file and fsyncs the log for power loss. A commit syncs on its own once
``sync_every_blocks`` blocks were written unsynced (which bounds what an open after a crash
reads back); ``close`` syncs and appends an empty record saying so. Opening loads the newest
snapshot and replays the log (``blocklog``); ``truncate_log`` writes a new snapshot and starts
log ``gen + 1`` holding only the caller's records it must keep.

Released blocks (an old tail, a replaced or dropped posting) are reused only once the commit
that released them is fsynced and every read that started before it has ended (tickets, as
in ``vindex.readers``); until then they wait in limbo (``allocator``).

Checksums: every data block has a 32-bit checksum of its 4096 bytes (``native.checksum``),
computed by the commit that writes the block and kept in the map beside the block id. Every
read that returns data (``read``: searches, gets, rebalancing; the old blocks an append
reads back) checks the blocks it gathered with one nogil kernel call before anything else
touches them; a mismatch raises ``CorruptionError`` naming the data file, the block and its
posting, never a wrong vector. The check costs a few percent of a read
(``test_checksum_cost_...`` measures it).

Reads: every block of every wanted posting, coalesced into runs of consecutive blocks, read
into a page-aligned buffer of the calling thread, checked, then compacted in place (the slack
of each posting's tail block squeezed out) so the result is the records back to back. The
reads are queued per class (``iosched``): with io_uring, one ring per class whose SQEs carry
the class's ioprio, served by a thread that sleeps on an eventfd; otherwise
(``VINDEX_NO_URING=1``, no io_uring, not x86-64) ``os.preadv`` at the class's ioprio, on the
class's worker threads or, when that pool is idle, on the caller (``IOScheduler.run``). Either
way the wait for the disk releases the GIL. A ring costs one posting's read two thread
hand-offs more than an inline preadv, but keeps a many-posting read's I/Os all in flight.

``cache_bytes`` is accepted for the ``open_store`` signature and ignored: the point of this
store is O_DIRECT reads that bypass every cache. Where O_DIRECT is refused (EINVAL), the store
uses buffered I/O and drops what it read or wrote from the page cache (``posix_fadvise``
DONTNEED); ``stats()["direct_io"]`` says which.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from typing import Iterator

import numpy as np

from vindex import native  # its kernels load on first use: numba loads when the store first reads or writes data

from ..errors import CorruptionError, IndexLockedError, StorageError
from ..iosched import CLASSES, IOScheduler, IOTargets, check_mode
from ..readers import Readers
from .allocator import allocate
from .base import Change, IOClass, PostingBatch
from .blocklog import BlockLog
from .blockmap import BLOCK, EMPTY, Entries, Entry, blocks_for
from .blockplan import Rewrite, plan
from .blockread import ReadJob, ThreadBuffers, corrupt, locate, read_table, verify
from .datafile import WRITE_PIECE, DataFile
from .diskio import Aligned, disk_scheduler, failed
from .tails import TAIL_CACHE_BYTES, TailCache
from .uring import CLASS_IOPRIO, RingScheduler

log = logging.getLogger("vindex.storage.blocks")

WRITE_CHUNK = 16 << 20    # bulk_load writes through a buffer of this size
HELD_MAX_BLOCKS = 256     # reads of at most this many blocks check and move them keeping the GIL (native.held)
PAUSE_MIN_POSTINGS = 64   # commits writing more postings pause for running searches in between
#: Default unsynced data (256 MiB) after which a commit syncs: bounds what an open reads back.
SYNC_EVERY_BLOCKS = 65536


class BlockStore:
    """Posting store on a file of 4 KiB blocks (see the module docstring).

    ``engine``: ``"io_uring"``, ``"preadv"`` or None (io_uring unless ``VINDEX_NO_URING=1``
    or unavailable). ``direct``: False skips O_DIRECT (tests); None tries it.
    ``write_piece``: bytes per pwrite (a search's reads wait behind one piece, not a whole
    commit). ``tail_cache_bytes``: budget of partly filled tail blocks kept for appends.
    ``sync_every_blocks``: unsynced data blocks after which a commit syncs.
    """

    def __init__(self, path: str, *, record_size: int, cache_bytes: int = 0, create: bool,
                 io_scheduler: str = "sla", engine: str | None = None, direct: bool | None = None,
                 write_piece: int = WRITE_PIECE, tail_cache_bytes: int = TAIL_CACHE_BYTES,
                 sync_every_blocks: int = SYNC_EVERY_BLOCKS, targets: IOTargets = IOTargets()):
        check_mode(io_scheduler)
        if not os.path.isdir(path):
            if not create:
                raise CorruptionError(f"posting store missing: {path}")
            os.makedirs(path)
        self.path = os.fspath(path)
        self.record_size = record_size
        self.mode = io_scheduler
        self.sync_every_blocks = sync_every_blocks
        self._data_path = os.path.join(self.path, "data")
        self._closed = True
        self._data: DataFile | None = None
        self._log = BlockLog(self.path, record_size)
        self._lock_fd = self._lock()
        try:
            self._data = DataFile(self._data_path, direct=direct, write_piece=write_piece)
            self.direct = self._data.direct
            self._map = self._log.load(create, self._data)
            self._sched, self.engine = self._scheduler(engine, targets)
        except BaseException:
            self._release_files()
            raise
        self._closed = False
        self._write_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._tickets = Readers()
        self._buffers = ThreadBuffers()
        self._tbuf = Aligned(1 << 16)   # old blocks an append rewrites (write lock)
        self._tails = TailCache(tail_cache_bytes)  # (write lock)
        self._stats_lock = threading.Lock()
        self.reads = self.read_bytes = 0
        self._by_class = {c.value: 0 for c in CLASSES}
        self.disk, self.disk_scheduler = disk_scheduler(self.path)
        note = " (I/O priorities have no effect under 'none')" if self.disk_scheduler == "none" else ""
        log.info("block store %s: disk %s, I/O scheduler %s%s; engine %s, direct I/O %s, queues %s",
                 self.path, self.disk, self.disk_scheduler, note, self.engine,
                 "on" if self.direct else "off", self.mode)

    # --- open ---------------------------------------------------------------------------------
    def _lock(self) -> int:
        fd = os.open(os.path.join(self.path, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise IndexLockedError(f"index store {self.path} is already open (in this or another "
                                   f"process); close it first") from None
        return fd

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
                raise corrupt(self._data_path, blocks, bad, lambda i: locate(pids, counts, i))
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

    def _read_blocks(self, blocks: np.ndarray, buf: Aligned, io: IOClass, *,
                     deadline: float | None = None, tenant: str = "default", cost: float = 1.0) -> None:
        """Read ``blocks`` into ``buf`` in order: one I/O per run of consecutive blocks."""
        table = read_table(blocks)
        prio = CLASS_IOPRIO[io] if self.mode == "sla" else None
        try:
            self._sched.run(io, ReadJob(self._data.fd, buf, table, prio), tenant=tenant, deadline=deadline, cost=cost)
        except StorageError:
            raise
        except OSError as exc:
            raise failed(exc, f"block store {self._data_path}", "reading") from None
        if not self.direct:
            self._data.advise(table[:, 0], table[:, 2])

    # --- commits ------------------------------------------------------------------------------
    def commit(self, change: Change, io: IOClass) -> int:
        """Apply ``change`` atomically; returns its log sequence number (0 without a log)."""
        with self._write_lock:
            self._check_open()
            work, released = plan(change, self._map, self._tails, self.record_size)
            if not work and change.log is None:
                return 0
            if any(w.reread.shape[0] for w in work.values()):
                self._read_back(work, io)
            self._pause(change)
            self._reclaim()
            chosen = self._allocate([blocks_for(sum(len(p) for p in w.pieces)) for w in work.values()])
            sums, tails = self._write([w.pieces for w in work.values()], chosen)
            self._pause(change)
            entries: Entries = {}
            for (pid, w), new, new_sums in zip(work.items(), chosen, sums):
                entries[pid] = (Entry(np.concatenate((w.kept, new)), w.records,
                                      np.concatenate((w.kept_sums, new_sums))) if w.records else None)
            seq = self._log.commit(entries, change.log)
            # the commit is in the log: from here on nothing may fail
            self._apply(entries, np.concatenate(chosen) if chosen else EMPTY, released)
            self._tails.keep(entries.items(), tails)
            if self._data.unsynced_blocks >= self.sync_every_blocks:
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

    def _read_back(self, work: dict[int, Rewrite], io: IOClass) -> None:
        """Read the old blocks that appends rewrite (one request), check them, and prefix
        their bytes to the new ones."""
        pids = [pid for pid, w in work.items() if w.reread.shape[0]]
        ws = [work[pid] for pid in pids]
        counts = np.array([w.reread.shape[0] for w in ws], dtype=np.int64)
        total = int(counts.sum())
        if self._tbuf.size < total * BLOCK:  # not the thread's read buffer: a caller may hold a result
            self._tbuf = Aligned(total * BLOCK)
        buf = self._tbuf
        blocks = np.concatenate([w.reread for w in ws])
        self._read_blocks(blocks, buf, io)

        def where(i: int) -> tuple[int, int, int]:  # numbered among the posting's old blocks
            pid, nth, n = locate(np.asarray(pids), counts, i)
            kept = work[pid].kept.shape[0]
            return pid, kept + nth, kept + n

        verify(self._data_path, buf, blocks, np.concatenate([w.reread_sums for w in ws]), where)
        start = 0
        for w, n in zip(ws, counts.tolist()):
            w.pieces.insert(0, bytes(buf.arr[start * BLOCK:start * BLOCK + w.reread_bytes]))
            start += n

    def _reclaim(self) -> int:
        return self._map.reclaim(self._log.synced_lsn, self._tickets.drained)

    def _allocate(self, sizes: list[int]) -> list[np.ndarray]:
        return allocate(self._map, self._data, sizes, sync=self._sync, reclaim=self._reclaim)

    def _write(self, pieces: list[list], chosen: list[np.ndarray]) -> tuple[list[np.ndarray], list[bytes]]:
        return self._data.write_postings(pieces, chosen, self._sched.yield_to_interactive)

    def _apply(self, entries: Entries, taken: np.ndarray, released: np.ndarray) -> None:
        """Install a durable commit in memory: new entries first, then the ticket boundary, so
        a read that can still hold a released block has a ticket below it."""
        self._map.take(taken)
        self._map.install(entries)
        self._map.release(released, self._log.lsn, self._tickets.now())

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
                written, ends = self._write([[raw[offsets[i] * rs:offsets[i + 1] * rs]] for i in range(lo, hi)],
                                            chosen[lo:hi])
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
            self._tails.keep(fresh, tails)

    # --- the log ------------------------------------------------------------------------------
    def log_since(self, seq: int, io: IOClass = IOClass.BACKGROUND) -> Iterator[tuple[int, bytes]]:
        """The caller's log records with sequence number > ``seq``, in order."""
        with self._write_lock:
            self._check_open()
            return self._log.since(seq)

    def continue_after(self, seq: int, io: IOClass = IOClass.BACKGROUND) -> None:
        if seq > self._log.seq:
            # the caller saved its state after commits the log no longer holds (cut here because
            # their data blocks, synced, fail their checksums; or a log truncated by hand): its
            # state would name missing records
            why = ("after commits whose data blocks fail their checksums were cut" if self._log.cut_seq is not None
                   else "(a truncated log file?)")
            raise CorruptionError(
                f"block store {self.path}: the caller's state covers log record {seq}, but the "
                f"log ends at {self._log.seq} {why}")
        with self._write_lock:
            self._log.seq = max(self._log.seq, seq)

    def truncate_log(self, upto: int, io: IOClass = IOClass.BACKGROUND) -> None:
        """Drop the caller's records <= ``upto``: a new snapshot covering every commit, and a
        new log generation holding only the records kept."""
        with self._write_lock, self._sync_lock:
            self._check_open()
            self._rotate(keep_above=upto)

    def _rotate(self, keep_above: int, overlay: Entries | None = None) -> None:
        """A new log generation and a snapshot of the map plus ``overlay`` (``BlockLog.rotate``).
        Holds both locks."""
        entries = self._map.entries()
        entries.update(overlay or {})
        self._log.rotate(keep_above, entries, self._data)

    def sync(self, io: IOClass = IOClass.UPDATE) -> None:
        """Make every committed change durable against power loss."""
        self._check_open()
        self._sync()

    def _sync(self) -> None:
        with self._sync_lock:
            lsn = self._log.lsn  # records up to here are in the log already
            written, self._data.unsynced_blocks = self._data.unsynced_blocks, 0
            try:
                self._sched.yield_to_interactive()  # a flush holds up the reads queued behind it
                if written:
                    os.fdatasync(self._data.fd)  # O_DIRECT data may sit in the disk's write cache
                os.fsync(self._log.fd)
            except OSError as exc:
                self._data.unsynced_blocks += written
                raise failed(exc, f"block store {self.path}", "syncing") from None
            self._log.synced_lsn = max(self._log.synced_lsn, lsn)

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
            "file_bytes": self._data.capacity * BLOCK, "postings": len(m), "blocks_used": m.used_blocks,
            "blocks_free": int(m.free.shape[0]) + max(0, self._data.capacity - m.high),
            "blocks_held": m.limbo_blocks, "log_bytes": self._log.end, "seq": self._log.seq,
            "reads": reads, "read_bytes": read_bytes, "reads_by_class": by_class,
            "tails_kept": len(self._tails), "tail_hits": self._tails.hits,
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
                self._log.claim_synced()
            finally:
                self._release_files()

    def _release_files(self) -> None:
        if self._data is not None:
            self._data.close()
        self._log.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the LOCK fd releases the flock
            self._lock_fd = -1
