"""An index's recall-target calibrations (``aps.Calibration``) by ``(k, candidate settings)``.

A calibration costs a pass over every posting (seconds to a minute at 1M records), so:

* the first one for a key is made in the search that asks for it (there is nothing to meet
  the target with before it);
* one made again later (from served queries, once enough came: ``adaptive.calibration``) is
  made by a background thread while searches go on with the one they have;
* they are kept in ``<index>/calibrations.json`` and read back at open, so a restarted server
  does not pay for them again. One made when the index held a very different number of live
  records (``STALE_SHARE``) is dropped at open. The file is a cache: a damaged one is ignored
  (with a warning) and written anew.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from typing import Callable

from .aps import Calibration
from .files import write_json_atomic

log = logging.getLogger(__name__)

#: The file, in the index directory.
FILE = "calibrations.json"
#: A kept calibration is dropped at open once the live records differ by more than this
#: share from what it was made on.
STALE_SHARE = 0.25

Make = Callable[[], Calibration]


class Calibrations:
    """Calibrations by key, made one at a time, kept in ``directory`` (None: memory only)."""

    def __init__(self, directory: str | None = None, live: int = 0) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[tuple, Calibration] = {}
        self._path = None if directory is None else os.path.join(directory, FILE)
        self._refreshing: dict[tuple, threading.Thread] = {}
        self._closed = False
        if self._path is not None:
            self._load(live)

    def peek(self, key: tuple) -> Calibration | None:
        return self._by_key.get(key)

    def summaries(self) -> dict[tuple, dict]:
        """Each stored calibration's ``summary()``, by key."""
        with self._lock:
            return {key: cal.summary() for key, cal in self._by_key.items()}

    def make(self, key: tuple, stale: Calibration | None, make: Make) -> Calibration:
        """``make()`` stored under ``key``, unless another thread replaced ``stale`` meanwhile."""
        with self._lock:
            found = self._by_key.get(key)
            if found is None or found is stale:
                found = self._by_key[key] = make()
                self._save()
            return found

    def refresh(self, key: tuple, stale: Calibration, make: Make) -> None:
        """Replace ``stale`` with ``make()`` from a background thread (one per key at a time)."""
        with self._lock:
            running = self._refreshing.get(key)
            if self._closed or (running is not None and running.is_alive()):
                return
            thread = threading.Thread(target=self._refresh, args=(key, stale, make), name="vindex-calibrate",
                                      daemon=True)
            self._refreshing[key] = thread
            thread.start()

    def _refresh(self, key: tuple, stale: Calibration, make: Make) -> None:
        try:
            fresh = make()
        except Exception:  # the index closing under it, a failing disk: the old one serves on
            log.warning("recall-target calibration for %s failed; keeping the previous one", key, exc_info=True)
            return
        with self._lock:
            if self._by_key.get(key) is stale:
                self._by_key[key] = fresh
                self._save()

    def close(self) -> None:
        """Wait for background calibrations to finish (they search the index)."""
        with self._lock:
            self._closed = True
            threads = list(self._refreshing.values())
        for t in threads:
            if t is not threading.current_thread():
                t.join()

    def _save(self) -> None:
        if self._path is None:
            return
        entries = [{"key": list(key), **cal.to_json()} for key, cal in self._by_key.items()]
        try:
            write_json_atomic(self._path, {"calibrations": entries})
        except OSError as e:  # a cache: the next open calibrates again
            log.warning("could not write %s: %s", self._path, e)

    def _load(self, live: int) -> None:
        try:
            with open(self._path, "rb") as f:
                entries = json.loads(f.read())["calibrations"]
            loaded = {}
            for e in entries:
                cal = Calibration.from_json(e)
                if abs(cal.live - live) <= STALE_SHARE * max(cal.live, live):
                    k, m, eps, ef = e["key"]
                    loaded[(int(k), int(m), float(eps), int(ef))] = cal
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring %s (%s): recall targets calibrate again", self._path, e)
            return
        self._by_key = loaded
