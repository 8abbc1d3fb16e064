"""The block store's calls to the disk that tests replace, the error an OSError becomes, and
page-aligned buffers (O_DIRECT needs them).

``pwrite`` and ``open_direct`` are looked up here at each call, so a fault-injection test
replaces them once (``monkeypatch.setattr(diskio, "pwrite", ...)``) for the data file and the
log alike.
"""
from __future__ import annotations

import errno
import mmap
import os
import re

import numpy as np

from ..errors import StorageError
from .blockmap import BLOCK

pwrite = os.pwrite  # every write of the data file and the log goes through here


def open_direct(path: str) -> int:
    """The data file with O_DIRECT (a function so tests can make it fail like tmpfs once did)."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_DIRECT, 0o644)


def failed(exc: OSError, where: str, doing: str) -> StorageError:
    """An OSError from the disk as the StorageError callers handle, naming file and step."""
    return StorageError(exc.errno or errno.EIO, f"{where}: {exc.strerror or exc} (while {doing})")


class Aligned:
    """A page-aligned anonymous mapping of whole blocks: O_DIRECT needs aligned buffers."""

    def __init__(self, size: int):
        self.size = max(BLOCK, -(-size // BLOCK) * BLOCK)
        self.mm = mmap.mmap(-1, self.size)
        self.arr = np.frombuffer(self.mm, dtype=np.uint8)
        self.mv = memoryview(self.mm)
        self.address = self.arr.ctypes.data


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
