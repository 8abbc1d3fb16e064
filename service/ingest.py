"""``vindex ingest``: stream a vector file into a collection, resumably.

Row ``r`` gets id ``r + id_offset``, so re-sending a row is an idempotent upsert. Rows go out
through one ``UpsertStream`` call in ``batch``-row chunks; after each chunk's acknowledgement
(the chunk is durable) the count of acknowledged rows is saved in a small progress file beside
the input. A run that stops (Ctrl-C, a network error, a server restart) continues where the
acknowledgements left off when started again; ``restart=True`` starts from row 0.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterator

import numpy as np

from vindex.errors import IndexNotFoundError
from vindex.files import write_json_atomic
from vindex.vecfiles import open_vectors


def progress_path(file: str, collection: str) -> str:
    return f"{file}.{collection}.vindex-progress"


def _identity(file: str, collection: str, id_offset: int) -> dict:
    st = os.stat(file)
    return {"file": os.path.abspath(file), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "collection": collection, "id_offset": id_offset}


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
    from tqdm import tqdm

    if batch < 1:
        raise ValueError(f"batch: expected a positive integer, got {batch}")
    data = open_vectors(file, key)
    n = len(data) if limit is None else min(len(data), limit)
    dim = int(data.shape[1])
    try:
        col = client.collection(name)
    except IndexNotFoundError:
        col = client.create_collection(name, dim=dim, metric=metric, exist_ok=True)
        print(f"created collection {name!r} (dim {dim}, {metric})", file=sys.stderr)
    if col.dim != dim:
        raise ValueError(f"{file}: rows have dimension {dim} but collection {name!r} has {col.dim}")
    state_file = progress_path(file, name)
    identity = _identity(file, name, id_offset)
    start = 0 if restart else min(_resume_row(state_file, identity), n)
    if start:
        print(f"resuming at row {start} of {n} (progress in {state_file})", file=sys.stderr)

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for lo in range(start, n, batch):
            hi = min(n, lo + batch)
            yield np.arange(lo + id_offset, hi + id_offset, dtype=np.int64), np.asarray(data[lo:hi], np.float32)

    done = start
    bar = tqdm(total=n, initial=start, unit="vec", unit_scale=True, disable=not progress, desc=f"ingest {name}")
    try:
        for ack in col.upsert_stream(chunks()):
            done = start + int(ack.total)
            write_json_atomic(state_file, {**identity, "rows_done": done})
            bar.update(int(ack.upserted))
    finally:
        bar.close()
    print(f"ingested rows {start}..{done} of {file} into {name!r}; collection holds {len(col)} vectors",
          file=sys.stderr)
    return 0
