"""``vindex ingest``: stream a vector file or a record file into a collection, resumably.

A vector file's row ``r`` gets id ``r + id_offset``; a record file (``.parquet``, ``.jsonl``,
see :mod:`service.recordfiles`) carries its own ids, metadata and documents. Either way
re-sending a row is an idempotent upsert. Rows go out through one ``UpsertStream`` call in
chunks of at most ``batch`` rows (and, for records, ``CHUNK_BYTES``); after each chunk's
acknowledgement (the chunk is durable) the count of acknowledged rows is saved in a small
progress file beside the input. A run that stops (Ctrl-C, a network error, a server restart)
continues where the acknowledgements left off when started again; ``restart=True`` starts from
row 0.
"""
from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any, Iterator

import numpy as np

from vindex.errors import IndexNotFoundError
from vindex.files import write_json_atomic
from vindex.vecfiles import open_vectors

from .recordfiles import Records, open_records

#: Bytes of vectors, metadata and documents per streamed chunk of records at most (a chunk of
#: one row may be larger): far below the 64 MiB message limit, whatever the documents' sizes.
CHUNK_BYTES = 16 << 20


def progress_path(file: str, collection: str) -> str:
    return f"{file}.{collection}.vindex-progress"


def _identity(file: str, collection: str, **extra: Any) -> dict:
    """What a progress file must match to be resumed: the same file, unchanged, and settings."""
    st = os.stat(file)
    return {"file": os.path.abspath(file), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "collection": collection, **extra}


def _resume_row(path: str, identity: dict) -> int:
    """Rows already acknowledged by an earlier run over the same file and collection."""
    try:
        with open(path) as f:
            saved = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return 0
    return int(saved.get("rows_done", 0)) if {k: saved.get(k) for k in identity} == identity else 0


def ingest_file(client: Any, name: str, file: str, *, batch: int = 2048, id_offset: int = 0,
                metric: str = "l2", key: str = "train", limit: int | None = None,
                restart: bool = False, progress: bool = True) -> int:
    """Upsert the rows of ``file`` into collection ``name`` (created with the file's dimension
    and ``metric`` if absent). Returns a process exit code."""
    _check_batch(batch)
    data = open_vectors(file, key)
    n = len(data) if limit is None else min(len(data), limit)
    col = _collection(client, name, file, int(data.shape[1]), metric)
    identity = _identity(file, name, id_offset=id_offset)
    start = _start(file, name, identity, n, restart)

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for lo in range(start, n, batch):
            hi = min(n, lo + batch)
            yield np.arange(lo + id_offset, hi + id_offset, dtype=np.int64), np.asarray(data[lo:hi], np.float32)

    return _stream(col, name, file, identity, start, n, chunks(), progress)


def ingest_records(client: Any, name: str, file: str, *, batch: int = 2048, metric: str = "l2",
                   limit: int | None = None, restart: bool = False, progress: bool = True) -> int:
    """Upsert the records (id, vector, metadata, document) of a ``.parquet`` or ``.jsonl`` file
    into collection ``name`` (created with the file's dimension, id type and ``metric`` if
    absent). Returns a process exit code."""
    _check_batch(batch)
    records = open_records(file)
    n = records.rows if limit is None else min(records.rows, limit)
    identity = _identity(file, name)
    start = _start(file, name, identity, n, restart)
    batches = _limited(records.batches(start, batch), n)
    first = next(batches, None)
    if first is None:
        print(f"nothing to ingest: {file} has {n} row(s), {start} already done", file=sys.stderr)
        return 0
    col = _collection(client, name, file, int(first.vectors.shape[1]), metric,
                      id_type="str" if isinstance(first.ids, list) else "int")

    def chunks() -> Iterator[tuple]:
        for part in _split(first, batches):
            yield part.ids, part.vectors, part.metadata, part.documents

    return _stream(col, name, file, identity, start, n, chunks(), progress)


def _check_batch(batch: int) -> None:
    if batch < 1:
        raise ValueError(f"batch: expected a positive integer, got {batch}")


def _collection(client: Any, name: str, file: str, dim: int, metric: str, **create: Any) -> Any:
    """Collection ``name``, created for rows of dimension ``dim`` if absent."""
    try:
        col = client.collection(name)
    except IndexNotFoundError:
        col = client.create_collection(name, dim=dim, metric=metric, exist_ok=True, **create)
        print(f"created collection {name!r} (dim {dim}, {metric})", file=sys.stderr)
    if col.dim != dim:
        raise ValueError(f"{file}: rows have dimension {dim} but collection {name!r} has {col.dim}")
    return col


def _start(file: str, name: str, identity: dict, n: int, restart: bool) -> int:
    """The row to start at: 0, or where an earlier run's acknowledgements left off."""
    state_file = progress_path(file, name)
    start = 0 if restart else min(_resume_row(state_file, identity), n)
    if start:
        print(f"resuming at row {start} of {n} (progress in {state_file})", file=sys.stderr)
    return start


def _limited(batches: Iterator[Records], n: int) -> Iterator[Records]:
    """``batches`` cut off after row ``n``."""
    for rec in batches:
        if rec.first >= n:
            return
        yield rec.slice(0, n - rec.first) if rec.first + len(rec) > n else rec


def _split(first: Records, rest: Iterator[Records]) -> Iterator[Records]:
    """Every batch, cut where its rows' bytes would pass ``CHUNK_BYTES``."""
    for rec in itertools.chain([first], rest):
        sizes = np.full(len(rec), rec.vectors.shape[1] * 4, dtype=np.int64)
        if isinstance(rec.metadata, list):
            sizes += [0 if m is None else len(json.dumps(m)) for m in rec.metadata]
        elif rec.metadata is not None:  # columns: their bytes shared out evenly
            sizes += rec.metadata.nbytes // max(len(rec), 1)
        if rec.documents is not None:
            sizes += [0 if d is None else len(d.encode()) for d in rec.documents]
        lo, total = 0, 0
        for i, size in enumerate(sizes.tolist()):
            if total + size > CHUNK_BYTES and i > lo:
                yield rec.slice(lo, i)
                lo, total = i, 0
            total += size
        yield rec.slice(lo, len(rec))


def _stream(col: Any, name: str, file: str, identity: dict, start: int, n: int, chunks: Iterator[tuple],
            progress: bool) -> int:
    """Send ``chunks`` through one UpsertStream, saving progress after each acknowledgement."""
    from tqdm import tqdm

    state_file = progress_path(file, name)
    done = start
    bar = tqdm(total=n, initial=start, unit="vec", unit_scale=True, disable=not progress, desc=f"ingest {name}")
    try:
        for ack in col.upsert_stream(chunks):
            done = start + int(ack.total)
            write_json_atomic(state_file, {**identity, "rows_done": done})
            bar.update(int(ack.upserted))
    finally:
        bar.close()
    print(f"ingested rows {start}..{done} of {file} into {name!r}; collection holds {len(col)} vectors",
          file=sys.stderr)
    return 0
