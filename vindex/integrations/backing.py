"""The records behind an integration's store: an embedded ``vindex.Index`` or a ``vindex.Client``
collection, with the life cycle the stores share.

An embedded index at ``path`` is opened if the path holds anything (what is not an index raises
``NotAnIndexError`` there and then); a missing path or an empty folder becomes an index on the
first write, once the embedding's dimension is known, with string ids. Without a path the index lives in a
temporary directory that is removed when the store is closed or garbage collected.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from typing import Any, Callable

from vindex.config import IndexConfig, check_metric
from vindex.errors import IndexClosedError, InvalidConfigError
from vindex.index import Index

__all__ = ["Backing"]


class _Handle:
    """What the finalizer needs, kept apart from the store so the store can be collected."""

    def __init__(self, records: Any, temp_dir: str | None):
        self.records, self.temp_dir = records, temp_dir


def _release(handle: _Handle, owned: bool) -> None:
    if owned and handle.records is not None:
        handle.records.close()
    handle.records = None
    if handle.temp_dir is not None:
        shutil.rmtree(handle.temp_dir, ignore_errors=True)


class Backing:
    """An embedded index (``path``, or a temporary one) or a remote ``collection``.

    ``metric`` and ``index_config`` (``IndexConfig`` fields) apply when the index is created;
    an index that exists already is opened with ``index_config`` as runtime settings and keeps
    its own metric. A collection keeps its own metric and configuration. ``check(records)``, if
    given, vets an index opened or a collection given (raising to refuse it): a store's own
    demands, such as string ids."""

    def __init__(self, owner: object, *, path: str | os.PathLike | None, collection: Any, metric: str,
                 index_config: dict[str, Any], check: Callable[[Any], None] | None = None):
        if path is not None and collection is not None:
            raise InvalidConfigError("give path (an embedded index) or collection (a vindex.Client collection), "
                                     "not both")
        self._lock = threading.Lock()
        self._config = dict(index_config)
        if collection is not None:
            if index_config:
                raise InvalidConfigError(f"index settings {sorted(index_config)} do not apply to a collection; "
                                         "the server fixed its configuration when it was created")
            if check is not None:
                check(collection)
            self._handle, self._metric, self._path = _Handle(collection, None), collection.metric, None
            self._finalize = weakref.finalize(owner, _release, self._handle, False)
            return
        if path is None:
            temp_dir = tempfile.mkdtemp(prefix="vindex-store-")
            self._path = os.path.join(temp_dir, "index")
        else:
            temp_dir, self._path = None, os.fspath(path)
        self._handle = _Handle(None, temp_dir)
        self._finalize = weakref.finalize(owner, _release, self._handle, True)
        if os.path.exists(self._path) and not (os.path.isdir(self._path) and not os.listdir(self._path)):
            # an index, or something else that Index.open names as not one
            index = Index.open(self._path, **self._config)
            try:
                if check is not None:
                    check(index)
            except BaseException:
                index.close()
                raise
            self._handle.records, self._metric = index, index.metric
        else:
            IndexConfig.from_kwargs(self._config)  # a bad setting fails here, not at the first write
            self._metric = check_metric(metric)

    @property
    def records(self) -> Any:
        """The ``vindex.Index`` or ``vindex.Collection``; None while an embedded index is not created yet."""
        if not self._finalize.alive:
            raise IndexClosedError("the store is closed")
        return self._handle.records

    @property
    def metric(self) -> str:
        return self._metric

    def for_writing(self, dim: int) -> Any:
        """The records, creating the embedded index of dimension ``dim`` on the first write."""
        records = self.records
        if records is not None:
            return records
        with self._lock:
            if not self._finalize.alive:
                raise IndexClosedError("the store is closed")
            if self._handle.records is None:
                self._handle.records = Index.create(self._path, dim=dim, metric=self._metric, id_type="str",
                                                    **self._config)
            return self._handle.records

    def close(self) -> None:
        """Close an embedded index (removing a temporary one); a collection stays as it is."""
        with self._lock:
            self._finalize()
