"""The policy's replica bounds, as every simulated strategy applies them."""

from __future__ import annotations

from scaler.policy import model as policy_model


def bounded(policy: policy_model.ScalePolicy, replicas: int) -> int:
    """`replicas` clamped to the policy's [min, max]."""
    return min(max(replicas, policy.spec.replicas.min), policy.spec.replicas.max)
