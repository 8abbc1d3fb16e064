"""Benchmark data sets: loading by name, vector-file readers, exact ground truth and recall.

Every data set is returned as a :class:`Dataset` with float32 C-contiguous vectors and
int64 ground-truth row numbers (best first), whatever its storage format. Distances follow
one convention everywhere in ``bench``: *smaller is better* (squared L2 for "l2",
``1 - cos`` for "cosine", ``-<q, x>`` for "ip").
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vindex.service import sample
from vindex import vecfiles

from bench.exact import METRICS, _f32, ground_truth, recall_at_k

__all__ = [
    "DATA_DIR",
    "METRICS",
    "Dataset",
    "available",
    "ground_truth",
    "load",
    "parse_count",
    "read_bin",
    "read_bvecs",
    "read_fvecs",
    "read_hdf5",
    "read_ivecs",
    "read_npy",
    "read_vectors",
    "recall_at_k",
]


# bench/ lives at <repo>/bench, so the shipped data is one level up.
DATA_DIR = Path(sample.data_dir())


@dataclass
class Dataset:
    """A base set, its queries and exact top-K ground truth for one metric."""

    name: str
    base: np.ndarray  # (n, d) float32, C-contiguous
    queries: np.ndarray  # (nq, d) float32, C-contiguous
    gt_ids: np.ndarray  # (nq, K) int64 row numbers into base, best first
    metric: str  # "l2" | "cosine" | "ip"
    # Distances matching gt_ids in the bench convention (ascending); None if unknown.
    gt_dists: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.base.shape[0])

    @property
    def d(self) -> int:
        return int(self.base.shape[1])

    def __repr__(self) -> str:  # arrays are too large for the default repr
        return (
            f"Dataset({self.name!r}, base={self.base.shape}, queries={self.queries.shape}, "
            f"gt={self.gt_ids.shape}, metric={self.metric!r})"
        )


# name -> (file, loader kind). The real sets are small enough to load eagerly.
_FILES = {
    "bigann-10k": "bigann-10k-u8-l2.npz",
    "bigann-10k-holdout": "bigann-10k-u8-l2.npz",
    "fmnist-1k": "fmnist-1k-u8-l2.npz",
    "mnist-9k": "mnist-t10k-u8-l2.npz",
    "glove-100k": "glove-6b-50d-100k-angular.npz",
    "wiki-minilm-15k": "wiki-minilm-15k-cos.npz",
}
_SYNTHETIC_RE = re.compile(r"^synthetic-([0-9.]+[kmg]?)(?:-d([0-9]+))?$", re.IGNORECASE)
_SYNTHETIC_PATTERN = "synthetic-<n>[-d<dim>] (n like 10k, 100k, 1m; d defaults to 128)"
_SYNTHETIC_EXAMPLES = ["synthetic-10k", "synthetic-100k", "synthetic-1m"]


def available() -> list[str]:
    """Names accepted by :func:`load`: real sets whose file is present, then example synthetic
    sizes (any ``synthetic-<n>[-d<dim>]`` works)."""
    real = [name for name, fname in _FILES.items() if (DATA_DIR / fname).exists()]
    return real + list(_SYNTHETIC_EXAMPLES)


def parse_count(text: str) -> int:
    """Parse a row count such as ``"10k"``, ``"1m"``, ``"2.5M"`` or ``"250000"``."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kmg]?)", text.strip().lower())
    if not m:
        raise ValueError(f"bad count {text!r}; expected e.g. 10k, 100k, 1m or 250000")
    value = float(m.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}[m.group(2)]
    if value != int(value) or value <= 0:
        raise ValueError(f"count {text!r} is not a positive whole number of rows")
    return int(value)


def _metric_from_npz(text: str) -> str:
    # The npz 'metric' is free text such as "l2 (squared)" or "angular (cosine; ...)".
    t = text.strip().lower()
    if t.startswith("l2"):
        return "l2"
    if t.startswith(("cos", "angular")):
        return "cosine"
    if t.startswith(("ip", "inner", "dot")):
        return "ip"
    raise ValueError(f"unrecognised metric text {text!r}")


def _npz_gt_dists(dists: np.ndarray, metric: str) -> np.ndarray:
    # The shipped files store similarities (descending) for cosine sets; convert to distances.
    dists = np.asarray(dists, dtype=np.float32)
    if metric == "cosine":
        return (1.0 - dists).astype(np.float32)
    if metric == "ip":
        return -dists
    return dists


def load(name: str) -> Dataset:
    """Load a data set by name; see :func:`available` for the names.

    Real sets come from ``DATA_DIR`` (env ``VINDEX_DATA_DIR`` overrides). Synthetic sets
    ``synthetic-<n>[-d<dim>]`` are generated once by :mod:`bench.synthetic` and cached.
    """
    key = name.strip().lower()
    m = _SYNTHETIC_RE.match(key)
    if m:
        from bench import synthetic  # lazy: only synthetic sets need it

        n = parse_count(m.group(1))
        d = int(m.group(2)) if m.group(2) else 128
        base, queries, gt = synthetic.load_cached(n, d, seed=0)
        return Dataset(
            name=key,
            base=base,
            queries=queries,
            gt_ids=np.asarray(gt, dtype=np.int64),
            metric="l2",
        )
    if key not in _FILES:
        valid = ", ".join(list(_FILES) + [_SYNTHETIC_PATTERN])
        raise ValueError(f"unknown data set {name!r}; valid names: {valid}")

    path = DATA_DIR / _FILES[key]
    if not path.exists():
        raise FileNotFoundError(f"{path} not found (set VINDEX_DATA_DIR to the folder holding {_FILES[key]})")
    with np.load(path, allow_pickle=False) as z:
        metric = _metric_from_npz(str(z["metric"]))
        if key == "bigann-10k-holdout":
            # base[holdout_n:] serve as queries against base[:holdout_n].
            split = int(z["holdout_base_n"])
            base, queries = z["base"][:split], z["base"][split:]
            gt_ids, gt_dists = z["holdout_gt_ids"], z["holdout_gt_dists"]
        else:
            base, queries = z["base"], z["queries"]
            gt_ids, gt_dists = z["gt_ids"], z["gt_dists"]
        return Dataset(
            name=key,
            base=_f32(base),
            queries=_f32(queries),
            gt_ids=np.ascontiguousarray(gt_ids, dtype=np.int64),
            metric=metric,
            gt_dists=_npz_gt_dists(gt_dists, metric),
        )


# ---------------------------------------------------------------------------------------------
# Readers. Each takes an optional max_rows so a prefix of a huge file can be read cheaply.


def _read(path: str | os.PathLike, suffix: str, max_rows: int | None, key: str = "train") -> np.ndarray:
    if Path(path).suffix.lower() != suffix:
        raise ValueError(f"{path}: expected a {suffix} file")
    return vecfiles.read_vectors(path, max_rows, key)


def read_fvecs(path: str | os.PathLike, max_rows: int | None = None) -> np.ndarray:
    """Read a texmex ``.fvecs`` file as (n, d) float32."""
    return _read(path, ".fvecs", max_rows)


def read_ivecs(path: str | os.PathLike, max_rows: int | None = None) -> np.ndarray:
    """Read a texmex ``.ivecs`` file (e.g. ground truth) as (n, d) int32."""
    return _read(path, ".ivecs", max_rows)


def read_bvecs(path: str | os.PathLike, max_rows: int | None = None) -> np.ndarray:
    """Read a texmex ``.bvecs`` file as (n, d) uint8."""
    return _read(path, ".bvecs", max_rows)


def read_bin(path: str | os.PathLike, max_rows: int | None = None, dtype: np.dtype | None = None) -> np.ndarray:
    """Read a big-ann-benchmarks binary file: int32 n, int32 d, then n*d elements row-major.

    The element type comes from the suffix (.fbin float32, .u8bin uint8, .i8bin int8,
    .ibin int32) unless ``dtype`` is given.
    """
    if dtype is None:
        return vecfiles.read_vectors(path, max_rows)
    dtype = np.dtype(dtype).newbyteorder("<")
    header = np.fromfile(path, dtype="<i4", count=2)
    if header.size < 2:
        raise ValueError(f"{path}: missing 8-byte header")
    n, d = int(header[0]), int(header[1])
    if os.path.getsize(path) < 8 + n * d * dtype.itemsize:
        raise ValueError(f"{path}: header says {n}x{d} but the file is too short")
    n = n if max_rows is None else min(n, int(max_rows))
    data = np.fromfile(path, dtype=dtype, count=n * d, offset=8)
    return data.reshape(n, d).astype(dtype.newbyteorder("="), copy=False)


def read_npy(path: str | os.PathLike, max_rows: int | None = None) -> np.ndarray:
    """Read a 2-D ``.npy`` array; with ``max_rows`` only that prefix is read (via mmap)."""
    return _read(path, ".npy", max_rows)


def read_hdf5(path: str | os.PathLike, max_rows: int | None = None, key: str = "train") -> np.ndarray:
    """Read one array of an ann-benchmarks HDF5 file (keys train / test / neighbors / distances)."""
    return vecfiles.read_vectors(path, max_rows, key)


def read_vectors(path: str | os.PathLike, max_rows: int | None = None) -> np.ndarray:
    """Read vectors from any supported file, choosing the reader by suffix (see
    :mod:`vindex.vecfiles`)."""
    return vecfiles.read_vectors(path, max_rows)
