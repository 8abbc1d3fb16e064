"""vindex behind the same small interface as the peers in ``bench.peers``."""
from __future__ import annotations

import shutil
import tempfile

import numpy as np

import vindex

#: Postings per query swept by the benchmarks (eps and ef stay at their defaults).
MAX_POSTINGS = (2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


class Vindex:
    """Builds into ``path`` (a temporary directory by default) with the RocksDB store."""

    name = "vindex"

    def __init__(self, path: str | None = None, build_threads: int = 1, config: dict | None = None,
                 cache_bytes: int | None = None) -> None:
        self._tmp = None if path else tempfile.mkdtemp(prefix="vindex-bench-")
        self.path = path or f"{self._tmp}/index"
        self.build_threads = build_threads
        self.config = dict(config or {})
        self.cache_bytes = cache_bytes
        self.index: vindex.Index | None = None
        self.params: dict = {}
        self.build_stats: dict = {}

    def build(self, base: np.ndarray, metric: str) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        with vindex.Index.build(self.path, base, metric=metric, build_threads=self.build_threads,
                                progress=False, **self.config) as index:
            self.build_stats = index.stats()["build"]

    def reopen(self) -> None:
        """Open the built index for searching, with a block cache that holds all postings
        when ``cache_bytes`` is not given (the benchmark measures a warm cache)."""
        if self.index is not None:
            self.index.close()
        runtime = {}
        if self.cache_bytes is not None:
            runtime["cache_bytes"] = self.cache_bytes
        self.index = vindex.Index.open(self.path, **runtime)
        if self.cache_bytes is None:
            sst = self.index.stats()["store"].get("sst_bytes", 0)
            self.index.close()
            self.index = vindex.Index.open(self.path, cache_bytes=max(256 << 20, int(sst * 1.25)))

    def warm(self, queries: np.ndarray) -> None:
        """Touch every posting once so the block cache is warm."""
        self.index.search(queries, 10, max_postings=max(MAX_POSTINGS))

    def sweep(self) -> list[dict]:
        return [{"max_postings": m} for m in MAX_POSTINGS]

    def set_params(self, params: dict) -> None:
        self.params = dict(params)

    def search(self, queries: np.ndarray, k: int, threads: int = 1) -> np.ndarray:
        return self.index.search(queries, k, threads=threads, **self.params).ids

    def save(self, path: str) -> None:
        pass  # the index lives in self.path already

    def rss_code(self, search: bool = False) -> str:
        """Code that opens the index (and with ``search``, runs one query) in a fresh process."""
        code = f"import vindex\nindex = vindex.Index.open({self.path!r})\n"
        if search:
            code += "import numpy\nindex.search(numpy.ones(index.dim, numpy.float32), 10)\n"
        return code

    def close(self) -> None:
        if self.index is not None:
            self.index.close()
            self.index = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
