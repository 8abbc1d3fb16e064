"""Where replica actors run: one placement group per shard, one bundle per replica.

Replicas of a shard go on different nodes (``STRICT_SPREAD``) when the cluster has as many
alive nodes as replicas; on fewer nodes (one machine) that group could never be placed, so it
is ``SPREAD``: different nodes where possible. Actors restart without limit (Ray re-runs their
constructor, which reopens the index in the same directory).
"""
from __future__ import annotations

from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from .replica import ACTOR_CONCURRENCY, CONCURRENCY_GROUPS, ShardReplica

#: Seconds to wait for a placement group's resources before giving up.
PLACEMENT_TIMEOUT_S = 60.0

_Actor = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(ShardReplica)


def connect(address: str | None) -> None:
    """Join the Ray cluster at ``address`` ("auto": the local one a ``ray start`` made) unless
    this process is already connected; None starts a local one if there is none."""
    if ray.is_initialized():
        return
    ray.init(address=address, include_dashboard=False, log_to_driver=False)


def default_actor_cpus(actors: int) -> float:
    """The CPUs each of ``actors`` new replicas reserves: an equal share of those still free
    in the cluster, at most one each (a 2-CPU machine holds a 2 x 2 collection)."""
    free = float(ray.available_resources().get("CPU", 0.0))
    return round(max(0.01, min(1.0, free / max(1, actors))), 4)


def strategy_for(replicas: int) -> str:
    alive = sum(1 for node in ray.nodes() if node.get("Alive"))
    return "STRICT_SPREAD" if replicas > 1 and alive >= replicas else "SPREAD"


def place_shard(replicas: int, cpus: float) -> PlacementGroup:
    group = placement_group([{"CPU": cpus}] * replicas, strategy=strategy_for(replicas))
    ready = group.ready()
    try:
        ray.get(ready, timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise RuntimeError(f"Ray could not place {replicas} replica(s) of {cpus} CPU each within "
                           f"{PLACEMENT_TIMEOUT_S:.0f} s (free: {ray.available_resources().get('CPU', 0)} CPU); "
                           f"pass a smaller actor_cpus") from None
    return group


def start_replica(group: PlacementGroup, bundle: int, cpus: float, *args: Any) -> Any:
    """A replica actor in ``group``'s bundle ``bundle``; ``args`` go to its constructor."""
    return _Actor.options(
        num_cpus=cpus, max_restarts=-1, max_task_retries=0, max_concurrency=ACTOR_CONCURRENCY,
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group,
                                                             placement_group_bundle_index=bundle),
    ).remote(*args)


def release(group: PlacementGroup) -> None:
    remove_placement_group(group)
