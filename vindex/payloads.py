"""Metadata and documents of records: checking them, their keys in the store, their form in
operation-log records, and reading them back for ``include``.

The store keeps both under one key per record, ``>Q ext, 0``, written in the same atomic commit
as the vector and the log record: ``flags u8`` (1: metadata, 2: a document), then with
metadata its length (u32 LE) and its compact JSON, then the document as UTF-8 (one store entry
a row costs about half of two: RocksDB's work is mostly per entry). ``set_metadata`` rewrites
the value with the document it holds. Stores written before kept the metadata alone under that
key (JSON, so its first byte is ``{``, never a flags byte) and the document under ``>Q ext, 1``;
reads still take those, a write replaces them (the new value shadows the old document's key)
and a delete clears both keys. The metadata also travels in the log record, so that replay
rebuilds the in-memory payload index (filters).
"""
from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Callable, Sequence

import numpy as np

from .errors import InvalidConfigError, InvalidInputError, LengthMismatchError, PayloadTooLargeError
from .filters import PayloadIndex, decode_metadata
from .filters.flat import FlatGroup, column_groups
from .filters.metadata import checked_metadata, encode_batch, encode_groups

_KEY_DTYPE = np.dtype([("ext", ">u8"), ("kind", "u1")])  # a key: ext u64 BE, kind u8
#: Key kinds: a record's value (metadata and document; in stores written before, its metadata
#: alone), and the document of a record written before.
RECORD, OLD_DOC = 0, 1
#: What ``read`` returns.
META, DOC = 0, 1
_HAS_META, _HAS_DOC = 1, 2
_HEAD = struct.Struct("<BI")  # flags, metadata length
#: What ``include`` may name.
INCLUDABLE = ("metadata", "documents", "vectors")
#: The stores that keep metadata and documents (the block store does not).
STORES = ("rocksdb", "memory")


def require_store(store: str) -> None:
    """Raise unless an index on ``store`` keeps metadata and documents."""
    if store not in STORES:
        raise InvalidConfigError(f"metadata and documents need store='rocksdb' (or 'memory'), not {store!r}")


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


def as_list(values: Any) -> list:
    """``values`` as a list; pyarrow and numpy arrays give plain Python values."""
    if hasattr(values, "to_pylist"):
        return values.to_pylist()
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def _per_row(values: Any, n: int, what: str) -> list:
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise InvalidInputError(f"{what}: expected one entry per row (a list of {n}), got {type(values).__name__}")
    values = as_list(values)
    if len(values) != n:
        raise LengthMismatchError(f"{what}: expected {n} entries (one per row), got {len(values)}")
    return values


def _encode_rows(values: list, what: str, encode: Callable[[Any], Any]) -> list:
    """``encode`` of each row's value (None stays None). An error names the row:
    ``what[i]: ...``."""
    out: list = []
    for i, value in enumerate(values):
        try:
            out.append(None if value is None else encode(value))
        except InvalidInputError as exc:
            raise type(exc)(f"{what}[{i}]: {exc}") from None
    return out


@dataclass
class Metadata:
    """A batch's metadata, checked: each row's stored form (compact JSON; None: no metadata),
    and the rows as they are for the payload index, which need not decode them again: as flat
    groups when they all are (``filters.flat``), else as dicts. ``rows`` is None for metadata
    given as columns."""

    encoded: list[bytes | None]
    rows: list[dict | None] | None
    groups: list[FlatGroup] | None

    @classmethod
    def none(cls, n: int) -> "Metadata":
        """``n`` rows without metadata."""
        return cls([None] * n, [None] * n, [])

    def index(self, payload: PayloadIndex, vids: np.ndarray) -> None:
        """Make these the metadata of ``vids`` (distinct) in ``payload``."""
        if self.groups is not None:
            payload.set_groups(vids, self.groups)
        else:
            payload.set(vids, self.rows)  # type: ignore[arg-type]


def check_metadata_rows(metadata: Any, n: int, max_bytes: int) -> Metadata | None:
    """``metadata`` checked and encoded; None when it is None. It is one dict or None per
    row, or columns: a mapping of key to ``n`` values (a list, numpy array or pyarrow array)
    or a pyarrow Table, where None (null) leaves the key out of that row. Flat rows take a
    columnar path (``filters.metadata``); others, and any batch with an invalid row, are
    checked row by row (which names the row and the problem)."""
    if metadata is None:
        return None
    columns = _as_columns(metadata, n)
    if columns is not None:
        names, values = columns
        groups = column_groups(names, values, n)
        encoded = None if groups is None else encode_groups(groups, n, max_bytes)
        if encoded is not None:
            return Metadata(encoded, None, groups)
        metadata = _rows_of_columns(names, values, n)
    rows = _per_row(metadata, n, "metadata")
    fast = encode_batch(rows, max_bytes)
    if fast is not None:
        return Metadata(fast[0], rows, fast[1])
    checked = _encode_rows(rows, "metadata", lambda meta: checked_metadata(meta, max_bytes))
    return Metadata([c and c[0] for c in checked], [c and c[1] for c in checked], None)


def metadata_rows(metadata: Any, n: int) -> list[dict | None] | None:
    """``metadata`` (rows or columns, see ``check_metadata_rows``) as one dict or None per row."""
    if metadata is None:
        return None
    columns = _as_columns(metadata, n)
    return _per_row(metadata, n, "metadata") if columns is None else _rows_of_columns(*columns, n)


def _rows_of_columns(names: list, columns: list[list], n: int) -> list[dict | None]:
    return [{k: v[i] for k, v in zip(names, columns) if v[i] is not None} for i in range(n)]


def _as_columns(metadata: Any, n: int) -> tuple[list, list[list]] | None:
    """``(keys, each key's n values as a list)`` of metadata given as columns; None for rows."""
    if isinstance(metadata, Mapping):
        items = list(metadata.items())
    elif hasattr(metadata, "column_names") and hasattr(metadata, "column"):  # a pyarrow Table or RecordBatch
        items = [(name, metadata.column(i)) for i, name in enumerate(metadata.column_names)]
    else:
        return None
    names, columns = [], []
    for name, column in items:
        if isinstance(column, (str, bytes, Mapping)) or not hasattr(column, "__len__"):
            raise InvalidInputError(f"metadata[{name!r}]: expected a column of {n} values, got {type(column).__name__}")
        values = as_list(column)
        if len(values) != n:
            raise LengthMismatchError(f"metadata[{name!r}]: expected {n} values (one per row), got {len(values)}")
        names.append(name)
        columns.append(values)
    return names, columns


def encode_metadata(metadata: Any, n: int, max_bytes: int) -> list[bytes | None] | None:
    """Each row's metadata as compact JSON (None: no metadata); None when ``metadata`` is."""
    checked = check_metadata_rows(metadata, n, max_bytes)
    return None if checked is None else checked.encoded


def encode_documents(documents: Any, n: int, max_bytes: int) -> list[bytes | None] | None:
    """Each row's document as UTF-8 (None: no document); None when ``documents`` is."""
    if documents is None:
        return None
    docs = _per_row(documents, n, "documents")
    try:  # the common case (every row a str), encoded at C speed
        raw = list(map(str.encode, docs))
    except (TypeError, UnicodeEncodeError):
        raw = None  # a None or a bad row: row by row below names the row
    if raw is not None and (not raw or max(map(len, raw)) <= max_bytes):
        return raw  # type: ignore[return-value]

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

    return _encode_rows(docs, "documents", encode)


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


def record_puts(exts: np.ndarray, metas: Sequence[bytes | None] | None,
                docs: Sequence[bytes | None] | None) -> dict[bytes, bytes]:
    """Store puts of records ``exts`` with these metadata and documents (None: none, for a
    row or for all): an upsert replaces the whole record."""
    return dict(zip(_keys(exts, RECORD), _records(metas, docs, len(exts))))


def delete_puts(exts: np.ndarray) -> dict[bytes, None]:
    """Store deletes of records ``exts`` (both keys: see the module's docstring)."""
    return dict.fromkeys(_keys(exts, RECORD) + _keys(exts, OLD_DOC))


def _records(metas: Sequence[bytes | None] | None, docs: Sequence[bytes | None] | None, n: int) -> list[bytes]:
    """The stored value of each of ``n`` records."""
    if metas is not None and docs is not None and None not in metas and None not in docs:  # the common case
        heads = map(_HEAD.pack, repeat(_HAS_META | _HAS_DOC), map(len, metas))
        return list(map(b"".join, zip(heads, metas, docs)))
    return list(map(_record, metas or repeat(None, n), docs or repeat(None, n)))


def _record(meta: bytes | None, doc: bytes | None) -> bytes:
    flags = (_HAS_DOC if doc is not None else 0) | (_HAS_META if meta is not None else 0)
    head = bytes((flags,)) if meta is None else _HEAD.pack(flags, len(meta)) + meta
    return head if doc is None else head + doc


def _field(value: bytes, which: int) -> bytes | None:
    """Metadata (``META``) or document (``DOC``) of a stored record value."""
    flags = value[0]
    end = 1
    if flags & _HAS_META:
        end = _HEAD.size + _HEAD.unpack_from(value)[1]
        if which == META:
            return value[_HEAD.size:end]
    elif which == META:
        return None
    return value[end:] if flags & _HAS_DOC else None


def _keys(exts: np.ndarray, kind: int) -> list[bytes]:
    """``key(e, kind)`` of every ``e`` in ``exts``, packed by numpy."""
    packed = np.empty(len(exts), _KEY_DTYPE)
    packed["ext"], packed["kind"] = exts, kind
    raw = packed.tobytes()
    size = _KEY_DTYPE.itemsize
    return list(map(raw.__getitem__, map(slice, range(0, len(raw), size), range(size, len(raw) + size, size))))


def read_raw(store: Any, exts: Sequence[int], which: int) -> list[bytes | None]:
    """Stored metadata JSON (``META``) or document UTF-8 (``DOC``) of ``exts`` (None where
    missing and for negative exts, the padding of results)."""
    want = list(dict.fromkeys(e for e in exts if e >= 0))
    if not want:
        return [None] * len(exts)
    values = dict(zip(want, store.read_payload(_keys(np.asarray(want, np.int64), RECORD))))
    written_before = []  # records whose document has a key of its own
    for e, value in values.items():
        if value is None or value[:1] == b"{":
            if which == DOC:
                written_before.append(e)
        else:
            values[e] = _field(value, which)
    if written_before:
        values.update(zip(written_before, store.read_payload(_keys(np.asarray(written_before, np.int64), OLD_DOC))))
    return [values.get(e) for e in exts]


def read(store: Any, exts: Sequence[int], which: int) -> list[Any]:
    """Metadata dicts (``META``) or document strs (``DOC``) of ``exts`` (None where missing
    and for negative exts, the padding of results)."""
    decode = decode_metadata if which == META else (lambda b: b.decode("utf-8"))
    return [None if raw is None else decode(raw) for raw in read_raw(store, exts, which)]
