"""Record files for ``vindex ingest``: ``.parquet`` and ``.jsonl`` with ids, vectors, metadata
and documents.

Columns (parquet) or keys (one JSON object per line of jsonl):

- ``id`` (required): integers, or strings for a collection of string ids;
- ``vector`` (required): a list of numbers (parquet ``list<float>`` or ``fixed_size_list``), the
  same length in every row;
- ``metadata`` (optional): a JSON object, null for none. In parquet either a struct column (its
  null fields are left out of a row's metadata, as a struct gives every row every field) or a
  string column of JSON text;
- ``document`` (optional): a string, null for none.

Any other column or key is refused, so a misspelt ``documents`` cannot drop data silently.
Errors name the file and the 0-based row. Reading parquet needs pyarrow (the ``ingest`` extra).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

COLUMNS = ("id", "vector", "metadata", "document")
REQUIRED = ("id", "vector")
SUFFIXES = (".parquet", ".jsonl", ".ndjson")


@dataclass
class Records:
    """Consecutive rows of a record file, starting at row ``first``."""

    first: int
    ids: np.ndarray | list[str]
    vectors: np.ndarray                      # (n, dim) float32
    #: one dict or None per row, or columns (a pyarrow RecordBatch, a column per key: a parquet
    #: struct column without null rows); None: the file has no metadata
    metadata: list[dict | None] | Any | None
    documents: list[str | None] | None       # None: the file has no documents

    def __len__(self) -> int:
        return len(self.ids)

    def metadata_rows(self) -> list[dict | None] | None:
        """``metadata`` as one dict or None per row (columns: a null leaves its key out)."""
        if self.metadata is None or isinstance(self.metadata, list):
            return self.metadata
        names, columns = self.metadata.schema.names, [c.to_pylist() for c in self.metadata.columns]
        return [{k: c[i] for k, c in zip(names, columns) if c[i] is not None} for i in range(len(self))]

    def slice(self, lo: int, hi: int) -> "Records":
        def part(rows: Any) -> Any:
            if rows is None:
                return None
            return rows[lo:hi] if isinstance(rows, list) else rows.slice(lo, hi - lo)
        return Records(self.first + lo, self.ids[lo:hi], self.vectors[lo:hi], part(self.metadata),
                       part(self.documents))


def is_record_file(path: str) -> bool:
    return path.lower().endswith(SUFFIXES)


def open_records(path: str) -> "ParquetRecords | JsonlRecords":
    """A reader of ``path`` by its suffix (``.parquet``; ``.jsonl`` or ``.ndjson``)."""
    if path.lower().endswith(".parquet"):
        return ParquetRecords(path)
    if path.lower().endswith((".jsonl", ".ndjson")):
        return JsonlRecords(path)
    raise ValueError(f"{path}: expected a .parquet, .jsonl or .ndjson record file")


class RecordError(ValueError):
    """A record file whose content does not fit the columns above."""


def _check_columns(path: str, names: list[str]) -> None:
    unknown = [n for n in names if n not in COLUMNS]
    missing = [n for n in REQUIRED if n not in names]
    if unknown or missing:
        what = f"unknown column(s) {unknown}" if unknown else f"no column(s) {missing}"
        raise RecordError(f"{path}: {what}; expected {', '.join(COLUMNS)} (id and vector required)")


def _vectors(path: str, first: int, rows: list) -> np.ndarray:
    """Rows of numbers as (n, dim) float32; a row of another length is named."""
    lengths = [len(r) if isinstance(r, (list, tuple, np.ndarray)) else -1 for r in rows]
    for i, n in enumerate(lengths):
        if n != lengths[0] or n <= 0:
            expected = f", expected {lengths[0]} like row {first}" if lengths[0] > 0 and i else ""
            got = "no list" if n < 0 else f"{n} values"
            raise RecordError(f"{path}: row {first + i}: vector has {got}{expected}")
    try:
        return np.asarray(rows, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise RecordError(f"{path}: rows {first}..{first + len(rows) - 1}: vectors must hold numbers ({e})") from None


def _ids(path: str, first: int, values: list) -> np.ndarray | list[str]:
    if all(isinstance(v, str) for v in values):
        return list(values)
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            kind = "str" if isinstance(v, str) else type(v).__name__
            raise RecordError(f"{path}: row {first + i}: id {v!r} is {kind}; every id must be an int, or every "
                              f"one a str")
    return np.array(values, dtype=np.int64)


def _metadata(path: str, first: int, values: list, json_text: bool) -> list[dict | None]:
    out: list[dict | None] = []
    for i, v in enumerate(values):
        if v is not None and json_text:
            try:
                v = json.loads(v)
            except ValueError as e:
                raise RecordError(f"{path}: row {first + i}: metadata is not valid JSON ({e})") from None
        if v is not None and not isinstance(v, dict):
            raise RecordError(f"{path}: row {first + i}: metadata must be a JSON object or null, got "
                              f"{type(v).__name__}")
        out.append(v)
    return out


def _documents(path: str, first: int, values: list) -> list[str | None]:
    for i, v in enumerate(values):
        if v is not None and not isinstance(v, str):
            raise RecordError(f"{path}: row {first + i}: document must be a string or null, got {type(v).__name__}")
    return list(values)


class ParquetRecords:
    """Rows of a parquet file, read a batch at a time (row groups before ``start`` are skipped)."""

    def __init__(self, path: str):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError("reading .parquet files needs pyarrow: pip install 'vindex[ingest]'") from None
        self.path = path
        self.file = pq.ParquetFile(path)
        self.names = list(self.file.schema_arrow.names)
        _check_columns(path, self.names)
        self.rows = int(self.file.metadata.num_rows)

    def batches(self, start: int, batch: int) -> Iterator[Records]:
        groups, row = [], 0
        for g in range(self.file.num_row_groups):
            n = self.file.metadata.row_group(g).num_rows
            if row + n <= start and not groups:
                row += n
                continue
            groups.append(g)
        if not groups:
            return
        for rb in self.file.iter_batches(batch_size=batch, row_groups=groups, columns=self.names):
            if row + rb.num_rows <= start:
                row += rb.num_rows
                continue
            if row < start:
                rb, row = rb.slice(start - row), start
            yield self._records(rb, row)
            row += rb.num_rows

    def _records(self, rb: Any, first: int) -> Records:
        import pyarrow as pa

        cols = {name: rb.column(name) for name in self.names}
        for name in REQUIRED:
            if cols[name].null_count:
                i = cols[name].is_null().to_pylist().index(True)
                raise RecordError(f"{self.path}: row {first + i}: {name} is null")
        vec = cols["vector"]
        if pa.types.is_fixed_size_list(vec.type):
            dim = vec.type.list_size
            x = np.asarray(vec.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim)
        else:
            x = _vectors(self.path, first, vec.to_pylist())
        meta = cols.get("metadata")
        metadata = None
        if meta is not None:
            struct = pa.types.is_struct(meta.type)
            if not struct and not pa.types.is_string(meta.type) and not pa.types.is_large_string(meta.type):
                raise RecordError(f"{self.path}: column metadata: expected a struct or a string of JSON, got "
                                  f"{meta.type}")
            if struct and not meta.null_count and meta.type.num_fields:
                # as columns, a null field leaving the key out of its row (a struct gives every
                # row every field): Index.upsert checks and indexes them a column at a time
                metadata = pa.RecordBatch.from_struct_array(meta)
            else:
                values = meta.to_pylist()
                if struct:  # leave out the fields a row does not set, as above
                    values = [None if v is None else {k: f for k, f in v.items() if f is not None} for v in values]
                metadata = _metadata(self.path, first, values, json_text=not struct)
        doc = cols.get("document")
        documents = None
        if doc is not None:
            string = pa.types.is_string(doc.type) or pa.types.is_large_string(doc.type)
            documents = doc.to_pylist() if string else _documents(self.path, first, doc.to_pylist())
        return Records(first, _ids(self.path, first, cols["id"].to_pylist()), x, metadata, documents)


class JsonlRecords:
    """Rows of a JSON-lines file (blank lines are skipped and not counted)."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            self.rows = sum(1 for line in f if line.strip())

    def batches(self, start: int, batch: int) -> Iterator[Records]:
        pending: list[dict] = []
        row = 0
        with open(self.path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if row >= start:
                    pending.append(self._object(line, lineno, row))
                    if len(pending) == batch:
                        yield self._records(pending, row - batch + 1)
                        pending = []
                row += 1
        if pending:
            yield self._records(pending, row - len(pending))

    def _object(self, line: str, lineno: int, row: int) -> dict:
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise RecordError(f"{self.path}: line {lineno} (row {row}): not valid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise RecordError(f"{self.path}: line {lineno} (row {row}): expected a JSON object")
        unknown = [k for k in obj if k not in COLUMNS]
        missing = [k for k in REQUIRED if k not in obj or obj[k] is None]
        if unknown or missing:
            what = f"unknown key(s) {unknown}" if unknown else f"no {' or '.join(missing)}"
            raise RecordError(f"{self.path}: line {lineno} (row {row}): {what}; expected {', '.join(COLUMNS)}")
        return obj

    def _records(self, objs: list[dict], first: int) -> Records:
        has_meta = any("metadata" in o for o in objs)
        has_docs = any("document" in o for o in objs)
        metadata = None
        if has_meta:
            raw = [o.get("metadata") for o in objs]
            metadata = [self._one_metadata(v, first + i) for i, v in enumerate(raw)]
        return Records(first, _ids(self.path, first, [o["id"] for o in objs]),
                       _vectors(self.path, first, [o["vector"] for o in objs]), metadata,
                       _documents(self.path, first, [o.get("document") for o in objs]) if has_docs else None)

    def _one_metadata(self, value: Any, row: int) -> dict | None:
        """An object, null, or (as in parquet string columns) a string of JSON."""
        return _metadata(self.path, row, [value], json_text=isinstance(value, str))[0]
