"""Upsert rate with metadata (the workload's 5 keys and one 500-byte document a row) against
without: the same vectors in the same batches into a fresh empty vindex index, the variants
alternated ``repeats`` times, medians of rows/s. The metadata goes in as one dict per row, and
(where this vindex takes them) as columns: a dict of key to a list of values per batch."""
from __future__ import annotations

import inspect
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable

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


def _takes_columns() -> bool:
    try:
        from vindex.filters.flat import column_groups  # noqa: F401  (metadata as columns)
    except ImportError:
        return False
    return True


def as_columns(rows: list[dict], batch: int) -> list[dict[str, list]]:
    """Each batch of ``rows`` (every row with the same keys) as a dict of key to its values."""
    return [{key: [row[key] for row in rows[s:s + batch]] for key in rows[0]} for s in range(0, len(rows), batch)]


def _upsert_rate(path: str, vectors: np.ndarray, metric: str, batch: int,
                 extra: Callable[[int, int], dict] | None = None) -> tuple[float, float]:
    """``(rows/s, CPU µs per row)`` of upserting ``vectors`` in batches into a fresh index;
    ``extra(lo, hi)``: the keyword arguments (metadata, documents) of rows ``lo:hi``. The CPU
    time is the whole process's (RocksDB's and the rebalancer's threads too): on a shared
    machine it varies less than the rate."""
    shutil.rmtree(path, ignore_errors=True)
    with vindex.Index.create(path, dim=vectors.shape[1], metric=metric) as index:
        t0, cpu0 = time.perf_counter(), time.process_time()
        for s in range(0, len(vectors), batch):
            hi = min(s + batch, len(vectors))
            index.upsert(np.arange(s, hi, dtype=np.int64), vectors[s:hi], **(extra(s, hi) if extra else {}))
        return len(vectors) / (time.perf_counter() - t0), (time.process_time() - cpu0) / len(vectors) * 1e6


def run(base: np.ndarray, metric: str, metadata: list[dict], titles: list[str] | None, *, rows: int,
        batch: int, repeats: int) -> dict:
    """``{"rows", "batch", "plain_rows_s", "metadata_rows_s", "ratio"}``, with
    ``"columns_rows_s"`` and ``"columns_ratio"`` for metadata given as columns (or
    ``"skipped"`` when this vindex has no ``upsert(metadata=...)``), and each variant's median
    CPU µs per row (``"<variant>_cpu_us_row"``)."""
    n = min(rows, base.shape[0])
    vectors = base[:n]
    docs = [document(i, titles[i] if titles else None) for i in range(n)]
    supported, columnar = _has_metadata_upsert(), _takes_columns()
    columns = as_columns(metadata[:n], batch) if columnar else []
    variants: dict[str, Callable[[int, int], dict] | None] = {"plain": None}
    if supported:
        variants["metadata"] = lambda lo, hi: {"metadata": metadata[lo:hi], "documents": docs[lo:hi]}
    if columnar:
        variants["columns"] = lambda lo, hi: {"metadata": columns[lo // batch], "documents": docs[lo:hi]}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="vindex-upsert-") as tmp:
        # compiles the write path's kernels, which the first upserts in a process would pay for
        _upsert_rate(f"{tmp}/warm", vectors[:2 * batch], metric, batch)
        for _ in range(max(1, repeats)):
            for name, extra in variants.items():
                rate, cpu_us = _upsert_rate(f"{tmp}/{name}", vectors, metric, batch, extra)
                rates[name].append(rate)
                cpu[name].append(cpu_us)
    out = {"rows": n, "batch": batch, "repeats": len(rates["plain"]), "keys": sorted(metadata[0]),
           "document_bytes": DOCUMENT_BYTES, "plain_rows_s": statistics.median(rates["plain"])}
    out.update({f"{name}_cpu_us_row": statistics.median(us) for name, us in cpu.items()})
    for name in ("metadata", "columns"):
        if name in rates:
            out[f"{name}_rows_s"] = statistics.median(rates[name])
            out["ratio" if name == "metadata" else "columns_ratio"] = out[f"{name}_rows_s"] / out["plain_rows_s"]
    if not supported:
        out["skipped"] = "this vindex has no Index.upsert(metadata=...) (issue 44's API is not on this branch)"
    print(f"upsert {n} rows in batches of {batch}: {out['plain_rows_s']:.0f} rows/s without metadata, "
          + (f"{out['metadata_rows_s']:.0f} with (x{out['ratio']:.2f})" if supported else out["skipped"])
          + (f", {out['columns_rows_s']:.0f} as columns (x{out['columns_ratio']:.2f})" if columnar else ""),
          file=sys.stderr, flush=True)
    return out
