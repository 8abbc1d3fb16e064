"""Postings that the RocksDB store's reads keep in memory, in one ring of records.

A read fetches only what it does not find here (see ``RocksStore.read``), and a search scans
the postings it finds here whole where they lie, without copying them into its read buffer:
on 10k x 128, 100 queries at max_postings 1-4 took 20-30% less time than when they copied
kept postings into their read buffer first (four paired runs in one process).

The ring is one array of records. An entry (a posting's records, or those that follow its
first chunk) takes the rows after the newest, and once the ring's end is reached the oldest
entries' rows, at its start: entries are overwritten oldest first. The ring starts small and
grows at its end, up to its capacity, while much of it is in use. Entries are numbered in the
order they are taken. A reader pins the lowest number it uses until it is done with the rows; an
entry that would overwrite a pinned one is not kept.

The array is allocated at full capacity once, and the ring's end only moves further into
it: the operating system maps its pages as they are first written, so its memory still
follows the ring's length, and growing copies nothing. (Growing by copying into a doubled
array ran in the search that triggered it, holding it up: on 200k x 128 with a 128 MiB
share, batch-1 searches stalled 51, 118, 213 and, for the last 63 rows of capacity, 485 ms.)
The pages are small ones: see ``_reserve``.
"""
from __future__ import annotations

import itertools
import logging
import mmap
import threading
from collections import deque

import numpy as np

from vindex import native

# Columns of the per-posting table (see native.kept_table)
from vindex.native.kept_table import GEN, ROWS, SEQ, SPAN, START

log = logging.getLogger(__name__)

#: Default bytes of the ring's first length; it doubles up to its capacity (see
#: ``KeptPostings._take``).
INITIAL_BYTES = 1 << 20


class KeptPostings:
    """Records of postings kept in memory, up to ``cap_bytes``; the ring starts at
    ``initial_bytes`` and doubles as it needs to."""

    def __init__(self, cap_bytes: int, record_size: int, initial_bytes: int = INITIAL_BYTES):
        self.record_size = record_size
        self.capacity = max(cap_bytes, 0) // record_size
        self.rows = _reserve(self.capacity, record_size // 4)
        self.rows_f = self.rows.view(np.float32)  # the same records as the scan kernels read them
        self.capacity = self.rows.shape[0]
        self._size = min(self.capacity, initial_bytes // record_size)  # the ring's length so far
        self.lock = threading.Lock()
        self._table = np.full((1024, 5), -1, dtype=np.int64)
        self._order: deque[tuple[int, int, int, int]] = deque()  # (number, start, rows, pid), oldest first
        self._head = 0  # where the next entry goes
        self._seq = 0  # the next entry's number
        self._pins: dict[int, int] = {}  # token -> lowest entry number its holder uses
        self._tokens = itertools.count(1)
        self.live_rows = 0
        #: New whole postings are kept while the postings read fit in the ring (see ``_take``).
        self.keep_whole = True

    @property
    def live_bytes(self) -> int:
        return self.live_rows * self.record_size

    @property
    def allocated_bytes(self) -> int:
        """The ring's length in bytes: the most of its memory written so far."""
        return self._size * self.record_size

    def find(self, pids: np.ndarray) -> tuple[np.ndarray, int]:
        """Each pid's table row (start -1: none kept), and a pin on every entry found: a
        token for ``release``, 0 if none was found."""
        with self.lock:
            found, oldest = native.kept.find(self._table, pids)
            if oldest < 0:
                return found, 0
            token = next(self._tokens)
            self._pins[token] = int(oldest)
            return found, token

    def pin_all(self) -> tuple[np.ndarray, int]:
        """The table of kept postings as it is now, and a pin on every entry in it (a token
        for ``release``; 0 when nothing is kept): while pinned, the rows of each entry the
        table names stay as they are, whatever is kept meanwhile."""
        with self.lock:
            if not self._order:
                return self._table, 0
            token = next(self._tokens)
            self._pins[token] = self._order[0][0]
            return self._table, token

    def repin(self, token: int, seq: int) -> None:
        """Narrow ``find``'s pin to the entries numbered ``seq`` and up (still in use)."""
        with self.lock:
            self._pins[token] = seq

    def release(self, token: int) -> None:
        """Unpin what ``find`` pinned (``token`` 0: nothing; a second release: nothing)."""
        if token:
            with self.lock:
                self._pins.pop(token, None)

    def view(self, start: int, rows: int) -> np.ndarray:
        """The records of an entry found (and pinned) at row ``start``."""
        return self.rows[start:start + rows]

    def view_bytes(self, start: int, rows: int) -> np.ndarray:
        """``view`` as flat bytes."""
        return self.view(start, rows).reshape(-1).view(np.uint8)

    def keep(self, entries: list[tuple[int, int, int, bool, np.ndarray]], *, evict: bool) -> list[bool]:
        """Keep ``(pid, span word, generation, lead, record bytes)`` entries (``lead``: the
        records start with the posting's first chunk); returns which were kept.

        With ``evict`` an entry overwrites the oldest, else only rows no entry uses any more.
        An entry that would overwrite a pinned one, or is larger than the ring, is not kept.
        The records are copied in outside the lock (the entries taken are pinned meanwhile)
        and published after."""
        if not self.capacity:
            return [False] * len(entries)
        rs = self.record_size
        token = next(self._tokens)
        with self.lock:
            placed, flags = [], []
            pending = 0  # rows taken by this call: in use once published
            for pid, span, gen, lead, data in entries:
                taken = self._take(pid, len(data) // rs, evict=evict, pending=pending)
                flags.append(taken is not None)
                if taken is not None:
                    if not placed:  # pinned, so that no entry taken after overwrites it
                        self._pins[token] = taken[0]
                    placed.append((pid, span, gen, lead, data, *taken))
                    pending += taken[2]
            if not placed:
                return flags
        try:
            # memoryview copies keep the GIL (numpy's release it above a few hundred bytes,
            # and beside a thread running Python each release costs a search a switch interval)
            ring = memoryview(self.rows).cast("B")
            for _, _, _, _, data, _, start, n in placed:
                ring[start * rs:(start + n) * rs] = data
        finally:
            with self.lock:
                del self._pins[token]
                table = self._ensure(max(p[0] for p in placed))
                for pid, span, gen, lead, _, seq, start, n in placed:
                    if table[pid, START] >= 0:
                        self.live_rows -= table[pid, ROWS]
                    table[pid] = (start, n, span, gen << 1 | lead, seq)
                    self.live_rows += n
        return flags

    def forget(self, pids: list[int]) -> None:
        """Stop using the entries of ``pids`` (their postings changed); their rows are
        overwritten in ring order, as evicted ones are."""
        if not pids:
            return
        with self.lock:
            t = self._table
            for pid in pids:
                if pid < t.shape[0] and t[pid, START] >= 0:
                    self.live_rows -= int(t[pid, ROWS])
                    t[pid, START] = -1

    def _take(self, pid: int, n: int, *, evict: bool, pending: int = 0) -> tuple[int, int, int] | None:
        """Take ``n`` rows for ``pid`` (lock held): ``(entry number, start, n)``, or None.
        Entries join ``_order`` here, so that it stays in ring order; one taken but not yet
        published counts as not in use, and cannot be overwritten (it is pinned).

        At its end the ring grows (up to its capacity) while a quarter or more of it is in
        use, else it wraps: its memory follows what is kept, not how often entries are
        replaced. Below capacity any entry may overwrite entries in use (few, then; a search
        that wants them again keeps them again); at capacity only with ``evict``, and whole
        postings stop being kept once that happens while three quarters of the ring are in
        use (the postings read no longer fit), and are kept again once less than half is.
        (Stopping at half, for good, stops within seconds, at a peak, and then reads no
        posting in place; resuming below half keeps most reads in place, and costs nothing
        where the postings outgrow the share.) ``pending``: rows the same ``keep`` took
        before, in use once published: a large read grows the ring for all it keeps instead
        of wrapping onto its own pinned entries and keeping the first ring's worth only."""
        if n == 0 or n > self.capacity:
            return None
        head, size = self._head, self._size
        if head + n > size and self._should_grow(n + pending):
            size = self._size = min(self.capacity, max(head + n, 2 * size))
        start = head if head + n <= size else 0
        popped, in_use = self._overwritten(head, start, n)
        if popped is None or (in_use and not evict and size == self.capacity):
            return None
        order = self._order
        for _ in range(popped):
            seq, _, rows, owner = order.popleft()
            if self._in_use(seq, owner):  # evicted
                if size == self.capacity and 4 * self.live_rows >= 3 * self.capacity:
                    self.keep_whole = False
                self._table[owner, START] = -1
                self.live_rows -= rows
        if not self.keep_whole and 2 * self.live_rows < self.capacity:
            self.keep_whole = True
        seq = self._seq
        self._seq += 1
        self._head = start + n
        order.append((seq, start, n, pid))
        return seq, start, n

    def _should_grow(self, n: int) -> bool:
        """At the ring's end, with ``n`` rows to take: grow rather than wrap (see ``_take``)."""
        size = self._size
        return size < self.capacity and 4 * (self.live_rows + n) >= size

    def _overwritten(self, head: int, start: int, n: int) -> tuple[int | None, bool]:
        """How many of the oldest entries an entry at ``start`` overwrites, and whether any is
        in use; None if one is pinned. Those are the entries its rows cover, and when it
        wraps to the ring's start, also all those from the head to the ring's end."""
        end, wraps = start + n, start != head
        low_pin = min(self._pins.values()) if self._pins else None
        count, in_use = 0, False
        for seq, first, _, owner in self._order:
            if not (head <= first < end or (wraps and (first >= head or first < end))):
                break
            if low_pin is not None and seq >= low_pin:
                return None, False
            in_use = in_use or self._in_use(seq, owner)
            count += 1
        return count, in_use

    def _in_use(self, seq: int, pid: int) -> bool:
        """Entry ``seq`` is ``pid``'s, published and not since replaced or evicted."""
        t = self._table
        return pid < t.shape[0] and t[pid, START] >= 0 and t[pid, SEQ] == seq

    def _ensure(self, pid: int) -> np.ndarray:
        if pid >= self._table.shape[0]:
            grown = np.full((max(pid + 1, 2 * self._table.shape[0]), 5), -1, dtype=np.int64)
            grown[:self._table.shape[0]] = self._table
            self._table = grown
        return self._table

    def entries(self) -> dict[int, tuple[int, int, bool, int]]:
        """pid -> (span word, generation, lead, rows) of every entry in use, oldest first
        (for tests)."""
        with self.lock:
            t = self._table
            return {p: (int(t[p, SPAN]), int(t[p, GEN] >> 1), bool(t[p, GEN] & 1), int(t[p, ROWS]))
                    for seq, _, _, p in self._order if self._in_use(seq, p)}


def _reserve(rows: int, cols: int) -> np.ndarray:
    """Zeroed ``(rows, cols) uint32`` in anonymous memory whose pages are mapped as first
    written, in small pages: with transparent huge pages (numpy asks for them on large
    arrays) the first write to each 2 MiB costs one search the whole huge page at once
    (milliseconds on a VM touching fresh memory), where small pages spread the cost over the
    keeps.
    Fewer rows if the operating system refuses that much address space."""
    while True:
        try:
            mem = mmap.mmap(-1, max(rows * cols * 4, 1))
        except (OSError, ValueError, OverflowError):
            log.warning("kept postings: cannot reserve %d bytes; halving the share", rows * cols * 4)
            rows //= 2
            continue
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            mem.madvise(mmap.MADV_NOHUGEPAGE)
        return np.frombuffer(mem, dtype=np.uint32, count=rows * cols).reshape(rows, cols)
