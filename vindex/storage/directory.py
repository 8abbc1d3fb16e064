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

    def __getitem__(self, pid):
        return self._a[pid]

    def __setitem__(self, pid, value) -> None:
        self._a[pid] = value

    def array(self) -> np.ndarray:
        return self._a
