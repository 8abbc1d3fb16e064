"""Id map, version map and home map.

External ids (non-negative int64 chosen by the user) map to dense internal vids (uint32)
that posting records carry. Per vid the map keeps:

* ``vid2ext``: the external id (-1 for a retired vid);
* ``versions``: one byte, the low 7 bits the version of the live copy, the high bit a deleted
  mark. A posting entry is live iff its stored version equals this byte, so an upsert
  (version + 1) or a delete (high bit) makes every old copy dead without touching disk;
* ``home``: one posting (pid) that holds the live copy, so ``get`` can read it back.

When a vid's 7-bit version would wrap, the id moves to a fresh vid and the old one is retired
(its copies can never match again), so a copy 128 versions old cannot come back to life.

Arrays are replaced, never resized in place, so a search holding the old arrays stays valid
while a writer grows them.
"""
from __future__ import annotations

import numpy as np

from vindex import native

DELETED = np.uint8(0x80)
VERSION_MASK = np.uint8(0x7F)


def _pow2_at_least(n: int) -> int:
    return 1 << max(4, int(n - 1).bit_length())


def _table_size(n: int) -> int:
    """Slots for ``n`` ids: a power of two at least twice ``n`` (load factor <= 0.5)."""
    return _pow2_at_least(2 * n)


class IdMap:
    """External id <-> vid, version map and home map."""

    def __init__(self, capacity: int = 1024):
        capacity = max(capacity, 16)
        self.vid2ext = np.full(capacity, -1, dtype=np.int64)
        self.versions = np.full(capacity, DELETED, dtype=np.uint8)
        self.home = np.full(capacity, -1, dtype=np.int32)
        self.table = np.full(_table_size(capacity), -1, dtype=np.int32)
        self.n_vids = 0
        self.n_live = 0

    # --- queries --------------------------------------------------------------------------------
    def lookup(self, exts: np.ndarray) -> np.ndarray:
        """vids of ``exts`` (int64; -1 for ids never seen, and for negative ``exts``: a
        retired vid's id reads -1, and a lookup of -1 must not find it)."""
        vids = native.idhash.lookup(self.table, self.vid2ext, exts)
        vids[exts < 0] = -1
        return vids

    def live_vids(self, exts: np.ndarray) -> np.ndarray:
        """vids of ``exts`` that are currently live (-1 otherwise)."""
        vids = self.lookup(exts)
        known = np.flatnonzero(vids >= 0)
        vids[known[(self.versions[vids[known]] & DELETED) != 0]] = -1
        return vids

    @property
    def n_deleted(self) -> int:
        """Deleted vids (tombstones) whose ids may come back with an upsert."""
        v = self.versions[: self.n_vids]
        return int(((v & DELETED) != 0).sum()) - self.n_retired

    @property
    def n_retired(self) -> int:
        return int((self.vid2ext[: self.n_vids] < 0).sum())

    # --- updates (callers serialise writers) ----------------------------------------------------
    def allocate(self, exts: np.ndarray) -> np.ndarray:
        """New live vids (version 0) for ids that have none (caller checked)."""
        n = exts.shape[0]
        start = self.n_vids
        self._reserve(start + n)
        vids = np.arange(start, start + n, dtype=np.int64)
        self.vid2ext[start:start + n] = exts
        self.versions[start:start + n] = 0
        native.idhash.insert(self.table, self.vid2ext, vids)
        self.n_vids = start + n
        self.n_live += n
        return vids

    def retire(self, vids: np.ndarray) -> None:
        """Take vids out of use for good: their hash slots stay as tombstones that lookups
        step over (the key no longer matches), and their copies never match again."""
        self.n_live -= int(((self.versions[vids] & DELETED) == 0).sum())
        self.vid2ext[vids] = -1
        self.versions[vids] = DELETED
        self.home[vids] = -1

    def set_versions(self, vids: np.ndarray, versions: np.ndarray) -> None:
        """New current versions (clearing deleted marks) for existing vids."""
        self.n_live += int(((self.versions[vids] & DELETED) != 0).sum())
        self.versions[vids] = versions

    def delete(self, vids: np.ndarray) -> None:
        """Mark live vids deleted."""
        self.versions[vids] |= DELETED
        self.n_live -= vids.shape[0]

    def _reserve(self, n: int) -> None:
        cap = self.vid2ext.shape[0]
        if n > cap:
            new_cap = max(n, 2 * cap)
            vid2ext = np.full(new_cap, -1, dtype=np.int64)
            vid2ext[:cap] = self.vid2ext
            versions = np.full(new_cap, DELETED, dtype=np.uint8)
            versions[:cap] = self.versions
            home = np.full(new_cap, -1, dtype=np.int32)
            home[:cap] = self.home
            self.vid2ext, self.versions, self.home = vid2ext, versions, home
        if 2 * n > self.table.shape[0]:
            table = np.full(_table_size(2 * n), -1, dtype=np.int32)  # room to grow
            native.idhash.rebuild(table, self.vid2ext, self.n_vids)
            self.table = table

    # --- persistence ----------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        n = self.n_vids
        # The hash table is saved too: reopening then needs no rehash (and no kernel at all).
        return {"vid2ext": self.vid2ext[:n], "versions": self.versions[:n], "home": self.home[:n],
                "id_table": self.table}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "IdMap":
        # Loaded arrays are used as they are (no copy): the first allocation grows them.
        vid2ext = arrays["vid2ext"]
        n = vid2ext.shape[0]
        m = cls.__new__(cls)
        m.vid2ext = np.require(vid2ext, np.int64, ["C", "W"])
        m.versions = np.require(arrays["versions"], np.uint8, ["C", "W"])
        home = arrays.get("home")
        m.home = np.require(home, np.int32, ["C", "W"]) if home is not None else np.full(n, -1, np.int32)
        m.n_vids = n
        m.n_live = int(((m.versions & DELETED) == 0).sum())
        table = arrays.get("id_table")
        if table is not None and table.shape[0] >= 2 * n:
            m.table = np.require(table, np.int32, ["C", "W"])
        else:
            m.table = np.full(_table_size(max(n, 16)), -1, dtype=np.int32)
            native.idhash.rebuild(m.table, m.vid2ext, n)
        return m
