"""``vindex ingest`` of a record file (parquet: id, vector, struct metadata, document) into a
server: rows/s with the metadata sent as columns (Arrow, into ``Index.upsert``'s columnar
path) against the same rows sent as one Struct per row, alternated ``--repeats`` times into
fresh collections of one server, medians.

    python -m bench.ingest_records --rows 20000

The file is generated: ``--dim`` random float32 vectors, the five keys of bench.filtered's
glove workload (label, year, cluster, rank: ints; group: a keyword) and a 500-byte document a
row. The server is a ``vindex serve`` subprocess on this machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from bench import report
from bench.filtered_upsert import DOCUMENT_BYTES, document
from bench.service_load import start_server, stop_server


def write_file(path: str, rows: int, dim: int, seed: int = 0) -> None:
    """A parquet record file of ``rows`` rows (see the module's docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    labels = rng.permutation(rows) % 10_000
    meta = pa.StructArray.from_arrays(
        [pa.array(labels), pa.array(rng.integers(1900, 2100, rows)), pa.array(rng.integers(0, 100, rows)),
         pa.array(np.arange(rows)), pa.array([f"g{lab // 100:03d}" for lab in labels.tolist()])],
        names=["label", "year", "cluster", "rank", "group"])
    table = pa.table({"id": pa.array(np.arange(rows, dtype=np.int64)),
                      "vector": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), dim),
                      "metadata": meta,
                      "document": pa.array([document(i, None) for i in range(rows)], pa.string())})
    pq.write_table(table, path, row_group_size=8192)


def _as_rows(open_records):
    """``open_records`` whose batches carry metadata as one dict per row (what ingest sent
    before it sent columns)."""
    def opened(path: str):
        records = open_records(path)
        batches = records.batches

        def rows(start: int, batch: int):
            for rec in batches(start, batch):
                rec.metadata = rec.metadata_rows()
                yield rec
        records.batches = rows
        return records
    return opened


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--dim", type=int, default=50)
    ap.add_argument("--batch", type=int, default=2048, help="ingest's --batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)

    import vindex
    from vindex.service import ingest

    rates: dict[str, list[float]] = {"columns": [], "rows": []}
    with tempfile.TemporaryDirectory(prefix="vindex-ingest-") as tmp:
        path = os.path.join(tmp, "records.parquet")
        write_file(path, args.rows, args.dim)
        proc, addr = start_server(os.path.join(tmp, "data"))
        try:
            with vindex.Client(addr, timeout=600) as client:
                original = ingest.open_records
                for r in range(args.repeats):
                    for name in rates:
                        ingest.open_records = original if name == "columns" else _as_rows(original)
                        try:
                            t0 = time.perf_counter()
                            rc = ingest.ingest_records(client, f"{name}-{r}", path, batch=args.batch, progress=False)
                            rates[name].append(args.rows / (time.perf_counter() - t0))
                        finally:
                            ingest.open_records = original
                        if rc:
                            raise SystemExit(f"ingest failed ({rc})")
                        client.drop_collection(f"{name}-{r}")
        finally:
            stop_server(proc)
    out = {"rows": args.rows, "dim": args.dim, "batch": args.batch, "repeats": args.repeats,
           "document_bytes": DOCUMENT_BYTES, "keys": ["label", "year", "cluster", "rank", "group"],
           "load_average": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
           **{f"{name}_rows_s": statistics.median(v) for name, v in rates.items()},
           "runs_rows_s": rates}
    out["ratio"] = out["columns_rows_s"] / out["rows_rows_s"]
    print(f"ingest {args.rows} rows: {out['columns_rows_s']:.0f} rows/s as columns, {out['rows_rows_s']:.0f} as "
          f"rows (x{out['ratio']:.2f})", file=sys.stderr)
    report.write_json(os.path.join(args.out, "ingest_records.json"), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
