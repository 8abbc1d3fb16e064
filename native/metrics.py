"""Metric codes shared by the kernels and the library (no numba import here)."""

L2 = 0  # squared Euclidean
IP = 1  # negative inner product, so smaller is always better
