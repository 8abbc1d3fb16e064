"""The on-disk layout of an index directory and its manifest.

::

    <path>/vindex.json        manifest: format version, dim, metric, config and a checksum
                              of them (written last by a build, so a directory without it is
                              not an index)
    <path>/store/             RocksDB posting store (postings, posting directory, op log)
    <path>/checkpoint/<seq>/  engine-state checkpoints (see ``checkpoint``)

The checksum is a CRC32 of the canonical JSON (sorted keys, no spaces) of every other field,
so an edit by hand (a metric or dim changed) fails the open instead of giving wrong answers.
Manifests written before the checksum existed have none and are read as they are.
"""
from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass

from .config import IndexConfig, RUNTIME_FIELDS, check_metric
from .errors import (CorruptionError, IndexExistsError, IndexNotFoundError, InvalidConfigError,
                     NotAnIndexError)
from .files import write_json_atomic

MANIFEST = "vindex.json"
STORE_DIR = "store"
FORMAT = "vindex-index"
FORMAT_VERSION = 1
CHECKSUM = "checksum"
MAX_DIM = 65536


def checksum(fields: dict) -> str:
    """``crc32:<hex>`` of the canonical JSON of ``fields`` without their checksum."""
    body = json.dumps({k: v for k, v in fields.items() if k != CHECKSUM}, sort_keys=True, separators=(",", ":"))
    return f"crc32:{zlib.crc32(body.encode()):08x}"


@dataclass(frozen=True)
class Manifest:
    dim: int
    metric: str
    config: IndexConfig
    checksummed: bool = True  # False: read from a file written before manifests had a checksum

    def to_json(self) -> dict:
        fields = {"format": FORMAT, "format_version": FORMAT_VERSION, "dim": self.dim,
                  "metric": self.metric, "config": self.config.to_dict()}
        return {**fields, CHECKSUM: checksum(fields)}


def store_path(path: str) -> str:
    return os.path.join(path, STORE_DIR)


def prepare_new(path: str) -> bool:
    """Check that ``path`` can hold a new index; create it. Returns whether it was created."""
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, MANIFEST)):
        raise IndexExistsError(f"an index already exists at {path!r}; open it with Index.open or choose another path")
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise IndexExistsError(f"{path!r} exists and is not a directory")
        if os.listdir(path):
            raise IndexExistsError(
                f"directory {path!r} is not empty (an interrupted build leaves files but no "
                f"{MANIFEST}); remove it or choose another path")
        return False
    os.makedirs(path)
    return True


def write(path: str, manifest: Manifest) -> None:
    write_json_atomic(os.path.join(path, MANIFEST), manifest.to_json())


def read(path: str, overrides: dict) -> Manifest:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise IndexNotFoundError(f"no index at {path!r}: the path does not exist")
    file = os.path.join(path, MANIFEST)
    if not os.path.isdir(path) or not os.path.exists(file):
        raise NotAnIndexError(f"{path!r} is not a vindex index (no {MANIFEST})")
    try:
        with open(file) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise CorruptionError(f"{file}: unreadable manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise NotAnIndexError(f"{file} is not a vindex manifest")
    if data.get("format_version") != FORMAT_VERSION:
        raise NotAnIndexError(
            f"{file}: format version {data.get('format_version')!r} is not supported "
            f"(this vindex reads version {FORMAT_VERSION})")
    stored = data.get(CHECKSUM)
    if stored is not None and stored != checksum(data):
        raise CorruptionError(f"{file}: checksum mismatch (edited by hand?): the file says {stored!r}, "
                              f"its contents give {checksum(data)!r}")
    bad = sorted(set(overrides) - RUNTIME_FIELDS)
    if bad:
        raise InvalidConfigError(
            f"cannot change {bad} when opening an index; only {sorted(RUNTIME_FIELDS)} may be set")
    try:  # what the file holds: a bad value is a damaged file, not a caller's mistake
        if not isinstance(data["config"], dict):
            raise InvalidConfigError(f"config: expected an object, got {data['config']!r}")
        IndexConfig.from_dict(data["config"])
        dim, metric = data["dim"], check_metric(data["metric"])
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_DIM:
            raise InvalidConfigError(f"dim: expected an integer in 1..{MAX_DIM}, got {dim!r}")
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise CorruptionError(f"{file}: invalid manifest ({type(exc).__name__}: {exc})") from None
    config = IndexConfig.from_dict({**data["config"], **overrides})  # a bad override is the caller's
    return Manifest(dim, metric, config, checksummed=stored is not None)
