"""Fuzzing the gRPC service: many garbage requests against a real server, counted by outcome.

    python -m bench.fuzz --requests 10000

Spawns ``vindex serve --port 0`` on a fresh data directory, writes a ``sentinel`` collection
(never written again) and three modeled collections (``fuzz-l2``, ``fuzz-ip``, ``fuzz-cos``),
then fires ``--requests`` fuzzed requests from ``--concurrency`` threads, every one through a
raw channel (bytes in, bytes out):

* structured requests of every RPC, valid or with defects: wrong, zero and 2^32-1 dimensions,
  byte strings that are not whole rows, NaN/Inf and random bit patterns as floats, k of 0 and
  above the limit, out-of-range search parameters, empty, duplicate, 2^63+ and too many ids,
  unknown collections, bad names, bad metrics, bad and hostile ``config_json``; filters valid
  and not (unknown operators, empty ``$and``, 300 nested ``$not``) on Search, Count, Scroll and
  Delete (a delete's valid filters name keys never written, so they delete nothing), ``include``
  with unknown names, Scroll page tokens that no Scroll returned, SetMetadata with metadata
  counts that do not match and metadata over its size limit;
* random bytes, and serialised requests with flipped bits, truncated, spliced or carrying
  invalid UTF-8, sent to any method;
* ``UpsertStream`` calls mixing valid chunks with bad ones and garbage;
* messages over the 64 MiB limit;
* vectors sent as ``repeated float`` instead of bytes, as float64 bytes, in both fields at
  once, and searches stating their query count ``nq`` rightly or wrongly.

``--tenants`` serves with a tenants file: set-up and checks use an admin key, every fuzzed call
a tenant granted only ``sentinel``, ``fuzz-*`` and ``scratch-*``, and a ``forbidden``
collection (written at set-up, named by the fuzz) joins the checked data. Every call, and every
stream message, naming a valid collection name outside those grants must be PERMISSION_DENIED
(and every call inside them must not be), and ListCollections must show only granted names.

Every call has a ``--timeout`` deadline (30 s): one that passes is a hang. A server process
that dies is a crash (the server is restarted on the same data and the run goes on). At the end:
health must be SERVING, the sentinel must hold its exact bytes and count, and every modeled
collection must hold, for every id, one of the vectors acknowledged for it (and every id whose
upsert was acknowledged and that no delete named). The server is then stopped (it must exit 0),
restarted, and the data checked again. Writes ``<out>/fuzz.json``.

Hostile-client modes (``bench/fuzz_admission.py``) check admission control instead:

    python -m bench.fuzz --mode idle-streams [--streams 300] [--idle-timeout 5] [--max-client-rpcs N]
    python -m bench.fuzz --mode slow-client  [--streams 300] [--idle-timeout 5] [--duration 15]

* ``idle-streams``: ``--streams`` UpsertStreams open at once from ``127.0.0.1`` and never send.
  Meanwhile that peer's health check must answer SERVING and another peer (``[::1]``) must be
  served; every stream must end, DEADLINE_EXCEEDED saying it was idle once ``--idle-timeout``
  passed (the server's ``--stream-idle-timeout``) or RESOURCE_EXHAUSTED naming the cap it hit.
* ``slow-client``: the same streams each send a one-row chunk every third of the idle timeout
  for ``--duration`` seconds, holding their slots; the same checks, then the admitted streams
  must end OK with every acknowledged row stored and the others must have been refused.

Each writes ``<out>/fuzz-<mode>.json`` and exits 1 unless every verdict holds.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from . import measure, report

SERVICE = "vindex.v1.VectorIndex"
SENTINEL = "sentinel"
MODELED = {"fuzz-l2": (16, "l2"), "fuzz-ip": (8, "ip"), "fuzz-cos": (5, "cosine")}
PROTECTED = {SENTINEL, *MODELED}
SCRATCH = [f"scratch-{i}" for i in range(4)]
UNKNOWN = ["nope", "FUZZ-L2", "sentinel2", "0", "scratch-9"]
FORBIDDEN = "forbidden"                 # --tenants: outside the fuzzing tenant's grants
GRANTS = ["sentinel", "fuzz-*", "scratch-*"]
KEYS = {"admin": "fuzz-admin-key", "fuzzer": "fuzz-tenant-key"}
BAD_NAMES = ["", "a/b", "..", ".hidden", "a b", "x" * 65, "ünï", "nul\0l", "-dash", "y" * 3000, "name\n", "é" * 10]
ANCHORS = np.arange(10**9, 10**9 + 100)  # written at set-up into every modeled collection, never named again
G_IDS = (0, 2000)      # ids upserted with the deterministic vectors g(id)
R_IDS = (2000, 4000)   # ids upserted with random vectors
LIMITS = dict(max_rows=2000, max_queries=200, max_k=256, max_results=20_000)
MESSAGE_BYTES = 64 * 2**20
#: Outcomes that leave it open whether a write was applied.
AMBIGUOUS = {"DEADLINE_EXCEEDED", "UNAVAILABLE", "UNKNOWN", "INTERNAL", "CANCELLED"}
#: Statuses the documentation allows for a fuzzed call while the server runs normally.
DOCUMENTED = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION"}
CONFIG_INT = ["posting_limit_bytes", "max_replicas", "replica_candidates", "insert_candidates", "insert_ef",
              "reassign_neighbors", "rebalance_batch", "checkpoint_every", "graph_degree", "graph_build_ef",
              "graph_entries", "kmeans_iters", "kmeans_max_points_per_centroid", "seed", "build_threads",
              "max_postings", "search_ef", "cache_bytes"]
CONFIG_FLOAT = ["build_fill", "replica_eps", "rng_factor", "new_head_factor", "merge_fraction", "gc_fraction",
                "scrub_ratio", "split_balance", "graph_alpha", "search_eps"]
#: Unbounded int fields that take huge values without allocating them (others stay small).
HUGE_OK = {"posting_limit_bytes", "checkpoint_every", "seed", "kmeans_max_points_per_centroid", "search_ef",
           "cache_bytes", "build_threads"}


def g_rows(ids: np.ndarray, dim: int) -> np.ndarray:
    """The deterministic vector of each id (finite, non-zero)."""
    j = np.arange(dim, dtype=np.float64)
    return (np.sin(np.asarray(ids, np.float64)[:, None] * (0.37 + j) + j) + 0.01 * (j + 1)).astype(np.float32)


def f32(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x, dtype="<f4").tobytes()


# --- the server ------------------------------------------------------------------------------------
class ServerProc:
    READY = re.compile(r"^vindex: serving \d+ collection\(s\) .* on (\S+):(\d+) \(data ")

    def __init__(self, data_dir: str, log_path: str, extra: list[str] | None = None):
        self.data_dir, self.log_path, self.extra = data_dir, log_path, extra or []
        self.proc: subprocess.Popen | None = None
        self.target = ""

    def start(self, timeout: float = 300.0) -> str:
        log = open(self.log_path, "a")
        args = [sys.executable, "-m", "vindex.service.cli", "serve", "--data", self.data_dir, "--port", "0",
                "--log-level", "warning"]
        for key, value in LIMITS.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        args += self.extra
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.proc.stdout] + [lines.put(None)],
                         daemon=True).start()
        self._lines = lines
        deadline = time.monotonic() + timeout
        while True:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                raise RuntimeError(f"server exited with {self.proc.wait()} before it was ready; see {self.log_path}")
            m = self.READY.match(line)
            if m:
                self.target = f"{m.group(1)}:{m.group(2)}"
                return self.target

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 120.0) -> tuple[int, bool]:
        """SIGTERM; the exit code and whether it printed its ``stopped`` line."""
        rc = measure.terminate(self.proc, timeout)
        rest = []
        while True:
            try:
                line = self._lines.get(timeout=10)
            except queue.Empty:
                break
            if line is None:
                break
            rest.append(line.strip())
        return rc, "vindex: stopped" in rest

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


# --- the fuzzer -------------------------------------------------------------------------------------
class Gen:
    """Fuzzed requests from a seeded generator: ``(method, payload bytes or list of chunks, kind)``."""

    def __init__(self, seed: int, forbidden: bool = False):
        from vindex.service import vindex_pb2 as pb

        self.pb = pb
        self.forbidden = [FORBIDDEN] if forbidden else []  # names outside the grants, with --tenants
        self.rng = np.random.default_rng(seed)
        methods = pb.DESCRIPTOR.services_by_name["VectorIndex"].methods
        self.request_types = {m.name: getattr(pb, m.input_type.name) for m in methods}
        self.unary = [m.name for m in methods if not m.client_streaming]

    # small helpers
    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, options: list) -> Any:
        return options[int(self.rng.integers(len(options)))]

    def random_text(self) -> str:
        n = int(self.rng.integers(0, 12))
        cps = self.rng.integers(1, 0x3000, n)
        text = "".join(chr(c) for c in cps if not 0xD800 <= c <= 0xDFFF)
        from vindex.service.collections import NAME_RE

        return self.pick(SCRATCH) if NAME_RE.fullmatch(text) else text  # random valid names: only the scratch pool

    def name(self, role: str) -> str:
        pools = {"read": [SENTINEL] * 2 + list(MODELED) * 4 + SCRATCH, "write": list(MODELED) * 5 + SCRATCH * 2,
                 "drop": SCRATCH * 2, "create": SCRATCH * 3 + [SENTINEL, "fuzz-l2"]}[role] + self.forbidden * 2
        r = self.rng.random()
        if r < 0.75:
            return self.pick(pools)
        if r < 0.85:
            return self.pick(UNKNOWN)
        if r < 0.95:
            return self.pick(BAD_NAMES)
        return self.random_text()

    def dim_of(self, name: str) -> int:
        if name in MODELED:
            return MODELED[name][0]
        if name == SENTINEL:
            return 16
        return int(self.rng.integers(1, 33))

    def ids(self, name: str) -> tuple[list[int], np.ndarray | None]:
        """Ids and, for valid g-range ids of a modeled collection, their vectors' source."""
        r = self.rng.random()
        n = int(self.pick([0, 1, 1, 2, 3, 5, 8, 13, 20]))
        lo, hi = G_IDS if r < 0.5 else R_IDS
        ids = self.rng.choice(np.arange(lo, hi), size=n, replace=False).astype(np.uint64)
        if r > 0.85:  # defects
            d = self.pick(["dup", "2^63", "2^64-1", "huge-list", "random-u64"])
            if d == "dup" and n:
                ids = np.append(ids, ids[0])
            elif d == "2^63":
                ids = np.append(ids, np.uint64(2**63) + np.uint64(self.rng.integers(0, 2**62)))
            elif d == "2^64-1":
                ids = np.append(ids, np.uint64(2**64 - 1))
            elif d == "huge-list":
                ids = np.arange(10**6, 10**6 + LIMITS["max_rows"] + int(self.rng.integers(1, 100)), dtype=np.uint64)
            else:
                ids = self.rng.integers(0, 2**63, size=n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        return [int(i) for i in ids if not (10**9 <= int(i) < 10**9 + 100)], None

    def floats(self, n: int, dim: int, name: str, ids: list[int] | None = None) -> bytes:
        """Whole rows of some kind (the caller breaks them further)."""
        if n == 0 or dim == 0:
            return b""
        kind = self.pick(["g", "g", "g", "normal", "normal", "scaled", "bits", "special"])
        if kind == "g":
            if ids is not None and len(ids) == n:
                return f32(g_rows(np.array(ids), dim))
            kind = "normal"
        if kind == "normal":
            return f32(self.rng.standard_normal((n, dim)))
        if kind == "scaled":
            scale = 10.0 ** self.rng.uniform(-40, 38)
            x = (self.rng.standard_normal((n, dim)) * scale).astype(np.float32)
        elif kind == "bits":  # random bit patterns: NaN, Inf, subnormals, 1e38
            x = self.rng.integers(0, 2**32, size=(n, dim), dtype=np.uint32).view("<f4").copy()
        else:
            x = self.rng.choice(np.array([0.0, -0.0, 1e-45, -1e-38, 3.4e38, -3.4e38, 1.0, np.nan, np.inf, -np.inf],
                                         dtype=np.float32), size=(n, dim))
        return f32(x)

    def encode(self, req: Any, field: str) -> Any:
        """Maybe move ``field``'s bytes elsewhere: to its ``repeated float`` twin, to float64
        bytes (twice the length: refused), or into both fields at once (refused)."""
        buf = getattr(req, field)
        if len(buf) % 4 or len(buf) > 1 << 20:
            return req
        twin, r = getattr(req, f"float_{field}"), self.rng.random()
        if r < 0.15:
            twin.extend(np.frombuffer(buf, "<f4").tolist())
            req.ClearField(field)
        elif buf and r < 0.18:
            setattr(req, field, np.frombuffer(buf, "<f4").astype("<f8").tobytes())
        elif buf and r < 0.21:
            twin.extend(np.frombuffer(buf, "<f4").tolist())
        return req

    def break_rows(self, buf: bytes, dim: int) -> tuple[bytes, int]:
        """Maybe damage the rows: partial rows, wrong dim field, injected NaN/Inf."""
        r = self.rng.random()
        if r < 0.8:
            return buf, dim
        d = self.pick(["partial", "dim0", "dim-other", "dim-max", "nan", "oversize-rows"])
        if d == "partial":
            return buf + self.rng.bytes(int(self.rng.integers(1, 4 * dim))), dim
        if d == "dim0":
            return buf, 0
        if d == "dim-other":
            return buf, int(self.rng.integers(1, 40))
        if d == "dim-max":
            return buf, 2**32 - 1
        if d == "nan" and buf:
            x = np.frombuffer(buf, "<f4").copy()
            x[int(self.rng.integers(x.size))] = self.pick([np.nan, np.inf, -np.inf])
            return f32(x), dim
        return bytes(4 * dim * (LIMITS["max_rows"] + 1)), dim

    def config_json(self) -> str:
        r = self.rng.random()
        if r < 0.15:
            return self.pick(["", "{", "[1]", "null", "1", '"x"', "{}", "[" * 50_000, '{"seed": ' + "9" * 5000 + "}",
                              '{"dim": 4}', '{"metric": "l2"}', '{"store": "memory"}', '{"store": "nvme"}',
                              '{"cache_bytes": 18446744073709551616}', '{"a": {"b": [1, 2, {"c": null}]}}',
                              "NaN", '{"max_postings": 1e999}', "\x00", '{"\\ud800": 1}'])
        cfg: dict[str, Any] = {}
        for _ in range(int(self.rng.integers(0, 4))):
            if self.chance(0.5):
                key = self.pick(CONFIG_INT)
                v = self.pick(["small", "small", "edge", "huge", "type"])
                if v == "small":
                    cfg[key] = int(self.rng.integers(-2, 300))
                elif v == "edge":
                    cfg[key] = self.pick([0, 1, 3, 4, 7, 8, 1023, 1024, 4096, 4097, 65536, 65537, 2**31 - 1])
                elif v == "huge" and (key in HUGE_OK or key == "graph_build_ef"):
                    cfg[key] = self.pick([2**31, 2**40, 2**62, 2**63 - 1])
                else:
                    cfg[key] = self.pick([None, "10", 1.5, True, [1], {"x": 1}])
            else:
                key = self.pick(CONFIG_FLOAT)
                v = self.pick(["normal", "edge", "type"])
                if v == "normal":
                    cfg[key] = float(self.rng.uniform(-0.5, 3.0))
                elif v == "edge":
                    cfg[key] = self.pick([0.0, 0.05, 0.5, 1.0, 1e-300, 1e30, 1e300, float("inf"), float("nan"),
                                          -0.0])
                else:
                    cfg[key] = self.pick([None, "1", [], 10**30])
        if self.chance(0.05):
            cfg[self.pick(["bogus", "rebalance", "durability"])] = self.pick([True, "x", 1])
        return json.dumps(cfg)

    # one request per RPC
    def structured(self, method: str) -> Any:
        pb = self.pb
        if method == "ListCollections":
            return pb.ListCollectionsRequest()
        if method == "DescribeCollection":
            return pb.DescribeCollectionRequest(name=self.name("read"))
        if method in ("Stats", "Flush"):
            req = self.request_types[method](collection=self.name("read"))
            if method == "Flush":
                req.wait_idle = self.chance(0.3)
            return req
        if method == "DropCollection":
            return pb.DropCollectionRequest(name=self.name("drop"))
        if method == "CreateCollection":
            return pb.CreateCollectionRequest(
                name=self.name("create"), dim=int(self.pick([0, 65537, 2**32 - 1] + list(range(1, 65, 3)))),
                metric=self.pick(["", "l2", "ip", "cosine", "L2", "euclid", "cos", "\x00"]),
                config_json=self.config_json(), if_not_exists=self.chance(0.5))
        if method in ("Get", "Delete"):
            name = self.name("read" if method == "Get" else "write")
            req = self.request_types[method](collection=name, ids=self.ids(name)[0])
            if method == "Get" and self.chance(0.3):
                req.include.extend(self.include())
            if method == "Delete" and self.chance(0.2):
                self.set_filter(req, deletes=True)
            return req
        if method == "Count":
            req = pb.CountRequest(collection=self.name("read"))
            if self.chance(0.8):
                self.set_filter(req)
            return req
        if method == "Scroll":
            req = pb.ScrollRequest(collection=self.name("read"), include=self.include(),
                                   batch=int(self.pick([0, 1, 7, 1000, LIMITS["max_rows"] + 1, 2**32 - 1])),
                                   page_token=self.pick(["", "", "0", "5", "-1", "x", "9" * 25, "\u0663"]))
            if self.chance(0.5):
                self.set_filter(req)
            return req
        if method == "SetMetadata":
            name = self.name("write")
            ids = self.ids(name)[0]
            req = pb.SetMetadataRequest(collection=name, ids=ids, replace=self.chance(0.3))
            for _ in range(int(self.pick([1, 1, len(ids), len(ids), 0, len(ids) + 1]))):
                req.metadata.add().update(self.metadata())
            return req
        if method == "Upsert":
            name = self.name("write")
            dim = self.dim_of(name)
            ids = self.ids(name)[0]
            n = len(ids) if self.chance(0.85) else int(self.rng.integers(0, 6))
            buf, dim = self.break_rows(self.floats(n, dim, name, ids), dim)
            req = pb.UpsertRequest(collection=name, ids=ids, vectors=buf, dim=dim, add_only=self.chance(0.2))
            return self.encode(req, "vectors")
        # Search
        name = self.name("read")
        dim = self.dim_of(name)
        nq = int(self.pick([0, 1, 1, 1, 2, 4, 16, 17, 64]))
        buf, dim = self.break_rows(self.floats(nq, dim, name), dim)
        if self.chance(0.03):  # more queries than a request may carry
            dim = self.dim_of(name)
            buf = bytes(4 * dim * (LIMITS["max_queries"] + 1))
        k = int(self.rng.integers(1, 20)) if self.chance(0.7) else \
            int(self.pick([0, 1, 100, LIMITS["max_k"], LIMITS["max_k"] + 1, 2**32 - 1]))
        req = self.encode(pb.SearchRequest(collection=name, queries=buf, dim=dim, k=k), "queries")
        r = self.rng.random()
        if r < 0.5:  # the count sent, or one that does not match it
            req.nq = nq if r < 0.45 else nq + int(self.rng.integers(1, 3))
        if self.chance(0.3):
            req.max_postings = int(self.pick([1, 2, 64, 4096, 4097, 2**32 - 1]))
        if self.chance(0.3):
            req.ef = int(self.pick([1, 8, 65536, 65537, 2**32 - 1]))
        if self.chance(0.3):
            req.eps = float(self.pick([0.0, 0.5, 10.0, float("inf"), float("nan"), -1.0, float("-inf"), 3e38]))
        if self.chance(0.2):
            self.set_filter(req)
        if self.chance(0.2):
            req.include.extend(self.include())
        return req

    # metadata, filters and include (the fuzz writes metadata keys m*, never the fz* its filters name)
    def metadata(self) -> dict:
        meta: dict[str, Any] = {"m": int(self.rng.integers(-5, 5)), "ms": self.random_text()}
        if self.chance(0.3):
            meta["ml"] = [1, "a", None, 2.5, True, {"x": [1]}]
        if self.chance(0.05):
            meta["mbig"] = "x" * (65 * 1024)  # over max_metadata_bytes
        if self.chance(0.05):
            meta["mnum"] = self.pick([float("nan"), float("inf"), 1e300, -0.0, 2.0**63])
        return meta

    def include(self) -> list[str]:
        names = ["metadata", "documents", "vectors", "bogus", "", "Metadata"]
        return [self.pick(names) for _ in range(int(self.pick([0, 1, 1, 2, 3])))]

    def set_filter(self, req: Any, deletes: bool = False) -> None:
        """A valid filter (for a delete one that matches nothing: fz* keys are never written) or
        a bad one."""
        good = [{"fz": 1}, {"fz": {"$in": [1, "a", None]}}, {"fz.a.b": {"$gte": "k", "$lt": 3}},
                {"$or": [{"fz": {"$gt": 2}}, {"fz2": {"$exists": True}}]}, {"fz": [1, 2]}, {"fz": None}]
        if not deletes:
            good += [{}, {"m": {"$gte": 0}}, {"$not": {"m": 1}}, {"ms": {"$nin": ["a"]}}, {"ml": "a"},
                     {"m": {"$exists": False}}, {"$and": [{"m": {"$lt": 3}}, {"ml.x": 1}]}]
        bad = [{"fz": {"$regex": "a"}}, {"$and": []}, {"": 1}, {"fz": {"$in": 3}}, {"$or": {"a": 1}},
               {"fz": {"$gt": [1]}}, {"fz": {"$eq": {"a": 1}}}, {"$nor": [{"a": 1}]}, {"fz": {"$exists": 1}}]
        nested: dict[str, Any] = {"fz": 1}
        for _ in range(int(self.rng.integers(1, 300))):
            nested = {"$not": nested}
        req.filter.update(self.pick(good) if self.chance(0.6) else self.pick(bad + [nested]))

    def mutate(self, raw: bytes) -> bytes:
        buf = bytearray(raw)
        how = self.pick(["flip", "truncate", "append", "splice", "bad-utf8", "dup-field"])
        if how == "flip" and buf:
            for _ in range(int(self.rng.integers(1, 5))):
                buf[int(self.rng.integers(len(buf)))] ^= 1 << int(self.rng.integers(8))
        elif how == "truncate" and buf:
            del buf[int(self.rng.integers(len(buf))):]
        elif how == "append":
            buf += self.rng.bytes(int(self.rng.integers(1, 32)))
        elif how == "splice" and buf:
            at = int(self.rng.integers(len(buf) + 1))
            buf[at:at] = self.rng.bytes(int(self.rng.integers(1, 16)))
        elif how == "dup-field":
            buf += bytes(buf)  # every field twice: the last scalar wins, repeated ones concatenate
        else:
            buf = bytearray(b"\x0a\x04\xff\xfe\xc3\x28") + buf
        return bytes(buf)

    def next(self) -> tuple[str, Any, str]:
        r = self.rng.random()
        if r < 0.002:
            method = self.pick(self.unary + ["UpsertStream"])
            size = MESSAGE_BYTES + int(self.rng.integers(1, 4096))
            payload = self.rng.bytes(size) if self.chance(0.5) else bytes(size)
            return method, [payload] if method == "UpsertStream" else payload, "oversized"
        if r < 0.06:
            chunks = []
            for _ in range(int(self.rng.integers(1, 7))):
                c = self.rng.random()
                if c < 0.6:
                    name = self.pick(list(MODELED) + ["", ""] + SCRATCH)
                    dim = self.dim_of(name) if name else 16
                    ids = self.ids(name)[0]
                    buf = self.floats(len(ids), dim, name or "scratch", ids)
                    chunks.append(self.pb.UpsertRequest(collection=name, ids=ids, vectors=buf,
                                                        dim=dim).SerializeToString())
                elif c < 0.8:
                    chunks.append(self.structured("Upsert").SerializeToString())
                else:
                    chunks.append(self.rng.bytes(int(self.rng.integers(0, 64))))
            return "UpsertStream", chunks, "stream"
        method = self.pick(self.unary)
        if r < 0.70:
            return method, self.structured(method).SerializeToString(), "structured"
        if r < 0.85:
            base = self.pick(self.unary)
            raw = self.mutate(self.structured(base).SerializeToString())
            return (base if self.chance(0.7) else method), raw, "mutated"
        n = int(self.pick([0, 1, 2, 5, 16, 64, 256, 4096]))
        return method, self.rng.bytes(n), "random-bytes"


class Tracker:
    """What each modeled collection may hold: for every id, the vectors whose upsert was
    acknowledged (or may have been applied), and which ids a delete named."""

    def __init__(self):
        self.lock = threading.Lock()
        self.possible: dict[str, dict[int, set[bytes]]] = {n: collections.defaultdict(set) for n in MODELED}
        self.acked: dict[str, set[int]] = {n: set() for n in MODELED}
        self.deleted: dict[str, set[int]] = {n: set() for n in MODELED}

    def stored_rows(self, name: str, buf: bytes, dim: int) -> list[bytes] | None:
        from vindex import validation

        if dim != MODELED[name][0] or len(buf) % (4 * dim):
            return None
        x = np.frombuffer(buf, "<f4").reshape(-1, dim)
        if not np.isfinite(x).all():
            return None
        if MODELED[name][1] == "cosine":
            try:
                x = validation.unit_rows(x, what="vectors")
            except Exception:
                return None
        return [np.ascontiguousarray(row, "<f4").tobytes() for row in x]

    def upsert(self, req: Any, name: str, code: str) -> None:
        if name not in MODELED or (code != "OK" and code not in AMBIGUOUS) or (req.vectors and req.float_vectors):
            return
        rows = self.stored_rows(name, req.vectors or f32(np.array(req.float_vectors, np.float32)), req.dim)
        if rows is None or len(rows) != len(req.ids):
            return
        with self.lock:
            for i, row in zip(req.ids, rows):
                self.possible[name][int(i)].add(row)
                if code == "OK":
                    self.acked[name].add(int(i))

    def delete(self, req: Any) -> None:
        if req.collection in MODELED:
            with self.lock:
                self.deleted[req.collection].update(int(i) for i in req.ids)


def protected_write(method: str, req: Any) -> bool:
    """Would this (parsed) request write or drop what the checks rely on, behind their back?"""
    if req is None:
        return False
    if method == "DropCollection":
        return req.name in PROTECTED
    if method in ("Upsert", "Delete", "UpsertStream"):
        return req.collection == SENTINEL
    return False


class Run:
    def __init__(self, args: argparse.Namespace, root: str):
        import grpc

        from vindex.service import vindex_pb2 as pb

        self.grpc, self.pb, self.args = grpc, pb, args
        extra = []
        self.grants = None   # with --tenants: the fuzzing tenant's grants
        if args.tenants:
            from vindex.service.grants import Grants

            self.grants = Grants.parse(GRANTS)
            path = os.path.join(root, "tenants.json")
            with open(path, "w") as f:
                json.dump({"tenants": [
                    {"name": "admin", "api_keys": [KEYS["admin"]], "classes": ["interactive", "update", "admin"]},
                    {"name": "fuzzer", "api_keys": [KEYS["fuzzer"]], "classes": ["interactive", "update", "admin"],
                     "collections": GRANTS}]}, f)
            extra = ["--tenants", path]
        self.server = ServerProc(os.path.join(root, "data"), os.path.join(root, "server.log"), extra)
        self.grant_checks = 0
        self.grant_violations: list[dict] = []
        self.channel_lock = threading.Lock()
        self.channel = None
        self.tracker = Tracker()
        self.counts: collections.Counter = collections.Counter()
        self.by_method: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.latency: list[float] = []
        self.crashes: list[dict] = []
        self.hangs: list[dict] = []
        self.bad: list[dict] = []          # UNKNOWN / INTERNAL / undocumented statuses
        self.undecodable_not_invalid: list[dict] = []
        self.skipped = 0
        self.lock = threading.Lock()
        self.generation = 0
        methods = pb.DESCRIPTOR.services_by_name["VectorIndex"].methods
        self.request_types = {m.name: getattr(pb, m.input_type.name) for m in methods}

    def connect(self) -> None:
        opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        old = self.channel
        self.channel = self.grpc.insecure_channel(self.server.target, options=opts)
        if old is not None:
            old.close()

    def start(self) -> None:
        self.server.start()
        self.connect()

    def metadata(self, who: str) -> tuple[tuple[str, str], ...]:
        """The API key of ``who`` ("admin": set-up and checks; "fuzzer": fuzzed calls), if any."""
        return (("x-api-key", KEYS[who]),) if self.grants is not None else ()

    def unary(self, method: str, payload: bytes, timeout: float | None = None, who: str = "admin"
              ) -> tuple[str, bytes | None, str]:
        call = self.channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=None, response_deserializer=None)
        try:
            return "OK", call(payload, timeout=timeout or self.args.timeout, metadata=self.metadata(who)), ""
        except self.grpc.RpcError as e:
            return e.code().name, None, e.details() or ""

    # --- set-up and checks ---------------------------------------------------------------------
    def setup(self) -> None:
        pb = self.pb
        rng = np.random.default_rng(12345)
        self.sentinel = rng.standard_normal((1000, 16)).astype(np.float32)
        for name, (dim, metric) in [(SENTINEL, (16, "l2")), *MODELED.items()]:
            req = pb.CreateCollectionRequest(name=name, dim=dim, metric=metric,
                                             config_json=json.dumps({"posting_limit_bytes": 2048}))
            self._must("CreateCollection", req)
        self._must("Upsert", pb.UpsertRequest(collection=SENTINEL, ids=list(range(1000)), vectors=f32(self.sentinel),
                                              dim=16))
        for name, (dim, _) in MODELED.items():
            ids = np.concatenate([ANCHORS, np.arange(*G_IDS, 7)])
            req = pb.UpsertRequest(collection=name, ids=ids.tolist(), vectors=f32(g_rows(ids, dim)), dim=dim)
            self._must("Upsert", req)
            self.tracker.upsert(req, name, "OK")
        if self.grants is not None:  # the fuzz names it; only PERMISSION_DENIED may come back
            self._must("CreateCollection", pb.CreateCollectionRequest(name=FORBIDDEN, dim=16))
            self._must("Upsert", pb.UpsertRequest(collection=FORBIDDEN, ids=list(range(1000)),
                                                  vectors=f32(self.sentinel), dim=16))

    def _must(self, method: str, req: Any) -> bytes:
        code, res, details = self.unary(method, req.SerializeToString())
        if code != "OK":
            raise RuntimeError(f"set-up {method} failed: {code} {details}")
        return res

    def health(self) -> dict:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self.channel)
        out = {}
        for service in ("", SERVICE):
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
                out[service or "overall"] = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            except self.grpc.RpcError as e:
                out[service or "overall"] = e.code().name
        return out

    def check_data(self) -> dict:
        """The sentinel's exact bytes and count; every modeled collection against the tracker."""
        pb = self.pb
        out: dict[str, Any] = {}
        res = pb.GetResponse.FromString(self._must("Get", pb.GetRequest(collection=SENTINEL, ids=list(range(1000)))))
        count = pb.CollectionInfo.FromString(self._must("DescribeCollection",
                                                        pb.DescribeCollectionRequest(name=SENTINEL))).count
        out[SENTINEL] = {"count": int(count), "all_found": all(res.found),
                         "bytes_identical": res.vectors == f32(self.sentinel)}
        out[SENTINEL]["ok"] = out[SENTINEL]["all_found"] and out[SENTINEL]["bytes_identical"] and count == 1000
        if self.grants is not None:  # written at set-up with the sentinel's vectors, then only denied
            code, raw, details = self.unary("Get", pb.GetRequest(collection=FORBIDDEN,
                                                                 ids=list(range(1000))).SerializeToString())
            res = pb.GetResponse.FromString(raw) if code == "OK" else pb.GetResponse()
            out[FORBIDDEN] = {"count": sum(res.found), "ok": code == "OK" and res.vectors == f32(self.sentinel),
                              "get": f"{code} {details}".strip()}
        for name, (dim, _) in MODELED.items():
            possible = self.tracker.possible[name]
            ids = sorted(possible)
            found_n, wrong, lost, failed = 0, [], [], {}
            for lo in range(0, len(ids), LIMITS["max_rows"]):
                chunk = ids[lo:lo + LIMITS["max_rows"]]
                code, raw, details = self.unary("Get", pb.GetRequest(collection=name, ids=chunk).SerializeToString())
                if code != "OK":  # find the ids that fail, one by one
                    rows = []
                    for i in chunk:
                        c, r, d = self.unary("Get", pb.GetRequest(collection=name, ids=[i]).SerializeToString())
                        if c != "OK":
                            failed[i] = f"{c}: {d}"
                            r = pb.GetResponse(vectors=bytes(4 * dim), dim=dim, found=[False]).SerializeToString()
                        rows.append(pb.GetResponse.FromString(r))
                    res = pb.GetResponse(vectors=b"".join(r.vectors for r in rows), dim=dim,
                                         found=[r.found[0] for r in rows])
                else:
                    res = pb.GetResponse.FromString(raw)
                x = np.frombuffer(res.vectors, "<f4").reshape(-1, dim)
                for i, f, row in zip(chunk, res.found, x):
                    if f:
                        found_n += 1
                        if row.tobytes() not in possible[i]:
                            wrong.append(i)
                    elif i in self.tracker.acked[name] and i not in self.tracker.deleted[name]:
                        lost.append(i)
            count = pb.CollectionInfo.FromString(self._must("DescribeCollection",
                                                            pb.DescribeCollectionRequest(name=name))).count
            out[name] = {"ids_tracked": len(ids), "found": found_n, "count": int(count),
                         "must_be_present": len(self.tracker.acked[name] - self.tracker.deleted[name]),
                         "wrong_bytes": len(wrong), "lost": len(lost), "wrong_examples": wrong[:10],
                         "lost_examples": lost[:10], "get_failed": len(failed),
                         "get_failed_examples": {str(i): d for i, d in list(failed.items())[:10]}}
            out[name]["ok"] = not wrong and not lost and not failed and count == found_n
        return out

    # --- the fuzzing ----------------------------------------------------------------------------
    def record(self, method: str, kind: str, code: str, details: str, secs: float, what: str) -> None:
        with self.lock:
            self.counts[code] += 1
            self.by_method[method][code] += 1
            self.by_kind[kind][code] += 1
            self.latency.append(secs)
            if code == "DEADLINE_EXCEEDED":
                self.hangs.append({"method": method, "kind": kind, "seconds": round(secs, 2), "request": what})
            elif code not in DOCUMENTED and not (code == "PERMISSION_DENIED" and self.grants is not None):
                self.bad.append({"method": method, "kind": kind, "code": code, "details": details[:300],
                                 "request": what, "cause": f"{method} {code}: {details[:80]}"})

    def describe(self, method: str, payload: Any) -> str:
        if isinstance(payload, list):
            return f"{len(payload)} chunks: " + "; ".join(self.describe("Upsert", c)[:150] for c in payload[:3])
        req = self.parse(method, payload)
        if len(payload) > 1 << 20:
            return f"{len(payload)} bytes"
        text = str(req).replace("\n", " ") if req is not None else f"undecodable {payload[:80]!r}"
        return text[:300]

    def parse(self, method: str, payload: bytes) -> Any:
        """The request as the server will read it; None if it does not parse."""
        try:
            return self.request_types[method].FromString(payload)
        except Exception:
            return None

    def one(self, method: str, payload: Any, kind: str) -> None:
        stream = method == "UpsertStream"
        parsed = [self.parse("Upsert", c) for c in payload] if stream else self.parse(method, payload)
        if any(protected_write(method, p) for p in (parsed if stream else [parsed])):
            with self.lock:
                self.skipped += 1
            return
        generation = self.generation
        t0 = time.perf_counter()
        if stream:
            code, details, acks = self.stream(payload)
        else:
            code, res, details = self.unary(method, payload, who="fuzzer")
        secs = time.perf_counter() - t0
        if code == "UNAVAILABLE" and not self.server.alive():
            self.crashed(generation, method, kind, details, self.describe(method, payload))
            return
        self.record(method, kind, code, details, secs, self.describe(method, payload) if code not in DOCUMENTED else "")
        if not stream and parsed is None and kind != "oversized" and code != "INVALID_ARGUMENT":
            with self.lock:
                self.undecodable_not_invalid.append({"method": method, "code": code, "request": self.describe(method, payload)})
        if self.grants is not None and kind != "oversized":
            self.check_grants(method, parsed, code, details, acks if stream else res)
        # what may have been written to the modeled collections
        if stream:
            name = ""
            for i, req in enumerate(parsed):
                if i > acks or req is None:
                    break
                name = req.collection or name
                self.tracker.upsert(req, name, "OK" if i < acks else code)
        elif method == "Upsert" and parsed is not None:
            self.tracker.upsert(parsed, parsed.collection, code)
        elif method == "Delete" and parsed is not None:
            self.tracker.delete(parsed)

    def check_grants(self, method: str, parsed: Any, code: str, details: str, answer: Any) -> None:
        """With --tenants: a call (or stream message) naming a valid collection name outside
        the grants is PERMISSION_DENIED, one inside them is not, and ListCollections shows
        only granted collections. ``answer``: the stream's acknowledgement count, or the
        unary response's bytes."""
        from vindex.service.collections import NAME_RE
        from vindex.service.grants import collection_named

        def forbidden(name: str | None) -> bool:
            return bool(name) and NAME_RE.fullmatch(name) is not None and not self.grants.allows(name)

        problem = None
        if method == "UpsertStream":
            name, first = "", None
            for i, req in enumerate(parsed):
                name = (req.collection if req is not None else "") or name
                if forbidden(name):
                    first = i
                    break
            if first is not None and (answer > first or (answer == first and code != "PERMISSION_DENIED")):
                problem = f"stream message {first} names {name!r}: {answer} acks, then {code}"
        elif method == "ListCollections" and code == "OK":
            shown = [c.name for c in self.pb.ListCollectionsResponse.FromString(answer).collections]
            if any(forbidden(n) for n in shown):
                problem = f"ListCollections shows {shown}"
        elif parsed is not None:
            name = collection_named(method, parsed)
            if forbidden(name) != (code == "PERMISSION_DENIED"):
                problem = f"{method} naming {name!r} answered {code}"
        with self.lock:
            self.grant_checks += 1
            if problem is not None:
                self.grant_violations.append({"method": method, "problem": problem, "details": details[:200]})

    def stream(self, chunks: list[bytes]) -> tuple[str, str, int]:
        call = self.channel.stream_stream(f"/{SERVICE}/UpsertStream", request_serializer=None,
                                          response_deserializer=None)
        acks = 0
        try:
            for _ in call(iter(chunks), timeout=self.args.timeout, metadata=self.metadata("fuzzer")):
                acks += 1
            return "OK", "", acks
        except self.grpc.RpcError as e:
            return e.code().name, e.details() or "", acks

    def crashed(self, generation: int, method: str, kind: str, details: str, what: str) -> None:
        with self.channel_lock:
            if generation != self.generation:
                return  # another thread restarted it already
            rc = self.server.proc.poll()
            self.crashes.append({"method": method, "kind": kind, "exit_code": rc, "request": what,
                                 "log_tail": self.server.log()[-2000:]})
            print(f"  server died (exit {rc}) after {method} {kind}; restarting", file=sys.stderr, flush=True)
            self.start()
            self.generation += 1

    def fuzz(self, n: int) -> float:
        gen = Gen(self.args.seed, forbidden=self.grants is not None)
        requests = (gen.next() for _ in range(n))
        t0 = time.perf_counter()
        done = 0
        with ThreadPoolExecutor(self.args.concurrency) as pool:
            window = []
            for method, payload, kind in requests:
                window.append(pool.submit(self.one, method, payload, kind))
                if len(window) >= 4 * self.args.concurrency:
                    for f in window:
                        f.result()
                        done += 1
                        if done % 1000 == 0:
                            print(f"  {done} requests, {dict(self.counts)}", file=sys.stderr, flush=True)
                    window = []
            for f in window:
                f.result()
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=4, help="client threads sending at once")
    ap.add_argument("--timeout", type=float, default=30.0, help="deadline of every call; past it: a hang")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--keep", action="store_true", help="keep the data directory and server log")
    ap.add_argument("--mode", default="fuzz", choices=["fuzz", "idle-streams", "slow-client"])
    ap.add_argument("--streams", type=int, default=300, help="hostile streams (modes other than fuzz)")
    ap.add_argument("--idle-timeout", type=float, default=5.0, help="the server's --stream-idle-timeout")
    ap.add_argument("--max-client-rpcs", type=int, default=0, help="the server's cap per client (0: its default)")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds slow clients keep sending")
    ap.add_argument("--tenants", action="store_true",
                    help="serve with a tenants file and fuzz as a tenant granted only some collections")
    args = ap.parse_args(argv)
    if args.mode != "fuzz":
        return hostile_clients(args)

    root = tempfile.mkdtemp(prefix="vindex-fuzz-")
    run = Run(args, root)
    result: dict[str, Any] = {"meta": {
        "requests": args.requests, "concurrency": args.concurrency, "timeout_s": args.timeout, "seed": args.seed,
        "limits": LIMITS, "cores": os.cpu_count(), "tenants": args.tenants,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"), "modeled": {k: list(v) for k, v in MODELED.items()}}}
    try:
        t0 = time.perf_counter()
        run.start()
        result["meta"]["server_start_s"] = round(time.perf_counter() - t0, 1)
        run.setup()
        print(f"server on {run.server.target}; fuzzing with {args.requests} requests "
              f"({args.concurrency} threads) ...", file=sys.stderr, flush=True)
        secs = run.fuzz(args.requests)
        lat = np.asarray(run.latency) * 1e3 if run.latency else np.zeros(1)
        result["fuzz"] = {
            "seconds": round(secs, 1), "requests_sent": int(sum(run.counts.values())) + len(run.crashes),
            "skipped_protected": run.skipped,
            "by_status": dict(run.counts.most_common()),
            "by_method": {m: dict(c.most_common()) for m, c in sorted(run.by_method.items())},
            "by_kind": {k: dict(c.most_common()) for k, c in sorted(run.by_kind.items())},
            "latency_ms": {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                           "max": float(lat.max())},
            "crashes": len(run.crashes), "crash_details": run.crashes[:10],
            "hangs": len(run.hangs), "hang_details": run.hangs[:10],
            "unknown_or_internal": sum(1 for b in run.bad if b["code"] in ("UNKNOWN", "INTERNAL")),
            "undocumented_statuses": len(run.bad),
            "undocumented_by_cause": dict(collections.Counter(b["cause"] for b in run.bad).most_common()),
            "undocumented_examples": _distinct(run.bad, 20),
            "undecodable_not_invalid_argument": len(run.undecodable_not_invalid),
            "undecodable_examples": run.undecodable_not_invalid[:10],
        }
        if run.grants is not None:
            result["fuzz"]["grants"] = {"granted": GRANTS, "checked": run.grant_checks,
                                        "violations": len(run.grant_violations),
                                        "violation_examples": run.grant_violations[:10]}
        result["after"] = {"server_alive": run.server.alive(), "health": run.health(), "data": run.check_data()}
        log = run.server.log()
        result["after"]["log_tracebacks"] = log.count("Traceback")
        result["after"]["log_internal_errors"] = log.count("internal error")
        rc, clean = run.server.stop()
        result["after"]["stop_exit_code"], result["after"]["stop_clean"] = rc, clean
        run.start()  # the same data after a restart
        result["after_restart"] = {"health": run.health(), "data": run.check_data()}
        rc, clean = run.server.stop()
        result["after_restart"]["stop_exit_code"] = rc
    finally:
        if run.server.alive():
            run.server.proc.kill()
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)

    f, a, r = result["fuzz"], result["after"], result["after_restart"]
    data_ok = all(v["ok"] for v in a["data"].values()) and all(v["ok"] for v in r["data"].values())
    result["verdict"] = {
        "no_crash": f["crashes"] == 0, "no_hang": f["hangs"] == 0, "no_unknown_or_internal": f["unknown_or_internal"] == 0,
        "only_documented_statuses": f["undocumented_statuses"] == 0,
        "serving_after": set(a["health"].values()) == {"SERVING"}, "data_intact": data_ok,
        "clean_stop": a["stop_exit_code"] == 0 and a["stop_clean"],
    }
    if args.tenants:
        result["verdict"]["grants_held"] = f["grants"]["violations"] == 0
    name = "fuzz-tenants" if args.tenants else "fuzz"
    path = os.path.join(args.out, f"{name}.json")
    report.write_json(path, result)
    print(summary(result))
    print(f"wrote {path}")
    return 0 if all(result["verdict"].values()) else 1


def hostile_clients(args: argparse.Namespace) -> int:
    """``--mode idle-streams`` or ``slow-client``: see the module docstring."""
    from . import fuzz_admission

    root = tempfile.mkdtemp(prefix=f"vindex-fuzz-{args.mode}-")
    server = ServerProc(os.path.join(root, "data"), os.path.join(root, "server.log"),
                        fuzz_admission.server_args(args))
    try:
        server.start()
        result = fuzz_admission.run_mode(args.mode, int(server.target.rpartition(":")[2]), args)
        rc, clean = server.stop()
        result["verdict"]["clean_stop"] = rc == 0 and clean
        result["verdict"]["no_traceback"] = "Traceback" not in server.log()
    finally:
        if server.alive():
            server.proc.kill()
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    path = os.path.join(args.out, f"fuzz-{args.mode}.json")
    report.write_json(path, result)
    print(fuzz_admission.summary(result))
    print(f"wrote {path}")
    return 0 if all(result["verdict"].values()) else 1


def _distinct(items: list[dict], n: int) -> list[dict]:
    seen, out = set(), []
    for it in items:
        key = (it["method"], it["code"], it["details"][:80])
        if key not in seen:
            seen.add(key)
            out.append(it)
        if len(out) >= n:
            break
    return out


def summary(result: dict) -> str:
    f, a = result["fuzz"], result["after"]
    lines = [f"{f['requests_sent']} fuzzed requests in {f['seconds']} s "
             f"({result['meta']['concurrency']} threads, seed {result['meta']['seed']}):"]
    lines += [f"  {code:<22} {n:>6}" for code, n in f["by_status"].items()]
    lines.append(f"  crashes {f['crashes']}, hangs {f['hangs']}, UNKNOWN/INTERNAL {f['unknown_or_internal']}, "
                 f"undecodable not INVALID_ARGUMENT {f['undecodable_not_invalid_argument']}, "
                 f"skipped (would touch the sentinel) {f['skipped_protected']}")
    for cause, n in f["undocumented_by_cause"].items():
        lines.append(f"    {n} x {cause}")
    data = a["data"]
    lines.append(f"  after: alive {a['server_alive']}, health {a['health']}, sentinel "
                 f"{'intact' if data[SENTINEL]['ok'] else 'CHANGED'} ({data[SENTINEL]['count']} vectors), "
                 + ", ".join(f"{n} {'ok' if data[n]['ok'] else 'WRONG'} ({data[n]['count']})" for n in MODELED))
    lines.append(f"  stop exit {a['stop_exit_code']} (clean: {a['stop_clean']}); after restart: "
                 + ", ".join(f"{n} {'ok' if v['ok'] else 'WRONG'}" for n, v in result["after_restart"]["data"].items()))
    lines.append("  verdict: " + ", ".join(f"{k}={v}" for k, v in result["verdict"].items()))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
