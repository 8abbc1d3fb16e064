"""Operation-log records: a typed, self-describing bundle of named numpy arrays.

A record is committed in the same atomic store write as the posting changes it describes;
replaying the records after the last checkpoint rebuilds the in-memory state exactly.
Layout: ``u32 header length | JSON header | array bytes...``; the header names the type, each
array's dtype and shape, and a CRC32 of the payload.
"""
from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from .errors import CorruptionError

ADD = "add"            # new vids for ids: exts, first_vid; versions set to `versions`
BOOTSTRAP = "bootstrap"  # first heads of an empty index: head arrays


@dataclass
class Record:
    type: str
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    # what the writer already holds decoded, by the name of the array it is encoded in (never
    # encoded itself): ``State.apply`` takes it instead of decoding that array again
    decoded: dict = field(default_factory=dict)


def encode(rec: Record) -> bytes:
    parts, specs = [], []
    for name, arr in rec.arrays.items():
        arr = np.ascontiguousarray(arr)
        specs.append([name, arr.dtype.str, list(arr.shape)])
        parts.append(arr.tobytes())
    payload = b"".join(parts)
    header = json.dumps({"type": rec.type, "arrays": specs, "meta": rec.meta,
                         "crc32": zlib.crc32(payload)}).encode()
    return struct.pack("<I", len(header)) + header + payload


def decode(data: bytes) -> Record:
    try:
        (hlen,) = struct.unpack_from("<I", data, 0)
        header = json.loads(data[4:4 + hlen])
        payload = memoryview(data)[4 + hlen:]
        if zlib.crc32(payload) != header["crc32"]:
            raise ValueError("payload checksum mismatch")
        arrays, pos = {}, 0
        for name, dtype, shape in header["arrays"]:
            dt = np.dtype(dtype)
            count = math.prod(shape)  # math, not numpy: replay decodes ~10^5 small records
            arrays[name] = np.frombuffer(payload, dtype=dt, count=count, offset=pos).reshape(shape)
            pos += count * dt.itemsize
        if pos != len(payload):
            raise ValueError("payload length mismatch")
        return Record(header["type"], arrays, header.get("meta", {}))
    except (struct.error, ValueError, KeyError, TypeError) as exc:
        raise CorruptionError(f"operation log record unreadable: {exc}") from None
