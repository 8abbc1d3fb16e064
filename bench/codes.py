"""int8 posting codes with exact rerank, beside hnswlib and faiss IVFFlat in one process.

    python -m bench.codes --datasets wiki-minilm-15k,glove-100k,synthetic-1m

Per data set: vindex without codes (float32 postings only), with codes beside the float32
postings it keeps, and with codes alone (``resident_bytes=0``; ``VARIANTS``), each over a
``max_postings`` sweep on the same index, against hnswlib's ef
sweep and faiss IVFFlat's nprobe sweep; each setting's recall@10 and batch-size-1 p50 over
``--queries`` one-query searches (one thread, after a warm pass). The p50 at recall 0.95 is
the cheapest setting reaching it. Memory: ``stats()["store"]`` (float32 postings kept, codes
kept, vector file) and the RSS of a fresh process that opened the index and ran the
queries at the setting reaching 0.95, each variant and each peer. Then the
upsert rate with codes and without (``--ingest``), alternated. Writes ``<out>/codes.json``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from . import datasets, measure, report
from .peers import make_peer

MAX_POSTINGS = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
#: (label, runtime config at open, search's rerank): float32 postings only (no codes built);
#: codes beside the float32 postings kept; codes with no float32 postings kept.
VARIANTS = (("vindex float32", {"resident_codes_bytes": 0}, 0),
            ("vindex codes", {}, None),
            ("vindex codes, no float32 kept", {"resident_bytes": 0}, None))
TARGET = 0.95


def _p50(fn, queries: np.ndarray, n: int) -> float:
    return measure.percentiles(measure.latencies(fn, queries, n=n))["p50"]


def _sweep(name: str, settings: list[dict], search, queries: np.ndarray, gt: np.ndarray, n: int) -> list[dict]:
    rows = []
    for params in settings:
        ids = search(queries, params)
        recall = datasets.recall_at_k(ids, gt, 10)
        row = {"method": name, "params": params, "recall": recall,
               "p50": _p50(lambda q: search(q, params), queries, n)}
        rows.append(row)
        print(f"  {name} {params} recall {recall:.4f} p50 {row['p50']:.3f} ms", file=sys.stderr, flush=True)
        if recall > 0.99:
            break
    return rows


def _at_target(rows: list[dict]) -> dict | None:
    ok = [r for r in rows if r["recall"] >= TARGET]
    return min(ok, key=lambda r: r["p50"]) if ok else None


def _rss_vindex(path: str, runtime: dict, mp: int, qfile: str, n: int) -> int:
    # the first search starts the build of the codes: the others run once it is done
    code = (f"import numpy, vindex\nindex = vindex.Index.open({path!r}, **{runtime!r})\n"
            f"q = numpy.load({qfile!r})[:{n}]\nindex.search(q[0], 10, max_postings={mp})\n"
            f"assert index.wait_idle(timeout=3600)\n"
            f"for row in q:\n    index.search(row, 10, max_postings={mp})\n")
    return measure.rss_of_subprocess(code)


def _rss_peer(peer, path: str, params: dict, qfile: str, n: int) -> int:
    cls = type(peer).__name__
    code = (f"import numpy\nfrom bench.peers import {cls}\nindex = {cls}.open_for_rss({path!r})\n"
            f"q = numpy.load({qfile!r})[:{n}]\n")
    if cls == "Hnswlib":
        code += f"index.set_ef({params['ef']})\nfor row in q:\n    index.knn_query(row[None], k=10, num_threads=1)\n"
    else:
        code += (f"import faiss\nindex.nprobe = {params['nprobe']}\nfaiss.omp_set_num_threads(1)\n"
                 f"for row in q:\n    index.search(row[None], 10)\n")
    return measure.rss_of_subprocess(code)


def run_dataset(name: str, args, workdir: str) -> dict:
    import vindex

    ds = datasets.load(name)
    queries, gt = ds.queries[:args.queries], ds.gt_ids[:args.queries]
    qfile = os.path.join(workdir, f"{name}-queries.npy")
    np.save(qfile, queries if ds.metric != "cosine" else queries / np.linalg.norm(queries, axis=1, keepdims=True))
    out: dict = {"dataset": name, "n": int(ds.base.shape[0]), "dim": int(ds.base.shape[1]), "queries": len(queries)}
    path = os.path.join(workdir, f"{name}-vindex")
    runtime = {"cache_bytes": args.cache_bytes}
    cached = args.index_dir.get(name)
    started = time.perf_counter()
    if cached:
        shutil.copytree(cached, path)
        out["vindex_build"] = f"copied from {cached}"
    else:
        measure.limit_threads(args.build_threads)
        vindex.Index.build(path, ds.base, metric=ds.metric, build_threads=args.build_threads, progress=False).close()
        out["vindex_build_s"] = time.perf_counter() - started
    measure.limit_threads(1)
    settings = [{"max_postings": m} for m in MAX_POSTINGS]
    rows: dict[str, list[dict]] = {}
    out["store_stats"], out["open_s"] = {}, {}
    for label, extra, rerank in VARIANTS:
        t0 = time.perf_counter()
        index = vindex.Index.open(path, **runtime, **extra)
        out["open_s"][label] = time.perf_counter() - t0
        index.search(queries, 10, max_postings=max(MAX_POSTINGS))  # warm caches and kernels
        index.search(queries[0], 10)  # starts the codes' build
        assert index.wait_idle(timeout=3600)

        def search(q, params, index=index, rerank=rerank):
            return index.search(q, 10, rerank=rerank, **params).ids

        rows[label] = _sweep(label, settings, search, queries, gt, args.latency_queries)
        out["store_stats"][label] = {k: v for k, v in index.stats()["store"].items() if k != "io"}
        index.close()
    peers = {}
    for peer_name in ("hnswlib", "faiss-ivfflat"):
        peer = make_peer(peer_name, build_threads=args.build_threads)
        measure.limit_threads(args.build_threads)
        t0 = time.perf_counter()
        peer.build(ds.base, ds.metric)
        out[f"{peer_name}_build_s"] = time.perf_counter() - t0
        measure.limit_threads(1)
        peer_path = os.path.join(workdir, f"{name}-{peer_name}")
        peer.save(peer_path)
        peers[peer_name] = (peer, peer_path)

        def search_peer(q, params, peer=peer):
            peer.set_params(params)
            return peer.search(q, 10)

        rows[peer_name] = _sweep(peer_name, peer.sweep(), search_peer, queries, gt, args.latency_queries)
        del peer
    out["sweeps"] = rows
    best = {m: _at_target(r) for m, r in rows.items()}
    out["at_0.95"] = best
    rss = {}
    for label, extra, _ in VARIANTS:
        mp = (best[label] or rows[label][-1])["params"]["max_postings"]
        rss[label] = _rss_vindex(path, {**runtime, **extra}, mp, qfile, args.rss_queries)
    for peer_name, (peer, peer_path) in peers.items():
        params = (best[peer_name] or rows[peer_name][-1])["params"]
        rss[peer_name] = _rss_peer(peer, peer_path, params, qfile, args.rss_queries)
    out["rss_bytes"] = rss
    for m, b in best.items():
        print(f"[{name}] {m}: p50@0.95 {b['p50'] if b else float('nan'):.3f} ms {b['params'] if b else ''}",
              file=sys.stderr)
    for m, v in rss.items():
        print(f"[{name}] RSS {m}: {v / 2**20:.0f} MiB", file=sys.stderr)
    shutil.rmtree(path, ignore_errors=True)
    return out


def run_ingest(args, workdir: str) -> dict:
    """Upsert rows/s (batches of 1,000, rebalancing off) into a glove-100k index of
    ``--ingest-rows`` built rows, as many again, with codes and without, alternated."""
    import vindex

    ds = datasets.load("glove-100k")
    n = args.ingest_rows
    x = ds.base[:2 * n]
    rates: dict[str, list[float]] = {"codes": [], "no codes": []}
    for rep in range(args.ingest_repeats):
        for label, codes_bytes in (("codes", -1), ("no codes", 0))[:: 1 if rep % 2 == 0 else -1]:
            path = os.path.join(workdir, f"ingest-{rep}-{codes_bytes}")
            index = vindex.Index.build(path, x[:n], metric=ds.metric, resident_codes_bytes=codes_bytes,
                                       rebalance=False, progress=False)
            t0 = time.perf_counter()
            for lo in range(n, 2 * n, 1000):
                index.upsert(np.arange(lo, lo + 1000), x[lo:lo + 1000])
            rates[label].append(n / (time.perf_counter() - t0))
            index.close()
            shutil.rmtree(path, ignore_errors=True)
            print(f"  ingest {label}: {rates[label][-1]:.0f} rows/s", file=sys.stderr, flush=True)
    return {"rows_per_s": rates, "median": {k: float(np.median(v)) for k, v in rates.items()}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="wiki-minilm-15k,glove-100k,synthetic-1m")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--latency-queries", type=int, default=1000)
    ap.add_argument("--rss-queries", type=int, default=1000)
    ap.add_argument("--cache-bytes", type=int, default=1 << 30,
                    help="vindex cache_bytes (resident postings: a quarter; codes: half)")
    ap.add_argument("--build-threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--index-dir", action="append", default=[],
                    help="NAME=PATH: copy a built vindex index for NAME instead of building one")
    ap.add_argument("--ingest", action="store_true")
    ap.add_argument("--ingest-repeats", type=int, default=3)
    ap.add_argument("--ingest-rows", type=int, default=50_000)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args(argv)
    args.index_dir = dict(item.split("=", 1) for item in args.index_dir)
    result: dict = {"cache_bytes": args.cache_bytes, "datasets": {}}
    with tempfile.TemporaryDirectory(prefix="vindex-codes-") as workdir:
        for name in [d for d in args.datasets.split(",") if d]:
            result["datasets"][name] = run_dataset(name, args, workdir)
        if args.ingest:
            result["ingest"] = run_ingest(args, workdir)
    report.write_json(os.path.join(args.out, "codes.json"), result)


if __name__ == "__main__":
    main()
