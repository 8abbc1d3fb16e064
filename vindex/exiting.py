"""Whether the interpreter is exiting, for background threads of an index left open.

At exit CPython runs its threading exit hooks before it marks the main thread stopped; the
first of them (``concurrent.futures``') stops every thread pool, so a background round that
submits work then fails while ``threading.main_thread().is_alive()`` still says True. This
module's hook is registered after ``concurrent.futures``' and so runs before it (the hooks
run last registered first): the flag is set before any pool refuses work."""
from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (its exit hook first, so ours runs before it)
import threading

_exiting = False


def _mark_exiting() -> None:
    global _exiting
    _exiting = True


threading._register_atexit(_mark_exiting)  # the hook concurrent.futures itself uses


def interpreter_exiting() -> bool:
    """True once the interpreter has begun to exit (its thread pools may refuse work)."""
    return _exiting or not threading.main_thread().is_alive()
