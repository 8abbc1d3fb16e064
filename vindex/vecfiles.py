"""Vector files opened lazily, so a loader can stream a file larger than memory in batches.

Formats, chosen by suffix: ``.npy`` (2-D), ``.fvecs`` / ``.ivecs`` / ``.bvecs`` (texmex: each
row an int32 dimension then the values), ``.fbin`` / ``.u8bin`` / ``.i8bin`` / ``.ibin``
(big-ann-benchmarks: int32 n, int32 d, then the rows), ``.hdf5`` / ``.h5`` (ann-benchmarks;
one named array, "train" by default; needs h5py).

``open_vectors(path)`` returns an object with ``shape``, ``dtype``, ``len()`` and slicing by row
ranges; a slice is read from disk then and there.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

_XVECS = {".fvecs": np.float32, ".ivecs": np.int32, ".bvecs": np.uint8}
_BIN = {".fbin": np.float32, ".u8bin": np.uint8, ".i8bin": np.int8, ".ibin": np.int32}
SUFFIXES = (".npy", *_XVECS, *_BIN, ".hdf5", ".h5")


class _Xvecs:
    """A texmex file as a memmap of records; slicing strips the per-row dimension field."""

    def __init__(self, path: str, elem: Any):
        elem = np.dtype(elem).newbyteorder("<")
        size = os.path.getsize(path)
        if size < 4:
            self._raw, self.dim = np.zeros((0, 4), np.uint8), 0
        else:
            d = int(np.fromfile(path, dtype="<i4", count=1)[0])
            if d <= 0:
                raise ValueError(f"{path}: bad dimension {d} in the first record")
            row = 4 + d * elem.itemsize
            if size % row:
                raise ValueError(f"{path}: size {size} is not a multiple of the {row}-byte record of dimension {d}")
            self._raw, self.dim = np.memmap(path, dtype=np.uint8, mode="r", shape=(size // row, row)), d
        self.path, self.dtype = path, elem.newbyteorder("=")
        self._elem = elem

    @property
    def shape(self) -> tuple[int, int]:
        return (self._raw.shape[0], self.dim)

    def __len__(self) -> int:
        return self._raw.shape[0]

    def __getitem__(self, rows: slice) -> np.ndarray:
        raw = np.asarray(self._raw[rows])
        if raw.shape[0] and np.any(raw[:, :4].copy().view("<i4").ravel() != self.dim):
            raise ValueError(f"{self.path}: records have differing dimensions")
        return np.ascontiguousarray(raw[:, 4:]).view(self._elem).astype(self.dtype, copy=False)


class _Hdf5:
    def __init__(self, path: str, key: str):
        try:
            import h5py  # optional: only needed for ann-benchmarks files
        except ImportError as e:
            raise ImportError("reading .hdf5 files needs h5py, which is not installed; `pip install h5py`") from e
        self._file = h5py.File(path, "r")
        if key not in self._file:
            keys = sorted(self._file.keys())
            self._file.close()
            raise KeyError(f"{path}: no dataset {key!r}; has {keys}")
        self._ds = self._file[key]
        self.shape, self.dtype = tuple(self._ds.shape), self._ds.dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> np.ndarray:
        return np.ascontiguousarray(self._ds[rows])


def open_vectors(path: str | os.PathLike, key: str = "train") -> Any:
    """Open a vector file for row-range reads (see the module docstring for formats)."""
    path = os.fspath(path)
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"{path}: unsupported suffix {suffix!r}; expected one of {', '.join(SUFFIXES)}")
    if suffix in (".hdf5", ".h5"):
        return _Hdf5(path, key)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if suffix == ".npy":
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
        if arr.ndim != 2:
            raise ValueError(f"{path}: expected a 2-D array, got shape {arr.shape}")
        return arr
    if suffix in _XVECS:
        return _Xvecs(path, _XVECS[suffix])
    if suffix in _BIN:
        dtype = np.dtype(_BIN[suffix]).newbyteorder("<")
        header = np.fromfile(path, dtype="<i4", count=2)
        if header.size < 2:
            raise ValueError(f"{path}: missing the 8-byte header")
        n, d = int(header[0]), int(header[1])
        if n < 0 or d <= 0 or os.path.getsize(path) < 8 + n * d * dtype.itemsize:
            raise ValueError(f"{path}: header says {n}x{d} but the file is too short")
        return np.memmap(path, dtype=dtype, mode="r", offset=8, shape=(n, d))


def read_vectors(path: str | os.PathLike, max_rows: int | None = None, key: str = "train") -> np.ndarray:
    """Read a whole vector file (or its first ``max_rows`` rows) into memory."""
    f = open_vectors(path, key)
    n = len(f) if max_rows is None else min(len(f), int(max_rows))
    return np.ascontiguousarray(f[:n]).astype(f.dtype.newbyteorder("="), copy=False)
