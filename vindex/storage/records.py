"""Posting record layout: ``[vid u32][version u32][vector float32 * dim]``.

All words are 32 bits so one buffer is viewed as float32 for vectors and as uint32 for the
header without copying (see ``native.scan``).
"""
from __future__ import annotations

import numpy as np

HEADER_WORDS = 2


def encode(vids: np.ndarray, versions: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Records as a ``(n, dim + 2) float32`` array (``.tobytes()`` gives the stored bytes)."""
    n, dim = vectors.shape
    recs = np.empty((n, dim + HEADER_WORDS), dtype=np.float32)
    words = recs.view(np.uint32)
    words[:, 0] = vids
    words[:, 1] = versions
    recs[:, HEADER_WORDS:] = vectors
    return recs


def view(data: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Zero-copy ``(float32, uint32)`` views of record bytes (a uint8 array), each ``(n, dim + 2)``."""
    flat = np.frombuffer(data, dtype=np.float32)
    recs_f = flat.reshape(-1, dim + HEADER_WORDS)
    return recs_f, recs_f.view(np.uint32)
