"""Metadata and documents of records: checking them, their keys in the store, their form in
operation-log records, and reading them back for ``include``.

The store keeps them by the record's internal id under two keys, ``>Q ext, 0`` (metadata as
compact JSON) and ``>Q ext, 1`` (document as UTF-8), written in the same atomic commit as the
vector and the log record; ``set_metadata`` rewrites the first alone. The metadata also
travels in the log record, so that replay rebuilds the in-memory payload index (filters).
"""
from __future__ import annotations

import struct
from typing import Any, Callable, Sequence

import numpy as np

from .errors import InvalidConfigError, InvalidInputError, LengthMismatchError, PayloadTooLargeError
from .filters import check_metadata, decode_metadata

_KEY = struct.Struct(">QB")
META, DOC = 0, 1
#: What ``include`` may name.
INCLUDABLE = ("metadata", "documents", "vectors")
#: The stores that keep metadata and documents (the block store does not).
STORES = ("rocksdb", "memory")


def require_store(store: str) -> None:
    """Raise unless an index on ``store`` keeps metadata and documents."""
    if store not in STORES:
        raise InvalidConfigError(f"metadata and documents need store='rocksdb' (or 'memory'), not {store!r}")


def key(ext: int, kind: int) -> bytes:
    return _KEY.pack(ext, kind)


def check_include(include: Any) -> frozenset[str]:
    """``include`` as a set of names from ``INCLUDABLE``."""
    if include is None:
        return frozenset()
    if isinstance(include, str):
        include = (include,)
    try:
        names = frozenset(include)
    except TypeError:
        raise InvalidInputError(f"include: expected a sequence of {INCLUDABLE}, got {include!r}") from None
    bad = sorted(str(n) for n in names - set(INCLUDABLE))
    if bad:
        raise InvalidInputError(f"include: unknown field(s) {bad}; expected some of {list(INCLUDABLE)}")
    return names


def _per_row(values: Any, n: int, what: str) -> list:
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise InvalidInputError(f"{what}: expected one entry per row (a list of {n}), got {type(values).__name__}")
    values = list(values)
    if len(values) != n:
        raise LengthMismatchError(f"{what}: expected {n} entries (one per row), got {len(values)}")
    return values


def _encode_rows(values: Any, n: int, what: str, encode: Callable[[Any], bytes]) -> list[bytes | None] | None:
    """``encode`` of each row's value (None stays None); None when ``values`` is. An error
    names the row: ``what[i]: ...``."""
    if values is None:
        return None
    out: list[bytes | None] = []
    for i, value in enumerate(_per_row(values, n, what)):
        try:
            out.append(None if value is None else encode(value))
        except InvalidInputError as exc:
            raise type(exc)(f"{what}[{i}]: {exc}") from None
    return out


def encode_metadata(metadata: Any, n: int, max_bytes: int) -> list[bytes | None] | None:
    """Each row's metadata as compact JSON (None: no metadata); None when ``metadata`` is."""
    return _encode_rows(metadata, n, "metadata", lambda meta: check_metadata(meta, max_bytes))


def encode_documents(documents: Any, n: int, max_bytes: int) -> list[bytes | None] | None:
    """Each row's document as UTF-8 (None: no document); None when ``documents`` is."""
    def encode(doc: Any) -> bytes:
        if not isinstance(doc, str):
            raise InvalidInputError(f"expected a str or None, got {type(doc).__name__}")
        try:
            raw = doc.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInputError(f"not valid UTF-8 text ({exc.reason})") from None
        if len(raw) > max_bytes:
            raise PayloadTooLargeError(f"{len(raw)} bytes of UTF-8, over the limit of {max_bytes} (max_document_bytes)")
        return raw

    return _encode_rows(documents, n, "documents", encode)


def pack(values: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """``(bytes, offsets (n + 1,))`` for a log record; an empty slice stands for None (a
    present value is never empty: the smallest metadata is ``{}``)."""
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum([0 if v is None else len(v) for v in values], out=offsets[1:])
    return np.frombuffer(b"".join(v for v in values if v), dtype=np.uint8).copy(), offsets


def unpack(data: np.ndarray, offsets: np.ndarray) -> list[bytes | None]:
    raw = data.tobytes()
    bounds = offsets.tolist()
    return [raw[a:b] if b > a else None for a, b in zip(bounds[:-1], bounds[1:])]


def puts(exts: np.ndarray, kind: int, values: Sequence[bytes | None] | None) -> dict[bytes, bytes | None]:
    """Store puts (deletes for None) of one kind of value for ``exts``; a whole kind left out
    (``values`` None) deletes it too: an upsert replaces the record."""
    ext_list = exts.tolist()
    if values is None:
        return {key(e, kind): None for e in ext_list}
    return {key(e, kind): v for e, v in zip(ext_list, values)}


def read(store: Any, exts: Sequence[int], kind: int) -> list[Any]:
    """Metadata dicts (``META``) or document strs (``DOC``) of ``exts`` (None where missing
    and for negative exts, the padding of results)."""
    want = [e for e in exts if e >= 0]
    values = dict(zip(want, store.read_payload([key(e, kind) for e in want]))) if want else {}
    decode = decode_metadata if kind == META else (lambda b: b.decode("utf-8"))
    return [None if values.get(e) is None else decode(values[e]) for e in exts]
