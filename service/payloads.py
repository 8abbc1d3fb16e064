"""Metadata, documents and filters in ``vindex.v1`` messages, both ways.

Metadata and filters travel as ``google.protobuf.Struct``, which holds every number as a double:
on the way in a number without a fractional part (within int64) becomes an ``int`` again, so a
page number stays ``3`` and not ``3.0``; integers beyond 2^53 are not exact over gRPC.

Rows are parallel lists (see ``service/vindex.proto``): ``metadata`` / ``documents`` are empty
(no row has one) or one entry per row, and the masks ``no_metadata`` / ``no_document`` are empty
(every row has one) or one flag per row, true where the row has none.
"""
from __future__ import annotations

from typing import Any, Sequence

from google.protobuf import struct_pb2

from vindex import errors

from .status import RequestTooLargeError

_INT64 = 2 ** 63


def _number(x: float) -> int | float:
    return int(x) if x.is_integer() and -_INT64 <= x < _INT64 else x


def from_value(v: struct_pb2.Value) -> Any:
    """A ``Value`` as the Python object it encodes (integral numbers as ``int``)."""
    kind = v.WhichOneof("kind")
    if kind == "number_value":
        return _number(v.number_value)
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "struct_value":
        return from_struct(v.struct_value)
    if kind == "list_value":
        return [from_value(item) for item in v.list_value.values]
    return None  # null_value, or no kind set


def from_struct(s: struct_pb2.Struct) -> dict:
    """A ``Struct`` as a dict (integral numbers as ``int``)."""
    return {key: from_value(value) for key, value in s.fields.items()}


def to_struct(d: dict, what: str = "metadata") -> struct_pb2.Struct:
    """A JSON-compatible dict as a ``Struct``; ``what`` names it in errors."""
    s = struct_pb2.Struct()
    try:
        s.update(d)
    except (ValueError, TypeError, OverflowError) as e:  # a value Struct cannot hold
        raise errors.InvalidInputError(f"{what}: not representable as JSON ({type(e).__name__}: {e})") from None
    return s


def decode_filter(request: Any) -> dict | None:
    """The request's ``filter`` as a dict, or None when the field is not set."""
    return from_struct(request.filter) if request.HasField("filter") else None


def _mask(flags: Sequence[bool], rows: int, field: str, rows_are: str) -> list[bool] | None:
    if not len(flags):
        return None
    if len(flags) != rows:
        raise errors.LengthMismatchError(f"{field}: {len(flags)} flags for {rows} {rows_are}; expected one per row "
                                         f"or none")
    return list(flags)


def _rows(values: Sequence[Any], flags: Sequence[bool], rows: int, field: str, mask_field: str,
          rows_are: str, max_rows: int, convert: Any) -> list | None:
    if len(values) > max_rows:
        raise RequestTooLargeError(f"{field}: at most {max_rows} per request, got {len(values)}")
    missing = _mask(flags, rows, mask_field, rows_are)
    if not len(values):
        if missing is not None and not all(missing):
            raise errors.LengthMismatchError(f"{mask_field}: says row {missing.index(False)} has one, but no "
                                             f"{field} were sent")
        return None
    if len(values) != rows:
        raise errors.LengthMismatchError(f"{field}: {len(values)} for {rows} {rows_are}; expected one per row "
                                         f"(set {mask_field} for rows without one) or none")
    if missing is None:
        return [convert(v) for v in values]
    return [None if m else convert(v) for v, m in zip(values, missing)]


def decode_metadata(request: Any, rows: int, max_rows: int, rows_are: str = "ids") -> Any:
    """The request's ``metadata`` (with ``no_metadata``): None, or one dict or None per row; or
    an upsert's ``metadata_arrow`` as a pyarrow Table (columns, which ``Index.upsert`` takes)."""
    if getattr(request, "metadata_arrow", b""):
        if len(request.metadata) or len(request.no_metadata):
            raise errors.InvalidInputError("metadata_arrow: send metadata as rows or as columns, not both")
        return arrow_columns(request.metadata_arrow, rows, rows_are)
    return _rows(request.metadata, request.no_metadata, rows, "metadata", "no_metadata", rows_are, max_rows,
                 from_struct)


def is_arrow_table(metadata: Any) -> bool:
    """Whether ``metadata`` is columns as a pyarrow Table or RecordBatch."""
    return type(metadata).__module__.startswith("pyarrow") and hasattr(metadata, "column_names")


def arrow_bytes(columns: Any) -> bytes:
    """A pyarrow Table or RecordBatch as an Arrow IPC stream (``metadata_arrow``)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, columns.schema) as writer:
        writer.write(columns)
    return sink.getvalue().to_pybytes()


def arrow_columns(data: bytes, rows: int, rows_are: str) -> Any:
    """``metadata_arrow`` as a pyarrow Table of ``rows`` rows."""
    try:
        import pyarrow as pa
    except ImportError:
        raise errors.InvalidInputError("metadata_arrow: this server has no pyarrow to read it; send metadata "
                                       "as rows") from None
    try:
        table = pa.ipc.open_stream(data).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise errors.InvalidInputError(f"metadata_arrow: not an Arrow IPC stream ({e})") from None
    if table.num_rows != rows:
        raise errors.LengthMismatchError(f"metadata_arrow: {table.num_rows} rows for {rows} {rows_are}; expected "
                                         f"one per row")
    return table


def decode_documents(request: Any, rows: int, max_rows: int, rows_are: str = "ids") -> list[str | None] | None:
    """The request's ``documents`` (with ``no_document``): None, or one str or None per row."""
    return _rows(request.documents, request.no_document, rows, "documents", "no_document", rows_are, max_rows,
                 str)


def encode_rows(message: Any, metadata: Sequence[dict | None] | None,
                documents: Sequence[str | None] | None) -> None:
    """Fill ``message``'s metadata / documents fields and their masks from per-row lists (None
    entries for rows without one); a list that is None leaves its fields empty."""
    if metadata is not None:
        message.metadata.extend(struct_pb2.Struct() if m is None else to_struct(m) for m in metadata)
        if any(m is None for m in metadata):
            message.no_metadata.extend(m is None for m in metadata)
    if documents is not None:
        message.documents.extend("" if d is None else d for d in documents)
        if any(d is None for d in documents):
            message.no_document.extend(d is None for d in documents)


def decode_rows(message: Any, rows: int) -> tuple[list[dict | None], list[str | None]]:
    """Per-row metadata and documents of a response (what ``encode_rows`` filled); a field
    left empty gives a list of ``rows`` Nones."""
    meta = _rows(message.metadata, message.no_metadata, rows, "metadata", "no_metadata", "rows", rows, from_struct)
    docs = _rows(message.documents, message.no_document, rows, "documents", "no_document", "rows", rows, str)
    return meta or [None] * rows, docs or [None] * rows
