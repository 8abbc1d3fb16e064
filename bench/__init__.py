"""Benchmark support for vindex: datasets, synthetic data, peer indexes and measurement helpers."""
