"""Which shard owns an id: a stable hash of the id, the same in every process and release.

Python's ``hash()`` is salted per process for str, so it cannot route: int ids go through
splitmix64's finaliser, str ids through an 8-byte BLAKE2b of their UTF-8 bytes.
"""
from __future__ import annotations

import hashlib

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def shard_of(ids: np.ndarray | list, shards: int) -> np.ndarray:
    """The shard (0..shards-1, int64) of each id: ``ids`` an int64 array or a list of str."""
    if isinstance(ids, np.ndarray) and ids.dtype.kind == "i":
        with np.errstate(over="ignore"):
            return (_splitmix64(ids.view(np.uint64)) % np.uint64(shards)).astype(np.int64)
    digests = [int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "little") for s in ids]
    return (np.asarray(digests, dtype=np.uint64) % np.uint64(shards)).astype(np.int64)


def split(shard: np.ndarray, shards: int) -> list[np.ndarray]:
    """Row positions of each shard, in their original order."""
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[order], np.arange(shards + 1))
    return [order[bounds[s]:bounds[s + 1]] for s in range(shards)]
