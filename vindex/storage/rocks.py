"""RocksDB posting store (rocksdict), the embedded default.

Layout, one RocksDB directory with column families:

* ``postings``: key ``(pid u32 BE, chunk u32 BE)`` -> records. An append writes one new chunk
  (rocksdict has no merge operator, and rewriting a whole posting per insert would multiply
  write traffic); a replace folds a posting into one chunk, at a key outside the posting's
  current chunks. Readers fetch every chunk of every wanted posting with one multi-get,
  which releases the GIL; what they read they also keep in memory (within ``KEPT_SHARE`` of
  the cache, see ``kept``): whole postings while there is room, else what follows a
  posting's first chunk, so that the next read of the posting fetches only its first chunk,
  if that, and the chunks appended since. A search scans a posting kept whole where it lies.
* ``pdir``: key pid -> ``(chunks u32, records u32, first chunk u32)``, the posting directory
  (the posting is chunks ``first .. first + chunks - 1``; values of stores written before
  ``first`` existed are 8 bytes, and mean ``first = 0``), updated in the same WriteBatch as
  the chunks it describes and loaded into memory at open.
* ``log``: key seq u64 BE -> operation-log record, written in the same WriteBatch as the
  posting changes it describes.
* ``payload``: key ``(ext u64 BE, kind u8)`` -> a record's metadata and document, one value per
  record (see ``vindex.payloads``), written in the same WriteBatch as its vector.
* the default column family: ``LOG_FLOOR`` -> the highest ``log`` seq a checkpoint covered
  (u64 BE), written with each truncation of the log (see ``continue_after``).

Writes go through RocksDB's WAL without a sync (they survive a process crash); ``sync()``
flushes the WAL with fsync. RocksDB checksums every WAL record and SST block; a failed check
surfaces as ``CorruptionError``, an I/O failure (disk full) as ``StorageError``. Opening
replays the WAL to its end: an incomplete last record (a torn write) ends it, and any other
damage fails the open with ``CorruptionError`` naming the log file, before anything is
written (RocksDB's default would end the replay at the damage and carry on without the
acknowledged writes after it).

A full disk (see ``diskfull``): a write that fails is not applied, and RocksDB then refuses
every later write; the store answers writes with ``StorageError(ENOSPC)`` without trying
until the disk has room for its write-ahead log plus ``resume_free_bytes``, then reopens its
RocksDB handle in place (readers wait meanwhile) and writes again. A store opened on a full
disk opens read-only (RocksDB cannot open for writing without writing) and becomes writable
the same way.

Reads go through an ``IOScheduler``: under ``sla`` each class has its own multi-get slots, so
a search never waits for a rebalancing read to finish; the caller copies the values into its
own buffer. Compaction is rate-limited and runs in RocksDB's low-priority pool.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import struct
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import numpy as np
from rocksdict import (AccessType, BlockBasedOptions, Cache, DBCompressionType, DBRecoveryMode, Env,
                       MemtableFactory, Options, Rdict, ReadOptions, WriteBatch, WriteOptions)

from vindex import native
from vindex.native.kept_table import CHUNKS_MASK as _CHUNKS_MASK

from ..errors import CorruptionError, IndexLockedError, StorageError
from ..iosched import IOScheduler, IOTargets
from .base import Change, InPlace, IOClass, PostingBatch, ReadBuffers
from .directory import Lengths
from .diskfull import NO_SPACE_ERRNOS, HandleGate, free_bytes, no_space_errno, wal_bytes
from .codes import PostingCodes
from .kept import GEN, INITIAL_BYTES, ROWS, SEQ, SPAN, START, KeptPostings

log = logging.getLogger(__name__)

_CFS = ("postings", "pdir", "log", "payload")
_PDIR = struct.Struct(">III")  # posting directory value: (chunks, records, first chunk)
_PDIR_V1 = struct.Struct(">II")  # (chunks, records) of stores written before ``first``
_PID = struct.Struct(">I")   # posting directory key
_KEY = struct.Struct(">II")  # (pid, chunk) big-endian, so a posting's chunks are adjacent
_SEQ = struct.Struct(">Q")   # operation-log key
#: Key (default column family) of the highest log seq a checkpoint covered.
LOG_FLOOR = b"log_floor"
#: How RocksDB's info log names a write-ahead log it could not replay.
_WAL_DROPPED = re.compile(r"(\d+\.log): dropping \d+ bytes")
#: Flush and compaction write rate under ``io_scheduler="sla"`` (DESIGN.md: capping background
#: writes brings the foreground reads' p99 back near its level without them).
BACKGROUND_WRITE_BYTES_PER_S = 96 << 20
#: Default for ``RocksStore(early_write_keys=)``: a commit writing more chunks (or more than
#: ``EARLY_WRITE_BYTES``) writes them ahead in pieces of at most this size (see
#: ``RocksStore._write_ahead``): rocksdict's ``write`` holds the GIL, and a search whose read
#: returns meanwhile waits for the piece; pieces this small cost an ingest without searches
#: nothing measurable, while pieces four times larger hold the GIL noticeably longer.
EARLY_WRITE_KEYS = 64
EARLY_WRITE_BYTES = 64 * 1024
#: Reads of a posting set that a concurrent commit moved (see ``RocksStore.read``) before
#: giving up on finding the missing chunks.
READ_ATTEMPTS = 1000
#: A read of at least this many postings that a concurrent commit disturbed reads again only
#: the postings it moved, not all of them (see ``RocksStore._reread_moved``).
REREAD_MOVED_MIN = 64
#: Default share of ``cache_bytes`` (on top of the block cache) that postings read may take in
#: memory (see ``RocksStore._kept``).
KEPT_SHARE = 0.25
#: The vector file of the codes' rerank (``codes.VectorFile``) is the store's path with this added.
VECTORS_SUFFIX = "-vectors.f32"
#: Postings per read when the codes are built at open.
CODES_BUILD_READ = 1024
#: Postings, spread over the whole store, an opened store's quantizer is trained on (postings
#: are numbered region by region: the first ones read would fit the range to a few regions).
CODES_TRAIN_POSTINGS = 512
#: Default for ``RocksStore(resume_free_bytes=)``: room needed, beyond the write-ahead logs
#: that reopening writes out as tables, before a store stopped by a full disk writes again.
RESUME_FREE_BYTES = 1 << 20


def _key(pid: int, chunk: int) -> bytes:
    return _KEY.pack(pid, chunk)


@contextmanager
def _errors(path: str, doing: str) -> Iterator[None]:
    """Turn rocksdict's plain exceptions into vindex errors naming the store and the step."""
    try:
        yield
    except Exception as exc:
        if type(exc) is not Exception:  # not rocksdict's plain error: ours, or a real bug
            raise
        msg = str(exc)
        if msg.startswith("Corruption"):
            raise CorruptionError(f"posting store {path}: {msg} (while {doing})") from None
        if msg.startswith("IO error"):
            raise _storage_error(path, msg, doing) from None
        raise


def _damaged_log(path: str, exc: Exception) -> str:
    """`` (write-ahead log <file> is damaged ...)`` for a failed open that RocksDB's info log
    (``LOG``) blames on a write-ahead log: its error message names no file."""
    if not str(exc).startswith("Corruption"):
        return ""
    try:
        with open(os.path.join(path, "LOG"), errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return ""
    for line in reversed(lines):  # "[WARN] ... <path>/000012.log: dropping 32768 bytes; Corruption: ..."
        found = _WAL_DROPPED.search(line)
        if found:
            return (f" (write-ahead log {os.path.join(path, found.group(1))} is damaged, not just torn at "
                    f"its end: writes acknowledged after the damage cannot be replayed; restore the index "
                    f"from a backup)")
    return ""


def _storage_error(path: str, msg: str, doing: str) -> StorageError:
    code = no_space_errno(msg)
    if code is None:
        return StorageError(errno.EIO, f"posting store {path}: {msg} (while {doing})")
    return StorageError(code, f"posting store {path}: the disk is full ({msg}, while {doing}); "
                              f"writes resume once space is freed")


def _again(err: StorageError) -> StorageError:
    """A fresh copy of ``err`` to raise (raising one exception object again and again would
    grow its traceback with every raise)."""
    return StorageError(err.errno, err.strerror)


def _open_error(path: str, exc: Exception) -> Exception:
    """The vindex error for rocksdict's failure to open ``path``."""
    msg = str(exc)
    if "lock" in msg.lower():
        return IndexLockedError(f"index store {path} is already open (in this or another process); close it first")
    if no_space_errno(msg) is not None:
        return _storage_error(path, msg, "opening")
    return CorruptionError(f"cannot open posting store {path}: {exc}{_damaged_log(path, exc)}")


def _options(cache: Cache, create: bool, io_scheduler: str) -> tuple[Options, dict[str, Options]]:
    base = Options(raw_mode=True)
    # Replay the WAL to its end or fail: only an incomplete last record (a torn write) is
    # the end of the log. Point-in-time recovery would stop at a damaged record and open
    # without every acknowledged write after it, then flush that state for good.
    base.set_wal_recovery_mode(DBRecoveryMode.tolerate_corrupted_tail_records())
    base.create_if_missing(create)
    base.create_missing_column_families(True)
    base.set_max_background_jobs(2)
    if io_scheduler == "sla":
        # Flush and compaction writes are the store's own background I/O: capped in rate, and
        # compaction's (low-priority pool) threads at idle I/O and CPU priority, so that
        # searches' reads do not queue behind them in the disk.
        base.set_ratelimiter(BACKGROUND_WRITE_BYTES_PER_S, 100_000, 10)
        env = Env()
        env.lower_thread_pool_io_priority()
        env.lower_thread_pool_cpu_priority()
        base.set_env(env)
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_block_size(16 * 1024)
    table.set_bloom_filter(10, False)
    base.set_block_based_table_factory(table)
    postings = Options(raw_mode=True)
    postings.set_block_based_table_factory(table)
    # float32 vectors barely compress; decompression would sit on the search path
    postings.set_compression_type(DBCompressionType.none())
    postings.set_write_buffer_size(128 * 1024 * 1024)
    small = Options(raw_mode=True)
    small.set_block_based_table_factory(table)
    # The directory is read only when the store opens (a full scan), never by key: an
    # unsorted memtable takes a large commit's entries about ten times faster than the
    # default skip list, and ``write`` holds the GIL that long. (A vector memtable
    # cannot take concurrent writers; commits are serialised anyway.)
    base.set_allow_concurrent_memtable_write(False)
    directory = Options(raw_mode=True)
    directory.set_block_based_table_factory(table)
    directory.set_memtable_factory(MemtableFactory.vector())
    payload = Options(raw_mode=True)  # metadata and documents: JSON and text compress well
    payload.set_block_based_table_factory(table)
    return base, {"postings": postings, "pdir": directory, "log": small, "payload": payload}


def _uncached_reads() -> ReadOptions:
    opts = ReadOptions()
    opts.fill_cache(False)
    return opts


class _ReadPlan:
    """One read's keys and how its chunks make up its postings (see ``RocksStore.read``).
    Per-posting lists cover the postings gathered into the read's buffer: all of them, or
    with ``in_place`` those not left where they are kept."""

    __slots__ = ("keys", "counts", "held", "leads", "from_memory", "learn", "pids", "gens", "spans", "in_place")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.counts: list[int] = []  # keys fetched per posting
        self.held: list[np.ndarray | None] = []  # per posting: chunks of it from memory
        self.leads: list[bool] = []  # per posting: they include its first chunk
        self.from_memory = False  # any posting's chunks came from memory
        self.learn: list[tuple[int, int, int]] = []  # (posting index, span word, its first key's index)
        self.pids: list[int] = []
        self.gens: list[int] = []
        self.spans: list[int] = []  # span words the keys were made from
        # postings kept whole and unchanged, left in memory: (positions in the read, their
        # first rows, rows, entry numbers)
        self.in_place: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None


class RocksStore:
    """Posting store on RocksDB.

    ``early_write_keys``: a commit writing more chunks than this writes them ahead in pieces
    of this many (``_write_ahead``). ``kept_initial_bytes``: the first size of the ring of
    postings kept in memory (``KeptPostings``). ``resume_free_bytes``: room needed beyond
    the write-ahead logs before a store stopped by a full disk reopens and writes again.
    ``resident_bytes``: bound on the postings kept in memory (None: ``KEPT_SHARE`` of
    ``cache_bytes``). ``codes_bytes``: bound on the int8 codes of postings kept in memory
    (``codes``; 0: none).
    """

    def __init__(self, path: str, *, record_size: int, cache_bytes: int, create: bool,
                 io_scheduler: str = "sla", targets: IOTargets = IOTargets(),
                 early_write_keys: int = EARLY_WRITE_KEYS, kept_initial_bytes: int = INITIAL_BYTES,
                 resume_free_bytes: int = RESUME_FREE_BYTES, resident_bytes: int | None = None,
                 codes_bytes: int = 0):
        self.record_size = record_size
        self.early_write_keys = early_write_keys
        self.resume_free_bytes = resume_free_bytes
        self.path = path
        self._cache = Cache(max(cache_bytes, 1 << 20))
        opts, cf_opts = _options(self._cache, create, io_scheduler)
        if not create and not os.path.isdir(path):
            raise CorruptionError(f"posting store missing: {path}")
        self._open_args = (opts, cf_opts)
        # the failure that stopped writes (a full disk), until the handle is reopened
        self._write_error: StorageError | None = None
        self._gate = HandleGate()  # readers of the handle; ``_writable`` replaces it
        self._attach(self._open_db(create))
        self._write_lock = threading.Lock()
        # per pid: ``first << 32 | chunks`` in one word, so that a reader sees both from the
        # same commit; ``_dir_version`` is odd while a commit's batch lands and its directory
        # changes (a seqlock: a read that raced it and found chunks missing reads again)
        self._spans = Lengths()
        self._lengths = Lengths()
        self._dir_version = 0
        # What readers found of postings, per pid: generation, span word of the chunks read,
        # their records, whether those include the first chunk. A read then fetches only the
        # chunks appended since (and the first, if not held): a flat-out ingest appends a
        # chunk to most postings per batch, faster than the background folds them, and a
        # multi-get's cost grows with its keys (a dozen keys a posting cost several times one
        # key a posting); a whole posting held costs no multi-get at all, which makes a search
        # of few postings markedly faster. Chunks never
        # change while a posting keeps its first chunk; a replace or drop moves it and bumps
        # ``_gens``. See ``_keep`` for what is kept.
        kept_bytes = int(cache_bytes * KEPT_SHARE) if resident_bytes is None else resident_bytes
        self._kept = KeptPostings(kept_bytes, record_size, kept_initial_bytes)
        self._gens = Lengths()
        self._load_directory()
        self._seq = self._last_seq()
        self._buffers = ReadBuffers()
        self._io = IOScheduler(io_scheduler, targets=targets)
        self.reads = 0
        self.resident_reads = 0  # postings small searches scanned where they are kept (``scan_resident``)
        self.resident_code_scans = 0  # of those, scanned as their codes first (``codes.scan_kept``)
        self.read_bytes = 0
        self._codes: PostingCodes | None = None
        # the codes of a store opened are built by a thread the first search starts
        # (``build_codes``); a new store's are made as it is written
        self._codes_build: threading.Thread | None = None
        self._codes_begun = create
        self._codes_lock = threading.Lock()
        self._codes_stop = threading.Event()
        if codes_bytes > 0:
            self._codes = PostingCodes(codes_bytes, record_size // 4 - 2, path.rstrip(os.sep) + VECTORS_SUFFIX)

    # --- open ---------------------------------------------------------------------------------
    def _open_db(self, create: bool) -> Rdict:
        """Open the database for writing; on a full disk, an existing one read-only (opening
        for writing writes out the logs' tables first), with writes refused until room is back."""
        opts, cf_opts = self._open_args
        try:
            db = Rdict(self.path, opts, column_families=cf_opts)
            self._write_error = None
            return db
        except Exception as exc:  # rocksdict raises plain Exception for open failures
            err = _open_error(self.path, exc)
            if create or not isinstance(err, StorageError):
                raise err from None
        try:
            db = Rdict(self.path, opts, column_families=cf_opts,
                       access_type=AccessType.read_only(error_if_log_file_exist=False))
        except Exception:
            raise err from None
        self._write_error = err
        return db

    def _attach(self, db: Rdict) -> None:
        self._db = db
        self._cf = {name: db.get_column_family(name) for name in _CFS}
        self._handle = {name: db.get_column_family_handle(name) for name in _CFS}
        # Background reads leave the block cache to searches: rebalancing reads several times
        # the cache's size during a drain, and filling it with those blocks slowed the drain
        self._uncached = db.get_column_family("postings")
        self._uncached.set_read_options(_uncached_reads())

    def _detach(self) -> None:
        """Close the database. Column-family handles keep it alive: they go first, so that
        its LOCK file is released and it can be opened again in this process."""
        for rdict in (*self._cf.values(), self._uncached, self._db):
            try:
                rdict.close()
            except Exception as exc:  # rocksdict flushes in close, and closes all the same
                if self._write_error is None or type(exc) is not Exception:
                    raise
        self._cf.clear()
        self._handle.clear()

    def _load_directory(self) -> None:
        for key, value in self._cf["pdir"].items():
            (pid,) = struct.unpack(">I", key)
            if len(value) == _PDIR_V1.size:
                (chunks, records), first = _PDIR_V1.unpack(value), 0
            else:
                chunks, records, first = _PDIR.unpack(value)
            for table, v in ((self._spans, first << 32 | chunks), (self._lengths, records)):
                table.ensure(pid)
                table[pid] = v

    def _last_seq(self) -> int:
        for key in self._cf["log"].keys(backwards=True):
            return struct.unpack(">Q", key)[0]
        return 0

    # --- reads --------------------------------------------------------------------------------
    def read(self, pids: np.ndarray, io: IOClass, *, deadline: float | None = None,
             tenant: str = "default", in_place: bool = False) -> PostingBatch:
        pids = np.asarray(pids, dtype=np.int64)
        kept = self._kept
        token = 0
        try:
            whole = False
            for attempt in range(READ_ATTEMPTS):
                version = self._dir_version
                gens = self._gens.get(pids)
                found = None
                if attempt == 0 and kept.capacity:
                    found, token = kept.find(pids)
                plan = self._chunk_keys(pids, gens, found, in_place)
                keys = plan.keys
                if keys:
                    values = self._io.run(io, lambda: self._multi_get(keys, io), tenant=tenant, deadline=deadline,
                                          cost=len(pids))
                else:
                    values = []
                    if len(pids):
                        self._io.admit(tenant, len(pids))
                # a replace moves a posting to new keys and deletes the old ones in one batch: a
                # read that resolved the keys before it and fetched after finds them gone; a read
                # that took chunks from memory also checks that their posting was not moved meanwhile
                still = version % 2 == 0 and version == self._dir_version
                if (still or not plan.from_memory or self._unmoved(pids, gens)) and (still or None not in values):
                    whole = True
                    break
                if attempt == 0 and plan.in_place is None and len(plan.counts) >= REREAD_MOVED_MIN:
                    plan, values = self._reread_moved(plan, values, io, tenant=tenant, deadline=deadline)
                    break  # not ``whole``: nothing of a spliced read is kept
                kept.release(token)
                token = 0
                time.sleep(0)  # let the commit update the directory
            data, offsets = self._gather(values, plan)
            # what was copied is free again (else what this read keeps could not push it out)
            if plan.in_place is None:
                kept.release(token)
                token = 0
            else:
                kept.repin(token, int(plan.in_place[3].min()))
            if whole and plan.learn and kept.capacity:
                self._keep(plan, values, data, offsets, search=io is IOClass.INTERACTIVE)
            if whole and io is IOClass.INTERACTIVE and self._codes is not None and plan.pids:
                self._learn_codes(plan, data, offsets)
            self.reads += len(pids)
            self.read_bytes += data.shape[0]
            if plan.in_place is None:
                return PostingBatch(data, offsets)
            index, starts, rows, _ = plan.in_place
            self.read_bytes += int(rows.sum()) * self.record_size
            held, token = token, 0  # released by the caller, through the batch
            return PostingBatch(data, offsets, InPlace(kept.rows, index, starts, starts + rows,
                                                       lambda: kept.release(held)))
        finally:
            kept.release(token)

    def scan_resident(self, sel: np.ndarray, counts: np.ndarray, slot: np.ndarray, queries: np.ndarray,
                      metric: int, versions: np.ndarray, vid2ext: np.ndarray, heap_d: np.ndarray,
                      heap_i: np.ndarray, sizes: np.ndarray, tenant: str = "default", coded: bool = False
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int] | None:
        """The fast path of a small search (``native.fast.scan_resident``): scan the chosen
        postings (``sel``/``counts``, heads per query) that are kept in memory, whole and
        current, where they lie, into the heaps; returns ``(miss pids, q_ptr, q_idx,
        postings scanned, records scanned)``, the postings left to ``read``. None, with the
        heaps emptied, when a commit changed the directory meanwhile: the caller reads them
        all. The postings scanned count against ``tenant``'s quota as a read's do. With
        nothing kept, every posting is a miss (for the codes, then the store). ``coded``: a
        search of one query scans the kept postings that are also coded as codes first, with
        an exact rerank from the kept rows (the same ids, distances to the last bit, a quarter of
        the bytes read)."""
        if not self._kept.capacity:
            return (*native.held.group_by_posting(sel, counts, slot), 0, 0)
        out = self._on_kept_coded(lambda table, kept, gens, spans, codes: native.held.scan_resident(
            sel, counts, slot, table, kept.rows_f, kept.rows, gens, spans, versions, vid2ext, queries, metric,
            heap_d, heap_i, sizes, codes), sizes, tenant, 3, coded and queries.shape[0] == 1)
        return out[0][:5] if out is not None and out[1] else None

    def search_resident(self, head_args: tuple, m: int, eps: float, sel: np.ndarray, sel_d: np.ndarray,
                        slot: np.ndarray, queries: np.ndarray, metric: int, versions: np.ndarray,
                        vid2ext: np.ndarray, heap_d: np.ndarray, heap_i: np.ndarray, sizes: np.ndarray,
                        tenant: str = "default", coded: bool = False) -> tuple | None:
        """A small search's head choice and resident scan in one kernel call that keeps the
        GIL (``native.held.search_resident``; ``head_args`` from ``HeadGraph.fused_args``):
        ``(head counts, (miss pids, q_ptr, q_idx, postings scanned, records scanned) or
        None)``, the heads in ``sel``; the second None, with the heaps emptied, when a commit
        changed the directory during the call: the caller reads every chosen posting. None
        (nothing done) when nothing is kept or a commit is landing. ``coded``: as
        ``scan_resident``'s."""
        out = self._on_kept_coded(lambda table, kept, gens, spans, codes: native.held.search_resident(
            queries, metric, m, eps, *head_args, sel, sel_d, slot, table, kept.rows_f, kept.rows, gens, spans,
            versions, vid2ext, heap_d, heap_i, sizes, codes), sizes, tenant, 4, coded and queries.shape[0] == 1)
        if out is None:
            return None
        return out[0][0], (out[0][1:6] if out[1] else None)

    def _on_kept_coded(self, kernel, sizes: np.ndarray, tenant: str, hits_at: int, coded: bool):
        """``_on_kept`` of ``kernel(table, kept, gens, spans, codes)``, ``codes`` the code
        ring's arrays pinned for the call when ``coded``, the codes are built and records
        are wide enough to gain (``native.fast.CODES_FIRST_MIN_DIM``), else
        ``native.fast.NO_CODES``; the kernel's last result is the kept postings it scanned
        as codes (``resident_code_scans``)."""
        codes = self._codes
        if not coded or codes is None or not codes.ready or codes.dim < native.fast.CODES_FIRST_MIN_DIM:
            out = self._on_kept(lambda *a: kernel(*a, native.fast.NO_CODES), sizes, tenant, hits_at)
        else:
            ring = codes.ring
            table, token = ring.pin_all()
            try:
                arrays = (table, codes.ring_b, codes.lo, codes.scale, codes.error_bound)
                out = self._on_kept(lambda *a: kernel(*a, arrays), sizes, tenant, hits_at)
            finally:
                ring.release(token)
        if out is not None and out[1]:
            self.resident_code_scans += out[0][-1]
        return out

    def _on_kept(self, kernel, sizes: np.ndarray, tenant: str, hits_at: int):
        """``(kernel(table, kept, gens, spans), current)`` on the pinned table of kept postings,
        under the directory's seqlock: None if a commit is landing (or nothing is kept);
        ``current`` False (heaps emptied) if one landed meanwhile, else the postings it
        scanned (its result's ``hits_at``) are admitted against ``tenant``'s quota."""
        kept = self._kept
        version = self._dir_version
        if version % 2 or not kept.capacity:
            return None
        table, token = kept.pin_all()
        try:
            out = kernel(table, kept, self._gens.array(), self._spans.array())
        finally:
            kept.release(token)
        if version != self._dir_version:
            sizes[:] = 0
            return out, False
        hits = out[hits_at]
        if hits:
            self._io.admit(tenant, hits)
            self.reads += hits
            self.resident_reads += hits
        return out, True

    def scan_codes(self, grouped: tuple, sel: np.ndarray, counts: np.ndarray, queries: np.ndarray, metric: int,
                   versions: np.ndarray, vid2ext: np.ndarray, heap_d: np.ndarray, heap_i: np.ndarray,
                   sizes: np.ndarray, rerank: int, tenant: str = "default"
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
        """The fast path's misses ``grouped`` (as ``scan_resident`` returns them; ``sel``/
        ``counts``: the heads chosen, which set the scan's order) scanned as
        int8 codes where the store holds them whole and current (``native.codes.scan_codes``),
        the best ``rerank`` of each query scored exactly against its float32 vector into the
        heaps; returns what is left to ``read``, as ``grouped``, counts added. A commit that
        changed the directory meanwhile leaves the heaps as they were and ``grouped`` to read."""
        codes = self._codes
        pids, q_ptr, q_idx, postings, scanned = grouped
        if codes is None or rerank <= 0 or not pids.shape[0]:
            return grouped
        if not self._codes_begun:
            self._start_codes_build()
        if not codes.ready:
            return grouped
        version = self._dir_version
        if version % 2:
            return grouped
        ring, nq = codes.ring, queries.shape[0]
        cand_d = np.empty((nq, rerank), dtype=np.float32)
        cand_v = np.empty((nq, rerank), dtype=np.int64)
        cand_n = np.zeros(nq, dtype=np.int32)
        table, token = ring.pin_all()
        try:
            miss, m_ptr, m_idx, hits, coded = native.codes.scan_codes_held(
                pids, q_ptr, q_idx, sel, counts, table, ring.rows, codes.ring_b, self._gens.array(),
                self._spans.array(), versions, vid2ext, queries, metric, codes.lo, codes.scale, cand_d, cand_v, cand_n)
        finally:
            ring.release(token)
        if version != self._dir_version:
            return grouped
        codes.rerank_reads += native.codes.rerank_held(cand_d, cand_v, cand_n, codes.vectors.fd, queries, metric,
                                                       vid2ext, heap_d, heap_i, sizes, codes.error_bound)
        if hits:
            self._io.admit(tenant, hits)
            self.reads += hits
            codes.code_reads += hits
        return miss, m_ptr, m_idx, postings + hits, scanned + coded

    def _start_codes_build(self) -> None:
        with self._codes_lock:  # one thread, started once
            if not self._codes_begun:
                self._spawn_codes_build(self._codes)

    def _spawn_codes_build(self, codes: PostingCodes) -> None:
        """Start the thread that builds ``codes`` (``_codes_lock`` held)."""
        self._codes_begun = True
        self._codes_build = threading.Thread(target=self.build_codes, args=(codes,), name="vindex-codes", daemon=True)
        self._codes_build.start()

    def wait_codes(self, timeout: float | None = None) -> bool:
        """Wait until a build of the codes that has started is done (and one a build started
        as it ended: ``_maybe_retrain_codes``); False on ``timeout``."""
        end = None if timeout is None else time.monotonic() + timeout
        while (build := self._codes_build) is not None:
            build.join(None if end is None else max(end - time.monotonic(), 0.0))
            if build.is_alive():
                return False
            if self._codes_build is build:
                return True
        return True

    def _maybe_retrain_codes(self) -> None:
        """Train a wider quantizer once the codes refused enough postings (records past its
        range: ``PostingCodes.wants_retrain``), and code every posting again in the
        background. Searches meanwhile scan what the new codes hold and read the rest."""
        codes = self._codes
        if codes is None or not codes.wants_retrain:
            return
        with self._codes_lock:
            build = self._codes_build
            running = build is not None and build.is_alive() and build is not threading.current_thread()
            if self._codes is not codes or running or self._codes_stop.is_set():
                return  # swapped already, or a build runs (it will refuse again: retrained after)
            self._codes = codes.successor()
            self._spawn_codes_build(self._codes)
        log.info("posting codes: %d postings past the quantizer's range; trained a wider one, coding again",
                 codes.refused)

    def build_codes(self, codes: PostingCodes | None = None) -> None:
        """Code every posting into ``codes`` (default: the store's; reading the whole store
        once, outside the block cache) and write the vector file
        (``stats()["codes_build_seconds"]`` says how long it took). Commits go on meanwhile:
        a piece of postings a commit moved while it was read reads nothing wrong (a
        posting's chunks never change under its generation and first chunk, and its codes
        are named after what was read), so it is kept as read."""
        codes = self._codes if codes is None else codes
        started = time.perf_counter()
        pids = np.flatnonzero(self._spans.array() & _CHUNKS_MASK).astype(np.int64)
        rs = self.record_size
        if codes.lo is None and pids.size:  # an opened store: train on postings from everywhere
            spread = np.unique(np.linspace(0, pids.size - 1, min(pids.size, CODES_TRAIN_POSTINGS)).astype(np.int64))
            got = self._read_whole(pids[spread])
            if got is not None:
                codes.train(got[1].view(np.float32).reshape(-1, rs // 4))
        for lo in range(0, pids.shape[0], CODES_BUILD_READ):
            if self._codes_stop.is_set() or self._codes is not codes:
                return
            got = self._read_whole(pids[lo:lo + CODES_BUILD_READ])
            if got is None:  # those postings are coded when a search reads them
                continue
            plan, data, offsets = got
            offs = offsets.tolist()
            read = [(p, span, gen, data[offs[i] * rs:offs[i + 1] * rs])
                    for i, (p, span, gen) in enumerate(zip(plan.pids, plan.spans, plan.gens))]
            self._keep_coded(codes, read)
        codes.build_seconds = time.perf_counter() - started
        self._maybe_retrain_codes()

    def _read_whole(self, pids: np.ndarray) -> tuple["_ReadPlan", np.ndarray, np.ndarray] | None:
        """``(plan, record bytes, offsets)`` of postings ``pids`` read whole in the background
        class, outside the block cache; None if a commit changed the directory meanwhile."""
        version = self._dir_version
        plan = self._chunk_keys(pids, self._gens.get(pids), None, False)
        values = self._multi_get(plan.keys, IOClass.BACKGROUND) if plan.keys else []
        if version % 2 or version != self._dir_version:
            return None
        data, offsets = self._gather(values, plan)
        return plan, data, offsets

    def _learn_codes(self, plan: "_ReadPlan", data: np.ndarray, offsets: np.ndarray) -> None:
        """Code the postings a search read whole whose codes the store does not hold as they
        were read (pushed out, or forgotten by an append)."""
        codes, rs = self._codes, self.record_size
        pids = np.asarray(plan.pids, dtype=np.int64)
        found, token = codes.ring.find(pids)
        codes.ring.release(token)
        usable, _, _ = native.kept.usable(found, np.asarray(plan.gens, dtype=np.int64),
                                          np.asarray(plan.spans, dtype=np.int64))
        offs = offsets.tolist()
        codes.keep([(plan.pids[i], plan.spans[i], plan.gens[i], data[offs[i] * rs:offs[i + 1] * rs])
                    for i in np.flatnonzero(~usable).tolist()],
                   # a search's postings are a few regions: an opened store's build trains on all
                   train=self._codes_build is None)
        self._maybe_retrain_codes()

    def _code_commit(self, change: Change, pids: np.ndarray, before: np.ndarray, after: np.ndarray) -> None:
        """Keep the codes of the postings a commit wrote as the commit left them (directory
        and generations already updated): replaced postings coded anew, appends coded after
        the posting's codes, dropped postings forgotten."""
        codes = self._codes
        touched = pids.tolist()
        new_span = dict(zip(touched, (after[:, 0] << 32 | after[:, 1]).tolist()))
        old_span = dict(zip(touched, before.tolist()))
        gens = dict(zip(touched, self._gens.get(pids).tolist()))
        dropped = set(change.drops)
        codes.ring.forget(change.drops)
        fresh = [(pid, new_span[pid], gens[pid], np.frombuffer(data + change.appends.get(pid, b""), np.uint8))
                 for pid, data in change.replaces.items()]
        fresh += [(pid, new_span[pid], gens[pid], np.frombuffer(data, np.uint8))
                  for pid, data in change.appends.items() if pid in dropped and pid not in change.replaces]
        codes.keep(fresh)
        codes.extend([(pid, old_span[pid], new_span[pid], gens[pid], np.frombuffer(data, np.uint8))
                      for pid, data in change.appends.items() if pid not in dropped and pid not in change.replaces])
        self._maybe_retrain_codes()

    def _chunk_keys(self, pids: np.ndarray, gens: np.ndarray, found: np.ndarray | None, in_place: bool
                    ) -> "_ReadPlan":
        """The keys to fetch, from the directory as it is now: every chunk of each posting,
        or only those appended since what ``found`` (the kept entries' table rows) holds. With
        ``in_place``, postings kept whole and unchanged are left where they are."""
        spans_arr = self._spans.array()
        if pids.size and int(pids.max()) >= spans_arr.shape[0]:  # heads never written to
            spans = self._spans.get(pids)
        else:
            spans = spans_arr[pids]
        plan = _ReadPlan()
        rest: int | np.ndarray = pids.shape[0]  # the postings to gather: all, or these positions
        if found is None:
            usable = np.zeros(pids.shape[0], dtype=bool)
        else:  # one kernel call: a search's few postings would pay ~1 us per numpy call here
            usable, whole, others = native.kept.usable(found, gens, spans)
            plan.from_memory = bool(usable.any())
            if in_place and whole.size:
                entries = found[whole]
                # a column of the table is strided: the kernels take contiguous arrays (another
                # layout would compile, or load, a second version inside a search)
                plan.in_place = (whole, np.ascontiguousarray(entries[:, START]), entries[:, ROWS], entries[:, SEQ])
                rest = others
                if not rest.size:  # every posting stays where it is kept: nothing to fetch or gather
                    return plan
        # Plain Python lists: for the few postings of one query, numpy call overheads would
        # cost more than the loop; for a large batch the loop stays far below the read itself.
        pack, view = _KEY.pack, self._kept.view_bytes
        keys, counts, held, leads, learn = plan.keys, plan.counts, plan.held, plan.leads, plan.learn
        if isinstance(rest, int):
            columns = (pids.tolist(), spans.tolist(), gens.tolist(), usable.tolist())
            kept_rows = found.tolist() if found is not None else [None] * rest
        else:
            columns = (pids[rest].tolist(), spans[rest].tolist(), gens[rest].tolist(), usable[rest].tolist())
            kept_rows = found[rest].tolist()
        plan.pids, plan.spans, plan.gens = columns[0], columns[1], columns[2]
        for i, (pid, span, gen, use, t) in enumerate(zip(*columns, kept_rows)):
            c = span & _CHUNKS_MASK
            if use:
                known, f, lead = t[SPAN] & _CHUNKS_MASK, span >> 32, bool(t[GEN] & 1)
                held.append(view(t[START], t[ROWS]))
                leads.append(lead)
                if lead and known == c:
                    counts.append(0)
                    continue
                k0 = len(keys)
                if not lead:  # what is held follows the first chunk
                    keys.append(pack(pid, f))
                keys.extend(pack(pid, j) for j in range(f + known, f + c))
                counts.append(len(keys) - k0)
            else:
                held.append(None)
                leads.append(False)
                counts.append(c)
                if not c:
                    continue
                k0 = len(keys)
                if c == 1:
                    keys.append(pack(pid, span >> 32))
                else:
                    keys.extend(pack(pid, j) for j in range(span >> 32, (span >> 32) + c))
            learn.append((i, span, k0))
        return plan

    def _reread_moved(self, plan: "_ReadPlan", values: list, io: IOClass, *, tenant: str,
                      deadline: float | None) -> tuple["_ReadPlan", list]:
        """``plan`` and its fetched ``values`` with the postings a concurrent commit moved
        (a chunk of theirs came back missing, or their generation changed) fetched again.

        A large rebalancing read beside a busy ingest meets a commit mid-read often: reading
        all of its postings again costs far more than the few the commit had moved. Every other
        posting was read whole from chunks that do not change while it keeps its keys, as a
        read that met no commit is. The chunks of memory-held postings stay pinned by the
        caller's token until they are gathered."""
        self._settled()  # the generations are consistent once the commit ends
        now = self._gens.get(np.asarray(plan.pids, dtype=np.int64)).tolist()
        moved, k = [], 0
        for i, (c, gen) in enumerate(zip(plan.counts, plan.gens)):
            if now[i] != gen or None in values[k:k + c]:
                moved.append(i)
            k += c
        pids = np.asarray([plan.pids[i] for i in moved], dtype=np.int64)
        for _ in range(READ_ATTEMPTS):
            version = self._dir_version
            again = self._chunk_keys(pids, self._gens.get(pids), None, False)
            fresh = self._io.run(io, lambda: self._multi_get(again.keys, io), tenant=tenant, deadline=deadline,
                                 cost=len(pids)) if again.keys else []
            if (version % 2 == 0 and version == self._dir_version) or None not in fresh:
                break
            time.sleep(0)
        out, spliced = _ReadPlan(), []
        k = j = m = 0
        for i, c in enumerate(plan.counts):
            if m < len(moved) and moved[m] == i:
                c2 = again.counts[m]
                spliced.extend(fresh[j:j + c2])
                j += c2
                m += 1
                out.counts.append(c2)
                out.held.append(None)
                out.leads.append(False)
            else:
                spliced.extend(values[k:k + c])
                out.counts.append(c)
                out.held.append(plan.held[i])
                out.leads.append(plan.leads[i])
            k += c
        return out, spliced

    def _settled(self) -> bool:
        """Wait (up to ``READ_ATTEMPTS`` yields) until no commit is updating the directory."""
        for _ in range(READ_ATTEMPTS):
            if self._dir_version % 2 == 0:
                return True
            time.sleep(0)
        return False

    def _unmoved(self, pids: np.ndarray, gens: np.ndarray) -> bool:
        """No commit has moved ``pids`` since their generations were ``gens`` (waiting out a
        commit that is updating the directory)."""
        return self._settled() and np.array_equal(self._gens.get(pids), gens)

    def _keep(self, plan: "_ReadPlan", values: list, data: np.ndarray, offsets: np.ndarray, *, search: bool
              ) -> None:
        """Keep in memory what this read fetched of postings.

        A whole posting a search read is kept while there is room; a read of it then needs no
        multi-get, and a search scans it where it lies. (Other reads are mostly of postings
        about to be rewritten.) Once the postings read outgrow the share, a posting in several
        chunks keeps only what follows its first chunk, pushing the oldest kept out, since
        each of those chunks is another key for the multi-get; and while that is so no
        posting is newly kept whole (one already kept whole that a search finds grown is kept
        whole again, as the newest; see ``KeptPostings._take``). Turning whole postings over
        costs every read and finds few again: slower than keeping none, and slower, once
        the postings have grown, than keeping only their tails."""
        rs, kept = self.record_size, self._kept
        offs, pids, gens, learn = offsets.tolist(), plan.pids, plan.gens, plan.learn
        if search and kept.keep_whole:
            placed = kept.keep([(pids[i], span, gens[i], True, data[offs[i] * rs:offs[i + 1] * rs])
                                for i, span, _ in learn], evict=False)
            learn = [entry for entry, kept_it in zip(learn, placed) if not kept_it]
        leads = plan.leads
        # a posting held whole that grew stays whole: else every read of it would fetch all
        # the chunks appended since, more with each append, until it is rewritten
        again = [(pids[i], span, gens[i], True, data[offs[i] * rs:offs[i + 1] * rs])
                 for i, span, _ in learn if leads[i]] if search else []
        # the rest: what follows the first chunk of postings in several, unless that is held
        held, tails = plan.held, []
        for i, span, k0 in learn:
            if span & _CHUNKS_MASK > 1 and not leads[i] and values[k0] is not None:
                tail = data[offs[i] * rs + len(values[k0]):offs[i + 1] * rs]
                if held[i] is None or len(held[i]) < len(tail):
                    tails.append((pids[i], span, gens[i], False, tail))
        if again or tails:
            kept.keep(again + tails, evict=True)

    @property
    def scheduler(self) -> IOScheduler:
        return self._io

    def _multi_get(self, keys: list[bytes], io: IOClass) -> list:
        with self._gate, _errors(self.path, "reading postings"):
            if not self._cf:
                raise self._not_open()
            # no handle in a local (see ``commit``)
            return (self._uncached if io is IOClass.BACKGROUND else self._cf["postings"]).get(keys)

    def _not_open(self) -> StorageError:
        return StorageError(errno.EIO, f"posting store {self.path}: not open: reopening it after a failed write "
                                       f"failed ({self._write_error}); the next write tries again")

    def _gather(self, values: list, plan: "_ReadPlan") -> tuple[np.ndarray, np.ndarray]:
        """Concatenate each posting's bytes: what memory holds of it, then its fetched
        chunks; returns the bytes and per-posting record offsets.

        The bytes land in a per-thread buffer reused across reads: a fresh multi-megabyte
        allocation per batch costs more in page faults than the copy itself.
        """
        rs = self.record_size
        if not plan.counts:  # nothing to gather (every posting of the read was left in place)
            return self._buffers.get(0)[:0], np.zeros(1, dtype=np.int64)
        odd = [len(v) for v in values if v is not None and len(v) % rs]
        if odd:
            raise CorruptionError(
                f"posting chunk of {odd[0]} bytes is not a whole number of {rs}-byte records")
        pieces, ends = [], [0]
        total = k = 0
        for kept, lead, c in zip(plan.held, plan.leads, plan.counts):
            if kept is not None and lead:
                pieces.append(kept)
                total += len(kept)
            if c:
                for j, v in enumerate(values[k:k + c]):
                    if v is not None:
                        pieces.append(v)
                        total += len(v)
                    if j == 0 and kept is not None and not lead:
                        pieces.append(kept)
                        total += len(kept)
                k += c
            ends.append(total)
        buf = self._buffers.get(total)
        view = memoryview(buf)
        pos = 0
        for piece in pieces:
            n = len(piece)
            view[pos:pos + n] = piece
            pos += n
        return buf[:pos], np.array(ends, dtype=np.int64) // rs

    # --- writes -------------------------------------------------------------------------------
    def _writable(self) -> None:
        """Make sure writes can go through (caller holds ``_write_lock``): after a failed
        write, raise its error again while the disk is still short of room, else reopen
        the handle (writing out the logs' tables) and go on."""
        failed = self._write_error
        if failed is None:
            return
        free, need = free_bytes(self.path), wal_bytes(self.path) + self.resume_free_bytes
        if free < need:
            cause = "the disk is full" if failed.errno in NO_SPACE_ERRNOS else f"a write failed ({failed.strerror})"
            raise StorageError(failed.errno, f"posting store {self.path}: {cause}; writes resume once space is "
                                             f"freed ({need} bytes free needed, {free} free)")
        with self._gate.exclusive():
            if self._cf:  # else a reopen failed outright: the next write tries again
                self._detach()
            self._attach(self._open_db(False))
        if self._write_error is not None:  # still full: opened read-only
            raise _again(self._write_error)
        if self._last_seq() > self._seq:  # not one torn record: a write reported failed was kept
            self._write_error = StorageError(
                errno.EIO, f"posting store {self.path}: a write reported as failed was found in the store "
                           f"after reopening it; close and reopen the index to apply it")
            raise _again(self._write_error)

    @contextmanager
    def _writing(self, doing: str) -> Iterator[None]:
        """``_errors`` for a write: a StorageError stops writes until ``_writable`` resumes them."""
        try:
            with _errors(self.path, doing):
                yield
        except StorageError as exc:
            # RocksDB answers writes after a failed one with "Writer has previous error":
            # the cause reported is the first failure
            if self._write_error is None or exc.errno in NO_SPACE_ERRNOS:
                self._write_error = _again(exc)  # no traceback: it would keep the handles alive
            raise _again(self._write_error) from None

    @contextmanager
    def _write_access(self, doing: str) -> Iterator[None]:
        """A write outside ``commit`` (a sync, a log truncation): resumed writes first if
        they stopped, then the handle held against a reopen."""
        if self._write_error is not None:
            with self._write_lock:
                self._writable()
        with self._gate, self._writing(doing):
            yield

    def commit(self, change: Change, io: IOClass) -> int:
        with self._write_lock:
            self._writable()
            batch = WriteBatch(raw_mode=True)
            # handles through the dict, never in locals: a traceback keeping this frame would
            # keep the database open, and ``_writable`` could not reopen it
            cf = self._handle
            rs = self.record_size
            touched = list(dict.fromkeys([*change.drops, *change.replaces, *change.appends]))
            # [first, chunks, records] per touched posting, as this commit leaves it; read from
            # the directory in one gather (a 1,000-row upsert touches ~1,000 postings)
            pids = np.asarray(touched, dtype=np.int64)
            spans = self._spans.get(pids)
            new_dir = {p: [f, c, r] for p, f, c, r in zip(
                touched, (spans >> 32).tolist(), (spans & _CHUNKS_MASK).tolist(), self._lengths.get(pids).tolist())}
            dropped = set(change.drops)
            for pid in change.drops:
                first, chunks, _ = new_dir[pid]
                if first + chunks:  # from chunk 0: chunks a failed commit left below ``first`` too
                    batch.delete_range(_key(pid, 0), _key(pid, first + chunks), cf["postings"])
                batch.delete(_PID.pack(pid), cf["pdir"])
                new_dir[pid] = [0, 0, 0]
            # New chunks go to keys outside every posting's current chunks, so they can be
            # written ahead of the batch (see ``_write_ahead``); a replace's old chunks are
            # deleted in the batch. A chunk of a posting this commit drops follows its delete.
            writes, in_batch = [], []
            for pid, data in change.replaces.items():
                first, chunks, _ = new_dir[pid]
                data = data + change.appends.get(pid, b"")  # one chunk, not a replace and an append
                at = 0 if first > 0 or chunks == 0 else chunks
                (in_batch if pid in dropped else writes).append((_key(pid, at), data))
                if chunks:
                    batch.delete_range(_key(pid, first), _key(pid, first + chunks), cf["postings"])
                new_dir[pid] = [at, 1, len(data) // rs]
            for pid, data in change.appends.items():
                if pid in change.replaces:
                    continue
                first, chunks, records = new_dir[pid]
                (in_batch if pid in dropped else writes).append((_key(pid, first + chunks), data))
                new_dir[pid] = [first, chunks + 1, records + len(data) // rs]
            if len(writes) > self.early_write_keys or sum(len(d) for _, d in writes) > EARLY_WRITE_BYTES:
                self._write_ahead(writes, change.pause)
            else:
                in_batch = writes + in_batch
            for key, data in in_batch:
                batch.put(key, data, cf["postings"])
            pack_pid, pack_dir = _PID.pack, _PDIR.pack
            for pid, (first, chunks, records) in new_dir.items():
                if chunks:
                    batch.put(pack_pid(pid), pack_dir(chunks, records, first), cf["pdir"])
            for key, value in change.payload.items():
                if value is None:
                    batch.delete(key, cf["payload"])
                else:
                    batch.put(key, value, cf["payload"])
            seq = 0
            if change.log is not None:
                seq = self._seq + 1
                batch.put(struct.pack(">Q", seq), change.log, self._handle["log"])
            self._dir_version += 1
            try:
                with self._writing("writing"):
                    self._db.write(batch)
                if seq:
                    self._seq = seq
                if touched:
                    after = np.array(list(new_dir.values()), dtype=np.int64).reshape(-1, 3)
                    self._spans.put(pids, after[:, 0] << 32 | after[:, 1])
                    self._lengths.put(pids, after[:, 2])
                    moved = np.array([*change.drops, *change.replaces], dtype=np.int64)
                    if moved.size:  # what reads kept no longer belongs to these postings
                        self._gens.put(moved, self._gens.get(moved) + 1)
                    if self._codes is not None:
                        self._code_commit(change, pids, spans, after)
            finally:
                self._dir_version += 1
            return seq

    def _write_ahead(self, writes: list[tuple[bytes, bytes]], pause) -> None:
        """Write a large commit's new chunks ahead of it, in pieces.

        rocksdict's ``write`` holds the GIL for the whole batch (tens of milliseconds for a
        round of rebalancing), and a search waiting for the GIL waits that long. A new chunk is
        invisible until the posting directory counts it, and the directory changes only in
        the commit's own batch, so chunks can go first in small batches with the GIL released
        between them: in ``pause``, where the engine lets running searches finish. A crash
        before the commit leaves chunks outside every posting's directory entry: never read,
        and overwritten by the writes that later extend a posting to their keys."""
        cf = self._handle  # not a handle in a local: see ``commit``
        piece, size = WriteBatch(raw_mode=True), 0
        for i, (key, data) in enumerate(writes):
            piece.put(key, data, cf["postings"])
            size += len(data)
            if len(piece) >= self.early_write_keys or size >= EARLY_WRITE_BYTES or i == len(writes) - 1:
                with self._writing("writing"):
                    self._db.write(piece)
                if pause is not None:
                    pause()
                else:
                    time.sleep(0)  # let a thread waiting for the GIL (a search) have it
                piece, size = WriteBatch(raw_mode=True), 0

    def bulk_load(self, pids: np.ndarray, records: np.ndarray, offsets: np.ndarray,
                  io: IOClass = IOClass.BACKGROUND) -> None:
        opts = WriteOptions()
        opts.disable_wal = True  # durable by the flush below; a crashed build is discarded
        with self._write_lock, self._writing("loading postings"):
            self._bulk_load(pids, records, offsets, opts)

    def _bulk_load(self, pids: np.ndarray, records: np.ndarray, offsets: np.ndarray, opts: WriteOptions) -> None:
        post, pdir = self._handle["postings"], self._handle["pdir"]
        batch, size = WriteBatch(raw_mode=True), 0
        codes = self._codes
        loaded: list[tuple[int, int, int, np.ndarray]] = []  # (pid, span word, generation, bytes)
        if codes is not None and records.ndim == 2:
            codes.train(records)  # the whole build, not its first postings
        for i, pid in enumerate(np.asarray(pids).tolist()):
            lo, hi = int(offsets[i]), int(offsets[i + 1])
            data = records[lo:hi].tobytes()
            loaded.append((pid, 1, int(self._gens.get_one(pid)) + 1, np.frombuffer(data, np.uint8)))
            batch.put(_key(pid, 0), data, post)
            batch.put(_PID.pack(pid), _PDIR.pack(1, hi - lo, 0), pdir)
            self._spans.ensure(pid)
            self._lengths.ensure(pid)
            self._spans[pid] = 1
            self._lengths[pid] = hi - lo
            self._gens.ensure(pid)
            self._gens[pid] += 1
            size += len(data)
            if size >= 64 << 20:
                self._db.write(batch, opts)
                batch, size = WriteBatch(raw_mode=True), 0
            if len(loaded) >= CODES_BUILD_READ:
                self._keep_coded(codes, loaded)
                loaded = []
        self._keep_coded(codes, loaded)
        if len(batch):
            self._db.write(batch, opts)
        self._db.flush()
        self._cf["postings"].flush()
        self._cf["pdir"].flush()

    def _keep_coded(self, codes: PostingCodes | None, postings: list[tuple[int, int, int, np.ndarray]]) -> None:
        """Code whole postings ``(pid, span word, generation, record bytes)`` (a build's, or
        those the codes build after an open read) into ``codes``, and keep them as float32
        too while the ring has room: once coded, a search's misses are served by the codes
        and never read the float32 posting, so the ring would stay as empty as the build or
        the open left it, and every small search pay the codes' rerank reads."""
        if not postings:
            return
        if codes is not None:
            codes.keep(postings)
        if self._kept.capacity and self._kept.keep_whole:
            self._kept.keep([(p, span, gen, True, rows) for p, span, gen, rows in postings], evict=False)

    def read_payload(self, keys: list[bytes]) -> list[bytes | None]:
        """Values of payload ``keys`` (None where a key has none)."""
        if not keys:
            return []
        with self._gate, _errors(self.path, "reading metadata and documents"):
            return self._cf["payload"][keys]

    def lengths(self) -> np.ndarray:
        return self._lengths.array()

    def fragments(self, pids: np.ndarray) -> np.ndarray:
        return self._spans.get(pids) & _CHUNKS_MASK

    # --- log ----------------------------------------------------------------------------------
    def log_since(self, seq: int, io: IOClass = IOClass.BACKGROUND) -> Iterator[tuple[int, bytes]]:
        with self._gate, _errors(self.path, "reading the operation log"):
            for key, value in self._cf["log"].items(from_key=struct.pack(">Q", seq + 1)):
                yield struct.unpack(">Q", key)[0], value

    def continue_after(self, seq: int, io: IOClass = IOClass.BACKGROUND) -> None:
        """Also the check that the store holds everything the caller's checkpoint (``seq``)
        covers: the log records up to it and the posting changes written with them. Its log
        reaches ``seq`` when a record at or above it survives, or the floor a truncation
        wrote does; a truncated write-ahead log that lost them opens without error (a cut
        looks like a torn tail) and would leave vectors the state names missing. A store
        written before the floor existed, with an empty log, cannot tell: it passes."""
        with _errors(self.path, "reading the log floor"):
            floor = self._db.get(LOG_FLOOR)
        reached = max(self._seq, _SEQ.unpack(floor)[0] if floor is not None else 0)
        if reached < seq and (floor is not None or self._seq > 0):
            raise CorruptionError(
                f"posting store {self.path}: the checkpoint covers operation-log record {seq}, but "
                f"the store's log ends at {reached}: its write-ahead log lost records (truncated or "
                f"deleted *.log files?); restore the index from a backup")
        self._seq = max(self._seq, seq)

    def truncate_log(self, upto: int, io: IOClass = IOClass.BACKGROUND) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.delete_range(struct.pack(">Q", 0), struct.pack(">Q", upto + 1), self._handle["log"])
        batch.put(LOG_FLOOR, _SEQ.pack(upto))  # what the deleted records reached (``continue_after``)
        with self._write_access("truncating the operation log"):
            self._db.write(batch)

    def sync(self, io: IOClass = IOClass.UPDATE) -> None:
        with self._write_access("syncing the write-ahead log"):
            self._db.flush_wal(True)

    def stats(self) -> dict:
        with self._gate:
            # per column family: the default one (the database handle's) holds almost nothing
            sst_bytes = sum(int(cf.property_int_value("rocksdb.total-sst-files-size") or 0)
                            for cf in self._cf.values())
        return {
            "kind": "rocksdb",
            "reads": self.reads,
            "read_bytes": self.read_bytes,
            "block_cache_usage": self._cache.get_usage(),
            "kept_bytes": self._kept.live_bytes,
            "resident_reads": self.resident_reads,
            "resident_code_scans": self.resident_code_scans,
            "kept_allocated_bytes": self._kept.allocated_bytes,
            **(self._codes.stats() if self._codes is not None else {"codes_bytes": 0}),
            "sst_bytes": sst_bytes,
            "writes_stopped": self._write_error is not None,
            "io": self._io.stats(),
        }

    def close(self) -> None:
        self._io.close()
        self._kept = KeptPostings(0, self.record_size)  # its memory goes now, not with the store
        self._codes_stop.set()
        self.wait_codes()
        if self._codes is not None:
            self._codes.close()
        try:
            if self._write_error is None:  # else RocksDB refuses it; what the log holds is in it already
                with _errors(self.path, "syncing the write-ahead log"):
                    self._db.flush_wal(True)
        finally:
            if self._cf:
                self._detach()
