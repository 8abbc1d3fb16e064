"""The block store's posting -> block-list map, its free space, and the byte formats of its
map snapshot and log records. Pure: no file I/O here, so every rule is tested in memory.

A posting's records are stored back to back in its blocks, in order; a record may straddle
two blocks, and only the posting's last block (its *tail*) may be partly filled. So the bytes
of a posting are its blocks concatenated, cut at ``records * record_size``, and a posting of
``b`` bytes always has ``ceil(b / BLOCK)`` blocks. Every block has a 32-bit checksum of its
4096 bytes, slack included (``native.checksum``), kept beside its block id and checked by
every read.

Copy-on-write: an entry ``(blocks, records, sums)`` is an immutable triple replaced as a
whole, so a reader that looked it up keeps a consistent list while writers install new ones.
Blocks a commit releases wait in *limbo* until (a) that commit is durable (its log record
fsynced) and (b) every read that began before the release has ended; only then are they reused.

Entry arrays (shared by snapshots and log records), little-endian, 8-byte aligned::

    pids i64[n] | records i64[n] | counts u32[n] | blocks u32[sum(counts)] | sums u32[sum(counts)]

An entry with ``records == 0`` (and no blocks) removes the posting.

Log (``log.<gen>``): ``b"VXBLOG02" | u64 gen``, then one record per commit::

    u32 payload length | u32 crc32(payload) | payload
    payload = u64 lsn | u64 seq | u32 n | u32 m | u32 log length | u32 unsynced | entry arrays | log bytes

``lsn`` numbers every record (gapless); ``seq`` is the caller's log sequence number, 0 for a
commit without a log record. ``unsynced``: how many records, this one included, were not yet
known to be fsynced when it was written (``lsn - unsynced`` and everything before it were),
capped at 2^32 - 1; 0 in records written before the field existed (no claim). Snapshot::

    b"VXBMAP02" | u64 gen | u64 lsn | u64 seq | u32 record size | u32 0 | u64 n | u64 m
    | entry arrays | u32 crc32(everything before)

Format 02 added the block checksums; files of format 01 are refused (``OLD_FORMAT``).
"""
from __future__ import annotations

import struct
import zlib
from collections import deque
from dataclasses import dataclass
from typing import BinaryIO, Callable, NamedTuple

import numpy as np

from .directory import Lengths

BLOCK = 4096
EMPTY = np.empty(0, dtype=np.uint32)

_REC_HEAD = struct.Struct("<II")          # payload length, crc32
_PAYLOAD_HEAD = struct.Struct("<QQIIII")  # lsn, seq, n, m, log length, unsynced
_SNAP_HEAD = struct.Struct("<8sQQQIIQQ")  # magic, gen, lsn, seq, record size, pad, n, m
SNAP_MAGIC = b"VXBMAP02"
LOG_MAGIC = b"VXBLOG02"
#: Magics of earlier formats, refused with this explanation.
OLD_MAGICS = (b"VXBMAP01", b"VXBLOG01")
OLD_FORMAT = ("format 01, written before data blocks had checksums; this version reads format 02 "
              "only: rebuild the index")
LOG_HEAD = struct.Struct("<8sQ")          # magic, gen
#: Largest payload a log record may claim; a bigger length field is damage, not a record.
MAX_RECORD = 1 << 34
#: Cap of a record's ``unsynced`` count (a u32).
MAX_UNSYNCED = (1 << 32) - 1


class Entry(NamedTuple):
    """A posting's blocks (uint32 ids, in order), its record count, and the checksum of each
    block (uint32, ``native.checksum``)."""

    blocks: np.ndarray
    records: int
    sums: np.ndarray


Entries = dict  # pid -> Entry, or None to remove the posting


class FormatError(ValueError):
    """Bytes that are not a well-formed snapshot or log record (the store names the file)."""


def blocks_for(nbytes: int) -> int:
    return -(-nbytes // BLOCK)


def runs(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Maximal runs of consecutive block ids in ``blocks`` (in list order): the index in
    ``blocks`` where each run starts and its length. One run costs one I/O."""
    if blocks.shape[0] == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    b = blocks.astype(np.int64, copy=False)
    starts = np.flatnonzero(np.concatenate(([True], b[1:] != b[:-1] + 1)))
    return starts, np.diff(np.append(starts, b.shape[0]))


def _records_and_runs(entries: list[Entry | None]) -> tuple[np.ndarray, np.ndarray]:
    """Records and runs of consecutive blocks of each entry (0 and 0 for None), vectorised
    over all their blocks: per entry, ``runs`` costs more in numpy call overheads."""
    lists = [EMPTY if e is None else e[0] for e in entries]
    recs = np.array([0 if e is None else e[1] for e in entries], dtype=np.int64)
    counts = np.array([b.shape[0] for b in lists], dtype=np.int64)
    flat = np.concatenate(lists).astype(np.int64) if lists else np.empty(0, np.int64)
    owner = np.repeat(np.arange(len(lists)), counts)
    first = np.ones(flat.shape[0], dtype=bool)
    first[1:] = (flat[1:] != flat[:-1] + 1) | (owner[1:] != owner[:-1])
    return recs, np.bincount(owner[first], minlength=len(lists))


# --- entry arrays -------------------------------------------------------------------------------
def encode_entries(entries: Entries) -> tuple[int, int, bytes]:
    """``(n, m, bytes)`` of the entry arrays for ``entries``."""
    pids = np.fromiter(entries.keys(), dtype="<i8", count=len(entries))
    recs = np.array([0 if e is None else e[1] for e in entries.values()], dtype="<i8")
    lists = [EMPTY if e is None else e.blocks for e in entries.values()]
    sums = [EMPTY if e is None else e.sums for e in entries.values()]
    if any(s.shape != b.shape for s, b in zip(sums, lists)):
        raise ValueError("every block needs exactly one checksum")
    counts = np.array([b.shape[0] for b in lists], dtype="<u4")
    blocks = np.concatenate(lists).astype("<u4") if lists else EMPTY
    sums_ = np.concatenate(sums).astype("<u4") if sums else EMPTY
    body = pids.tobytes() + recs.tobytes() + counts.tobytes() + blocks.tobytes() + sums_.tobytes()
    return pids.shape[0], blocks.shape[0], body


def decode_entries(buf: memoryview, pos: int, n: int, m: int, record_size: int) -> tuple[Entries, int]:
    """Entries from the arrays at ``buf[pos:]``; returns them and the position after."""
    end = pos + 20 * n + 8 * m
    if end > len(buf):
        raise FormatError(f"entry arrays run past the end ({end} > {len(buf)} bytes)")
    pids = np.frombuffer(buf, "<i8", n, pos)
    recs = np.frombuffer(buf, "<i8", n, pos + 8 * n)
    counts = np.frombuffer(buf, "<u4", n, pos + 16 * n).astype(np.int64)
    blocks = np.frombuffer(buf, "<u4", m, pos + 20 * n).astype(np.uint32)
    sums = np.frombuffer(buf, "<u4", m, pos + 20 * n + 4 * m).astype(np.uint32)
    if counts.sum() != m or (pids < 0).any() or (recs < 0).any():
        raise FormatError("entry arrays are inconsistent")
    if (counts != -(-(recs * record_size) // BLOCK)).any():
        raise FormatError("a posting's block count does not match its record count")
    ends = np.cumsum(counts)
    out: Entries = {}
    for pid, r, lo, hi in zip(pids.tolist(), recs.tolist(), (ends - counts).tolist(), ends.tolist()):
        out[pid] = Entry(blocks[lo:hi], r, sums[lo:hi]) if r else None
    return out, end


# --- log records --------------------------------------------------------------------------------
@dataclass
class LogRecord:
    lsn: int
    seq: int
    entries: Entries
    log: bytes | None
    offset: int = 0    # file offset of the record
    size: int = 0      # bytes on disk, header included
    unsynced: int = 0  # records up to this one not known fsynced when it was written (0: no claim)


def encode_record(lsn: int, seq: int, entries: Entries, log: bytes | None, unsynced: int = 0) -> bytes:
    n, m, body = encode_entries(entries)
    log = log or b""
    payload = _PAYLOAD_HEAD.pack(lsn, seq, n, m, len(log), min(unsynced, MAX_UNSYNCED)) + body + log
    return _REC_HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def decode_payload(payload: bytes, record_size: int, *, keep_log: bool = True) -> LogRecord:
    buf = memoryview(payload)
    if len(buf) < _PAYLOAD_HEAD.size:
        raise FormatError("log record too short")
    lsn, seq, n, m, loglen, unsynced = _PAYLOAD_HEAD.unpack_from(buf)
    entries, pos = decode_entries(buf, _PAYLOAD_HEAD.size, n, m, record_size)
    if pos + loglen != len(buf):
        raise FormatError("log record length mismatch")
    return LogRecord(lsn, seq, entries, bytes(buf[pos:]) if seq and keep_log else None, unsynced=unsynced)


def decode_record(data: bytes, record_size: int) -> LogRecord:
    """One whole record as ``encode_record`` wrote it (header, checksum, payload)."""
    if len(data) < _REC_HEAD.size:
        raise FormatError("log record too short")
    size, crc = _REC_HEAD.unpack_from(data)
    payload = memoryview(data)[_REC_HEAD.size:]
    if len(payload) != size or zlib.crc32(payload) != crc:
        raise FormatError("log record fails its checksum")
    return decode_payload(bytes(payload), record_size)


def read_log(f: BinaryIO, start: int, next_lsn: int, record_size: int) -> tuple[list[LogRecord], int]:
    """Parse the records of a log stream from offset ``start``; the first should have lsn
    ``next_lsn``. Returns ``(records, good_end)``.

    A damaged record (short, running past the end, failing its checksum) after which no intact
    record follows is a torn, unacknowledged final write: parsing stops and ``good_end`` is
    where the log should be cut. A damaged record followed by an intact one raises
    FormatError: acknowledged commits would be lost.
    """
    f.seek(0, 2)
    file_end = f.tell()
    f.seek(start)
    out: list[LogRecord] = []
    pos = start
    while pos < file_end:
        head = f.read(_REC_HEAD.size)
        payload = None
        if len(head) == _REC_HEAD.size:
            size, crc = _REC_HEAD.unpack(head)
            if size <= MAX_RECORD and pos + _REC_HEAD.size + size <= file_end:
                payload = f.read(size)
                if zlib.crc32(payload) != crc:
                    payload = None
        if payload is None:
            if _intact_record_after(f, pos + 1, next_lsn + len(out)):
                raise FormatError(f"the record at offset {pos} is damaged and intact records follow it")
            return out, pos
        rec = decode_payload(payload, record_size, keep_log=False)  # replay needs offsets only
        rec.offset, rec.size = pos, _REC_HEAD.size + len(payload)
        out.append(rec)
        pos += rec.size
    return out, pos


def _intact_record_after(f: BinaryIO, pos: int, lsn: int, lookahead: int = 4) -> bool:
    """Whether a record with a valid checksum and lsn in ``lsn .. lsn + lookahead`` starts
    anywhere at or after ``pos``. Only runs on a damaged log, so reading the rest is fine."""
    f.seek(pos)
    rest = f.read()
    for want in range(lsn, lsn + lookahead + 1):
        needle = struct.pack("<Q", want)
        at = rest.find(needle, _REC_HEAD.size)
        while at >= 0:
            start = at - _REC_HEAD.size
            size, crc = _REC_HEAD.unpack_from(rest, start)
            if _PAYLOAD_HEAD.size <= size <= len(rest) - at and zlib.crc32(rest[at:at + size]) == crc:
                return True
            at = rest.find(needle, at + 1)
    return False


# --- snapshots ----------------------------------------------------------------------------------
@dataclass
class Snapshot:
    gen: int
    lsn: int
    seq: int
    entries: Entries


def encode_snapshot(gen: int, lsn: int, seq: int, record_size: int, entries: Entries) -> bytes:
    n, m, body = encode_entries(entries)
    data = _SNAP_HEAD.pack(SNAP_MAGIC, gen, lsn, seq, record_size, 0, n, m) + body
    return data + struct.pack("<I", zlib.crc32(data))


def decode_snapshot(data: bytes, record_size: int) -> Snapshot:
    if len(data) < _SNAP_HEAD.size + 4:
        raise FormatError("snapshot too short")
    if zlib.crc32(memoryview(data)[:-4]) != struct.unpack_from("<I", data, len(data) - 4)[0]:
        raise FormatError("snapshot fails its checksum")
    magic, gen, lsn, seq, rs, _, n, m = _SNAP_HEAD.unpack_from(data)
    if magic in OLD_MAGICS:
        raise FormatError(f"snapshot of {OLD_FORMAT}")
    if magic != SNAP_MAGIC:
        raise FormatError(f"not a block-store snapshot (magic {magic!r})")
    if rs != record_size:
        raise FormatError(f"snapshot has {rs}-byte records, the index expects {record_size}")
    buf = memoryview(data)[:-4]
    entries, end = decode_entries(buf, _SNAP_HEAD.size, n, m, record_size)
    if end != len(buf):
        raise FormatError("snapshot length mismatch")
    return Snapshot(gen, lsn, seq, entries)


# --- the map ------------------------------------------------------------------------------------
class BlockMap:
    """Postings -> block lists, plus free and released (limbo) blocks.

    Readers call ``get`` from any thread; everything else runs under the store's write lock.
    """

    def __init__(self, record_size: int):
        self.record_size = record_size
        self._entries: dict[int, Entry] = {}
        self.lengths = Lengths()   # records per posting (the store's ``lengths()``)
        self.runs = Lengths()      # contiguous block runs per posting (``fragments()``)
        self.free = np.empty(0, dtype=np.int64)  # sorted, reusable now
        self.high = 0              # first block id never handed out
        self._limbo: deque[tuple[int, int, np.ndarray]] = deque()  # (lsn, reader boundary, blocks)
        self.limbo_blocks = 0
        self.used_blocks = 0

    # --- lookups ----------------------------------------------------------------------------
    def get(self, pid: int) -> Entry | None:
        return self._entries.get(pid)

    def entries(self) -> Entries:
        return dict(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def referenced(self) -> np.ndarray:
        """Every block id the map points at (int64, unsorted)."""
        lists = [e[0] for e in self._entries.values()]
        return np.concatenate(lists).astype(np.int64) if lists else np.empty(0, np.int64)

    # --- changes ----------------------------------------------------------------------------
    def install(self, entries: Entries, *, derived: bool = True) -> None:
        """Replace the entries of the postings in ``entries`` (None removes one). Replay at
        open passes ``derived=False`` and calls ``refresh_derived`` once at the end."""
        for pid, e in entries.items():
            old = self._entries.get(pid)
            if old is not None:
                self.used_blocks -= old[0].shape[0]
            if e is None:
                self._entries.pop(pid, None)
            else:
                self._entries[pid] = e  # one reference swap: readers see old or new
                self.used_blocks += e[0].shape[0]
        if derived and entries:
            pids = np.fromiter(entries.keys(), dtype=np.int64, count=len(entries))
            recs, n_runs = _records_and_runs(list(entries.values()))
            self._set_derived(pids, recs, n_runs)

    def refresh_derived(self) -> None:
        """Records and runs of every posting, at once (vectorised over all blocks)."""
        self.lengths, self.runs = Lengths(), Lengths()
        if not self._entries:
            return
        pids = np.fromiter(self._entries.keys(), dtype=np.int64, count=len(self._entries))
        self._set_derived(pids, *_records_and_runs(list(self._entries.values())))

    def _set_derived(self, pids: np.ndarray, recs: np.ndarray, n_runs: np.ndarray) -> None:
        self.lengths.ensure(int(pids.max()))
        self.runs.ensure(int(pids.max()))
        self.lengths.array()[pids] = recs
        self.runs.array()[pids] = n_runs

    def rebuild_free(self) -> None:
        """After loading: every unreferenced block below the highest referenced one is free."""
        ref = self.referenced()
        if np.unique(ref).shape[0] != ref.shape[0]:
            raise FormatError("a block belongs to two postings")
        self.high = int(ref.max()) + 1 if ref.shape[0] else 0
        used = np.zeros(self.high, dtype=bool)
        used[ref] = True
        self.free = np.flatnonzero(~used).astype(np.int64)
        self._limbo.clear()
        self.limbo_blocks = 0

    def allocate(self, sizes: list[int]) -> list[np.ndarray]:
        """Choose blocks for one commit's postings of ``sizes`` blocks each, without taking
        them (``take`` does, once the commit is written). The postings are laid out one after
        another, so the commit is written in as few I/Os as there are pieces: in the first
        free run that holds them all, else at the end of the file, unless a quarter of the
        file is free, when they fill the longest free runs first (a posting may then span two
        runs, one more I/O to read it). Placing each posting in its own first-fit hole instead
        cost one synchronous O_DIRECT write per posting: a 1,000-row upsert made ~1,000. The
        price is space: replacing 240k random vectors of a 200k index left the file at 1.75x
        the blocks in use, against 1.55x with first-fit holes."""
        total = int(sum(sizes))
        if total == 0:
            return [EMPTY] * len(sizes)
        starts, lens = runs(self.free)
        starts = self.free[starts] if starts.shape[0] else starts
        fit = np.flatnonzero(lens >= total)
        if fit.shape[0]:
            s = int(starts[fit[0]])
            flat = np.arange(s, s + total, dtype=np.uint32)
        elif self.free.shape[0] >= total and 4 * self.free.shape[0] >= self.high:
            flat = self._scattered(starts, lens.copy(), total)
        else:
            flat = np.arange(self.high, self.high + total, dtype=np.uint32)
        out, lo = [], 0
        for hi in np.cumsum(sizes).tolist():  # slices: np.split costs ~1 us a piece
            out.append(flat[lo:hi])
            lo = hi
        return out

    @staticmethod
    def _scattered(starts: np.ndarray, lens: np.ndarray, k: int) -> np.ndarray:
        """Take ``k`` blocks from the longest free runs first (fewest pieces)."""
        got = []
        for i in np.argsort(-lens, kind="stable").tolist():
            if k == 0 or lens[i] == 0:
                break
            n = int(min(k, lens[i]))
            got.append(np.arange(starts[i], starts[i] + n, dtype=np.uint32))
            starts[i] += n
            lens[i] -= n
            k -= n
        return np.concatenate(got)

    def take(self, blocks: np.ndarray) -> None:
        """Mark chosen ``blocks`` used: off the free list, and past the high-water mark."""
        if blocks.shape[0] == 0:
            return
        b = blocks.astype(np.int64)
        at = np.searchsorted(self.free, b)  # free is sorted: O(free) to cut, no re-sort
        hit = at < self.free.shape[0]
        hit[hit] = self.free[at[hit]] == b[hit]
        self.free = np.delete(self.free, at[hit])
        self.high = max(self.high, int(b.max()) + 1)

    def release(self, blocks: np.ndarray, lsn: int, boundary: int) -> None:
        """Blocks no longer in the map as of record ``lsn``; readers holding tickets below
        ``boundary`` may still be reading them."""
        if blocks.shape[0]:
            self._limbo.append((lsn, boundary, blocks.astype(np.int64)))
            self.limbo_blocks += blocks.shape[0]

    def reclaim(self, synced_lsn: int, drained: Callable[[int], bool]) -> int:
        """Move limbo blocks whose release is durable and unread to the free list. Limbo is
        in commit order and both keys only grow, so the first ineligible batch stops the scan.
        Returns the number of blocks freed."""
        freed = []
        while self._limbo:
            lsn, boundary, blocks = self._limbo[0]
            if lsn > synced_lsn or not drained(boundary):
                break
            self._limbo.popleft()
            freed.append(blocks)
        if not freed:
            return 0
        got = np.concatenate(freed)
        self.limbo_blocks -= got.shape[0]
        self.free = np.union1d(self.free, got)
        return int(got.shape[0])

    def held(self) -> np.ndarray:
        """Blocks in limbo (for tests and stats)."""
        return (np.concatenate([b for _, _, b in self._limbo]) if self._limbo
                else np.empty(0, np.int64))



# --- replay -------------------------------------------------------------------------------------
class Replayed(NamedTuple):
    """A map rebuilt from a snapshot and log records, and the blocks it points at whose data
    only unsynced records wrote: ``blocks`` (sorted), the checksum the map expects of each,
    and the lsn of the record that wrote it."""

    map: BlockMap
    blocks: np.ndarray
    sums: np.ndarray
    lsns: np.ndarray


def durable_lsn(snapshot_lsn: int, records: list[LogRecord]) -> int:
    """The last lsn whose data blocks are known fsynced: the snapshot's, or what a later
    record claims (``lsn - unsynced``)."""
    return max([snapshot_lsn] + [r.lsn - r.unsynced for r in records if r.unsynced])


def replay(snapshot: Entries, records: list[LogRecord], record_size: int, durable: int) -> Replayed:
    """Install ``snapshot`` then ``records`` in order. Blocks new in a record above
    ``durable`` are tracked: a power loss may have kept that record (the log is a buffered
    file the kernel writes back when it likes) but not the block (written with O_DIRECT, maybe
    still in the disk's volatile cache). Within those records no block is written twice: a
    released block is reused only once its release is fsynced."""
    m = BlockMap(record_size)
    m.install(snapshot, derived=False)
    written, by = [], []
    for rec in records:
        if rec.lsn > durable:
            for pid, e in rec.entries.items():
                if e is None:
                    continue
                old = m.get(pid)
                new = e.blocks if old is None else e.blocks[~np.isin(e.blocks, old.blocks)]
                written.append(new.astype(np.int64))
                by.append(np.full(new.shape[0], rec.lsn, dtype=np.int64))
        m.install(rec.entries, derived=False)
    m.refresh_derived()
    entries = list(m.entries().values())
    if not written or not entries:
        return Replayed(m, np.empty(0, np.int64), EMPTY, np.empty(0, np.int64))
    written_b, written_by = np.concatenate(written), np.concatenate(by)
    ref = np.concatenate([e.blocks for e in entries]).astype(np.int64)
    sums = np.concatenate([e.sums for e in entries])
    hit = np.isin(ref, written_b)
    ref, sums = ref[hit], sums[hit]
    order = np.argsort(ref)
    ref, sums = ref[order], sums[order]
    last = np.unique(written_b[::-1], return_index=True)[1]  # the latest writer of each block
    wb, wl = written_b[::-1][last], written_by[::-1][last]
    return Replayed(m, ref, sums, wl[np.searchsorted(wb, ref)])
