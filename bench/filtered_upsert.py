"""Upsert rate with metadata (the workload's 5 keys and one 500-byte document a row) against
without: the same vectors in the same batches into a fresh empty vindex index, the two variants
alternated ``repeats`` times, medians of rows/s."""
from __future__ import annotations

import inspect
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

import vindex

DOCUMENT_BYTES = 500


def document(i: int, title: str | None) -> str:
    """A ``DOCUMENT_BYTES``-byte ASCII document for row ``i``: its title (or number) repeated."""
    seed = (title or f"row {i}").encode("ascii", "replace").decode("ascii")
    text = f"{seed}. " * (DOCUMENT_BYTES // (len(seed) + 2) + 1)
    return text[:DOCUMENT_BYTES]


def _has_metadata_upsert() -> bool:
    return "metadata" in inspect.signature(vindex.Index.upsert).parameters


def _upsert_rate(path: str, vectors: np.ndarray, metric: str, batch: int, metadata=None, documents=None) -> float:
    shutil.rmtree(path, ignore_errors=True)
    extra = {}
    with vindex.Index.create(path, dim=vectors.shape[1], metric=metric) as index:
        t0 = time.perf_counter()
        for s in range(0, len(vectors), batch):
            ids = np.arange(s, min(s + batch, len(vectors)), dtype=np.int64)
            if metadata is not None:
                extra = {"metadata": metadata[s:s + batch], "documents": documents[s:s + batch]}
            index.upsert(ids, vectors[s:s + batch], **extra)
        return len(vectors) / (time.perf_counter() - t0)


def run(base: np.ndarray, metric: str, metadata: list[dict], titles: list[str] | None, *, rows: int,
        batch: int, repeats: int) -> dict:
    """``{"rows", "batch", "plain_rows_s", "metadata_rows_s", "ratio"}`` (or ``"skipped"`` for the
    metadata variant when this vindex has no ``upsert(metadata=...)``)."""
    n = min(rows, base.shape[0])
    vectors = base[:n]
    docs = [document(i, titles[i] if titles else None) for i in range(n)]
    supported = _has_metadata_upsert()
    plain, meta = [], []
    with tempfile.TemporaryDirectory(prefix="vindex-upsert-") as tmp:
        # compiles the write path's kernels, which the first upserts in a process would pay for
        _upsert_rate(f"{tmp}/warm", vectors[:2 * batch], metric, batch)
        for _ in range(max(1, repeats)):
            plain.append(_upsert_rate(f"{tmp}/plain", vectors, metric, batch))
            if supported:
                meta.append(_upsert_rate(f"{tmp}/meta", vectors, metric, batch, metadata[:n], docs))
    out = {"rows": n, "batch": batch, "repeats": len(plain), "keys": sorted(metadata[0]),
           "document_bytes": DOCUMENT_BYTES, "plain_rows_s": statistics.median(plain)}
    if supported:
        out["metadata_rows_s"] = statistics.median(meta)
        out["ratio"] = out["metadata_rows_s"] / out["plain_rows_s"]
    else:
        out["skipped"] = "this vindex has no Index.upsert(metadata=...) (issue 44's API is not on this branch)"
    print(f"upsert {n} rows in batches of {batch}: {out['plain_rows_s']:.0f} rows/s without metadata, "
          + (f"{out['metadata_rows_s']:.0f} with (x{out['ratio']:.2f})" if supported else out["skipped"]),
          file=sys.stderr, flush=True)
    return out
