"""The sample collection ``vindex serve --sample NAME`` loads from the data sets bundled as the
package ``vindex.data`` (``data/`` in the repository; ``data/NOTICE.md`` gives their sources
and licences)."""
from __future__ import annotations

import importlib.resources
import logging
import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the bench's data loader imports this module without the service
    from .collections import Collections

log = logging.getLogger("vindex.service")

SAMPLES = {
    "wiki": "wiki-minilm-15k-cos.npz",      # 15k Wikipedia titles, all-MiniLM-L6-v2, cosine
    "bigann": "bigann-10k-u8-l2.npz",       # 10k SIFT-like vectors, l2
    "glove": "glove-6b-50d-100k-angular.npz",  # 100k GloVe words, cosine
}


def data_dir() -> str:
    """The bundled data sets: ``$VINDEX_DATA_DIR``, else the installed package ``vindex.data``."""
    return os.environ.get("VINDEX_DATA_DIR") or str(importlib.resources.files("vindex.data"))


def load_npz(name: str) -> dict:
    if name not in SAMPLES:
        raise ValueError(f"sample: expected one of {sorted(SAMPLES)}, got {name!r}")
    path = os.path.join(data_dir(), SAMPLES[name])
    if not os.path.exists(path):
        raise FileNotFoundError(f"bundled data set not found at {path} (set VINDEX_DATA_DIR)")
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def load_sample(collections: "Collections", name: str) -> str:
    """Build collection ``name`` from its bundled data set unless it exists; returns ``name``."""
    if name in collections.names():
        return name
    data = load_npz(name)
    metric = "l2" if str(data["metric"]).startswith("l2") else "cosine"
    base = data["base"]
    log.info("loading sample collection %r: %d x %d %s vectors", name, base.shape[0], base.shape[1], metric)
    metadata, documents = sample_payload(data)
    collections.create(name, dim=base.shape[1], metric=metric, config={}, vectors=base, metadata=metadata,
                       documents=documents)
    return name


def sample_payload(data: dict) -> tuple[list[dict] | None, list[str] | None]:
    """``(metadata, documents)`` of a bundled set's base rows: for wiki, each row's article title
    as its document and ``{"topic": name, "chunk": n}`` (the article's topic, and which chunk of
    its summary the row embeds) as its metadata; ``(None, None)`` for sets without text."""
    if "base_title" not in data:
        return None, None
    topics = data["topic_names"][data["base_topic"]]
    metadata = [{"topic": str(t), "chunk": int(c)} for t, c in zip(topics, data["base_chunk"])]
    return metadata, [str(t) for t in data["base_title"]]
