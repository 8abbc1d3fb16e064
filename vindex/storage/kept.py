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
"""
from __future__ import annotations

import itertools
import threading
from collections import deque

import numpy as np

import native

# Columns of the per-posting table: the entry's first row (-1: none kept), its rows, the
# posting's span word and ``generation << 1 | lead`` when it was kept, the entry's number
# (defined with the kernel that reads the table).
from native.kept import GEN, ROWS, SEQ, SPAN, START

#: The ring's first allocation; it doubles up to its capacity (see ``KeptPostings._take``).
INITIAL_BYTES = 1 << 20


class KeptPostings:
    """Records of postings kept in memory, up to ``cap_bytes``."""

    def __init__(self, cap_bytes: int, record_size: int):
        self.record_size = record_size
        self.capacity = max(cap_bytes, 0) // record_size
        self.rows = np.zeros((min(self.capacity, INITIAL_BYTES // record_size), record_size // 4), dtype=np.uint32)
        self.lock = threading.Lock()
        self._table = np.full((1024, 5), -1, dtype=np.int64)
        self._order: deque[tuple[int, int, int, int]] = deque()  # (number, start, rows, pid), oldest first
        self._head = 0  # where the next entry goes
        self._seq = 0  # the next entry's number
        self._pins: dict[int, int] = {}  # token -> lowest entry number its holder uses
        self._tokens = itertools.count(1)
        self._copying = 0  # entries taken whose records are still being copied in
        self._growing = False  # the ring is being copied into a larger array: nothing is taken
        self.live_rows = 0
        #: New whole postings are kept while the postings read fit in the ring (see ``_take``).
        self.keep_whole = True

    @property
    def live_bytes(self) -> int:
        return self.live_rows * self.record_size

    @property
    def allocated_bytes(self) -> int:
        return self.rows.nbytes

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
        n = sum(len(e[4]) for e in entries) // rs
        if self._head + n > self.rows.shape[0] and self._should_grow(n):  # a hint: no lock held
            self._grow(self._head + n)
        token = next(self._tokens)
        with self.lock:
            placed, flags = [], []
            for pid, span, gen, lead, data in entries:
                taken = self._take(pid, len(data) // rs, evict=evict)
                flags.append(taken is not None)
                if taken is not None:
                    if not placed:  # pinned, so that no entry taken after overwrites it
                        self._pins[token] = taken[0]
                    placed.append((pid, span, gen, lead, data, *taken))
            if not placed:
                return flags
            self._copying += len(placed)
        try:
            for _, _, _, _, data, _, start, n in placed:
                self.view_bytes(start, n)[:] = np.frombuffer(data, dtype=np.uint8)
        finally:
            with self.lock:
                del self._pins[token]
                self._copying -= len(placed)
                table = self._ensure(max(p[0] for p in placed))
                for pid, span, gen, lead, _, seq, start, n in placed:
                    if table[pid, START] >= 0:
                        self.live_rows -= table[pid, ROWS]
                    table[pid] = (start, n, span, gen << 1 | lead, seq)
                    self.live_rows += n
        return flags

    def _take(self, pid: int, n: int, *, evict: bool) -> tuple[int, int, int] | None:
        """Take ``n`` rows for ``pid`` (lock held): ``(entry number, start, n)``, or None.
        Entries join ``_order`` here, so that it stays in ring order; one taken but not yet
        published counts as not in use, and cannot be overwritten (it is pinned).

        At its end the ring grows (up to its capacity) while a quarter or more of it is in
        use, else it wraps: its memory follows what is kept, not how often entries are
        replaced. Below capacity any entry may overwrite entries in use (few, then; a search
        that wants them again keeps them again); at capacity only with ``evict``, and whole
        postings stop being kept once that happens while three quarters of the ring are in
        use (the postings read no longer fit), and are kept again once less than half is.
        (Stopping at half, for good, a 10k x 128 index with a 16 MiB share stopped within
        seconds, at a peak, and then read no posting in place: 98-99% in place now with one
        searching thread, 53-93% with four, where stopping for good left none. With a 4 MiB
        share, which the postings outgrow, batch-1 p50 0.19-0.24 ms against 0.21-0.27.)"""
        if n == 0 or n > self.capacity:
            return None
        head, size = self._head, self.rows.shape[0]
        if self._growing or (head + n > size and self._should_grow(n)):  # grown in ``keep``
            return None
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
        size = self.rows.shape[0]
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

    def _grow(self, rows: int) -> None:
        """Make the ring at least ``rows`` long (up to its capacity), unless records are being
        copied in (they would miss the new array) or another thread is growing it. The copy
        runs outside the lock, so searches keep finding entries meanwhile (in the old array:
        what they use is the same in both); nothing is taken until the new array is in place."""
        with self.lock:
            old = self.rows
            if self._copying or self._growing or old.shape[0] >= min(rows, self.capacity):
                return
            self._growing = True
        grown = None
        try:
            grown = np.zeros((min(self.capacity, max(rows, 2 * old.shape[0])), old.shape[1]), dtype=np.uint32)
            grown[:old.shape[0]] = old
        finally:
            with self.lock:
                if grown is not None:
                    self.rows = grown
                self._growing = False

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
