"""Calls to replica actors: the errors a replica raises come back as themselves."""
from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from .errors import BehindError, NotServingError

#: What says "this replica cannot answer now": dead or restarting, recovering, or missed writes.
REPLICA_DOWN = (RayActorError, NotServingError, BehindError, GetTimeoutError)


def result(ref: Any, timeout: float | None = None) -> Any:
    """``ray.get(ref)``, raising the replica's own exception (a ValueError stays one)."""
    try:
        return ray.get(ref, timeout=timeout)
    except RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, BaseException) and not isinstance(cause, RayActorError):
            raise cause from None
        raise
