"""Small durable-file helpers: atomic writes and directory fsync."""
from __future__ import annotations

import json
import os
from typing import Any


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new file, never a mix."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def write_json_atomic(path: str, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True).encode())
