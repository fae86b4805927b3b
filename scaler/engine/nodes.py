"""Node planning (DESIGN 3.6): bin-pack replicas onto a pool's nodes, plus warm headroom."""

from __future__ import annotations

from collections.abc import Sequence

from scaler.engine import types
from scaler.policy import model


def nodes_needed(gpu_requests: Sequence[int], *, gpus_per_node: int) -> int:
    """First-fit decreasing: how many nodes of `gpus_per_node` hold these replicas.

    A replica's GPUs must sit on one node (tensor parallelism runs over NVLink), so an
    8-GPU replica needs a whole 8-GPU node and two 6-GPU replicas need two nodes even
    though 12 <= 16. First-fit decreasing is within 11/9 of optimal, and exact for the
    common case of one replica size per pool.
    """
    free: list[int] = []
    for request in sorted(gpu_requests, reverse=True):
        if request > gpus_per_node:
            raise ValueError(f"a replica needing {request} GPUs cannot fit a "
                             f"{gpus_per_node}-GPU node")
        for i, room in enumerate(free):
            if room >= request:
                free[i] = room - request
                break
        else:
            free.append(gpus_per_node - request)
    return len(free)


def plan_pool(
    pool: model.NodePool,
    *,
    resource_name: str,
    demands: Sequence[types.PoolDemand],
) -> types.NodePlan:
    """Nodes the pool needs for the decided replicas, and warm headroom for the forecast.

    Headroom = nodes for the replicas forecast one node boot ahead, less nodes for the
    replicas decided now, plus the pool's static `warmNodes`. Example: 8-GPU nodes, a TP8
    model decided at 3 replicas and forecast at 5 within a node boot, warmNodes 1:
    3 nodes for replicas, 5 - 3 + 1 = 3 headroom nodes, 6 wanted. Each headroom node gets
    one placeholder pod requesting all its GPUs, so real replicas preempt exactly one
    placeholder each and the node autoscaler keeps the node.
    """
    per_replica = [d.gpus_per_replica for d in demands for _ in range(d.replicas)]
    forecast = [d.gpus_per_replica for d in demands
                for _ in range(max(d.replicas, d.forecast_replicas))]
    for_replicas = nodes_needed(per_replica, gpus_per_node=pool.gpus_per_node)
    for_forecast = nodes_needed(forecast, gpus_per_node=pool.gpus_per_node)
    headroom = for_forecast - for_replicas + pool.warm_nodes
    reasons = [f"{len(per_replica)} replicas need {for_replicas} node(s)",
               f"forecast needs {for_forecast} node(s) within one node boot",
               f"static warm floor {pool.warm_nodes} node(s)"]
    wanted = for_replicas + headroom
    if pool.max_nodes is not None and wanted > pool.max_nodes:
        reasons.append(f"capped by maxNodes {pool.max_nodes}")
        wanted = pool.max_nodes
        headroom = max(0, wanted - for_replicas)
    return types.NodePlan(
        pool=pool.name,
        resource_name=resource_name,
        gpus_per_node=pool.gpus_per_node,
        nodes_for_replicas=for_replicas,
        headroom_nodes=headroom,
        nodes_wanted=wanted,
        placeholder_pods=headroom,
        placeholder_gpus=pool.gpus_per_node,
        reasons=tuple(reasons),
    )


def pool_demand(policy: model.ScalePolicy, decision: types.Decision) -> types.PoolDemand:
    """A decision's demand on its pool: replicas now and forecast one node boot ahead."""
    spec = policy.spec
    forecast = decision.forecast.replicas_at_node_ready if decision.forecast else 0
    return types.PoolDemand(
        model=policy.key,
        gpus_per_replica=spec.resources.gpus_per_replica,
        replicas=decision.desired,
        forecast_replicas=min(max(forecast, decision.desired), spec.replicas.max),
    )
