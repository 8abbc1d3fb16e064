"""Compact posting codes kept in memory, and the vector file their candidates are reranked from.

The RocksDB store keeps, beside the float32 postings it keeps (``kept``), an int8 code of
every posting it can fit in ``cap_bytes`` (``IndexConfig.resident_codes_bytes``): per record
its header and one byte per dimension (``native.codes``), 4.06x smaller than the record at
128 dimensions. The codes live in a ``KeptPostings`` ring of their own, under the same rules
as the float32 one: an entry names the posting's generation and span word as they were when
it was made, a reader checks both against the directory (the seqlock of
``RocksStore._dir_version`` around it) and pins the entries it reads.

The codes follow the postings: the store builds them at open from every posting (reading
the whole store once: ``RocksStore.build_codes``), and each commit codes what it writes
(a replaced posting anew, an append's records after the posting's codes, a dropped posting
forgotten). A posting whose codes were pushed out is coded again when a search reads it.

The exact rerank reads float32 vectors from the vector file: one row of ``dim`` float32 per
vid, written with ``pwrite`` when a record of a newer version than the row's passes through
the store (a rebalancing rewrite of a record already there writes nothing), and read with
``pread`` (about 0.2 us a row from the page cache, no RocksDB lookup, and none of it counted
in the process's resident memory). The file is a cache of the postings: it is rebuilt with
the codes at open, so a crash between a commit and its ``pwrite`` costs nothing.

The quantizer (per-dimension ``lo`` and ``scale``) is trained on the first records the
store codes: the build's postings, or at open the first postings read; values outside its
range are clipped (the rerank is exact) while clipping moves a record less than rounding
does (``native.codes.encode``); a posting holding a record moved further (the data drifted
past what the quantizer saw) is not coded, so a search scans it as float32: its codes would
all sit at the range's end, tie, and leave the true neighbours out of the rerank
(``stats()["codes_refused"]`` counts such postings).
"""
from __future__ import annotations

import os
import threading

import numpy as np

from vindex import native

from .kept import KeptPostings
from .records import view as record_view

#: Headroom on each side of the trained range (a fraction of it), for values the sample missed.
RANGE_MARGIN = 0.05
#: Records a quantizer is trained on at most.
TRAIN_RECORDS = 65536
#: Records a quantizer is trained on at least: fewer (a first upsert of a few rows) would fit
#: the range to them alone; postings written before are coded once a search reads them.
MIN_TRAIN_RECORDS = 1000
#: vids the vector file's version table grows by at least.
MIN_VIDS = 1024
#: Postings refused (a record past the range) since the quantizer was trained that make the
#: store train a wider one and code every posting again (``wants_retrain``): at least this
#: many, and at least ``RETRAIN_SHARE`` of the postings coded meanwhile. Data that drifts
#: past the range (a stream whose first records were one region) would otherwise leave ever
#: more postings uncoded.
RETRAIN_MIN_REFUSED = 64
RETRAIN_SHARE = 0.02


def code_words(dim: int) -> int:
    """uint32 words of one code record: the header's two and ``dim`` bytes, padded."""
    return 2 + (dim + 3) // 4


class VectorFile:
    """float32 vectors by vid in one file, with the version of each row held in memory."""

    def __init__(self, path: str, dim: int):
        self.path = path
        self.dim = dim
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.versions = np.full(MIN_VIDS, 0xFF, dtype=np.uint8)  # 0xFF: no row yet
        self.lock = threading.Lock()
        self.short_writes = 0

    def write(self, recs_u: np.ndarray, recs_f: np.ndarray) -> None:
        """Write the rows of the records whose vid's row is missing or older."""
        if not recs_u.shape[0]:
            return
        with self.lock:
            top = int(recs_u[:, 0].max())
            if top >= self.versions.shape[0]:
                grown = np.full(max(top + 1, 2 * self.versions.shape[0]), 0xFF, dtype=np.uint8)
                grown[:self.versions.shape[0]] = self.versions
                self.versions = grown
            rows = native.codes.newer_rows(recs_u, self.versions)
            if rows.shape[0]:
                self.short_writes += native.codes.write_vectors(self.fd, recs_u, recs_f, rows)

    @property
    def file_bytes(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PostingCodes:
    """int8 codes of postings in a ring of ``cap_bytes``, their quantizer, and the vector file."""

    def __init__(self, cap_bytes: int, dim: int, vectors: str | VectorFile):
        self.cap_bytes = cap_bytes
        self.dim = dim
        self.words = code_words(dim)
        self.ring = KeptPostings(cap_bytes, self.words * 4)
        self.ring_b = self.ring.rows.view(np.uint8)
        self.vectors = vectors if isinstance(vectors, VectorFile) else VectorFile(vectors, dim)
        self.lo: np.ndarray | None = None
        self.scale: np.ndarray | None = None
        self.inv_scale: np.ndarray | None = None
        self.code_reads = 0  # postings scanned as codes
        self.rerank_reads = 0  # vectors read for reranks
        self.build_seconds = 0.0  # the last ``RocksStore.build_codes``
        self.refused = 0  # postings not coded: a record outside the quantizer's range
        self.retrains = 0  # quantizers trained again (``successor``)
        self._coded_since = 0  # postings coded, and refused, since the quantizer was trained
        self._refused_since = 0
        self._seen: tuple[np.ndarray, np.ndarray] | None = None  # the range of the refused records

    @property
    def ready(self) -> bool:
        return self.lo is not None and self.ring.capacity > 0

    def train(self, recs_f: np.ndarray) -> None:
        """Fit the per-dimension range to (a sample of) float32 records ``(n, dim + 2)``."""
        if self.lo is not None or recs_f.shape[0] < MIN_TRAIN_RECORDS:
            return
        step = max(1, recs_f.shape[0] // TRAIN_RECORDS)
        x = recs_f[::step, 2:]
        self._fit(x.min(axis=0), x.max(axis=0))

    def _fit(self, lo: np.ndarray, hi: np.ndarray) -> None:
        pad = (hi - lo) * RANGE_MARGIN
        lo, hi = lo - pad, hi + pad
        scale = np.maximum((hi - lo) / 255.0, 1e-12).astype(np.float32)
        self.scale, self.inv_scale, self.lo = scale, (1.0 / scale).astype(np.float32), lo.astype(np.float32)
        # how far a coded record lies from its vector at most: half a step in each dimension,
        # plus the clipping ``encode`` lets through (squared, in steps: up to ``budget``),
        # 1% more for the float32 reciprocal of the scale
        budget = max(self.dim / 12.0, 1.0)
        self.error_bound = np.float32(1.01 * (0.5 * float(np.linalg.norm(scale.astype(np.float64)))
                                              + np.sqrt(budget) * float(scale.max())))

    def encode(self, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Code records of record bytes ``data`` (uint8): ``(codes as bytes, clipped per
        record)`` (see ``native.codes.encode``); writes their vectors too."""
        recs_f, recs_u = record_view(data, self.dim)
        self.train(recs_f)
        self.vectors.write(recs_u, recs_f)
        out = np.empty((recs_u.shape[0], self.words), dtype=np.uint32)
        clipped = native.codes.encode(recs_u, recs_f, self.lo, self.inv_scale, out, out.view(np.uint8))
        return out.reshape(-1).view(np.uint8), clipped

    def encode_each(self, pieces: list[np.ndarray]) -> list[np.ndarray | None]:
        """``encode`` of each piece of record bytes, in one kernel call for all (a commit
        appends to a thousand postings: a call each cost an ingest a quarter of its rate);
        None for a piece with a record outside the quantizer's range: such a posting is
        scanned as float32, never as codes whose estimates would misplace it."""
        if not pieces:
            return []
        data = np.concatenate(pieces)
        coded, clipped = self.encode(data)
        rows = np.cumsum([len(p) for p in pieces[:-1]], dtype=np.int64) // (4 * (self.dim + 2))
        out = np.split(coded, rows * (4 * self.words))
        self._coded_since += len(pieces)
        if clipped.any():
            upto = np.concatenate([[0], np.cumsum(clipped)])
            bounds = np.concatenate([[0], rows, [clipped.shape[0]]])
            bad = upto[bounds[1:]] > upto[bounds[:-1]]
            refused = int(np.count_nonzero(bad))
            self.refused += refused
            self._refused_since += refused
            x = record_view(data, self.dim)[0][clipped, 2:]
            lo, hi = x.min(axis=0), x.max(axis=0)
            if self._seen is not None:
                lo, hi = np.minimum(lo, self._seen[0]), np.maximum(hi, self._seen[1])
            self._seen = lo, hi
            out = [None if b else c for c, b in zip(out, bad.tolist())]
        return out

    @property
    def wants_retrain(self) -> bool:
        """Enough postings were refused since the quantizer was trained to train a wider one."""
        return (self._seen is not None and self._refused_since >= RETRAIN_MIN_REFUSED
                and self._refused_since >= RETRAIN_SHARE * self._coded_since)

    def successor(self) -> "PostingCodes":
        """Empty codes of the same capacity and vector file, their quantizer's range widened
        to the records this one refused (the caller codes every posting again)."""
        nxt = PostingCodes(self.cap_bytes, self.dim, self.vectors)
        hi = self.lo + 255.0 * self.scale
        seen_lo, seen_hi = self._seen
        nxt._fit(np.minimum(self.lo, seen_lo), np.maximum(hi, seen_hi))
        nxt.refused, nxt.retrains = self.refused, self.retrains + 1
        nxt.code_reads, nxt.rerank_reads = self.code_reads, self.rerank_reads
        return nxt

    def keep(self, entries: list[tuple[int, int, int, np.ndarray]], train: bool = True) -> None:
        """Code and keep whole postings ``(pid, span word, generation, record bytes)`` (none
        before the quantizer is trained: see ``MIN_TRAIN_RECORDS``; ``train`` False: none
        then, these postings being no fair sample of the data)."""
        if self.ring.capacity and entries:
            if self.lo is None and not train:
                return
            if self.lo is None:  # the first postings coded: train on all of them
                self.train(record_view(np.concatenate([e[3] for e in entries]), self.dim)[0])
                if self.lo is None:
                    return
            coded = self.encode_each([e[3] for e in entries])
            self.ring.keep([(pid, span, gen, True, c) for (pid, span, gen, _), c in zip(entries, coded)
                            if c is not None], evict=True)

    def extend(self, appends: list[tuple[int, int, int, int, np.ndarray]]) -> None:
        """Postings ``(pid, span before, span after, generation, appended record bytes)``: the
        codes of those held whole as they were before, with the appended records' codes
        after them; the others are forgotten (their codes no longer match)."""
        if not appends or not self.ring.capacity or self.lo is None:
            return
        pids = np.array([a[0] for a in appends], dtype=np.int64)
        found, token = self.ring.find(pids)
        try:
            current, stale = [], []
            for a, t in zip(appends, found.tolist()):
                if t[0] >= 0 and t[2] == a[1] and t[3] == (a[3] << 1 | 1):
                    current.append((a, self.ring.view_bytes(t[0], t[1])))
                else:
                    stale.append(a[0])
            coded = self.encode_each([a[4] for a, _ in current])
            entries = [(pid, after, gen, True, np.concatenate([old, c]))
                       for ((pid, _, after, gen, _), old), c in zip(current, coded) if c is not None]
            stale += [a[0] for (a, _), c in zip(current, coded) if c is None]
        finally:
            self.ring.release(token)
        self.ring.forget(stale)
        if entries:
            self.ring.keep(entries, evict=True)

    def stats(self) -> dict:
        return {"codes_bytes": self.ring.live_bytes, "codes_allocated_bytes": self.ring.allocated_bytes,
                "code_reads": self.code_reads, "rerank_reads": self.rerank_reads,
                "vector_file_bytes": self.vectors.file_bytes, "codes_build_seconds": self.build_seconds,
                "codes_refused": self.refused, "codes_retrains": self.retrains}

    def close(self) -> None:
        self.ring = KeptPostings(0, self.words * 4)
        self.vectors.close()
