"""Progress of long operations: a tqdm bar on a terminal, or log lines in a server.

Every long operation takes ``progress``: ``True`` (a bar), ``False`` (nothing), ``None`` (a
bar when stderr is a terminal) or ``"log"`` (a line on the ``vindex.progress`` logger every
``LOG_EVERY_S`` seconds and one when work it had to do ends, for servers whose stderr is a log file).
"""
from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from typing import Callable, Iterable, Iterator, TypeVar, Union

T = TypeVar("T")

#: What a ``progress`` argument may be.
Mode = Union[bool, None, str]

log = logging.getLogger("vindex.progress")

#: Seconds between two log lines of one operation.
LOG_EVERY_S = 5.0
#: Seconds between two looks at a backlog being watched (``watch``).
POLL_S = 0.25


def enabled(flag: Mode) -> bool:
    """``None`` means: show progress when stderr is a terminal; "log" is shown as log lines."""
    return sys.stderr.isatty() if flag is None else bool(flag)


def check_mode(progress: Mode) -> Mode:
    if progress is None or isinstance(progress, bool) or progress == "log":
        return progress
    raise ValueError(f"progress: expected True, False, None or 'log', got {progress!r}")


def bar(items: Iterable[T], *, desc: str, total: int | None = None, show: bool = False) -> Iterable[T]:
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, total=total, unit="", leave=False, dynamic_ncols=True, file=sys.stderr)


def track(items: Iterable[T], *, desc: str, total: int | None = None, progress: Mode = None) -> Iterable[T]:
    """``items``, reporting how many have been taken as ``progress`` says."""
    if progress == "log":
        return _logged(items, desc, total)
    return bar(items, desc=desc, total=total, show=enabled(progress))


def _logged(items: Iterable[T], desc: str, total: int | None) -> Iterator[T]:
    started = last = time.monotonic()
    done = 0
    of = "" if total is None else f" of {total}"
    for item in items:
        yield item
        done += 1
        now = time.monotonic()
        if now - last >= LOG_EVERY_S:
            last = now
            log.info("%s: %d%s (%.0f s)", desc, done, of, now - started)
    if done:
        log.info("%s: done, %d%s in %.1f s", desc, done, of, time.monotonic() - started)


@contextlib.contextmanager
def watch(desc: str, remaining: Callable[[], int], progress: Mode) -> Iterator[None]:
    """While the body runs (a wait), show how much of ``remaining()`` (a backlog) is done:
    a thread looks every ``POLL_S`` seconds and updates a bar or logs a line."""
    if progress != "log" and not enabled(progress):
        yield
        return
    stop = threading.Event()
    thread = threading.Thread(target=_watch, args=(desc, remaining, progress, stop), name="vindex-progress",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _watch(desc: str, remaining: Callable[[], int], progress: Mode, stop: threading.Event) -> None:
    first = remaining()
    started = last = time.monotonic()
    shown = None
    if progress != "log":
        from tqdm import tqdm

        shown = tqdm(desc=desc, total=first, unit="", leave=False, dynamic_ncols=True, file=sys.stderr)
    try:
        while not stop.wait(POLL_S):
            left = remaining()
            if shown is not None:
                shown.total = max(shown.total or 0, left)
                shown.n = shown.total - left
                shown.refresh()
            elif time.monotonic() - last >= LOG_EVERY_S:
                last = time.monotonic()
                log.info("%s: %d left of %d (%.0f s)", desc, left, first, last - started)
    finally:
        if shown is not None:
            shown.close()
    if shown is None and first:
        log.info("%s: done in %.1f s", desc, time.monotonic() - started)


def step(message: str, show: bool) -> None:
    """One line announcing a build stage."""
    if show:
        print(f"vindex: {message}", file=sys.stderr, flush=True)
