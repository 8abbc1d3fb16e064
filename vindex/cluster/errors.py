"""What a replica raises when it cannot take a call now (the coordinator tries another)."""
from __future__ import annotations


class NotServingError(RuntimeError):
    """The replica has (re)started and is not yet known to be up to date."""


class BehindError(RuntimeError):
    """The replica missed writes: it has applied up to ``seq``."""

    def __init__(self, seq: int):
        super().__init__(f"replica has writes up to {seq} only")
        self.seq = seq

    def __reduce__(self):
        return (BehindError, (self.seq,))
