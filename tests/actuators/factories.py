"""Builders of the policies and decisions the actuator tests feed in."""

from __future__ import annotations

from scaler.engine import types
from scaler.policy import model


def make_policy(namespace: str, target: str, *, kind: str = "Deployment",
                api_version: str = "apps/v1", node_pool: model.NodePool | None = None,
                gpus_per_replica: int = 1) -> model.ScalePolicy:
    return model.ScalePolicy(
        api_version="scaler.io/v1alpha1", kind="ScalePolicy",
        metadata=model.Metadata(name=target, namespace=namespace),
        spec=model.ScalePolicySpec(
            target=model.Target(api_version=api_version, kind=kind, name=target),
            replicas=model.Replicas(min=0, max=64),
            signals=model.Signals(concurrency=model.ConcurrencySignal(target_per_replica=10)),
            node_pool=node_pool,
            resources=model.Resources(gpus_per_replica=gpus_per_replica),
        ),
    )


def make_decision(model_key: str, *, current: int, desired: int, at: float = 0.0
                  ) -> types.Decision:
    return types.Decision(model=model_key, at=at, current=current, desired=desired,
                          recommendation=desired, winner="concurrency", signals=())
