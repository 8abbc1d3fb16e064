"""Index configuration: one frozen dataclass, every parameter documented once.

Structural parameters are fixed when an index is built or created and saved with it.
Runtime parameters (marked below) may be changed when an index is reopened. Search
parameters given per call override the defaults here for that call only.
See ``docs/params.md`` for ranges and costs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from .errors import InvalidConfigError

METRICS = ("l2", "ip", "cosine")
STORES = ("rocksdb", "blocks", "memory")
DURABILITY = ("process", "fsync")
IO_SCHEDULERS = ("sla", "fifo")

#: A search of at most this many queries is a small (interactive) one: a caller waits on its
#: latency, so its p99 is what ``interactive_p99_ms`` targets (the pacers' samples, the
#: searches writers yield to), the server coalesces such requests into one batch, and it is
#: short enough to run its kernels holding the GIL (a release costs a hand-off that, beside a
#: thread running Python, can take a whole switch interval: more than such a search spends in
#: the kernels).
SMALL_SEARCH_QUERIES = 16
#: Default candidates reranked exactly per result asked for (``IndexConfig.rerank``).
RERANK_FACTOR = 8
#: With ``recall_target`` and no ``max_postings`` given, a query's candidate postings are this
#: many times ``IndexConfig.max_postings`` (the estimate stops most queries long before).
APS_CANDIDATES = 2
#: Most threads one search may use (``search(..., threads=)``, ``search_threads``).
MAX_SEARCH_THREADS = 256

#: Fields that may differ between the process that built an index and one that reopens it.
RUNTIME_FIELDS = frozenset({"cache_bytes", "build_threads", "rebalance", "rebalance_batch",
                            "checkpoint_every", "scrub_ratio", "durability",
                            "io_scheduler", "interactive_p99_ms", "read_p99_ms",
                            "exact_search_max_heads", "max_metadata_bytes", "max_document_bytes",
                            "filter_exact_factor", "filter_gather_ratio", "filter_cache_bytes", "filter_widen",
                            "search_threads", "recall_target", "resident_bytes", "resident_codes_bytes", "rerank",
                            "recall_monitor_cpu", "recall_alert", "recall_k"})


@dataclass(frozen=True)
class IndexConfig:
    """Every tunable of a vindex index."""

    # --- postings -------------------------------------------------------------------------
    posting_limit_bytes: int = 48 * 1024
    """Byte budget of one posting list (records are ``4 * (dim + 2)`` bytes). Turned into a
    vector count per dimension; a bulk build never writes a posting above it."""
    build_fill: float = 0.5
    """Target mean posting size after a bulk build, as a fraction of the budget. Sets the
    number of heads: smaller means more heads (more memory, finer partitions)."""

    # --- replicas (SPANN closure assignment with the RNG rule) -----------------------------
    max_replicas: int = 8
    """At most this many postings hold a copy of one vector."""
    replica_candidates: int = 64
    """Nearest heads examined when choosing a vector's postings."""
    replica_eps: float = 0.5
    """A head is a replica candidate only while ``D(x,c) <= (1+eps) * D(x,c_1)``."""
    rng_factor: float = 1.0
    """RNG rule: accept head c only if ``rng_factor * D(c, c') > D(x, c)`` for each accepted c'."""
    insert_candidates: int = 16
    """Nearest heads examined when an insert or a reassignment chooses postings (a bulk build
    examines ``replica_candidates``); fewer is faster, and the RNG rule rarely reaches past
    the first few, so 16 costs no recall on the churn benchmark (docs/params.md)."""

    insert_ef: int = 24
    """Beam width of an upsert's search for its ``insert_candidates`` (from the shared entry
    points): wider finds the nearest head a little more often and costs time (docs/params.md).
    A reassignment starts at the posting the vector sits in and uses a beam as wide as its
    candidates."""

    new_head_factor: float = 2.0
    """An insert farther from its nearest head than this many times that head's radius (the
    mean squared distance of its vectors when it was made) lies outside every posting; a batch
    with enough such vectors gets new heads for them at once. 0 disables."""

    # --- rebalancing (SPFresh LIRE) -----------------------------------------------------------
    rebalance: bool = True
    """Split, merge, reassign and garbage-collect postings in the background. Off: appends only."""
    merge_fraction: float = 0.4
    """A posting with fewer live vectors than this fraction of the budget is merged away.
    0.4 leaves a churned index with about as many heads as a fresh build of its live set, so
    a fixed ``max_postings`` scans as many vectors (docs/params.md)."""
    gc_fraction: float = 0.1
    """A posting is rewritten without garbage once this fraction of it is known dead. The
    rewrite is also when a shrinking posting is found small enough to merge, so under deletes
    this keeps postings as full as a fresh build's (higher values leave them emptier: more
    garbage, fewer live vectors, less recall at a fixed ``max_postings``)."""
    reassign_neighbors: int = 64
    """Postings around a split whose vectors are checked for reassignment."""
    scrub_ratio: float = 1.0
    """Stored vectors re-checked in the background per vector written: each is moved if its
    posting is no longer among the ones the RNG rule picks (0: only SPFresh's reassignment
    around splits). A record whose posting's graph neighbourhood vouches for it costs a read
    and ~35 distances; about 1 in 6 gets replica selection again. More closes more of the
    recall gap to a fresh build and costs drain time in proportion (docs/params.md)."""
    split_balance: float = 1.0
    """Size penalty of the balanced k-means that splits a posting (0: plain k-means)."""
    rebalance_batch: int = 256
    """Postings handled per background round."""
    checkpoint_every: int = 200_000
    """Vectors written (upserts, deletes, reassignments) between automatic checkpoints."""

    # --- head graph ------------------------------------------------------------------------
    graph_degree: int = 32
    """Out-degree bound of the head graph."""
    graph_build_ef: int = 128
    """Beam width when inserting a head into the graph."""
    graph_alpha: float = 1.2
    """DiskANN pruning factor; > 1 keeps longer edges for faster navigation."""
    graph_entries: int = 256
    """Entry points (a sample of heads) every head search starts from."""
    exact_search_max_heads: int = 4096
    """(runtime) Up to this many heads, a search scores every head (one BLAS product for a
    batch) instead of walking the graph: exact, and cheaper below a few thousand heads.
    A search of up to 8 queries scores every head only up to 512 heads (it has no BLAS
    product to amortise). 0 always walks the graph."""

    # --- clustering ------------------------------------------------------------------------
    kmeans_iters: int = 12
    """k-means iterations at each level of the hierarchical clustering."""
    kmeans_max_points_per_centroid: int = 128
    """Training sample bound for the top level, as in faiss."""
    seed: int = 0
    """Seed of every random choice in a build; equal inputs give equal indexes."""
    build_threads: int = 0
    """(runtime) Threads for a bulk build; 0 means all cores."""

    # --- search defaults (each overridable per call) -----------------------------------------
    max_postings: int = 64
    """Postings a query may visit."""
    search_eps: float = 10.0
    """Query-aware pruning: visit head j only if ``D(q,c_j) <= (1+eps) * D(q,c_1)``."""
    search_ef: int = 0
    """Beam width of the head-graph search; 0 means ``max(max_postings, 32)`` (a wider beam
    finds slightly better heads at more graph cost)."""
    recall_target: float | None = None
    """(runtime) Default of ``search(recall_target=)``: each query reads its candidate postings
    nearest first until its estimated recall@k reaches this (docs/search-path.md). None: every
    query reads its ``max_postings`` nearest postings."""
    search_threads: int = 1
    """(runtime) Threads a batch's search uses: its queries are cut into as many pieces (of
    over ``SMALL_SEARCH_QUERIES`` queries each) searched in parallel. ``search(threads=)``
    overrides it per call."""

    # --- metadata, documents and filters ------------------------------------------------------
    max_metadata_bytes: int = 64 * 1024
    """(runtime) Largest metadata of one record, as compact JSON (``PayloadTooLargeError`` over it)."""
    max_document_bytes: int = 1024 * 1024
    """(runtime) Largest document of one record, in UTF-8 bytes."""
    filter_exact_factor: float = 4.0
    """(runtime) A filtered search scans every posting that holds a matching record (an exact
    answer) when there are at most ``filter_exact_factor * max_postings`` of them."""
    filter_gather_ratio: float = 2.0
    """(runtime) A filtered search scores just the matching records' vectors (read once per
    filter and write, then kept with the filter's plan: the exact answer) when they are at
    most ``filter_gather_ratio`` times the rows the posting scan would score (the heads it
    ranks plus its postings' records); measured crossover in docs/filters.md."""
    filter_cache_bytes: int = 64 << 20
    """(runtime) Memory for the plans of recent filters (their masks and gathered vectors),
    kept until the next write; the least recently used go first."""
    filter_widen: float = 8.0
    """(runtime) Otherwise it scans the postings nearest the query among those that hold
    matches: ``max_postings / selectivity`` of them, at most ``filter_widen * max_postings``."""

    # --- live recall monitor (vindex.recall_monitor) ---------------------------------------
    recall_monitor_cpu: float = 0.01
    """(runtime) Share of one core the background recall monitor may keep busy (0 turns the
    background off; ``Index.check_recall`` still runs a pass when called)."""
    recall_alert: float = 0.8
    """(runtime) A recall estimate under this logs a warning (once until it recovers)."""
    recall_k: int = 10
    """(runtime) The k of the recall@k the monitor estimates."""

    # --- storage ---------------------------------------------------------------------------
    store: str = "rocksdb"
    """Posting store: ``rocksdb`` (embedded, the default), ``blocks`` (one file of 4 KiB
    blocks read with O_DIRECT, for NVMe) or ``memory`` (tests; not persisted)."""
    cache_bytes: int = 512 * 1024 * 1024
    """(runtime) RocksDB block cache size. The RocksDB store also keeps what it read of
    postings in memory, up to a quarter of this more: whole postings until they outgrow
    that (a posting read again then costs no RocksDB read), then what follows each
    posting's first chunk (a read fetches the first chunk and those appended since). 0
    keeps nothing and leaves the block cache at its 1 MiB floor."""
    resident_bytes: int = -1
    """(runtime) Bound on the memory for postings kept resident as searches read them (RocksDB
    store): a small search scans those where they lie and reads only the others from the
    store. -1: a quarter of ``cache_bytes``; 0: none kept."""
    resident_codes_bytes: int = -1
    """(runtime) Bound on the memory for int8 codes of postings (RocksDB store; built at open
    from every posting, kept through every write): a small search scans the codes of
    postings not kept as float32 and reranks its best ``rerank`` candidates exactly from
    the vector file; a one-query search of 128 dimensions or more scans the kept ones as
    codes first too, reranking from the kept rows. -1: half of ``cache_bytes``; 0: no codes
    (and no vector file)."""
    rerank: int = -1
    """(runtime) Candidates per query a search scores exactly after scanning codes (at least
    ``k``; 0: no codes). -1: ``RERANK_FACTOR`` times ``k``."""
    io_scheduler: str = "sla"
    """(runtime) ``sla``: storage reads queue per I/O class (searches first, earliest deadline
    first); background rebalancing and foreground writes yield to searches, their shares of
    time shrinking while the p99 of small searches misses ``interactive_p99_ms`` (docs/sla.md).
    ``fifo``: one shared queue, no pacing (for comparison)."""
    interactive_p99_ms: float = 5.0
    """(runtime) The search latency target (p99 of whole searches of up to
    ``SMALL_SEARCH_QUERIES`` queries) background work and writes are paced to; a commit waits
    at most this long for running searches."""
    read_p99_ms: float = 2.0
    """(runtime) The latency target of one interactive storage read (p99 from queued to done:
    a multi-get, or a search's block reads), a part of a search's time. The store's I/O
    scheduler paces its background reads to it, and a disk request of another class waits at
    most this long for running interactive reads to end: one still running then has missed
    its target anyway, and longer waits would only cost the writer. The default is about twice
    a one-query search's read p99 on a cloud VM's SSD with nothing else running."""
    durability: str = "process"
    """(runtime) When a write is acknowledged. ``process``: it is in the store's write-ahead
    log, so it survives the process being killed (not a power loss). ``fsync``: the log is
    also fsynced; concurrent writers share one fsync (group commit)."""

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, expected: str) -> None:
            if not cond:
                raise InvalidConfigError(
                    f"config {name}: expected {expected}, got {getattr(self, name)!r}")

        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidConfigError(f"config {f.name}: expected an integer, got {value!r}")
            if f.type == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InvalidConfigError(f"config {f.name}: expected a number, got {value!r}")
            if f.type == "bool" and not isinstance(value, bool):
                raise InvalidConfigError(f"config {f.name}: expected True or False, got {value!r}")
        need(1024 <= self.posting_limit_bytes <= 1 << 30, "posting_limit_bytes", "1024..2^30")
        need(0.05 <= self.build_fill <= 1.0, "build_fill", "a fraction in [0.05, 1]")
        need(1 <= self.max_replicas <= 8, "max_replicas", "1..8")
        need(1 <= self.replica_candidates <= 1024, "replica_candidates", "1..1024")
        need(self.replica_eps >= 0, "replica_eps", ">= 0")
        need(self.rng_factor > 0, "rng_factor", "> 0")
        need(1 <= self.insert_candidates <= 1024, "insert_candidates", "1..1024")
        need(1 <= self.insert_ef <= 4096, "insert_ef", "1..4096")
        need(isinstance(self.rebalance, bool), "rebalance", "True or False")
        need(self.new_head_factor >= 0, "new_head_factor", ">= 0")
        need(0 <= self.merge_fraction < 0.5, "merge_fraction", "in [0, 0.5)")
        need(0 < self.gc_fraction <= 1, "gc_fraction", "in (0, 1]")
        need(0 <= self.reassign_neighbors <= 1024, "reassign_neighbors", "0..1024")
        need(self.split_balance >= 0, "split_balance", ">= 0")
        need(self.scrub_ratio >= 0, "scrub_ratio", ">= 0")
        need(1 <= self.rebalance_batch <= 65536, "rebalance_batch", "1..65536")
        need(1 <= self.checkpoint_every <= 1 << 62, "checkpoint_every", "1..2^62")
        need(4 <= self.graph_degree <= 256, "graph_degree", "4..256")
        need(self.graph_degree <= self.graph_build_ef <= 4096, "graph_build_ef", "graph_degree..4096")
        need(1.0 <= self.graph_alpha <= 10.0, "graph_alpha", "in [1, 10]")
        need(1 <= self.graph_entries <= 4096, "graph_entries", "1..4096")
        need(1 <= self.kmeans_iters <= 1000, "kmeans_iters", "1..1000")
        need(8 <= self.kmeans_max_points_per_centroid <= 1 << 20, "kmeans_max_points_per_centroid", "8..2^20")
        need(0 <= self.seed < 1 << 31, "seed", "0..2^31-1 (faiss takes a 32-bit seed)")
        need(0 <= self.build_threads <= 1024, "build_threads", "0..1024")
        need(1 <= self.max_postings <= 4096, "max_postings", "1..4096")
        need(self.search_eps >= 0, "search_eps", ">= 0")
        need(1 <= self.search_threads <= MAX_SEARCH_THREADS, "search_threads", f"1..{MAX_SEARCH_THREADS}")
        need(self.recall_target is None or (not isinstance(self.recall_target, bool)
                                            and isinstance(self.recall_target, (int, float))
                                            and 0 < self.recall_target < 1),
             "recall_target", "None or a number strictly between 0 and 1")
        need(self.search_ef == 0 or self.search_ef >= 1, "search_ef", "0 (auto) or >= 1")
        need(self.store in STORES, "store", f"one of {STORES}")
        need(0 <= self.cache_bytes <= 1 << 48, "cache_bytes", "0..2^48")
        need(-1 <= self.resident_bytes <= 1 << 48, "resident_bytes", "-1..2^48")
        need(-1 <= self.resident_codes_bytes <= 1 << 48, "resident_codes_bytes", "-1..2^48")
        need(-1 <= self.rerank <= 1 << 16, "rerank", "-1..65536")
        need(self.durability in DURABILITY, "durability", f"one of {DURABILITY}")
        need(self.io_scheduler in IO_SCHEDULERS, "io_scheduler", f"one of {IO_SCHEDULERS}")
        need(self.interactive_p99_ms > 0, "interactive_p99_ms", "> 0")
        need(self.read_p99_ms > 0, "read_p99_ms", "> 0")
        need(0 <= self.exact_search_max_heads <= 1 << 30, "exact_search_max_heads", "0..2^30")
        need(2 <= self.max_metadata_bytes <= 1 << 30, "max_metadata_bytes", "2..2^30")
        need(0 <= self.max_document_bytes <= 1 << 30, "max_document_bytes", "0..2^30")
        need(self.filter_exact_factor >= 0, "filter_exact_factor", ">= 0")
        need(self.filter_widen >= 1, "filter_widen", ">= 1")
        need(self.filter_gather_ratio >= 0, "filter_gather_ratio", ">= 0")
        need(0 <= self.filter_cache_bytes <= 1 << 48, "filter_cache_bytes", "0..2^48")
        need(0 <= self.recall_monitor_cpu <= 1, "recall_monitor_cpu", "a share of one core in [0, 1]")
        need(0 <= self.recall_alert <= 1, "recall_alert", "a recall in [0, 1]")
        need(1 <= self.recall_k <= 1024, "recall_k", "1..1024")

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> "IndexConfig":
        """Build a config from keyword arguments, naming any that are unknown."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise InvalidConfigError(
                f"unknown config parameter(s) {unknown}; expected some of {sorted(known)}")
        return cls(**kwargs)

    def replace(self, **changes: Any) -> "IndexConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "IndexConfig":
        # Ignore keys written by newer versions; fields added since use their defaults.
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def posting_limit(self, dim: int) -> int:
        """Posting budget in vectors for this dimension (at least 4)."""
        return max(4, self.posting_limit_bytes // record_bytes(dim))

    def resident_budget(self) -> int:
        """Bytes of postings the store may keep resident (``resident_bytes``)."""
        return self.cache_bytes // 4 if self.resident_bytes < 0 else self.resident_bytes

    def codes_budget(self) -> int:
        """Bytes of posting codes the store may keep resident (``resident_codes_bytes``)."""
        return self.cache_bytes // 2 if self.resident_codes_bytes < 0 else self.resident_codes_bytes

    def rerank_for(self, k: int) -> int:
        """Candidates reranked exactly per query of a ``k``-nearest search (``rerank``)."""
        return RERANK_FACTOR * k if self.rerank < 0 else max(self.rerank, k) if self.rerank else 0

    def ef_for(self, max_postings: int) -> int:
        return self.search_ef if self.search_ef > 0 else max(max_postings, 32)


def record_bytes(dim: int) -> int:
    """Bytes of one posting record: vid (u32), version (u32), ``dim`` float32."""
    return 4 * (dim + 2)


def check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise InvalidConfigError(f"metric: expected one of {METRICS}, got {metric!r}")
    return metric


