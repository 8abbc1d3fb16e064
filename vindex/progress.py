"""Progress bars for long operations (tqdm), shown on a terminal unless turned off."""
from __future__ import annotations

import sys
from typing import Iterable, TypeVar

T = TypeVar("T")


def enabled(flag: bool | None) -> bool:
    """``None`` means: show progress when stderr is a terminal."""
    return sys.stderr.isatty() if flag is None else bool(flag)


def bar(items: Iterable[T], *, desc: str, total: int | None = None, show: bool = False) -> Iterable[T]:
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, total=total, unit="", leave=False, dynamic_ncols=True, file=sys.stderr)


def step(message: str, show: bool) -> None:
    """One line announcing a build stage."""
    if show:
        print(f"vindex: {message}", file=sys.stderr, flush=True)
