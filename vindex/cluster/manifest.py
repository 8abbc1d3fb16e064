"""The layout of a sharded collection, persisted as ``<path>/cluster.json``.

::

    <path>/cluster.json                 name, dim, metric, shards, replicas, id kind, index config
    <path>/shard-<s>/replica-<r>/       one replica's directory (on the node its actor runs on)
        index/                          its vindex.Index
        writes.log                      the shard's writes it applied, by sequence number
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from vindex.errors import IndexExistsError, IndexNotFoundError, NotAnIndexError

FILE = "cluster.json"
FORMAT = 1


@dataclasses.dataclass
class ClusterManifest:
    name: str
    dim: int
    metric: str
    shards: int
    replicas: int
    id_type: str | None
    config: dict[str, Any]
    format: int = FORMAT


def replica_dir(path: str, shard: int, replica: int) -> str:
    return os.path.join(path, f"shard-{shard}", f"replica-{replica}")


def write(path: str, manifest: ClusterManifest) -> None:
    """Write the manifest atomically (a reader sees the old or the new one, whole)."""
    tmp = os.path.join(path, FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(dataclasses.asdict(manifest), f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, FILE))


def read(path: str) -> ClusterManifest:
    file = os.path.join(path, FILE)
    if not os.path.exists(file):
        if not os.path.isdir(path):
            raise IndexNotFoundError(f"{path}: no sharded collection here (no such directory)")
        raise NotAnIndexError(f"{path}: not a sharded collection (no {FILE})")
    with open(file) as f:
        data = json.load(f)
    if data.get("format") != FORMAT:
        raise NotAnIndexError(f"{file}: unsupported format {data.get('format')!r} (this release reads {FORMAT})")
    return ClusterManifest(**data)


def prepare_new(path: str) -> None:
    """Make ``path`` for a new collection: it must not exist or be empty."""
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise IndexExistsError(f"{path}: exists and is not an empty directory")
    os.makedirs(path, exist_ok=True)
