"""Per-posting bookkeeping shared by the stores: records per posting, grown on demand."""
from __future__ import annotations

import numpy as np


class Lengths:
    """Growable ``int64`` array of records per posting, indexed by pid."""

    def __init__(self, capacity: int = 1024):
        self._a = np.zeros(max(capacity, 16), dtype=np.int64)

    def ensure(self, pid: int) -> None:
        if pid >= self._a.shape[0]:
            grown = np.zeros(max(pid + 1, 2 * self._a.shape[0]), dtype=np.int64)
            grown[: self._a.shape[0]] = self._a
            self._a = grown

    def get_one(self, pid: int) -> int:
        """The value at ``pid`` (0 if never set)."""
        return int(self._a[pid]) if pid < self._a.shape[0] else 0

    def get(self, pids: np.ndarray) -> np.ndarray:
        """The values at ``pids`` (0 for pids never set)."""
        pids = np.asarray(pids, dtype=np.int64)
        a = self._a
        out = np.zeros(pids.shape[0], dtype=np.int64)
        inside = pids < a.shape[0]
        out[inside] = a[pids[inside]]
        return out

    def put(self, pids: np.ndarray, values: np.ndarray) -> None:
        """Set ``values`` at ``pids``, growing first (one array swap) if needed."""
        pids = np.asarray(pids, dtype=np.int64)
        if pids.size:
            self.ensure(int(pids.max()))
            self._a[pids] = values

    def __getitem__(self, pid):
        return self._a[pid]

    def __setitem__(self, pid, value) -> None:
        self._a[pid] = value

    def array(self) -> np.ndarray:
        return self._a
