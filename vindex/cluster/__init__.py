"""Sharded, replicated collections on Ray Core (the ``vindex[ray]`` extra).

    >>> from vindex.cluster import ShardedIndex
    >>> index = ShardedIndex.create("docs", 384, "cosine", shards=2, replicas=2, path="/data/docs")  # doctest: +SKIP

Importing this package does not start or join Ray; :meth:`ShardedIndex.create` and
:meth:`ShardedIndex.open` do.
"""
from __future__ import annotations

try:
    import ray  # noqa: F401
except ImportError as exc:  # pragma: no cover - CI installs the extra
    raise ImportError("vindex.cluster needs Ray: pip install 'vindex[ray]'") from exc

from .shard import ShardUnavailableError
from .sharded import ShardedIndex

__all__ = ["ShardedIndex", "ShardUnavailableError"]
