"""Checkpoints: the in-memory engine state (id map, version map, heads, head graph) as
``.npy`` files with CRC32 checksums, covering the operation log up to a sequence number.

A checkpoint is written into a temporary directory, fsynced and renamed to
``checkpoint/<seq>``; only then is the log truncated and older checkpoints removed, so a crash
at any point leaves either the old checkpoint plus its log or the new one.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import zlib

import numpy as np

from .errors import CorruptionError, StorageError
from .files import fsync_dir

DIR = "checkpoint"
MANIFEST = "manifest.json"


def _name(seq: int) -> str:
    return f"{seq:020d}"


def save(index_dir: str, seq: int, arrays: dict[str, np.ndarray], extra: dict) -> None:
    """Write checkpoint ``seq``. A failed write (a full disk) removes what it wrote and raises
    ``StorageError``; the previous checkpoint and the log stay as they were."""
    root = os.path.join(index_dir, DIR)
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, _name(seq))
    tmp = final + ".tmp"
    try:
        _write(tmp, seq, arrays, extra)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # give the space back
        if isinstance(exc, StorageError):
            raise
        # numpy's tofile reports a short write (a full disk) as an OSError without errno
        code = exc.errno or errno.ENOSPC
        raise StorageError(code, f"checkpoint {tmp}: {exc.strerror or exc}") from None
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    fsync_dir(root)


def _write(tmp: str, seq: int, arrays: dict[str, np.ndarray], extra: dict) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    meta = {"seq": seq, "extra": extra, "arrays": {}}
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        path = os.path.join(tmp, f"{name}.npy")
        with open(path, "wb") as f:
            np.save(f, arr, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        meta["arrays"][name] = {"crc32": zlib.crc32(arr.view(np.uint8).reshape(-1)),
                                "shape": list(arr.shape), "dtype": arr.dtype.str}
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)


def prune(index_dir: str, keep_seq: int) -> None:
    """Remove every checkpoint but ``keep_seq``'s, and leftovers of interrupted saves."""
    root = os.path.join(index_dir, DIR)
    for entry in os.listdir(root):
        if entry.endswith(".tmp") or (entry.isdigit() and int(entry) != keep_seq):
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)


def latest(index_dir: str) -> int | None:
    root = os.path.join(index_dir, DIR)
    if not os.path.isdir(root):
        return None
    seqs = [int(e) for e in os.listdir(root)
            if e.isdigit() and os.path.exists(os.path.join(root, e, MANIFEST))]
    return max(seqs) if seqs else None


def load(index_dir: str, seq: int) -> tuple[dict[str, np.ndarray], dict]:
    """Arrays and extra metadata of checkpoint ``seq``, checksums verified."""
    folder = os.path.join(index_dir, DIR, _name(seq))
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:
        raise CorruptionError(f"checkpoint {folder}: unreadable manifest ({exc})") from None
    arrays = {}
    for name, info in meta["arrays"].items():
        path = os.path.join(folder, f"{name}.npy")
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise CorruptionError(f"checkpoint file {path}: unreadable ({exc})") from None
        if (list(arr.shape) != info["shape"] or arr.dtype.str != info["dtype"]
                or zlib.crc32(np.ascontiguousarray(arr).view(np.uint8).reshape(-1)) != info["crc32"]):
            raise CorruptionError(f"checkpoint file {path}: checksum or shape mismatch")
        arrays[name] = arr
    return arrays, meta.get("extra", {})
