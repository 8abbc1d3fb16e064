"""Seeded synthetic vectors that behave roughly like SIFT for ANN benchmarks at 1M scale.

Why not simpler data: i.i.d. Gaussian vectors have no neighbourhood structure (every index
looks bad) and ``make_blobs`` clusters are so separated that every index looks perfect.
Real descriptors sit near a low-dimensional, clustered, curved manifold plus noise, so:

1. a latent ``z`` in ``LATENT_DIM`` dimensions is drawn from a two-level Gaussian mixture
   (groups of sub-clusters) with log-normal component weights and spreads and an
   anisotropic, randomly rotated covariance per component;
2. ``z`` is mapped to ``d`` dimensions by a fixed random two-layer network
   (``softplus(W2 tanh(W1 z + b1) + b2)``), which curves the manifold and makes the
   output non-negative like SIFT;
3. isotropic Gaussian noise is added.

The distribution depends only on ``(seed, d)``, never on ``n``: ``make(n)`` is exactly the
first ``n`` rows of ``make(m)`` for ``m > n``, so "synthetic-100k" is a sample of the same
distribution as "synthetic-1m" (same cluster structure, ten times fewer points). Rows are
generated in fixed blocks of ``BLOCK`` rows, each from its own seeded stream and computed
with identical array shapes (BLAS results depend on matrix shape), so the output is
bit-identical whatever ``chunk_rows`` is. Across CPUs or BLAS builds the last bits of the
floats may differ, which is why caches are per machine. Queries come from the same
distribution through a separate stream, so they are never copies of base rows.

Tuned (see ``_Config``) so that faiss IndexIVFFlat with nlist=4000 on 1M x 128 gives
recall@10 near 0.9 at nprobe=16 and >= 0.97 at nprobe=64, as SIFT1M does; on 10k rows its
IVF recall curve, relative contrast and local intrinsic dimension are close to real SIFT's.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from bench.exact import ground_truth

__all__ = ["BLOCK", "GENERATOR_VERSION", "cache_dir", "load_cached", "make", "make_rows"]

# Bump when the generator's output changes so stale caches are not reused.
GENERATOR_VERSION = 1
# Rows per independently seeded, identically shaped generation block (part of the format).
BLOCK = 4096
_BASE_STREAM, _QUERY_STREAM = 1, 2


@dataclass(frozen=True)
class _Config:
    """Shape of the distribution; the defaults are the tuned values."""

    latent_dim: int = 24
    n_groups: int = 64  # top-level clusters
    subs_per_group: int = 32  # sub-clusters per group
    group_spread: float = 3.0  # std of group centres
    sub_spread: float = 1.0  # std of sub-cluster centres around their group centre
    # Components overlap heavily at the tuned value: SIFT is only weakly clustered (k-means
    # distortion at k=16/64/379 on 10k rows: SIFT 0.72/0.60/0.48 of total variance, this
    # generator 0.76/0.62/0.49; at comp_scale=0.45 it is 0.52/0.23/0.10, i.e. far too easy).
    comp_scale: float = 3.5  # median within-component std (before the anisotropy profile)
    scale_sigma: float = 0.35  # log-normal sigma of per-component spread
    weight_sigma: float = 1.0  # log-normal sigma of group and sub-cluster weights
    aniso_decay: float = 0.6  # component std along axis j ~ (1 + j) ** -aniso_decay
    hidden: int = 256
    gain1: float = 1.0  # pre-tanh gain
    gain2: float = 2.0  # pre-softplus gain
    noise: float = 0.1  # isotropic noise std, relative to the per-dim std of the clean output
    out_scale: float = 20.0  # overall scale (SIFT-like magnitudes; irrelevant to neighbours)


DEFAULT = _Config()


@dataclass(frozen=True)
class _Model:
    """The fixed random parameters of the distribution for one (seed, d, config)."""

    cum_weights: np.ndarray  # (C,) cumulative component probabilities
    centres: np.ndarray  # (C, L) component means
    factors: np.ndarray  # (C, L, L) per-component covariance square roots
    w1: np.ndarray  # (L, H)
    b1: np.ndarray  # (H,)
    w2: np.ndarray  # (H, d)
    b2: np.ndarray  # (d,)
    noise_std: float
    out_scale: float


@lru_cache(maxsize=8)
def _model(seed: int, d: int, cfg: _Config = DEFAULT) -> _Model:
    # The latent mixture depends on the seed only, so every d shares one cluster structure.
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0, 0]))
    L, G, S = cfg.latent_dim, cfg.n_groups, cfg.subs_per_group
    C = G * S
    group_c = rng.standard_normal((G, L)) * cfg.group_spread
    # Each group stretches its sub-clusters along its own random axes.
    group_axes = np.exp(rng.normal(0.0, 0.5, size=(G, L)))
    sub_c = group_c[:, None, :] + rng.standard_normal((G, S, L)) * group_axes[:, None, :] * cfg.sub_spread
    centres = sub_c.reshape(C, L)
    weights = np.exp(rng.normal(0, cfg.weight_sigma, size=(G, 1)) + rng.normal(0, cfg.weight_sigma, size=(G, S)))
    weights = weights.ravel() / weights.sum()
    # Anisotropic covariance: decaying axis profile, random rotation, log-normal overall scale.
    profile = (1.0 + np.arange(L)) ** -cfg.aniso_decay
    profile /= np.sqrt(np.mean(profile**2))
    scales = cfg.comp_scale * np.exp(rng.normal(0, cfg.scale_sigma, size=C))
    q, r = np.linalg.qr(rng.standard_normal((C, L, L)))
    q *= np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]  # Haar-uniform rotations
    factors = q * (profile[None, None, :] * scales[:, None, None])

    mrng = np.random.default_rng(np.random.SeedSequence([seed, 0, d]))
    H = cfg.hidden
    w1 = mrng.standard_normal((L, H)) * (cfg.gain1 / np.sqrt(L * cfg.group_spread**2))
    b1 = mrng.standard_normal(H) * 0.5
    w2 = mrng.standard_normal((H, d)) * (cfg.gain2 / np.sqrt(H))
    b2 = mrng.standard_normal(d) * 0.5
    m = _Model(
        cum_weights=np.cumsum(weights),
        centres=centres.astype(np.float32),
        factors=factors.astype(np.float32),
        w1=w1.astype(np.float32),
        b1=b1.astype(np.float32),
        w2=w2.astype(np.float32),
        b2=b2.astype(np.float32),
        noise_std=0.0,
        out_scale=cfg.out_scale,
    )
    # Calibrate noise against the clean signal's per-dimension spread on a fixed probe.
    probe = _clean_block(m, np.random.default_rng(np.random.SeedSequence([seed, 0, d, 1])))
    noise_std = float(cfg.noise * np.sqrt(np.mean(probe.var(axis=0))))
    return _Model(**{**m.__dict__, "noise_std": noise_std})


def _clean_block(m: _Model, rng: np.random.Generator) -> np.ndarray:
    """One block of noise-free outputs; draws in a fixed order so blocks are reproducible."""
    comp = np.searchsorted(m.cum_weights, rng.random(BLOCK), side="right")
    comp = np.minimum(comp, len(m.cum_weights) - 1)  # guard the float-rounding edge
    eps = rng.standard_normal((BLOCK, m.centres.shape[1]), dtype=np.float32)
    z = m.centres[comp] + np.einsum("nij,nj->ni", m.factors[comp], eps)
    h = np.tanh(z @ m.w1 + m.b1)
    x = np.logaddexp(0.0, h @ m.w2 + m.b2)  # softplus
    return x * np.float32(m.out_scale)


def _block(m: _Model, seed: int, stream: int, index: int, d: int) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence([seed, stream, index]))
    x = _clean_block(m, rng)
    x += rng.standard_normal((BLOCK, d), dtype=np.float32) * np.float32(m.noise_std)
    return x.astype(np.float32, copy=False)


def make_rows(
    start: int, stop: int, d: int = 128, seed: int = 0, stream: int = _BASE_STREAM, cfg: _Config = DEFAULT
) -> np.ndarray:
    """Rows ``[start, stop)`` of the infinite seeded stream, as (stop - start, d) float32."""
    m = _model(seed, d, cfg)
    out = np.empty((max(0, stop - start), d), dtype=np.float32)
    for b in range(start // BLOCK, (stop + BLOCK - 1) // BLOCK):
        lo, hi = max(start, b * BLOCK), min(stop, (b + 1) * BLOCK)
        out[lo - start : hi - start] = _block(m, seed, stream, b, d)[lo - b * BLOCK : hi - b * BLOCK]
    return out


def make(
    n: int,
    d: int = 128,
    n_queries: int = 10_000,
    seed: int = 0,
    chunk_rows: int = 16 * BLOCK,
    cfg: _Config = DEFAULT,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Generate ``(base (n, d), queries (n_queries, d))`` float32.

    Memory stays near the output size: rows are produced ``chunk_rows`` at a time into the
    preallocated output. The result does not depend on ``chunk_rows`` (multiples of
    ``BLOCK`` are fastest: other sizes regenerate the blocks they split).
    """
    if n < 0 or n_queries < 0 or d <= 0:
        raise ValueError("n and n_queries must be >= 0 and d > 0")
    chunk_rows = max(1, int(chunk_rows))
    base = np.empty((n, d), dtype=np.float32)
    t0 = time.perf_counter()
    for lo in range(0, n, chunk_rows):
        hi = min(n, lo + chunk_rows)
        base[lo:hi] = make_rows(lo, hi, d, seed, _BASE_STREAM, cfg)
        if progress and (hi == n or (lo // chunk_rows) % 16 == 15):
            print(f"  synthetic base {hi}/{n} rows, {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    queries = make_rows(0, n_queries, d, seed, _QUERY_STREAM, cfg)
    return base, queries


def cache_dir() -> Path:
    """Where :func:`load_cached` keeps its files (env ``VINDEX_BENCH_CACHE``)."""
    return Path(os.environ.get("VINDEX_BENCH_CACHE") or Path.home() / ".cache" / "vindex-bench")


def _save_atomic(path: Path, arr: np.ndarray) -> None:
    # Write then rename so an interrupted run never leaves a truncated cache file.
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.save(f, arr)
    os.replace(tmp, path)


def load_cached(
    n: int,
    d: int = 128,
    seed: int = 0,
    k: int = 100,
    n_queries: int = 10_000,
    mmap: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(base, queries, gt_ids (n_queries, k) int64)`` for a synthetic set, computed once.

    Files live in ``cache_dir()/synthetic-v<version>-n<n>-d<d>-s<seed>-q<nq>/``. With
    ``mmap=True`` base is memory-mapped read-only instead of read into memory.
    """

    folder = cache_dir() / f"synthetic-v{GENERATOR_VERSION}-n{n}-d{d}-s{seed}-q{n_queries}"
    folder.mkdir(parents=True, exist_ok=True)
    base_p, query_p = folder / "base.npy", folder / "queries.npy"
    if base_p.exists() and query_p.exists():
        base = np.load(base_p, mmap_mode="r" if mmap else None)
        queries = np.load(query_p)
    else:
        t0 = time.perf_counter()
        print(f"generating synthetic n={n} d={d} seed={seed} into {folder}", file=sys.stderr)
        base, queries = make(n, d, n_queries, seed, progress=True)
        _save_atomic(base_p, base)
        _save_atomic(query_p, queries)
        print(f"  generated in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    # Any cached ground truth with at least k columns will do.
    for p in sorted(folder.glob("gt-k*.npy"), key=lambda p: int(p.stem[4:])):
        if int(p.stem[4:]) >= k:
            return base, queries, np.load(p)[:, :k]
    t0 = time.perf_counter()
    print(f"computing exact top-{k} for {len(queries)} queries over {n} rows", file=sys.stderr)
    gt, _ = ground_truth(np.asarray(base), queries, k, "l2", progress=True)
    _save_atomic(folder / f"gt-k{k}.npy", gt)
    print(f"  ground truth in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return base, queries, gt
