"""Node planning: bin-packing replicas onto a pool's nodes and warm headroom."""

from __future__ import annotations

import pytest

from scaler.engine import nodes, types
from scaler.policy import model


def pool(**overrides: object) -> model.NodePool:
    return model.NodePool.model_validate({"name": "p", "gpusPerNode": 8, **overrides})


def demand(gpus: int, replicas: int, forecast: int | None = None) -> types.PoolDemand:
    return types.PoolDemand(model="m", gpus_per_replica=gpus, replicas=replicas,
                            forecast_replicas=replicas if forecast is None else forecast)


@pytest.mark.parametrize(
    ("requests", "per_node", "expected"),
    [
        ([8, 8, 8], 8, 3),          # TP8: one whole node per replica
        ([6, 6], 8, 2),             # 12 GPUs <= 16 but neither node holds two 6s
        ([1] * 10, 8, 2),
        ([4, 4, 2, 2, 2, 2], 8, 2),
        ([1] * 10, 56, 1),          # MIG 1g.10gb: 7 slices x 8 GPUs per node
        ([], 8, 0),
    ],
)
def test_nodes_needed(requests: list[int], per_node: int, expected: int) -> None:
    assert nodes.nodes_needed(requests, gpus_per_node=per_node) == expected


def test_replica_larger_than_a_node_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot fit"):
        nodes.nodes_needed([16], gpus_per_node=8)


def test_eight_gpu_replica_needs_a_whole_node_and_headroom_follows_forecast() -> None:
    plan = nodes.plan_pool(pool(warmNodes=1), resource_name="nvidia.com/gpu",
                           demands=[demand(8, 3, forecast=5)])
    assert plan.nodes_for_replicas == 3
    assert plan.headroom_nodes == 5 - 3 + 1
    assert plan.nodes_wanted == 6
    assert plan.placeholder_pods == 3 and plan.placeholder_gpus == 8


def test_models_share_a_pool() -> None:
    plan = nodes.plan_pool(pool(), resource_name="nvidia.com/gpu",
                           demands=[demand(4, 3), demand(2, 2)])
    # 4+4 | 4+2+2 -> two nodes
    assert plan.nodes_for_replicas == 2 and plan.headroom_nodes == 0


def test_max_nodes_caps_the_plan() -> None:
    plan = nodes.plan_pool(pool(maxNodes=4, warmNodes=2), resource_name="nvidia.com/gpu",
                           demands=[demand(8, 3, forecast=6)])
    assert plan.nodes_wanted == 4 and plan.headroom_nodes == 1
    assert any("maxNodes" in r for r in plan.reasons)


def test_pool_demand_from_a_decision_uses_the_node_boot_forecast() -> None:
    p = model.ScalePolicy.model_validate({
        "apiVersion": "scaler.io/v1alpha1", "kind": "ScalePolicy",
        "metadata": {"name": "m"},
        "spec": {"target": {"name": "m"}, "replicas": {"max": 6},
                 "signals": {"concurrency": {"targetPerReplica": 10}},
                 "resources": {"gpusPerReplica": 8},
                 "nodePool": {"name": "p", "gpusPerNode": 8}}})
    forecast = types.Forecast(time_to_ready_s=60, needs_node=False, demand_now=2,
                              slope_per_s=0.01, demand_at_ready=2.6, replicas_at_ready=3,
                              replicas_at_node_ready=9)
    decision = types.Decision(model="default/m", at=0, current=2, desired=3,
                              recommendation=3, winner="forecast", signals=(),
                              forecast=forecast)
    d = nodes.pool_demand(p, decision)
    assert (d.replicas, d.forecast_replicas, d.gpus_per_replica) == (3, 6, 8)  # capped at max
