"""One replica of one shard: the Ray actor that owns a :class:`vindex.Index` and its write log.

The coordinator (:mod:`vindex.cluster.shard`) numbers a shard's writes 1, 2, 3...; a replica
applies write ``n`` only after ``n - 1`` and ignores one it already has, so a write retried
after a crash is applied once. The coordinator keeps a few writes in flight per shard; Ray
may start them out of order on the replica's write threads, so write ``n`` waits (up to
``REORDER_WAIT_S``) for ``n - 1`` before it raises :class:`BehindError`. A replica starts (and restarts)
not serving: the coordinator first brings it up to date from a peer's log, then calls
:meth:`ShardReplica.serve`.
"""
from __future__ import annotations

import os
import shutil
import threading
import uuid
from typing import Any

import numpy as np
import ray

from vindex import Index
from vindex.errors import VindexError

from . import snapshot
from .errors import BehindError, NotServingError
from .priority import WritePriority
from .remote import result
from .writelog import WriteLog

#: Threads of a replica actor's default concurrency group: searches and other reads run
#: beside each other, never queued behind a write.
ACTOR_CONCURRENCY = 16
#: Writes a shard's coordinator keeps in flight to each replica: the next one is already queued
#: at the replica while the coordinator collects the last acknowledgement.
PIPELINE_DEPTH = 2
#: Writes (and catch-up) run on a concurrency group of their own: they are applied one at a
#: time, in order, under the replica's lock; the group has a thread per write in flight (a
#: write waits on its thread for the one before it) and one for a catch-up. Each thread's CPU
#: priority is set per write (:mod:`.priority`).
CONCURRENCY_GROUPS = {"writes": PIPELINE_DEPTH + 1}
#: Seconds a write waits for the write before it (started out of order) before it fails.
REORDER_WAIT_S = 10.0


def _serve_at_normal_priority() -> None:
    """Ray starts worker processes at nice 15 (``RAY_worker_niceness``) so that background
    tasks yield to the raylet; a replica serves searches and acknowledges writes, and at nice
    15 it lost the cores to every other process of the machine. Back to 0 where the process
    may raise its priority (root, CAP_SYS_NICE); as it is elsewhere."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except (OSError, AttributeError):  # not permitted, or not POSIX
        pass


def apply_write(index: Index, write: tuple[str, dict], replay: bool) -> Any:
    """Run one logged write on ``index``. A replayed ``add`` is an upsert: the write was
    checked when it was first applied, and the index may already hold it."""
    kind, args = write
    if kind == "add" and replay:
        kind = "upsert"
    if kind in ("upsert", "add"):
        getattr(index, kind)(args["ids"], args["vectors"], metadata=args.get("metadata"),
                             documents=args.get("documents"))
        return None
    if kind == "delete":
        return index.delete(args.get("ids"), filter=args.get("filter"))
    if kind == "set_metadata":
        return index.set_metadata(args["ids"], args["metadata"], merge=args["merge"])
    raise ValueError(f"unknown write {kind!r}")


class ShardReplica:
    """The actor's body (``ray.remote`` is applied by :mod:`vindex.cluster.placement`)."""

    def __init__(self, path: str, dim: int, metric: str, id_type: str | None, config: dict):
        _serve_at_normal_priority()
        os.makedirs(path, exist_ok=True)
        self.path = path
        index_dir = os.path.join(path, "index")
        shutil.rmtree(index_dir + ".incoming", ignore_errors=True)  # a snapshot copy cut short
        if os.path.exists(os.path.join(index_dir, "vindex.json")):
            self.index = Index.open(index_dir)
        else:  # new, lost, or a creation that did not finish
            shutil.rmtree(index_dir, ignore_errors=True)
            self.index = Index.create(index_dir, dim=dim, metric=metric, id_type=id_type, **config)
        self._fsync = config.get("durability") == "fsync"
        self.log = WriteLog(self._log_path, fsync=self._fsync)
        self._lock = threading.Lock()  # writes, catch-up and trims, one at a time
        self._advanced = threading.Condition(self._lock)  # the log's last write changed
        #: Catch-ups and snapshot copies, one at a time (a copy releases ``_lock`` while it
        #: fetches; two repairs may drive this replica at once)
        self._copying = threading.Lock()
        self._priority = WritePriority()
        self._serving = False
        last = self.log.last()
        if last is not None:  # the process may have stopped between logging it and applying it
            self._apply(last[1], replay=True)

    def _apply(self, write: tuple[str, dict], replay: bool) -> Any:
        try:
            return apply_write(self.index, write, replay)
        except VindexError:
            if replay:  # it failed the same way when first applied (bad input: nothing written)
                return None
            raise

    # --- writes -------------------------------------------------------------------------------
    @ray.method(concurrency_group="writes")
    def apply(self, seq: int, write: tuple[str, dict]) -> Any:
        """Apply the shard's write number ``seq``; None if it was applied before."""
        self._priority.before_write()
        with self._lock:
            self._advanced.wait_for(lambda: not self._serving or seq <= self.log.last_seq + 1, REORDER_WAIT_S)
            if not self._serving:
                raise NotServingError("replica is recovering")
            if seq <= self.log.last_seq:
                return None
            if seq != self.log.last_seq + 1:
                raise BehindError(self.log.last_seq)
            self.log.append(seq, write)
            self._advanced.notify_all()
            return self._apply(write, replay=False)

    @ray.method(concurrency_group="writes")
    def catch_up(self, records: list[tuple[int, tuple[str, dict]]]) -> int:
        """Apply a peer's log records this replica lacks; returns its sequence number after."""
        with self._copying, self._lock:
            for seq, write in records:
                if seq <= self.log.last_seq:
                    continue
                if seq != self.log.last_seq + 1:
                    raise BehindError(self.log.last_seq)
                self.log.append(seq, write)
                self._advanced.notify_all()
                self._apply(write, replay=True)
            return self.log.last_seq

    def log_since(self, seq: int, limit: int | None = None) -> list[tuple[int, tuple[str, dict]]]:
        return self.log.since(seq, limit)

    @property
    def _log_path(self) -> str:
        return os.path.join(self.path, "writes.log")

    # --- snapshot copies ----------------------------------------------------------------------
    def snapshot_begin(self) -> tuple[str, int, Any, list[tuple[str, int]]]:
        """Copy this replica's index for a peer: ``(snapshot id, the write number it holds,
        that write's log record, its files)``. Writes to this replica wait meanwhile (ms)."""
        sid = f"snapshot-{uuid.uuid4().hex}"
        root = os.path.join(self.path, sid)
        with self._lock:
            snapshot.take(self.index, root)
            last = self.log.last()
        if last is None:
            return sid, 0, None, snapshot.files(root)
        return sid, last[0], last[1], snapshot.files(root)

    def snapshot_piece(self, sid: str, rel: str, offset: int) -> bytes:
        return snapshot.read_piece(os.path.join(self.path, sid), rel, offset)

    def snapshot_end(self, sid: str) -> None:
        shutil.rmtree(os.path.join(self.path, sid), ignore_errors=True)

    @ray.method(concurrency_group="writes")
    def restore_from(self, source: Any) -> int:
        """Replace this replica's index with a copy of ``source``'s (a peer actor) and its log
        with the copy's write number; returns that number. The replica stops serving."""
        with self._copying:
            return self._restore_from(source)

    def _restore_from(self, source: Any) -> int:
        with self._lock:
            self._serving = False  # the coordinator counts it stale already
            self._advanced.notify_all()
        sid, seq, last, listing = result(source.snapshot_begin.remote())
        incoming = os.path.join(self.path, "index.incoming")
        try:
            shutil.rmtree(incoming, ignore_errors=True)
            snapshot.fetch(listing, lambda rel, offset: result(source.snapshot_piece.remote(sid, rel, offset)),
                           incoming)
        finally:
            source.snapshot_end.remote(sid)
        with self._lock:
            index_dir = self.index.path
            self.index.close()
            self.log.close()
            # the log goes first: a crash from here on restarts at write 0, and the next
            # repair copies a snapshot again
            os.remove(self._log_path)
            shutil.rmtree(index_dir)
            os.replace(incoming, index_dir)
            self.index = Index.open(index_dir)
            self.log = WriteLog(self._log_path, fsync=self._fsync)
            if last is not None:
                self.log.append(seq, last)  # the copy has it applied; a restart re-applies it
            return self.log.last_seq

    def trim(self, keep_after: int) -> int:
        with self._lock:
            return self.log.trim(keep_after)

    def serve(self, seq: int) -> bool:
        """Start serving if this replica has every write up to ``seq``."""
        with self._lock:
            self._serving = self.log.last_seq >= seq
            return self._serving

    def state(self) -> dict:
        return {"seq": self.log.last_seq, "serving": self._serving, "pid": os.getpid(),
                "log_bytes": self.log.bytes, "log_first": self.log.first_seq}

    # --- reads --------------------------------------------------------------------------------
    def _check_serving(self) -> None:
        if not self._serving:
            raise NotServingError("replica is recovering")

    def search(self, queries: np.ndarray, k: int, params: dict) -> tuple:
        self._check_serving()
        self._priority.searched()
        res = self.index.search(queries, k, **params)
        return res.ids, res.distances, res.stats, res.included

    def get(self, ids: Any, include: Any) -> tuple:
        self._check_serving()
        res = self.index.get(ids, include=include)
        return res.vectors, res.found, res.included

    def count(self, filter: Any) -> int:
        self._check_serving()
        return self.index.count(filter)

    def scroll_page(self, filter: Any, batch: int, include: Any, cursor: int | None) -> tuple:
        self._check_serving()
        page = next(self.index.scroll(filter, batch=batch, include=include, cursor=cursor))
        return page.ids, page.cursor, page.included

    def live(self) -> int:
        self._check_serving()
        return len(self.index)

    def stats(self) -> dict:
        return {**self.index.stats(), "replica": self.state()}

    def wait_idle(self, timeout: float | None) -> bool:
        return self.index.wait_idle(timeout)

    def checkpoint(self) -> None:
        self.index.checkpoint()

    def set_tenant_quotas(self, quotas: dict[str, tuple[float | None, float | None]]) -> None:
        """``tenant -> (postings_per_s, burst)`` as :meth:`vindex.Index.set_tenant_quota`."""
        for tenant, (rate, burst) in quotas.items():
            self.index.set_tenant_quota(tenant, rate, burst)

    def close(self) -> None:
        self.index.close()
        self.log.close()
