"""The ``vindex`` command line.

    vindex serve  [--data DIR] [--host H] [--port P] [--sample wiki]   run the gRPC server
                  [--ray ADDRESS|auto --shards S --replicas R]   collections sharded over Ray actors
                  [--metrics-port PORT] [--log-json]
                  [--tenants FILE] [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]
    vindex create NAME --dim D [--metric cosine] [--set key=value ...]  create a collection
    vindex ingest NAME FILE [--batch N]       stream a vector or record file in (resumable, with progress)
    vindex ingest FILE --collection NAME      the same; FILE .parquet/.jsonl: ids, vectors, metadata, documents
    vindex query  NAME (--id ID | --file F)   nearest neighbours of a stored id or of file rows
    vindex stats  NAME | list | drop NAME     inspect and manage collections
    vindex demo                               the library alone: build and query a bundled set
    vindex verify DIR                         check an index (or every collection of a data dir)

Every client command talks to ``--server`` (default ``127.0.0.1:50051``, or ``$VINDEX_SERVER``),
sending ``--api-key`` (default ``$VINDEX_API_KEY``) and trusting ``--tls-ca`` for TLS.
Heavy imports are deferred so ``serve`` can pin BLAS/OpenMP to one thread per call first.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

DEFAULT_SERVER = "127.0.0.1:50051"
#: One BLAS/OpenMP thread per call: the server runs many calls at once on its own pool.
_SERVE_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


# --- serve ---------------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    from .server import Limits, ServerConfig, serve

    from .logs import configure

    configure(args.log_level, args.log_json)  # one line per event, secrets taken out
    logging.getLogger("faiss").setLevel(logging.WARNING)  # its loader logs which CPU build it picked
    limits = Limits(max_rows=args.max_rows, max_queries=args.max_queries, max_k=args.max_k,
                    max_results=args.max_results, max_search_threads=args.max_search_threads,
                    max_concurrent_rpcs=args.max_concurrent_rpcs, max_client_rpcs=args.max_client_rpcs,
                    max_inflight_bytes=args.max_inflight_bytes, inflight_wait_s=args.inflight_wait,
                    stream_idle_timeout_s=args.stream_idle_timeout)
    if not 0.05 <= args.switch_interval_ms <= 100:
        raise SystemExit(f"--switch-interval-ms: expected 0.05..100, got {args.switch_interval_ms}")
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    sharding = None
    if args.ray is not None:
        from .collections import Sharding

        sharding = Sharding(args.ray, shards=args.shards, replicas=args.replicas)
    elif (args.shards, args.replicas) != (2, 1):
        raise SystemExit("vindex serve: --shards and --replicas shard collections over Ray: give --ray too")
    cfg = ServerConfig(data_dir=args.data, host=args.host, port=args.port, workers=args.workers,
                       limits=limits, sample=None if args.sample == "none" else args.sample,
                       tenants=args.tenants, tls_cert=args.tls_cert, tls_key=args.tls_key,
                       tls_client_ca=args.tls_client_ca, sharding=sharding, metrics_port=args.metrics_port)
    if args.metrics_port is not None:
        from .metrics import require

        require()  # a clear error now, not after the collections opened

    def ready(server: Any) -> None:
        names = server.collections.names()
        print(f"vindex: serving {len(names)} collection(s) {names} on {cfg.host}:{server.port} "
              f"(data {os.path.abspath(cfg.data_dir)}); Ctrl-C or SIGTERM stops", flush=True)

    serve(cfg, ready)
    try:
        print("vindex: stopped", flush=True)
    except BrokenPipeError:  # whoever started us stopped reading; the stop itself succeeded
        pass
    return 0


def _positive(kind: type, zero: bool = False) -> Any:
    """An argparse type: a number of ``kind`` above 0 (or at least 0 with ``zero``)."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (value >= 0 if zero else value > 0) or value != value:  # NaN fails too
            raise argparse.ArgumentTypeError(f"expected a number {'>= 0' if zero else '> 0'}, got {text}")
        return value
    return parse


# --- client commands -----------------------------------------------------------------------------
def _client(args: argparse.Namespace) -> Any:
    import vindex

    return vindex.Client(args.server, timeout=args.timeout, api_key=args.api_key or None,
                         tls_root_cert=args.tls_ca or None, tls_client_cert=args.tls_client_cert,
                         tls_client_key=args.tls_client_key)


def _config_pairs(pairs: list[str]) -> dict:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"vindex: --set expects key=value, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def cmd_create(args: argparse.Namespace) -> int:
    with _client(args) as client:
        col = client.create_collection(args.name, dim=args.dim, metric=args.metric, exist_ok=args.exist_ok,
                                       **_config_pairs(args.set))
        print(f"collection {col.name!r}: dim {col.dim}, metric {col.metric}, {len(col)} vectors")
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    from .ingest import ingest_file, ingest_records
    from .recordfiles import is_record_file

    if args.collection is not None:
        if len(args.paths) != 1:
            raise SystemExit(f"vindex ingest: with --collection give one FILE, got {args.paths}")
        name, file = args.collection, args.paths[0]
    elif len(args.paths) == 2:
        name, file = args.paths
    else:
        raise SystemExit("vindex ingest: expected NAME FILE, or FILE --collection NAME")
    with _client(args) as client:
        if is_record_file(file):
            if args.id_offset or args.key != "train":
                raise SystemExit("vindex ingest: --id-offset and --key are for vector files; a record file "
                                 "carries its own ids")
            return ingest_records(client, name, file, batch=args.batch, metric=args.metric, limit=args.limit,
                                  restart=args.restart, progress=not args.quiet)
        return ingest_file(client, name, file, batch=args.batch, id_offset=args.id_offset,
                           metric=args.metric, key=args.key, limit=args.limit, restart=args.restart,
                           progress=not args.quiet)


def cmd_query(args: argparse.Namespace) -> int:
    import numpy as np

    from vindex.vecfiles import open_vectors

    try:
        where = None if args.filter is None else json.loads(args.filter)
    except json.JSONDecodeError as e:
        print(f"vindex: --filter is not JSON: {e}", file=sys.stderr)
        return 2
    with _client(args) as client:
        col = client.collection(args.name)
        if args.id is not None:
            key = args.id if col.id_type == "str" else _int_id(args.id)
            if key is None:
                print(f"vindex: collection {args.name!r} has integer ids; --id {args.id!r} is not one", file=sys.stderr)
                return 2
            x, found = col.get([key])
            if not found[0]:
                print(f"vindex: id {args.id} is not in collection {args.name!r}", file=sys.stderr)
                return 1
            queries, labels = x, [f"id {args.id}"]
        else:
            f = open_vectors(args.file, args.key)
            lo, _, hi = args.rows.partition(":")
            lo_i, hi_i = int(lo or 0), int(hi) if hi else int(lo or 0) + 1
            queries = np.asarray(f[lo_i:hi_i], dtype=np.float32)
            labels = [f"{args.file} row {r}" for r in range(lo_i, lo_i + queries.shape[0])]
        params = {key: value for key, value in (("max_postings", args.max_postings), ("threads", args.threads))
                  if value is not None}
        if args.recall_target is not None:
            params["recall_target"] = args.recall_target
        t0 = time.perf_counter()
        res = col.search(queries, args.k, filter=where, include=["documents"], **params)
        ms = (time.perf_counter() - t0) * 1e3
        for label, ids, dists, docs in zip(labels, res.ids, res.distances, res.documents):
            print(f"{label}:")
            for rank, (i, d, doc) in enumerate(zip(ids, dists, docs), 1):
                if i is not None and not (isinstance(i, (int, np.integer)) and i < 0):
                    text = "" if doc is None else "  " + _shorten(doc, 80)
                    print(f"  {rank:>3}  id {str(i):<12} distance {d:.4f}{text}")
        print(f"({queries.shape[0]} quer{'y' if queries.shape[0] == 1 else 'ies'}, k={args.k}, {ms:.1f} ms)")
    return 0


def _int_id(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _shorten(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[:width - 1] + "…"


def cmd_stats(args: argparse.Namespace) -> int:
    with _client(args) as client:
        print(json.dumps(client.collection(args.name).stats(), indent=2))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        for name in client.list_collections():
            col = client.collection(name)
            print(f"{name}\tdim {col.dim}\t{col.metric}\t{len(col)} vectors")
    return 0


def cmd_drop(args: argparse.Namespace) -> int:
    with _client(args) as client:
        dropped = client.drop_collection(args.name)
    print(f"dropped {args.name!r}" if dropped else f"no collection named {args.name!r}")
    return 0 if dropped else 1


def cmd_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every index checks out, 1 on invariant violations; a store that fails its
    checksums raises CorruptionError (exit 2)."""
    from vindex import Index

    root = os.path.join(args.dir, "collections")
    paths = ([os.path.join(root, n) for n in sorted(os.listdir(root))] if os.path.isdir(root)
             else [args.dir])
    bad = 0
    for path in paths:
        # look, do not change anything; a bar on a terminal for the replay and the postings
        with Index.open(path, rebalance=False, progress=None) as index:
            report = index.verify(progress=None)
        print(f"== {path}\n{report}")
        bad += not report.ok
    return 1 if bad else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import demo

    return demo(args.dataset, args.data)


# --- parser --------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vindex", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gRPC server on an embedded store")
    s.add_argument("--data", default="./vindex-data", help="data directory (default ./vindex-data)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=50051, help="0 picks a free port (printed when ready)")
    s.add_argument("--sample", default="none", choices=["none", "wiki", "bigann", "glove"],
                   help="load this bundled data set as a collection of the same name if absent")
    s.add_argument("--workers", type=int, default=0, help="threads running calls (default 2 x cores)")
    s.add_argument("--max-rows", type=int, default=100_000, help="ids or vectors per request")
    s.add_argument("--max-queries", type=int, default=10_000, help="queries per search request")
    s.add_argument("--max-k", type=int, default=1024)
    s.add_argument("--max-results", type=int, default=1_000_000, help="queries x k per search request")
    s.add_argument("--max-search-threads", type=_positive(int, zero=True), default=0,
                   help="most cores one search request may ask for (SearchRequest.threads; default: all cores)")
    s.add_argument("--max-concurrent-rpcs", type=_positive(int), default=256,
                   help="calls in flight, all clients together; beyond it RESOURCE_EXHAUSTED (health "
                   "checks and reflection are never refused)")
    s.add_argument("--max-client-rpcs", type=_positive(int), default=64,
                   help="calls in flight of one client: its tenant with --tenants, else its address")
    s.add_argument("--max-inflight-bytes", type=_positive(int), default=512 << 20,
                   help="request bytes being worked on, all calls together (default 512 MiB)")
    s.add_argument("--inflight-wait", type=_positive(float, zero=True), default=1.0, metavar="SECONDS",
                   help="how long a request waits for room in --max-inflight-bytes before RESOURCE_EXHAUSTED")
    s.add_argument("--stream-idle-timeout", type=_positive(float), default=30.0, metavar="SECONDS",
                   help="an UpsertStream that sends nothing this long is ended (DEADLINE_EXCEEDED)")
    s.add_argument("--tenants", metavar="FILE", help="tenants, API keys, classes and quotas (JSON; see "
                   "docs/service.md); without it every call is the one tenant 'default', unauthenticated")
    s.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain: serve TLS (with --tls-key)")
    s.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    s.add_argument("--tls-client-ca", metavar="FILE",
                   help="PEM CA bundle: require client certificates it signed (mutual TLS)")
    s.add_argument("--ray", metavar="ADDRESS", help="shard every collection over Ray actors on the cluster at "
                   "ADDRESS ('auto': the one 'ray start' made on this machine; 'local': start one here)")
    s.add_argument("--shards", type=_positive(int), default=2, help="with --ray: shards of a new collection")
    s.add_argument("--replicas", type=_positive(int), default=1, help="with --ray: replicas of each shard")
    s.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on http://HOST:PORT/metrics (needs prometheus-client: "
                        "pip install 'vindex[metrics]'); 0 picks a free port")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument("--log-json", action="store_true",
                   help="log one JSON object per line (ts, level, logger, msg, ...) instead of text")
    s.add_argument("--switch-interval-ms", type=float, default=0.25,
                   help="GIL switch interval: how long a thread holding the GIL keeps a waiting search "
                        "waiting (Python's default 5 ms; on 1M, search p99 under ingest was 1.7x idle at "
                        "0.25 ms against 2.4x at 1 ms, bench.ingest)")
    s.set_defaults(func=cmd_serve)

    def client_parser(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("--server", default=os.environ.get("VINDEX_SERVER", DEFAULT_SERVER))
        p.add_argument("--timeout", type=float, default=60.0, help="seconds per call")
        p.add_argument("--api-key", default=os.environ.get("VINDEX_API_KEY"),
                       help="API key for a server with tenants (default $VINDEX_API_KEY, which keeps it "
                            "out of the process list)")
        p.add_argument("--tls-ca", metavar="FILE", default=os.environ.get("VINDEX_TLS_CA"),
                       help="PEM CA certificate the server's certificate is checked against: connect with TLS "
                            "(default $VINDEX_TLS_CA)")
        p.add_argument("--tls-client-cert", metavar="FILE", help="PEM client certificate (mutual TLS)")
        p.add_argument("--tls-client-key", metavar="FILE", help="PEM private key of --tls-client-cert")
        return p

    c = client_parser("create", "create a collection")
    c.add_argument("name")
    c.add_argument("--dim", type=int, required=True)
    c.add_argument("--metric", default="l2", choices=["l2", "ip", "cosine"])
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an IndexConfig field")
    c.add_argument("--exist-ok", action="store_true")
    c.set_defaults(func=cmd_create)

    i = client_parser("ingest", "upsert the vectors of a file (.npy .fvecs .bvecs .fbin .u8bin .hdf5), or the "
                                "records of a .parquet / .jsonl file (id, vector, metadata, document)")
    i.add_argument("paths", nargs="+", metavar="NAME FILE", help="collection and file; or only FILE with --collection")
    i.add_argument("--collection", help="the collection to ingest into (instead of NAME)")
    i.add_argument("--batch", type=int, default=2048, help="rows per acknowledged chunk")
    i.add_argument("--id-offset", type=int, default=0, help="vector files: row r gets id r + offset")
    i.add_argument("--metric", default="l2", choices=["l2", "ip", "cosine"],
                   help="metric if the collection has to be created")
    i.add_argument("--key", default="train", help="array name in an .hdf5 file")
    i.add_argument("--limit", type=int, default=None, help="ingest only the first LIMIT rows")
    i.add_argument("--restart", action="store_true", help="ignore saved progress and start at row 0")
    i.add_argument("--quiet", action="store_true", help="no progress bar")
    i.set_defaults(func=cmd_ingest)

    q = client_parser("query", "search a collection")
    q.add_argument("name")
    src = q.add_mutually_exclusive_group(required=True)
    src.add_argument("--id", help="use this stored vector (an int or str id) as the query")
    src.add_argument("--file", help="take queries from this vector file")
    q.add_argument("--rows", default="0", help="rows of --file: R or LO:HI (default 0)")
    q.add_argument("--key", default="test", help="array name in an .hdf5 file")
    q.add_argument("-k", type=int, default=10)
    q.add_argument("--max-postings", type=int, default=None)
    q.add_argument("--threads", type=int, default=None,
                   help="cores the server searches the queries with (default: the collection's search_threads)")
    q.add_argument("--recall-target", type=float, default=None,
                   help="read postings until the estimated recall@k reaches this, in (0, 1)")
    q.add_argument("--filter", default=None, help='a metadata filter as JSON, e.g. \'{"topic": "Arts"}\'')
    q.set_defaults(func=cmd_query)

    st = client_parser("stats", "print a collection's statistics as JSON")
    st.add_argument("name")
    st.set_defaults(func=cmd_stats)
    ls = client_parser("list", "list collections")
    ls.set_defaults(func=cmd_list)
    dr = client_parser("drop", "drop a collection and its data")
    dr.add_argument("name")
    dr.set_defaults(func=cmd_drop)

    v = sub.add_parser("verify", help="check the invariants of an index directory (server stopped)")
    v.add_argument("dir", help="an index directory, or a server data directory (every collection)")
    v.set_defaults(func=cmd_verify)

    d = sub.add_parser("demo", help="library only: build an index on a bundled data set and query it")
    d.add_argument("--dataset", choices=["wiki", "bigann", "glove"], default="wiki")
    d.add_argument("--data", default="./vindex-data", help="directory for index data (default ./vindex-data)")
    d.set_defaults(func=cmd_demo)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "serve":
        for var in _SERVE_ENV:
            os.environ.setdefault(var, "1")
    try:
        rc = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return rc
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (``vindex query ... | head``): stop quietly, as Unix tools do;
        # stdout goes to /dev/null so that the interpreter's own flush at exit does not fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command SIGPIPE stopped
    except Exception as e:  # library and service errors: one clear line, no traceback
        from vindex.errors import VindexError

        if isinstance(e, (VindexError, FileNotFoundError, ValueError, KeyError, ImportError)):
            print(f"vindex {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
