"""String ids: the table between a str-id index's ids and the integer ids the engine keeps.

A str-id index gives each new string the next integer (0, 1, 2, ...) and keeps that integer
as the record's id everywhere inside (the id map, the payload keys). The pairing never
changes, not even when the id is deleted: an id deleted and upserted again gets its integer
back. New strings travel in the operation-log record of the write that introduced them
(``encode``/``decode``), so replay rebuilds the table in the same order.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from .errors import CorruptionError, InvalidIdError

#: Longest string id, in UTF-8 bytes.
MAX_ID_BYTES = 512


def check(ids: Iterable[object]) -> list[str]:
    """``ids`` as a list of str, each non-empty and at most ``MAX_ID_BYTES`` in UTF-8."""
    out = list(ids)
    bad = [i for i in out if not isinstance(i, str)]
    if bad:
        raise InvalidIdError(f"ids: this index holds string ids, got {type(bad[0]).__name__} {bad[0]!r}")
    long = [i for i in out if not i or len(i.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES]
    if long:
        shown = long[0] if len(long[0]) <= 40 else long[0][:40] + "..."
        raise InvalidIdError(f"ids: string ids must have 1..{MAX_ID_BYTES} UTF-8 bytes, got {shown!r}")
    try:
        for i in out:
            i.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidIdError(f"ids: not valid UTF-8 text ({exc.reason})") from None
    return out


def encode(strs: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(utf-8 bytes, offsets (n + 1,) int64)`` of ``strs``."""
    raw = [s.encode("utf-8") for s in strs]
    offsets = np.zeros(len(raw) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in raw], out=offsets[1:])
    return np.frombuffer(b"".join(raw), dtype=np.uint8).copy(), offsets


def decode(data: np.ndarray, offsets: np.ndarray) -> list[str]:
    raw = data.tobytes()
    bounds = offsets.tolist()
    try:
        return [raw[a:b].decode("utf-8") for a, b in zip(bounds[:-1], bounds[1:])]
    except UnicodeDecodeError as exc:
        raise CorruptionError(f"string id table unreadable: {exc}") from None


class StrIds:
    """str -> internal integer id, and back. One writer at a time; readers see whole entries."""

    def __init__(self, strs: list[str] | None = None):
        self._strs: list[str] = strs or []
        self._ints: dict[str, int] = {s: i for i, s in enumerate(self._strs)}
        if len(self._ints) != len(self._strs):
            raise CorruptionError("string id table holds a string twice")

    def __len__(self) -> int:
        return len(self._strs)

    def lookup(self, strs: Sequence[str]) -> np.ndarray:
        """Internal ids of ``strs`` (int64; -1 for strings never seen)."""
        get = self._ints.get
        return np.fromiter((get(s, -1) for s in strs), dtype=np.int64, count=len(strs))

    def plan(self, strs: Sequence[str]) -> tuple[np.ndarray, list[str]]:
        """Internal ids ``strs`` will have, and the new strings (in the order they get the
        next integers) that a write of them must register with ``register``."""
        exts = self.lookup(strs)
        new = [s for s, e in zip(strs, exts.tolist()) if e < 0]
        exts[exts < 0] = np.arange(len(self._strs), len(self._strs) + len(new))
        return exts, new

    def register(self, new: Sequence[str], first: int) -> None:
        """Give ``new`` the integers from ``first`` on (a committed write's new strings)."""
        if first != len(self._strs):
            raise CorruptionError(f"operation log out of step: next string id is {len(self._strs)}, "
                                  f"record says {first}")
        for s in new:
            if s in self._ints:
                raise CorruptionError(f"operation log registers string id {s!r} twice")
            self._ints[s] = len(self._strs)
            self._strs.append(s)

    def names(self, exts: np.ndarray) -> np.ndarray:
        """Object array shaped like ``exts`` of the strings, None where ``exts`` is negative."""
        flat = np.asarray(exts).reshape(-1).tolist()
        strs = self._strs
        out = np.empty(len(flat), dtype=object)
        out[:] = [strs[e] if e >= 0 else None for e in flat]
        return out.reshape(np.shape(exts))

    def arrays(self) -> dict[str, np.ndarray]:
        data, offsets = encode(self._strs)
        return {"sid_data": data, "sid_offsets": offsets}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "StrIds":
        if "sid_offsets" not in arrays:
            return cls()
        return cls(decode(arrays["sid_data"], arrays["sid_offsets"]))
