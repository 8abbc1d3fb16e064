"""Metadata filters: the filter language, its reference evaluation and the payload index.

- ``compile_filter(obj) -> Filter``: validate a Mongo-style filter dict (docs/filters.md).
- ``matches(filter, meta) -> bool``: the reference (plain Python) evaluation on one record.
- ``PayloadIndex``: metadata of every row as numpy columns; ``mask``/``check`` evaluate a filter.
- ``check_metadata(meta, max_bytes) -> bytes`` / ``decode_metadata(bytes) -> dict``: one row's
  metadata validated and encoded as compact UTF-8 JSON, and back.
"""
from vindex.filters.language import And, Field, Filter, Not, Or, compile_filter
from vindex.filters.metadata import check_metadata, decode_metadata
from vindex.filters.oracle import matches
from vindex.filters.payload import PayloadIndex

__all__ = ["And", "Field", "Filter", "Not", "Or", "PayloadIndex", "check_metadata", "compile_filter",
           "decode_metadata", "matches"]
